//! Recipes: the human-written YAML description of one pin (docs/recipes.md).
//!
//! A [`Recipe`] is parsed strictly (unknown keys are errors) and then validated;
//! every error names the file, the line and the field, and maps to exit code 2.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::exit::bad_input;

mod env;
mod errors;
mod files;
mod lines;
mod strict;
mod validate;

pub mod pin;

pub use env::{env_references, expand_env};
pub use files::{
    MAX_GOLDEN_JSON, MAX_GOLDEN_NPY, MAX_PROMPTS_FILE, check_files, prompts_path, read_prompts,
};
pub use lines::locate;
use validate::validate;
pub use validate::{CONFINED_SMOKE_VARS, controlled_smoke_var};
pub use validate::{
    controlled_build_var, is_distribution_name, is_env_name, is_exact_version, is_full_commit,
    is_valid_name,
};

/// One pin: a commit of a repository plus the dependency stack and the gate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Unique name, `[a-z0-9._-]+`; also the name of the oracle's GC root.
    pub name: String,
    /// Where the source comes from.
    pub source: Source,
    /// Python `major.minor` the oracle runs on, e.g. `"3.12"`.
    pub python: String,
    /// Extra package indexes, highest priority first (uv `--index`): a URL,
    /// or an explicit index `{name, url, packages}` that serves only the
    /// packages it names, which come only from it (uv's `[[tool.uv.index]]
    /// explicit = true` with `[tool.uv.sources]`).
    #[serde(default)]
    pub indexes: Vec<Index>,
    /// Exact versions that override whatever the checkout asks for
    /// (distribution name -> version), e.g. `torch: 2.13.0`.
    #[serde(default)]
    pub pins: BTreeMap<String, String>,
    /// How the wheel is built.
    #[serde(default)]
    pub build: Build,
    /// The identity a correct build must report; absent fields are not checked.
    #[serde(default)]
    pub expect: Expect,
    /// The smoke run that decides *gateable*.
    #[serde(default)]
    pub smoke: Smoke,
    /// How `oracle-build lock` resolves (see `stages::lock`).
    #[serde(default)]
    pub lock: LockSettings,
    /// Packages the oracle holds besides what the package requires: its
    /// own extras and added exact pins (issue 38).
    #[serde(default, skip_serializing_if = "Install::is_empty")]
    pub install: Install,
}

/// `install:` what the runtime set holds besides the package's own
/// requirements, resolved into the runtime lock like every other package.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Install {
    /// Extras of the package itself (`vllm[bench]`): the `Requires-Dist` of
    /// its metadata whose marker holds with `extra == "<name>"`.
    #[serde(default)]
    pub extras: Vec<String>,
    /// Added packages, each an exact PEP 508 pin `name==version`
    /// (`pandas==2.2.3`).
    #[serde(default)]
    pub with: Vec<String>,
}

impl Install {
    /// Whether nothing is asked for (the recipe has no `install:`).
    pub fn is_empty(&self) -> bool {
        self.extras.is_empty() && self.with.is_empty()
    }

    /// The `with` entries as `(name, version)`, in order; entries that are
    /// no exact pin are skipped (validation refuses them, exit 2).
    pub fn with_pins(&self) -> Vec<(String, String)> {
        self.with
            .iter()
            .filter_map(|w| parse_with(w).ok())
            .collect()
    }
}

/// One `install.with` entry parsed as a PEP 508 requirement that is an
/// exact pin: `name==version` with no extras, URL or marker, returned as
/// (normalized name, version).
///
/// Errors: a message saying why it is not one.
pub fn parse_with(entry: &str) -> Result<(String, String), String> {
    use std::str::FromStr;
    let req = pep508_rs::Requirement::<pep508_rs::VerbatimUrl>::from_str(entry)
        .map_err(|e| format!("is not a PEP 508 requirement ({e})"))?;
    let not_pin = || {
        "is not an exact pin; each entry is `name==version` (PEP 508 name, one exact PEP 440 version, no extras, URL or marker), e.g. \"pandas==2.2.3\"".to_string()
    };
    if !req.extras.is_empty() || req.marker.contents().is_some() {
        return Err(not_pin());
    }
    let Some(pep508_rs::VersionOrUrl::VersionSpecifier(spec)) = &req.version_or_url else {
        return Err(not_pin());
    };
    let spec: Vec<_> = spec.iter().collect();
    match spec.as_slice() {
        [one] if *one.operator() == pep440_rs::Operator::Equal => {
            Ok((req.name.to_string(), one.version().to_string()))
        }
        _ => Err(not_pin()),
    }
}

/// One entry of `indexes:`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Index {
    /// An extra index, searched before the default one for every package.
    Url(String),
    /// An index that serves only `packages`; they come only from it.
    Explicit {
        /// Its name (`[a-z0-9-]+`), recorded in the lock.
        name: String,
        /// Its simple-API URL.
        url: String,
        /// The distributions it serves.
        packages: Vec<String>,
    },
}

impl Index {
    /// The index's URL.
    pub fn url(&self) -> &str {
        match self {
            Index::Url(u) | Index::Explicit { url: u, .. } => u,
        }
    }
}

/// `lock:` resolution settings for `oracle-build lock`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct LockSettings {
    /// Upload-time cut-off (uv `--exclude-newer`): `commit` (the default: the
    /// commit's committer time), `none` (no cut-off), or an RFC 3339 timestamp.
    pub exclude_newer: Option<String>,
}

/// `source:` the repository, the commit and the Python distribution it builds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Any URL git understands (`https://`, `file://`, a local path).
    pub repo: String,
    /// Full 40-hex commit id.
    pub commit: String,
    /// Distribution and import name (default `vllm`).
    #[serde(default = "default_package")]
    pub package: String,
    /// What a build does when an online refresh finds that a tag the
    /// mirror had was moved (or deleted) upstream and that this changes the
    /// version the commit's history gives: `follow` (the default) or
    /// `refuse`.
    #[serde(default, skip_serializing_if = "MovedTags::is_follow")]
    pub moved_tags: MovedTags,
}

fn default_package() -> String {
    "vllm".into()
}

