//! Stage 3, wheel: build the package's wheel from the checkout, without build
//! isolation, against pinned build dependencies (vLLM `setup.py`, `requirements/build.txt`).
//!
//! The entry `store/wheels/<key>/` holds the wheel, `build.json` (inputs,
//! tools, environment, sha256, duration, the kernel families the tree's
//! configure reported: [`families`]) and `build.log`.

pub mod families;
pub mod jobs;
pub mod torch_cuda;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::stages::Ctx;
use anyhow::{Context, Result, bail};
use fs_err as fs;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::exit::bad_input;
use crate::host::ccache::{REMOTE_STORAGE_VAR, RemoteStorage};
use crate::host::toolchain::Tool;
use crate::host::toolchain::{self, Toolchain};
use crate::host::uv::pin_lines;
use crate::progress::{self, Progress};
use crate::recipe::{BuildMode, LoadedRecipe, TargetDevice};
use crate::stages::ext::{Decided, ExtSource, Variable};
use crate::stages::lock::{BuildRequirements, build_requirements};
use crate::stages::rust::TreeRust;
use crate::stages::rust::crates::{self, CratesRecord};
use crate::stages::rust::declared::{self, Extension};
use crate::stages::source::Describe;
use crate::stages::wheelhouse::LockedInstall;
use crate::store::key::{KEY_SCHEMA, content_key};
use crate::store::{Bucket, Entry, Manifest, Store, copy_tree, read_json, sha256_file, write_json};

/// Environment variables removed from every build: each can silently change
/// what is built (vLLM `setup.py` reads the `VLLM_*` variables; setuptools-scm reads
/// `SETUPTOOLS_SCM_PRETEND_VERSION*`).
pub const SCRUBBED_ENV: &[&str] = &[
    "SETUPTOOLS_SCM_PRETEND_VERSION",
    "VLLM_USE_PRECOMPILED",
    "VLLM_PRECOMPILED_WHEEL_LOCATION",
    "VLLM_SKIP_PRECOMPILED_VERSION_SUFFIX",
    "VLLM_VERSION_OVERRIDE",
    "PYTHONPATH",
    "PYTHONHOME",
    "PIP_CONSTRAINT",
    // Set by the build for a tree that reads it (`stages::rust::REQUIRE_ENV`).
    "VLLM_REQUIRE_RUST_FRONTEND",
];

/// Prefixes of variables that hand-set a version (setuptools-scm's
/// `SETUPTOOLS_SCM_PRETEND_VERSION[_FOR_<DIST>]`, `SETUPTOOLS_SCM_PRETEND_METADATA`,
/// and the same under vcs-versioning's name): removed from every build and
/// from the run that computes the version the history gives.
pub const PRETEND_PREFIXES: &[&str] = &["SETUPTOOLS_SCM_PRETEND", "VCS_VERSIONING_PRETEND"];

/// Compiler, linker and build-tool variables of the user's environment,
/// removed from every wheel build: each reaches the compiler (setuptools'
/// `customize_compiler` appends `CPPFLAGS`, `CFLAGS`, `LDFLAGS`; CMake reads
/// `CC`, `CXX`, `CFLAGS`, `CXXFLAGS`, `CUDAFLAGS`, `CUDACXX`, `CUDAHOSTCXX`,
/// `LDFLAGS` and `CMAKE_*` variables from the environment; nvcc reads
/// `NVCC_PREPEND_FLAGS` / `NVCC_APPEND_FLAGS`; vLLM's setup.py reads
/// `CMAKE_ARGS`, `CUDA_HOME`), yet none is in the wheel key. The build
/// environment is the recipe's `build.env` (keyed) plus the tool's own.
/// The one table of such names: what else is scrubbed extends it here.
pub const COMPILER_ENV: &[&str] = &[
    "CPPFLAGS",
    "CFLAGS",
    "CXXFLAGS",
    "LDFLAGS",
    "LDSHARED",
    "LDCXXSHARED",
    "ARFLAGS",
    "CC",
    "CXX",
    "CPP",
    "LD",
    "AR",
    "CUDAFLAGS",
    "CUDACXX",
    "CUDAHOSTCXX",
    "CUDA_HOME",
    "CUDA_PATH",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "NVCC_CCBIN",
    "PYTORCH_NVCC",
    "CMAKE_ARGS",
    // Rust (a tree built with setuptools-rust or maturin): cargo and rustc
    // read these (cargo's `config.html#environment-variables`); the build
    // sets its own `CARGO`, `RUSTUP_TOOLCHAIN`, `CARGO_HOME` and
    // `CARGO_NET_OFFLINE` (`stages::rust`).
    "RUSTFLAGS",
    "RUSTDOCFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "RUSTC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTUP_TOOLCHAIN",
    "CARGO",
    "CARGO_HOME",
    "CARGO_NET_OFFLINE",
];

/// Prefixes of build-tool variables removed like [`COMPILER_ENV`]: CMake
/// reads `CMAKE_GENERATOR`, `CMAKE_BUILD_TYPE`, `CMAKE_TOOLCHAIN_FILE`,
/// `CMAKE_<LANG>_COMPILER_LAUNCHER`... from the environment (cmake-env-variables(7)).
/// cargo reads `CARGO_BUILD_*`, `CARGO_PROFILE_*` and `CARGO_TARGET_*`
/// (`CARGO_TARGET_DIR`, `CARGO_TARGET_<triple>_RUSTFLAGS`, `_LINKER`) as config.
pub const COMPILER_ENV_PREFIXES: &[&str] =
    &["CMAKE_", "CARGO_BUILD_", "CARGO_PROFILE_", "CARGO_TARGET_"];

/// Whether the inherited variable `key` is removed from builds.
pub fn is_scrubbed(key: &str) -> bool {
    SCRUBBED_ENV.contains(&key)
        || COMPILER_ENV.contains(&key)
        || PRETEND_PREFIXES.iter().any(|p| key.starts_with(p))
        || COMPILER_ENV_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// The inherited variables to remove from a wheel build: the `scrubbed`
/// names ([`is_scrubbed`]) the build does not set itself in `env` (the
/// environment given to the build, last value wins). What the tool sets
/// wins over the user's: the recipe's `build.env`, `CFLAGS` with the prefix
/// map, the compiler cache's `CCACHE_*` and its launchers in `CMAKE_ARGS`.
/// A removal must not name them, since duct applies the earliest modifier
/// last, so `env_remove(k)` before `env(k, v)` leaves `k` unset.
pub fn removals(scrubbed: &[String], env: &[(String, String)]) -> Vec<String> {
    scrubbed
        .iter()
        .filter(|k| !env.iter().any(|(set, _)| set == *k))
        .cloned()
        .collect()
}

/// The version the history of the checkout at `tree` gives, computed by the
/// tree's own version tool: `python -m setuptools_scm` run with the build
/// venv's Python (`venv`, which holds the tree's build requirements) in the
/// tree (so setuptools-scm reads the tree's `pyproject.toml`
/// `[tool.setuptools_scm]`), with every `SETUPTOOLS_SCM_*` and
/// `VCS_VERSIONING_*` variable removed (no pretend version, no overrides).
/// The tree must be an unmodified clone with full history and tags (the
/// store's checkout or a copy of it, before anything is built in it).
///
/// Returns `Ok(None)` when the build venv has no setuptools-scm (the tree
/// does not version itself with it, so there is nothing to compare with).
///
/// Errors: setuptools-scm is installed but fails or prints nothing.
pub fn history_version(venv: &Path, tree: &Path) -> Result<Option<String>> {
    let python = venv.join("bin/python");
    let probe = duct::cmd(&python, ["-I", "-c", "import setuptools_scm"])
        .dir(tree)
        .stdout_null()
        .stderr_null()
        .unchecked()
        .run()
        .with_context(|| format!("running {}", python.display()))?;
    if !probe.status.success() {
        return Ok(None);
    }
    let mut cmd = duct::cmd(&python, ["-I", "-m", "setuptools_scm"]).dir(tree);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("SETUPTOOLS_SCM_") || k.starts_with("VCS_VERSIONING_") {
            cmd = cmd.env_remove(k.as_ref());
        }
    }
    let out = crate::host::process::capture(
        &format!(
            "{} -m setuptools_scm (in {})",
            python.display(),
            tree.display()
        ),
        cmd,
    )?;
    let version = out.lines().rev().map(str::trim).find(|l| !l.is_empty());
    match version {
        Some(v) => Ok(Some(v.to_string())),
        None => bail!(
            "{} -m setuptools_scm printed no version in {}",
            python.display(),
            tree.display()
        ),
    }
}

