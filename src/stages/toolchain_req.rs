//! The toolchain a tree asks for, as its own files state it (issue 37),
//! for the advance report: read, quoted with `file:line`, never evaluated.
//!
//! - **CMake**: `cmake_minimum_required(VERSION ...)` of the top-level
//!   `CMakeLists.txt`;
//! - **compiler**: every `if()` / `elseif()` condition of the tree's CMake
//!   files (`CMakeLists.txt`, `*.cmake`) that tests a compiler's version or
//!   id (`CMAKE_CXX_COMPILER_VERSION`, `CMAKE_CUDA_COMPILER_VERSION`,
//!   `CMAKE_<LANG>_COMPILER_ID`, ...), e.g. vLLM's
//!   `if(${CMAKE_CUDA_COMPILER_VERSION} VERSION_GREATER_EQUAL 12.8 AND ...)`;
//! - **CUDA**: the `set()` of a CUDA support list or version in those files
//!   (`CUDA_SUPPORTED_ARCHS`, `TORCH_SUPPORTED_VERSION_CUDA`), and the
//!   requirement lines (`requirements*.txt`, `requirements/*.txt`,
//!   `pyproject.toml`) that name a CUDA build of torch (a
//!   `download.pytorch.org/whl/cuNNN` index or a `+cuNNN` version);
//! - **Rust**: what [`crate::stages::rust::discover`] finds the build needs
//!   (`setuptools-rust` / `maturin` in the build requirements, a
//!   `rust-toolchain` file and its channel, the `Cargo.lock` files), and the
//!   `Cargo.toml` files near the root (a `rust/` workspace) whether or not
//!   the build requires them.
//!
//! What the tree's configure would make of these is its own business: this
//! module only says what each tree writes, so that two trees can be compared.

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::stages::ext::{Call, calls};

/// The largest file read (a CMake file, a requirement file).
pub const MAX_FILE: usize = 4 << 20;
/// The most CMake files read in one tree.
const MAX_CMAKE_FILES: usize = 2000;

/// Which toolchain a requirement is about.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The CMake minimum.
    Cmake,
    /// A condition on a compiler's version or id.
    Compiler,
    /// CUDA versions or architectures the tree supports.
    Cuda,
    /// Rust.
    Rust,
}

impl Kind {
    /// The kind in words, for the report.
    pub fn word(self) -> &'static str {
        match self {
            Kind::Cmake => "CMake",
            Kind::Compiler => "compiler",
            Kind::Cuda => "CUDA",
            Kind::Rust => "Rust",
        }
    }
}

/// One requirement as the tree states it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stated {
    /// Which toolchain.
    pub kind: Kind,
    /// What it is matched by between two trees (the same key in both is
    /// the same requirement, changed when `text` differs): the command and
    /// variable for a `cmake_minimum_required` or `set()`, else the text.
    pub key: String,
    /// The statement as written, on one line.
    pub text: String,
    /// `file:line` where it is written.
    pub at: String,
}

/// Whether a condition names a compiler's version or id.
fn tests_compiler(args: &[String]) -> bool {
    args.iter().any(|a| {
        let a = a.to_ascii_uppercase();
        a.contains("CMAKE_") && (a.contains("_COMPILER_VERSION") || a.contains("_COMPILER_ID"))
    })
}

