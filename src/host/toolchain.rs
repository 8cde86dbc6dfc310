//! The toolchain: Python, uv, and the native compilers, found and proven to run.
//!
//! Every tool is run once to prove it works (version managers leave shims on
//! PATH that fail) and its path and version are recorded in `build.json`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use fs_err as fs;
use serde::{Deserialize, Serialize};

use crate::host::process::{capture, failure_line};
use crate::host::uv_wheels;
use crate::progress;
use crate::store::Store;

/// The uv version provisioned into `<root>/tools/` when none is on PATH
/// (pinned by its wheels' sha256, [`uv_wheels::UV_WHEELS`]).
pub use crate::host::uv_wheels::UV_VERSION;

/// A tool that ran: where it is and what version it reported.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Tool {
    /// Absolute path of the program.
    pub path: PathBuf,
    /// The version it reported, e.g. `3.12.1`, `uv 0.13.9`, `12.2.0`.
    pub version: String,
}

/// A Python interpreter, identified by running it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Python {
    /// `sys.executable`, resolved.
    pub path: PathBuf,
    /// `platform.python_version()`, e.g. `3.12.1`.
    pub version: String,
    /// `sys.implementation.name`, e.g. `cpython`.
    pub implementation: String,
    /// `sysconfig.get_platform()`, e.g. `linux-x86_64`.
    pub platform: String,
}

/// What [`probe_python`] runs. `sys.version`'s first word is what
/// `platform.python_version()` returns (it parses the same string), without
/// importing `platform`.
const PROBE: &str = "import sys,sysconfig,os;print(os.path.realpath(sys.executable));print(sys.version.split()[0]);print(sys.implementation.name);print(sysconfig.get_platform())";

/// Runs `candidate` and reads its identity: isolated (`-I`) and without
/// the `site` module (`-S`), whose `.pth` files may take longer than the
/// probe and change nothing it reads. Errors: it does not run (a broken shim).
pub fn probe_python(candidate: &Path) -> Result<Python> {
    let out = capture(
        &format!("{} (probe)", candidate.display()),
        duct::cmd(candidate, ["-I", "-S", "-c", PROBE]),
    )?;
    let mut lines = out.lines();
    let mut next = || {
        lines
            .next()
            .map(str::to_string)
            .context("python printed too little")
    };
    Ok(Python {
        path: PathBuf::from(next()?),
        version: next()?,
        implementation: next()?,
        platform: next()?,
    })
}

/// Finds a working Python `minor` (e.g. `"3.12"`): `$ORACLE_BUILD_PYTHON` if
/// set, else `python3.12`, `python3`, `python` on PATH, else `uv python find`.
///
/// Errors: none works; the message lists every candidate tried and why it failed.
pub fn find_python(minor: &str, uv: Option<&Tool>) -> Result<Python, String> {
    let mut tried = Vec::new();
    let matches = |p: &Python| p.version == minor || p.version.starts_with(&format!("{minor}."));
    if let Some(explicit) = std::env::var_os("ORACLE_BUILD_PYTHON").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(explicit);
        return match probe_python(&path) {
            Ok(p) if matches(&p) => Ok(p),
            Ok(p) => Err(format!(
                "ORACLE_BUILD_PYTHON={} is Python {}, not {minor}",
                path.display(),
                p.version
            )),
            Err(e) => Err(format!(
                "ORACLE_BUILD_PYTHON={} does not run: {}",
                path.display(),
                failure_line(&e)
            )),
        };
    }
    let mut seen = std::collections::BTreeSet::new();
    for name in [format!("python{minor}"), "python3".into(), "python".into()] {
        for path in which::which_all(&name).into_iter().flatten() {
            if !seen.insert(path.canonicalize().unwrap_or_else(|_| path.clone())) {
                continue;
            }
            match probe_python(&path) {
                Ok(p) if matches(&p) => return Ok(p),
                Ok(p) => tried.push(format!("{} is {}", path.display(), p.version)),
                Err(e) => tried.push(format!(
                    "{} does not run ({})",
                    path.display(),
                    failure_line(&e)
                )),
            }
        }
    }
    if let Some(uv) = uv {
        let found = capture(
            "uv python find",
            duct::cmd(&uv.path, ["python", "find", "--no-python-downloads", minor]),
        );
        match found {
            Ok(path) => match probe_python(Path::new(&path)) {
                Ok(p) if matches(&p) => return Ok(p),
                Ok(p) => tried.push(format!("uv found {path}, which is {}", p.version)),
                Err(e) => tried.push(format!(
                    "uv found {path}, which does not run ({})",
                    failure_line(&e)
                )),
            },
            Err(_) => tried.push("`uv python find` found none".into()),
        }
    }
    Err(format!(
        "Python {minor} not found (tried: {}); install it (e.g. `uv python install {minor}`), put python{minor} on PATH, or set ORACLE_BUILD_PYTHON",
        if tried.is_empty() {
            "nothing on PATH".to_string()
        } else {
            tried.join("; ")
        }
    ))
}