/// `source.moved_tags`: whether a build follows a tag moved upstream.
///
/// `follow` is the default: the repository is the authority on its tags
/// (its refresh already moves and prunes them, and a new tag changes the
/// version the same way), and refusing by default would stop every box's
/// builds of a pin whenever upstream re-tags a release; the build names
/// the version change instead (old and new version, the tag and both
/// commits). `refuse` is for a team whose oracle must never change
/// version under a fixed commit: the move is undone in the mirror and the
/// build stops (exit 3) until the recipe says `follow`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum MovedTags {
    /// Take the repository's tags as they are now; name the version change.
    #[default]
    Follow,
    /// Keep the mirror's tags where they were and stop the build.
    Refuse,
}

impl MovedTags {
    /// Whether this is the default, `follow`.
    pub fn is_follow(&self) -> bool {
        *self == MovedTags::Follow
    }
}

/// Whether native code is compiled from the checkout or taken from a prebuilt wheel.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum BuildMode {
    /// Compile every extension from the checkout (`VLLM_USE_PRECOMPILED=0`).
    #[default]
    Source,
    /// vLLM's `VLLM_USE_PRECOMPILED=1`: kernels from a prebuilt wheel. Flagged everywhere.
    Precompiled,
}

impl BuildMode {
    /// `"source"` or `"precompiled"`, as written in recipes and identities.
    pub fn as_str(self) -> &'static str {
        match self {
            BuildMode::Source => "source",
            BuildMode::Precompiled => "precompiled",
        }
    }
}

/// `build:` how the wheel is built (vLLM's `setup.py` environment variables).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Build {
    /// `source` or `precompiled`.
    #[serde(default)]
    pub mode: BuildMode,
    /// Exported as `VLLM_TARGET_DEVICE`: cuda | rocm | cpu | xpu | tpu | empty.
    #[serde(default = "default_device")]
    pub target_device: String,
    /// `auto` (from `nvidia-smi` compute capability) or a `TORCH_CUDA_ARCH_LIST`
    /// value such as `"9.0a;12.1a"`. Only used for `cuda`.
    #[serde(default = "default_auto")]
    pub cuda_arch_list: String,
    /// `auto` (the CPUs, fewer when the available memory holds fewer jobs
    /// of `mem_per_job_gib`) or a positive integer; exported as `MAX_JOBS`.
    #[serde(default = "default_auto")]
    pub max_jobs: String,
    /// The memory one compile job needs, in GiB, for `max_jobs: auto`
    /// (`None`: the device's default, [`Build::mem_per_job`]).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict::opt_f64"
    )]
    pub mem_per_job_gib: Option<f64>,
    /// Exported as `NVCC_THREADS`.
    #[serde(default = "default_one", deserialize_with = "strict::u32")]
    pub nvcc_threads: u32,
    /// Extra build environment, recorded in `build.json` and part of the wheel key.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Disk each stage needs, for the preflight; defaults by target device.
    #[serde(default)]
    pub disk: Disk,
    /// The optional extensions the tree declares (its setuptools-rust
    /// `RustExtension` / `RustBin` targets, e.g. `vllm._rust_tool_parser`,
    /// `vllm.vllm-rs`) this oracle may lack. Every declared one is required
    /// unless named here (`stages::rust::declared`); part of the wheel key
    /// of a tree that builds Rust.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub optional_missing_ok: Vec<String>,
}

/// `build.disk:` free space each stage needs before it starts, in GiB.
/// Absent fields default by target device (see `host::disk::needed`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Disk {
    /// The mirror and checkout (vLLM with history: ~0.9 GiB).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict::opt_f64"
    )]
    pub source_gib: Option<f64>,
    /// Building the wheel (vLLM CUDA: >= 18 GiB).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict::opt_f64"
    )]
    pub wheel_gib: Option<f64>,
    /// One oracle venv (vLLM CUDA: 15-20 GiB).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict::opt_f64"
    )]
    pub venv_gib: Option<f64>,
}

fn default_device() -> String {
    "cuda".into()
}
fn default_auto() -> String {
    "auto".into()
}
fn default_one() -> u32 {
    1
}

impl Default for Build {
    fn default() -> Self {
        Build {
            mode: BuildMode::Source,
            target_device: default_device(),
            cuda_arch_list: default_auto(),
            max_jobs: default_auto(),
            mem_per_job_gib: None,
            nvcc_threads: 1,
            env: BTreeMap::new(),
            disk: Disk::default(),
            optional_missing_ok: Vec::new(),
        }
    }
}

/// `expect:` identity fields a correct oracle must report (docs/identity.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// `<package>.__version__`, e.g. `0.23.1rc1.dev1511+g555967922`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_version: Option<String>,
    /// `importlib.metadata.version(<package>)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distribution_version: Option<String>,
    /// `flashinfer.__version__`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flashinfer_version: Option<String>,
    /// `torch.__version__`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_version: Option<String>,
    /// Kernel families the tree's configure must report built (`build.json`
    /// `kernel_families`, as its CMake files name them: `SM12x NVFP4`,
    /// `moe_data`): one it does not build fails the build before the venv
    /// stage (exit 3); a name the tree's CMake files cannot report is bad
    /// input (exit 2), said before the wheel is built.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_families: Vec<String>,
}

/// `smoke:` the gate run (docs/smoke.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Smoke {
    /// Environment for every case, e.g. `VLLM_ENABLE_V1_MULTIPROCESSING: "0"`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Greedy batch-1 generations per case; all must agree.
    #[serde(default = "default_runs", deserialize_with = "strict::u32")]
    pub runs: u32,
    /// Execute one compiled custom op on the device before the cases:
    /// `true` (`<package>._custom_ops.rms_norm` against a reference), `false`,
    /// or `{module: ..., function: ...}` naming another probe.
    #[serde(default)]
    pub probe: Probe,
    /// Wall-clock limit per case process, in seconds.
    #[serde(default = "default_timeout", deserialize_with = "strict::u64")]
    pub timeout_s: u64,
    /// A golden mismatch whose two tokens are within this many nats (natural-log
    /// probability) of each other at the first divergent step is flagged a near-tie.
    #[serde(default = "default_near_tie_nats", deserialize_with = "strict::f64")]
    pub near_tie_nats: f64,
    /// Top-k log-probabilities requested per generated token
    /// (`SamplingParams(logprobs=k)`); 0 requests none (no gaps can be reported).
    #[serde(default = "default_logprobs", deserialize_with = "strict::u32")]
    pub logprobs: u32,
    /// Accept an extension whose only device code for the GPU is PTX (the
    /// driver JIT-compiles it at load, so the code that runs is not the code
    /// that was built and reviewed); `false` (the default) refuses it in the
    /// `kernels` identity checks (`stages::identity::coverage`).
    #[serde(default)]
    pub allow_ptx_jit: bool,
    /// The gate models.
    #[serde(default)]
    pub cases: Vec<Case>,
    /// The online leg: serve the named cases with the oracle's own server
    /// and compare its tokens with their offline golden (docs/smoke.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<Serve>,
}

