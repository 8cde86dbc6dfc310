//! The content-addressed store (layout: `docs/architecture.md`).
//!
//! Layout under the root, every directory behind one method of [`Store`]:
//!
//! ```text
//! store/<bucket>/<name>   finished, read-only entries (see [`Bucket`])     Store::bucket_dir
//! roots/<name>            GC roots: relative symlinks into store/          Store::roots_dir
//! tmp/                    staging; an entry appears only by one rename     Store::tmp_dir
//! locks/                  OS file locks, one per entry being produced      Store::locks_dir
//! tools/                  provisioned tools (a pinned uv)                  Store::tools_dir
//! logs/                   logs of failed or running stages, smoke logs     Store::logs_dir
//! reports/                `advance` reports                                Store::reports_dir
//! uv-cache/               uv's cache                                       Store::uv_cache_dir
//! uv-tmp/                 uv's TMPDIR (its build-environment locks)        Store::uv_tmp_dir
//! downloads/sha256/<hex>  cache blobs checked by a pull not yet finished   Store::downloads_dir
//! wheelhouse-links/       links to wheelhouse files, shared by installs    Store::wheelhouse_links_dir
//! sccache/, ccache/       compiler caches                                  Store::compiler_cache_dir
//! cargo-target/<h>        cargo target dirs of Rust builds (a cache)       Store::compiler_cache_dir
//! engine-cache/<k>-<dev>  an oracle's warm engine caches, per device       Store::engine_cache_dir
//! imported/<recipe>/      recipes and locks of imported bundles            Store::imported_dir
//! aliases.json            the alias registry (see [`alias`])
//! ```
//!
//! Besides the store proper: [`key`] (content keys), [`gc`] (reachability
//! from roots through `requires`), [`alias`] (activated paths) and
//! [`bundle`] (the portable archive format and its hostile-archive checks).
//!
//! Modelled on uv's `uv-cache`: typed paths ([`Bucket`], [`Entry`]) instead of
//! bare `PathBuf`s, one [`Store::persist`] that renames a staged directory into
//! place, and every file operation through `fs-err` so errors carry the path.
//! Unlike a cache the store is not disposable, so it carries no `CACHEDIR.TAG`.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use fs_err as fs;
use serde::Serialize;

use crate::exit::bad_input;

pub mod fscheck;
mod fsutil;
mod manifest;
mod stamps;

pub mod alias;
pub mod bundle;

pub mod engine_cache;
pub mod gc;
pub mod held;
pub mod key;
mod lock;
pub mod wheelname;

use fsutil::sync_dir;
pub use fsutil::{
    copy_tree, disk_usage, make_read_only, make_writable, read_json, sha256_file, write_atomic,
    write_json,
};
pub use lock::{Lock, LockName, lock_tools, release_run_lock};
use lock::{lock_file, take_run_lock, wait_for_run_lock};
pub use manifest::{ARTIFACT_JSON, MANIFEST, Manifest, ManifestFile, RECORDS, STAMPS};
pub use stamps::Stamps;

/// The kinds of store entries; each is one directory under `<root>/store/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Bucket {
    /// `store/git/<repo-key>.git`: bare mirrors with full history.
    Git,
    /// `store/src/<commit>`: read-only checkouts of exactly one commit.
    Src,
    /// `store/ext/<name>-<rev>`: staged external sources.
    Ext,
    /// `store/crates/<sha256 of a Cargo.lock>`: the crates of one
    /// `Cargo.lock`, vendored (`stages::rust::crates`).
    Crates,
    /// `store/wheelhouse/`: downloaded wheels, by hash.
    Wheelhouse,
    /// `store/wheels/<key>`: a built wheel with `build.json` and `build.log`.
    Wheels,
    /// `store/venvs/<key>`: an oracle venv with `oracle.json`.
    Venvs,
    /// `store/lockfiles/<key>`: a lock resolved for a build whose recipe has
    /// no lockfile, kept so rebuilds need neither the network nor a new resolution.
    Locks,
    /// `store/pyc/<wheel sha256>-<cache tag>-<magic>`: the bytecode of one
    /// wheel for one Python, hash-based `.pyc` files (PEP 552) valid
    /// wherever that wheel is installed (see `host::bytecode`).
    Bytecode,
}

impl Bucket {
    /// Every bucket, in pipeline order.
    pub const ALL: [Bucket; 9] = [
        Bucket::Git,
        Bucket::Src,
        Bucket::Ext,
        Bucket::Crates,
        Bucket::Locks,
        Bucket::Wheelhouse,
        Bucket::Wheels,
        Bucket::Bytecode,
        Bucket::Venvs,
    ];

    /// The bucket whose directory under `store/` is `name`.
    pub fn from_dir_name(name: &str) -> Option<Bucket> {
        Bucket::ALL.into_iter().find(|b| b.dir_name() == name)
    }

