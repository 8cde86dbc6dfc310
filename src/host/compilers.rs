//! The native compilers a wheel build uses, declared and measured.
//!
//! A recipe declares them in `build.env` (`CC`, `CXX`, `CUDACXX`,
//! `CUDA_HOME`, `CUDA_PATH`: absolute paths, or names found on PATH); what
//! it does not declare is found as before (`gcc` / `g++` on PATH, nvcc from
//! the user's `CUDA_HOME`, PATH or `/usr/local/cuda`). Each one is run to
//! measure it: its path with symlinks followed, its compiler id (GNU, Clang,
//! NVIDIA: the predefined macros of `-dM -E`, or nvcc's `--version`), and
//! its version (GNU: `-dumpfullversion`; Clang: `__clang_major__` ...;
//! nvcc: the `release X.Y, VX.Y.Z` line). The id and version are part of
//! the wheel key; the whole record goes into `build.json`
//! (`tools.compilers`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::host::process::{capture_within, failure_line};

/// The longest one measuring run of a compiler may take.
const MEASURE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Where a compiler came from.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum DeclaredBy {
    /// The recipe's `build.env`.
    #[serde(rename = "build.env")]
    BuildEnv,
    /// Found on PATH (or in the user's CUDA toolkit) as before: not declared.
    #[serde(rename = "PATH")]
    Path,
}

/// One measured compiler.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Compiler {
    /// Its absolute path, symlinks followed.
    pub path: PathBuf,
    /// The compiler id as CMake names it: `GNU`, `Clang`, `NVIDIA`, or
    /// `unknown` (it ran but none of these macros or lines was found).
    pub id: String,
    /// Its version, e.g. `12.2.0`.
    pub version: String,
    /// The version CMake reads (`CMAKE_<LANG>_COMPILER_VERSION`, from the
    /// predefined `__GNUC__.__GNUC_MINOR__.__GNUC_PATCHLEVEL__`), recorded
    /// only when it differs from `version` (a wrapper answering
    /// `-dumpfullversion` with another version than its macros say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmake_version: Option<String>,
    /// Where it came from.
    pub declared_by: DeclaredBy,
}

impl Compiler {
    /// The version CMake sees: `cmake_version`, else `version`.
    pub fn version_for_cmake(&self) -> &str {
        self.cmake_version.as_deref().unwrap_or(&self.version)
    }
}

/// The CUDA toolkit a build uses (for `cuda`, or a configure-only toolkit
/// that a CPU build's torch asks for).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Cuda {
    /// The toolkit's root (`CUDA_HOME` / `CUDA_PATH`, else nvcc's `../..`).
    pub home: Option<PathBuf>,
    /// nvcc, measured (`None`: a declared toolkit root without `bin/nvcc`).
    pub nvcc: Option<Compiler>,
    /// nvcc's version (`VX.Y.Z` of its `--version`), when measured.
    pub version: Option<String>,
    /// Where the toolkit came from.
    pub declared_by: DeclaredBy,
}

/// Every compiler a build uses, as measured at preflight.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Compilers {
    /// The C compiler (`CC`).
    pub cc: Option<Compiler>,
    /// The C++ compiler (`CXX`).
    pub cxx: Option<Compiler>,
    /// The CUDA toolkit (`CUDACXX`, `CUDA_HOME`, `CUDA_PATH`).
    pub cuda: Option<Cuda>,
}

impl Compilers {
    /// What the wheel key holds of them: each compiler's id and version,
    /// never its path (two stores at different paths, one declaration, one key).
    pub fn key(&self) -> serde_json::Value {
        let c = |c: &Option<Compiler>| {
            c.as_ref()
                .map(|c| serde_json::json!({"id": c.id, "version": c.version, "cmake_version": c.cmake_version}))
        };
        serde_json::json!({
            "cc": c(&self.cc),
            "cxx": c(&self.cxx),
            "cuda": self.cuda.as_ref().map(|k| serde_json::json!({
                "nvcc": c(&k.nvcc),
                "version": k.version,
            })),
        })
    }
}

/// The `build.env` variables that declare a compiler or the CUDA toolkit.
pub const DECLARING_VARS: &[&str] = &["CC", "CXX", "CUDACXX", "CUDA_HOME", "CUDA_PATH"];