/// Whether `version` is `history` with at most extra local labels appended
/// (PEP 440 local segment: `history` + `+label` when it has no local segment,
/// else `.label`): how a tree's `setup.py` may extend the history's version
/// for the distribution (vLLM appends `precompiled`, `cu130`, `cpu`, ...),
/// while the public version and the history's own local labels (`g<sha>`,
/// `dYYYYMMDD`) stay as the history gives them.
pub fn extends_history(version: &str, history: &str) -> bool {
    if version == history {
        return true;
    }
    let sep = if history.contains('+') { '.' } else { '+' };
    version
        .strip_prefix(history)
        .and_then(|rest| rest.strip_prefix(sep))
        .is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .split('.')
                    .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric()))
        })
}

/// The recipe's `expect.runtime_version` and `expect.distribution_version`
/// against `history`, the version the commit's history gives (computed
/// before the build): the runtime version must be it exactly, the
/// distribution version it or it with local labels appended (as the
/// identity gate checks them after the install). `describe` names the tag
/// the version comes from.
///
/// Errors (exit 3, identity mismatch): a field the history contradicts,
/// naming both versions and the tag.
pub fn check_expected_versions(
    lr: &LoadedRecipe,
    history: &str,
    describe: Option<&Describe>,
) -> Result<()> {
    let r = &lr.recipe;
    let mut wrong = Vec::new();
    if let Some(want) = &r.expect.runtime_version
        && want != history
    {
        wrong.push(format!("expect.runtime_version is {want}"));
    }
    if let Some(want) = &r.expect.distribution_version
        && !extends_history(want, history)
    {
        wrong.push(format!("expect.distribution_version is {want}"));
    }
    if wrong.is_empty() {
        return Ok(());
    }
    let from = describe.map_or_else(|| "no tag reaches it".to_string(), |d| format!("from {d}"));
    Err(crate::exit::mismatch(format!(
        "{}: {}, but the history of {} gives {history} ({from}); refusing before the wheel is built",
        lr.origin,
        wrong.join(" and "),
        r.source.commit
    )))
}

/// The wheel stage's settings, resolved from the recipe and the checkout
/// before any work (see [`settings`]).
#[derive(Debug, Clone)]
pub struct WheelSettings {
    /// Resolved `TORCH_CUDA_ARCH_LIST` (cuda only).
    pub arch_list: Option<String>,
    /// Resolved `MAX_JOBS` and why (not part of the key: it changes speed,
    /// not output; [`jobs::decide`]).
    pub jobs: jobs::Jobs,
    /// Where the build requirements come from.
    pub requirements: BuildRequirements,
    /// The tag the version of the commit's history comes from, read from
    /// the mirror ([`crate::stages::source::describe`]; `None`: no tag).
    pub describe: Option<Describe>,
}

/// Everything the wheel stage needs to know before running: its key, computed
/// once from complete inputs, and the resolved settings.
#[derive(Debug, Clone)]
pub struct WheelPlan {
    /// Content key of the inputs.
    pub key: String,
    /// The inputs, as hashed.
    pub inputs: Value,
    /// `store/wheels/<key>`.
    pub entry: Entry,
    /// Resolved `TORCH_CUDA_ARCH_LIST` (cuda only).
    pub arch_list: Option<String>,
    /// Resolved `MAX_JOBS` and why (not part of the key: it changes speed, not output).
    pub jobs: jobs::Jobs,
    /// Where the build requirements come from.
    pub requirements: BuildRequirements,
    /// Locked build set, staged external sources, compiler cache.
    pub hermetic: WheelHermetic,
    /// The tag the version comes from (see [`WheelSettings::describe`]).
    pub describe: Option<Describe>,
}

/// Resolves the wheel stage's settings for `lr` built from the checkout at
/// `src`. `jobs` overrides the recipe's `max_jobs` (`auto`: the CPUs and
/// the memory of this host, [`jobs::decide`]).
///
/// Errors (exit 2): `mode: precompiled` on aarch64 (kernels would be missing:
/// vLLM's precompiled wheels are built for x86_64 only). Errors:
/// `cuda_arch_list: auto` with no GPU visible; no build requirements found.
pub fn settings(lr: &LoadedRecipe, src: &Path, jobs: Option<usize>) -> Result<WheelSettings> {
    let r = &lr.recipe;
    if r.build.mode == BuildMode::Precompiled && std::env::consts::ARCH == "aarch64" {
        return Err(bad_input(format!(
            "{}: build.mode precompiled is refused on aarch64: the precompiled wheel ships no kernels for it; use mode: source",
            lr.origin
        )));
    }
    let arch_list = if r.build.device() == TargetDevice::Cuda {
        Some(resolve_arch_list(&r.build.cuda_arch_list)?)
    } else {
        None
    };
    let jobs = jobs::decide(&r.build, jobs, &jobs::Host::measure());
    let requirements = build_requirements(src, &r.build.target_device)?;
    Ok(WheelSettings {
        arch_list,
        jobs,
        requirements,
        describe: None,
    })
}

/// The wheel plan for `lr` with `tc`, the resolved `settings` and the
/// hermetic inputs `hermetic`: the key is the content key of the commit,
/// package, mode, device, arch list, build environment, build requirements,
/// pins, indexes, toolchain, the staged external sources' revisions and the
/// build lock's sha256 (see [`crate::store::key`]).
pub fn plan(
    store: &Store,
    lr: &LoadedRecipe,
    tc: &Toolchain,
    settings: WheelSettings,
    hermetic: WheelHermetic,
) -> WheelPlan {
    let r = &lr.recipe;
    let ext = if hermetic.ext_key.is_null() {
        Value::Array(Vec::new())
    } else {
        hermetic.ext_key.clone()
    };
    let mut inputs = json!({
        "schema": KEY_SCHEMA,
        "stage": "wheel",
        "commit": r.source.commit,
        "package": r.source.package,
        "mode": r.build.mode.as_str(),
        "target_device": r.build.target_device,
        "cuda_arch_list": settings.arch_list,
        "env": r.build.env,
        "build_requirements": settings.requirements,
        "pins": r.pins,
        "indexes": r.indexes,
        "ext": ext,
        // The tag the history's version comes from, and its commit.
        "describe": settings.describe,
        // The record carries the version the history gives (`history_version`)
        // and the tag it comes from (`describe`).
        "record": 3,
        "toolchain": {
            "python": tc.python.version, "implementation": tc.python.implementation, "platform": tc.python.platform,
            "gcc": tc.gcc.as_ref().map(|t| &t.version), "nvcc": tc.nvcc.as_ref().map(|t| &t.version),
            // The measured compilers' ids and versions (never their paths).
            "compilers": tc.compilers.key(),
            "uv": crate::host::toolchain::uv_version_number(&tc.uv.version),
        },
        "build_lock": hermetic.build_lock.as_ref().map(|l| l.lock_sha256.clone()),
    });
    // Only a tree that builds Rust has it in its key (other keys stay as they were).
    if let (Some(rust), Some(t)) = (&hermetic.rust, &tc.rust) {
        inputs["rust"] = json!({
            "toolchain": t.key(),
            "crates": crates::key_inputs(&rust.crates),
            // The extensions the recipe lets be absent; the rest are required.
            "optional_missing_ok": r.build.optional_missing_ok,
            "require_env": require_env(rust, lr),
        });
    }
    let key = content_key(&inputs);
    WheelPlan {
        entry: store.entry(Bucket::Wheels, &key),
        key,
        inputs,
        arch_list: settings.arch_list,
        jobs: settings.jobs,
        requirements: settings.requirements,
        hermetic,
        describe: settings.describe,
    }
}

