//! The memory a build may use now: the smaller of the kernel's
//! `MemAvailable` (`/proc/meminfo`, proc(5)) and the headroom of the
//! cgroup v2 memory limits above this process (`memory.max` minus
//! `memory.current` of its own cgroup, named in `/proc/self/cgroup`, and of
//! each ancestor that sets a limit; the kernel's cgroup-v2.rst). Every read
//! is bounded; what cannot be read is left out (unknown, not zero).

use std::io::Read;
use std::path::{Path, PathBuf};

/// The most of one proc or cgroup file read.
const READ_LIMIT: u64 = 64 << 10;

/// Where cgroup v2 is mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The memory available to a build, and where that number comes from.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Available {
    /// Bytes.
    pub bytes: u64,
    /// `MemAvailable`, or `cgroup <path>: memory.max - memory.current`.
    pub from: String,
}

/// The memory this process may use now ([`choose`] of [`mem_available`]
/// and [`cgroup_headroom`]); `None` when neither can be read (not Linux).
pub fn available() -> Option<Available> {
    let meminfo = read_bounded(Path::new("/proc/meminfo")).and_then(|t| mem_available(&t));
    let cgroup = read_bounded(Path::new("/proc/self/cgroup"))
        .and_then(|t| own_cgroup(&t))
        .and_then(|rel| cgroup_headroom(Path::new(CGROUP_ROOT), &rel));
    choose(meminfo, cgroup)
}

/// The smaller of `meminfo` (bytes of `MemAvailable`) and `cgroup` (the
/// headroom of a cgroup limit and the cgroup's path), named by its source.
pub fn choose(meminfo: Option<u64>, cgroup: Option<(u64, String)>) -> Option<Available> {
    let m = meminfo.map(|bytes| Available {
        bytes,
        from: "MemAvailable".into(),
    });
    let c = cgroup.map(|(bytes, path)| Available {
        bytes,
        from: format!("cgroup {path}: memory.max - memory.current"),
    });
    match (m, c) {
        (Some(m), Some(c)) => Some(if c.bytes < m.bytes { c } else { m }),
        (m, c) => m.or(c),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes (the file says kB).
pub fn mem_available(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemAvailable:")?;
        let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
        kb.checked_mul(1024)
    })
}

/// The cgroup v2 path of this process from a `/proc/self/cgroup` text (the
/// `0::<path>` line), without its leading `/`.
pub fn own_cgroup(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().trim_start_matches('/').to_string())
}

/// The least headroom (`memory.max - memory.current`, 0 when above) of the
/// cgroup `rel` under `root` and of each of its ancestors that sets a limit
/// (`memory.max` not `max`), with that cgroup's path; `None`: no limit set.
/// A path with `..` is refused (`None`).
pub fn cgroup_headroom(root: &Path, rel: &str) -> Option<(u64, String)> {
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    let mut dir: PathBuf = root.join(rel);
    let mut best: Option<(u64, String)> = None;
    loop {
        if let Some(h) = limit_headroom(&dir) {
            let name = dir
                .strip_prefix(root)
                .map(|p| format!("/{}", p.display()))
                .unwrap_or_else(|_| dir.display().to_string());
            if best.as_ref().is_none_or(|(b, _)| h < *b) {
                best = Some((h, name));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    best
}

/// `memory.max - memory.current` of the cgroup at `dir`, when it sets a limit.
fn limit_headroom(dir: &Path) -> Option<u64> {
    let max = read_bounded(&dir.join("memory.max"))?;
    let max: u64 = max.trim().parse().ok()?; // `max`: no limit here
    let current: u64 = read_bounded(&dir.join("memory.current"))?
        .trim()
        .parse()
        .ok()?;
    Some(max.saturating_sub(current))
}

/// The text of `path`, at most [`READ_LIMIT`] bytes; `None` when unreadable.
fn read_bounded(path: &Path) -> Option<String> {
    let mut s = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(READ_LIMIT)
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_available_and_the_own_cgroup() {
        let t = "MemTotal:       131072000 kB\nMemFree:  1000 kB\nMemAvailable:   24536000 kB\n";
        assert_eq!(mem_available(t), Some(24536000 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(
            own_cgroup("0::/user.slice/run-1.scope\n").as_deref(),
            Some("user.slice/run-1.scope")
        );
        assert_eq!(own_cgroup("0::/\n").as_deref(), Some(""));
        assert_eq!(own_cgroup("12:memory:/x\n"), None);
    }

    #[test]
    fn the_smallest_headroom_of_the_cgroup_and_its_ancestors_wins() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let leaf = root.join("a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(root.join("a/memory.max"), "1000\n").unwrap();
        std::fs::write(root.join("a/memory.current"), "900\n").unwrap();
        std::fs::write(leaf.join("memory.max"), "max\n").unwrap();
        std::fs::write(leaf.join("memory.current"), "50\n").unwrap();
        assert_eq!(cgroup_headroom(root, "a/b"), Some((100, "/a".into())));
        assert_eq!(cgroup_headroom(root, "../etc"), None);
        std::fs::write(root.join("a/memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_headroom(root, "a/b"), None);
    }

    #[test]
    fn a_cgroup_limit_below_mem_available_is_the_one_taken() {
        let c = choose(Some(8 << 30), Some((2 << 30, "/box".into()))).unwrap();
        assert_eq!(c.bytes, 2 << 30);
        assert_eq!(c.from, "cgroup /box: memory.max - memory.current");
        let m = choose(Some(1 << 30), Some((2 << 30, "/box".into()))).unwrap();
        assert_eq!(m.from, "MemAvailable");
        assert_eq!(choose(None, None), None);
    }
}
