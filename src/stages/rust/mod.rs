//! Stage "rust": what a tree whose build compiles Rust needs beyond Python
//! (issue 40): the Rust toolchain its files declare, and the crates of its
//! `Cargo.lock` files.
//!
//! Everything is read from the tree (a checkout, or a commit of the mirror),
//! never assumed: the build needs Rust when its build requirements
//! (`pyproject.toml` `[build-system]`, `requirements/build/<device>.txt` or
//! `requirements/build.txt`) name `setuptools-rust` or `maturin`, or when it
//! has a `rust-toolchain.toml` / `rust-toolchain` file ([`discover_in_tree`]).
//! Only then is a toolchain measured and held against the channels the
//! tree declares ([`crate::host::rust`]), and only then does the wheel key
//! hold it; a tree without Rust builds as before.

pub mod crates;
pub mod declared;

use std::path::Path;
use std::str::FromStr;

use anyhow::Result;
use fs_err as fs;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::host::rust::{Declared, parse_toolchain_file};

/// The largest file of the tree read here (a `Cargo.lock` of vLLM's 610
/// crates is ~70 KiB; a Python file that large is not a build script).
const MAX_READ: usize = 16 << 20;

/// The environment variable vLLM's build reads to make its Rust frontend
/// required rather than optional.
pub const REQUIRE_ENV: &str = "VLLM_REQUIRE_RUST_FRONTEND";

/// One `Cargo.lock` of the tree.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CargoLock {
    /// Its path relative to the tree, e.g. `rust/Cargo.lock`.
    pub file: String,
    /// The sha256 of its bytes (the name of its crates' store entry).
    pub sha256: String,
}

/// What the tree's build needs of Rust.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct TreeRust {
    /// Why the build needs Rust, one line each (`pyproject.toml
    /// [build-system] requires setuptools-rust>=1.9.0`, `rust-toolchain.toml`).
    pub needs: Vec<String>,
    /// Its toolchain files and their channels.
    pub toolchain_files: Vec<Declared>,
    /// Its `Cargo.lock` files, in path order.
    pub locks: Vec<CargoLock>,
    /// Whether a Python file of the tree reads [`REQUIRE_ENV`] (only
    /// looked for in a checkout; `false` for a mirror's commit).
    #[serde(default)]
    pub reads_require_env: bool,
    /// The Python files of the tree that name `setuptools_rust` (where its
    /// extensions are declared: [`declared`]; only looked for in a checkout).
    #[serde(default)]
    pub rust_py_files: Vec<String>,
}

/// The file names rustup reads a toolchain from.
const TOOLCHAIN_FILES: [&str; 2] = ["rust-toolchain.toml", "rust-toolchain"];

/// The build backends that compile Rust.
const RUST_BUILDERS: [&str; 2] = ["setuptools-rust", "maturin"];

/// The name of a requirement line or string (`setuptools-rust>=1.9.0` ->
/// `setuptools-rust`), normalized (PEP 503); `None` for options, comments,
/// includes and lines that do not parse.
fn requirement_name(line: &str) -> Option<String> {
    let line = line.split('#').next().unwrap_or("").trim();
    if line.is_empty() || line.starts_with('-') {
        return None;
    }
    let req = pep508_rs::Requirement::<pep508_rs::VerbatimUrl>::from_str(line).ok()?;
    // A `PackageName` is normalized (PEP 503) when parsed.
    Some(req.name.to_string())
}

/// The Rust of a tree whose regular files are `paths` (relative,
/// `/`-separated), read through `read`, built for `device`; `None` when its
/// build needs no Rust. `scan_env`: look through its Python files for
/// [`REQUIRE_ENV`].
///
/// Errors: a toolchain file that does not parse (names it).
pub fn discover(
    paths: &[String],
    read: &dyn Fn(&str) -> Option<Vec<u8>>,
    device: &str,
    scan_env: bool,
) -> Result<Option<TreeRust>> {
    let text = |p: &str| read(p).map(|b| String::from_utf8_lossy(&b).into_owned());
    let mut needs = Vec::new();
    if let Some(doc) = text("pyproject.toml").and_then(|t| toml::from_str::<toml::Table>(&t).ok())
        && let Some(bs) = doc.get("build-system")
    {
        for r in bs
            .get("requires")
            .and_then(|r| r.as_array())
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
        {
            if requirement_name(r).is_some_and(|n| RUST_BUILDERS.contains(&n.as_str())) {
                needs.push(format!("pyproject.toml [build-system] requires {r}"));
            }
        }
        if bs
            .get("build-backend")
            .and_then(|b| b.as_str())
            .is_some_and(|b| b.starts_with("maturin"))
        {
            needs.push("pyproject.toml [build-system] build-backend is maturin".into());
        }
    }
    for rel in crate::stages::lock::build_candidates(device) {
        for line in text(&rel).unwrap_or_default().lines() {
            if requirement_name(line).is_some_and(|n| RUST_BUILDERS.contains(&n.as_str())) {
                needs.push(format!("{rel} requires {}", line.trim()));
            }
        }
    }
    let mut toolchain_files = Vec::new();
    let mut locks = Vec::new();
    let mut sorted: Vec<&String> = paths.iter().collect();
    sorted.sort();
    for p in sorted {
        let name = p.rsplit('/').next().unwrap_or(p);
        if TOOLCHAIN_FILES.contains(&name) {
            let t = text(p).unwrap_or_default();
            let channel = parse_toolchain_file(&t)
                .map_err(|why| crate::exit::bad_input(format!("the tree's {p}: {why}")))?;
            toolchain_files.push(Declared {
                file: p.clone(),
                channel,
            });
            needs.push(p.clone());
        } else if name == "Cargo.lock"
            && let Some(bytes) = read(p)
        {
            locks.push(CargoLock {
                file: p.clone(),
                sha256: hex::encode(Sha256::digest(&bytes)),
            });
        }
    }
    if needs.is_empty() {
        return Ok(None);
    }
    let mut reads_require_env = false;
    let mut rust_py_files = Vec::new();
    if scan_env {
        let has = |b: &[u8], word: &str| b.windows(word.len()).any(|w| w == word.as_bytes());
        let mut py: Vec<&String> = paths.iter().filter(|p| p.ends_with(".py")).collect();
        py.sort();
        for p in py {
            let Some(b) = read(p) else { continue };
            reads_require_env |= has(&b, REQUIRE_ENV);
            if has(&b, "setuptools_rust") {
                rust_py_files.push(p.clone());
            }
        }
    }
    Ok(Some(TreeRust {
        needs,
        toolchain_files,
        locks,
        reads_require_env,
        rust_py_files,
    }))
}

