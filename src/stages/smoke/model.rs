//! The identity of a gate case's model: a manifest of its directory (every
//! file's relative path, size and sha256; for a Hugging Face hub snapshot,
//! `.../models--ORG--NAME/snapshots/<revision>/` whose files are links into
//! `../../blobs/<name>`, also the hub's repository, revision and each file's
//! blob name), recorded with each case in `oracle.json` and with every
//! golden, and compared when a golden is ([`diff`]; docs/smoke.md, "The
//! model's identity").
//!
//! Hashing tens of GiB must not slow every gate: each file's sha256 is kept
//! in `<root>/model-hashes/<h>.json` (one small file per model directory,
//! written atomically) under the file's (path, size, mtime, ctime, inode,
//! device); a file whose size, times or inode changed is hashed again.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::progress;
use crate::store::key::canonical_json;
use crate::store::write_json;

/// The `format` of a kept-hashes file.
const HASHES_FORMAT: &str = "oracle-build-model-hashes/1";
/// At most this many files in a model directory.
const MAX_FILES: usize = 100_000;
/// At most this deep below the model directory.
const MAX_DEPTH: usize = 32;
/// A kept-hashes file larger than this is ignored (every file hashed again).
const MAX_KEPT_BYTES: u64 = 64 << 20;
/// Top-level paths of a model directory that are not the model: git's
/// metadata (a `git lfs` clone) and the hub client's download records of a
/// `--local-dir` download, both rewritten by tools without the model changing.
const NOT_THE_MODEL: &[&str] = &[".git", ".cache/huggingface"];

/// One file of a model directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ModelFile {
    /// Path relative to the model directory (`/`-separated).
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex sha256 of its bytes.
    pub sha256: String,
    /// For a hub snapshot: the name of the blob the file links to (for a
    /// Git LFS file, its sha256; else its git blob id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<String>,
}

/// What a hub snapshot's path says of it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HubSnapshot {
    /// The hub repository, `ORG/NAME` (from `models--ORG--NAME`).
    pub repo: String,
    /// The snapshot's revision (the commit the hub served).
    pub revision: String,
    /// The refs of the cache (`refs/<name>`) that name this revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<String>,
}

/// How the hashes of one manifest were had: read now or kept from before.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct Hashing {
    /// Files whose bytes were read now.
    pub files_hashed: usize,
    /// Bytes read now (0: every hash was kept).
    pub hashed_bytes: u64,
    /// Files whose kept hash was used (their size, times and inode unchanged).
    pub files_kept: usize,
    /// True when every file's hash was kept.
    pub from_cache: bool,
    /// The kept-hashes file (absent: none kept, e.g. a read-only store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_in: Option<PathBuf>,
}

/// The manifest of a model directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ModelManifest {
    /// The directory (or single file) hashed, symlinks resolved.
    pub dir: String,
    /// sha256 of the canonical JSON of `[[path, size, sha256], ...]`.
    pub digest: String,
    /// Total bytes of the files.
    pub bytes: u64,
    /// Every file, sorted by path.
    pub files: Vec<ModelFile>,
    /// The hub snapshot the directory is, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<HubSnapshot>,
    /// Files whose bytes do not hash to the sha256 their hub blob is named by
    /// (a damaged download); each fails the case.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// How the hashes were had (this run only; not in goldens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hashing: Option<Hashing>,
}

impl ModelManifest {
    /// The manifest as a golden keeps it: without this run's [`Hashing`].
    pub fn for_golden(&self) -> ModelManifest {
        ModelManifest {
            hashing: None,
            ..self.clone()
        }
    }

    /// One line: files, bytes, revision, and how the hashes were had.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} files, {}, manifest sha256 {}",
            self.files.len(),
            human_bytes(self.bytes),
            &self.digest[..self.digest.len().min(16)]
        );
        if let Some(h) = &self.hub {
            s.push_str(&format!("; hub {} revision {}", h.repo, h.revision));
        }
        if let Some(h) = &self.hashing {
            if h.from_cache {
                s.push_str("; every hash kept from before");
            } else {
                s.push_str(&format!(
                    "; {} files hashed now ({}), {} kept",
                    h.files_hashed,
                    human_bytes(h.hashed_bytes),
                    h.files_kept
                ));
            }
        }
        s
    }
}