    /// The record file of this bucket's entries that lists, in `requires`,
    /// the entries each was made from (`build.json` of a wheel, `oracle.json`
    /// of a venv); `None` for buckets whose entries need nothing.
    pub fn record_file(self) -> Option<&'static str> {
        match self {
            Bucket::Wheels => Some("build.json"),
            Bucket::Venvs => Some("oracle.json"),
            _ => None,
        }
    }

    /// The prefix of the lock files of this bucket's entries (see [`LockName`]).
    pub fn lock_prefix(self) -> &'static str {
        match self {
            Bucket::Git => "git",
            Bucket::Src => "src",
            Bucket::Ext => "ext",
            Bucket::Crates => "crates",
            Bucket::Wheelhouse => "wheelhouse",
            Bucket::Wheels => "wheel",
            Bucket::Venvs => "venv",
            Bucket::Locks => "autolock",
            Bucket::Bytecode => "pyc",
        }
    }

    /// The directory name of the bucket under `store/`.
    pub fn dir_name(self) -> &'static str {
        match self {
            Bucket::Git => "git",
            Bucket::Src => "src",
            Bucket::Ext => "ext",
            Bucket::Crates => "crates",
            Bucket::Wheelhouse => "wheelhouse",
            Bucket::Wheels => "wheels",
            Bucket::Venvs => "venvs",
            Bucket::Locks => "lockfiles",
            Bucket::Bytecode => "pyc",
        }
    }
}

/// The path of one store entry (which may or may not exist yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its bucket.
    pub bucket: Bucket,
    /// Its name inside the bucket (a key, a commit, `<repo-key>.git`).
    pub name: String,
    /// `<root>/store/<bucket>/<name>`.
    pub path: PathBuf,
}

impl Entry {
    /// Whether the entry is present. Entries appear only complete, by rename.
    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    /// `<bucket>/<name>`, the short form used in messages and roots.
    pub fn label(&self) -> String {
        format!("{}/{}", self.bucket.dir_name(), self.name)
    }

    /// The name of this entry's lock.
    pub fn lock_name(&self) -> LockName {
        LockName::Entry(self.bucket, self.name.clone())
    }

    /// `<root>`, the store root this entry lives in (its path is
    /// `<root>/store/<bucket>/<name>`).
    fn store_root(&self) -> &Path {
        self.path
            .ancestors()
            .nth(3)
            .unwrap_or_else(|| Path::new("/nonexistent"))
    }

    /// Takes this entry's exclusive lock (`<root>/locks/<prefix>-<name>.lock`),
    /// held while the entry is produced, replaced or moved aside; waits when
    /// another process holds it.
    ///
    /// Errors: the lock file cannot be created or locked.
    pub fn lock(&self) -> Result<Lock> {
        if dir_read_only(self.store_root()) {
            return Ok(Lock { _file: None });
        }
        lock_file(&self.store_root().join("locks"), &self.lock_name())
    }

    /// Whether another process holds this entry's lock now (without waiting).
    pub fn is_locked(&self) -> bool {
        let path = self
            .store_root()
            .join("locks")
            .join(self.lock_name().file_name());
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(f) => f.try_lock().is_err(),
            Err(_) => false,
        }
    }
}

/// An opened store root.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// A staging directory under `<root>/tmp/`; removed on drop unless persisted.
#[derive(Debug)]
pub struct Staging {
    dir: Option<tempfile::TempDir>,
}

impl Staging {
    /// The staging directory.
    pub fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new("/nonexistent"), |d| d.path())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            let path = dir.path().to_path_buf();
            make_writable(&path);
            drop(dir);
        }
    }
}

/// Whether `dir` exists and this process cannot write it: `access(2)` with
/// `W_OK`, which reports `EROFS` on a read-only mount even for root.
fn dir_read_only(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    if !dir.is_dir() {
        return false;
    }
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access only reads the NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) != 0 }
}

/// A running build's temporary GC roots (see [`Store::temp_roots`]).
#[derive(Debug)]
pub struct TempRoots {
    /// None in a read-only store: no `gc` can run there, so nothing to record.
    file: Option<File>,
    path: PathBuf,
}

impl TempRoots {
    /// Registers `entry` as used by this build, under the shared gc lock, so a
    /// concurrent `gc` either sees it or finished before it was looked up.
    pub fn add(&self, store: &Store, entry: &Entry) -> Result<()> {
        let Some(mut f) = self.file.as_ref() else {
            return Ok(());
        };
        let _gc = store.gc_lock(false)?;
        writeln!(f, "{}", entry.label())
            .with_context(|| format!("writing {}", self.path.display()))?;
        Ok(())
    }
}