fn resolve_arch_list(spec: &str) -> Result<String> {
    if spec != "auto" {
        return Ok(spec.to_string());
    }
    let caps: Vec<String> = toolchain::gpus()
        .into_iter()
        .map(|g| g.compute_cap)
        .collect();
    if caps.is_empty() {
        bail!(
            "build.cuda_arch_list is auto but no GPU is visible (nvidia-smi found none); set cuda_arch_list, e.g. \"12.1a\""
        );
    }
    Ok(toolchain::arch_list_for(&caps))
}

/// Which compiler cache a build uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheKind {
    /// Mozilla's sccache (a server shared by the user's builds).
    Sccache,
    /// ccache.
    Ccache,
}

/// A compiler cache (sccache or ccache) and its directory inside the store root.
#[derive(Debug, Clone)]
pub struct CompilerCache {
    /// Which one.
    pub kind: CacheKind,
    /// The program found.
    pub tool: Tool,
    /// `CCACHE_DIR` / `SCCACHE_DIR`.
    pub dir: PathBuf,
    /// Which variable points at `dir`.
    pub var: &'static str,
    /// The team cache (ccache's remote storage) the site configured, if
    /// any: ccache only (`[compiler_cache]`, [`crate::host::ccache`]).
    pub remote: Option<RemoteStorage>,
}

/// What the compiler cache did during one wheel build (`build.json`
/// `compiler_cache_stats`).
///
/// For ccache, read from the build's own stats log (`CCACHE_STATSLOG`, ccache
/// 4.4+): one `# <source>` line per cacheable call, then the counters that
/// call bumped (`direct_cache_hit`, `preprocessed_cache_hit`, `cache_miss`,
/// `local_storage_hit`, `remote_storage_hit`, `remote_storage_error`,
/// `remote_storage_timeout`; ccache's `doc/MANUAL.adoc`, "stats_log", and
/// `src/core/Statistic.hpp`), so builds running at the same time, even on
/// one local cache directory, do not mix. For sccache, the difference of
/// the server's `--show-stats --stats-format json` counters before and
/// after the build (shared by every build the server serves meanwhile; no
/// local/remote split).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Compiler calls the cache looked up.
    pub calls: u64,
    /// Calls answered from the cache (local or remote).
    pub hits: u64,
    /// Calls that ran the compiler and stored the result.
    pub misses: u64,
    /// Hits from the store's own cache directory.
    #[serde(default)]
    pub local_hits: u64,
    /// Hits from the team cache (ccache's remote storage).
    #[serde(default)]
    pub remote_hits: u64,
    /// Calls whose team cache lookup or store failed (unreachable, stopped,
    /// timed out): compiled here all the same.
    #[serde(default)]
    pub remote_errors: u64,
    /// Whether the build skipped the team cache after it timed out and
    /// stopped answering (`host::team_cache`): the calls after that did
    /// not ask it.
    #[serde(default)]
    pub remote_skipped: bool,
    /// The sources of the calls that missed, as ccache logged them (relative
    /// to the build directory), at most [`MISSED_SHOWN`].
    #[serde(default)]
    pub missed: Vec<String>,
}

/// How many missed sources [`CacheStats::missed`] lists at most.
pub const MISSED_SHOWN: usize = 1000;

impl CacheStats {
    /// Counts the calls of a ccache stats log's `text` (see [`CacheStats`]).
    pub fn from_ccache_log(text: &str) -> CacheStats {
        let mut s = CacheStats::default();
        let mut source = "";
        let mut call_failed = false;
        for line in text.lines().map(str::trim) {
            match line {
                l if l.starts_with('#') => {
                    s.calls += 1;
                    source = l.trim_start_matches('#').trim();
                    call_failed = false;
                }
                // Not a lookup: a link (setuptools links through `CC`) or
                // another call ccache passes to the compiler uncached.
                l if l.starts_with("called_for_") => s.calls = s.calls.saturating_sub(1),
                "direct_cache_hit" | "preprocessed_cache_hit" => s.hits += 1,
                "local_storage_hit" => s.local_hits += 1,
                "remote_storage_hit" => s.remote_hits += 1,
                "remote_storage_error" | "remote_storage_timeout" if !call_failed => {
                    call_failed = true;
                    s.remote_errors += 1;
                }
                "cache_miss" => {
                    s.misses += 1;
                    if s.missed.len() < MISSED_SHOWN {
                        s.missed.push(source.to_string());
                    }
                }
                _ => {}
            }
        }
        s
    }

    /// The hit and miss counts of sccache's `--stats-format json` output
    /// (`stats.cache_hits.counts` and `stats.cache_misses.counts`, summed over
    /// languages); `None` when `text` is not that shape.
    pub fn from_sccache_json(text: &str) -> Option<CacheStats> {
        let v: Value = serde_json::from_str(text).ok()?;
        let sum = |field: &str| -> Option<u64> {
            let counts = v.get("stats")?.get(field)?.get("counts")?.as_object()?;
            Some(counts.values().filter_map(Value::as_u64).sum())
        };
        let (hits, misses) = (sum("cache_hits")?, sum("cache_misses")?);
        Some(CacheStats {
            calls: hits + misses,
            hits,
            misses,
            ..CacheStats::default()
        })
    }
}

/// Measures what the compiler cache does during one build: made before the
/// build ([`CacheCounter::start`]), read after it ([`CacheCounter::finish`]).
#[derive(Debug)]
pub struct CacheCounter {
    cache: CompilerCache,
    statslog: PathBuf,
    before: Option<CacheStats>,
}

impl CacheCounter {
    /// Starts counting for a build whose scratch directory is `work`:
    /// for ccache, the variables naming a fresh stats log there (returned, to
    /// add to the build's environment); for sccache, the server's counters now.
    ///
    /// Errors: a stale stats log cannot be removed.
    pub fn start(
        cache: &CompilerCache,
        work: &Path,
    ) -> Result<(CacheCounter, Vec<(String, String)>)> {
        let statslog = work.join("ccache-stats.log");
        if statslog.exists() {
            fs::remove_file(&statslog)?;
        }
        let mut env = Vec::new();
        let before = match cache.kind {
            CacheKind::Ccache => {
                env.push((
                    "CCACHE_STATSLOG".to_string(),
                    statslog.display().to_string(),
                ));
                None
            }
            CacheKind::Sccache => sccache_stats(cache),
        };
        Ok((
            CacheCounter {
                cache: cache.clone(),
                statslog,
                before,
            },
            env,
        ))
    }

    /// The build's ccache stats log (`CCACHE_STATSLOG`; ccache only).
    pub fn statslog(&self) -> &Path {
        &self.statslog
    }

    /// The counts of the build since [`CacheCounter::start`]; `None` when
    /// they cannot be read (sccache not answering). A ccache build that made
    /// no compiler call has no stats log: all zero.
    pub fn finish(&self) -> Option<CacheStats> {
        match self.cache.kind {
            CacheKind::Ccache => Some(CacheStats::from_ccache_log(
                &std::fs::read_to_string(&self.statslog).unwrap_or_default(),
            )),
            CacheKind::Sccache => {
                let (b, a) = (self.before.as_ref()?, sccache_stats(&self.cache)?);
                let hits = a.hits.saturating_sub(b.hits);
                let misses = a.misses.saturating_sub(b.misses);
                Some(CacheStats {
                    calls: hits + misses,
                    hits,
                    misses,
                    ..CacheStats::default()
                })
            }
        }
    }
}

