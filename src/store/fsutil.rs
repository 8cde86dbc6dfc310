//! File helpers of the store: atomic writes, JSON records, permissions, copies.
//! Every operation goes through `fs-err` so errors carry the path.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, Result};
use fs_err as fs;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Clears the write bits of every file and directory under `dir` (symlinks untouched).
pub fn make_read_only(dir: &Path) -> Result<()> {
    set_write_bits(dir, false)
}

/// Sets the owner write bit everywhere under `dir` so it can be deleted. Best effort.
pub fn make_writable(dir: &Path) {
    let _ = set_write_bits(dir, true);
}

/// Sets or clears the write bits of `path` and, for a directory, of
/// everything below it (symlinks untouched). A directory's tree is walked by
/// a few threads sharing a queue of directories: a venv holds 10,000 to
/// 100,000 files, each a `lstat` and maybe a `chmod`. Order does not matter:
/// changing a file's mode needs no write permission on its directory.
///
/// Errors: the first entry that cannot be read or changed.
fn set_write_bits(path: &Path, writable: bool) -> Result<()> {
    use std::sync::{Condvar, Mutex};
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    set_mode_bits(path, &meta, writable)?;
    if !meta.is_dir() {
        return Ok(());
    }
    struct Walk {
        dirs: Vec<std::path::PathBuf>,
        /// Directories queued or being read.
        pending: usize,
        error: Option<anyhow::Error>,
    }
    let walk = Mutex::new(Walk {
        dirs: vec![path.to_path_buf()],
        pending: 1,
        error: None,
    });
    let wake = Condvar::new();
    let one_dir = |dir: &Path, found: &mut Vec<std::path::PathBuf>| -> Result<()> {
        for e in fs::read_dir(dir)? {
            let e = e?;
            let meta = fs::symlink_metadata(e.path())?;
            if meta.file_type().is_symlink() {
                continue;
            }
            set_mode_bits(&e.path(), &meta, writable)?;
            if meta.is_dir() {
                found.push(e.path());
            }
        }
        Ok(())
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let Ok(mut w) = walk.lock() else { return };
                loop {
                    if w.pending == 0 || w.error.is_some() {
                        wake.notify_all();
                        return;
                    }
                    let Some(dir) = w.dirs.pop() else {
                        w = match wake.wait(w) {
                            Ok(w) => w,
                            Err(_) => return,
                        };
                        continue;
                    };
                    drop(w);
                    let mut found = Vec::new();
                    let res = one_dir(&dir, &mut found);
                    w = match walk.lock() {
                        Ok(w) => w,
                        Err(_) => return,
                    };
                    w.pending = w.pending + found.len() - 1;
                    w.dirs.extend(found);
                    if let Err(e) = res {
                        w.error.get_or_insert(e);
                    }
                    wake.notify_all();
                }
            });
        }
    });
    match walk.into_inner() {
        Ok(Walk { error: Some(e), .. }) => Err(e),
        Ok(_) => Ok(()),
        Err(_) => anyhow::bail!("a thread changing modes under {} panicked", path.display()),
    }
}

/// Sets or clears the write bits of the one file or directory `path`
/// whose metadata is `meta`, when they differ.
fn set_mode_bits(path: &Path, meta: &std::fs::Metadata, writable: bool) -> Result<()> {
    let mode = meta.permissions().mode();
    let new = if writable {
        mode | 0o200
    } else {
        mode & !0o222
    };
    if new != mode {
        fs::set_permissions(path, std::fs::Permissions::from_mode(new))?;
    }
    Ok(())
}

/// The lowercase hex sha256 of the file at `path`.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(h.finalize()))
}

/// Writes `value` as pretty JSON to `path` through a temporary file and a rename.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    write_atomic(path, text.as_bytes())
}

/// Writes `bytes` to `path` atomically: a sibling temporary file, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().context("path has no parent")?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(bytes)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Reads JSON from `path` into `T`; errors name the path.
pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = fs::read_to_string(path)?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Copies the tree at `src` to `dst` (which must not exist), files made
/// owner-writable, symlinks kept as symlinks.
pub fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    fs::create_dir_all(dst)?;
    for e in fs::read_dir(src)? {
        let e = e?;
        let from = e.path();
        let to = dst.join(e.file_name());
        let ft = e.file_type()?;
        if ft.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&from)?, &to)
                .with_context(|| format!("creating symlink {}", to.display()))?;
        } else if ft.is_dir() {
            copy_tree(&from, &to)?;
        } else {
            fs::copy(&from, &to)?;
            let mode = fs::metadata(&to)?.permissions().mode();
            fs::set_permissions(&to, std::fs::Permissions::from_mode(mode | 0o200))?;
        }
    }
    Ok(())
}

/// Total bytes of regular files under `path` (0 when absent).
pub fn disk_usage(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_dir() {
        std::fs::read_dir(path)
            .map(|rd| rd.flatten().map(|e| disk_usage(&e.path())).sum())
            .unwrap_or(0)
    } else if meta.is_file() {
        meta.len()
    } else {
        0
    }
}
