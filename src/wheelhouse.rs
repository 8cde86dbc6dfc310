//! The wheelhouse: every artifact (wheel or sdist) a build or venv installs,
//! kept in the store by its sha256 so rebuilds need no network.
//!
//! One immutable entry per artifact, `store/wheelhouse/<sha256>/`, holding the
//! file under its own name plus `artifact.json` (package, version, file name,
//! URL, sha256, size). Entries are filled from a PEP 751 lock
//! (`pylock.*.toml`, written by `oracle-build lock` via `uv pip compile
//! --format pylock.toml`): uv's lock for one environment lists exactly the
//! artifacts that environment installs, each with its URL and sha256.
//! Installs then read only the wheelhouse: a directory of symlinks to the
//! entries is passed to `uv pip install --offline --no-index --find-links
//! ... --require-hashes` with a requirements file derived from the lock.
//! Wheel and venv records list the wheelhouse entries they used in
//! `requires`, so `gc` keeps them as long as the oracle is rooted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use fs_err as fs;
use serde::{Deserialize, Serialize};

use crate::process::capture;
use crate::progress;
use crate::store::{Bucket, Entry, Manifest, Store, TempRoots, sha256_file, write_json};

/// The record file of a wheelhouse entry.
pub const ARTIFACT_JSON: &str = "artifact.json";

/// One file of a locked package (PEP 751 `[[packages.wheels]]` or `packages.sdist`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Artifact {
    /// Normalized name of the package it belongs to.
    pub package: String,
    /// Its version.
    pub version: String,
    /// File name (`name`, else the last segment of the URL or path, percent-decoded).
    pub filename: String,
    /// Where it is downloaded from (`url`), if remote.
    pub url: Option<String>,
    /// A local path (`path`, relative to the lock file's directory), if local.
    pub path: Option<String>,
    /// Lowercase hex sha256 (PEP 751 requires hashes; only sha256 is used).
    pub sha256: String,
    /// Size in bytes, when the lock says.
    pub size: Option<u64>,
}

/// One package of a PEP 751 lock.
#[derive(Debug, Clone, PartialEq)]
pub struct LockedPackage {
    /// Package name as written in the lock.
    pub name: String,
    /// Exact version.
    pub version: String,
    /// Environment marker, if the lock has one.
    pub marker: Option<String>,
    /// Its wheels (for a single-environment lock: the ones that install there).
    pub wheels: Vec<Artifact>,
    /// Its sdist, if any.
    pub sdist: Option<Artifact>,
}

impl LockedPackage {
    /// The artifacts the wheelhouse keeps for this package: its wheels, or
    /// the sdist when it has no wheel.
    pub fn wanted(&self) -> Vec<&Artifact> {
        if self.wheels.is_empty() {
            self.sdist.iter().collect()
        } else {
            self.wheels.iter().collect()
        }
    }

    /// The hash-pinned requirement line uv installs it from:
    /// `name==version [; marker] --hash=sha256:...` (every wanted artifact's hash).
    pub fn requirement_line(&self) -> String {
        let mut line = format!("{}=={}", self.name, self.version);
        if let Some(m) = &self.marker {
            line.push_str(&format!(" ; {m}"));
        }
        for a in self.wanted() {
            line.push_str(&format!(" --hash=sha256:{}", a.sha256));
        }
        line
    }
}

#[derive(Deserialize)]
struct PylockFile {
    #[serde(default)]
    packages: Vec<PylockPackage>,
}

#[derive(Deserialize)]
struct PylockPackage {
    name: String,
    version: Option<String>,
    marker: Option<String>,
    #[serde(default)]
    wheels: Vec<PylockArtifact>,
    sdist: Option<PylockArtifact>,
    vcs: Option<toml::Value>,
    directory: Option<toml::Value>,
    archive: Option<toml::Value>,
}

#[derive(Deserialize)]
struct PylockArtifact {
    name: Option<String>,
    url: Option<String>,
    path: Option<String>,
    size: Option<u64>,
    #[serde(default)]
    hashes: BTreeMap<String, String>,
}

/// Reads the packages of the PEP 751 lock at `path`.
///
/// Errors: the file does not parse; a package is a VCS, directory or archive
/// source (not installable from a wheelhouse), has no version, or an artifact
/// has no sha256.
pub fn parse_pylock(path: &Path) -> Result<Vec<LockedPackage>> {
    let text = fs::read_to_string(path)?;
    parse_pylock_str(&text, path)
}

