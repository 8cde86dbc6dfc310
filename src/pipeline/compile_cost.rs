//! The compile cost of a new pin, said before any build (issue 25): which
//! extension sources changed since the oracle being replaced, read as a
//! tree-to-tree diff of the two commits in the store's mirror (libgit2, no
//! network), and what that means for the compiler cache.
//!
//! The extension sources are decided from the paths of the tree: C, C++
//! and CUDA translation units (`.c .cc .cpp .cxx .cu`) and headers
//! (`.h .hh .hpp .hxx .cuh .inl .inc`) anywhere, the CMake build
//! (`CMakeLists.txt`, `*.cmake`, anything under `cmake/`), and anything
//! else under `csrc/` (vLLM's kernel sources and their generators). With
//! ccache's `base_dir` set to the build directory (`stages::wheel`), an
//! unchanged translation unit of the new pin has the key it had in the
//! old one, so it hits; a changed one misses; a changed header makes every
//! unit that includes it miss; a changed CMake build may change the flags
//! of every unit.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::recipe::{BuildMode, LoadedRecipe};
use crate::stages::source;
use crate::stages::wheel::BuildRecord;
use crate::store::{Bucket, Store};

/// How many paths each list keeps at most (the counts are exact).
pub const LISTED: usize = 500;

/// The extension sources that changed between two commits, and the cost
/// that gives.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CompileCost {
    /// The commit of the oracle being replaced.
    pub since: String,
    /// What that commit is, in words (the FROM pin, the store's last wheel).
    pub since_what: String,
    /// Translation units added or changed: each misses the cache.
    pub translation_units: Vec<String>,
    /// Headers added, changed or removed: every unit including one misses.
    pub headers: Vec<String>,
    /// CMake files added, changed or removed.
    pub build_files: Vec<String>,
    /// Other files under `csrc/` added, changed or removed.
    pub other: Vec<String>,
    /// Translation units removed (no cost).
    pub removed: Vec<String>,
    /// How many extension sources changed in all (the lists stop at [`LISTED`]).
    pub changed: usize,
    /// The expected cost, one line.
    pub summary: String,
}

/// What a changed path is to the extension build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Unit,
    Header,
    Build,
    Other,
}

fn kind(path: &str) -> Option<Kind> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    let in_dir = |d: &str| path.starts_with(&format!("{d}/")) || path.contains(&format!("/{d}/"));
    match ext.as_deref() {
        Some("c" | "cc" | "cpp" | "cxx" | "cu") => Some(Kind::Unit),
        Some("h" | "hh" | "hpp" | "hxx" | "cuh" | "inl" | "inc") => Some(Kind::Header),
        _ if name == "CMakeLists.txt" || ext.as_deref() == Some("cmake") || in_dir("cmake") => {
            Some(Kind::Build)
        }
        _ if path.starts_with("csrc/") => Some(Kind::Other),
        _ => None,
    }
}

