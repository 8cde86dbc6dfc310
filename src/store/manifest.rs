//! Entry manifests: every file of a store entry with its size and sha256,
//! and every directory with its modification time; checked by the no-op path
//! (the entry's stamps, [`Manifest::check_quick`]), `status`, `doctor`, `verify`
//! (sizes) and `verify --deep` (hashes).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::Result;
use fs_err as fs;
use serde::{Deserialize, Serialize};

use super::fsutil::{read_json, sha256_file, write_json};

/// The file name of every entry's manifest.
pub const MANIFEST: &str = "manifest.json";

/// The file name of a venv entry's stamps (`store::stamps`), beside [`MANIFEST`].
pub const STAMPS: &str = "manifest.stamps";

/// The records of entries (`oracle.json` of a venv, `build.json` of a
/// wheel): small files that say what the entry is, so [`Manifest::check`]
/// always compares their sha256, not only their size.
pub const RECORDS: &[&str] = &["oracle.json", "build.json"];

/// The record file of a wheelhouse entry: the locked artifact it holds
/// (its package, version, file name and sha256).
pub const ARTIFACT_JSON: &str = "artifact.json";

/// Every file of an entry with its size and sha256, and every symlink with its target.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Manifest {
    /// Regular files, paths relative to the entry, sorted.
    pub files: Vec<ManifestFile>,
    /// Symlinks, relative path -> link target.
    pub symlinks: Vec<(String, String)>,
    /// Top-level names left out on purpose (the manifest itself, `oracle.json`).
    #[serde(default = "default_excluded")]
    pub excluded: Vec<String>,
    /// Every directory below the top one, with its modification time as
    /// the manifest was built (entries are read-only from then on): adding,
    /// removing or renaming anything in a directory changes its time, so
    /// [`Manifest::check_quick`] reads these instead of every file. Empty in
    /// manifests written before they were recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dirs: Vec<DirStamp>,
}

/// One directory of a [`Manifest`] and its modification time.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DirStamp {
    /// Path relative to the entry.
    pub path: String,
    /// Modification time, nanoseconds since the Unix epoch (`st_mtim`).
    pub mtime_ns: i64,
}

/// `st_mtim` of `m` in nanoseconds since the Unix epoch.
fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    m.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(m.mtime_nsec())
}

fn default_excluded() -> Vec<String> {
    vec![MANIFEST.to_string(), "oracle.json".to_string()]
}

/// One file of a [`Manifest`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ManifestFile {
    /// Path relative to the entry.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex sha256 of the content.
    pub sha256: String,
}

impl Manifest {
    /// Walks `dir` and hashes every file except those named in `skip` (top-level names).
    pub fn build(dir: &Path, skip: &[&str]) -> Result<Manifest> {
        Self::build_known(dir, skip, &HashMap::new())
    }

    /// [`Manifest::build`], taking the sha256 of the files in `known` (paths
    /// relative to `dir`) as given instead of reading them. Callers put there
    /// only hashes they can vouch for (a wheel's RECORD for a hard link of the
    /// hash-checked cache file; the bytecode pool's own record): a wrong one
    /// can only make `verify --deep` report a file as changed, never hide a change.
    pub fn build_known(
        dir: &Path,
        skip: &[&str],
        known: &HashMap<String, String>,
    ) -> Result<Manifest> {
        let mut m = Manifest {
            excluded: skip.iter().map(|s| s.to_string()).collect(),
            ..Manifest::default()
        };
        walk(dir, dir, skip, known, &mut m)?;
        m.files.sort_by(|a, b| a.path.cmp(&b.path));
        m.symlinks.sort();
        m.dirs.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(m)
    }

