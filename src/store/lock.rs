//! The store's locks: every lock file's name ([`LockName`]), exclusive OS
//! file locks shared with the watchdogs of the builds they guard ([`Lock`]),
//! the tools directory's lock ([`lock_tools`]), and each process's run lock
//! (while it is held, that process or a build it started still runs).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use fs_err as fs;

use super::{Bucket, held};

/// The locks of the store, each one file `<root>/locks/<file_name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockName {
    /// The lock of one entry (see [`super::Entry::lock`]).
    Entry(Bucket, String),
    /// The alias registry (`aliases.json`).
    Aliases,
    /// One oracle's engine caches on one device,
    /// `<root>/engine-cache/<name>` (`store::engine_cache`).
    EngineCache(String),
    /// One version of a tool in a tools directory that several stores may
    /// share (see [`lock_tools`]), e.g. the pinned uv while it is provisioned.
    Tool {
        /// The tool, e.g. `uv`.
        tool: String,
        /// Its version.
        version: String,
    },
}

impl LockName {
    /// The lock's file name under `<root>/locks/`: `<prefix>-<name>.lock`
    /// for an entry (the prefix from [`Bucket::lock_prefix`]), `aliases.lock`;
    /// `engine-cache-<name>.lock`; for a tool, `.<tool>-<version>.lock` in
    /// its tools directory.
    pub fn file_name(&self) -> String {
        match self {
            LockName::Entry(b, name) => format!("{}-{name}.lock", b.lock_prefix()),
            LockName::Aliases => "aliases.lock".to_string(),
            LockName::EngineCache(name) => format!("engine-cache-{name}.lock"),
            LockName::Tool { tool, version } => format!(".{tool}-{version}.lock"),
        }
    }
}

/// Takes the lock of `tool` at `version` in the tools directory `tools`
/// (which several stores may share), waiting while another process holds
/// it; released when the returned [`Lock`] is dropped.
///
/// Errors: the lock file cannot be created or locked.
pub fn lock_tools(tools: &Path, tool: &str, version: &str) -> Result<Lock> {
    let name = LockName::Tool {
        tool: tool.to_string(),
        version: version.to_string(),
    };
    let file = fs::File::create(tools.join(name.file_name()))?
        .into_parts()
        .0;
    file.lock().context("locking the tools directory")?;
    Ok(Lock { _file: Some(file) })
}

/// Takes the exclusive lock `name` in the directory `locks`, waiting for it
/// when another process holds it (and saying who, on stderr); the holder's
/// pid and command line are written into the file.
pub(super) fn lock_file(locks: &Path, name: &LockName) -> Result<Lock> {
    let path = locks.join(name.file_name());
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)?
        .into_parts()
        .0;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            crate::progress::line(format!(
                "waiting for {} (held by {})",
                path.display(),
                holder_text(&holder, |pid| Path::new(&format!("/proc/{pid}")).exists())
            ));
            file.lock()
                .with_context(|| format!("locking {}", path.display()))?;
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    Ok(held_by_this_process(file))
}

/// Takes the exclusive lock `name` in the directory `locks` when no other
/// process holds it (the holder's pid and command line written into the
/// file, as [`lock_file`] does); `Ok(None)` without waiting when another
/// process holds it.
///
/// Errors: the lock file cannot be created, or locking fails otherwise.
pub(super) fn try_lock_file(locks: &Path, name: &LockName) -> Result<Option<Lock>> {
    let path = locks.join(name.file_name());
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)?
        .into_parts()
        .0;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    Ok(Some(held_by_this_process(file)))
}

