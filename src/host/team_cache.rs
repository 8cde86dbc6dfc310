//! A team compiler cache that stalls mid-build (issue 42, item 9;
//! docs/compiler-cache.md "When the team cache fails"): ccache waits its
//! `operation-timeout` (10 s by default) on every compiler call while a
//! Redis or HTTP server accepts connections and never answers, so a build
//! of a thousand units would lose hours. ccache has no memory between
//! calls, so the build keeps it:
//!
//! - the compilers' launcher is a small script in the build's work
//!   directory ([`Switch::install`]) that runs ccache, and leaves the team
//!   cache out (`CCACHE_REMOTE_STORAGE` unset) once a marker file exists;
//! - a thread of the tool ([`Watch`]) reads the build's ccache stats log as
//!   it grows; on a call whose team cache lookup or store failed
//!   (`remote_storage_error`: ccache 4.7 logs a timeout so too) it asks the
//!   server itself ([`RemoteStorage::probe`]): a server that answers, or
//!   refuses connections at once (down: that costs a call nothing), is kept;
//!   one that stays silent is skipped for the rest of the build: the marker
//!   is written and that is said once.
//!
//! The password in the remote's URL stays in the environment: the script
//! holds paths only.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Result;

use crate::host::ccache::{Probe, REMOTE_STORAGE_VAR, RemoteStorage};
use crate::progress;

/// The launcher script's name in the build's work directory.
const LAUNCHER: &str = "ccache-launcher";
/// The marker's name: while it exists, calls skip the team cache.
const OFF: &str = "team-cache-off";
/// How long the probe waits to connect, and again for a reply, at most
/// (less when the remote's operation timeout is shorter).
const PROBE_LIMIT: Duration = Duration::from_secs(2);
/// How often the stats log is read.
const POLL: Duration = Duration::from_millis(100);

/// The path of the launcher script for a build in `work` (what CMake's
/// `CMAKE_<LANG>_COMPILER_LAUNCHER` names; written by [`Switch::install`]).
pub fn launcher_path(work: &Path) -> PathBuf {
    work.join(LAUNCHER)
}

/// The launcher script of one build, and its marker.
#[derive(Debug, Clone)]
pub struct Switch {
    off: PathBuf,
}

impl Switch {
    /// Writes the launcher script ([`launcher_path`]) of a build in `work`,
    /// running `ccache`, and removes a marker a killed build left.
    ///
    /// Errors: the script cannot be written.
    pub fn install(work: &Path, ccache: &Path) -> Result<Switch> {
        let off = work.join(OFF);
        if off.exists() {
            fs_err::remove_file(&off)?;
        }
        let q = |p: &Path| crate::shell::shell_quote(&p.display().to_string());
        let script = format!(
            "#!/bin/sh\n# oracle-build: ccache, without the team compiler cache once this build found it stalled\nif [ -e {off} ]; then unset {REMOTE_STORAGE_VAR}; fi\nexec {ccache} \"$@\"\n",
            off = q(&off),
            ccache = q(ccache),
        );
        let path = launcher_path(work);
        fs_err::write(&path, script)?;
        fs_err::set_permissions(
            &path,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
        )?;
        Ok(Switch { off })
    }
}

/// The thread that watches one build's ccache stats log (see the module
/// docs); [`Watch::finish`] stops it.
#[derive(Debug)]
pub struct Watch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<bool>>,
}

impl Watch {
    /// Starts watching `statslog` (ccache's `CCACHE_STATSLOG` of the build)
    /// for failed team cache calls of `remote`, skipping it through `switch`.
    pub fn start(switch: &Switch, statslog: PathBuf, remote: RemoteStorage) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let off = switch.off.clone();
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut read = 0usize;
            while !stopped.load(Ordering::Relaxed) {
                std::thread::sleep(POLL);
                let text = std::fs::read(&statslog).unwrap_or_default();
                if text.len() < read {
                    read = 0;
                }
                let fresh = String::from_utf8_lossy(&text[read..]);
                // Only whole lines; the rest is read next time.
                let upto = fresh.rfind('\n').map_or(0, |i| i + 1);
                let errors = fresh[..upto]
                    .lines()
                    .filter(|l| l.trim() == "remote_storage_error")
                    .count();
                read += upto;
                if errors == 0 {
                    continue;
                }
                if remote.probe(remote.operation_timeout().min(PROBE_LIMIT)) == Probe::Silent {
                    if fs_err::write(&off, b"").is_ok() {
                        progress::stage(
                            "build",
                            format!(
                                "the team compiler cache {remote} timed out on a compiler call (operation timeout {} ms) and sends nothing now: skipped for the rest of this build (ccache compiles here, with the store's own cache)",
                                remote.operation_timeout().as_millis()
                            ),
                        );
                        return true;
                    }
                    return false;
                }
                // Answers or refuses: asked again at the next failure, at
                // most once a second.
                std::thread::sleep(Duration::from_secs(1));
            }
            false
        });
        Watch {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops watching; whether the team cache was skipped.
    pub fn finish(mut self) -> bool {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or(false)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launcher_drops_the_team_cache_once_the_marker_exists() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work dir");
        std::fs::create_dir_all(&work).unwrap();
        // A "ccache" that prints the team cache it was given.
        let fake = work.join("fake ccache");
        std::fs::write(&fake, "#!/bin/sh\necho \"[$CCACHE_REMOTE_STORAGE] $*\"\n").unwrap();
        std::fs::set_permissions(
            &fake,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
        )
        .unwrap();
        let switch = Switch::install(&work, &fake).unwrap();
        let run = || {
            let out = std::process::Command::new(launcher_path(&work))
                .args(["gcc", "-c", "a.c"])
                .env(REMOTE_STORAGE_VAR, "redis://h:1")
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        assert_eq!(run(), "[redis://h:1] gcc -c a.c");
        std::fs::write(&switch.off, b"").unwrap();
        assert_eq!(run(), "[] gcc -c a.c");
        Switch::install(&work, &fake).unwrap();
        assert_eq!(run(), "[redis://h:1] gcc -c a.c");
    }
}