fn human_bytes(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let f = b as f64;
    if f >= GIB {
        format!("{:.2} GiB", f / GIB)
    } else if f >= MIB {
        format!("{:.1} MiB", f / MIB)
    } else {
        format!("{b} bytes")
    }
}

/// How a case's model stands against its golden's (`CaseResult::model_check`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ModelCheck {
    /// Every file the golden's manifest lists, and no other, with its sha256.
    #[serde(rename = "matched")]
    Matched,
    /// Files differ: the golden is refused (see `model_diff`).
    #[serde(rename = "differs")]
    Differs,
    /// The golden records no manifest (recorded before this check, or a
    /// numpy golden): the model was not checked.
    #[serde(rename = "not checked")]
    NotChecked,
}

/// The files on which two manifests differ.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ModelDiff {
    /// In this run's model, not in the golden's.
    pub added: Vec<String>,
    /// In the golden's, not in this run's.
    pub removed: Vec<String>,
    /// In both, with another size or sha256.
    pub changed: Vec<String>,
    /// The golden's hub revision and this one's, when they differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<(String, String)>,
}

impl ModelDiff {
    /// Whether the files are the same (a revision alone does not count).
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

impl std::fmt::Display for ModelDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[String]| {
            let mut s = v.iter().take(20).cloned().collect::<Vec<_>>().join(", ");
            if v.len() > 20 {
                s.push_str(&format!(" and {} more", v.len() - 20));
            }
            s
        };
        let mut parts = Vec::new();
        for (what, v) in [
            ("changed", &self.changed),
            ("added", &self.added),
            ("removed", &self.removed),
        ] {
            if !v.is_empty() {
                parts.push(format!("{what}: {}", list(v)));
            }
        }
        if let Some((g, n)) = &self.revision {
            parts.push(format!("hub revision: golden {g} vs now {n}"));
        }
        f.write_str(&parts.join("; "))
    }
}

/// The files on which `golden` and `now` differ, by path (size and sha256).
pub fn diff(golden: &ModelManifest, now: &ModelManifest) -> ModelDiff {
    let g: BTreeMap<&str, &ModelFile> = golden.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let n: BTreeMap<&str, &ModelFile> = now.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let mut d = ModelDiff::default();
    for (p, nf) in &n {
        match g.get(p) {
            None => d.added.push((*p).to_string()),
            Some(gf) if gf.size != nf.size || gf.sha256 != nf.sha256 => {
                d.changed.push((*p).to_string())
            }
            Some(_) => {}
        }
    }
    d.removed = g
        .keys()
        .filter(|p| !n.contains_key(*p))
        .map(|p| (*p).to_string())
        .collect();
    if let (Some(a), Some(b)) = (&golden.hub, &now.hub)
        && a.revision != b.revision
    {
        d.revision = Some((a.revision.clone(), b.revision.clone()));
    }
    d
}

/// A file's kept hash and the facts it was kept under.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Kept {
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
    dev: u64,
    sha256: String,
}

/// `<root>/model-hashes/<h>.json`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
struct KeptFile {
    format: String,
    dir: String,
    files: BTreeMap<String, Kept>,
}

fn stat_of(m: &std::fs::Metadata) -> (u64, i128, i128, u64, u64) {
    (
        m.size(),
        i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        m.ino(),
        m.dev(),
    )
}

/// One file found under the model directory.
struct Found {
    rel: String,
    path: PathBuf,
    meta: std::fs::Metadata,
    blob: Option<String>,
}

/// What is at a case's model path.
#[derive(Debug)]
pub enum Presence {
    /// Nothing: `lstat` finds no entry (the model is not on this box).
    Absent,
    /// Something that resolves (a directory, a file, a link to one).
    Present,
    /// An entry that cannot be resolved: a dangling link, a link loop, a
    /// parent that cannot be searched. What is wrong, in words.
    Unresolvable(String),
}

/// What is at the model path `path`: [`Presence::Absent`] only when
/// nothing exists there (`lstat` fails with `ENOENT`); a link that exists
/// but does not resolve (dangling, or a loop such as `ln -s l l`) is
/// [`Presence::Unresolvable`], naming the link's target and the OS error.
pub fn presence(path: &Path) -> Presence {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Presence::Absent,
        Err(e) => Presence::Unresolvable(format!("cannot be read: {e}")),
        Ok(_) => match std::fs::metadata(path) {
            Ok(_) => Presence::Present,
            Err(e) => Presence::Unresolvable(match std::fs::read_link(path) {
                Ok(target) => format!(
                    "is a symbolic link to {} that cannot be resolved: {e}",
                    target.display()
                ),
                Err(_) => format!("cannot be resolved: {e}"),
            }),
        },
    }
}

