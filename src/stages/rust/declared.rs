//! The Rust extensions a tree declares, and whether a wheel or a venv
//! holds them (issue 40: "optional parts are part of the identity").
//!
//! setuptools-rust builds what the tree declares: `RustExtension(target=...)`
//! (a Python module, or with `binding=Binding.Exec` an executable inside the
//! package, as vLLM's `vllm.vllm-rs`) and `RustBin(target=...)` (a script),
//! in Python (read without running it: Python's own `ast`, by
//! `py/rust_declared.py`, in every file of the tree that names
//! `setuptools_rust`), or in `pyproject.toml` (`[[tool.setuptools-rust.
//! ext-modules]]`, `[[tool.setuptools-rust.bins]]`). An extension declared
//! `optional` that fails to build is left out of the wheel with only a
//! warning; here every declared one is required unless the recipe's
//! `build.optional_missing_ok` names it.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::TreeRust;

const RUST_DECLARED_PY: &str = include_str!("../../py/rust_declared.py");

/// What an extension is once installed.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A Python extension module: `<a>/<b>/<c>*.so` for the target `a.b.c`.
    Module,
    /// An executable inside the package (`Binding.Exec`): `<a>/<b>/<c>`.
    Executable,
    /// A script (`RustBin`): `<dist>.data/scripts/<target>`, the venv's `bin/<target>`.
    Script,
}

/// One extension the tree declares, and whether it is there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Extension {
    /// Its target as declared (`vllm._rust_tool_parser`, `vllm.vllm-rs`).
    pub target: String,
    /// What it is once installed.
    pub kind: Kind,
    /// Where it is declared: `file:line` (`pyproject.toml` for a table there).
    pub declared: String,
    /// Whether the wheel (in `build.json`) or the venv (in the identity)
    /// holds it.
    #[serde(default)]
    pub present: bool,
}

/// One object `rust_declared.py` prints.
#[derive(Debug, Deserialize)]
struct Found {
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    binding: Option<String>,
    file: String,
    #[serde(default)]
    line: Option<u64>,
    #[serde(default)]
    error: Option<String>,
}

fn kind_of(kind: &str, binding: Option<&str>) -> Kind {
    match (kind, binding) {
        ("bin", _) => Kind::Script,
        (_, Some(b)) if b.eq_ignore_ascii_case("exec") => Kind::Executable,
        _ => Kind::Module,
    }
}

/// The extensions `pyproject.toml` of the tree at `src` declares
/// (`[[tool.setuptools-rust.ext-modules]]`, `[[tool.setuptools-rust.bins]]`).
fn in_pyproject(src: &Path) -> Vec<Extension> {
    let Ok(text) = fs_err::read_to_string(src.join("pyproject.toml")) else {
        return Vec::new();
    };
    let Ok(doc) = toml::from_str::<toml::Table>(&text) else {
        return Vec::new();
    };
    let Some(tool) = doc
        .get("tool")
        .and_then(|t| t.get("setuptools-rust"))
        .and_then(|t| t.as_table())
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (table, kind) in [("ext-modules", "extension"), ("bins", "bin")] {
        for (i, e) in tool
            .get(table)
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(target) = e.get("target").and_then(|t| t.as_str()) {
                out.push(Extension {
                    target: target.to_string(),
                    kind: kind_of(kind, e.get("binding").and_then(|b| b.as_str())),
                    declared: format!("pyproject.toml [tool.setuptools-rust.{table}][{i}]"),
                    present: false,
                });
            }
        }
    }
    out
}