/// `smoke.serve`: which offline cases the gate also runs through the
/// oracle's server (`<venv>/bin/<command> serve <model> --host 127.0.0.1
/// --port <free port>` plus `args`), one server per case.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Serve {
    /// Names of offline cases (`smoke.cases[].name`), each served once.
    pub cases: Vec<String>,
    /// The console script of the oracle's `bin/` that has a `serve`
    /// subcommand (vLLM's `vllm`; another package names its own).
    #[serde(default = "default_serve_command")]
    pub command: String,
    /// Further arguments after `serve <model> --host ... --port ...`
    /// (e.g. `--max-model-len 256`); `--host` and `--port` are the gate's.
    #[serde(default)]
    pub args: Vec<String>,
    /// Seconds the server has to answer `GET /health` (and, again, the
    /// completion request).
    #[serde(default = "default_serve_timeout", deserialize_with = "strict::u64")]
    pub timeout_s: u64,
}

fn default_serve_command() -> String {
    "vllm".into()
}
fn default_serve_timeout() -> u64 {
    600
}

fn default_runs() -> u32 {
    5
}
fn default_timeout() -> u64 {
    1800
}
fn default_near_tie_nats() -> f64 {
    1.0
}
fn default_logprobs() -> u32 {
    5
}

/// The most log-probabilities per step a recipe may request (vLLM's default
/// `max_logprobs` is 20).
pub const MAX_LOGPROBS: u32 = 20;

/// The longest recipe or case name: it names files and GC roots
/// (`roots/<name>`, `.<name>.<pid>.tmp`, `goldens/<name>/`), which must stay
/// under the file system's 255-byte limit with room for those decorations.
pub const MAX_NAME_LEN: usize = 128;

/// The most smoke runs of one case a recipe may ask for.
pub const MAX_RUNS: u32 = 1000;

/// `smoke.probe`: which compiled op, if any, is executed before the cases.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Probe {
    /// `true`: the built-in probe, `<package>._custom_ops.rms_norm` against a
    /// torch (or pure Python) reference; `false`: no probe.
    Builtin(bool),
    /// Another probe: `function(device)` of `module`, run in the oracle venv.
    Custom(CustomProbe),
}

impl Default for Probe {
    fn default() -> Self {
        Probe::Builtin(true)
    }
}

impl<'de> Deserialize<'de> for Probe {
    /// `true`/`false`, or a map that must be a [`CustomProbe`] (its own
    /// errors, unknown keys included, pass through unchanged).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Probe;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false, or {module: ..., function: ...}")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Probe, E> {
                Ok(Probe::Builtin(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Probe, A::Error> {
                CustomProbe::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(Probe::Custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl Probe {
    /// The dotted name of what the probe executes, given the recipe's package
    /// (e.g. `vllm._custom_ops.rms_norm`); `None` when disabled.
    pub fn describe(&self, package: &str) -> Option<String> {
        match self {
            Probe::Builtin(false) => None,
            Probe::Builtin(true) => Some(format!("{package}._custom_ops.rms_norm")),
            Probe::Custom(c) => Some(format!("{}.{}", c.module, c.function)),
        }
    }
}

/// `probe: {module: ..., function: ...}`: a probe the recipe names.
///
/// The driver imports `module` in the oracle venv and calls
/// `function(device)` with the recipe's `build.target_device`. It passes when
/// the call returns a true value, or a dict whose `"ok"` is true (the dict is
/// recorded); it fails when it returns a false value or raises.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CustomProbe {
    /// Importable module, e.g. `vllm._custom_ops` or `mylab.probes`.
    pub module: String,
    /// Function of that module, called with the device name.
    pub function: String,
}

impl Default for Smoke {
    fn default() -> Self {
        Smoke {
            env: BTreeMap::new(),
            runs: default_runs(),
            probe: Probe::default(),
            timeout_s: default_timeout(),
            near_tie_nats: default_near_tie_nats(),
            logprobs: default_logprobs(),
            allow_ptx_jit: false,
            cases: Vec::new(),
            serve: None,
        }
    }
}

/// One gate model run: `LLM(model, revision, **engine_args).generate(prompt)`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Case name, `[a-z0-9._-]+`, unique in the recipe.
    pub name: String,
    /// Model directory; `${VAR}` references are expanded at run time.
    pub model: String,
    /// Hub revision of the model, recorded and passed as `revision=`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Raw prompt text (no chat template). Exactly one of `prompt`,
    /// `prompt_token_ids`, `prompts` and `prompts_file` is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The prompt as token ids (`{"prompt_token_ids": [...]}`), bypassing the tokenizer.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict::opt_vec_u32"
    )]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// Several raw prompts, each generated and compared on its own (one
    /// golden entry per prompt); instead of `prompt` (docs/smoke.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts: Option<Vec<String>>,
    /// A file of prompts, relative to the recipe's directory: a JSON
    /// (`.json`) or YAML (`.yaml`, `.yml`) list of strings, else one prompt
    /// per non-blank line; instead of `prompt` (docs/smoke.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts_file: Option<String>,
    /// `SamplingParams.max_tokens`.
    #[serde(default = "default_max_tokens", deserialize_with = "strict::u32")]
    pub max_tokens: u32,
    /// `eager` (the default: `enforce_eager: true`) or `compiled` (vLLM's
    /// production configuration: no `enforce_eager`, its default
    /// compilation and CUDA graphs). See [`Case::driver_engine_args`].
    #[serde(default, skip_serializing_if = "Mode::is_eager")]
    pub mode: Mode,
    /// Keyword arguments of `LLM(...)`, e.g. `max_model_len: 256`. An
    /// `enforce_eager` here must agree with `mode` (checked at load).
    #[serde(default)]
    pub engine_args: BTreeMap<String, serde_json::Value>,
    /// Extra environment for this case, over `smoke.env`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Golden output, relative to the recipe's directory: a JSON golden (as
    /// written by `smoke --record-golden`, or at least `{"output_token_ids": [...]}`),
    /// or a numpy golden (`greedy_ids.npy`, or a directory holding it, with
    /// `manifest.json` beside it). Unset: `<store>/goldens/<recipe>/<case>.json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub golden: Option<String>,
}

fn default_max_tokens() -> u32 {
    16
}

/// `smoke.cases[i].mode`: how the engine of a case runs.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `enforce_eager: true`: no `torch.compile`, no CUDA graphs (the default).
    #[default]
    Eager,
    /// vLLM's production configuration: `enforce_eager` left to the
    /// engine's default (false), so its default compilation and CUDA graphs.
    Compiled,
}

