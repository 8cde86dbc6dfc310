//! The package indexes a lock resolves against, through the site's
//! `[[mirror]]` tables ([`crate::host::mirror`]): the recipe's indexes
//! ([`site_indexes`]) and every index a requirement file of the tree names
//! (`--index-url`, `-i`, `--extra-index-url`, pip's requirements file
//! format, followed through `-r` / `-c` includes: [`scan`]). A mapped index
//! is given to uv instead of the original, a `none` one not at all; when a
//! file's index is mapped, uv reads a copy of the tree's requirement files
//! with those lines rewritten ([`rewrite`]), never the tree itself.
//!
//! Before uv runs, each index left is asked once ([`check_reachable`]): one
//! that does not answer fails naming the requirement file and line that
//! named it and the `[[mirror]]` that would fix it.
//!
//! Keys: the lock's inputs (`lock.json` `inputs.indexes`) and the wheel and
//! venv keys keep the recipe's indexes as written; a mirror that serves an
//! index is not part of any key, as a git mirror is not. What a lock
//! installs is decided by its content (every artifact pinned by sha256),
//! whichever index served it. An index a mirror drops ([`dropped`]) changes
//! what a resolution can pick, so the store lock's key holds it
//! ([`super::dropped_indexes`]).

use std::path::{Path, PathBuf};

use anyhow::Result;
use fs_err as fs;

use crate::host::mirror::{Mapped, Mirrors};
use crate::recipe::Index;
use crate::store::Store;

/// One index a requirement file names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexLine {
    /// The file, relative to the tree (`requirements/cpu.txt`).
    pub file: String,
    /// Its 1-based line.
    pub line: usize,
    /// The option as written (`--extra-index-url`).
    pub option: String,
    /// The index URL as written.
    pub url: String,
}

/// The requirement-file options that name an index (pip's requirements
/// file format; uv reads the same).
const INDEX_OPTIONS: &[&str] = &["--index-url", "-i", "--extra-index-url"];

/// The requirement-file options that include another file.
const INCLUDE_OPTIONS: &[&str] = &["-r", "--requirement", "-c", "--constraint"];

/// A line's option and its value: `--opt value`, `--opt=value` or `-ivalue`.
fn option_of<'a>(line: &'a str, options: &[&str]) -> Option<(&'a str, &'a str)> {
    let t = line.trim();
    for o in options {
        if let Some(rest) = t.strip_prefix(o) {
            let value = if let Some(v) = rest.strip_prefix('=') {
                v
            } else if rest.starts_with(char::is_whitespace) {
                rest.trim_start()
            } else if o.len() == 2 && !rest.is_empty() {
                rest
            } else {
                continue;
            };
            let value = value.split(" #").next().unwrap_or(value).trim();
            if !value.is_empty() {
                return Some((&t[..o.len()], value));
            }
        }
    }
    None
}

/// Every file reached from `files` (relative to `root`) through `-r` / `-c`
/// lines, each once, in the order reached; includes leaving `root` or
/// absolute are not followed (uv reads them as they are).
fn reached(root: &Path, files: &[String]) -> Vec<String> {
    reached_with(&|rel| fs::read_to_string(root.join(rel)).ok(), files)
        .into_iter()
        .map(|(rel, _)| rel)
        .collect()
}

/// [`reached`] through `read` (a path relative to the tree's root -> its
/// text, `None` when it cannot be read): each file with its text.
fn reached_with(read: &dyn Fn(&str) -> Option<String>, files: &[String]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut todo: Vec<String> = files.iter().rev().cloned().collect();
    while let Some(rel) = todo.pop() {
        if out.iter().any(|(r, _)| *r == rel) {
            continue;
        }
        let Some(text) = read(&rel) else {
            continue;
        };
        let dir = Path::new(&rel).parent().unwrap_or(Path::new(""));
        let mut next = Vec::new();
        for line in text.lines() {
            if let Some((_, v)) = option_of(line, INCLUDE_OPTIONS) {
                let p = dir.join(v);
                if let Some(norm) = crate::stages::source::tree_relative(&p) {
                    next.push(norm);
                }
            }
        }
        out.push((rel, text));
        todo.extend(next.into_iter().rev());
    }
    out
}