fn probe_tool(path: &Path, args: &[&str]) -> Option<Tool> {
    let out = capture(&path.display().to_string(), duct::cmd(path, args)).ok()?;
    Some(Tool {
        path: path.to_path_buf(),
        version: out.lines().next().unwrap_or("").trim().to_string(),
    })
}

/// The environment variable that lets a uv of another version than
/// [`UV_VERSION`] (from `ORACLE_BUILD_UV` or PATH) build: `1`.
pub const UV_UNPINNED_ENV: &str = "ORACLE_BUILD_UV_UNPINNED";

/// The version number a `uv --version` line reports (`uv 0.13.9 (...)` -> `0.13.9`).
pub fn uv_version_number(version_line: &str) -> &str {
    version_line
        .split_whitespace()
        .nth(1)
        .unwrap_or(version_line)
}

fn unpinned_allowed() -> bool {
    std::env::var(UV_UNPINNED_ENV).is_ok_and(|v| v == "1")
}

/// Finds uv, the pinned version ([`UV_VERSION`]) unless the user asks for
/// another one: `$ORACLE_BUILD_UV`, else `uv` on PATH, each used only when
/// it is the pinned version or `ORACLE_BUILD_UV_UNPINNED=1` is set (a uv
/// the user installed on this machine, chosen by them); else the pinned uv
/// in the tools directory (`$ORACLE_BUILD_TOOLS` or `<root>/tools`) or in
/// the default store's ([`shared_uv`]), each used only when it was
/// installed from a wheel whose sha256 is pinned by this binary
/// ([`installed_uv`]). Provisions nothing: the pinned wheel is fetched by
/// `stages::installer` and installed by [`install_uv_wheel`].
///
/// Errors: `ORACLE_BUILD_UV` does not run or is another version (without
/// `ORACLE_BUILD_UV_UNPINNED=1`); no uv is found (the message names the
/// tools directory).
pub fn find_uv(store: &Store) -> Result<Tool> {
    let pinned = |t: &Tool| uv_version_number(&t.version) == UV_VERSION || unpinned_allowed();
    if let Some(explicit) = std::env::var_os("ORACLE_BUILD_UV").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(explicit);
        let tool = probe_tool(&path, &["--version"])
            .with_context(|| format!("ORACLE_BUILD_UV={} does not run", path.display()))?;
        if !pinned(&tool) {
            anyhow::bail!(
                "ORACLE_BUILD_UV={} is {}, not the pinned uv {UV_VERSION}: unset it to use the pinned uv, or set {UV_UNPINNED_ENV}=1 to build with it anyway (the uv version is part of the wheel and venv keys)",
                path.display(),
                tool.version
            );
        }
        return Ok(tool);
    }
    for path in which::which_all("uv").into_iter().flatten() {
        if let Some(tool) = probe_tool(&path, &["--version"])
            && pinned(&tool)
        {
            return Ok(tool);
        }
    }
    let dir = uv_dir(store);
    if let Some(tool) = installed_uv(&dir) {
        return Ok(tool);
    }
    if let Some(tool) = shared_uv(store) {
        return Ok(tool);
    }
    anyhow::bail!(
        "uv not found on PATH and not yet provisioned in {}",
        dir.display()
    )
}