/// Finds and measures the compilers of a build whose recipe sets `env`
/// (`build.env`). `cuda`: whether to look for an undeclared CUDA toolkit
/// (as `find_nvcc` did; a declared one is always measured).
///
/// Errors: one line per declared compiler or toolkit root that does not
/// exist or does not run, each naming `build.env.<VAR>` and its value.
pub fn measure(env: &BTreeMap<String, String>, cuda: bool) -> Result<Compilers, Vec<String>> {
    // `Err`: the problem of a declared compiler.
    let one = |var: &str, fallback: &[&str], lang: &str| -> Result<Option<Compiler>, String> {
        match env.get(var) {
            Some(value) => resolve(value)
                .and_then(|p| measure_one(&p, lang, DeclaredBy::BuildEnv))
                .map(Some)
                .map_err(|e| format!("build.env.{var} = {value:?}: {e}")),
            None => Ok(fallback.iter().find_map(|name| {
                let found = which::which(name).ok()?;
                measure_one(&found, lang, DeclaredBy::Path).ok()
            })),
        }
    };
    // The C and C++ compilers are asked at once: each is two runs of the
    // driver (its macros, its version), tens of milliseconds.
    let (cc, cxx) = std::thread::scope(|s| {
        let cxx = s.spawn(|| one("CXX", &["g++"], "c++"));
        let cc = one("CC", &["gcc"], "c");
        let cxx = cxx
            .join()
            .unwrap_or_else(|_| Err("build.env.CXX: measuring it panicked".into()));
        (cc, cxx)
    });
    let mut problems = Vec::new();
    let mut keep = |r: Result<Option<Compiler>, String>| {
        r.unwrap_or_else(|e| {
            problems.push(e);
            None
        })
    };
    let (cc, cxx) = (keep(cc), keep(cxx));
    let cuda = measure_cuda(env, cuda, &mut problems);
    if problems.is_empty() {
        Ok(Compilers { cc, cxx, cuda })
    } else {
        Err(problems)
    }
}

/// The declared or found CUDA toolkit; problems of declared ones pushed.
fn measure_cuda(
    env: &BTreeMap<String, String>,
    wanted: bool,
    problems: &mut Vec<String>,
) -> Option<Cuda> {
    let mut home: Option<PathBuf> = None;
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        let Some(value) = env.get(var) else { continue };
        let p = Path::new(value);
        if !p.is_absolute() || !p.is_dir() {
            problems.push(format!(
                "build.env.{var} = {value:?}: not an existing directory (an absolute path to the CUDA toolkit's root)"
            ));
        } else if home.is_none() {
            home = Some(p.canonicalize().unwrap_or_else(|_| p.to_path_buf()));
        }
    }
    let declared_nvcc = env.get("CUDACXX");
    let nvcc_at = |p: &Path| measure_one(p, "cuda", DeclaredBy::BuildEnv);
    let nvcc = if let Some(value) = declared_nvcc {
        match resolve(value).and_then(|p| nvcc_at(&p)) {
            Ok(c) => Some(c),
            Err(e) => {
                problems.push(format!("build.env.CUDACXX = {value:?}: {e}"));
                return None;
            }
        }
    } else if let Some(h) = &home {
        let bin = h.join("bin/nvcc");
        if bin.exists() {
            match nvcc_at(&bin) {
                Ok(c) => Some(c),
                Err(e) => {
                    problems.push(format!("build.env.CUDA_HOME's nvcc {}: {e}", bin.display()));
                    return None;
                }
            }
        } else {
            None
        }
    } else {
        None
    };
    if declared_nvcc.is_some() || home.is_some() {
        let home = home.or_else(|| {
            nvcc.as_ref()
                .and_then(|n| n.path.parent()?.parent().map(Path::to_path_buf))
        });
        let version = nvcc.as_ref().map(|n| n.version.clone());
        return Some(Cuda {
            home,
            nvcc,
            version,
            declared_by: DeclaredBy::BuildEnv,
        });
    }
    if !wanted {
        return None;
    }
    let nvcc = nvcc_candidates()
        .into_iter()
        .find_map(|p| measure_one(&p, "cuda", DeclaredBy::Path).ok())?;
    Some(Cuda {
        home: nvcc.path.parent()?.parent().map(Path::to_path_buf),
        version: Some(nvcc.version.clone()),
        nvcc: Some(nvcc),
        declared_by: DeclaredBy::Path,
    })
}

/// Where an undeclared nvcc is looked for, in order: the user's
/// `$CUDA_HOME/bin`, PATH, `/usr/local/cuda/bin`.
pub fn nvcc_candidates() -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("bin/nvcc"));
    }
    candidates.extend(which::which_all("nvcc").into_iter().flatten());
    candidates.push(PathBuf::from("/usr/local/cuda/bin/nvcc"));
    candidates
}