/// Every index line of the requirement files `files` of the tree at
/// `root` and of the files they include (`-r`, `-c`), in order.
pub fn scan(root: &Path, files: &[String]) -> Vec<IndexLine> {
    scan_with(&|rel| fs::read_to_string(root.join(rel)).ok(), files)
}

/// [`scan`] of a tree read through `read` (a path relative to the tree's
/// root -> its text, `None` when absent), such as a commit of a mirror
/// ([`crate::stages::source::CommitFiles`]).
pub fn scan_with(read: &dyn Fn(&str) -> Option<String>, files: &[String]) -> Vec<IndexLine> {
    let mut out = Vec::new();
    for (rel, text) in reached_with(read, files) {
        for (i, line) in text.lines().enumerate() {
            if let Some((option, url)) = option_of(line, INDEX_OPTIONS) {
                out.push(IndexLine {
                    file: rel.clone(),
                    line: i + 1,
                    option: option.to_string(),
                    url: url.to_string(),
                });
            }
        }
    }
    out
}

/// The indexes `mirrors` drop (`url = "none"`) among those the recipe
/// names (`recipe`) and those the tree's requirement files name (`lines`):
/// each URL as written, sorted, once. Pure.
pub fn dropped(mirrors: &Mirrors, recipe: &[Index], lines: &[IndexLine]) -> Vec<String> {
    let mut out: Vec<String> = recipe
        .iter()
        .map(Index::url)
        .chain(lines.iter().map(|l| l.url.as_str()))
        .filter(|u| matches!(mirrors.map(u), Mapped::Dropped(_)))
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The recipe's `indexes` through the site's mirrors of the store: each
/// URL mapped, those mapped to `none` left out (order kept).
///
/// Errors: exit 2 for a bad `config.toml`.
pub fn site_indexes(store: &Store, indexes: &[Index]) -> Result<Vec<Index>> {
    let mirrors = crate::host::mirror::load(store.root())?;
    Ok(map_indexes(&mirrors, indexes))
}

/// [`site_indexes`] with the mirrors given. Pure.
pub fn map_indexes(mirrors: &Mirrors, indexes: &[Index]) -> Vec<Index> {
    indexes
        .iter()
        .filter_map(|i| {
            let url = mirrors.map(i.url()).url()?.to_string();
            Some(match i {
                Index::Url(_) => Index::Url(url),
                Index::Explicit { name, packages, .. } => Index::Explicit {
                    name: name.clone(),
                    url,
                    packages: packages.clone(),
                },
            })
        })
        .collect()
}

/// The index an artifact URL of a lock resolved with `mirrors` was served
/// from, named as the recipe names it ([`crate::host::uv::index_of`] on
/// the mapped indexes, a mapped URL read back as the recipe's).
pub fn index_of(mirrors: &Mirrors, indexes: &[Index], artifact_url: &str) -> String {
    let mapped = map_indexes(mirrors, indexes);
    let got = crate::host::uv::index_of(&mapped, artifact_url);
    indexes
        .iter()
        .filter(|i| matches!(i, Index::Url(_)))
        .find(|i| mirrors.map(i.url()).url() == Some(got.as_str()))
        .map_or(got, |i| i.url().to_string())
}

/// Copies the requirement files `files` of the tree at `root` (and those
/// they include) under `out` at the same relative paths, each index line
/// mapped through `mirrors` or, when its mirror is `none`, commented out;
/// returns `out` when some line changed (uv then reads the copies), `None`
/// when no mirror applies (uv reads the tree's own files).
///
/// Errors: a file cannot be written.
pub fn rewrite(
    root: &Path,
    files: &[String],
    mirrors: &Mirrors,
    out: &Path,
) -> Result<Option<PathBuf>> {
    let mut changed = false;
    let mut copies: Vec<(PathBuf, String)> = Vec::new();
    for rel in reached(root, files) {
        let Ok(text) = fs::read_to_string(root.join(&rel)) else {
            continue;
        };
        let mut new = String::with_capacity(text.len());
        for line in text.lines() {
            match option_of(line, INDEX_OPTIONS) {
                Some((option, url)) => match mirrors.map(url) {
                    Mapped::Unchanged(_) => new.push_str(line),
                    Mapped::Mirrored(to, _) => {
                        changed = true;
                        new.push_str(&format!("{option} {to}"));
                    }
                    Mapped::Dropped(m) => {
                        changed = true;
                        new.push_str(&format!("# {line}  (dropped by {})", m.describe()));
                    }
                },
                None => new.push_str(line),
            }
            new.push('\n');
        }
        copies.push((out.join(&rel), new));
    }
    if !changed {
        return Ok(None);
    }
    for (path, text) in copies {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&path, text)?;
    }
    Ok(Some(out.to_path_buf()))
}