impl Mode {
    /// Its name in recipes, goldens and `oracle.json`: `eager` or `compiled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::Compiled => "compiled",
        }
    }

    /// Whether it is [`Mode::Eager`], the default (for `skip_serializing_if`).
    pub fn is_eager(&self) -> bool {
        *self == Mode::Eager
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Case {
    /// The keyword arguments the driver passes to `LLM(...)`: `engine_args`
    /// with `enforce_eager: true` added for [`Mode::Eager`]; for
    /// [`Mode::Compiled`] `engine_args` as written (validation refused an
    /// `enforce_eager` other than false, so the engine's default applies).
    pub fn driver_engine_args(&self) -> BTreeMap<String, serde_json::Value> {
        let mut args = self.engine_args.clone();
        if self.mode == Mode::Eager {
            args.insert("enforce_eager".into(), serde_json::Value::Bool(true));
        }
        args
    }
}

/// Target devices vLLM's `VLLM_TARGET_DEVICE` accepts (vllm/envs.py).
pub const TARGET_DEVICES: &[&str] = &["cuda", "rocm", "cpu", "xpu", "tpu", "empty"];

/// The devices vLLM builds for: the values of `VLLM_TARGET_DEVICE` its
/// `setup.py` accepts (vLLM `setup.py`, `envs.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetDevice {
    /// NVIDIA CUDA.
    Cuda,
    /// AMD ROCm.
    Rocm,
    /// CPU only.
    Cpu,
    /// Intel XPU.
    Xpu,
    /// Google TPU.
    Tpu,
    /// No compiled extensions at all.
    Empty,
}

impl TargetDevice {
    /// Every device, in the order of [`TARGET_DEVICES`].
    pub const ALL: [TargetDevice; 6] = [
        TargetDevice::Cuda,
        TargetDevice::Rocm,
        TargetDevice::Cpu,
        TargetDevice::Xpu,
        TargetDevice::Tpu,
        TargetDevice::Empty,
    ];

    /// The device named `name` (a `build.target_device` value), if any.
    pub fn parse(name: &str) -> Option<TargetDevice> {
        TargetDevice::ALL.into_iter().find(|d| d.as_str() == name)
    }

    /// Its `VLLM_TARGET_DEVICE` value.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetDevice::Cuda => "cuda",
            TargetDevice::Rocm => "rocm",
            TargetDevice::Cpu => "cpu",
            TargetDevice::Xpu => "xpu",
            TargetDevice::Tpu => "tpu",
            TargetDevice::Empty => "empty",
        }
    }

    /// Whether the build compiles GPU kernels (CUDA or ROCm): the heavy builds.
    pub fn compiles_kernels(self) -> bool {
        matches!(self, TargetDevice::Cuda | TargetDevice::Rocm)
    }
}

impl Build {
    /// `target_device` as a [`TargetDevice`] (validated when the recipe was
    /// loaded; an unknown value reads as the default, `cuda`).
    pub fn device(&self) -> TargetDevice {
        TargetDevice::parse(&self.target_device).unwrap_or(TargetDevice::Cuda)
    }

    /// The memory one compile job needs for `max_jobs: auto`, in GiB, and
    /// where it comes from: `build.mem_per_job_gib` when set, else the
    /// device's default ([`DEFAULT_MEM_PER_JOB_CUDA_GIB`] for `cuda`,
    /// [`DEFAULT_MEM_PER_JOB_GIB`] for the others).
    pub fn mem_per_job(&self) -> (f64, String) {
        match self.mem_per_job_gib {
            Some(v) => (v, "build.mem_per_job_gib".into()),
            None if self.device() == TargetDevice::Cuda => (
                DEFAULT_MEM_PER_JOB_CUDA_GIB,
                "build.mem_per_job_gib, cuda's default".into(),
            ),
            None => (
                DEFAULT_MEM_PER_JOB_GIB,
                format!(
                    "build.mem_per_job_gib, {}'s default",
                    self.device().as_str()
                ),
            ),
        }
    }
}

/// `build.mem_per_job_gib`'s default for `cuda`: an nvcc job of vLLM's
/// kernels (CUTLASS templates) takes several GiB.
pub const DEFAULT_MEM_PER_JOB_CUDA_GIB: f64 = 4.0;

/// `build.mem_per_job_gib`'s default for every device but `cuda`.
pub const DEFAULT_MEM_PER_JOB_GIB: f64 = 1.0;

/// A recipe together with where it came from.
#[derive(Debug, Clone)]
pub struct LoadedRecipe {
    /// The parsed, validated recipe.
    pub recipe: Recipe,
    /// Where it was read: a file path, or `<builtin>/<file>` for compiled-in recipes.
    pub origin: String,
    /// Directory that relative paths (goldens) resolve against; `None` for built-ins.
    pub dir: Option<PathBuf>,
    /// The exact text, recorded in `oracle.json`.
    pub text: String,
}

/// Reads and validates the recipe at `path`.
///
/// Errors (exit 2): the file is missing or unreadable, the YAML is malformed,
/// a key is unknown, or a field fails validation; each names the file.
pub fn load_file(path: &Path) -> Result<LoadedRecipe> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| bad_input(format!("cannot read recipe {}: {e}", path.display())))?;
    let recipe = parse(&text, &path.display().to_string())?;
    // Recorded absolute (in oracle.json, aliases, reports) so it still names
    // the file from another directory.
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    Ok(LoadedRecipe {
        recipe,
        origin: abs.display().to_string(),
        dir: abs.parent().map(Path::to_path_buf),
        text,
    })
}

/// Parses and validates recipe `text`; `origin` names it in errors.
///
/// Errors (exit 2): malformed YAML, unknown keys, wrong types, invalid values.
pub fn parse(text: &str, origin: &str) -> Result<Recipe> {
    let recipe: Recipe =
        serde_saphyr::from_str(text).map_err(|e| bad_input(errors::describe(&e, text, origin)))?;
    validate(&recipe, text, origin)?;
    Ok(recipe)
}

