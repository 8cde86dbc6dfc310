//! What `cache ls|verify|gc` needs from a cache: list its tags, read a
//! manifest and blobs, delete a tag ([`Catalog`]); and [`Layout`], the
//! implementation for an OCI image layout on disk (`file:///dir`; OCI image
//! spec, "image-layout.md": `oci-layout`, `index.json`, `blobs/sha256/<hex>`,
//! tags as `org.opencontainers.image.ref.name` annotations in the index).
//!
//! The registry transport implements the same trait for `oci://` and
//! `oci+http://` caches.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};

/// The media type of an OCI image manifest.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// The media type of an OCI image index.
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// The annotation that names a tag in a layout's `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// An OCI content descriptor (image spec, "descriptor.md"), the fields we use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// The media type of the referenced content.
    pub media_type: String,
    /// `sha256:<64 hex>`.
    pub digest: String,
    /// The size in bytes.
    pub size: u64,
    /// The artifact type, on manifests of artifacts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// Annotations (a layer's file name in `org.opencontainers.image.title`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An OCI image manifest (image spec, "manifest.md"), the fields we use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`MANIFEST_MEDIA_TYPE`].
    #[serde(default)]
    pub media_type: Option<String>,
    /// The artifact type (`application/vnd.oracle-build.wheel.v1` ...).
    #[serde(default)]
    pub artifact_type: Option<String>,
    /// The config blob: the entry's record with its attestations.
    pub config: Descriptor,
    /// The entry's files.
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A tag with the manifest it points to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tagged {
    /// The tag (`wheel-<key>` ...).
    pub tag: String,
    /// The manifest's digest, `sha256:<hex>`.
    pub digest: String,
    /// The manifest's bytes, checked against `digest`.
    pub bytes: Vec<u8>,
    /// The parsed manifest.
    pub manifest: Manifest,
}

/// The read and delete operations `cache ls|verify|gc` needs.
pub trait Catalog {
    /// Every tag of the repository, sorted.
    ///
    /// Errors: the cache cannot be reached or read.
    fn list_tags(&self) -> Result<Vec<String>>;

    /// The manifest `tag` points to, its digest checked.
    ///
    /// Errors: no such tag, unreadable, not an image manifest, or its bytes
    /// do not hash to the digest the tag names.
    fn get_manifest(&self, tag: &str) -> Result<Tagged>;

    /// A reader of blob `digest` (`sha256:<hex>`); the caller checks the
    /// bytes against the digest.
    ///
    /// Errors: no such blob, or it cannot be opened.
    fn open_blob(&self, digest: &str) -> Result<Box<dyn Read>>;

    /// Removes `tag`; blobs no longer referenced may be removed with it (a
    /// layout) or left to the registry's own garbage collection.
    ///
    /// Errors: the tag cannot be removed.
    fn delete_tag(&self, tag: &str) -> Result<()>;
}

/// An OCI image layout directory.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The layout's root (holds `oci-layout`).
    pub dir: PathBuf,
}

impl Layout {
    /// The layout at `dir`.
    ///
    /// Errors: `dir` has no `oci-layout` file with `imageLayoutVersion`
    /// 1.0.0 (exit 2, naming the path).
    pub fn open(dir: &Path) -> Result<Layout> {
        todo!()
    }

    /// The path of blob `digest` (`blobs/sha256/<hex>`).
    ///
    /// Errors: `digest` is not `sha256:` and 64 lower-case hex digits.
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        todo!()
    }

    /// Removes every blob no manifest of `index.json` references (directly
    /// or as config or layer); with `dry_run` only lists them.
    ///
    /// Errors: the index or a manifest cannot be read, or a removal fails.
    pub fn sweep_blobs(&self, dry_run: bool) -> Result<Vec<String>> {
        todo!()
    }
}

impl Catalog for Layout {
    fn list_tags(&self) -> Result<Vec<String>> {
        todo!()
    }

    fn get_manifest(&self, tag: &str) -> Result<Tagged> {
        todo!()
    }

    fn open_blob(&self, digest: &str) -> Result<Box<dyn Read>> {
        todo!()
    }

    fn delete_tag(&self, tag: &str) -> Result<()> {
        todo!()
    }
}