    /// Adds the top-level directory `name` of the entry at `dir`, which
    /// [`Manifest::build`] was told to skip (made after the rest was walked,
    /// e.g. an oracle's logs): its files (hashed), symlinks and directories
    /// join the others and it is no longer excluded.
    ///
    /// Errors: `dir/name` or something below it cannot be read.
    pub fn add_tree(&mut self, dir: &Path, name: &str) -> Result<()> {
        let top = dir.join(name);
        self.dirs.push(DirStamp {
            path: name.to_string(),
            mtime_ns: mtime_ns(&fs::metadata(&top)?),
        });
        walk(dir, &top, &[], &HashMap::new(), self)?;
        self.excluded.retain(|e| e != name);
        self.files.sort_by(|a, b| a.path.cmp(&b.path));
        self.symlinks.sort();
        self.dirs.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(())
    }

    /// Writes the manifest to `<dir>/manifest.json`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_json(&dir.join(MANIFEST), self)
    }

    /// Reads `<dir>/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        read_json(&dir.join(MANIFEST))
    }

    /// Records the current size and sha256 of the file `rel` of the entry at
    /// `dir` (a record replaced on purpose, e.g. `oracle.json` after the gate
    /// re-ran), adding it when it is not listed yet; top-level names the
    /// manifest excludes stay excluded.
    ///
    /// Errors: the file cannot be read.
    pub fn refresh(&mut self, dir: &Path, rel: &str) -> Result<()> {
        if self.excluded.iter().any(|e| e == rel) {
            return Ok(());
        }
        let p = dir.join(rel);
        let file = ManifestFile {
            path: rel.to_string(),
            size: fs::metadata(&p)?.len(),
            sha256: sha256_file(&p)?,
        };
        match self.files.iter_mut().find(|f| f.path == rel) {
            Some(f) => *f = file,
            None => {
                self.files.push(file);
                self.files.sort_by(|a, b| a.path.cmp(&b.path));
            }
        }
        Ok(())
    }

    /// Total size of the files, in bytes.
    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Problems found by checking every file exists with its recorded size
    /// (and, when `deep`, its sha256; the entry's [`RECORDS`] always), and that no file was added: an extra
    /// `.pth`, `sitecustomize.py` or installed package changes what the
    /// oracle runs without changing any recorded file. Bytecode caches
    /// (`__pycache__/*.pyc`, written by Python as it imports) are not counted.
    /// Empty means intact.
    pub fn check(&self, dir: &Path, deep: bool) -> Vec<String> {
        self.check_hashing(dir, |f| deep || RECORDS.contains(&f.path.as_str()))
    }

    /// The no-op's check of an entry written before stamps, whose cost grows
    /// with the number of directories, not of files. Every file, symlink and
    /// directory at the entry's top is checked as [`Manifest::check`] does;
    /// below it, each directory's modification time is compared with
    /// [`Manifest::dirs`]. When all match, nothing was added, removed or
    /// renamed anywhere, and no file was replaced by a new one. When one
    /// differs, the whole entry is checked as [`Manifest::check`] does, and
    /// every file directly in a changed directory is hashed as well.
    /// A file rewritten in place (its inode kept, its directory untouched)
    /// is left to `verify`. Manifests without directory times get
    /// [`Manifest::check`] with sizes. Empty means intact.
    pub fn check_dirs(&self, dir: &Path) -> Vec<String> {
        if self.dirs.is_empty() {
            return self.check(dir, false);
        }
        let changed = self.changed_dirs(dir);
        if changed.is_empty() {
            return self.check_top(dir);
        }
        self.check_changed(dir, &changed)
    }

    /// Directories of [`Manifest::dirs`] that are gone, not directories, or
    /// of another modification time now.
    pub(super) fn changed_dirs(&self, dir: &Path) -> HashSet<&str> {
        self.dirs
            .iter()
            .filter(|d| match std::fs::symlink_metadata(dir.join(&d.path)) {
                Ok(m) => !m.is_dir() || mtime_ns(&m) != d.mtime_ns,
                Err(_) => true,
            })
            .map(|d| d.path.as_str())
            .collect()
    }

    /// [`Manifest::check`] with sizes, hashing the records, every file named
    /// in `changed` and every file directly in a directory named there.
    pub(super) fn check_changed(&self, dir: &Path, changed: &HashSet<&str>) -> Vec<String> {
        self.check_hashing(dir, |f| {
            RECORDS.contains(&f.path.as_str())
                || changed.contains(f.path.as_str())
                || changed.contains(f.path.rsplit_once('/').map_or("", |(parent, _)| parent))
        })
    }

    /// [`Manifest::check`] of the entry's top level only: its files (sizes,
    /// records hashed), symlinks and directories, and nothing added there.
    fn check_top(&self, dir: &Path) -> Vec<String> {
        let top = |p: &str| !p.contains('/');
        let mut problems = Vec::new();
        for f in self.files.iter().filter(|f| top(&f.path)) {
            self.check_file(dir, f, RECORDS.contains(&f.path.as_str()), &mut problems);
        }
        for (path, target) in self.symlinks.iter().filter(|(p, _)| top(p)) {
            check_link(dir, path, target, &mut problems);
        }
        let mut known: std::collections::HashSet<&str> = self
            .files
            .iter()
            .map(|f| f.path.as_str())
            .chain(self.symlinks.iter().map(|(p, _)| p.as_str()))
            .filter(|p| top(p))
            .collect();
        for d in self.dirs.iter().filter(|d| top(&d.path)) {
            known.insert(d.path.as_str());
        }
        if let Ok(rd) = std::fs::read_dir(dir) {
            let mut extra: Vec<String> = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    !known.contains(n.as_str()) && !self.excluded.contains(n) && n != STAMPS
                })
                .collect();
            extra.sort();
            problems.extend(extra.into_iter().map(|p| format!("added: {p}")));
        }
        problems
    }

    /// Checks the file `f` of the entry at `dir`: present, its recorded
    /// size, and (when `hash`) its sha256.
    fn check_file(&self, dir: &Path, f: &ManifestFile, hash: bool, problems: &mut Vec<String>) {
        let p = dir.join(&f.path);
        match std::fs::symlink_metadata(&p) {
            Err(_) => problems.push(format!("missing: {}", f.path)),
            // A regular file of the entry replaced by a link (to an identical
            // file elsewhere, perhaps): its bytes are no longer the entry's.
            Ok(m) if m.file_type().is_symlink() => problems.push(replaced_by_link(dir, &f.path)),
            Ok(m) if !m.is_file() => problems.push(format!("not a file: {}", f.path)),
            Ok(m) if m.len() != f.size => problems.push(format!(
                "changed size: {} ({} -> {} bytes)",
                f.path,
                f.size,
                m.len()
            )),
            Ok(_) if hash => match sha256_file(&p) {
                Ok(h) if h == f.sha256 => {}
                Ok(_) => problems.push(format!("changed content: {}", f.path)),
                Err(e) => problems.push(format!("unreadable: {}: {e}", f.path)),
            },
            Ok(_) => {}
        }
    }

    /// [`Manifest::check`], hashing the files for which `hash` is true.
    fn check_hashing(&self, dir: &Path, hash: impl Fn(&ManifestFile) -> bool) -> Vec<String> {
        let mut problems = Vec::new();
        for f in &self.files {
            self.check_file(dir, f, hash(f), &mut problems);
        }
        for (path, target) in &self.symlinks {
            check_link(dir, path, target, &mut problems);
        }
        for d in &self.dirs {
            if std::fs::symlink_metadata(dir.join(&d.path))
                .is_ok_and(|m| m.file_type().is_symlink())
            {
                problems.push(replaced_by_link(dir, &d.path));
            }
        }
        let known: std::collections::HashSet<&str> = self
            .files
            .iter()
            .map(|f| f.path.as_str())
            .chain(self.symlinks.iter().map(|(p, _)| p.as_str()))
            .collect();
        let mut extra = Vec::new();
        added(dir, dir, &self.excluded, &known, &mut extra);
        extra.sort();
        problems.extend(extra.into_iter().map(|p| format!("added: {p}")));
        problems
    }
}

