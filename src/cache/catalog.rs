//! What `cache gc` needs beyond [`super::Transport`]: removing a tag
//! ([`Prune`]), and its implementation for an OCI image layout on disk
//! ([`LayoutPrune`]; OCI image spec, "image-layout.md": `oci-layout`,
//! `index.json`, `blobs/sha256/<hex>`, tags as
//! `org.opencontainers.image.ref.name` annotations in the index).
//!
//! Reading (tags, manifests, blobs) goes through [`super::Transport`];
//! only deletion is here. In a registry (`oci://`, `oci+http://`,
//! [`RegistryPrune`]) a tag is deleted by deleting the manifest it names
//! (OCI distribution spec, "Deleting manifests": `DELETE
//! /v2/<name>/manifests/<digest>`; distribution needs `storage: delete:
//! enabled: true`), which is safe because in the append-only layout a
//! manifest belongs to one entry; its blobs are left to the registry's own
//! garbage collector (`registry garbage-collect`), which is the only thing
//! that knows what other repositories reference.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use fs_err as fs;
use serde_json::Value;

use super::config::{Cache, CacheUrl};
use super::digest_hex;
use super::layout::REF_NAME;

/// How old an unreferenced blob must be before [`Prune::sweep`] removes it:
/// a push uploads its blobs first and its manifest last, so a younger blob
/// may belong to a push in flight.
pub const SWEEP_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removing tags from a cache.
pub trait Prune {
    /// Removes `tag` (nothing when it is not there). Blobs are not touched;
    /// see [`Prune::sweep`].
    ///
    /// Errors: the tag list cannot be read or rewritten.
    fn delete_tag(&self, tag: &str) -> Result<()>;

    /// Removes (with `dry_run`: only lists) every blob no tagged manifest
    /// references, as config, layer or the manifest itself, and that is
    /// older than [`SWEEP_GRACE`]; returns their digests and the bytes they
    /// take.
    ///
    /// Errors: the tag list or a manifest cannot be read, or a removal fails.
    fn sweep(&self, dry_run: bool) -> Result<(Vec<String>, u64)>;
}

/// The [`Prune`] of the configured cache `cache` (a registry's with its
/// timeouts).
///
/// Errors: the registry client cannot be made.
pub fn pruner(cache: &Cache) -> Result<Box<dyn Prune>> {
    match &cache.url {
        CacheUrl::File { dir } => Ok(Box::new(LayoutPrune {
            dir: dir.to_path_buf(),
        })),
        CacheUrl::Oci { .. } | CacheUrl::OciHttp { .. } => Ok(Box::new(RegistryPrune {
            transport: super::open(cache)?,
        })),
    }
}

/// Deletion in a registry, through its API.
pub struct RegistryPrune {
    /// The registry.
    pub transport: Box<dyn super::Transport>,
}

impl Prune for RegistryPrune {
    /// Deletes the manifest `tag` names (nothing when the tag is gone).
    ///
    /// Errors: the registry refuses (deletes not enabled: distribution
    /// answers 405 `UNSUPPORTED`; the message says so).
    fn delete_tag(&self, tag: &str) -> Result<()> {
        let Some(m) = self.transport.manifest(tag)? else {
            return Ok(());
        };
        self.transport
            .delete_manifest(&m.digest)
            .with_context(|| format!("cache gc: deleting {tag}"))
    }

    /// Nothing: a registry's blobs are collected by the registry itself.
    fn sweep(&self, _dry_run: bool) -> Result<(Vec<String>, u64)> {
        Ok((Vec::new(), 0))
    }
}

/// Deletion in an OCI image layout directory.
#[derive(Debug, Clone)]
pub struct LayoutPrune {
    /// The layout's root (holds `oci-layout` and `index.json`).
    pub dir: PathBuf,
}

impl LayoutPrune {
    fn index_path(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    /// `index.json` as JSON (an empty index when there is none).
    fn index(&self) -> Result<Value> {
        let p = self.index_path();
        if !p.exists() {
            return Ok(serde_json::json!({"schemaVersion": 2, "manifests": []}));
        }
        let v: Value = serde_json::from_slice(&fs::read(&p)?)
            .with_context(|| format!("{} is not JSON", p.display()))?;
        if !v["manifests"].is_array() {
            bail!("{} has no manifests array", p.display());
        }
        Ok(v)
    }

    /// Runs `f` holding the layout's index lock (`.index.lock`, the lock
    /// pushers take), so no concurrent push loses its tag.
    fn locked<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let lock = super::layout::lock_index(&self.dir)?;
        let out = f();
        drop(lock);
        out
    }

    fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        Ok(self.dir.join("blobs/sha256").join(digest_hex(digest)?))
    }
}

/// The digests manifest (or index) blob `manifest` references: its config
/// and layers, and the manifests an index lists.
fn referenced_by(manifest: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let v: Value = serde_json::from_slice(&fs::read(manifest)?)
        .with_context(|| format!("{} is not a JSON manifest", manifest.display()))?;
    let digests = |key: &str| -> Vec<String> {
        v[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["digest"].as_str().map(str::to_string))
            .collect()
    };
    let mut leaves = digests("layers");
    if let Some(d) = v["config"]["digest"].as_str() {
        leaves.push(d.to_string());
    }
    Ok((leaves, digests("manifests")))
}