/// The directory the pinned uv is installed into: `<tools>/uv-<UV_VERSION>`.
pub fn uv_dir(store: &Store) -> PathBuf {
    tools_dir(store).join(format!("uv-{UV_VERSION}"))
}

/// The uv installed in `dir` (`<tools>/uv-<version>`) when it runs,
/// reports [`UV_VERSION`] and its record ([`UV_WHEEL_RECORD`]) names a
/// wheel pinned for this host's architecture ([`uv_wheels::check`]);
/// `None` otherwise (nothing there, or a uv an older oracle-build
/// installed with pip, which is replaced when the pinned wheel is
/// installed).
pub fn installed_uv(dir: &Path) -> Option<Tool> {
    let tool = probe_tool(&dir.join("bin/uv"), &["--version"])?;
    let sha = uv_wheel_sha256(&tool)?;
    uv_wheels::check(&sha, std::env::consts::ARCH, "")
        .ok()
        .filter(|_| uv_version_number(&tool.version) == UV_VERSION)
        .map(|_| tool)
}

/// The pinned uv another store of this user already holds, so that a second
/// store does not provision its own copy: the default store's
/// (`Store::default_root(None)`, i.e. `$ORACLE_BUILD_HOME` or
/// `~/.local/share/oracle-build`) `tools/uv-<UV_VERSION>/bin/uv`, used when
/// [`installed_uv`] accepts it. `None` when `ORACLE_BUILD_TOOLS` names the
/// tools directory (then that one is the shared one), when this store is
/// the default store, or when it holds no such uv.
fn shared_uv(store: &Store) -> Option<Tool> {
    if std::env::var_os("ORACLE_BUILD_TOOLS").is_some_and(|v| !v.is_empty()) {
        return None;
    }
    let default = Store::default_root(None).ok()?;
    let same = |a: &Path, b: &Path| {
        a.canonicalize()
            .ok()
            .is_some_and(|a| Some(a) == b.canonicalize().ok())
    };
    if same(&default, store.root()) {
        return None;
    }
    installed_uv(&default.join("tools").join(format!("uv-{UV_VERSION}")))
}

/// The tools directory: `$ORACLE_BUILD_TOOLS`, else `<root>/tools`.
pub fn tools_dir(store: &Store) -> PathBuf {
    std::env::var_os("ORACLE_BUILD_TOOLS")
        .filter(|v| !v.is_empty())
        .map_or_else(|| store.tools_dir(), PathBuf::from)
}

/// The record, in a uv installed from a wheel (`<tools>/uv-<version>/`), of
/// that wheel's sha256.
const UV_WHEEL_RECORD: &str = "wheel.json";

/// The largest file [`install_uv_wheel`] unpacks (uv 0.13.9's `uv` is 37 MiB).
const MAX_UV_PROGRAM: u64 = 512 << 20;

/// The sha256 of the wheel the uv `tool` was installed from by
/// [`install_uv_wheel`] (its wheelhouse entry's name), read from the record
/// beside its `bin/`; `None` for a uv from anywhere else.
pub fn uv_wheel_sha256(tool: &Tool) -> Option<String> {
    let dir = tool.path.parent()?.parent()?;
    let v: serde_json::Value = crate::store::read_json(&dir.join(UV_WHEEL_RECORD)).ok()?;
    v["sha256"]
        .as_str()
        .filter(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string)
}