/// Checks that the symlink `path` of the entry at `dir` still points at `target`.
/// The problem of `path` (relative to the entry at `dir`), recorded as a
/// file or directory and now a symlink: where it points, and whether that
/// leaves the entry.
fn replaced_by_link(dir: &Path, path: &str) -> String {
    let p = dir.join(path);
    let target = std::fs::read_link(&p).unwrap_or_default();
    let leaves = match (p.canonicalize(), dir.canonicalize()) {
        (Ok(t), Ok(d)) => !t.starts_with(d),
        _ => true,
    };
    format!(
        "replaced by a symlink: {path} -> {}{}",
        target.display(),
        if leaves { " (outside the entry)" } else { "" }
    )
}

fn check_link(dir: &Path, path: &str, target: &str, problems: &mut Vec<String>) {
    match std::fs::read_link(dir.join(path)) {
        Ok(t) if t.to_string_lossy() == *target => {}
        Ok(_) => problems.push(format!("changed link: {path}")),
        Err(_) => problems.push(format!("missing: {path}")),
    }
}

/// Files and symlinks under `dir` that `known` does not list (see [`Manifest::check`]).
fn added(
    base: &Path,
    dir: &Path,
    excluded: &[String],
    known: &std::collections::HashSet<&str>,
    out: &mut Vec<String>,
) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let path = e.path();
        let rel = path
            .strip_prefix(base)
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        if dir == base && (excluded.contains(&rel) || rel == STAMPS) {
            continue;
        }
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() && !ft.is_symlink() {
            added(base, &path, excluded, known, out);
        } else if !known.contains(rel.as_str()) {
            let pycache =
                dir.file_name().is_some_and(|n| n == "__pycache__") && rel.ends_with(".pyc");
            if !pycache {
                out.push(rel);
            }
        }
    }
}