/// The prefix of the GC roots of aliases (`roots/alias-<name>-<hash>`, see
/// `alias::root_name`); no recipe name may start with it, so a recipe's root
/// `roots/<name>` can never be an alias's root.
pub const ALIAS_ROOT_PREFIX: &str = "alias-";

/// How a printed command names the recipe `lr`: its file, absolute and
/// shell-quoted, when it was read from one (so the command runs from any
/// directory); else (a built-in recipe) its name.
pub fn shell_arg(lr: &LoadedRecipe) -> String {
    use crate::shell::shell_quote;
    match &lr.dir {
        Some(_) => {
            let file = std::path::Path::new(&lr.origin);
            let abs = file
                .canonicalize()
                .or_else(|_| std::path::absolute(file))
                .unwrap_or_else(|_| file.to_path_buf());
            shell_quote(&abs.display().to_string())
        }
        None => shell_quote(&lr.recipe.name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "name: t\nsource:\n  repo: file:///x\n  commit: 5559679229bc961848b121ccdeaa8fa5d79bec98\npython: \"3.11\"\npins: {torch: 2.13.0, transformers: 5.10}\nbuild:\n  max_jobs: 6\n";

    #[test]
    fn a_with_entry_is_an_exact_pep508_pin() {
        assert_eq!(
            parse_with("Pandas==2.2.3"),
            Ok(("pandas".to_string(), "2.2.3".to_string()))
        );
        for bad in [
            "pandas",
            "pandas>=2",
            "pandas==2.*",
            "pandas[x]==2.2.3",
            "pandas==2.2.3; python_version<'3'",
            "pandas==2,<3",
            "==",
        ] {
            assert!(parse_with(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_versions_as_written() {
        let r = parse(GOOD, "t.yaml").unwrap();
        assert_eq!(r.pins["torch"], "2.13.0");
        assert_eq!(r.pins["transformers"], "5.10");
        assert_eq!(r.build.max_jobs, "6");
        assert_eq!(r.source.package, "vllm");
    }

    #[test]
    fn short_commit_names_line_and_field() {
        let text = GOOD.replace("5559679229bc961848b121ccdeaa8fa5d79bec98", "abc123");
        let e = parse(&text, "t.yaml").unwrap_err().to_string();
        assert!(e.contains("t.yaml: line 4: field `source.commit`"), "{e}");
    }

    #[test]
    fn unknown_key_is_an_error() {
        let e = parse(&format!("{GOOD}colour: blue\n"), "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("colour"), "{e}");
    }

    fn with_smoke(smoke: &str) -> Result<Recipe> {
        parse(&format!("{GOOD}smoke:\n{smoke}"), "t.yaml")
    }

    const CASE: &str = "  cases:\n    - name: c\n      model: /m\n";

    #[test]
    fn smoke_defaults_and_probe_forms() {
        let r = with_smoke(&format!("  runs: 2\n{CASE}      prompt: hi\n")).unwrap();
        assert_eq!(r.smoke.probe, Probe::Builtin(true));
        assert_eq!(r.smoke.near_tie_nats, 1.0);
        assert_eq!(r.smoke.logprobs, 5);
        assert_eq!(
            r.smoke.probe.describe("vllm").as_deref(),
            Some("vllm._custom_ops.rms_norm")
        );
        let off = with_smoke("  probe: false\n").unwrap();
        assert_eq!(off.smoke.probe.describe("vllm"), None);
        let custom = with_smoke("  probe: {module: lab.probes, function: gemm}\n").unwrap();
        assert_eq!(
            custom.smoke.probe.describe("vllm").as_deref(),
            Some("lab.probes.gemm")
        );
    }

    #[test]
    fn smoke_serve_names_offline_cases_and_refuses_what_the_gate_sets() {
        let case = format!("{CASE}      prompt: hi\n");
        let r = with_smoke(&format!("{case}  serve:\n    cases: [c]\n")).unwrap();
        let s = r.smoke.serve.unwrap();
        assert_eq!((s.command.as_str(), s.timeout_s), ("vllm", 600));
        assert!(s.args.is_empty());
        assert!(with_smoke(&case).unwrap().smoke.serve.is_none());
        for (serve, field, value) in [
            (
                "{cases: [nope]}",
                "smoke.serve.cases[0]",
                "\"nope\" is not a case",
            ),
            ("{cases: [c, c]}", "smoke.serve.cases[1]", "listed twice"),
            ("{cases: []}", "smoke.serve.cases", "names no case"),
            (
                "{cases: [c], command: ../bin/sh}",
                "smoke.serve.command",
                "../bin/sh",
            ),
            (
                "{cases: [c], args: [--port=9]}",
                "smoke.serve.args[0]",
                "--port=9",
            ),
            (
                "{cases: [c], args: [--hos, 0.0.0.0]}",
                "smoke.serve.args[0]",
                "--hos",
            ),
            (
                "{cases: [c], timeout_s: 0}",
                "smoke.serve.timeout_s",
                "at least 1",
            ),
            ("{cases: [c], host: x}", "smoke.serve.host", "unknown key"),
        ] {
            let e = with_smoke(&format!("{case}  serve: {serve}\n")).unwrap_err();
            assert_eq!(crate::exit::code_of(&e), 2, "{serve}: {e:#}");
            let e = format!("{e:#}");
            assert!(
                e.contains("t.yaml") && e.contains(field) && e.contains(value),
                "{serve}: {e}"
            );
        }
        // A case of several prompts is not served (one request a case).
        let several = format!("{CASE}      prompts: [hi, there]\n");
        let e = with_smoke(&format!("{several}  serve: {{cases: [c]}}\n")).unwrap_err();
        assert_eq!(crate::exit::code_of(&e), 2, "{e:#}");
        let e = format!("{e:#}");
        assert!(
            e.contains("t.yaml")
                && e.contains("smoke.serve.cases[0]")
                && e.contains("holds several prompts"),
            "{e}"
        );
    }

    #[test]
    fn allow_ptx_jit_is_a_cuda_boolean() {
        assert!(!with_smoke("  runs: 1\n").unwrap().smoke.allow_ptx_jit);
        assert!(
            with_smoke("  allow_ptx_jit: true\n")
                .unwrap()
                .smoke
                .allow_ptx_jit
        );
        let e = with_smoke("  allow_ptx_jit: \"sure\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("allow_ptx_jit"), "{e}");
        let cpu = GOOD.replace("  max_jobs: 6\n", "  max_jobs: 6\n  target_device: cpu\n");
        let e = parse(&format!("{cpu}smoke:\n  allow_ptx_jit: true\n"), "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("smoke.allow_ptx_jit") && e.contains("cpu"),
            "{e}"
        );
    }

    #[test]
    fn bad_smoke_settings_name_the_field() {
        let e = with_smoke("  probe: {module: lab.probes, colour: red}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("colour"), "{e}");
        let e = with_smoke("  probe: {module: \"lab probes\", function: f}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("smoke.probe.module"), "{e}");
        let e = with_smoke("  near_tie_nats: -1\n").unwrap_err().to_string();
        assert!(e.contains("smoke.near_tie_nats"), "{e}");
        let e = with_smoke("  logprobs: 50\n").unwrap_err().to_string();
        assert!(e.contains("smoke.logprobs"), "{e}");
        let both = format!("{CASE}      prompt: hi\n      prompt_token_ids: [1, 2]\n");
        let e = with_smoke(&both).unwrap_err().to_string();
        assert!(e.contains("exactly one of `prompt`"), "{e}");
        let e = with_smoke(CASE).unwrap_err().to_string();
        assert!(e.contains("exactly one of `prompt`"), "{e}");
        let several = format!("{CASE}      prompts: [\"a b\", \"c\"]\n");
        assert_eq!(
            with_smoke(&several).unwrap().smoke.cases[0].prompts,
            Some(vec!["a b".to_string(), "c".to_string()])
        );
        let e = with_smoke(&format!("{several}      prompt: hi\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("smoke.cases[0].prompts") && e.contains("exactly one of"),
            "{e}"
        );
        let e = with_smoke(&format!("{CASE}      prompts: [\"a\", \"\"]\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("smoke.cases[0].prompts[1]"), "{e}");
        let file = format!("{CASE}      prompts_file: prompts.txt\n");
        assert_eq!(
            with_smoke(&file).unwrap().smoke.cases[0]
                .prompts_file
                .as_deref(),
            Some("prompts.txt")
        );
        let ids = format!("{CASE}      prompt_token_ids: [2, 3]\n");
        assert_eq!(
            with_smoke(&ids).unwrap().smoke.cases[0].prompt_token_ids,
            Some(vec![2, 3])
        );
    }

    #[test]
    fn a_case_mode_sets_enforce_eager_and_a_contradiction_is_refused() {
        let case = |extra: &str| format!("{CASE}      prompt: hi\n{extra}");
        let eager = with_smoke(&case("")).unwrap();
        let c = &eager.smoke.cases[0];
        assert_eq!(c.mode, Mode::Eager);
        assert_eq!(c.driver_engine_args()["enforce_eager"], true);
        let compiled = with_smoke(&case(
            "      mode: compiled\n      engine_args: {max_model_len: 256}\n",
        ))
        .unwrap();
        let c = &compiled.smoke.cases[0];
        assert_eq!(c.mode, Mode::Compiled);
        assert!(!c.driver_engine_args().contains_key("enforce_eager"));
        // Serialized only when compiled: eager recipes keep their smoke keys.
        assert!(serde_json::to_value(c).unwrap()["mode"] == "compiled");
        assert!(
            serde_json::to_value(&eager.smoke.cases[0])
                .unwrap()
                .get("mode")
                .is_none()
        );
        for ok in [
            "      mode: compiled\n      engine_args: {enforce_eager: false}\n",
            "      mode: eager\n      engine_args: {enforce_eager: true}\n",
            "      engine_args: {enforce_eager: true}\n",
        ] {
            assert!(with_smoke(&case(ok)).is_ok(), "{ok}");
        }
        for (bad, says) in [
            (
                "      mode: compiled\n      engine_args: {enforce_eager: true}\n",
                "contradicts `mode: compiled`",
            ),
            (
                "      engine_args: {enforce_eager: false}\n",
                "contradicts `mode: eager`",
            ),
            (
                "      mode: compiled\n      engine_args: {enforce_eager: \"no\"}\n",
                "is not true or false",
            ),
        ] {
            let e = with_smoke(&case(bad)).unwrap_err();
            assert_eq!(crate::exit::code_of(&e), 2, "{e}");
            let e = e.to_string();
            assert!(
                e.contains("t.yaml: line ")
                    && e.contains("field `smoke.cases[0].engine_args.enforce_eager`")
                    && e.contains("case \"c\"")
                    && e.contains(says),
                "{e}"
            );
        }
        let e = with_smoke(&case("      mode: graphs\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("mode") && e.contains("graphs"), "{e}");
    }

    #[test]
    fn the_builtin_parity_pin_runs_each_gate_model_eager_compiled_and_served_with_pandas() {
        let (file, text) = pin::BUILTIN
            .iter()
            .find(|(f, _)| *f == "555967922.yaml")
            .unwrap();
        let r = parse(text, file).unwrap();
        assert_eq!(r.install.with, ["pandas==2.2.3"]);
        let models: std::collections::BTreeSet<&str> =
            r.smoke.cases.iter().map(|c| c.model.as_str()).collect();
        assert_eq!(models.len(), 2, "{models:?}");
        for model in models {
            let modes: Vec<(Mode, bool)> = r
                .smoke
                .cases
                .iter()
                .filter(|c| c.model == model)
                .map(|c| {
                    (
                        c.mode,
                        c.driver_engine_args().get("enforce_eager") == Some(&true.into()),
                    )
                })
                .collect();
            assert!(modes.contains(&(Mode::Eager, true)), "{model}: {modes:?}");
            assert!(
                r.smoke.cases.iter().any(|c| c.model == model
                    && c.mode == Mode::Compiled
                    && !c.driver_engine_args().contains_key("enforce_eager")),
                "{model}: {modes:?}"
            );
            // Served as the harness runs it: its compiled case, online.
            let serve = r
                .smoke
                .serve
                .as_ref()
                .expect("the parity pin serves its models");
            assert!(
                r.smoke.cases.iter().any(|c| c.model == model
                    && c.mode == Mode::Compiled
                    && serve.cases.contains(&c.name)),
                "{model}: {:?}",
                serve.cases
            );
        }
    }

    #[test]
    fn names_reject_traversal() {
        assert!(!is_valid_name("../x"));
        assert!(!is_valid_name("a/b"));
        assert!(!is_valid_name(".."));
        assert!(is_valid_name("vllm-555967922"));
    }

    #[test]
    fn expands_only_set_variables() {
        assert_eq!(expand_env("/m/x").unwrap(), "/m/x");
        let e = expand_env("${ORACLE_BUILD_SURELY_UNSET_VAR}/m").unwrap_err();
        assert!(e.contains("ORACLE_BUILD_SURELY_UNSET_VAR"));
    }

    /// Name, source and python only: 5 lines.
    const BASE: &str = "name: t\nsource:\n  repo: file:///x\n  commit: 5559679229bc961848b121ccdeaa8fa5d79bec98\npython: \"3.11\"\n";

    /// The error text of `parse` on `BASE` plus `extra` (which starts at line 6).
    fn error_of(extra: &str) -> String {
        parse(&format!("{BASE}{extra}"), "r.yaml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn an_empty_or_repeated_extra_is_refused_naming_its_index() {
        let ok = parse(
            &format!("{BASE}install:\n  extras: [bench, audio]\n"),
            "r.yaml",
        )
        .unwrap();
        assert_eq!(ok.install.extras, ["bench", "audio"]);
        let e = error_of("install:\n  extras: [\"\"]\n");
        assert!(
            e.contains("`install.extras[0]`") && e.contains("not an extra name"),
            "{e}"
        );
        // PEP 685: `Audio` and `audio` are one extra.
        let e = error_of("install:\n  extras: [audio, Audio]\n");
        assert!(
            e.contains("`install.extras[1]`") && e.contains("again") && e.contains("extras[0]"),
            "{e}"
        );
    }

    #[test]
    fn optional_missing_ok_names_targets_with_their_line() {
        let ok = parse(
            &format!("{BASE}build:\n  target_device: cpu\n  optional_missing_ok: [vllm._rust_tool_parser, vllm.vllm-rs]\n"),
            "r.yaml",
        )
        .unwrap();
        assert_eq!(
            ok.build.optional_missing_ok,
            ["vllm._rust_tool_parser", "vllm.vllm-rs"]
        );
        let e = error_of(
            "build:\n  target_device: cpu\n  optional_missing_ok:\n    - vllm.ok\n    - \"vllm rs\"\n",
        );
        assert!(
            e.starts_with("r.yaml: line 10: field `build.optional_missing_ok[1]`: \"vllm rs\""),
            "{e}"
        );
        let e = error_of("build:\n  optional_missing_ok: [a.b, a.b]\n");
        assert!(
            e.contains("`build.optional_missing_ok[1]`") && e.contains("listed twice"),
            "{e}"
        );
        let e = error_of("build:\n  optional_missing_ok: [\"\"]\n");
        assert!(e.contains("`build.optional_missing_ok[0]`"), "{e}");
        let e = error_of("build:\n  optional_missing_ok: vllm.x\n");
        assert!(e.contains("optional_missing_ok"), "{e}");
        assert_plain(&e);
    }

    #[test]
    fn expect_kernel_families_are_names_with_their_line() {
        let ok = parse(
            &format!("{BASE}expect:\n  kernel_families: [\"SM12x NVFP4\", moe_data]\n"),
            "r.yaml",
        )
        .unwrap();
        assert_eq!(ok.expect.kernel_families, ["SM12x NVFP4", "moe_data"]);
        let e = error_of("expect:\n  kernel_families:\n    - moe_data\n    - \"\"\n");
        assert!(
            e.starts_with(
                "r.yaml: line 9: field `expect.kernel_families[1]`: \"\" is not a kernel family"
            ),
            "{e}"
        );
        let e = error_of("expect:\n  kernel_families: [\" SM12x NVFP4\"]\n");
        assert!(e.contains("`expect.kernel_families[0]`"), "{e}");
        let e = error_of("expect:\n  kernel_families: [a, a]\n");
        assert!(e.contains("listed twice"), "{e}");
        let e = error_of("expect:\n  kernel_families: SM12x NVFP4\n");
        assert!(e.contains("kernel_families"), "{e}");
        assert_plain(&e);
    }
    /// Rust type names and serde-saphyr's advice must never reach the user.
    fn assert_plain(e: &str) {
        for internal in [
            "u32",
            "u64",
            "Option<",
            "DuplicateKeyPolicy",
            "Options",
            "sequence start",
            "mapping start",
            "deserialize",
            "struct ",
        ] {
            assert!(!e.contains(internal), "{internal:?} in {e}");
        }
    }

    #[test]
    fn parse_errors_name_file_line_and_field_in_plain_words() {
        let cases = [
            (
                "smoke:\n  runs: -1\n",
                "r.yaml: line 7: field `smoke.runs`: -1 is negative",
            ),
            (
                "indexes: \"x\"\n",
                "r.yaml: line 6: field `indexes`: expected a list",
            ),
            (
                "python: \"3.12\"\n",
                "r.yaml: line 6: field `python`: `python` is given twice in the same mapping (first at line 5)",
            ),
            (
                "colour: blue\n",
                "r.yaml: line 6: field `colour`: unknown key `colour` (allowed keys here: name, source, python,",
            ),
            (
                "smoke:\n  cases:\n    - {name: a, model: /m, prompt: x}\n    - name: b\n      model: /m\n      max_tokens: [1]\n",
                "r.yaml: line 11: field `smoke.cases[1].max_tokens`: expected a number, found a list",
            ),
            (
                "build:\n  env: {A: [1]}\n",
                "r.yaml: line 7: field `build.env.A`: expected a text value, found a list",
            ),
            (
                "pins2: {torch: 2.1, torch: 2.2}\n",
                "r.yaml: line 6: field `pins2`: unknown key",
            ),
            (
                "expect: {torch_version: 2.1, torch_version: 2.2}\n",
                "r.yaml: line 6: field `expect.torch_version`: `torch_version` is given twice",
            ),
            (
                "smoke:\n  probe: {module: a}\n",
                "r.yaml: line 7: field `smoke.probe.function`: is required but missing",
            ),
            (
                "build:\n  mode: fast\n",
                "r.yaml: line 7: field `build.mode`: `fast` is not one of: source, precompiled",
            ),
        ];
        for (extra, want) in cases {
            let e = error_of(extra);
            assert!(e.starts_with(want), "{extra:?}:\n{e}\nwant {want}");
            assert_plain(&e);
        }
        let e = parse(
            &GOOD.replace("  max_jobs: 6\n", "  max_jobs: 6\n  nvcc_threads:\n"),
            "r.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("r.yaml: line 9: field `build.nvcc_threads`: has no value"),
            "{e}"
        );
        let e = parse(
            &GOOD.replace("  commit:", "  package:\n  commit:"),
            "r.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("r.yaml: line 4: field `source.package`: has no value"),
            "{e}"
        );
        assert_plain(&e);
        let e = parse("", "r.yaml").unwrap_err().to_string();
        assert!(e.contains("the recipe is empty"), "{e}");
    }

    #[test]
    fn quoted_numbers_are_refused() {
        for (extra, field) in [
            ("smoke:\n  runs: \"3\"\n", "smoke.runs"),
            ("smoke:\n  timeout_s: '60'\n", "smoke.timeout_s"),
            ("smoke:\n  near_tie_nats: \"1.0\"\n", "smoke.near_tie_nats"),
            ("build:\n  nvcc_threads: \"2\"\n", "build.nvcc_threads"),
            (
                "build:\n  disk: {wheel_gib: \"3\"}\n",
                "build.disk.wheel_gib",
            ),
        ] {
            let e = error_of(extra);
            assert!(
                e.contains(&format!("field `{field}`: ")) && e.contains("quoted string"),
                "{e}"
            );
        }
        let ids = format!("smoke:\n{CASE}      prompt_token_ids: [1, \"2\"]\n");
        let e = error_of(&ids);
        assert!(
            e.contains("field `smoke.cases[0].prompt_token_ids[1]`: \"2\" is a quoted string"),
            "{e}"
        );
        // Unquoted, they are numbers as before.
        let r = with_smoke("  runs: 3\n  near_tie_nats: 0.5\n").unwrap();
        assert_eq!((r.smoke.runs, r.smoke.near_tie_nats), (3, 0.5));
    }

    #[test]
    fn pins_are_exact_versions() {
        for ok in [
            "2.13.0",
            "0.6.15.post1",
            "2.13.0+cu130",
            "1!2.0rc1.dev3",
            "5.10",
            "2.0a1",
        ] {
            assert!(is_exact_version(ok), "{ok}");
        }
        for bad in [
            ">=20",
            "==20",
            "20, 21",
            "2.*",
            "2.0 ; python_version<'3'",
            "",
            " 2.0",
            "~=2.0",
            "2.0,<3",
        ] {
            assert!(!is_exact_version(bad), "{bad}");
        }
        let e = error_of("pins: {packaging: \">=20\"}\n");
        assert!(
            e.starts_with(
                "r.yaml: line 6: field `pins.packaging`: \">=20\" is not an exact version"
            ),
            "{e}"
        );
    }

    #[test]
    fn build_env_may_not_set_what_the_tool_controls() {
        for (key, names) in [
            ("SETUPTOOLS_SCM_PRETEND_VERSION", "source.commit"),
            ("SETUPTOOLS_SCM_PRETEND_VERSION_FOR_VLLM", "source.commit"),
            ("VLLM_VERSION_OVERRIDE", "source.commit"),
            ("VLLM_USE_PRECOMPILED", "build.mode"),
            ("VLLM_TARGET_DEVICE", "build.target_device"),
            ("NVCC_THREADS", "build.nvcc_threads"),
            ("TORCH_CUDA_ARCH_LIST", "build.cuda_arch_list"),
        ] {
            let e = error_of(&format!("build:\n  env: {{{key}: \"1\"}}\n"));
            assert!(
                e.contains(&format!("line 7: field `build.env.{key}`")) && e.contains(names),
                "{e}"
            );
        }
        assert!(parse(&format!("{BASE}build:\n  env: {{CC: gcc}}\n"), "r.yaml").is_ok());
    }

    #[test]
    fn smoke_env_may_not_set_what_the_gate_confines() {
        for key in CONFINED_SMOKE_VARS {
            let e = error_of(&format!("smoke:\n  env: {{{key}: /x}}\n"));
            assert!(
                e.contains(&format!("line 7: field `smoke.env.{key}`"))
                    && e.contains("oracle-build itself"),
                "{e}"
            );
        }
        let e = error_of(
            "smoke:\n  cases:\n    - name: a\n      model: /m\n      prompt: hi\n      env: {TORCHINDUCTOR_CACHE_DIR: /x}\n",
        );
        assert!(
            e.contains("field `smoke.cases[0].env.TORCHINDUCTOR_CACHE_DIR`"),
            "{e}"
        );
        let ok = format!("{BASE}smoke:\n  env: {{VLLM_CPU_KVCACHE_SPACE: \"4\"}}\n");
        assert!(parse(&ok, "r.yaml").is_ok());
    }

    #[test]
    fn names_of_alias_roots_are_reserved() {
        let text = BASE.replacen("name: ", "name: alias-", 1);
        let e = parse(&text, "r.yaml").unwrap_err().to_string();
        assert!(e.contains("field `name`") && e.contains("reserved"), "{e}");
    }

    #[test]
    fn env_errors_name_the_key() {
        let e = error_of("build:\n  env: {\"A=B\": x}\n");
        assert!(e.contains("field `build.env.A=B`"), "{e}");
        let e = error_of("smoke:\n  env:\n    OK: x\n    \"=\": y\n");
        assert!(e.contains("line 9: field `smoke.env.=`"), "{e}");
        let two = format!(
            "smoke:\n{CASE}      prompt: x\n    - name: d\n      model: /m\n      prompt: x\n      env: {{\"X=1\": y}}\n"
        );
        let e = error_of(&two);
        assert!(e.contains("line 14: field `smoke.cases[1].env.X=1`"), "{e}");
    }

    #[test]
    fn model_references_must_be_well_formed() {
        for (model, why) in [
            ("${FX_MODELS", "without its closing"),
            ("${}/m", "not a variable name"),
            ("${1X}/m", "not a variable name"),
            ("/m/${A-B}", "not a variable name"),
        ] {
            let e = with_smoke(&format!(
                "  cases:\n    - name: c\n      model: {model}\n      prompt: hi\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("line 12: field `smoke.cases[0].model`") && e.contains(why),
                "{model}: {e}"
            );
            assert!(expand_env(model).is_err());
        }
        with_smoke("  cases:\n    - name: c\n      model: ${_A1}/x/${B}\n      prompt: hi\n")
            .unwrap();
    }
}