/// A declared value as a program path: an absolute path as it is, a name
/// found on PATH. Errors: it does not exist, or a relative path.
fn resolve(value: &str) -> Result<PathBuf, String> {
    let p = Path::new(value);
    if p.is_absolute() {
        if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err("does not exist".into())
        }
    } else if value.contains('/') {
        Err("is a relative path: give an absolute path or a name found on PATH".into())
    } else {
        which::which(value).map_err(|_| "not found on PATH".to_string())
    }
}

/// Runs the compiler at `path` (as given, so a launcher symlink keeps its
/// name) and returns its resolved path, id and version. `lang`: `c`, `c++`
/// or `cuda` (nvcc's `--version`).
fn measure_one(path: &Path, lang: &str, declared_by: DeclaredBy) -> Result<Compiler, String> {
    let resolved = path.canonicalize().map_err(|e| format!("{e}"))?;
    let done = |id: &str, version: String, cmake_version: Option<String>| Compiler {
        path: resolved.clone(),
        id: id.into(),
        cmake_version: cmake_version.filter(|v| *v != version),
        version,
        declared_by,
    };
    // Bounded: a compiler shim that hangs must not hang the preflight.
    let run = |args: &[&str]| {
        capture_within(
            &path.display().to_string(),
            duct::cmd(path, args),
            MEASURE_TIMEOUT,
            "a compiler answers its version in well under a second",
        )
        .map_err(|e| format!("does not run: {}", failure_line(&e)))
    };
    if lang == "cuda" {
        let out = run(&["--version"])?;
        let version = nvcc_version(&out)
            .ok_or_else(|| "printed no `release X.Y, VX.Y.Z` line for --version".to_string())?;
        return Ok(done("NVIDIA", version, None));
    }
    let macros = run(&["-dM", "-E", "-x", lang, "/dev/null"])?;
    let defined = |name: &str| -> Option<String> {
        macros.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("#define") && w.next() == Some(name))
                .then(|| w.next().unwrap_or("").to_string())
        })
    };
    if let Some(major) = defined("__clang_major__") {
        let minor = defined("__clang_minor__").unwrap_or_else(|| "0".into());
        let patch = defined("__clang_patchlevel__").unwrap_or_else(|| "0".into());
        return Ok(done("Clang", format!("{major}.{minor}.{patch}"), None));
    }
    if let Some(major) = defined("__GNUC__") {
        let minor = defined("__GNUC_MINOR__").unwrap_or_else(|| "0".into());
        let patch = defined("__GNUC_PATCHLEVEL__").unwrap_or_else(|| "0".into());
        let from_macros = format!("{major}.{minor}.{patch}");
        let version = run(&["-dumpfullversion"])?;
        let version = version.lines().next().unwrap_or("").trim().to_string();
        if version.is_empty() {
            return Err("printed nothing for -dumpfullversion".into());
        }
        return Ok(done("GNU", version, Some(from_macros)));
    }
    Ok(done("unknown", String::new(), None))
}

/// nvcc's version from its `--version` output: `X.Y.Z` of
/// `Cuda compilation tools, release X.Y, VX.Y.Z`, else the `X.Y` of `release`.
pub fn nvcc_version(out: &str) -> Option<String> {
    let line = out.lines().find(|l| l.contains("release "))?;
    let full = line
        .split(", V")
        .nth(1)
        .map(|v| v.split_whitespace().next().unwrap_or(v).trim().to_string());
    let release = line
        .split("release ")
        .nth(1)
        .map(|r| r.split(',').next().unwrap_or(r).trim().to_string());
    full.filter(|v| !v.is_empty()).or(release)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvcc_version_reads_the_release_line() {
        let out = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.48\nBuild cuda_13.0";
        assert_eq!(nvcc_version(out).as_deref(), Some("13.0.48"));
        assert_eq!(
            nvcc_version("Cuda compilation tools, release 12.8").as_deref(),
            Some("12.8")
        );
        assert_eq!(nvcc_version("nothing"), None);
    }

    #[test]
    fn a_declared_compiler_that_does_not_exist_names_its_variable() {
        let env = BTreeMap::from([("CXX".to_string(), "/nonexistent/g++".to_string())]);
        let e = measure(&env, false).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("build.env.CXX = \"/nonexistent/g++\""),
            "{e:?}"
        );
    }
}
