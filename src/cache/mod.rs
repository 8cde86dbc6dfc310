//! The registry cache (issue 13): a layer between the pipeline and
//! [`crate::stages`] that shares store entries through OCI registries
//! (`oci://host/repo`, `oci+http://host:port/repo`) and OCI image layouts on
//! disk (`file:///dir`).
//!
//! - [`config`]: which caches a site uses (`config.toml` in the store root
//!   or in `$XDG_CONFIG_HOME/oracle-build/`, `--cache`, `ORACLE_BUILD_CACHE`).
//! - [`identity`]: which cache a URL names however it is spelled (host
//!   forms, default ports, this box's names): what a store's policy binds.
//! - [`trust`]: the signed statement a builder attaches to a wheel, SSHSIG
//!   signing and verification against an `allowed_signers` file, and the
//!   [`trust::Verdict`] a pulling box acts on.
//! - [`catalog`]: the small read/delete interface `cache ls|verify|gc`
//!   needs from a cache, with its implementation for `file://` layouts.
//! - [`Transport`]: the few operations of the OCI distribution spec a cache
//!   needs (blobs by digest, manifests by tag), with two implementations:
//!   [`registry`] (`oci-client`) and [`layout`] (an OCI image layout).
//! - [`artifact`]: one OCI artifact per store entry, named by its content
//!   key and its manifest's digest in the tag (`wheel-<key>-<wheel
//!   sha256>-<manifest>`, `src-<commit>-<manifest>`, ...): append-only, a
//!   tag names one manifest forever.
//! - [`attest`]: each signed statement its own small artifact
//!   (`att-<kind>-<key>-<subject>-<signer>-<manifest>`), generic over what
//!   it signs.
//! - [`listing`]: what a cache holds for one entry, found by listing tags:
//!   every artifact of it and every attestation, so every reader sees the
//!   same (a reproducibility failure included).
//! - [`provenance`]: the wheel's build as a signed in-toto Statement with an
//!   SLSA v1 provenance predicate, kept as its own append-only artifact.
//! - [`readahead`]: the manifests and configs an operation will read,
//!   fetched many at a time first, then served from memory and disk.
//! - [`substitute`]: taking an entry from a cache instead of doing the work,
//!   every blob checked on arrival and the entry made by one rename; what
//!   `pull` and `build` share.
//! - [`compiler`]: the team compiler cache (`[compiler_cache]` in the same
//!   `config.toml`), ccache's remote storage for the wheel stage's compilers.
//! - [`site`]: both `config.toml` files checked whole (every table by its
//!   reader) before a command does any work.
//!
//! Every blob and manifest is checked against its digest on arrival: by
//! the transport (the sha256 of what was received) and again by
//! [`substitute`] before anything is renamed into the store.

pub mod accept;
pub mod artifact;
pub mod attest;
pub mod bounds;
pub mod catalog;
pub mod compiler;
pub mod config;
pub mod delete;
pub mod ext_trust;
pub mod fetcher;
pub mod identity;
pub mod inputs_record;
pub mod inspect;
pub mod keyfile;
pub mod layout;
pub mod listing;
pub mod provenance;
pub mod pull;
pub mod readahead;
pub mod registry;
pub mod site;
pub mod source_bundle;
pub mod substitute;
pub mod trust;

use std::path::Path;

use anyhow::{Result, bail};

/// A manifest as received: its bytes and their digest (`sha256:<hex>`,
/// already checked against the bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The manifest's bytes, exactly as stored.
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
}

/// One blob to download: [`Transport::get_blobs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobGet {
    /// `sha256:<hex>`.
    pub digest: String,
    /// Its declared size (read up to it and no further).
    pub size: u64,
    /// The new file it goes to.
    pub dest: std::path::PathBuf,
}

/// The operations of the OCI distribution spec (or an image layout) a cache
/// needs. Implementations check every blob and manifest they receive
/// against its digest and fail naming it.
pub trait Transport {
    /// The cache's URL, for messages.
    fn describe(&self) -> String;
    /// The manifest tagged `tag`, or `None` when there is no such tag.
    ///
    /// Errors: the cache cannot be reached or refuses; the bytes do not
    /// match the digest the cache gives.
    fn manifest(&self, tag: &str) -> Result<Option<Fetched>>;
    /// [`Transport::manifest`] of each of `tags`, one result each, in
    /// order; a registry keeps several requests in flight.
    fn manifests(&self, tags: &[String]) -> Vec<Result<Option<Fetched>>> {
        tags.iter().map(|t| self.manifest(t)).collect()
    }
    /// Whether the blob `digest` is present.
    fn has_blob(&self, digest: &str) -> Result<bool>;
    /// Downloads the blob `digest` of `size` bytes into the new file `dest`.
    ///
    /// Errors: the cache fails; what arrived has another digest or size
    /// (the message names the digest; `dest` is removed).
    fn get_blob(&self, digest: &str, size: u64, dest: &Path) -> Result<()>;
    /// [`Transport::get_blob`] of each of `blobs`, one result each, in
    /// order; a registry keeps several requests in flight.
    fn get_blobs(&self, blobs: &[BlobGet]) -> Vec<Result<()>> {
        blobs
            .iter()
            .map(|b| self.get_blob(&b.digest, b.size, &b.dest))
            .collect()
    }
    /// Uploads the file `src` as the blob `digest`, skipped when present;
    /// returns whether it was uploaded.
    fn put_blob(&self, src: &Path, digest: &str, size: u64) -> Result<bool>;
    /// Stores `bytes` (an OCI image manifest) under `tag`; returns its digest.
    fn put_manifest(&self, tag: &str, bytes: &[u8]) -> Result<String>;
    /// Every tag of the cache.
    fn tags(&self) -> Result<Vec<String>>;
    /// Deletes the manifest `digest` (and with it every tag naming it):
    /// `DELETE /v2/<name>/manifests/<digest>` on a registry. Used by
    /// `cache gc` ([`catalog`]); blobs are left to the registry's own
    /// garbage collector.
    ///
    /// Errors: the cache refuses (a registry without deletes enabled
    /// answers 405 `UNSUPPORTED`); the default: not supported by this
    /// transport.
    fn delete_manifest(&self, digest: &str) -> Result<()> {
        bail!(
            "cache {}: deleting manifest {digest} is not supported",
            self.describe()
        )
    }
}

/// Opens the configured cache `cache` (its URL, with its timeouts).
///
/// Errors: the layout path is not a directory; the registry client cannot be made.
pub fn open(cache: &config::Cache) -> Result<Box<dyn Transport>> {
    let url = &cache.url;
    let shown = url.to_string();
    Ok(match url {
        config::CacheUrl::File { dir } => Box::new(layout::Layout::open(dir, &shown)?),
        config::CacheUrl::Oci { host, port, repo }
        | config::CacheUrl::OciHttp { host, port, repo } => {
            let host = match port {
                Some(p) => format!("{host}:{p}"),
                None => host.clone(),
            };
            let plain = matches!(url, config::CacheUrl::OciHttp { .. });
            Box::new(registry::Registry::new(
                &host,
                repo,
                plain,
                &shown,
                cache.timeouts,
            )?)
        }
    })
}

/// `sha256:<hex>` of `bytes`.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The hex part of a `sha256:<hex>` digest.
///
/// Errors: another algorithm or not 64 lowercase hex digits.
pub fn digest_hex(digest: &str) -> Result<&str> {
    match digest.strip_prefix("sha256:") {
        Some(h)
            if h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(h)
        }
        _ => bail!("digest {digest:?} is not sha256:<64 hex digits>"),
    }
}