/// The extension sources that differ between the trees of commits `from`
/// and `to` in the git repository at `repo` (the store's mirror), described
/// as `since_what`.
///
/// Errors: the repository cannot be opened, or it lacks either commit.
pub fn between(repo: &Path, from: &str, to: &str, since_what: &str) -> Result<CompileCost> {
    let git = git2::Repository::open(repo)
        .with_context(|| format!("opening the mirror {}", repo.display()))?;
    let tree = |c: &str| -> Result<git2::Tree<'_>> {
        let oid = git2::Oid::from_str(c).with_context(|| format!("commit {c}"))?;
        Ok(git
            .find_commit(oid)
            .with_context(|| format!("{} lacks commit {c}", repo.display()))?
            .tree()?)
    };
    let (a, b) = (tree(from)?, tree(to)?);
    let diff = git.diff_tree_to_tree(Some(&a), Some(&b), None)?;
    let mut cost = CompileCost {
        since: from.to_string(),
        since_what: since_what.to_string(),
        translation_units: Vec::new(),
        headers: Vec::new(),
        build_files: Vec::new(),
        other: Vec::new(),
        removed: Vec::new(),
        changed: 0,
        summary: String::new(),
    };
    for delta in diff.deltas() {
        let deleted = delta.status() == git2::Delta::Deleted;
        let file = if deleted {
            delta.old_file()
        } else {
            delta.new_file()
        };
        let Some(path) = file.path().and_then(Path::to_str) else {
            continue;
        };
        let Some(k) = kind(path) else { continue };
        cost.changed += 1;
        let list = match (k, deleted) {
            (Kind::Unit, true) => &mut cost.removed,
            (Kind::Unit, false) => &mut cost.translation_units,
            (Kind::Header, _) => &mut cost.headers,
            (Kind::Build, _) => &mut cost.build_files,
            (Kind::Other, _) => &mut cost.other,
        };
        if list.len() < LISTED {
            list.push(path.to_string());
        }
    }
    cost.summary = summary(&cost);
    Ok(cost)
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn listed(paths: &[String]) -> String {
    let shown: Vec<&str> = paths.iter().take(8).map(String::as_str).collect();
    let more = paths.len().saturating_sub(shown.len());
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

fn summary(c: &CompileCost) -> String {
    let since = format!("{} ({})", &c.since[..12.min(c.since.len())], c.since_what);
    let costly = c.translation_units.len() + c.headers.len() + c.build_files.len() + c.other.len();
    if costly == 0 {
        return format!("no extension source changed since {since}: compile hits expected");
    }
    let mut parts = Vec::new();
    if !c.translation_units.is_empty() {
        parts.push(format!(
            "{} changed since {since}: {} (they miss; the others hit)",
            plural(
                c.translation_units.len(),
                "translation unit",
                "translation units"
            ),
            listed(&c.translation_units)
        ));
    } else {
        parts.push(format!("no translation unit changed since {since}"));
    }
    if !c.headers.is_empty() {
        parts.push(format!(
            "{} changed: {} (every unit including one misses too)",
            plural(c.headers.len(), "header", "headers"),
            listed(&c.headers)
        ));
    }
    if !c.build_files.is_empty() {
        parts.push(format!(
            "the CMake build changed: {} (its flags may change for every unit: expect many misses)",
            listed(&c.build_files)
        ));
    }
    if !c.other.is_empty() {
        parts.push(format!(
            "{} under csrc/ changed: {} (generated kernels may change)",
            plural(c.other.len(), "other file", "other files"),
            listed(&c.other)
        ));
    }
    parts.join("; ")
}

/// Whether a build of `lr` compiles anything (source mode, a device that
/// builds the extension).
fn compiles(lr: &LoadedRecipe) -> bool {
    lr.recipe.build.mode == BuildMode::Source
        && crate::stages::ext::runs_cmake(&lr.recipe.build.target_device)
}

/// For `plan`: the compile cost of `lr`'s commit since the oracle it
/// replaces, taken to be the wheel this store built (or took) last from
/// the same repository and package at another commit (`build.json`
/// `started`); `None` when the build compiles nothing, the mirror lacks a
/// commit, or the store has no such wheel.
pub fn for_plan(store: &Store, lr: &LoadedRecipe) -> Option<CompileCost> {
    if !compiles(lr) {
        return None;
    }
    let r = &lr.recipe;
    let mirror = source::mirror_entry(store, &r.source.repo);
    let label = mirror.label();
    let last = store
        .entries(Bucket::Wheels)
        .ok()?
        .into_iter()
        .filter_map(|e| BuildRecord::read(&e.path).ok())
        .filter(|b| b.requires.contains(&label))
        .filter(|b| b.inputs["package"] == r.source.package.as_str())
        .filter(|b| b.inputs["commit"] != r.source.commit.as_str())
        .max_by(|x, y| x.started.cmp(&y.started))?;
    let from = last.inputs["commit"].as_str()?.to_string();
    between(
        &mirror.path,
        &from,
        &r.source.commit,
        "the wheel this store built last from this repository",
    )
    .ok()
}

/// For `advance`: the compile cost of TO since FROM (both in FROM's
/// mirror); `None` when TO compiles nothing or the mirror lacks a commit.
pub fn for_advance(store: &Store, from: &LoadedRecipe, to: &LoadedRecipe) -> Option<CompileCost> {
    if !compiles(to) {
        return None;
    }
    let mirror = source::mirror_entry(store, &from.recipe.source.repo);
    between(
        &mirror.path,
        &from.recipe.source.commit,
        &to.recipe.source.commit,
        &format!("FROM {}", from.recipe.name),
    )
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_sorted_into_units_headers_build_files_and_kernel_sources() {
        for (p, k) in [
            ("csrc/gen/k07.cpp", Some(Kind::Unit)),
            ("csrc/attention/a.cu", Some(Kind::Unit)),
            ("src/x.c", Some(Kind::Unit)),
            ("csrc/ops.h", Some(Kind::Header)),
            ("csrc/q/kernel.cuh", Some(Kind::Header)),
            ("CMakeLists.txt", Some(Kind::Build)),
            ("csrc/CMakeLists.txt", Some(Kind::Build)),
            ("cmake/utils.cmake", Some(Kind::Build)),
            ("cmake/external_projects/flashmla.txt", Some(Kind::Build)),
            ("csrc/quantization/machete/generate.py", Some(Kind::Other)),
            ("vllm/engine.py", None),
            ("README.md", None),
            ("docs/cmake.md", None),
        ] {
            assert_eq!(kind(p), k, "{p}");
        }
    }

    fn commit(repo: &git2::Repository, files: &[(&str, &str)], msg: &str) -> String {
        let root = repo.workdir().unwrap().to_path_buf();
        for (p, text) in files {
            let f = root.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, text).unwrap();
        }
        let mut index = repo.index().unwrap();
        index
            .add_all(["*"].iter(), git2::IndexAddOption::DEFAULT, None)
            .unwrap();
        index.write().unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        repo.commit(Some("HEAD"), &sig, &sig, msg, &tree, &parents)
            .unwrap()
            .to_string()
    }

    #[test]
    fn the_diff_of_two_commits_gives_the_changed_units_or_no_cost() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let c1 = commit(
            &repo,
            &[
                ("csrc/a.cpp", "int a;"),
                ("csrc/b.cu", "int b;"),
                ("csrc/ops.h", "#pragma once"),
                ("CMakeLists.txt", "project(x)"),
                ("README.md", "x"),
            ],
            "one",
        );
        let c2 = commit(&repo, &[("README.md", "y"), ("vllm/x.py", "1")], "docs");
        let none = between(dir.path(), &c1, &c2, "FROM fx").unwrap();
        assert_eq!(none.changed, 0);
        assert_eq!(
            none.summary,
            format!(
                "no extension source changed since {} (FROM fx): compile hits expected",
                &c1[..12]
            )
        );
        let c3 = commit(&repo, &[("csrc/b.cu", "int b2;")], "kernel");
        let one = between(dir.path(), &c2, &c3, "FROM fx").unwrap();
        assert_eq!(one.translation_units, ["csrc/b.cu"]);
        assert!(
            one.summary
                .starts_with(&format!("1 translation unit changed since {}", &c2[..12])),
            "{}",
            one.summary
        );
        std::fs::remove_file(dir.path().join("csrc/a.cpp")).unwrap();
        let mut index = repo.index().unwrap();
        index.remove_path(Path::new("csrc/a.cpp")).unwrap();
        index.write().unwrap();
        let c4 = commit(
            &repo,
            &[
                ("csrc/ops.h", "#pragma once\n#define X"),
                ("CMakeLists.txt", "project(y)"),
            ],
            "header and cmake",
        );
        let many = between(dir.path(), &c3, &c4, "the store's last wheel").unwrap();
        assert_eq!(many.removed, ["csrc/a.cpp"]);
        assert_eq!(many.headers, ["csrc/ops.h"]);
        assert_eq!(many.build_files, ["CMakeLists.txt"]);
        assert!(
            many.summary.contains("no translation unit changed"),
            "{}",
            many.summary
        );
        assert!(
            many.summary.contains("1 header changed: csrc/ops.h"),
            "{}",
            many.summary
        );
        assert!(
            many.summary.contains("the CMake build changed"),
            "{}",
            many.summary
        );
        assert!(between(dir.path(), &c1, &"0".repeat(40), "x").is_err());
    }
}
