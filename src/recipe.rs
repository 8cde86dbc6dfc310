//! Recipes: the human-written YAML description of one pin (DESIGN.md, "Recipe").
//!
//! A [`Recipe`] is parsed strictly (unknown keys are errors) and then validated;
//! every error names the file, the line and the field, and maps to exit code 2.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::exit::bad_input;

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
    /// Extra package indexes, highest priority first (uv `--index`).
    #[serde(default)]
    pub indexes: Vec<String>,
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
}

fn default_package() -> String {
    "vllm".into()
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
    /// `auto` (the number of CPUs) or a positive integer; exported as `MAX_JOBS`.
    #[serde(default = "default_auto")]
    pub max_jobs: String,
    /// Exported as `NVCC_THREADS`.
    #[serde(default = "default_one")]
    pub nvcc_threads: u32,
    /// Extra build environment, recorded in `build.json` and part of the wheel key.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Disk each stage needs, for the preflight; defaults by target device.
    #[serde(default)]
    pub disk: Disk,
}

/// `build.disk:` free space each stage needs before it starts, in GiB.
/// Absent fields default by target device (vLLM CUDA: CONTEXT.md "Costs").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Disk {
    /// The mirror and checkout (vLLM with history: ~0.9 GiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_gib: Option<f64>,
    /// Building the wheel (vLLM CUDA: >= 18 GiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wheel_gib: Option<f64>,
    /// One oracle venv (vLLM CUDA: 15-20 GiB).
    #[serde(skip_serializing_if = "Option::is_none")]
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
            nvcc_threads: 1,
            env: BTreeMap::new(),
            disk: Disk::default(),
        }
    }
}

/// `expect:` identity fields a correct oracle must report (DESIGN.md "Identity").
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
}

/// `smoke:` the gate run (DESIGN.md "Smoke and the gate").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Smoke {
    /// Environment for every case, e.g. `VLLM_ENABLE_V1_MULTIPROCESSING: "0"`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Greedy batch-1 generations per case; all must agree.
    #[serde(default = "default_runs")]
    pub runs: u32,
    /// Execute one compiled custom op on the device before the cases:
    /// `true` (`<package>._custom_ops.rms_norm` against a reference), `false`,
    /// or `{module: ..., function: ...}` naming another probe.
    #[serde(default)]
    pub probe: Probe,
    /// Wall-clock limit per case process, in seconds.
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    /// A golden mismatch whose two tokens are within this many nats (natural-log
    /// probability) of each other at the first divergent step is flagged a near-tie.
    #[serde(default = "default_near_tie_nats")]
    pub near_tie_nats: f64,
    /// Top-k log-probabilities requested per generated token
    /// (`SamplingParams(logprobs=k)`); 0 requests none (no gaps can be reported).
    #[serde(default = "default_logprobs")]
    pub logprobs: u32,
    /// The gate models.
    #[serde(default)]
    pub cases: Vec<Case>,
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
            cases: Vec::new(),
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
    /// Raw prompt text (no chat template). Exactly one of `prompt` and
    /// `prompt_token_ids` is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The prompt as token ids (`{"prompt_token_ids": [...]}`), bypassing the tokenizer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// `SamplingParams.max_tokens`.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Keyword arguments of `LLM(...)`, e.g. `enforce_eager: true`.
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

/// Target devices vLLM's `VLLM_TARGET_DEVICE` accepts (vllm/envs.py).
pub const TARGET_DEVICES: &[&str] = &["cuda", "rocm", "cpu", "xpu", "tpu", "empty"];

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
    Ok(LoadedRecipe {
        recipe,
        origin: path.display().to_string(),
        dir: path.parent().map(Path::to_path_buf),
        text,
    })
}

/// Parses and validates recipe `text`; `origin` names it in errors.
///
/// Errors (exit 2): malformed YAML, unknown keys, wrong types, invalid values.
pub fn parse(text: &str, origin: &str) -> Result<Recipe> {
    let recipe: Recipe = serde_saphyr::from_str(text)
        .map_err(|e| bad_input(format!("{origin}: invalid recipe: {e}")))?;
    validate(&recipe, text, origin)?;
    Ok(recipe)
}

/// Whether `s` is a valid recipe or case name: `[a-z0-9._-]+`, not `.` or `..`.
pub fn is_valid_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && !s.contains("..")
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
}