/// Installs the uv of the wheel at `wheel` (its `uv-<version>.data/scripts/`
/// programs, as `pip install --target` lays them out) into the tools
/// directory as the pinned uv `uv-<UV_VERSION>/bin/uv`, unpacked into a
/// staging directory beside it and renamed into place (a uv there that
/// [`installed_uv`] does not accept is replaced), unless an accepted one is
/// there. `what` names the wheel in messages (`the pushed uv wheel
/// wheelhouse/<sha>`). Nothing is unpacked before the wheel's sha256 is
/// found among the wheels this binary pins for this host's architecture
/// ([`uv_wheels::check`]). Returns the uv, proven to run.
///
/// Errors: the wheel's sha256 is not pinned (the message names both
/// hashes); it is not a zip or lacks its program; the program does not run
/// on this host or reports another version.
pub fn install_uv_wheel(store: &Store, wheel: &Path, what: &str) -> Result<Tool> {
    let dir = uv_dir(store);
    if let Some(tool) = installed_uv(&dir) {
        return Ok(tool);
    }
    let sha = crate::store::sha256_file(wheel)?;
    uv_wheels::check(&sha, std::env::consts::ARCH, what)?;
    let tools = dir.parent().context("tools dir")?;
    fs::create_dir_all(tools)?;
    let _lock = crate::store::lock_tools(tools, "uv", UV_VERSION)?;
    if let Some(tool) = installed_uv(&dir) {
        return Ok(tool);
    }
    let staging = tempfile::Builder::new()
        .prefix(".uv-staging.")
        .tempdir_in(tools)?;
    let target = staging.path().join("uv");
    fs::create_dir_all(target.join("bin"))?;
    let f = fs::File::open(wheel)?;
    let mut zip = zip::ZipArchive::new(f)
        .with_context(|| format!("{} is not a zip archive", wheel.display()))?;
    let prefix = format!("uv-{UV_VERSION}.data/scripts/");
    let mut found = false;
    for i in 0..zip.len() {
        let mut member = zip.by_index(i)?;
        let name = member.name()?.to_string();
        let Some(prog) = name.strip_prefix(&prefix) else {
            continue;
        };
        if prog.is_empty() || prog.contains('/') || prog.starts_with('.') {
            continue;
        }
        let out = target.join("bin").join(prog);
        let mut file = fs::File::create(&out)?;
        let copied = std::io::copy(
            &mut std::io::Read::take(&mut member, MAX_UV_PROGRAM + 1),
            &mut file,
        )?;
        if copied > MAX_UV_PROGRAM {
            anyhow::bail!(
                "{}: {name} is larger than {MAX_UV_PROGRAM} bytes",
                wheel.display()
            );
        }
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755))?;
        found |= prog == "uv";
    }
    if !found {
        anyhow::bail!(
            "{} holds no {prefix}uv: it is not the wheel of uv {UV_VERSION}",
            wheel.display()
        );
    }
    let probe = probe_tool(&target.join("bin/uv"), &["--version"]).with_context(|| {
        format!(
            "the uv of {} does not run on this host (a wheel for another platform?)",
            wheel.display()
        )
    })?;
    if uv_version_number(&probe.version) != UV_VERSION {
        anyhow::bail!(
            "{} is {}, not uv {UV_VERSION}",
            wheel.display(),
            probe.version
        );
    }
    // Which wheel it came from: the oracles built with it require that
    // wheelhouse entry ([`uv_wheel_sha256`]), so `gc` keeps it.
    fs::write(
        target.join(UV_WHEEL_RECORD),
        serde_json::json!({"sha256": sha, "wheel": wheel.file_name().map(|n| n.to_string_lossy().into_owned())}).to_string(),
    )?;
    // A uv not installed from a pinned wheel (an older oracle-build's
    // `pip install`) is moved into the staging directory, which goes.
    if fs::symlink_metadata(&dir).is_ok() {
        fs::rename(&dir, staging.path().join("replaced"))?;
    }
    fs::rename(&target, &dir)?;
    progress::stage(
        "toolchain",
        format!("installed uv {UV_VERSION} into {}", dir.display()),
    );
    probe_tool(&dir.join("bin/uv"), &["--version"])
        .with_context(|| format!("installed uv at {} does not run", dir.display()))
}

/// `nvcc`, from `$CUDA_HOME/bin`, PATH, or `/usr/local/cuda/bin`; version is
/// the `release X.Y` it reports.
pub fn find_nvcc() -> Option<Tool> {
    crate::host::compilers::nvcc_candidates()
        .into_iter()
        .find_map(|p| {
            let out = capture("nvcc --version", duct::cmd(&p, ["--version"])).ok()?;
            let release = out
                .lines()
                .find_map(|l| l.split("release ").nth(1))
                .map(|r| r.split(',').next().unwrap_or(r).to_string());
            Some(Tool {
                path: p,
                version: release.unwrap_or(out),
            })
        })
}