/// Every regular file under `dir`, relative and `/`-separated, `.git`
/// left out; symlinks are not followed.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, rel: &str, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(root.join(rel)) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            match e.file_type() {
                Ok(t) if t.is_dir() && name != ".git" => walk(root, &path, out),
                Ok(t) if t.is_file() => out.push(path),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out);
    out
}

/// Reads the regular file `rel` of `dir`, at most [`MAX_READ`] bytes.
fn read_bounded(dir: &Path, rel: &str) -> Option<Vec<u8>> {
    let p = dir.join(rel);
    let m = fs::symlink_metadata(&p).ok()?;
    if !m.is_file() || m.len() > MAX_READ as u64 {
        return None;
    }
    fs::read(&p).ok()
}

/// [`discover`] on the checkout at `src` for `device`, its Python files
/// searched for [`REQUIRE_ENV`].
///
/// Errors: as [`discover`].
pub fn discover_in_tree(src: &Path, device: &str) -> Result<Option<TreeRust>> {
    let paths = files_under(src);
    discover(&paths, &|rel| read_bounded(src, rel), device, true)
}

/// [`discover`] on `commit` of the bare mirror at `mirror`, without a
/// checkout (for `plan` and the `--offline` preflight); `None` also when
/// the mirror lacks the commit.
///
/// Errors: as [`discover`].
pub fn discover_in_mirror(mirror: &Path, commit: &str, device: &str) -> Result<Option<TreeRust>> {
    let Some(files) = crate::stages::source::CommitFiles::open(mirror, commit) else {
        return Ok(None);
    };
    let paths = files.paths();
    discover(
        &paths,
        &|rel| files.read(rel, MAX_READ).map(String::into_bytes),
        device,
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn tree(files: &[(&str, &str)]) -> (Vec<String>, BTreeMap<String, Vec<u8>>) {
        let map: BTreeMap<String, Vec<u8>> = files
            .iter()
            .map(|(p, t)| (p.to_string(), t.as_bytes().to_vec()))
            .collect();
        (map.keys().cloned().collect(), map)
    }

    #[test]
    fn a_tree_needs_rust_by_its_build_requirements_or_toolchain_file() {
        let (paths, map) = tree(&[
            (
                "pyproject.toml",
                "[build-system]\nrequires = [\"setuptools>=77\", \"setuptools-rust>=1.9.0\"]\n",
            ),
            ("rust/Cargo.lock", "version = 4\n"),
            ("rust-toolchain.toml", "[toolchain]\nchannel = \"1.95\"\n"),
            (
                "tools/build_rust.py",
                "from setuptools_rust import RustExtension\nos.getenv('VLLM_REQUIRE_RUST_FRONTEND')\n",
            ),
        ]);
        let read = |p: &str| map.get(p).cloned();
        let t = discover(&paths, &read, "cpu", true).unwrap().unwrap();
        assert_eq!(
            t.needs,
            [
                "pyproject.toml [build-system] requires setuptools-rust>=1.9.0",
                "rust-toolchain.toml"
            ]
        );
        assert_eq!(t.toolchain_files[0].channel.as_deref(), Some("1.95"));
        assert_eq!(t.locks.len(), 1);
        assert_eq!(t.locks[0].file, "rust/Cargo.lock");
        assert!(t.reads_require_env);
        assert_eq!(t.rust_py_files, ["tools/build_rust.py"]);
        assert!(
            !discover(&paths, &read, "cpu", false)
                .unwrap()
                .unwrap()
                .reads_require_env
        );

        let (paths, map) = tree(&[
            (
                "requirements/build/cuda.txt",
                "# build\nsetuptools_rust >= 1.9\n-r common.txt\n",
            ),
            (
                "pyproject.toml",
                "[build-system]\nrequires = [\"setuptools\"]\n",
            ),
        ]);
        let read = |p: &str| map.get(p).cloned();
        let t = discover(&paths, &read, "cuda", true).unwrap().unwrap();
        assert_eq!(
            t.needs,
            ["requirements/build/cuda.txt requires setuptools_rust >= 1.9"]
        );
        assert!(
            discover(&paths, &read, "cpu", true).unwrap().is_none(),
            "no Rust for cpu"
        );

        let (paths, map) = tree(&[("rust-toolchain.toml", "[toolchain\n")]);
        let read = |p: &str| map.get(p).cloned();
        let e = discover(&paths, &read, "cpu", true).unwrap_err();
        assert!(format!("{e:#}").contains("rust-toolchain.toml"), "{e:#}");
    }
}