fn sccache_stats(cache: &CompilerCache) -> Option<CacheStats> {
    let out = crate::host::process::capture(
        "sccache",
        duct::cmd(&cache.tool.path, ["--show-stats", "--stats-format", "json"])
            .env(cache.var, &cache.dir),
    )
    .ok()?;
    CacheStats::from_sccache_json(&out)
}

impl CompilerCache {
    /// sccache, else ccache, on PATH; its directory is `<root>/sccache` or
    /// `<root>/ccache`, so a rebuild after a reboot reuses compiled objects.
    /// vLLM's setup.py uses whichever it finds as the compiler launcher.
    pub fn find(store: &Store) -> Option<CompilerCache> {
        for (kind, prog, var, dir) in [
            (CacheKind::Sccache, "sccache", "SCCACHE_DIR", "sccache"),
            (CacheKind::Ccache, "ccache", "CCACHE_DIR", "ccache"),
        ] {
            if let Ok(path) = which::which(prog)
                && let Ok(out) =
                    crate::host::process::capture(prog, duct::cmd(&path, ["--version"]))
            {
                return Some(CompilerCache {
                    kind,
                    tool: Tool {
                        path,
                        version: out.lines().next().unwrap_or("").trim().to_string(),
                    },
                    dir: store.compiler_cache_dir(dir),
                    var,
                    remote: None,
                });
            }
        }
        None
    }

    /// ccache on PATH (even when sccache is there too) with the team cache
    /// `remote`: what a build uses when the site configures one (sccache
    /// does not read ccache's remote storage). `None` when ccache is absent.
    pub fn with_remote(store: &Store, remote: RemoteStorage) -> Option<CompilerCache> {
        let path = which::which("ccache").ok()?;
        let out = crate::host::process::capture("ccache", duct::cmd(&path, ["--version"])).ok()?;
        Some(CompilerCache {
            kind: CacheKind::Ccache,
            tool: Tool {
                path,
                version: out.lines().next().unwrap_or("").trim().to_string(),
            },
            dir: store.compiler_cache_dir("ccache"),
            var: "CCACHE_DIR",
            remote: Some(remote),
        })
    }

    /// The variables that make this cache's keys independent of where the
    /// store lives, for a build in `work` (recorded in `build.json`): for
    /// ccache, `CCACHE_BASEDIR=<work>` (ccache's `base_dir`: absolute paths
    /// under `work` are rewritten relative to the compiler's working
    /// directory, the same in every store) and `CCACHE_NOHASHDIR=1`
    /// (`hash_dir = false`: ccache hashes the working directory for every
    /// call it takes to make debug information, and it takes nvcc's
    /// `-gencode=...` for a `-g` option, so every nvcc call would key on the
    /// store's path; the C and C++ debug information holds no store path,
    /// the build's `-ffile-prefix-map` maps it).
    /// When a team cache is configured, also the compiler launchers in
    /// `CMAKE_ARGS` (CMake's `CMAKE_<LANG>_COMPILER_LAUNCHER` for C, C++ and
    /// CUDA, after the tree's own: vLLM's setup.py puts sccache first when
    /// it is on PATH) and `VLLM_DISABLE_SCCACHE=1`.
    pub fn path_env(&self, work: &Path, cmake_args: Option<&str>) -> Vec<(String, String)> {
        if self.kind != CacheKind::Ccache {
            return Vec::new();
        }
        let mut env = vec![
            ("CCACHE_BASEDIR".to_string(), work.display().to_string()),
            ("CCACHE_NOHASHDIR".to_string(), "1".to_string()),
        ];
        if self.remote.is_some() {
            // ccache through the build's launcher script, which leaves a
            // stalled team cache out (`host::team_cache`).
            let launcher = crate::host::team_cache::launcher_path(work)
                .display()
                .to_string();
            let mut args = cmake_args.unwrap_or("").to_string();
            for lang in ["C", "CXX", "CUDA"] {
                args = format!("{args} -DCMAKE_{lang}_COMPILER_LAUNCHER={launcher}");
            }
            env.push(("CMAKE_ARGS".into(), args.trim().to_string()));
            env.push(("VLLM_DISABLE_SCCACHE".into(), "1".into()));
        }
        env
    }
}

impl CompilerCache {
    /// For ccache: writes the build's compiler scripts
    /// ([`crate::host::ccache_wrappers`]) and returns the variables naming
    /// them (`CC`, `CXX`, `PYTORCH_NVCC`), so setuptools' `build_ext` and
    /// torch's `cpp_extension` compile through ccache as CMake does, and
    /// `CMAKE_ARGS` (`cmake_args` as the build has it so far) with
    /// `CMAKE_<LANG>_COMPILER` naming the real compilers, so CMake takes no
    /// script for its compiler (no `ccache ccache gcc`). The real C and C++
    /// compilers are the recipe's `build.env` `CC` / `CXX` (in `env`), else
    /// `gcc` / `g++`, found on PATH as preflight found them (`compilers`:
    /// only those it measured are wrapped); nvcc is the measured one. With
    /// a team cache the scripts run the build's launcher
    /// ([`crate::host::team_cache::launcher_path`]), else ccache itself.
    /// Nothing for sccache.
    ///
    /// Errors: a script cannot be written.
    pub fn compiler_wrappers(
        &self,
        work: &Path,
        compilers: &crate::host::compilers::Compilers,
        nvcc: Option<&Path>,
        env: &BTreeMap<String, String>,
    ) -> Result<Vec<(String, String)>> {
        if self.kind != CacheKind::Ccache {
            return Ok(Vec::new());
        }
        let find = |var: &str, fallback: &str| {
            which::which(env.get(var).map_or(fallback, String::as_str)).ok()
        };
        let cc = compilers.cc.as_ref().and_then(|_| find("CC", "gcc"));
        let cxx = compilers.cxx.as_ref().and_then(|_| find("CXX", "g++"));
        let nvcc = compilers
            .cuda
            .as_ref()
            .and_then(|c| c.nvcc.as_ref().map(|n| n.path.clone()))
            .or_else(|| nvcc.map(Path::to_path_buf));
        let ccache = if self.remote.is_some() {
            crate::host::team_cache::launcher_path(work)
        } else {
            self.tool.path.clone()
        };
        let w = crate::host::ccache_wrappers::install(
            work,
            &ccache,
            &crate::host::ccache_wrappers::Real {
                cc: cc.as_deref(),
                cxx: cxx.as_deref(),
                nvcc: nvcc.as_deref(),
            },
        )?;
        let mut out = Vec::new();
        let mut cmake_args = env.get("CMAKE_ARGS").cloned().unwrap_or_default();
        for (var, lang, script, real) in [("CC", "C", &w.cc, &cc), ("CXX", "CXX", &w.cxx, &cxx)] {
            if let (Some(script), Some(real)) = (script, real) {
                // One shell word: setuptools splits CC / CXX with shell rules
                // (`split_quoted`), and the store's path may hold a space.
                out.push((var.to_string(), shell_word(&script.display().to_string())));
                cmake_args = format!("{cmake_args} -DCMAKE_{lang}_COMPILER={}", real.display());
            }
        }
        if let Some(script) = &w.nvcc {
            // torch writes it into a ninja rule run by the shell.
            out.push((
                "PYTORCH_NVCC".into(),
                shell_word(&script.display().to_string()),
            ));
        }
        if !cmake_args.trim().is_empty() {
            out.push(("CMAKE_ARGS".into(), cmake_args.trim().to_string()));
        }
        Ok(out)
    }
}

/// The note of a build whose configured compiler cache saw no compiler call
/// (`build.json` `compiler_cache_unused`): `None` when it saw some, or when
/// the counts are not known or not the build's own (sccache).
pub fn unused_note(cache: &CompilerCache, stats: Option<&CacheStats>) -> Option<String> {
    let s = stats?;
    if cache.kind != CacheKind::Ccache || s.calls > 0 {
        return None;
    }
    Some(format!(
        "the compiler cache ({}{}) was configured but no compiler call went through it: the build compiled nothing (a package without extensions, or a target that builds none), or its build system runs a compiler by its own path, ignoring CC, CXX, PYTORCH_NVCC and CMake's compiler launchers",
        cache.tool.version,
        cache
            .remote
            .as_ref()
            .map(|r| format!(", team cache {r}"))
            .unwrap_or_default()
    ))
}