/// The manifest of the model at `model` (a directory, or one file such as a
/// GGUF), every file's sha256 kept in `hashes_dir` (`None`: none kept, every
/// file hashed) and reused while the file's size, mtime, ctime, inode and
/// device are unchanged.
///
/// Errors: the model cannot be read (a broken symlink, as a partial copy
/// leaves; an unreadable file; more than 100,000 files or 32 levels), or
/// a file changed while it was hashed. A kept-hashes file that cannot be
/// read or written costs only the time to hash again.
pub fn take(model: &Path, hashes_dir: Option<&Path>) -> Result<ModelManifest> {
    let dir = model
        .canonicalize()
        .with_context(|| format!("resolving the model path {}", model.display()))?;
    let dir_text = dir.display().to_string();
    let hub = hub_of(&dir);
    let blobs = hub
        .as_ref()
        .and_then(|_| dir.parent()?.parent())
        .and_then(|r| r.join("blobs").canonicalize().ok());
    let mut found = Vec::new();
    let mut irregular = Vec::new();
    let top = std::fs::metadata(&dir)
        .with_context(|| format!("reading the model path {}", dir.display()))?;
    if !top.is_file() && !top.is_dir() {
        bail!(
            "the model path {} is {}, not a directory or a regular file: nothing of it can be hashed",
            model.display(),
            irregular_kind(&top, model)
        );
    }
    if top.is_file() {
        let meta = top;
        let name = dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        found.push(Found {
            rel: name,
            path: dir.clone(),
            meta,
            blob: None,
        });
    } else {
        walk(&dir, "", 0, blobs.as_deref(), &mut found, &mut irregular)?;
    }
    if !irregular.is_empty() {
        bail!(
            "model directory {} holds {}, which the manifest cannot vouch for (the engine may read it; hashing it could block or never end): {}",
            dir.display(),
            if irregular.len() == 1 {
                "1 entry that is not a regular file".to_string()
            } else {
                format!("{} entries that are not regular files", irregular.len())
            },
            irregular.join("; ")
        );
    }
    found.sort_by(|a, b| a.rel.cmp(&b.rel));

    let kept_path = hashes_dir.map(|d| {
        d.join(format!(
            "{}.json",
            &hex::encode(Sha256::digest(dir_text.as_bytes()))[..32]
        ))
    });
    let kept = kept_path
        .as_deref()
        .and_then(read_kept)
        .filter(|k| k.format == HASHES_FORMAT && k.dir == dir_text)
        .unwrap_or_default();
    let to_hash: u64 = found
        .iter()
        .filter(|f| !is_kept(&kept, f))
        .map(|f| f.meta.len())
        .sum();
    if to_hash > 0 {
        progress::stage(
            "smoke",
            format!(
                "model: hashing {} of {} (kept for the next gate)",
                human_bytes(to_hash),
                dir.display()
            ),
        );
    }
    let mut hashing = Hashing {
        kept_in: kept_path.clone(),
        ..Hashing::default()
    };
    let mut next = KeptFile {
        format: HASHES_FORMAT.into(),
        dir: dir_text.clone(),
        files: BTreeMap::new(),
    };
    let mut files = Vec::new();
    let mut problems = Vec::new();
    for f in found {
        let (size, mtime_ns, ctime_ns, ino, dev) = stat_of(&f.meta);
        let sha256 = match kept.files.get(&f.rel).filter(|_| is_kept(&kept, &f)) {
            Some(k) => {
                hashing.files_kept += 1;
                k.sha256.clone()
            }
            None => {
                let sha = hash_file(&f.path, &f.meta)?;
                hashing.files_hashed += 1;
                hashing.hashed_bytes += size;
                sha
            }
        };
        if let Some(b) = &f.blob
            && b.len() == 64
            && b.bytes().all(|c| c.is_ascii_hexdigit())
            && !b.eq_ignore_ascii_case(&sha256)
        {
            problems.push(format!(
                "model file {}: its hub blob is named by sha256 {b}, but its bytes hash to {sha256} (a damaged download)",
                f.rel
            ));
        }
        next.files.insert(
            f.rel.clone(),
            Kept {
                size,
                mtime_ns,
                ctime_ns,
                ino,
                dev,
                sha256: sha256.clone(),
            },
        );
        files.push(ModelFile {
            path: f.rel,
            size,
            sha256,
            blob: f.blob,
        });
    }
    hashing.from_cache = hashing.files_hashed == 0;
    if let Some(p) = &kept_path
        && (hashing.files_hashed > 0 || next.files.len() != kept.files.len())
    {
        let written = p
            .parent()
            .map_or(Ok(()), |d| std::fs::create_dir_all(d).map_err(Into::into))
            .and_then(|()| write_json(p, &next));
        if let Err(e) = written {
            progress::stage(
                "smoke",
                format!("model: the hashes could not be kept ({e:#}); the next gate hashes again"),
            );
            hashing.kept_in = None;
        }
    }
    let listed: Vec<serde_json::Value> = files
        .iter()
        .map(|f| serde_json::json!([f.path, f.size, f.sha256]))
        .collect();
    Ok(ModelManifest {
        dir: dir_text,
        digest: hex::encode(Sha256::digest(canonical_json(&listed).as_bytes())),
        bytes: files.iter().map(|f| f.size).sum(),
        files,
        hub,
        problems,
        hashing: Some(hashing),
    })
}