/// The extensions the tree at `src` declares (see the module docs), read
/// with `python` (the recipe's: only its standard library is used), and
/// the declarations that could not be read (a file that does not parse,
/// a target that is not a string literal), one line each.
///
/// Errors: the interpreter does not run or prints something else than the
/// expected JSON.
pub fn find(python: &Path, src: &Path, tree: &TreeRust) -> Result<(Vec<Extension>, Vec<String>)> {
    let mut out = in_pyproject(src);
    let mut unreadable = Vec::new();
    if !tree.rust_py_files.is_empty() {
        let work = tempfile::tempdir().context("creating a scratch directory")?;
        let script = work.path().join("rust_declared.py");
        fs_err::write(&script, RUST_DECLARED_PY)?;
        let mut args: Vec<std::ffi::OsString> = vec![
            "-I".into(),
            "-S".into(),
            script.into_os_string(),
            src.as_os_str().to_owned(),
        ];
        args.extend(tree.rust_py_files.iter().map(Into::into));
        let printed = crate::host::process::capture(
            "reading the tree's setuptools-rust declarations",
            duct::cmd(python, args).dir(work.path()),
        )?;
        let found: Vec<Found> = serde_json::from_str(printed.lines().last().unwrap_or(""))
            .with_context(|| format!("rust_declared.py printed: {printed}"))?;
        for f in found {
            let at = format!("{}:{}", f.file, f.line.unwrap_or(0));
            match (f.error, f.target) {
                (Some(e), _) => unreadable.push(format!("{}: {e}", f.file)),
                (None, None) => unreadable.push(format!(
                    "{at}: a setuptools-rust extension whose target is not a string literal"
                )),
                (None, Some(target)) => {
                    if !out.iter().any(|e| e.target == target) {
                        out.push(Extension {
                            target,
                            kind: kind_of(f.kind.as_deref().unwrap_or(""), f.binding.as_deref()),
                            declared: at,
                            present: false,
                        });
                    }
                }
            }
        }
    }
    Ok((out, unreadable))
}

/// The target's path parts: `vllm.vllm-rs` -> (`["vllm"]`, `vllm-rs`).
fn split(target: &str) -> (Vec<&str>, &str) {
    let mut parts: Vec<&str> = target.split('.').collect();
    let last = parts.pop().unwrap_or(target);
    (parts, last)
}

/// Whether a wheel whose members are `members` (paths inside the zip)
/// holds `ext`.
pub fn in_wheel(ext: &Extension, members: &[String]) -> bool {
    let (dirs, last) = split(&ext.target);
    let prefix = dirs.iter().map(|d| format!("{d}/")).collect::<String>();
    members.iter().any(|m| match ext.kind {
        Kind::Module => m
            .strip_prefix(&prefix)
            .is_some_and(|rest| is_module_file(rest, last)),
        Kind::Executable => *m == format!("{prefix}{last}"),
        Kind::Script => m
            .split_once(".data/scripts/")
            .is_some_and(|(dist, name)| !dist.contains('/') && name == ext.target),
    })
}

/// Whether the file name `name` is the extension module `last`
/// (`_rust_tool_parser.abi3.so`, `_rust_tool_parser.cpython-312-x86_64-linux-gnu.so`,
/// `_rust_tool_parser.so`).
fn is_module_file(name: &str, last: &str) -> bool {
    name.strip_prefix(last)
        .and_then(|rest| rest.strip_prefix('.'))
        .is_some_and(|rest| {
            !rest.contains('/') && (rest == "so" || rest.ends_with(".so") || rest.ends_with(".pyd"))
        })
}

/// The site-packages directories of the venv at `venv` (`lib/python*/site-packages`).
fn site_dirs(venv: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        if let Ok(rd) = std::fs::read_dir(venv.join(lib)) {
            for e in rd.flatten() {
                let site = e.path().join("site-packages");
                if e.file_name().to_string_lossy().starts_with("python") && site.is_dir() {
                    out.push(site);
                }
            }
        }
    }
    out
}

/// Whether the venv at `venv` holds `ext` installed: a module file or an
/// executable under its site-packages, a script in its `bin/`.
pub fn in_venv(venv: &Path, ext: &Extension) -> bool {
    let (dirs, last) = split(&ext.target);
    match ext.kind {
        Kind::Script => venv.join("bin").join(&ext.target).is_file(),
        Kind::Executable => site_dirs(venv).iter().any(|s| {
            dirs.iter()
                .fold(s.clone(), |p, d| p.join(d))
                .join(last)
                .is_file()
        }),
        Kind::Module => site_dirs(venv).iter().any(|s| {
            let dir = dirs.iter().fold(s.clone(), |p, d| p.join(d));
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    e.file_type().is_ok_and(|t| t.is_file())
                        && is_module_file(&e.file_name().to_string_lossy(), last)
                })
        }),
    }
}

