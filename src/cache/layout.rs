//! A `file://` cache: an OCI image layout on disk (OCI image spec,
//! `image-layout.md`), readable by `oras` and `skopeo`:
//!
//! ```text
//! <dir>/oci-layout            {"imageLayoutVersion": "1.0.0"}
//! <dir>/index.json            an image index; each tag is a manifest descriptor
//!                             with the annotation org.opencontainers.image.ref.name
//! <dir>/blobs/sha256/<hex>    every blob and manifest, by digest
//! ```
//!
//! Blobs are written to a temporary file in `blobs/sha256/`, checked against
//! their digest and renamed into place; `index.json` is rewritten through a
//! temporary file and a rename, under an OS file lock (`<dir>/.index.lock`),
//! so concurrent pushers on one file system (NFS included) never lose a tag.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use fs_err as fs;
use serde_json::{Value, json};

use super::{Fetched, Transport, digest_hex, digest_of};
use crate::store::sha256_file;

/// The annotation holding a manifest's tag in `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The media type of an OCI image manifest.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// An OCI image layout at a directory.
#[derive(Debug, Clone)]
pub struct Layout {
    dir: PathBuf,
    url: String,
}

impl Layout {
    /// The layout at `dir` (`url` is how the user named it). Nothing is
    /// created until something is pushed.
    ///
    /// Errors: `dir` exists but is not a directory, or holds files but no
    /// `oci-layout` (some other directory: reading it as an empty cache
    /// would hide the mistake, and a push would write into it).
    pub fn open(dir: &Path, url: &str) -> Result<Layout> {
        if dir.exists() && !dir.is_dir() {
            bail!("cache {url}: {} is not a directory", dir.display());
        }
        if !dir.join("oci-layout").exists()
            && fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
        {
            bail!(
                "cache {url}: {} is not an OCI image layout (it holds files but no oci-layout); point the cache at a new or empty directory, or at the layout itself",
                dir.display()
            );
        }
        Ok(Layout {
            dir: dir.to_path_buf(),
            url: url.to_string(),
        })
    }

    /// The path of blob `digest`.
    ///
    /// Errors: not a sha256 digest.
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        Ok(self.dir.join("blobs/sha256").join(digest_hex(digest)?))
    }

    fn init(&self) -> Result<()> {
        fs::create_dir_all(self.dir.join("blobs/sha256"))?;
        let marker = self.dir.join("oci-layout");
        if !marker.exists() {
            crate::store::write_atomic(&marker, br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        }
        Ok(())
    }

    fn index(&self) -> Result<Value> {
        let p = self.dir.join("index.json");
        if !p.exists() {
            return Ok(json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [],
            }));
        }
        let bytes = super::bounds::read_bounded(
            fs::File::open(&p)?,
            super::bounds::INDEX_LIMIT,
            &p.display().to_string(),
        )?;
        let v: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not JSON", p.display()))?;
        if !v["manifests"].is_array() {
            bail!("{} has no manifests array", p.display());
        }
        Ok(v)
    }

    /// Writes `bytes` as blob `digest` (temporary file, check, rename).
    fn write_blob(
        &self,
        digest: &str,
        write: impl FnOnce(&mut fs::File) -> Result<()>,
    ) -> Result<()> {
        let dest = self.blob_path(digest)?;
        if dest.exists() {
            return Ok(());
        }
        let dir = self.dir.join("blobs/sha256");
        let tmp = tempfile::Builder::new()
            .prefix(".upload.")
            .tempfile_in(&dir)
            .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
        let (file, tmp_path) = tmp.into_parts();
        let mut f = fs::File::from_parts(file, tmp_path.to_path_buf());
        write(&mut f)?;
        f.sync_all()?;
        let got = format!("sha256:{}", sha256_file(&tmp_path)?);
        if got != digest {
            bail!(
                "uploading blob {digest} to {}: what was written has {got}",
                self.url
            );
        }
        tmp_path
            .persist(&dest)
            .map_err(|e| anyhow!("renaming into {}: {}", dest.display(), e.error))?;
        Ok(())
    }
}

impl Transport for Layout {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn manifest(&self, tag: &str) -> Result<Option<Fetched>> {
        let index = self.index()?;
        let Some(desc) = index["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .rev()
            .find(|m| m["annotations"][REF_NAME].as_str() == Some(tag))
        else {
            return Ok(None);
        };
        let digest = desc["digest"]
            .as_str()
            .ok_or_else(|| anyhow!("{}: index.json entry of {tag} has no digest", self.url))?;
        let path = self.blob_path(digest)?;
        let bytes = super::bounds::read_bounded(
            fs::File::open(&path)?,
            super::bounds::MANIFEST_LIMIT,
            &format!("cache {}: manifest {digest} of {tag}", self.url),
        )?;
        let got = digest_of(&bytes);
        if got != digest {
            bail!(
                "cache {}: manifest {digest} of {tag} does not match its digest (got {got})",
                self.url
            );
        }
        Ok(Some(Fetched {
            bytes,
            digest: digest.to_string(),
        }))
    }