/// Whether `f`'s kept hash may be used: its size, times, inode and device as kept.
fn is_kept(kept: &KeptFile, f: &Found) -> bool {
    let (size, mtime_ns, ctime_ns, ino, dev) = stat_of(&f.meta);
    kept.files.get(&f.rel).is_some_and(|k| {
        k.size == size
            && k.mtime_ns == mtime_ns
            && k.ctime_ns == ctime_ns
            && k.ino == ino
            && k.dev == dev
    })
}

/// The kept-hashes file at `path`, read with a bound; `None` when absent,
/// too large or not one.
fn read_kept(path: &Path) -> Option<KeptFile> {
    let f = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    f.take(MAX_KEPT_BYTES + 1).read_to_string(&mut text).ok()?;
    if text.len() as u64 > MAX_KEPT_BYTES {
        return None;
    }
    serde_json::from_str(&text).ok()
}

/// The sha256 of the file at `path`, `meta` its metadata before. It is
/// opened without blocking and must be a regular file then too
/// ([`crate::regular_file::open`]: a FIFO swapped in is never waited on);
/// it is read to its end but at most `meta.len() + 1` bytes, and must hold
/// exactly `meta.len()` (a file whose size is not its content, as a link
/// to `/proc/self/status`, size 0, is refused, not hashed as empty) and
/// still be that size and mtime after.
fn hash_file(path: &Path, meta: &std::fs::Metadata) -> Result<String> {
    let f = crate::regular_file::open(path)
        .map_err(|e| anyhow::anyhow!("model file {} {e}", path.display()))?;
    let mut h = Sha256::new();
    let n = std::io::copy(&mut f.take(meta.len().saturating_add(1)), &mut h)
        .with_context(|| format!("reading {}", path.display()))?;
    let after = std::fs::metadata(path)?;
    if n != meta.len() || stat_of(&after).0 != meta.len() || stat_of(&after).1 != stat_of(meta).1 {
        bail!(
            "model file {} changed while hashed or its size is not its content: its size said {} bytes, {} came; run the gate again once it is complete, or replace it with a regular file",
            path.display(),
            meta.len(),
            if n > meta.len() {
                "more".to_string()
            } else {
                n.to_string()
            }
        );
    }
    Ok(hex::encode(h.finalize()))
}

/// The kind of the non-regular, non-directory `meta` (of the path
/// `path`, links followed), in words, with the link's target when `path`
/// is a link: `a FIFO`, `a character device (a link to /dev/zero)`.
fn irregular_kind(meta: &std::fs::Metadata, path: &Path) -> String {
    let kind = crate::regular_file::kind_of(meta.file_type());
    match std::fs::read_link(path) {
        Ok(target) => format!("{kind} (a link to {})", target.display()),
        Err(_) => kind.to_string(),
    }
}