/// What the wheel stage takes beyond its own plan.
#[derive(Debug, Clone, Default)]
pub struct WheelHermetic {
    /// The build set, installed into the build venv.
    pub build_lock: Option<LockedInstall>,
    /// Staged external sources: the source and its store entry.
    pub ext: Vec<(ExtSource, Entry)>,
    /// The key inputs of the staged sources ([`crate::stages::ext::key_inputs`]).
    pub ext_key: Value,
    /// sccache / ccache, when found.
    pub compiler_cache: Option<CompilerCache>,
    /// What the tree's build needs of Rust (`None`: it builds no Rust).
    pub rust: Option<RustInputs>,
}

/// The Rust inputs of a tree whose build needs Rust ([`crate::stages::rust`]).
#[derive(Debug, Clone, Default)]
pub struct RustInputs {
    /// What the tree declares.
    pub tree: TreeRust,
    /// The crates of each of its `Cargo.lock` files, staged
    /// ([`crate::stages::rust::crates`]).
    pub crates: Vec<(Entry, CratesRecord)>,
}

impl WheelHermetic {
    /// Labels of every store entry these inputs come from (for `requires`).
    pub fn labels(&self) -> Vec<String> {
        let mut out: Vec<String> = self.ext.iter().map(|(_, e)| e.label()).collect();
        if let Some(r) = &self.rust {
            out.extend(r.crates.iter().map(|(e, _)| e.label()));
        }
        if let Some(l) = &self.build_lock {
            out.extend(l.labels());
        }
        out
    }

    /// The extra build environment: the staged sources (copied into
    /// `work`), `CMAKE_ARGS` merged with `base_cmake_args`, and the compiler
    /// cache directory (created).
    pub fn env(
        &self,
        work: &Path,
        base_cmake_args: Option<&str>,
    ) -> Result<BTreeMap<String, String>> {
        let mut env = crate::stages::ext::build_env(&self.ext, work, base_cmake_args)?;
        if let Some(c) = &self.compiler_cache {
            fs::create_dir_all(&c.dir)?;
            env.insert(c.var.into(), c.dir.display().to_string());
        }
        Ok(env)
    }

    /// Names of the variables the staged sources are passed through.
    pub fn variables(&self) -> Vec<String> {
        self.ext
            .iter()
            .map(|(s, _)| match &s.variable {
                _ if s.decided == Decided::Configure => s.passed_through(),
                Variable::Env(v) => v.clone(),
                Variable::Cmake(v) => format!("CMAKE_ARGS -D{v}"),
            })
            .collect()
    }
}

/// The wheel stage's work directory, `<root>/tmp/build-<wheel key>`: the
/// same path for every build of a key (the build holds the key's lock), so
/// the compiler command lines, and with them ccache/sccache hits, survive a
/// reboot. Removed when dropped, and before use if a killed build left it.
#[derive(Debug)]
pub struct StableWorkDir(PathBuf);