fn walk(
    base: &Path,
    dir: &Path,
    skip: &[&str],
    known: &HashMap<String, String>,
    m: &mut Manifest,
) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let path = e.path();
        let rel = path
            .strip_prefix(base)
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        if dir == base && (skip.contains(&rel.as_str()) || rel == STAMPS) {
            continue;
        }
        let ft = e.file_type()?;
        if ft.is_symlink() {
            m.symlinks
                .push((rel, fs::read_link(&path)?.to_string_lossy().into_owned()));
        } else if ft.is_dir() {
            m.dirs.push(DirStamp {
                path: rel.clone(),
                mtime_ns: mtime_ns(&e.metadata()?),
            });
            walk(base, &path, skip, known, m)?;
        } else {
            let size = e.metadata()?.len();
            let sha256 = match known.get(&rel) {
                Some(h) => h.clone(),
                None => sha256_file(&path)?,
            };
            m.files.push(ManifestFile {
                path: rel,
                size,
                sha256,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field by field: [`Manifest`] has no `PartialEq`.
    fn same(a: &Manifest, b: &Manifest) {
        assert_eq!(a.files, b.files);
        assert_eq!(a.symlinks, b.symlinks);
        assert_eq!(a.excluded, b.excluded);
        assert_eq!(a.dirs, b.dirs);
    }

    #[test]
    fn a_tree_added_later_is_listed_as_if_it_had_been_walked() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::create_dir_all(d.join("lib/pkg")).unwrap();
        fs::write(d.join("lib/pkg/a.py"), "a = 1\n").unwrap();
        fs::write(d.join("top.txt"), "top\n").unwrap();
        // Listed before the logs exist, without them.
        let mut m = Manifest::build(d, &[MANIFEST, "logs"]).unwrap();
        fs::create_dir_all(d.join("logs/smoke")).unwrap();
        fs::write(d.join("logs/install.log"), "installed\n").unwrap();
        fs::write(d.join("logs/smoke/result.json"), "{}\n").unwrap();
        std::os::unix::fs::symlink("install.log", d.join("logs/latest")).unwrap();
        m.add_tree(d, "logs").unwrap();
        same(&m, &Manifest::build(d, &[MANIFEST]).unwrap());
        assert!(m.files.iter().any(|f| f.path == "logs/smoke/result.json"));
        // An edited log is damage, as any other file.
        fs::write(d.join("logs/install.log"), "edited!!!\n").unwrap();
        assert!(!m.check(d, true).is_empty());
    }
}