/// The extensions `declared` as the venv at `venv` holds them now.
pub fn measure_in_venv(venv: &Path, declared: &[Extension]) -> Vec<Extension> {
    declared
        .iter()
        .map(|e| Extension {
            present: in_venv(venv, e),
            ..e.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(target: &str, kind: Kind) -> Extension {
        Extension {
            target: target.into(),
            kind,
            declared: "tools/build_rust.py:1".into(),
            present: false,
        }
    }

    #[test]
    fn a_wheel_holds_an_extension_by_its_kind() {
        let members: Vec<String> = [
            "vllm/__init__.py",
            "vllm/_rust_tool_parser.abi3.so",
            "vllm/vllm-rs",
            "vllm-0.1.data/scripts/fx-bin",
        ]
        .map(String::from)
        .to_vec();
        assert!(in_wheel(
            &ext("vllm._rust_tool_parser", Kind::Module),
            &members
        ));
        assert!(in_wheel(&ext("vllm.vllm-rs", Kind::Executable), &members));
        assert!(in_wheel(&ext("fx-bin", Kind::Script), &members));
        assert!(!in_wheel(&ext("vllm._rust_other", Kind::Module), &members));
        assert!(
            !in_wheel(&ext("vllm._rust", Kind::Module), &members),
            "a prefix is not the module"
        );
        assert!(!in_wheel(&ext("vllm.vllm", Kind::Executable), &members));
        assert!(!in_wheel(&ext("vllm-rs", Kind::Script), &members));
        assert!(is_module_file(
            "_rust_tool_parser.cpython-312-x86_64-linux-gnu.so",
            "_rust_tool_parser"
        ));
        assert!(is_module_file("_x.so", "_x"));
        assert!(!is_module_file("_x.py", "_x"));
    }

    #[test]
    fn a_tree_declares_its_extensions_in_python_and_pyproject() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path();
        fs_err::create_dir_all(src.join("tools")).unwrap();
        fs_err::write(
            src.join("tools/build_rust.py"),
            "from setuptools_rust import Binding, RustBin, RustExtension\n\
             def rust_extensions(*, optional=False):\n\
             \x20   return [\n\
             \x20       RustExtension(target=\"vllm.vllm-rs\", binding=Binding.Exec, optional=optional),\n\
             \x20       RustExtension(\"vllm._rust_tool_parser\", binding=Binding.PyO3),\n\
             \x20       RustBin(target=\"vllm-cli\"),\n\
             \x20       RustExtension(target=TARGET),\n\
             \x20   ]\n",
        )
        .unwrap();
        fs_err::write(src.join("bad.py"), "import setuptools_rust\ndef (:\n").unwrap();
        fs_err::write(
            src.join("pyproject.toml"),
            "[[tool.setuptools-rust.ext-modules]]\ntarget = \"pkg._native\"\npath = \"Cargo.toml\"\n",
        )
        .unwrap();
        let tree = TreeRust {
            rust_py_files: vec!["bad.py".into(), "tools/build_rust.py".into()],
            ..TreeRust::default()
        };
        let python = which::which("python3").unwrap();
        let (found, unreadable) = find(&python, src, &tree).unwrap();
        let got: Vec<(&str, Kind, &str)> = found
            .iter()
            .map(|e| (e.target.as_str(), e.kind, e.declared.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "pkg._native",
                    Kind::Module,
                    "pyproject.toml [tool.setuptools-rust.ext-modules][0]"
                ),
                ("vllm.vllm-rs", Kind::Executable, "tools/build_rust.py:4"),
                (
                    "vllm._rust_tool_parser",
                    Kind::Module,
                    "tools/build_rust.py:5"
                ),
                ("vllm-cli", Kind::Script, "tools/build_rust.py:6"),
            ]
        );
        assert_eq!(unreadable.len(), 2, "{unreadable:?}");
        assert!(unreadable[0].starts_with("bad.py: "), "{unreadable:?}");
        assert!(
            unreadable[1].starts_with("tools/build_rust.py:7: "),
            "{unreadable:?}"
        );
    }
}
