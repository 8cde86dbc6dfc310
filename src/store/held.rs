//! The locks this process holds that watchdogs inherit (a leaf of the
//! store: the store registers its lock files here, `host::process` hands
//! them to each watchdog it starts).
//!
//! A watchdog outliving a killed tool keeps these locks held until the
//! build it guards is gone, so no other run takes the build's lock or
//! deletes its working directory.

/// File descriptors of the locks this process holds (entry locks, temporary
/// roots, the run lock) that watchdogs inherit: a watchdog outliving a
/// killed tool keeps them held until the build it guards is gone, so no
/// other run takes the build's lock or deletes its working directory.
static INHERITED: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Lets watchdogs started from now on inherit the lock held on `fd` (see [`INHERITED`]).
pub fn share_lock_with_watchdogs(fd: i32) {
    if let Ok(mut v) = INHERITED.lock() {
        v.push(fd);
    }
}

/// Undoes [`share_lock_with_watchdogs`] for `fd` (before it is closed).
pub fn unshare_lock(fd: i32) {
    if let Ok(mut v) = INHERITED.lock() {
        v.retain(|&f| f != fd);
    }
}

/// The file descriptors registered now (for a watchdog about to start).
pub fn inherited() -> Vec<i32> {
    INHERITED.lock().map(|v| v.clone()).unwrap_or_default()
}