/// Every file under `dir` (links followed, [`NOT_THE_MODEL`] left out),
/// with the blob name of each link into `blobs`; every entry that is
/// neither a directory nor a regular file (a FIFO, a socket, a device, a
/// link to one) into `irregular`, as `<path>: <kind>`. Nothing is opened.
fn walk(
    dir: &Path,
    rel: &str,
    depth: usize,
    blobs: Option<&Path>,
    out: &mut Vec<Found>,
    irregular: &mut Vec<String>,
) -> Result<()> {
    if depth > MAX_DEPTH {
        bail!(
            "model directory {} is more than {MAX_DEPTH} levels deep (a symlink loop?)",
            dir.display()
        );
    }
    let mut entries: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)
        .with_context(|| format!("reading the model directory {}", dir.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let r = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        if NOT_THE_MODEL.contains(&r.as_str()) {
            continue;
        }
        let path = e.path();
        let link = e.file_type()?.is_symlink();
        let meta = std::fs::metadata(&path).with_context(|| {
            if link {
                format!(
                    "model file {r} is a symlink to {} that does not resolve (a partial copy or download?)",
                    std::fs::read_link(&path)
                        .map(|t| t.display().to_string())
                        .unwrap_or_default()
                )
            } else {
                format!("reading {}", path.display())
            }
        })?;
        if meta.is_dir() {
            walk(&path, &r, depth + 1, blobs, out, irregular)?;
        } else if !meta.is_file() {
            irregular.push(format!("{r}: {}", irregular_kind(&meta, &path)));
        } else {
            if out.len() >= MAX_FILES {
                bail!("model directory holds more than {MAX_FILES} files");
            }
            let blob = link
                .then(|| path.canonicalize().ok())
                .flatten()
                .filter(|t| blobs.is_some_and(|b| t.parent() == Some(b)))
                .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
            out.push(Found {
                rel: r,
                path,
                meta,
                blob,
            });
        }
    }
    Ok(())
}