/// Whether the index `url` answers: any HTTP response counts (uv reads a
/// 404 as "no such package here"); a `file://` index must be a directory.
fn reachable(url: &str) -> std::result::Result<(), String> {
    if let Some(path) = url.strip_prefix("file://") {
        return if Path::new(path).is_dir() {
            Ok(())
        } else {
            Err(format!("{path} is not a directory"))
        };
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Ok(());
    }
    let client = crate::host::http::client_builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let url = url.to_string();
    let got =
        crate::host::http::block_on(1, async move { client.get(&url).send().await.map(|_| ()) })
            .map_err(|e| format!("{e:#}"))?;
    got.map_err(|e| crate::host::http::error_chain(&e))
}

/// Asks each index uv will be given once, before it runs: every index line
/// of `lines` (from the tree's requirement files) and every recipe index of
/// `recipe` (as written), each through `mirrors`.
///
/// Errors: naming, for the first index that does not answer, the
/// requirement file and line (or the recipe field) that named it, the URL
/// tried, why, and the `[[mirror]]` that would fix it (or the one that
/// mapped it).
pub fn check_reachable(mirrors: &Mirrors, lines: &[IndexLine], recipe: &[Index]) -> Result<()> {
    let config = mirrors
        .config_file
        .as_ref()
        .map_or("the store's config.toml".to_string(), |p| {
            p.display().to_string()
        });
    let mut asked: Vec<String> = Vec::new();
    let named = lines
        .iter()
        .map(|l| (format!("{}:{}", l.file, l.line), l.url.as_str()))
        .chain(
            recipe
                .iter()
                .enumerate()
                .map(|(i, x)| (format!("the recipe's indexes[{i}]"), x.url())),
        );
    for (by, url) in named {
        let mapped = mirrors.map(url);
        let Some(to) = mapped.url() else { continue };
        if asked.iter().any(|a| a == to) {
            continue;
        }
        asked.push(to.to_string());
        let Err(why) = reachable(to) else { continue };
        match &mapped {
            Mapped::Mirrored(_, m) => {
                return Err(anyhow::anyhow!(
                    "{by} names the package index {url}, mirrored to {to} by {}, which is unreachable ({why}): fix that mirror's url, or set it to \"none\"",
                    m.describe()
                ));
            }
            _ => {
                return Err(anyhow::anyhow!(
                    "{by} names the package index {url}, unreachable ({why}): add [[mirror]] prefix = \"{url}\" url = \"none\" (or a reachable mirror) to {config}"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_indexes_a_mirror_drops_are_named_once_each_and_sorted() {
        let mirrors = Mirrors {
            entries: crate::host::mirror::parse(
                "[[mirror]]\nprefix = \"https://download.pytorch.org/whl/\"\nurl = \"none\"\n[[mirror]]\nprefix = \"https://pypi.org/\"\nurl = \"http://127.0.0.1:9/pypi/\"\n",
                Path::new("/s/config.toml"),
            )
            .unwrap(),
            config_file: None,
        };
        let line = |file: &str, url: &str| IndexLine {
            file: file.into(),
            line: 1,
            option: "--extra-index-url".into(),
            url: url.into(),
        };
        let lines = [
            line(
                "requirements/cpu.txt",
                "https://download.pytorch.org/whl/cpu",
            ),
            line(
                "requirements/build/cpu.txt",
                "https://download.pytorch.org/whl/cpu",
            ),
            line("requirements/common.txt", "https://pypi.org/simple"),
            line("requirements/common.txt", "https://example.org/simple"),
        ];
        let recipe = [
            Index::Url("https://download.pytorch.org/whl/cu128".into()),
            Index::Url("https://pypi.org/simple".into()),
        ];
        // Mirrored (pypi) or untouched (example.org): served, not dropped.
        assert_eq!(
            dropped(&mirrors, &recipe, &lines),
            [
                "https://download.pytorch.org/whl/cpu",
                "https://download.pytorch.org/whl/cu128"
            ]
        );
        assert!(dropped(&Mirrors::default(), &recipe, &lines).is_empty());
        // The same lines read through a reader as through the tree.
        let files: std::collections::BTreeMap<&str, &str> = [
            (
                "requirements/cpu.txt",
                "-r common.txt\n--extra-index-url https://download.pytorch.org/whl/cpu\n",
            ),
            (
                "requirements/common.txt",
                "-i https://pypi.org/simple\nnumpy\n",
            ),
        ]
        .into_iter()
        .collect();
        let read = |rel: &str| files.get(rel).map(|t| t.to_string());
        let got = scan_with(&read, &["requirements/cpu.txt".to_string()]);
        let urls: Vec<&str> = got.iter().map(|l| l.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "https://download.pytorch.org/whl/cpu",
                "https://pypi.org/simple"
            ]
        );
        assert_eq!(
            dropped(&mirrors, &[], &got),
            ["https://download.pytorch.org/whl/cpu"]
        );
    }

    #[test]
    fn index_lines_are_found_through_includes_and_rewritten() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        fs::create_dir_all(root.join("requirements/build")).unwrap();
        fs::write(
            root.join("requirements/cpu.txt"),
            "--extra-index-url https://download.pytorch.org/whl/cpu\n-r common.txt\ntorch==2.11.0\n",
        )
        .unwrap();
        fs::write(
            root.join("requirements/common.txt"),
            "--index-url=https://pypi.org/simple\nnumpy\n",
        )
        .unwrap();
        let files = vec!["requirements/cpu.txt".to_string()];
        let lines = scan(root, &files);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(
            (lines[0].file.as_str(), lines[0].line),
            ("requirements/cpu.txt", 1)
        );
        assert_eq!(lines[0].url, "https://download.pytorch.org/whl/cpu");
        assert_eq!(lines[1].file, "requirements/common.txt");
        assert_eq!(lines[1].url, "https://pypi.org/simple");
        let mirrors = Mirrors {
            entries: crate::host::mirror::parse(
                "[[mirror]]\nprefix = \"https://download.pytorch.org/whl/cpu\"\nurl = \"none\"\n[[mirror]]\nprefix = \"https://pypi.org/\"\nurl = \"http://127.0.0.1:9/pypi/\"\n",
                Path::new("/s/config.toml"),
            )
            .unwrap(),
            config_file: None,
        };
        let out = root.join("out");
        assert_eq!(
            rewrite(root, &files, &mirrors, &out).unwrap(),
            Some(out.clone())
        );
        let cpu = fs::read_to_string(out.join("requirements/cpu.txt")).unwrap();
        assert!(cpu.starts_with("# --extra-index-url"), "{cpu}");
        assert!(cpu.contains("-r common.txt\n"), "{cpu}");
        let common = fs::read_to_string(out.join("requirements/common.txt")).unwrap();
        assert!(
            common.starts_with("--index-url http://127.0.0.1:9/pypi/simple\n"),
            "{common}"
        );
        assert_eq!(
            rewrite(root, &files, &Mirrors::default(), &root.join("o2")).unwrap(),
            None
        );
    }
}