impl Drop for TempRoots {
    fn drop(&mut self) {
        if let Some(f) = &self.file {
            use std::os::fd::AsRawFd;
            held::unshare_lock(f.as_raw_fd());
            // Unlocked for every holder (a watchdog shares the description).
            let _ = f.unlock();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Store {
    /// The store root to use: `explicit` (`--store`), else `$ORACLE_BUILD_HOME`,
    /// else `$XDG_DATA_HOME/oracle-build`, else `~/.local/share/oracle-build`.
    ///
    /// Errors: none of those can be determined (no `HOME`).
    pub fn default_root(explicit: Option<&Path>) -> Result<PathBuf> {
        if let Some(p) = explicit {
            return Ok(p.to_path_buf());
        }
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        if let Some(p) = env("ORACLE_BUILD_HOME") {
            return Ok(p);
        }
        if let Some(p) = env("XDG_DATA_HOME") {
            return Ok(p.join("oracle-build"));
        }
        let home =
            env("HOME").context("cannot find the store: set --store, ORACLE_BUILD_HOME or HOME")?;
        Ok(home.join(".local/share/oracle-build"))
    }

    /// The store at `root`, validated but not created (see [`Store::init`]).
    ///
    /// Errors (exit 2): `root` exists and is not a directory, holds a `$`
    /// or a control character (a line break), or lies inside a git checkout.
    pub fn at(root: &Path) -> Result<Store> {
        let abs =
            std::path::absolute(root).with_context(|| format!("resolving {}", root.display()))?;
        if abs.exists() && !abs.is_dir() {
            return Err(bad_input(format!(
                "store root {} exists and is not a directory (--store or ORACLE_BUILD_HOME)",
                abs.display()
            )));
        }
        if abs.to_string_lossy().contains('$') {
            // setuptools expands `$name` in the build's install paths
            // (distutils `subst_vars`) and fails deep in a build.
            return Err(bad_input(format!(
                "store root {} holds a `$`, which Python's setuptools reads as a variable in the build's paths; choose a path without `$` (--store or ORACLE_BUILD_HOME)",
                abs.display()
            )));
        }
        if abs.to_string_lossy().chars().any(char::is_control) {
            // A line break in a path reaches uv, the venv's scripts
            // (shebangs) and RECORD files, which cannot carry it.
            return Err(bad_input(format!(
                "store root {} holds a line break or another control character, which uv, a venv's scripts and RECORD files cannot carry; choose a path without one (--store or ORACLE_BUILD_HOME)",
                abs.display().to_string().escape_debug()
            )));
        }
        // Symlinks resolved, so a link into a checkout is caught too.
        let real = resolve_existing(&abs);
        if let Some(checkout) = enclosing_checkout(&real) {
            return Err(bad_input(format!(
                "store root {} is inside the source checkout {}; choose a directory outside any checkout (--store or ORACLE_BUILD_HOME)",
                abs.display(),
                checkout.display()
            )));
        }
        Ok(Store { root: abs })
    }

    /// Creates the store's directories (idempotent), after its file system
    /// was tried once ([`fscheck::ensure`]).
    ///
    /// Errors (exit 2): the store's file system is refused (a CIFS/SMB/FAT
    /// mount, or symlinks, hard links, exec bits or atomic rename failing
    /// there), naming the mount point and type; else a directory cannot be
    /// created.
    pub fn init(&self) -> Result<()> {
        fscheck::ensure(&self.root)?;
        // `store/` last: it is what `open_existing` takes for a store, so a
        // `gc` running at that moment finds `locks/` already there.
        for d in ["roots", "tmp", "locks", "tools", "uv-tmp"] {
            fs::create_dir_all(self.root.join(d))?;
        }
        for b in Bucket::ALL {
            fs::create_dir_all(self.bucket_dir(b))?;
        }
        Ok(())
    }

    /// Opens the store at `root` only if it already exists (for read-only commands).
    pub fn open_existing(root: &Path) -> Option<Store> {
        root.join("store").is_dir().then(|| Store {
            root: std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf()),
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the store exists but this process cannot write it (a
    /// read-only mount, or another user's store): `access(2)` with `W_OK`,
    /// which reports `EROFS` even for root. Then locks and temporary roots
    /// are skipped (no process can change the store under a reader: nobody
    /// can write it, or it is not ours to lock), staging goes to the system's
    /// temporary directory, and read-only commands (`gc --dry-run`, `export`,
    /// `verify`, a no-op `build`) work; anything that must write fails
    /// naming the store as read-only.
    pub fn read_only(&self) -> bool {
        dir_read_only(&self.root)
    }

    /// Refuses a command that must write a read-only store ([`Store::read_only`])
    /// before it changes anything: the error names the store and `what`.
    ///
    /// Errors: the store is read-only.
    pub fn refuse_read_only(&self, what: &str) -> Result<()> {
        if self.read_only() {
            return Err(self.read_only_error(what));
        }
        Ok(())
    }

    /// The error for a write a read-only store refuses: names the store and `what`.
    fn read_only_error(&self, what: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "the store {} is read-only (not writable by this user, or a read-only file system): cannot {what}",
            self.root.display()
        )
    }

    /// `<root>/store/<bucket>`.
    pub fn bucket_dir(&self, bucket: Bucket) -> PathBuf {
        self.root.join("store").join(bucket.dir_name())
    }

    /// `<root>/tools`: provisioned tools.
    pub fn tools_dir(&self) -> PathBuf {
        self.root.join("tools")
    }

    /// `<root>/roots`: GC roots.
    pub fn roots_dir(&self) -> PathBuf {
        self.root.join("roots")
    }

    /// A log file for a stage that may fail: `<root>/logs/<name>.log`, emptied.
    /// It lives outside staging so that the path an error message names still
    /// exists after the staging directory is discarded; callers copy it into
    /// the entry on success and then remove it.
    pub fn stage_log(&self, name: &str) -> Result<PathBuf> {
        let dir = self.logs_dir();
        fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{name}.log"));
        fs::write(&path, "")?;
        Ok(path)
    }

    /// `<root>/locks`: the lock files (see [`LockName`]) and the temporary
    /// roots of running builds.
    pub fn locks_dir(&self) -> PathBuf {
        self.root.join("locks")
    }

    /// `<root>/logs`: logs of stages that may fail (see [`Store::stage_log`])
    /// and the smoke logs of gate runs.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// `<root>/reports`: the reports `advance` writes.
    pub fn reports_dir(&self) -> PathBuf {
        self.root.join("reports")
    }

    /// `<root>/uv-cache`: uv's cache (`--cache-dir`).
    pub fn uv_cache_dir(&self) -> PathBuf {
        self.root.join("uv-cache")
    }

    /// `<root>/uv-tmp`: uv's `TMPDIR`: the `uv-setuptools-<h>.lock` files
    /// it keeps there and its scratch, inside the store instead of the
    /// machine's `/tmp`; apart from `tmp/`, whose entries are staging only.
    pub fn uv_tmp_dir(&self) -> PathBuf {
        self.root.join("uv-tmp")
    }

    /// `<root>/downloads`: blobs a pull or substitution has downloaded and
    /// checked against their digest (`sha256/<hex>`, hard links into its
    /// staging), so a pull that is killed or fails resumes from them; each
    /// goes when the entry it belongs to is in the store, and `gc` removes
    /// any older than a day.
    pub fn downloads_dir(&self) -> PathBuf {
        self.root.join("downloads")
    }

    /// `<root>/bytecode`: the bytecode pool, one `.pyc` per (Python cache
    /// tag, source file of the uv cache), hard-linked into every venv that
    /// links the same source (see `host::bytecode`).
    pub fn bytecode_dir(&self) -> PathBuf {
        self.root.join("bytecode")
    }

    /// `<root>/wheelhouse-links`: one directory of links to wheelhouse files
    /// that every locked install shares (uv keys its cache of local wheels by
    /// path, so the same wheel is unpacked once).
    pub fn wheelhouse_links_dir(&self) -> PathBuf {
        self.root.join("wheelhouse-links")
    }

    /// `<root>/<name>` for the compiler cache `name` (`sccache`, `ccache`).
    pub fn compiler_cache_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// `<root>/imported`: the recipes and locks of imported bundles.
    pub fn imported_dir(&self) -> PathBuf {
        self.root.join("imported")
    }

    /// `<root>/demo`: the repository, model and recipe of `oracle-build demo`.
    pub fn demo_dir(&self) -> PathBuf {
        self.root.join("demo")
    }

    /// `<root>/model-hashes`: the sha256 of every file of the gate's
    /// models, one small JSON file per model directory, kept under each
    /// file's size, times and inode so a gate hashes only what changed
    /// (`stages::smoke::model`). Bookkeeping, not entries: written
    /// atomically, and losing it costs only hashing again.
    pub fn model_hashes_dir(&self) -> PathBuf {
        self.root.join("model-hashes")
    }

    /// `<root>/tmp`: staging.
    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// The entry `name` of `bucket`.
    pub fn entry(&self, bucket: Bucket, name: &str) -> Entry {
        Entry {
            bucket,
            name: name.to_string(),
            path: self.bucket_dir(bucket).join(name),
        }
    }

    /// The entries present in `bucket`, sorted by name.
    pub fn entries(&self, bucket: Bucket) -> Result<Vec<Entry>> {
        let dir = self.bucket_dir(bucket);
        let mut out = Vec::new();
        if dir.is_dir() {
            for e in fs::read_dir(&dir)? {
                let name = e?.file_name().to_string_lossy().into_owned();
                out.push(self.entry(bucket, &name));
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// A fresh staging directory `<root>/tmp/<label>.<pid>.<random>`; in the
    /// system's temporary directory for a read-only store, or one not made
    /// yet (no `store/`: `plan` on a new box reading a cache), so that
    /// nothing is written in it.
    pub fn stage(&self, label: &str) -> Result<Staging> {
        let tmp = if self.read_only() || !self.root.join("store").is_dir() {
            std::env::temp_dir()
        } else {
            let locks = self.root.join("locks");
            if fs::create_dir_all(&locks).is_ok() {
                take_run_lock(&locks);
            }
            self.tmp_dir()
        };
        let dir = tempfile::Builder::new()
            .prefix(&format!("{label}.{}.", std::process::id()))
            .tempdir_in(&tmp)
            .with_context(|| format!("creating a staging directory in {}", tmp.display()))?;
        Ok(Staging { dir: Some(dir) })
    }

    /// Makes `src` (a directory inside a [`Staging`]) read-only and renames it to
    /// `entry`. The rename is the commit point: before it the entry is absent,
    /// after it it is complete.
    ///
    /// Errors: `entry` already exists (callers hold the entry's lock), or the rename fails.
    pub fn persist(&self, src: &Path, entry: &Entry) -> Result<()> {
        if entry.exists() {
            bail!(
                "store entry {} appeared while it was being built",
                entry.path.display()
            );
        }
        make_read_only(src)?;
        fs::rename(src, &entry.path)?;
        sync_dir(&self.bucket_dir(entry.bucket));
        Ok(())
    }

    /// Moves the damaged entry `entry` out of the store, into
    /// `<root>/tmp/damaged-<bucket>-<name>.<pid>` (removed by the next run's
    /// staging cleanup), saying why on stderr; the caller rebuilds it.
    /// Callers hold the entry's lock.
    pub fn quarantine(&self, entry: &Entry, problems: &[String]) -> Result<()> {
        let aside = self.tmp_dir().join(format!(
            "damaged-{}-{}.{}",
            entry.bucket.dir_name(),
            entry.name,
            std::process::id()
        ));
        let shown: Vec<&str> = problems.iter().take(3).map(String::as_str).collect();
        crate::progress::stage(
            entry.bucket.dir_name(),
            format!(
                "{} is damaged ({}); moving it to {} and rebuilding",
                entry.label(),
                shown.join("; "),
                aside.display()
            ),
        );
        fs::rename(&entry.path, &aside)?;
        Ok(())
    }

    /// Takes the exclusive lock `name` (`<root>/locks/<file name>`), waiting
    /// for it when another process holds it (and saying who, on stderr).
    ///
    /// Errors: the lock file cannot be created or locked.
    pub fn lock(&self, name: LockName) -> Result<Lock> {
        if self.read_only() {
            return Ok(Lock { _file: None });
        }
        lock_file(&self.locks_dir(), &name)
    }

    /// The entry named by a label `<bucket>/<name>` (as in `requires` lists).
    pub fn entry_by_label(&self, label: &str) -> Option<Entry> {
        let (bucket, name) = label.split_once('/')?;
        let bucket = Bucket::from_dir_name(bucket)?;
        (!name.is_empty() && !name.contains('/') && name != "..").then(|| self.entry(bucket, name))
    }

    /// The entry a path inside `<root>/store/<bucket>/<name>` belongs to, if any.
    pub fn entry_of_path(&self, path: &Path) -> Option<Entry> {
        let dir = self.root.join("store");
        let canon = dir.canonicalize().unwrap_or_else(|_| dir.clone());
        let rel = path
            .strip_prefix(&dir)
            .or_else(|_| path.strip_prefix(&canon))
            .ok()?;
        let mut parts = rel.components();
        let bucket = Bucket::from_dir_name(parts.next()?.as_os_str().to_str()?)?;
        let name = parts.next()?.as_os_str().to_str()?;
        Some(self.entry(bucket, name))
    }

    /// Removes the GC root `<root>/roots/<name>`; returns whether it existed.
    pub fn remove_root(&self, name: &str) -> Result<bool> {
        let link = self.roots_dir().join(name);
        if fs::symlink_metadata(&link).is_err() {
            return Ok(false);
        }
        fs::remove_file(&link)?;
        Ok(true)
    }

    /// The lock every build takes shared (briefly, to register temporary
    /// roots) and `gc` takes exclusively (for its whole mark and sweep).
    pub fn gc_lock(&self, exclusive: bool) -> Result<Lock> {
        if self.read_only() {
            return Ok(Lock { _file: None });
        }
        let path = self.root.join("locks").join("gc.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?
            .into_parts()
            .0;
        let res = if exclusive {
            file.lock()
        } else {
            file.lock_shared()
        };
        res.with_context(|| format!("locking {}", path.display()))?;
        Ok(Lock { _file: Some(file) })
    }

    /// Temporary GC roots for this process: `<root>/locks/build-<pid>.roots`,
    /// held locked while the process lives, listing every entry it uses.
    /// A second set held at once by the same process (`advance` keeps FROM's
    /// oracle while it builds TO, whose build holds its own) is
    /// `build-<pid>.<n>.roots`: one file per set, so neither truncates,
    /// unlocks or removes the other's.
    pub fn temp_roots(&self) -> Result<TempRoots> {
        static SETS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = if n == 0 {
            format!("build-{}.roots", std::process::id())
        } else {
            format!("build-{}.{n}.roots", std::process::id())
        };
        let path = self.root.join("locks").join(name);
        if self.read_only() {
            return Ok(TempRoots { file: None, path });
        }
        fs::create_dir_all(self.root.join("locks"))?;
        let _gc = self.gc_lock(false)?;
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)?
            .into_parts()
            .0;
        file.lock()
            .with_context(|| format!("locking {}", path.display()))?;
        held::share_lock_with_watchdogs(std::os::fd::AsRawFd::as_raw_fd(&file));
        Ok(TempRoots {
            file: Some(file),
            path,
        })
    }

    /// The entries listed by the temporary roots of running builds; files
    /// of builds that no longer run are removed.
    pub fn live_temp_roots(&self) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        // No `locks/`: no build ever ran here, so none runs now.
        if !self.root.join("locks").is_dir() {
            return Ok(out);
        }
        for e in fs::read_dir(self.root.join("locks"))? {
            let path = e?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !(name.starts_with("build-") && name.ends_with(".roots")) {
                continue;
            }
            let Ok(file) = File::open(&path) else {
                continue;
            };
            match file.try_lock_shared() {
                Ok(()) => {
                    // Nobody holds it: the build is gone.
                    let _ = fs::remove_file(&path);
                }
                Err(_) => {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    out.extend(text.lines().filter_map(|l| self.entry_by_label(l.trim())));
                }
            }
        }
        Ok(out)
    }

    /// Points the GC root `<root>/roots/<name>` at `entry`, atomically (a new
    /// symlink renamed over the old one).
    pub fn set_root(&self, name: &str, entry: &Entry) -> Result<()> {
        let target = Path::new("../store")
            .join(entry.bucket.dir_name())
            .join(&entry.name);
        let link = self.roots_dir().join(name);
        if self.read_only() {
            // A root already in place needs no write (a no-op build).
            if fs::read_link(&link).is_ok_and(|t| t == target) {
                return Ok(());
            }
            return Err(self.read_only_error(&format!("set the GC root roots/{name}")));
        }
        let tmp = self
            .roots_dir()
            .join(format!(".{name}.{}.tmp", std::process::id()));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)
            .with_context(|| format!("creating symlink {}", tmp.display()))?;
        fs::rename(&tmp, &link)?;
        Ok(())
    }

    /// Writes the list root `<root>/roots/<name>` (see [`IMPORTED_ROOT_PREFIX`]):
    /// a text file whose first line is `# <header>` and whose other lines
    /// are the labels of those of `entries` that exist (one refused on the
    /// way in is not listed) and of the entries it already named that still
    /// exist, sorted, written atomically. `gc` keeps every entry it names
    /// and what they require.
    ///
    /// Errors: the store is read-only; the file cannot be written.
    pub fn set_list_root(&self, name: &str, header: &str, entries: &[Entry]) -> Result<()> {
        if self.read_only() {
            return Err(self.read_only_error(&format!("set the GC root roots/{name}")));
        }
        let path = self.roots_dir().join(name);
        let mut labels: std::collections::BTreeSet<String> = entries
            .iter()
            .filter(|e| e.exists())
            .map(Entry::label)
            .collect();
        if let Ok(old) = std::fs::read_to_string(&path) {
            labels.extend(
                list_root_labels(&old)
                    .filter_map(|l| self.entry_by_label(l))
                    .filter(Entry::exists)
                    .map(|e| e.label()),
            );
        }
        let mut text = format!("# {header}\n");
        for l in labels {
            text.push_str(&l);
            text.push('\n');
        }
        fs::create_dir_all(self.roots_dir())?;
        write_atomic(&path, text.as_bytes())
    }

    /// The entries `root` names: for a symlink, the entry it points at
    /// (none when it dangles or points outside the store); for a list root,
    /// each of its labels that names an entry of the store.
    pub fn root_entries(&self, root: &Root) -> Vec<Entry> {
        if root.is_list() {
            return root
                .entries
                .iter()
                .filter_map(|l| self.entry_by_label(l))
                .collect();
        }
        root.path
            .canonicalize()
            .ok()
            .and_then(|t| self.entry_of_path(&t))
            .into_iter()
            .collect()
    }

    /// Every GC root: its name, its link target, and whether the target exists.
    pub fn roots(&self) -> Result<Vec<Root>> {
        let mut out = Vec::new();
        // A store without `roots/` (removed by hand, a partial copy) is an
        // error, not a store without roots: `gc` would delete everything.
        for e in fs::read_dir(self.roots_dir())? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let path = e.path();
            let target = fs::read_link(&path).unwrap_or_default();
            let list = e.file_type().is_ok_and(|t| t.is_file());
            let (header, entries) = if list {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let header = text
                    .lines()
                    .next()
                    .and_then(|l| l.strip_prefix("# "))
                    .map(str::to_string);
                (
                    header,
                    list_root_labels(&text).map(str::to_string).collect(),
                )
            } else {
                (None, Vec::new())
            };
            out.push(Root {
                name,
                live: path.exists(),
                target,
                path,
                header,
                entries,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Removes staging directories left by processes that no longer run
    /// (a killed build). Returns how many were removed.
    pub fn clean_stale_staging(&self) -> Result<usize> {
        self.remove_left_by_dead(&self.tmp_dir(), |_| true)
    }

    /// Removes the partial downloads that processes which no longer run
    /// left in `<root>/downloads/sha256/` (`.<pid>.…`: blobs not checked
    /// yet; the checked ones, named by their digest, stay for a resumed
    /// pull). Returns how many were removed.
    pub fn clean_stale_downloads(&self) -> Result<usize> {
        let area = self.downloads_dir().join("sha256");
        self.remove_left_by_dead(&area, |name| name.starts_with('.'))
    }

    /// What runs that no longer run left: the staging directories under
    /// `<root>/tmp/` and the partial downloads under `<root>/downloads/`
    /// that [`Store::clean_stale_staging`] and
    /// [`Store::clean_stale_downloads`] remove (listed, not removed: for
    /// `doctor` and `gc --dry-run`). A damaged entry moved aside
    /// (`damaged-…`, [`Store::quarantine`]) is left on purpose by a run that
    /// ended well, for the next one to remove: not listed.
    ///
    /// Errors: a directory cannot be read.
    pub fn left_by_dead(&self) -> Result<Vec<PathBuf>> {
        let mut out = left_by_dead_in(&self.tmp_dir(), |name| !name.starts_with("damaged-"))?;
        out.extend(left_by_dead_in(
            &self.downloads_dir().join("sha256"),
            |name| name.starts_with('.'),
        )?);
        Ok(out)
    }

    /// Removes what [`left_by_dead_in`] lists in `dir`, each once its run's
    /// lock is free. Returns how many were removed.
    fn remove_left_by_dead(&self, dir: &Path, take: impl Fn(&str) -> bool) -> Result<usize> {
        let mut removed = 0;
        let locks = self.root.join("locks");
        for path in left_by_dead_in(dir, take)? {
            // Never under a build that still runs: wait until it is gone.
            if let Some(p) = pid_in_name(&path) {
                wait_for_run_lock(&locks, p);
            }
            make_writable(&path);
            let res = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            if res.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// A GC root as found under `<root>/roots/`.
#[derive(Debug, Clone, Serialize)]
pub struct Root {
    /// The root's name (a recipe name, an alias).
    pub name: String,
    /// `<root>/roots/<name>`.
    pub path: PathBuf,
    /// Where the symlink points.
    pub target: PathBuf,
    /// Whether the target exists (false: dangling).
    pub live: bool,
    /// For a list root (a file, see [`Store::set_list_root`]): its first
    /// line (`<recipe> <commit> (imported|pulled)`); `None` for a symlink.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// For a list root: the labels it names.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<String>,
}

impl Root {
    /// Whether this is a list root (a file of labels) rather than a symlink.
    pub fn is_list(&self) -> bool {
        self.header.is_some() || !self.entries.is_empty()
    }
}

/// Removes the staging directories killed runs left under `<root>/tmp/`
/// ([`Store::clean_stale_staging`]) and their partial downloads
/// ([`Store::clean_stale_downloads`]), and says so on stderr, as `stage`
/// (`pull`, `import`) reports; returns how many staging directories.
///
/// Errors: a directory cannot be removed.
pub fn report_stale_staging(store: &Store, stage: &str) -> Result<usize> {
    let n = store.clean_stale_staging()?;
    if n > 0 {
        crate::progress::stage(
            stage,
            format!(
                "removed {n} stale staging director{} of killed runs from {}",
                if n == 1 { "y" } else { "ies" },
                store.tmp_dir().display()
            ),
        );
    }
    let partial = store.clean_stale_downloads()?;
    if partial > 0 {
        crate::progress::stage(
            stage,
            format!(
                "removed {partial} partial download(s) of killed runs from {}",
                store.downloads_dir().join("sha256").display()
            ),
        );
    }
    Ok(n)
}

/// The prefix of the list roots `import` and `pull` write for what they
/// bring (`roots/imported-<recipe>`), kept until a build of that recipe at
/// that commit roots its oracle, or `unkeep` drops it.
pub const IMPORTED_ROOT_PREFIX: &str = "imported-";

/// The name of the list root of recipe `name` (`imported-<name>`).
pub fn imported_root_name(name: &str) -> String {
    format!("{IMPORTED_ROOT_PREFIX}{name}")
}

/// The labels of a list root's text: every line but comments and blanks.
fn list_root_labels(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// The pid a staging name carries as its second `.`-separated part
/// (`<stage>.<pid>.<rand>`, `.<pid>.<n>`).
fn pid_in_name(path: &Path) -> Option<i32> {
    let name = path.file_name()?.to_string_lossy().into_owned();
    name.split('.').nth(1).and_then(|p| p.parse::<i32>().ok())
}

/// Each entry of `dir` that `take` accepts by name and whose name carries
/// the pid of a process that no longer runs ([`pid_in_name`]); none when
/// `dir` does not exist.
///
/// Errors: `dir` cannot be read.
fn left_by_dead_in(dir: &Path, take: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if !dir.is_dir() {
        return Ok(out);
    }
    for e in fs::read_dir(dir)? {
        let path = e?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if take(&name) && pid_in_name(&path).is_some_and(|p| !process_alive(p)) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// Whether process `pid` still runs: it exists (`kill(pid, 0)`) and is not
/// a zombie. A run killed by SIGKILL whose parent has not reaped it yet (a
/// `timeout -s KILL` that died with it, a shell that waits later) is a
/// zombie: it holds no file and no lock, so what it left is stale.
/// The state is the field after the command in `/proc/<pid>/stat` (proc(5));
/// where `/proc` cannot be read, existing counts as running.
pub(crate) fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc != 0 {
        return std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // `pid (comm) state ...`: comm may hold spaces and parentheses.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    state != Some("Z")
}

/// `path` with every symlink along it resolved, dangling ones included (so a
/// link pointing into a checkout is seen there before the target exists):
/// the longest existing prefix is canonicalized; a dangling link is followed
/// by hand. At most 40 links, as the kernel allows.
fn resolve_existing(path: &Path) -> PathBuf {
    let mut current = path.to_path_buf();
    for _ in 0..40 {
        let Some((base, rest)) = current.ancestors().find_map(|a| {
            let real = a.canonicalize().ok()?;
            Some((
                real,
                current
                    .strip_prefix(a)
                    .unwrap_or(Path::new(""))
                    .to_path_buf(),
            ))
        }) else {
            return current;
        };
        let mut parts = rest.components();
        let Some(first) = parts.next() else {
            return base;
        };
        let next = base.join(first);
        match std::fs::read_link(&next) {
            Ok(target) => current = base.join(target).join(parts.as_path()),
            Err(_) => return base.join(rest),
        }
    }
    current
}

/// The git checkout containing `path` (the nearest ancestor with a `.git`), if any.
pub fn enclosing_checkout(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .find(|a| a.join(".git").exists())
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_root_with_a_line_break_is_refused_as_one_with_a_dollar() {
        let t = tempfile::tempdir().unwrap();
        for bad in ["a\nb", "a\rb", "a$b"] {
            let err = Store::at(&t.path().join(bad)).unwrap_err();
            assert_eq!(crate::exit::code_of(&err), 2, "{bad:?}: {err:#}");
            assert!(!t.path().join(bad).exists());
        }
        let err = Store::at(&t.path().join("x\ny")).unwrap_err();
        assert!(
            format!("{err:#}").contains("x\\ny holds a line break"),
            "{err:#}"
        );
        assert!(Store::at(&t.path().join("fine store")).is_ok());
    }

    #[test]
    fn a_killed_process_not_yet_reaped_is_not_alive() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        assert!(process_alive(pid));
        // SAFETY: signals our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        // Not waited for: a zombie until `wait` below.
        let stat = format!("/proc/{pid}/stat");
        let t = std::time::Instant::now();
        while !std::fs::read_to_string(&stat).unwrap().contains(") Z") {
            assert!(t.elapsed().as_secs() < 10, "never a zombie");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!process_alive(pid));
        child.wait().unwrap();
        assert!(!process_alive(pid));
        assert!(process_alive(i32::try_from(std::process::id()).unwrap()));
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(&dir.path().join("root")).unwrap();
        store.init().unwrap();
        (dir, store)
    }

    #[test]
    fn a_persisted_entry_appears_whole_and_read_only_and_staging_is_gone() {
        let (_d, store) = store();
        let e = store.entry(Bucket::Wheels, "k1");
        let staging = store.stage("wheel-k1").unwrap();
        let out = staging.path().join("entry");
        fs::create_dir_all(&out).unwrap();
        fs::write(out.join("build.json"), "{}").unwrap();
        assert!(!e.exists());
        store.persist(&out, &e).unwrap();
        assert!(e.path.join("build.json").is_file());
        let mode = std::fs::metadata(e.path.join("build.json"))
            .unwrap()
            .permissions();
        assert!(mode.readonly(), "persisted files are read-only");
        let staged = staging.path().to_path_buf();
        drop(staging);
        assert!(!staged.exists(), "dropping the staging removes it");
        // A second persist of the same entry is refused: it already exists.
        let again = store.stage("wheel-k1").unwrap();
        let out2 = again.path().join("entry");
        fs::create_dir_all(&out2).unwrap();
        assert!(store.persist(&out2, &e).is_err());
    }

    #[test]
    fn a_quarantined_entry_leaves_the_store() {
        let (_d, store) = store();
        let e = store.entry(Bucket::Venvs, "v1");
        fs::create_dir_all(&e.path).unwrap();
        store.quarantine(&e, &["changed".to_string()]).unwrap();
        assert!(!e.exists());
        assert!(store.entries(Bucket::Venvs).unwrap().is_empty());
    }

    #[test]
    fn entry_locks_have_typed_names_and_exclude_each_other() {
        let (_d, store) = store();
        let w = store.entry(Bucket::Wheels, "abc");
        assert_eq!(w.lock_name().file_name(), "wheel-abc.lock");
        assert_eq!(
            store.entry(Bucket::Locks, "x").lock_name().file_name(),
            "autolock-x.lock"
        );
        assert_eq!(LockName::Aliases.file_name(), "aliases.lock");
        let tool = LockName::Tool {
            tool: "uv".into(),
            version: "0.9.1".into(),
        };
        assert_eq!(tool.file_name(), ".uv-0.9.1.lock");
        assert!(!w.is_locked());
        let held = w.lock().unwrap();
        assert!(store.locks_dir().join("wheel-abc.lock").is_file());
        assert!(w.is_locked(), "a held lock is seen as held");
        assert!(!store.entry(Bucket::Wheels, "other").is_locked());
        drop(held);
        assert!(!w.is_locked(), "dropping the lock releases it");
    }

    #[test]
    fn roots_point_at_entries_and_labels_round_trip() {
        let (_d, store) = store();
        let e = store.entry(Bucket::Venvs, "v1");
        fs::create_dir_all(&e.path).unwrap();
        store.set_root("fx", &e).unwrap();
        store.set_root("fx", &e).unwrap();
        let roots = store.roots().unwrap();
        assert_eq!(roots.len(), 1);
        assert_eq!(roots[0].name, "fx");
        assert!(roots[0].live);
        let target = roots[0].path.canonicalize().unwrap();
        assert_eq!(store.entry_of_path(&target), Some(e.clone()));
        assert_eq!(store.entry_by_label(&e.label()), Some(e.clone()));
        assert_eq!(store.entry_by_label("venvs/.."), None);
        assert_eq!(store.entry_by_label("nobucket/x"), None);
        assert!(store.remove_root("fx").unwrap());
        assert!(!store.remove_root("fx").unwrap());
    }

    #[test]
    fn every_folder_is_under_the_root() {
        let (_d, store) = store();
        let root = store.root().to_path_buf();
        for (dir, name) in [
            (store.logs_dir(), "logs"),
            (store.reports_dir(), "reports"),
            (store.uv_cache_dir(), "uv-cache"),
            (store.uv_tmp_dir(), "uv-tmp"),
            (store.wheelhouse_links_dir(), "wheelhouse-links"),
            (store.locks_dir(), "locks"),
            (store.imported_dir(), "imported"),
        ] {
            assert_eq!(dir, root.join(name));
        }
        let log = store.stage_log("build-x").unwrap();
        assert_eq!(log, root.join("logs/build-x.log"));
    }
}
