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

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use fs_err as fs;

use crate::host::process::capture;
use crate::host::uv::Uv;
use crate::progress;
use crate::stages::lock::pylock::{Artifact, LockedPackage};
use crate::store::{Bucket, Entry, Manifest, Store, TempRoots, sha256_file, write_json};

/// The record file of a wheelhouse entry (named by the store).
pub use crate::store::ARTIFACT_JSON;

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
    let _lock = e.lock()?;
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

/// A hash-pinned install of a locked set from wheelhouse entries.
#[derive(Debug, Clone, Default)]
pub struct LockedInstall {
    /// The locked packages.
    pub packages: Vec<LockedPackage>,
    /// The wheelhouse entries that hold their artifacts.
    pub entries: Vec<Entry>,
    /// sha256 of the lock file they come from.
    pub lock_sha256: String,
    /// The store-wide directory of links to wheelhouse files
    /// ([`Store::wheelhouse_links_dir`]).
    pub links: PathBuf,
}

impl LockedInstall {
    /// Installs exactly the set into `venv` from the wheelhouse only (`--offline
    /// --no-index --require-hashes --no-deps`); `extra_lines` are appended to the
    /// requirements (e.g. the built wheel by path with its hash) and
    /// `extra_args` to the command. Scratch files go to `work`.
    ///
    /// Errors: uv fails (an artifact missing, a hash mismatch, an incomplete set).
    pub fn install(
        &self,
        uv: &Uv,
        venv: &Path,
        work: &Path,
        extra_lines: &[String],
        extra_args: &[String],
        log: &Path,
    ) -> Result<()> {
        // One store-wide directory of links: uv keys its cache of local
        // wheels by path, so the same wheel at the same path is unpacked once
        // and every venv hard-links the same files (two oracles sharing their
        // dependencies cost little more than one). A file-name clash with
        // another artifact falls back to a private directory.
        let shared = self.links.clone();
        let links = if link_dir(&self.entries, &shared).is_ok() {
            shared
        } else {
            let dir = work.join("wheelhouse-links");
            link_dir(&self.entries, &dir)?;
            dir
        };
        let reqs = work.join("locked-requirements.txt");
        let mut text = crate::stages::lock::pylock::requirements_text(&self.packages);
        for l in extra_lines {
            text.push_str(l);
            text.push('\n');
        }
        fs::write(&reqs, text)?;
        // The lock is the complete resolution (pins applied as overrides when
        // it was made): install exactly it, without resolving again.
        let mut args = vec!["--no-deps".to_string()];
        args.extend(extra_args.iter().cloned());
        uv.pip_install_locked(venv, &reqs, &links, &args, log)
    }

    /// The labels of its wheelhouse entries (for `requires`).
    pub fn labels(&self) -> Vec<String> {
        self.entries.iter().map(Entry::label).collect()
    }
}
