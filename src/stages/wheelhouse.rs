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

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use fs_err as fs;

use crate::host::http;
use crate::host::uv::Uv;
use crate::progress::{self, Progress};
use crate::stages::lock::pylock::{Artifact, LockedPackage};
use crate::store::{Bucket, Entry, Manifest, Store, TempRoots, write_json};

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

/// Ensures every package of `packages` has its artifacts in the wheelhouse,
/// downloading what is missing unless `offline`: all at once, in parallel
/// ([`http::fetch_all`], at most [`http::downloads`] at a time), each
/// streamed into a staging directory with its sha256 checked against the
/// lock before the entry is persisted. `lock_dir` resolves relative `path`
/// artifacts. Each entry is registered in `temp` before it is looked at.
/// Returns the entries, one or more per package, in lock order.
///
/// Errors: `offline` and an artifact is missing (names every one); an
/// artifact's sha256 is not 64 hex digits (exit 2); a download fails after
/// its retries; a file's sha256 differs from the lock (names the file, its
/// URL and both hashes). Artifacts fetched before a failure stay in the
/// store; the failed ones leave nothing.
pub fn ensure(
    store: &Store,
    packages: &[LockedPackage],
    lock_dir: &Path,
    offline: bool,
    temp: Option<&TempRoots>,
) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut missing_offline = Vec::new();
    let mut todo: Vec<&Artifact> = Vec::new();
    let mut seen = HashSet::new();
    for p in packages {
        let wanted = p.wanted();
        for a in &wanted {
            check_sha256(a)?;
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
            out.push(entry(store, &a.sha256));
            if seen.insert(a.sha256.as_str()) {
                todo.push(a);
            }
        }
    }
    if !missing_offline.is_empty() {
        bail!(
            "--offline: the wheelhouse lacks {}",
            missing_offline.join(", ")
        );
    }
    fetch(store, &todo, lock_dir)?;
    Ok(out)
}

/// Refuses a lock's sha256 that is not 64 lowercase hex digits: it names a
/// store entry.
fn check_sha256(a: &Artifact) -> Result<()> {
    let ok = a.sha256.len() == 64
        && a.sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !ok {
        return Err(crate::exit::bad_input(format!(
            "the lock's artifact {} of {}=={}: sha256 `{}` is not 64 hex digits",
            a.filename, a.package, a.version, a.sha256
        )));
    }
    Ok(())
}

/// One artifact being fetched: its entry (locked) and staging directory.
struct Pending<'a> {
    artifact: &'a Artifact,
    entry: Entry,
    _lock: crate::store::Lock,
    // Removed when dropped: a failed download leaves nothing behind.
    _staging: crate::store::Staging,
    dir: PathBuf,
}

/// Downloads (or copies) `todo` into their wheelhouse entries, in parallel.
fn fetch(store: &Store, todo: &[&Artifact], lock_dir: &Path) -> Result<()> {
    if todo.is_empty() {
        return Ok(());
    }
    let parallel = http::downloads()?;
    // Locks are taken in sha256 order, so two builds never wait on each other in a cycle.
    let mut sorted = todo.to_vec();
    sorted.sort_by(|a, b| a.sha256.cmp(&b.sha256));
    let mut pending = Vec::new();
    let mut jobs = Vec::new();
    for a in sorted {
        let e = entry(store, &a.sha256);
        let lock = e.lock()?;
        if e.exists() {
            continue;
        }
        let source = match (&a.url, &a.path) {
            (Some(url), _) => http::Source::from_url(url)
                .with_context(|| format!("the lock's artifact {}", a.filename))?,
            (None, Some(rel)) => http::Source::Local(lock_dir.join(rel)),
            (None, None) => bail!("artifact {} has neither url nor path", a.filename),
        };
        let staging = store.stage(&format!("wheelhouse-{}", &a.sha256[..16]))?;
        let dir = staging.path().join("entry");
        fs::create_dir_all(&dir)?;
        jobs.push(http::Job {
            name: a.filename.clone(),
            source,
            dest: dir.join(&a.filename),
            sha256: a.sha256.clone(),
            size: a.size,
        });
        pending.push(Some(Pending {
            artifact: a,
            entry: e,
            _lock: lock,
            _staging: staging,
            dir,
        }));
    }
    if jobs.is_empty() {
        return Ok(());
    }
    let sizes: Option<u64> = pending
        .iter()
        .flatten()
        .map(|p| p.artifact.size)
        .sum::<Option<u64>>();
    let count = jobs.len();
    progress::stage(
        "wheelhouse",
        format!(
            "downloading {count} artifact{}{}, {} at once",
            if count == 1 { "" } else { "s" },
            sizes.map_or(String::new(), |b| format!(" ({})", mib(b))),
            parallel.min(count)
        ),
    );
    let bar = Progress::bytes("wheelhouse", sizes);
    let counter = bar.counter();
    let t0 = Instant::now();
    let mut total = 0u64;
    http::fetch_all(
        jobs,
        parallel,
        std::sync::Arc::new(move |d| counter.add(d)),
        |i, result| {
            let p = pending
                .get_mut(i)
                .and_then(Option::take)
                .context("a download finished twice")?;
            let fetched = result?;
            total += fetched.bytes;
            persist(store, p, fetched.bytes)
        },
    )?;
    if let Some(p) = pending.iter().flatten().next() {
        bail!("the download of {} did not finish", p.artifact.filename);
    }
    bar.finish();
    let secs = t0.elapsed().as_secs_f64();
    progress::stage(
        "wheelhouse",
        format!(
            "downloaded {count} artifact{}, {} in {secs:.2} s ({:.1} MiB/s)",
            if count == 1 { "" } else { "s" },
            mib(total),
            total as f64 / 1048576.0 / secs.max(1e-3)
        ),
    );
    Ok(())
}

/// `artifact.json` and the manifest (the hash just checked, not read again),
/// then the staging directory renamed into the entry.
fn persist(store: &Store, p: Pending<'_>, bytes: u64) -> Result<()> {
    let mut rec = p.artifact.clone();
    rec.size = Some(bytes);
    write_json(&p.dir.join(ARTIFACT_JSON), &rec)?;
    let known = HashMap::from([(rec.filename.clone(), rec.sha256.clone())]);
    Manifest::build_known(&p.dir, &[crate::store::MANIFEST], &known)?.write(&p.dir)?;
    store.persist(&p.dir, &p.entry)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / 1048576.0)
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
