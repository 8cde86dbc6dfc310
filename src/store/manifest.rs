//! Entry manifests: every file of a store entry with its size and sha256,
//! checked by the no-op path (sizes), `status`, `doctor` and `verify --deep` (hashes).

use std::collections::HashMap;
use std::path::Path;

use anyhow::Result;
use fs_err as fs;
use serde::{Deserialize, Serialize};

use super::fsutil::{read_json, sha256_file, write_json};

/// The file name of every entry's manifest.
pub const MANIFEST: &str = "manifest.json";

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
        Ok(m)
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
        let mut problems = Vec::new();
        for f in &self.files {
            let p = dir.join(&f.path);
            match std::fs::metadata(&p) {
                Err(_) => problems.push(format!("missing: {}", f.path)),
                Ok(m) if m.len() != f.size => problems.push(format!(
                    "changed size: {} ({} -> {} bytes)",
                    f.path,
                    f.size,
                    m.len()
                )),
                Ok(_) if deep || RECORDS.contains(&f.path.as_str()) => match sha256_file(&p) {
                    Ok(h) if h == f.sha256 => {}
                    Ok(_) => problems.push(format!("changed content: {}", f.path)),
                    Err(e) => problems.push(format!("unreadable: {}: {e}", f.path)),
                },
                Ok(_) => {}
            }
        }
        for (path, target) in &self.symlinks {
            match std::fs::read_link(dir.join(path)) {
                Ok(t) if t.to_string_lossy() == *target => {}
                Ok(_) => problems.push(format!("changed link: {path}")),
                Err(_) => problems.push(format!("missing: {path}")),
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
        if dir == base && excluded.contains(&rel) {
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
        if dir == base && skip.contains(&rel.as_str()) {
            continue;
        }
        let ft = e.file_type()?;
        if ft.is_symlink() {
            m.symlinks
                .push((rel, fs::read_link(&path)?.to_string_lossy().into_owned()));
        } else if ft.is_dir() {
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