/// `gcc` on PATH with `-dumpfullversion`.
pub fn find_gcc() -> Option<Tool> {
    let path = which::which("gcc").ok()?;
    probe_tool(&path, &["-dumpfullversion"])
}

/// The git command line (setuptools-scm calls it to compute versions).
pub fn find_git() -> Option<Tool> {
    let path = which::which("git").ok()?;
    probe_tool(&path, &["--version"])
}

/// The linked libgit2 version, e.g. `libgit2 1.9.0`.
pub fn libgit2_version() -> String {
    let (a, b, c) = git2::Version::get().libgit2_version();
    format!("libgit2 {a}.{b}.{c}")
}

/// One GPU as reported by `nvidia-smi`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Gpu {
    /// e.g. `NVIDIA GB10`.
    pub name: String,
    /// Compute capability, e.g. `12.1`.
    pub compute_cap: String,
    /// Driver version.
    pub driver: String,
    /// Free memory as reported, e.g. `119000 MiB`.
    pub memory_free: String,
}

/// The GPUs `nvidia-smi` lists; empty when it is absent or fails.
pub fn gpus() -> Vec<Gpu> {
    let Ok(path) = which::which("nvidia-smi") else {
        return Vec::new();
    };
    let Ok(out) = capture(
        "nvidia-smi",
        duct::cmd(
            path,
            [
                "--query-gpu=name,compute_cap,driver_version,memory.free",
                "--format=csv,noheader",
            ],
        ),
    ) else {
        return Vec::new();
    };
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            (f.len() == 4).then(|| Gpu {
                name: f[0].into(),
                compute_cap: f[1].into(),
                driver: f[2].into(),
                memory_free: f[3].into(),
            })
        })
        .collect()
}

/// `TORCH_CUDA_ARCH_LIST` for the given compute capabilities: `9.0` becomes
/// `9.0a`, `12.1` becomes `12.1a` (arch-specific features from sm_90 on, as
/// vLLM's CMakeLists.txt builds them), older ones stay as they are. Sorted, unique.
pub fn arch_list_for(caps: &[String]) -> String {
    let mut archs: Vec<String> = caps
        .iter()
        .map(|c| {
            let major: u32 = c
                .split('.')
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            if major >= 9 {
                format!("{c}a")
            } else {
                c.clone()
            }
        })
        .collect();
    archs.sort();
    archs.dedup();
    archs.join(";")
}

/// The number of CPUs, used for `max_jobs: auto`.
pub fn cpu_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    #[test]
    fn arch_list_marks_arch_specific() {
        assert_eq!(super::arch_list_for(&["12.1".into()]), "12.1a");
        assert_eq!(
            super::arch_list_for(&["9.0".into(), "8.0".into(), "9.0".into()]),
            "8.0;9.0a"
        );
    }
}

/// Every tool a build used, recorded in `build.json` and `oracle.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Toolchain {
    /// The recipe's Python.
    pub python: Python,
    /// uv (resolver, venvs, installs, build frontend).
    pub uv: Tool,
    /// The git command line (setuptools-scm uses it), when present.
    pub git: Option<Tool>,
    /// The libgit2 linked into this tool (mirrors and checkouts).
    pub libgit2: String,
    /// gcc, when present.
    pub gcc: Option<Tool>,
    /// nvcc, when present.
    pub nvcc: Option<Tool>,
    /// The compilers the build uses (declared in `build.env` or found on
    /// PATH), measured at preflight ([`crate::host::compilers`]).
    #[serde(default)]
    pub compilers: crate::host::compilers::Compilers,
    /// rustc and cargo, for a tree whose build needs Rust (measured after
    /// the checkout, against the channels it declares: [`crate::host::rust`]);
    /// `None` for every other tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rust: Option<crate::host::rust::RustToolchain>,
}