/// Whether `s` is a full lowercase 40-hex git commit id.
pub fn is_full_commit(s: &str) -> bool {
    s.len() == 40
        && s.chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

fn validate(r: &Recipe, text: &str, origin: &str) -> Result<()> {
    let fail = |field: &str, msg: String| -> anyhow::Error {
        let line = locate(text, field).map_or(String::new(), |l| format!("line {l}: "));
        bad_input(format!("{origin}: {line}field `{field}`: {msg}"))
    };
    if !is_valid_name(&r.name) {
        return Err(fail(
            "name",
            format!(
                "{:?} is not a valid name (use [a-z0-9._-], no `/` or `..`)",
                r.name
            ),
        ));
    }
    if !is_full_commit(&r.source.commit) {
        return Err(fail(
            "source.commit",
            format!(
                "{:?} is not a full 40-hex lowercase commit id",
                r.source.commit
            ),
        ));
    }
    if r.source.repo.trim().is_empty() {
        return Err(fail("source.repo", "must not be empty".into()));
    }
    let pkg = &r.source.package;
    if pkg.is_empty() || !pkg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(fail(
            "source.package",
            format!("{pkg:?} is not an importable package name"),
        ));
    }
    let py_ok = r
        .python
        .split_once('.')
        .is_some_and(|(a, b)| a == "3" && !b.is_empty() && b.chars().all(|c| c.is_ascii_digit()));
    if !py_ok {
        return Err(fail(
            "python",
            format!("{:?} is not a Python version like \"3.12\"", r.python),
        ));
    }
    for (name, version) in &r.pins {
        if version.trim().is_empty() || version.contains(char::is_whitespace) {
            return Err(fail(
                &format!("pins.{name}"),
                format!("{version:?} is not a version"),
            ));
        }
    }
    let b = &r.build;
    if !TARGET_DEVICES.contains(&b.target_device.as_str()) {
        return Err(fail(
            "build.target_device",
            format!(
                "{:?} is not one of {}",
                b.target_device,
                TARGET_DEVICES.join(", ")
            ),
        ));
    }
    if b.max_jobs != "auto" && b.max_jobs.parse::<u32>().map_or(true, |n| n == 0) {
        return Err(fail(
            "build.max_jobs",
            format!("{:?} is not `auto` or a positive integer", b.max_jobs),
        ));
    }
    if b.nvcc_threads == 0 {
        return Err(fail("build.nvcc_threads", "must be at least 1".into()));
    }
    let arch_ok = b.cuda_arch_list == "auto"
        || b.cuda_arch_list
            .split([';', ' '])
            .filter(|s| !s.is_empty())
            .all(|a| {
                let a = a.trim_end_matches("+PTX").trim_end_matches(['a', 'f']);
                a.split_once('.').is_some_and(|(x, y)| {
                    !x.is_empty()
                        && x.chars().all(|c| c.is_ascii_digit())
                        && y.chars().all(|c| c.is_ascii_digit())
                })
            });
    if !arch_ok {
        return Err(fail(
            "build.cuda_arch_list",
            format!(
                "{:?} is not `auto` or a list like \"9.0a;12.1a\"",
                b.cuda_arch_list
            ),
        ));
    }
    for (field, v) in [
        ("source_gib", b.disk.source_gib),
        ("wheel_gib", b.disk.wheel_gib),
        ("venv_gib", b.disk.venv_gib),
    ] {
        if v.is_some_and(|v| !(v >= 0.0 && v.is_finite())) {
            return Err(fail(
                &format!("build.disk.{field}"),
                format!("{v:?} is not a size in GiB"),
            ));
        }
    }
    for key in b.env.keys().chain(r.smoke.env.keys()) {
        if key.is_empty() || key.contains('=') {
            return Err(fail(
                "env",
                format!("{key:?} is not an environment variable name"),
            ));
        }
    }
    if r.smoke.runs == 0 {
        return Err(fail("smoke.runs", "must be at least 1".into()));
    }
    if r.smoke.timeout_s == 0 {
        return Err(fail("smoke.timeout_s", "must be at least 1".into()));
    }
    if !(r.smoke.near_tie_nats.is_finite() && r.smoke.near_tie_nats > 0.0) {
        return Err(fail(
            "smoke.near_tie_nats",
            format!("{} is not a positive number of nats", r.smoke.near_tie_nats),
        ));
    }
    if r.smoke.logprobs > MAX_LOGPROBS {
        return Err(fail(
            "smoke.logprobs",
            format!(
                "{} is more than {MAX_LOGPROBS} (vLLM's max_logprobs)",
                r.smoke.logprobs
            ),
        ));
    }
    if let Probe::Custom(p) = &r.smoke.probe {
        let dotted = |s: &str| {
            !s.is_empty()
                && s.split('.').all(|part| {
                    !part.is_empty()
                        && !part.starts_with(|c: char| c.is_ascii_digit())
                        && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
        };
        if !dotted(&p.module) {
            return Err(fail(
                "smoke.probe.module",
                format!("{:?} is not an importable module name", p.module),
            ));
        }
        if !dotted(&p.function) || p.function.contains('.') {
            return Err(fail(
                "smoke.probe.function",
                format!("{:?} is not a function name", p.function),
            ));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for case in &r.smoke.cases {
        if !is_valid_name(&case.name) {
            return Err(fail(
                "smoke.cases.name",
                format!("{:?} is not a valid case name", case.name),
            ));
        }
        if !seen.insert(case.name.as_str()) {
            return Err(fail(
                "smoke.cases.name",
                format!("{:?} appears twice", case.name),
            ));
        }
        if case.model.trim().is_empty() {
            return Err(fail(
                "smoke.cases.model",
                format!("case {:?} has an empty model", case.name),
            ));
        }
        match (&case.prompt, &case.prompt_token_ids) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(fail(
                    "smoke.cases.prompt",
                    format!(
                        "case {:?}: give exactly one of `prompt` (text) and `prompt_token_ids`",
                        case.name
                    ),
                ));
            }
            (Some(p), None) if p.is_empty() => {
                return Err(fail(
                    "smoke.cases.prompt",
                    format!("case {:?}: the prompt is empty", case.name),
                ));
            }
            (None, Some(ids)) if ids.is_empty() => {
                return Err(fail(
                    "smoke.cases.prompt_token_ids",
                    format!("case {:?}: the prompt has no token ids", case.name),
                ));
            }
            _ => {}
        }
        if case.golden.as_deref().is_some_and(|g| g.trim().is_empty()) {
            return Err(fail(
                "smoke.cases.golden",
                format!("case {:?}: the golden path is empty", case.name),
            ));
        }
        for key in case.env.keys() {
            if key.is_empty() || key.contains('=') {
                return Err(fail(
                    "smoke.cases.env",
                    format!(
                        "case {:?}: {key:?} is not an environment variable name",
                        case.name
                    ),
                ));
            }
        }
        if case.max_tokens == 0 {
            return Err(fail(
                "smoke.cases.max_tokens",
                format!("case {:?}: must be at least 1", case.name),
            ));
        }
    }
    Ok(())
}

/// The 1-based line where the dotted `field` (e.g. `source.commit`) is written
/// in `text`, found by following the keys down the indentation. `None` when absent.
pub fn locate(text: &str, field: &str) -> Option<usize> {
    let mut parts = field.split('.').peekable();
    let mut want = parts.next()?;
    let mut min_indent = 0usize;
    let mut found = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start_matches([' ', '-']);
        let indent = line.len() - trimmed.len();
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        if found.is_some() && indent < min_indent {
            break;
        }
        if indent >= min_indent
            && trimmed
                .strip_prefix(want)
                .is_some_and(|r| r.starts_with(':'))
        {
            found = Some(i + 1);
            match parts.next() {
                Some(next) => {
                    want = next;
                    min_indent = indent + 1;
                }
                None => return found,
            }
        }
    }
    found
}

/// Expands `${VAR}` references in `s` (used only for model paths).
///
/// Errors: a referenced variable is unset; the message names it.
pub fn expand_env(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unterminated ${{ in {s:?}"))?;
        let var = &after[..end];
        let value = std::env::var(var)
            .map_err(|_| format!("{s:?} refers to ${{{var}}}, which is not set"))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "name: t\nsource:\n  repo: file:///x\n  commit: 5559679229bc961848b121ccdeaa8fa5d79bec98\npython: \"3.11\"\npins: {torch: 2.13.0, transformers: 5.10}\nbuild:\n  max_jobs: 6\n";

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
        let ids = format!("{CASE}      prompt_token_ids: [2, 3]\n");
        assert_eq!(
            with_smoke(&ids).unwrap().smoke.cases[0].prompt_token_ids,
            Some(vec![2, 3])
        );
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
}