    fn has_blob(&self, digest: &str) -> Result<bool> {
        Ok(self.blob_path(digest)?.is_file())
    }

    fn get_blob(&self, digest: &str, size: u64, dest: &Path) -> Result<()> {
        let src = self.blob_path(digest)?;
        let r = (|| {
            let mut out = fs::File::create(dest)?;
            let copied = super::bounds::copy_bounded(fs::File::open(&src)?, &mut out, size)
                .with_context(|| {
                    format!(
                        "cache {}: reading blob {digest} ({size} bytes declared)",
                        self.url
                    )
                })?;
            out.sync_all()?;
            let (len, got) = (copied.len, copied.digest);
            if got != digest || len != size {
                bail!(
                    "cache {}: blob {digest} does not match its digest (got {got}, {len} bytes; expected {size})",
                    self.url
                );
            }
            Ok(())
        })();
        if r.is_err() {
            let _ = fs::remove_file(dest);
        }
        r
    }

    fn put_blob(&self, src: &Path, digest: &str, _size: u64) -> Result<bool> {
        self.init()?;
        if self.has_blob(digest)? {
            return Ok(false);
        }
        self.write_blob(digest, |f| {
            std::io::copy(&mut fs::File::open(src)?, f)?;
            Ok(())
        })?;
        Ok(true)
    }

    fn put_manifest(&self, tag: &str, bytes: &[u8]) -> Result<String> {
        self.init()?;
        let digest = digest_of(bytes);
        self.write_blob(&digest, |f| Ok(f.write_all(bytes)?))?;
        let lock = lock_index(&self.dir)?;
        let mut index = self.index()?;
        let list = index["manifests"]
            .as_array_mut()
            .ok_or_else(|| anyhow!("index.json has no manifests array"))?;
        list.retain(|m| m["annotations"][REF_NAME].as_str() != Some(tag));
        list.push(json!({
            "mediaType": MANIFEST_MEDIA_TYPE,
            "digest": digest,
            "size": bytes.len(),
            "annotations": {REF_NAME: tag},
        }));
        crate::store::write_atomic(
            &self.dir.join("index.json"),
            &serde_json::to_vec_pretty(&index)?,
        )?;
        drop(lock);
        Ok(digest)
    }

    fn tags(&self) -> Result<Vec<String>> {
        let index = self.index()?;
        let mut out: Vec<String> = index["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["annotations"][REF_NAME].as_str().map(str::to_string))
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// Takes the exclusive lock of the layout at `dir` (`<dir>/.index.lock`),
/// held while the returned file is open: pushers hold it to rewrite
/// `index.json`, `cache gc` to delete tags.
///
/// Errors: the lock file cannot be opened or locked (naming it).
pub fn lock_index(dir: &Path) -> Result<std::fs::File> {
    let lock_path = dir.join(".index.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    Ok(lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_that_is_no_layout_is_refused_and_an_empty_one_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("notes");
        fs::create_dir_all(&other).unwrap();
        fs::write(other.join("todo.txt"), "x").unwrap();
        let e = format!("{:#}", Layout::open(&other, "file:///notes").err().unwrap());
        assert!(
            e.contains("file:///notes") && e.contains("not an OCI image layout"),
            "{e}"
        );
        let empty = dir.path().join("empty");
        fs::create_dir_all(&empty).unwrap();
        let l = Layout::open(&empty, "file:///empty").unwrap();
        let src = dir.path().join("src");
        fs::write(&src, b"abc").unwrap();
        l.put_blob(&src, &digest_of(b"abc"), 3).unwrap();
        // Once pushed to, it is a layout and opens again.
        Layout::open(&empty, "file:///empty").unwrap();
        assert!(Layout::open(&dir.path().join("new"), "file:///new").is_ok());
    }

    #[test]
    fn a_blob_larger_than_declared_is_read_only_up_to_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::open(&dir.path().join("l"), "file:///l").unwrap();
        let src = dir.path().join("src");
        fs::write(&src, b"0123456789").unwrap();
        let digest = digest_of(b"0123456789");
        layout.put_blob(&src, &digest, 10).unwrap();
        // Someone appends 8 MiB to the blob file in the layout.
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(layout.blob_path(&digest).unwrap())
            .unwrap();
        f.write_all(&vec![b'x'; 8 << 20]).unwrap();
        let dest = dir.path().join("got");
        let e = format!("{:#}", layout.get_blob(&digest, 10, &dest).unwrap_err());
        assert!(
            e.contains("file:///l")
                && e.contains(&digest)
                && e.contains("more than its declared 10 bytes"),
            "{e}"
        );
        assert!(!dest.exists(), "the partial blob is removed");
        // The untouched blob reads back whole.
        fs::write(layout.blob_path(&digest).unwrap(), b"0123456789").unwrap();
        layout.get_blob(&digest, 10, &dest).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"0123456789");
    }
}