/// Reads the packages of the PEP 751 lock `text`; `path` names it in errors
/// (the pure part of [`parse_pylock`], also what the `pylock` fuzz target runs).
///
/// Errors: as [`parse_pylock`], except reading the file.
pub fn parse_pylock_str(text: &str, path: &Path) -> Result<Vec<LockedPackage>> {
    let lock: PylockFile =
        toml::from_str(text).with_context(|| format!("parsing {}", path.display()))?;
    let mut out = Vec::new();
    for p in lock.packages {
        if p.vcs.is_some() || p.directory.is_some() || p.archive.is_some() {
            bail!(
                "{}: package {} comes from a VCS, directory or archive source; only index artifacts can be kept in the wheelhouse",
                path.display(),
                p.name
            );
        }
        let version = p
            .version
            .with_context(|| format!("{}: package {} has no version", path.display(), p.name))?;
        let conv = |a: PylockArtifact| -> Result<Artifact> {
            let sha256 = a.hashes.get("sha256").cloned().with_context(|| {
                format!(
                    "{}: an artifact of {} has no sha256",
                    path.display(),
                    p.name
                )
            })?;
            let source = a.url.as_deref().or(a.path.as_deref()).unwrap_or("");
            let filename = a
                .name
                .clone()
                .unwrap_or_else(|| percent_decode(source.rsplit('/').next().unwrap_or("")));
            if filename.is_empty() || filename.contains('/') || filename.starts_with('.') {
                bail!(
                    "{}: an artifact of {} has no usable file name",
                    path.display(),
                    p.name
                );
            }
            Ok(Artifact {
                package: p.name.clone(),
                version: version.clone(),
                filename,
                url: a.url,
                path: a.path,
                sha256: sha256.to_ascii_lowercase(),
                size: a.size,
            })
        };
        let wheels = p.wheels.into_iter().map(conv).collect::<Result<Vec<_>>>()?;
        let sdist = p.sdist.map(conv).transpose()?;
        if wheels.is_empty() && sdist.is_none() {
            bail!("{}: package {} lists no artifact", path.display(), p.name);
        }
        out.push(LockedPackage {
            name: p.name,
            version,
            marker: p.marker,
            wheels,
            sdist,
        });
    }
    Ok(out)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(h) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(h, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The hash-pinned requirements text for `packages` (one line each, sorted as locked).
pub fn requirements_text(packages: &[LockedPackage]) -> String {
    packages
        .iter()
        .map(|p| p.requirement_line() + "\n")
        .collect()
}

/// The wheelhouse entry of the artifact with `sha256`.
pub fn entry(store: &Store, sha256: &str) -> Entry {
    store.entry(Bucket::Wheelhouse, sha256)
}

/// The artifact file inside a wheelhouse entry (read from `artifact.json`).
pub fn file_of(entry: &Entry) -> Result<PathBuf> {
    let a: Artifact = crate::store::read_json(&entry.path.join(ARTIFACT_JSON))?;
    Ok(entry.path.join(a.filename))
}

/// The packages none of whose wanted artifacts is in the wheelhouse, as
/// `name==version (file)` lines.
pub fn missing(store: &Store, packages: &[LockedPackage]) -> Vec<String> {
    packages
        .iter()
        .filter(|p| !p.wanted().iter().any(|a| entry(store, &a.sha256).exists()))
        .map(|p| {
            let files: Vec<&str> = p.wanted().iter().map(|a| a.filename.as_str()).collect();
            format!("{}=={} ({})", p.name, p.version, files.join(", "))
        })
        .collect()
}

/// Python (stdlib only) that downloads `argv[1]` to `argv[2]`; honours the
/// usual proxy variables. Hashes are checked by the caller.
const DOWNLOAD_PY: &str = "import sys, shutil, urllib.request\nwith urllib.request.urlopen(sys.argv[1], timeout=600) as r, open(sys.argv[2], 'wb') as f:\n    shutil.copyfileobj(r, f, 1 << 20)\n";

/// Ensures every package of `packages` has its artifacts in the wheelhouse,
/// downloading what is missing (with `python`, stdlib `urllib`) unless
/// `offline`. `lock_dir` resolves relative `path` artifacts. Each entry is
/// registered in `temp` before it is looked at. Returns the entries, one or
/// more per package, in lock order.
///
/// Errors: `offline` and an artifact is missing (names every one); a download
/// fails; a file's sha256 differs from the lock (names URL and both hashes).
pub fn ensure(
    store: &Store,
    packages: &[LockedPackage],
    lock_dir: &Path,
    python: &Path,
    offline: bool,
    temp: Option<&TempRoots>,
) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut missing_offline = Vec::new();
    for p in packages {
        let wanted = p.wanted();
        for a in &wanted {
            if let Some(t) = temp {
                t.add(store, &entry(store, &a.sha256))?;
            }
        }
        let present: Vec<Entry> = wanted
            .iter()
            .map(|a| entry(store, &a.sha256))
            .filter(Entry::exists)
            .collect();
        if !present.is_empty() {
            out.extend(present);
            continue;
        }
        if offline {
            missing_offline.push(format!("{}=={}", p.name, p.version));
            continue;
        }
        for a in wanted {
            out.push(fetch(store, a, lock_dir, python)?);
        }
    }
    if !missing_offline.is_empty() {
        bail!(
            "--offline: the wheelhouse lacks {}",
            missing_offline.join(", ")
        );
    }
    Ok(out)
}

fn fetch(store: &Store, a: &Artifact, lock_dir: &Path, python: &Path) -> Result<Entry> {
    let e = entry(store, &a.sha256);
    let _lock = store.lock(&format!("wheelhouse-{}", a.sha256))?;
    if e.exists() {
        return Ok(e);
    }
    let staging = store.stage(&format!("wheelhouse-{}", &a.sha256[..16]))?;
    let dir = staging.path().join("entry");
    fs::create_dir_all(&dir)?;
    let file = dir.join(&a.filename);
    match (&a.url, &a.path) {
        (Some(url), _) => {
            progress::stage("wheelhouse", format!("downloading {}", a.filename));
            capture(
                &format!("downloading {url}"),
                duct::cmd(
                    python,
                    [
                        "-I",
                        "-c",
                        DOWNLOAD_PY,
                        url.as_str(),
                        &file.display().to_string(),
                    ],
                ),
            )?;
        }
        (None, Some(rel)) => {
            fs::copy(lock_dir.join(rel), &file)?;
        }
        (None, None) => bail!("artifact {} has neither url nor path", a.filename),
    }
    let sha = sha256_file(&file)?;
    if sha != a.sha256 {
        bail!(
            "{} ({}) has sha256 {sha}, but the lock says {}; refusing it",
            a.filename,
            a.url.as_deref().or(a.path.as_deref()).unwrap_or(""),
            a.sha256
        );
    }
    let mut rec = a.clone();
    rec.size = Some(fs::metadata(&file)?.len());
    write_json(&dir.join(ARTIFACT_JSON), &rec)?;
    Manifest::build(&dir, &[crate::store::MANIFEST])?.write(&dir)?;
    store.persist(&dir, &e)?;
    Ok(e)
}

/// Fills `dir` (created) with one symlink per entry, named after its
/// artifact file: the `--find-links` directory of a locked install.
pub fn link_dir(entries: &[Entry], dir: &Path) -> Result<()> {
    fs::create_dir_all(dir)?;
    for e in entries {
        let file = file_of(e)?;
        let name = file.file_name().context("artifact without a name")?;
        let link = dir.join(name);
        match std::os::unix::fs::symlink(&file, &link) {
            Ok(()) => {}
            // Made by an earlier or concurrent install: fine if it names the same file.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if fs::read_link(&link)? != file {
                    anyhow::bail!("{} already links to another artifact", link.display());
                }
            }
            Err(e) => return Err(e).with_context(|| format!("linking {}", link.display())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_uv_pylock_and_writes_hash_pinned_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pylock.test.toml");
        fs::write(
            &p,
            r#"lock-version = "1.0"
created-by = "uv"
requires-python = ">=3.11"

[[packages]]
name = "torch"
version = "2.9.0+cu130"
wheels = [{ url = "https://example.invalid/whl/torch-2.9.0%2Bcu130-cp311-cp311-manylinux_2_28_x86_64.whl", upload-time = 2024-11-23T00:18:21Z, size = 3, hashes = { sha256 = "AB12" } }]

[[packages]]
name = "onlysdist"
version = "1.0"
sdist = { url = "https://example.invalid/onlysdist-1.0.tar.gz", hashes = { sha256 = "cd34" } }
"#,
        )
        .unwrap();
        let pkgs = parse_pylock(&p).unwrap();
        assert_eq!(pkgs.len(), 2);
        assert_eq!(
            pkgs[0].wheels[0].filename,
            "torch-2.9.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
        );
        assert_eq!(
            requirements_text(&pkgs),
            "torch==2.9.0+cu130 --hash=sha256:ab12\nonlysdist==1.0 --hash=sha256:cd34\n"
        );
    }
}