/// A call's arguments as written (quoted ones in quotes), on one line.
fn shown(c: &Call) -> String {
    c.args
        .iter()
        .zip(&c.quoted)
        .map(|(a, q)| {
            let a = a.split_whitespace().collect::<Vec<_>>().join(" ");
            if *q { format!("\"{a}\"") } else { a }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `set(<var> ...)` sets a CUDA support list or version.
fn cuda_variable(var: &str) -> bool {
    let v = var.to_ascii_uppercase();
    v.contains("CUDA") && (v.contains("SUPPORTED") || v.ends_with("_VERSION"))
}

/// The requirements stated by one CMake file `rel` with text `text` (pure):
/// its `cmake_minimum_required` when `rel` is the top-level
/// `CMakeLists.txt`, its compiler conditions and its CUDA `set()`s.
pub fn of_cmake(rel: &str, text: &str) -> Vec<Stated> {
    let mut out = Vec::new();
    for c in calls(text) {
        let at = format!("{rel}:{}", c.line);
        match c.name.as_str() {
            "cmake_minimum_required" if rel == "CMakeLists.txt" => out.push(Stated {
                kind: Kind::Cmake,
                key: "cmake_minimum_required".into(),
                text: format!("cmake_minimum_required({})", shown(&c)),
                at,
            }),
            "if" | "elseif" if tests_compiler(&c.args) => out.push(Stated {
                kind: Kind::Compiler,
                key: format!("{}({})", c.name, shown(&c)),
                text: format!("{}({})", c.name, shown(&c)),
                at,
            }),
            "set" if c.args.first().is_some_and(|v| cuda_variable(v)) => out.push(Stated {
                kind: Kind::Cuda,
                key: format!("set({})", c.args[0]),
                text: format!("set({})", shown(&c)),
                at,
            }),
            _ => {}
        }
    }
    out
}

/// Whether a requirement line names a CUDA build of torch.
fn names_cuda_build(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    let cu_after = |pat: &str| {
        l.match_indices(pat).any(|(i, _)| {
            l[i + pat.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
    };
    l.contains("download.pytorch.org") && cu_after("/whl/cu") || cu_after("+cu")
}

/// The CUDA requirement lines of one requirement file or `pyproject.toml`
/// (pure): each line naming a CUDA build of torch.
pub fn of_requirements(rel: &str, text: &str) -> Vec<Stated> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with('#') && names_cuda_build(l))
        .map(|(i, l)| {
            let t = l.trim().to_string();
            Stated {
                kind: Kind::Cuda,
                key: t.clone(),
                text: t,
                at: format!("{rel}:{}", i + 1),
            }
        })
        .collect()
}

/// Whether `p` is a requirement file read for CUDA lines.
fn is_requirement_file(p: &str) -> bool {
    let name = p.rsplit('/').next().unwrap_or(p);
    p == "pyproject.toml"
        || (!p.contains('/') && name.starts_with("requirements") && name.ends_with(".txt"))
        || (p.starts_with("requirements/") && name.ends_with(".txt"))
}

/// Whether `p` is a CMake file of the tree (hidden directories left out).
fn is_cmake_file(p: &str) -> bool {
    let name = p.rsplit('/').next().unwrap_or(p);
    !p.split('/').any(|s| s.starts_with('.'))
        && (name == "CMakeLists.txt" || name.ends_with(".cmake"))
}

/// Every toolchain requirement of the tree whose regular files are `paths`
/// (relative, `/`-separated), read through `read` (at most [`MAX_FILE`]
/// bytes a file), built for `device`: CMake files in path order (at most
/// 2000), then requirement files, then Rust.
///
/// Errors: a `rust-toolchain` file that does not parse (as
/// [`crate::stages::rust::discover`]).
pub fn read_tree(
    paths: &[String],
    read: &dyn Fn(&str) -> Option<String>,
    device: &str,
) -> Result<Vec<Stated>> {
    let mut sorted: Vec<&String> = paths.iter().collect();
    sorted.sort();
    let mut out = Vec::new();
    for p in sorted
        .iter()
        .filter(|p| is_cmake_file(p))
        .take(MAX_CMAKE_FILES)
    {
        if let Some(t) = read(p) {
            out.extend(of_cmake(p, &t));
        }
    }
    for p in sorted.iter().filter(|p| is_requirement_file(p)) {
        if let Some(t) = read(p) {
            out.extend(of_requirements(p, &t));
        }
    }
    let bytes = |p: &str| read(p).map(String::into_bytes);
    if let Some(rust) = crate::stages::rust::discover(paths, &bytes, device, false)? {
        for need in &rust.needs {
            let channel = rust
                .toolchain_files
                .iter()
                .find(|d| &d.file == need)
                .map(|d| d.channel.as_deref().unwrap_or("no channel"));
            let text = match channel {
                Some(c) => format!("{need} (channel {c})"),
                None => need.clone(),
            };
            out.push(Stated {
                kind: Kind::Rust,
                key: need.clone(),
                text,
                at: need.split_whitespace().next().unwrap_or(need).to_string(),
            });
        }
        for l in &rust.locks {
            out.push(Stated {
                kind: Kind::Rust,
                key: format!("Cargo.lock {}", l.file),
                text: format!(
                    "{} (sha256 {})",
                    l.file,
                    &l.sha256[..12.min(l.sha256.len())]
                ),
                at: l.file.clone(),
            });
        }
    }
    for p in sorted.iter().filter(|p| {
        p.ends_with("Cargo.toml") && (p.as_str() == "Cargo.toml" || p.matches('/').count() == 1)
    }) {
        out.push(Stated {
            kind: Kind::Rust,
            key: format!("Cargo.toml {p}"),
            text: format!("Cargo workspace or crate {p}"),
            at: p.to_string(),
        });
    }
    Ok(out)
}

/// [`read_tree`] on `commit` of the bare mirror at `mirror` (no checkout).
///
/// Errors: the mirror lacks the commit; as [`read_tree`].
pub fn in_mirror(mirror: &std::path::Path, commit: &str, device: &str) -> Result<Vec<Stated>> {
    let files = crate::stages::source::CommitFiles::open(mirror, commit).ok_or_else(|| {
        anyhow::anyhow!("commit {commit} is not in the mirror {}", mirror.display())
    })?;
    let paths = files.paths();
    read_tree(&paths, &|rel| files.read(rel, MAX_FILE), device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shaped like vLLM's top-level CMakeLists.txt (abridged).
    const VLLM_LIKE: &str = r#"cmake_minimum_required(VERSION 3.26)

project(vllm_extensions LANGUAGES CXX)

# Supported NVIDIA architectures.
set(TORCH_SUPPORTED_VERSION_CUDA "2.7.0")
if(DEFINED CMAKE_CUDA_COMPILER_VERSION AND
   CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)
  set(CUDA_SUPPORTED_ARCHS "7.0;7.2;7.5;8.0;8.6;8.7;8.9;9.0;10.0;10.1;12.0")
else()
  set(CUDA_SUPPORTED_ARCHS "7.0;7.2;7.5;8.0;8.6;8.7;8.9;9.0")
endif()

if(VLLM_GPU_LANG STREQUAL "CUDA")
  if(${CMAKE_CUDA_COMPILER_VERSION} VERSION_GREATER_EQUAL 12.0 AND SCALED_MM_ARCHS)
    list(APPEND VLLM_EXT_SRC "csrc/quantization/cutlass_w8a8/scaled_mm_c3x_sm90.cu")
  endif()
endif()
set(VLLM_EXT_SRC "csrc/cache_kernels.cu")
"#;

    #[test]
    fn a_vllm_shaped_cmakelists_gives_its_minimum_compiler_conditions_and_cuda_lists() {
        let s = of_cmake("CMakeLists.txt", VLLM_LIKE);
        let got: Vec<(Kind, &str, &str)> = s
            .iter()
            .map(|x| (x.kind, x.text.as_str(), x.at.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    Kind::Cmake,
                    "cmake_minimum_required(VERSION 3.26)",
                    "CMakeLists.txt:1"
                ),
                (
                    Kind::Cuda,
                    "set(TORCH_SUPPORTED_VERSION_CUDA \"2.7.0\")",
                    "CMakeLists.txt:6"
                ),
                (
                    Kind::Compiler,
                    "if(DEFINED CMAKE_CUDA_COMPILER_VERSION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)",
                    "CMakeLists.txt:7"
                ),
                (
                    Kind::Cuda,
                    "set(CUDA_SUPPORTED_ARCHS \"7.0;7.2;7.5;8.0;8.6;8.7;8.9;9.0;10.0;10.1;12.0\")",
                    "CMakeLists.txt:9"
                ),
                (
                    Kind::Cuda,
                    "set(CUDA_SUPPORTED_ARCHS \"7.0;7.2;7.5;8.0;8.6;8.7;8.9;9.0\")",
                    "CMakeLists.txt:11"
                ),
                (
                    Kind::Compiler,
                    "if(${CMAKE_CUDA_COMPILER_VERSION} VERSION_GREATER_EQUAL 12.0 AND SCALED_MM_ARCHS)",
                    "CMakeLists.txt:15"
                ),
            ]
        );
        // The keys match a set() by its variable, a minimum by its command.
        assert_eq!(s[3].key, "set(CUDA_SUPPORTED_ARCHS)");
        assert_eq!(s[0].key, "cmake_minimum_required");
    }

    #[test]
    fn a_gcc_floor_in_a_cmake_file_is_quoted_and_a_sub_directory_minimum_is_not_the_tree_s() {
        let text = "cmake_minimum_required(VERSION 3.18)\nif (CMAKE_SYSTEM_PROCESSOR MATCHES \"x86_64\")\n  if (NOT (CMAKE_CXX_COMPILER_ID STREQUAL \"GNU\" AND\n          CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12.3))\n    message(FATAL_ERROR \"X86 backend requires gcc/g++ >= 12.3\") # comment (\n  endif()\nendif()\n";
        let s = of_cmake("cmake/cpu_extension.cmake", text);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].kind, Kind::Compiler);
        assert_eq!(
            s[0].text,
            "if(NOT (CMAKE_CXX_COMPILER_ID STREQUAL \"GNU\" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12.3))"
        );
        assert_eq!(s[0].at, "cmake/cpu_extension.cmake:3");
    }

    #[test]
    fn requirement_lines_naming_a_cuda_torch_build_are_cuda_requirements() {
        let text = "# comment --extra-index-url https://download.pytorch.org/whl/cu118\n--extra-index-url https://download.pytorch.org/whl/cu128\ntorch==2.7.0\ntorchaudio==2.7.0+cu126\nnumba == 0.61.2\ncupy-cuda12x\n";
        let s = of_requirements("requirements/cuda.txt", text);
        let got: Vec<(&str, &str)> = s.iter().map(|x| (x.text.as_str(), x.at.as_str())).collect();
        assert_eq!(
            got,
            [
                (
                    "--extra-index-url https://download.pytorch.org/whl/cu128",
                    "requirements/cuda.txt:2"
                ),
                ("torchaudio==2.7.0+cu126", "requirements/cuda.txt:4"),
            ]
        );
    }

    #[test]
    fn a_tree_read_whole_names_its_rust_needs_and_skips_other_files() {
        let files: Vec<(String, String)> = vec![
            (
                "CMakeLists.txt".into(),
                "cmake_minimum_required(VERSION 3.29)\n".into(),
            ),
            (
                "sub/CMakeLists.txt".into(),
                "cmake_minimum_required(VERSION 3.5)\n".into(),
            ),
            (
                ".git/x.cmake".into(),
                "if(CMAKE_CXX_COMPILER_VERSION VERSION_LESS 9)\nendif()\n".into(),
            ),
            (
                "pyproject.toml".into(),
                "[build-system]\nrequires = [\"setuptools>=77\", \"setuptools-rust>=1.9.0\"]\n"
                    .into(),
            ),
            (
                "rust-toolchain.toml".into(),
                "[toolchain]\nchannel = \"1.85\"\n".into(),
            ),
            ("rust/Cargo.toml".into(), "[workspace]\n".into()),
            ("rust/Cargo.lock".into(), "version = 4\n".into()),
            ("docs/requirements.txt".into(), "torch==2.0+cu118\n".into()),
        ];
        let paths: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
        let read = |p: &str| files.iter().find(|(q, _)| q == p).map(|(_, t)| t.clone());
        let s = read_tree(&paths, &read, "cuda").unwrap();
        let got: Vec<(Kind, &str, &str)> = s
            .iter()
            .map(|x| (x.kind, x.text.as_str(), x.at.as_str()))
            .collect();
        assert_eq!(
            got[0],
            (
                Kind::Cmake,
                "cmake_minimum_required(VERSION 3.29)",
                "CMakeLists.txt:1"
            )
        );
        assert!(
            got.contains(&(
                Kind::Rust,
                "pyproject.toml [build-system] requires setuptools-rust>=1.9.0",
                "pyproject.toml"
            )),
            "{got:?}"
        );
        assert!(
            got.contains(&(
                Kind::Rust,
                "rust-toolchain.toml (channel 1.85)",
                "rust-toolchain.toml"
            )),
            "{got:?}"
        );
        assert!(got.iter().any(|g| g.2 == "rust/Cargo.lock"), "{got:?}");
        assert!(
            got.contains(&(
                Kind::Rust,
                "Cargo workspace or crate rust/Cargo.toml",
                "rust/Cargo.toml"
            )),
            "{got:?}"
        );
        // Not the tree's minimum, a hidden directory, a docs requirement file.
        assert!(
            !got.iter().any(|g| g.2.starts_with("sub/")
                || g.2.starts_with(".git")
                || g.2.starts_with("docs/")),
            "{got:?}"
        );
    }
}