/// The hub snapshot `dir` is (`.../models--ORG--NAME/snapshots/<revision>`), if it is one.
fn hub_of(dir: &Path) -> Option<HubSnapshot> {
    let revision = dir.file_name()?.to_str()?.to_string();
    let snapshots = dir.parent()?;
    if snapshots.file_name()? != "snapshots" {
        return None;
    }
    let repo_dir = snapshots.parent()?;
    let repo = repo_dir
        .file_name()?
        .to_str()?
        .strip_prefix("models--")?
        .replace("--", "/");
    let mut refs = Vec::new();
    if let Ok(rd) = std::fs::read_dir(repo_dir.join("refs")) {
        for e in rd.flatten() {
            let mut text = String::new();
            let read =
                std::fs::File::open(e.path()).and_then(|f| f.take(256).read_to_string(&mut text));
            if read.is_ok() && text.trim() == revision {
                refs.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    refs.sort();
    Some(HubSnapshot {
        repo,
        revision,
        refs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, sha: &str) -> ModelFile {
        ModelFile {
            path: path.into(),
            size: 1,
            sha256: sha.into(),
            blob: None,
        }
    }

    fn manifest(files: Vec<ModelFile>) -> ModelManifest {
        ModelManifest {
            dir: "/m".into(),
            digest: String::new(),
            bytes: 0,
            files,
            hub: None,
            problems: Vec::new(),
            hashing: None,
        }
    }

    #[test]
    fn a_diff_names_added_removed_and_changed_files() {
        let g = manifest(vec![file("a", "1"), file("b", "2"), file("c", "3")]);
        let n = manifest(vec![file("a", "1"), file("b", "9"), file("d", "4")]);
        let d = diff(&g, &n);
        assert_eq!(d.changed, ["b"]);
        assert_eq!(d.added, ["d"]);
        assert_eq!(d.removed, ["c"]);
        assert_eq!(d.to_string(), "changed: b; added: d; removed: c");
        assert!(diff(&g, &g).is_empty());
    }

    #[test]
    fn hashes_are_kept_until_a_file_changes_and_a_hub_snapshot_is_read() {
        let t = tempfile::tempdir().unwrap();
        let repo = t.path().join("hub/models--org--tiny");
        let snap = repo.join("snapshots/0123abcd");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
        let bytes = b"weights";
        let sha = hex::encode(Sha256::digest(bytes));
        std::fs::write(repo.join("blobs").join(&sha), bytes).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{sha}"), snap.join("w.bin")).unwrap();
        let kept = t.path().join("kept");
        let m = take(&snap, Some(&kept)).unwrap();
        let hub = m.hub.clone().unwrap();
        assert_eq!(
            (hub.repo.as_str(), hub.revision.as_str()),
            ("org/tiny", "0123abcd")
        );
        assert_eq!(hub.refs, ["main"]);
        assert_eq!(m.files[0].blob.as_deref(), Some(sha.as_str()));
        assert_eq!(m.files[0].sha256, sha);
        assert!(m.problems.is_empty());
        assert_eq!(m.hashing.as_ref().unwrap().hashed_bytes, 7);
        let again = take(&snap, Some(&kept)).unwrap();
        assert!(again.hashing.as_ref().unwrap().from_cache);
        assert_eq!(again.digest, m.digest);
        // Same size, other bytes: hashed again, and the blob's name disagrees.
        std::fs::write(repo.join("blobs").join(&sha), b"WEIGHTS").unwrap();
        let changed = take(&snap, Some(&kept)).unwrap();
        assert_eq!(changed.hashing.as_ref().unwrap().files_hashed, 1);
        assert_ne!(changed.digest, m.digest);
        assert_eq!(diff(&m, &changed).changed, ["w.bin"]);
        assert_eq!(changed.problems.len(), 1, "{:?}", changed.problems);
        // A broken link (a partial copy) is an error naming the file.
        std::os::unix::fs::symlink("../../blobs/missing", snap.join("x.bin")).unwrap();
        let e = format!("{:#}", take(&snap, Some(&kept)).unwrap_err());
        assert!(e.contains("x.bin"), "{e}");
    }

    #[test]
    fn entries_that_are_not_regular_files_are_named_with_their_kind_and_none_is_opened() {
        let t = tempfile::tempdir().unwrap();
        let m = t.path().join("m");
        std::fs::create_dir_all(m.join("sub")).unwrap();
        std::fs::write(m.join("config.json"), "{}").unwrap();
        // A FIFO with no writer: opening it would block for ever.
        let fifo = std::ffi::CString::new(m.join("sub/pipe").to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::os::unix::fs::symlink("/dev/zero", m.join("zero.bin")).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(m.join("s.sock")).unwrap();
        let e = format!("{:#}", take(&m, None).unwrap_err());
        for want in [
            "holds 3 entries that are not regular files",
            "s.sock: a socket",
            "sub/pipe: a FIFO",
            "zero.bin: a character device (a link to /dev/zero)",
        ] {
            assert!(e.contains(want), "{want:?} in {e}");
        }
        // The model path itself.
        let e = format!("{:#}", take(&m.join("sub/pipe"), None).unwrap_err());
        assert!(
            e.contains("is a FIFO, not a directory or a regular file"),
            "{e}"
        );
    }

    #[test]
    fn a_file_whose_size_is_not_its_content_is_refused_not_hashed_as_empty() {
        let t = tempfile::tempdir().unwrap();
        let m = t.path().join("m");
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(m.join("config.json"), "{}").unwrap();
        // Size 0 by stat, a page of text when read.
        std::os::unix::fs::symlink("/proc/self/status", m.join("status")).unwrap();
        let e = format!("{:#}", take(&m, None).unwrap_err());
        assert!(
            e.contains("status changed while hashed or its size is not its content")
                && e.contains("its size said 0 bytes, more came"),
            "{e}"
        );
        std::fs::remove_file(m.join("status")).unwrap();
        let ok = take(&m, None).unwrap();
        assert_eq!(ok.files.len(), 1);
        assert_eq!(ok.files[0].sha256, hex::encode(Sha256::digest(b"{}")));
    }

    #[test]
    fn only_a_path_where_nothing_is_is_absent() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        assert!(matches!(presence(d), Presence::Present));
        assert!(matches!(presence(&d.join("none")), Presence::Absent));
        std::os::unix::fs::symlink("gone", d.join("dangling")).unwrap();
        // Below a dangling link nothing exists either.
        assert!(matches!(presence(&d.join("dangling/x")), Presence::Absent));
        match presence(&d.join("dangling")) {
            Presence::Unresolvable(why) => assert!(
                why.starts_with("is a symbolic link to gone that cannot be resolved: No such file"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        std::os::unix::fs::symlink("selfloop", d.join("selfloop")).unwrap();
        match presence(&d.join("selfloop")) {
            Presence::Unresolvable(why) => {
                assert!(why.contains("Too many levels of symbolic links"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        match presence(&d.join("selfloop/x")) {
            Presence::Unresolvable(why) => assert!(why.starts_with("cannot be read: "), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