impl Prune for LayoutPrune {
    fn delete_tag(&self, tag: &str) -> Result<()> {
        if !self.index_path().exists() {
            return Ok(());
        }
        self.locked(|| {
            let mut index = self.index()?;
            let list = index["manifests"]
                .as_array_mut()
                .ok_or_else(|| anyhow!("index.json has no manifests array"))?;
            let before = list.len();
            list.retain(|m| m["annotations"][REF_NAME].as_str() != Some(tag));
            if list.len() != before {
                crate::store::write_atomic(
                    &self.index_path(),
                    &serde_json::to_vec_pretty(&index)?,
                )?;
            }
            Ok(())
        })
    }

    fn sweep(&self, dry_run: bool) -> Result<(Vec<String>, u64)> {
        let blobs = self.dir.join("blobs/sha256");
        if !blobs.is_dir() {
            return Ok((Vec::new(), 0));
        }
        self.locked(|| {
            let index = self.index()?;
            let mut keep: BTreeSet<String> = BTreeSet::new();
            // (digest, whether it is a manifest or index whose references count)
            let mut todo: Vec<(String, bool)> = index["manifests"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["digest"].as_str().map(|d| (d.to_string(), true)))
                .collect();
            while let Some((d, is_manifest)) = todo.pop() {
                if !keep.insert(d.clone()) {
                    continue;
                }
                let p = self.blob_path(&d)?;
                if is_manifest && p.is_file() {
                    let (leaves, manifests) = referenced_by(&p)?;
                    todo.extend(leaves.into_iter().map(|d| (d, false)));
                    todo.extend(manifests.into_iter().map(|d| (d, true)));
                }
            }
            let mut removed = Vec::new();
            let mut bytes = 0;
            let mut names: Vec<_> = fs::read_dir(&blobs)?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            for name in names {
                // Uploads in flight (`.upload.*`) belong to a pusher.
                if name.starts_with('.') {
                    continue;
                }
                let digest = format!("sha256:{name}");
                if keep.contains(&digest) {
                    continue;
                }
                let p = blobs.join(&name);
                let meta = fs::metadata(&p)?;
                // A pusher uploads blobs before its manifest; leave young
                // blobs to the pusher that may be about to reference them.
                let young = meta
                    .modified()
                    .ok()
                    .and_then(|m| m.elapsed().ok())
                    .is_none_or(|age| age < SWEEP_GRACE);
                if young {
                    continue;
                }
                bytes += meta.len();
                if !dry_run {
                    fs::remove_file(&p)?;
                }
                removed.push(digest);
            }
            Ok((removed, bytes))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    /// Writes `bytes` as a blob of the layout at `dir`, `age` old; returns its digest.
    fn blob(dir: &Path, bytes: &[u8], age: Duration) -> String {
        let digest = crate::cache::digest_of(bytes);
        let p = dir.join("blobs/sha256").join(digest_hex(&digest).unwrap());
        std::fs::write(&p, bytes).unwrap();
        let f = std::fs::File::options().write(true).open(&p).unwrap();
        f.set_modified(SystemTime::now() - age).unwrap();
        digest
    }

    #[test]
    fn sweep_keeps_what_tags_reach_and_young_blobs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        let old = Duration::from_secs(2 * 3600);
        let config = blob(dir, b"{\"kind\":\"wheel\"}", old);
        let layer = blob(dir, b"wheel bytes", old);
        let manifest = format!(
            "{{\"schemaVersion\":2,\"config\":{{\"digest\":\"{config}\"}},\"layers\":[{{\"digest\":\"{layer}\"}}]}}"
        );
        let m = blob(dir, manifest.as_bytes(), old);
        let hint = format!("{{\"schemaVersion\":2,\"manifests\":[{{\"digest\":\"{m}\"}}]}}");
        let index_blob = blob(dir, hint.as_bytes(), old);
        let orphan = blob(dir, b"nobody's", old);
        let young = blob(dir, b"a push in flight", Duration::from_secs(0));
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [
            {"digest": m, "annotations": {REF_NAME: "wheel-k"}},
            {"digest": index_blob, "annotations": {REF_NAME: "index-fx"}},
        ]});
        std::fs::write(dir.join("index.json"), index.to_string()).unwrap();
        let p = LayoutPrune {
            dir: dir.to_path_buf(),
        };

        let (listed, bytes) = p.sweep(true).unwrap();
        assert_eq!(listed, vec![orphan.clone()]);
        assert_eq!(bytes, 8);
        assert!(
            p.blob_path(&orphan).unwrap().exists(),
            "a dry run removes nothing"
        );
        assert_eq!(p.sweep(false).unwrap().0, vec![orphan.clone()]);
        assert!(!p.blob_path(&orphan).unwrap().exists());
        assert!(p.blob_path(&young).unwrap().exists());

        // Untagging the wheel: the hint index still reaches its manifest.
        p.delete_tag("wheel-k").unwrap();
        assert!(p.sweep(false).unwrap().0.is_empty());
        // Untagging the hint too: manifest, config and layer go; the young blob stays.
        p.delete_tag("index-fx").unwrap();
        p.delete_tag("no-such-tag").unwrap();
        let mut gone = p.sweep(false).unwrap().0;
        gone.sort();
        let mut want = vec![config, layer, m, index_blob];
        want.sort();
        assert_eq!(gone, want);
        assert!(p.blob_path(&young).unwrap().exists());
        let index: Value =
            serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
        assert_eq!(index["manifests"], serde_json::json!([]));
    }
}