impl StableWorkDir {
    /// Creates (after clearing) `<root>/tmp/build-<key>`.
    pub fn create(store: &Store, key: &str) -> Result<StableWorkDir> {
        let dir = store.tmp_dir().join(format!("build-{key}"));
        if fs::symlink_metadata(&dir).is_ok() {
            crate::store::make_writable(&dir);
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir)?;
        Ok(StableWorkDir(dir))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Removes the work directories of builds that no longer run (a build
    /// killed at any moment, even between persisting its wheel and cleaning
    /// up): those whose wheel lock nobody holds. Returns how many.
    pub fn clean_stale(store: &Store) -> usize {
        let Ok(rd) = fs::read_dir(store.tmp_dir()) else {
            return 0;
        };
        let mut removed = 0;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(key) = name.strip_prefix("build-") else {
                continue;
            };
            if !store.entry(Bucket::Wheels, key).is_locked() {
                crate::store::make_writable(&e.path());
                if std::fs::remove_dir_all(e.path()).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}

impl Drop for StableWorkDir {
    fn drop(&mut self) {
        crate::store::make_writable(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where the sources of a wheel were fetched from (`build.json`
/// `origins`): the declared URLs through the site's `[[mirror]]` tables.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Origins {
    /// The URL the recipe's repository is fetched from (the mirror of
    /// `source.repo`, or `source.repo` itself).
    #[serde(default)]
    pub source: Option<String>,
    /// Each staged CMake source (git) by name: the URL its entry was
    /// fetched from (its `ext.json` `fetched_from`).
    #[serde(default)]
    pub ext: BTreeMap<String, String>,
}

/// The record of a built wheel: `store/wheels/<key>/build.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BuildRecord {
    /// The wheel key.
    pub key: String,
    /// The wheel's file name inside the entry.
    pub wheel: String,
    /// Its sha256.
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
    /// The hashed inputs.
    pub inputs: Value,
    /// The build environment that was set (beyond the inherited one).
    pub env: BTreeMap<String, String>,
    /// Variables removed from the inherited environment.
    pub scrubbed_env: Vec<String>,
    /// Every tool used, with path and version.
    pub tools: Toolchain,
    /// Store entries this wheel was made from (`src/<commit>`, `git/<repo>.git`),
    /// kept alive by `gc` as long as the wheel is.
    #[serde(default)]
    pub requires: Vec<String>,
    /// The version the commit's history gives, computed by the tree's own
    /// version tool before the build (see [`history_version`]); `None` when
    /// the tree does not use setuptools-scm (or for wheels built before it was recorded).
    #[serde(default)]
    pub history_version: Option<String>,
    /// The tag `history_version` comes from and its commit (also in
    /// `inputs`, so in the key); `None`: no tag reaches the commit.
    #[serde(default)]
    pub describe: Option<Describe>,
    /// The compiler cache (sccache / ccache) the build could use, if any.
    #[serde(default)]
    pub compiler_cache: Option<crate::host::toolchain::Tool>,
    /// What the compiler cache did in this build: lookups, hits, misses
    /// (`None`: no cache found, or its counters could not be read).
    #[serde(default)]
    pub compiler_cache_stats: Option<CacheStats>,
    /// The team compiler cache the build used, redacted (no password):
    /// `redis://host:port`, with ` (read-only)` when so.
    #[serde(default)]
    pub compiler_cache_remote: Option<String>,
    /// Why a build whose compiler cache was configured made no call
    /// through it ([`unused_note`]); absent when it made some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiler_cache_unused: Option<String>,
    /// Where each source was fetched from: the URL after the site's
    /// `[[mirror]]` tables (not keyed: `inputs` keeps the declared URLs).
    #[serde(default)]
    pub origins: Origins,
    /// The declaration each staged external source was taken from
    /// (`file:line`, origin, commit, decided for the `target` or at
    /// `configure` time by the tree's CMake; [`crate::stages::ext::taken`]).
    #[serde(default)]
    pub ext_taken: Vec<crate::stages::ext::Taken>,
    /// Every extension the tree declares to setuptools-rust and whether the
    /// wheel holds it ([`crate::stages::rust::declared`]); empty for a tree
    /// that builds no Rust.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rust_extensions: Vec<Extension>,
    /// Declarations of the tree that could not be read (a file that does
    /// not parse, a target that is not a string literal), one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rust_unread: Vec<String>,
    /// Every kernel family the tree's configure reported, built or not, in
    /// the order printed ([`families`]); `None` in a record written before
    /// they were read (see [`BuildRecord::kernel_families`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_families: Option<Vec<families::KernelFamily>>,
    /// `MAX_JOBS` (also in `env`) and why ([`jobs::decide`]); `None` in a
    /// record written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs: Option<jobs::Jobs>,
    /// When the build started (RFC 3339).
    pub started: String,
    /// Wall time, seconds.
    pub duration_s: f64,
}

impl BuildRecord {
    /// Reads the record of the wheel entry at `dir`.
    pub fn read(dir: &Path) -> Result<BuildRecord> {
        read_json(&dir.join("build.json"))
    }

    /// The wheel's path inside the entry at `dir`.
    pub fn wheel_path(&self, dir: &Path) -> PathBuf {
        dir.join(&self.wheel)
    }

    /// The kernel families of the wheel entry at `dir`: the recorded ones,
    /// else (a record written before they were read) those of the entry's
    /// `build.log`, untraced; `None` when neither is there.
    pub fn kernel_families(&self, dir: &Path) -> Option<Vec<families::KernelFamily>> {
        self.kernel_families
            .clone()
            .or_else(|| families::read_log(&dir.join("build.log")))
    }
}

/// The recipe's `expect.kernel_families` against the families the wheel at
/// `entry` (record `record`) was built with: each must be reported built by
/// the tree's configure.
///
/// Errors (exit 3, identity mismatch): a family not built, naming it, the
/// tree's reason, where the tree says so and the build's arch list; the
/// wheel entry is kept (it is what the tree builds for these inputs).
pub fn check_expected_families(
    lr: &LoadedRecipe,
    entry: &Entry,
    record: &BuildRecord,
) -> Result<()> {
    let expected = &lr.recipe.expect.kernel_families;
    if expected.is_empty() {
        return Ok(());
    }
    let recorded = record.kernel_families(&entry.path);
    let unmet = families::unmet(expected, recorded.as_deref());
    if unmet.is_empty() {
        return Ok(());
    }
    let arch = record.env.get("TORCH_CUDA_ARCH_LIST").map_or_else(
        || {
            format!(
                "no TORCH_CUDA_ARCH_LIST: target_device {}",
                lr.recipe.build.target_device
            )
        },
        |a| format!("TORCH_CUDA_ARCH_LIST={a}"),
    );
    Err(crate::exit::mismatch(format!(
        "{}: expect.kernel_families: the wheel {} lacks {} the recipe requires (built with {arch}):\n  - {}\nrefusing before the venv is made (the wheel is kept: {}/build.json `kernel_families` lists what the tree's configure reported)",
        lr.origin,
        entry.label(),
        if unmet.len() == 1 {
            "a kernel family"
        } else {
            "kernel families"
        },
        unmet.join("\n  - "),
        entry.path.display()
    )))
}

/// Checks the wheel entry `entry` against its manifest, hashes included
/// (the wheel is one file, and it is about to be installed); when damaged, moves
/// it aside to `<root>/tmp` (removed by the next run) and returns true.
///
/// Errors: the entry cannot be moved.
pub fn quarantine_if_damaged(store: &Store, entry: &Entry, record: &BuildRecord) -> Result<bool> {
    let mut problems = Manifest::read(&entry.path)
        .map_or_else(|e| vec![format!("{e:#}")], |m| m.check(&entry.path, true));
    if problems.is_empty()
        && sha256_file(&record.wheel_path(&entry.path)).ok().as_deref()
            != Some(record.sha256.as_str())
    {
        problems.push(format!(
            "{} does not have the sha256 build.json records",
            record.wheel
        ));
    }
    if problems.is_empty() {
        return Ok(false);
    }
    let _lock = entry.lock()?;
    store.quarantine(entry, &problems)?;
    Ok(true)
}

/// Returns the wheel of `plan`, building it if its entry is absent: copy the
/// checkout to staging, make a build venv with the build requirements (recipe
/// pins as overrides), `uv build --wheel --no-build-isolation` with the
/// recipe's environment, then record and persist.
///
/// Returns the record and whether this call built it.
///
/// Errors: any build step fails (the error quotes the log's tail and names it).
pub fn ensure(
    cx: &Ctx<'_>,
    plan: &WheelPlan,
    src: &Entry,
    requires: &[String],
) -> Result<(BuildRecord, bool)> {
    let Ctx { store, lr, tc, uv } = *cx;
    if plan.entry.exists() {
        return Ok((BuildRecord::read(&plan.entry.path)?, false));
    }
    let _lock = plan.entry.lock()?;
    if plan.entry.exists() {
        return Ok((BuildRecord::read(&plan.entry.path)?, false));
    }
    let r = &lr.recipe;
    progress::stage(
        "build",
        format!(
            "building {} wheel {} from {}",
            r.source.package,
            plan.key,
            src.label()
        ),
    );
    progress::stage(
        "build",
        format!("MAX_JOBS {}: {}", plan.jobs.jobs, plan.jobs.why),
    );
    let started = jiff::Timestamp::now().to_string();
    let t0 = Instant::now();
    let staging = store.stage(&format!("wheel-{}", plan.key))?;
    let out = staging.path().join("entry");
    // A work path that is the same for every build of this key, so compiler
    // caches (ccache/sccache) see the same command lines after a reboot.
    let work_dir = StableWorkDir::create(store, &plan.key)?;
    let work = work_dir.path().to_path_buf();
    fs::create_dir_all(&out)?;
    let log = store.stage_log(&format!("build-{}", plan.key))?;
    let tree = work.join("src");
    copy_tree(&src.path, &tree)?;
    // The tags the key was computed from (the mirror's now), not the ones
    // the checkout was made with.
    let mirror = crate::stages::source::mirror_entry(store, &r.source.repo);
    crate::stages::source::sync_tags(&tree, &mirror.path)
        .context("giving the build tree the mirror's tags")?;
    let venv = work.join("venv");
    uv.venv(&tc.python.path, &venv, false, &log)?;
    let overrides = work.join("overrides.txt");
    fs::write(&overrides, pin_lines(&r.pins))?;
    let mut args: Vec<String> = match &plan.requirements {
        BuildRequirements::File(rel) => vec!["-r".into(), tree.join(rel).display().to_string()],
        BuildRequirements::Pyproject(reqs) => reqs.clone(),
    };
    args.extend(["--override".into(), overrides.display().to_string()]);
    if let Some(locked) = &plan.hermetic.build_lock {
        // The lock already resolved the recipe's pins (as overrides); passing
        // them again would add unhashed requirements under --require-hashes.
        locked
            .install(uv, &venv, &work, &[], &[], &log)
            .context("installing the locked build requirements from the wheelhouse")?;
    } else if !args.is_empty() {
        uv.pip_install(&venv, &args, &log)
            .context("installing the build requirements")?;
    }
    // What the commit's history gives, asked of the tree's own version tool
    // before the build writes anything into the tree.
    let history = history_version(&venv, &tree)
        .context("computing the version the commit's history gives")?;
    // A recipe that expects another version fails now, not after the build.
    if let Some(h) = &history {
        check_expected_versions(lr, h, plan.describe.as_ref())?;
    }
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert("VLLM_TARGET_DEVICE".into(), r.build.target_device.clone());
    env.insert("MAX_JOBS".into(), plan.jobs.jobs.to_string());
    env.insert("NVCC_THREADS".into(), r.build.nvcc_threads.to_string());
    env.insert(
        "VLLM_USE_PRECOMPILED".into(),
        if r.build.mode == BuildMode::Precompiled {
            "1"
        } else {
            "0"
        }
        .into(),
    );
    if let Some(arch) = &plan.arch_list {
        env.insert("TORCH_CUDA_ARCH_LIST".into(), arch.clone());
    }
    if let Some(nvcc) = &tc.nvcc
        && let Some(home) = nvcc.path.parent().and_then(Path::parent)
    {
        env.entry("CUDA_HOME".into())
            .or_insert_with(|| home.display().to_string());
    }
    // Reproducible builds (reproducible-builds.org): zip timestamps from the
    // commit time, and no staging path baked into debug info, so the same
    // inputs give the same wheel bytes in any store.
    let epoch = crate::stages::source::commit_time(&src.path, &r.source.commit)?;
    env.insert("SOURCE_DATE_EPOCH".into(), epoch.to_string());
    // Quoted as one shell word: setuptools splits CFLAGS with shell rules
    // (`split_quoted`) and CMake's generated command lines run through a
    // shell, so a store path with a space or a quote stays one argument.
    let map = shell_word(&format!(
        "-ffile-prefix-map={}=/oracle-build",
        work.display()
    ));
    // The recipe's `build.env` (keyed) over the tool's own, except that its
    // CFLAGS / CXXFLAGS come before the prefix map rather than replacing it:
    // the user's environment gives none of them (`is_scrubbed`).
    env.extend(r.build.env.clone());
    for var in ["CFLAGS", "CXXFLAGS"] {
        let recipe = r.build.env.get(var).map(String::as_str).unwrap_or_default();
        env.insert(var.into(), format!("{recipe} {map}").trim().to_string());
    }
    let ext_env = plan
        .hermetic
        .env(&work, r.build.env.get("CMAKE_ARGS").map(String::as_str))?;
    env.extend(ext_env);
    let cache = plan.hermetic.compiler_cache.as_ref();
    if let Some(c) = cache {
        let paths = c.path_env(&work, env.get("CMAKE_ARGS").map(String::as_str));
        env.extend(paths);
        let nvcc = tc.nvcc.as_ref().map(|t| t.path.as_path());
        let wrappers = c.compiler_wrappers(&work, &tc.compilers, nvcc, &env)?;
        env.extend(wrappers);
    }
    // Rust: the measured toolchain, named for rustup (`RUSTUP_TOOLCHAIN`).
    // Its staged crates only, offline (`CARGO_HOME` in the work directory);
    // its optional extensions required where the tree reads the variable.
    if let (Some(rust), Some(t)) = (&plan.hermetic.rust, &tc.rust) {
        env.extend(t.env());
        env.extend(crates::build_env(&rust.crates, &work)?);
        // Rust's compile cache is cargo's own target directory: kept in the
        // store beside the compiler cache (never in the wheel's staging),
        // one per lock set, toolchain and device, so a rebuild of the wheel
        // (a killed build, new C++ code, a reboot) compiles no crate again.
        if cache.is_some() {
            let dir = crates::target_dir(store, &rust.crates, &t.key(), &r.build.target_device);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            env.insert("CARGO_TARGET_DIR".into(), dir.display().to_string());
        }
        if let Some(v) = require_env(rust, lr) {
            env.insert(crate::stages::rust::REQUIRE_ENV.into(), v.into());
        }
    }
    if uv.offline && crate::stages::ext::runs_cmake(&r.build.target_device) {
        // Offline, CMake itself must fail on any source that was not
        // redirected to a staged copy (CMake docs, FetchContent).
        let args = env.get("CMAKE_ARGS").cloned().unwrap_or_default();
        let flag = "-DFETCHCONTENT_FULLY_DISCONNECTED=ON";
        env.insert(
            "CMAKE_ARGS".into(),
            format!("{args} {flag}").trim().to_string(),
        );
    }
    // The cache's counters for this build alone; the stats log is scratch,
    // so its variable is not part of the recorded environment.
    let counter = match &plan.hermetic.compiler_cache {
        Some(c) => Some(CacheCounter::start(c, &work)?),
        None => None,
    };
    // Names only (never values): every inherited variable that would have
    // reached the build and was removed (the build may set its own value).
    let mut scrubbed: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .filter(|k| is_scrubbed(k))
        .collect();
    // A configure-time candidate's variable must not reach CMake from the
    // user's environment either: CMake asks the provider only when it is empty.
    for (s, _) in &plan.hermetic.ext {
        if let Variable::Env(v) = &s.variable
            && s.decided == Decided::Configure
            && std::env::var_os(v).is_some()
            && !scrubbed.contains(v)
        {
            scrubbed.push(v.clone());
        }
    }
    scrubbed.sort();
    let bar = Progress::new("build");
    let mut env_pairs: Vec<(String, String)> =
        env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    if let Some((_, extra)) = &counter {
        env_pairs.extend(extra.iter().cloned());
    }
    // The team cache's URL may hold a password: it reaches the compilers'
    // environment only; the record keeps the redacted form.
    let remote = cache.and_then(|c| c.remote.as_ref());
    if let Some(r) = remote {
        env_pairs.push((REMOTE_STORAGE_VAR.into(), r.ccache_value()));
    }
    // A team cache that stalls is skipped for the rest of the build.
    let watch = match (cache, remote, &counter) {
        (Some(c), Some(r), Some((counter, _))) => {
            let switch = crate::host::team_cache::Switch::install(&work, &c.tool.path)?;
            Some(crate::host::team_cache::Watch::start(
                &switch,
                counter.statslog().to_path_buf(),
                r.clone(),
            ))
        }
        _ => None,
    };
    // uv writes its own files beside the wheel (a `.gitignore`): the build
    // goes to `dist/`, and only the wheel moves into the entry.
    let dist = work.join("dist");
    let remove = removals(&scrubbed, &env_pairs);
    uv.build_wheel(&venv, &tree, &dist, &env_pairs, &remove, &log, &bar)?;
    bar.finish();
    let skipped = watch.is_some_and(crate::host::team_cache::Watch::finish);
    let cache_stats = counter
        .as_ref()
        .and_then(|(c, _)| c.finish())
        .map(|s| CacheStats {
            remote_skipped: skipped,
            ..s
        });
    let unused = cache.and_then(|c| unused_note(c, cache_stats.as_ref()));
    if let Some(note) = &unused {
        progress::stage("build", format!("warning: {note}"));
    }
    let ext_taken = crate::stages::ext::taken(&plan.hermetic.ext, &work)?;
    // What the tree's configure said it builds, traced to its CMake files.
    let mut kernel_families = families::read_log(&log).unwrap_or_default();
    families::trace(
        &mut kernel_families,
        &crate::stages::ext::messages::in_tree(&src.path),
    );
    let wheels: Vec<String> = fs::read_dir(&dist)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".whl"))
        .collect();
    let [wheel] = wheels.as_slice() else {
        bail!(
            "the build produced {} wheels in {} (expected one): {wheels:?}",
            wheels.len(),
            dist.display()
        );
    };
    let wheel_path = out.join(wheel);
    if fs::rename(dist.join(wheel), &wheel_path).is_err() {
        // Another file system (a staging directory outside the store).
        fs::copy(dist.join(wheel), &wheel_path)?;
    }
    // The tree's Rust extensions, and which of them the wheel holds.
    let (mut rust_extensions, mut rust_unread) = (Vec::new(), Vec::new());
    if let Some(rust) = &plan.hermetic.rust {
        (rust_extensions, rust_unread) = declared::find(&tc.python.path, &src.path, &rust.tree)?;
        let members = wheel_members(&wheel_path)?;
        for e in &mut rust_extensions {
            e.present = declared::in_wheel(e, &members);
        }
        for w in &rust_unread {
            progress::stage(
                "build",
                format!(
                    "warning: a Rust extension declaration that cannot be read (not checked): {w}"
                ),
            );
        }
        let missing: Vec<&str> = rust_extensions
            .iter()
            .filter(|e| !e.present)
            .map(|e| e.target.as_str())
            .collect();
        if !missing.is_empty() {
            progress::stage(
                "build",
                format!(
                    "the wheel lacks the Rust extension(s) {} the tree declares (see {})",
                    missing.join(", "),
                    log.display()
                ),
            );
        }
    }
    let record = BuildRecord {
        key: plan.key.clone(),
        wheel: wheel.clone(),
        sha256: sha256_file(&wheel_path)?,
        size: fs::metadata(&wheel_path)?.len(),
        inputs: plan.inputs.clone(),
        env,
        scrubbed_env: scrubbed,
        tools: tc.clone(),
        requires: requires.to_vec(),
        history_version: history,
        describe: plan.describe.clone(),
        compiler_cache: plan
            .hermetic
            .compiler_cache
            .as_ref()
            .map(|c| c.tool.clone()),
        compiler_cache_stats: cache_stats,
        compiler_cache_remote: remote.map(ToString::to_string),
        compiler_cache_unused: unused,
        origins: Origins {
            source: crate::stages::source::origin_url(store, &r.source.repo).ok(),
            ext: plan
                .hermetic
                .ext
                .iter()
                .filter_map(|(s, e)| Some((s.name.clone(), crate::stages::ext::fetched_from(e)?)))
                .collect(),
        },
        ext_taken,
        rust_extensions,
        rust_unread,
        kernel_families: Some(kernel_families),
        max_jobs: Some(plan.jobs.clone()),
        started,
        duration_s: t0.elapsed().as_secs_f64(),
    };
    write_json(&out.join("build.json"), &record)?;
    fs::copy(&log, out.join("build.log"))?;
    Manifest::build(&out, &[crate::store::MANIFEST])?.write(&out)?;
    store.persist(&out, &plan.entry)?;
    let _ = fs::remove_file(&log);
    let cache_note = record
        .compiler_cache_stats
        .as_ref()
        .map(|c| {
            let split = if remote.is_some() {
                format!(
                    " ({} local, {} from the team cache)",
                    c.local_hits, c.remote_hits
                )
            } else {
                String::new()
            };
            format!(
                "; compiler cache: {} hits{split}, {} misses of {} calls",
                c.hits, c.misses, c.calls
            )
        })
        .unwrap_or_default();
    if let (Some(r), Some(c)) = (remote, &record.compiler_cache_stats)
        && c.remote_errors > 0
    {
        // Said once per build: ccache itself only logs each failure.
        progress::stage(
            "build",
            format!(
                "the team compiler cache {r} did not answer {} of {} compiler calls (unreachable or stopped): ccache compiled them here, so only time was lost; the wheel is the same",
                c.remote_errors, c.calls
            ),
        );
    }
    progress::stage(
        "build",
        format!(
            "wheel {} ({} bytes, {:.1} s{cache_note})",
            record.wheel, record.size, record.duration_s
        ),
    );
    Ok((record, true))
}

/// The value of [`crate::stages::rust::REQUIRE_ENV`] the build sets: `1`
/// when the tree reads it and the recipe accepts no absent extension
/// (`build.optional_missing_ok` empty), so the tree's own build fails
/// rather than leave one out; else none (the tree's default).
fn require_env(rust: &RustInputs, lr: &LoadedRecipe) -> Option<&'static str> {
    (rust.tree.reads_require_env && lr.recipe.build.optional_missing_ok.is_empty()).then_some("1")
}

/// The member names of the wheel at `path`.
///
/// Errors: it is not a zip archive.
fn wheel_members(path: &Path) -> Result<Vec<String>> {
    let zip = zip::ZipArchive::new(fs::File::open(path)?)
        .with_context(|| format!("{} is not a zip archive", path.display()))?;
    zip.file_names()
        .map(|n| Ok(n?.into_owned()))
        .collect::<Result<Vec<String>, zip::result::ZipError>>()
        .with_context(|| format!("reading the member names of {}", path.display()))
}

/// `s` as one POSIX shell word: unchanged when it holds only characters no
/// shell treats specially, else single-quoted (a `'` inside written `'\''`).
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_s_compiler_variables_are_removed_and_the_tool_s_own_values_win() {
        for k in [
            "CPPFLAGS",
            "CMAKE_ARGS",
            "CMAKE_GENERATOR",
            "CMAKE_CXX_COMPILER_LAUNCHER",
            "NVCC_APPEND_FLAGS",
            "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_X",
        ] {
            assert!(is_scrubbed(k), "{k}");
        }
        for k in ["CCACHE_DIR", "CCACHE_REMOTE_STORAGE", "PATH", "HOME"] {
            assert!(!is_scrubbed(k), "{k}");
        }
        let scrubbed: Vec<String> = ["CFLAGS", "CMAKE_ARGS", "CMAKE_GENERATOR", "CPPFLAGS"]
            .map(String::from)
            .to_vec();
        // The tool sets CFLAGS (the prefix map) and CMAKE_ARGS (ccache's
        // launchers); duct would unset them if they were also removed.
        let env: Vec<(String, String)> = [
            ("CFLAGS", "-ffile-prefix-map=/w=/oracle-build"),
            ("CMAKE_ARGS", "-DCMAKE_C_COMPILER_LAUNCHER=/usr/bin/ccache"),
            ("CCACHE_REMOTE_STORAGE", "redis://h"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec();
        assert_eq!(removals(&scrubbed, &env), ["CMAKE_GENERATOR", "CPPFLAGS"]);
        let out = duct::cmd("sh", ["-c", "echo \"${CMAKE_ARGS-unset}\""])
            .env_remove("CMAKE_ARGS")
            .env("CMAKE_ARGS", "tool")
            .read()
            .unwrap();
        assert_eq!(out, "unset", "a removal wins over a value set after it");
    }

    #[test]
    fn a_ccache_stats_log_gives_local_and_remote_hits_misses_and_failures() {
        // As ccache 4.7 writes it: one `# <source>` line per call, then its counters.
        let log = "# ../../csrc/a.cpp\ndirect_cache_hit\nlocal_storage_hit\nlocal_storage_read_hit\n\
                   # ../../csrc/b.cpp\ndirect_cache_hit\nlocal_storage_miss\nremote_storage_hit\nremote_storage_read_hit\n\
                   # ../../csrc/c.cpp\ncache_miss\ndirect_cache_miss\nlocal_storage_miss\nremote_storage_error\nremote_storage_error\n\
                   # ../../csrc/d.cu\ncache_miss\nremote_storage_timeout\n";
        let s = CacheStats::from_ccache_log(log);
        assert_eq!((s.calls, s.hits, s.misses), (4, 2, 2));
        assert_eq!((s.local_hits, s.remote_hits), (1, 1));
        assert_eq!(
            s.remote_errors, 2,
            "one per call, however many errors it logged"
        );
        assert_eq!(s.missed, ["../../csrc/c.cpp", "../../csrc/d.cu"]);
        assert_eq!(CacheStats::from_ccache_log(""), CacheStats::default());
    }

    #[test]
    fn the_team_cache_sets_base_dir_no_hash_dir_and_the_launchers() {
        let tool = Tool {
            path: PathBuf::from("/usr/bin/ccache"),
            version: "ccache version 4.7.5".into(),
        };
        let mut c = CompilerCache {
            kind: CacheKind::Ccache,
            tool,
            dir: PathBuf::from("/s/ccache"),
            var: "CCACHE_DIR",
            remote: None,
        };
        let work = Path::new("/s/tmp/build-k");
        let local: BTreeMap<String, String> = c.path_env(work, Some("-DX=1")).into_iter().collect();
        assert_eq!(local["CCACHE_BASEDIR"], "/s/tmp/build-k");
        assert_eq!(local["CCACHE_NOHASHDIR"], "1");
        assert!(!local.contains_key("CMAKE_ARGS"), "{local:?}");
        c.remote = Some(RemoteStorage::parse("redis://:pw@h:6379", false).unwrap());
        let team: BTreeMap<String, String> = c.path_env(work, Some("-DX=1")).into_iter().collect();
        assert_eq!(
            team["CMAKE_ARGS"],
            "-DX=1 -DCMAKE_C_COMPILER_LAUNCHER=/s/tmp/build-k/ccache-launcher -DCMAKE_CXX_COMPILER_LAUNCHER=/s/tmp/build-k/ccache-launcher -DCMAKE_CUDA_COMPILER_LAUNCHER=/s/tmp/build-k/ccache-launcher"
        );
        assert_eq!(team["VLLM_DISABLE_SCCACHE"], "1");
        assert!(
            !format!("{team:?}").contains("pw"),
            "the URL is not in the recorded environment"
        );
        c.kind = CacheKind::Sccache;
        assert!(c.path_env(work, None).is_empty());
    }
}