/// The lock on `file`, just taken: the holder's pid and command line
/// written into it (what a waiting process prints), and shared with this
/// process's watchdogs, so a build started under it keeps it held if this
/// process is killed (see [`held`]).
fn held_by_this_process(mut file: std::fs::File) -> Lock {
    file.set_len(0).ok();
    let _ = writeln!(
        file,
        "pid {} ({})",
        std::process::id(),
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    held::share_lock_with_watchdogs(std::os::fd::AsRawFd::as_raw_fd(&file));
    Lock { _file: Some(file) }
}

/// Who holds a lock, from its file's text (`pid <n> (<command line>)`, as
/// [`lock_file`] writes it): that text, and when `alive` says the pid is
/// gone, that a process it started holds the lock now (a killed build's
/// watchdog and compilers share its lock until they stop).
fn holder_text(text: &str, alive: impl Fn(u32) -> bool) -> String {
    let text = text.trim();
    if text.is_empty() {
        return "another process".into();
    }
    let pid = text
        .strip_prefix("pid ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse::<u32>().ok());
    match pid {
        Some(pid) if !alive(pid) => format!(
            "{text}; process {pid} is gone, and a process it started still holds the lock until it stops"
        ),
        _ => text.to_string(),
    }
}

/// An exclusive OS file lock under `<root>/locks/`; released on drop.
#[derive(Debug)]
pub struct Lock {
    /// None in a read-only store (see [`super::Store::read_only`]): nothing to guard.
    pub(super) _file: Option<File>,
}

impl Drop for Lock {
    fn drop(&mut self) {
        if let Some(f) = &self._file {
            use std::os::fd::AsRawFd;
            held::unshare_lock(f.as_raw_fd());
            // Unlocked for every holder (a watchdog shares the description).
            let _ = f.unlock();
        }
    }
}

/// This process's run lock, `<root>/locks/run-<pid>.lock`, taken when it
/// first stages in a store and held (and shared with watchdogs) until it
/// exits: while it is held, the process or a build it started still runs,
/// and its staging directories are not stale.
static RUN_LOCK: std::sync::OnceLock<Option<File>> = std::sync::OnceLock::new();

pub(super) fn take_run_lock(locks: &Path) {
    RUN_LOCK.get_or_init(|| {
        let path = locks.join(format!("run-{}.lock", std::process::id()));
        let _ = RUN_LOCK_PATH.set(path.clone());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .ok()?;
        file.lock().ok()?;
        use std::os::fd::AsRawFd;
        held::share_lock_with_watchdogs(file.as_raw_fd());
        Some(file)
    });
}

/// Removes this process's run lock file, if it took one: called by `main`
/// when the command has ended normally (every child it started has
/// finished), so a run leaves no bookkeeping behind. A killed run's file is
/// removed by the next run, once it is free (see [`wait_for_run_lock`]).
pub fn release_run_lock() {
    if let Some(Some(_)) = RUN_LOCK.get() {
        let _ = std::fs::remove_file(run_lock_path_of_this_process());
    }
}

/// The path [`take_run_lock`] used, recorded when it was taken.
fn run_lock_path_of_this_process() -> PathBuf {
    RUN_LOCK_PATH.get().cloned().unwrap_or_default()
}

/// Where this process's run lock file is (set with [`RUN_LOCK`]).
static RUN_LOCK_PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Waits until the run lock of the dead process `pid` is free: a watchdog
/// of a build that process started still holds it while that build's
/// process group is being terminated (at most about a minute). Then the
/// lock file is removed. Without a lock file there is nothing to wait for.
pub(super) fn wait_for_run_lock(locks: &Path, pid: i32) {
    let path = locks.join(format!("run-{pid}.lock"));
    let Ok(f) = std::fs::OpenOptions::new().write(true).open(&path) else {
        return;
    };
    if f.try_lock().is_err() {
        crate::progress::stage(
            "store",
            format!("waiting for the build of the killed run {pid} to stop"),
        );
        let _ = f.lock();
    }
    let _ = std::fs::remove_file(&path);
}

#[cfg(test)]
mod tests {
    use super::holder_text;

    #[test]
    fn a_holder_whose_pid_is_gone_is_said_to_be_gone() {
        let text = "pid 4242 (oracle-build build fx.yaml)\n";
        assert_eq!(
            holder_text(text, |_| true),
            "pid 4242 (oracle-build build fx.yaml)"
        );
        let gone = holder_text(text, |pid| pid != 4242);
        assert!(
            gone.starts_with("pid 4242 (oracle-build build fx.yaml); process 4242 is gone"),
            "{gone}"
        );
        assert_eq!(holder_text("  \n", |_| false), "another process");
        // Text another version wrote: shown as it is.
        assert_eq!(holder_text("someone", |_| false), "someone");
    }
}
