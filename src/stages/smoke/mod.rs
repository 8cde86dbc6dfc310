//! Stage 6, smoke: run the probe and the gate cases in the oracle venv and
//! decide *gateable* (README.md, "The gate: `oracle-build smoke`").
//!
//! One process per case, each under a timeout (its whole process group is
//! killed when it runs over), with the embedded driver `py/smoke_driver.py`.
//! The verdict is `gateable` only when the probe passed, every case ran,
//! every run of a case produced the same tokens, every golden matched under
//! the same engine configuration, and the host's boot id did not change.
//! [`golden`] reads and compares goldens; [`npy`] reads numpy goldens.

pub mod golden;
pub mod npy;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fs_err as fs;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use golden::{ConfigDiff, GoldenDiff};

use crate::host::toolchain::{self, Gpu};
use crate::progress;
use crate::recipe::{Case, LoadedRecipe, Probe, expand_env};
use crate::store::key::{KEY_SCHEMA, content_key};
use crate::store::{Store, read_json, write_json};

const DRIVER_PY: &str = include_str!("../../py/smoke_driver.py");

/// The gate's decision.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Probe ok, every case ran and agreed with itself and its golden.
    Gateable,
    /// Anything else; the reasons say what.
    NotGateable,
    /// Smoke was skipped (`--no-smoke`).
    Unsmoked,
}

impl Verdict {
    /// `gateable`, `not-gateable` or `unsmoked`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Gateable => "gateable",
            Verdict::NotGateable => "not-gateable",
            Verdict::Unsmoked => "unsmoked",
        }
    }
}

/// One candidate token at one generated step (vLLM's `Logprob`, flattened).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TopLogprob {
    /// Token id.
    pub id: i64,
    /// Natural-log probability (null when not finite).
    pub logprob: Option<f64>,
    /// 1-based rank among the candidates.
    #[serde(default)]
    pub rank: Option<i64>,
    /// The decoded token text.
    #[serde(default)]
    pub token: Option<String>,
}

/// Runs of one case that disagree: where, and what each run chose there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Disagreement {
    /// First output position (0-based) where any run differs from run 1.
    pub position: usize,
    /// The tokens the runs chose there, one entry per distinct token.
    pub candidates: Vec<Candidate>,
}

/// One token chosen at a disagreement, and by which runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Candidate {
    /// The token id (null: those runs had already ended).
    pub token: Option<i64>,
    /// Its text, when the run recorded log-probabilities.
    pub text: Option<String>,
    /// Its log-probability in the runs that chose it.
    pub logprob: Option<f64>,
    /// 1-based numbers of the runs that chose it.
    pub runs: Vec<usize>,
}

/// The result of one case.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CaseResult {
    /// Case name.
    pub name: String,
    /// Model path after `${VAR}` expansion (or the unexpanded text if that failed).
    pub model: String,
    /// Whether the case passes the gate.
    pub ok: bool,
    /// Why not, one line each.
    pub problems: Vec<String>,
    /// Observations that do not fail the gate (e.g. a golden without engine configuration).
    #[serde(default)]
    pub notes: Vec<String>,
    /// The prompt text, when the case gives text.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Prompt token ids of the first run.
    pub prompt_token_ids: Vec<i64>,
    /// Output token ids of the first run.
    pub output_token_ids: Vec<i64>,
    /// Output text of the first run.
    pub text: String,
    /// Per-step top-k log-probabilities of the first run (`smoke.logprobs`).
    #[serde(default)]
    pub logprobs: Vec<Vec<TopLogprob>>,
    /// Number of runs made.
    pub runs: usize,
    /// Whether every run produced the same output tokens.
    pub deterministic: bool,
    /// Where the runs first disagree, when they do.
    #[serde(default)]
    pub disagreement: Option<Disagreement>,
    /// Seconds to construct `LLM(...)`.
    pub load_s: Option<f64>,
    /// Median tokens per second over the runs.
    pub tokens_per_s: Option<f64>,
    /// The engine configuration read back from the engine.
    pub engine_config: Value,
    /// Engine arguments the case set that the driver could not read back
    /// from the engine (absent from `engine_config`), each with the reason.
    #[serde(default)]
    pub unread_engine_args: Vec<UnreadKnob>,
    /// The environment the case ran with (`smoke.env` + the case's `env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `matched`, `mismatched`, `refused` (recorded under another engine
    /// configuration or prompt), `missing` (named by the recipe, absent),
    /// `unreadable`, `recorded` (`--record-golden`), `not compared` (the
    /// case failed first), or `none`.
    pub golden: String,
    /// The golden file compared with (or written).
    #[serde(default)]
    pub golden_path: Option<PathBuf>,
    /// The first divergence from the golden, when mismatched.
    #[serde(default)]
    pub golden_diff: Option<GoldenDiff>,
    /// Engine settings that differ from the golden's, when refused.
    #[serde(default)]
    pub config_diffs: Vec<ConfigDiff>,
    /// What the driver reported when it failed: stage, exception, last log lines.
    #[serde(default)]
    pub error: Option<Value>,
    /// The driver's log file.
    pub log: PathBuf,
}

/// An engine argument that could not be read back from the engine.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UnreadKnob {
    /// The engine argument, as the case names it.
    pub knob: String,
    /// Why it could not be read back (e.g. no attribute of vLLM's config has it).
    pub reason: String,
}

/// The whole smoke run, as recorded in `oracle.json` `"smoke"`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SmokeReport {
    /// Content key of the smoke inputs; a re-run with the same key is not repeated.
    pub key: String,
    /// The decision.
    pub verdict: Verdict,
    /// Why it is not gateable, one line each.
    pub reasons: Vec<String>,
    /// The probe's result (null when disabled).
    pub probe: Value,
    /// Per-case results.
    pub cases: Vec<CaseResult>,
    /// `/proc/sys/kernel/random/boot_id` before and after.
    pub boot_id_before: Option<String>,
    /// See `boot_id_before`.
    pub boot_id_after: Option<String>,
    /// GPUs seen by `nvidia-smi` before the run: name, compute capability,
    /// driver, free memory (empty when none).
    pub gpus: Vec<Gpu>,
    /// The near-tie threshold used, nats.
    #[serde(default)]
    pub near_tie_nats: f64,
    /// `--case NAME`: only this case ran (such a report is not the gate's record).
    #[serde(default)]
    pub only_case: Option<String>,
    /// When the run started (RFC 3339).
    pub started: String,
    /// Wall time of the whole run, seconds.
    pub duration_s: f64,
}

impl SmokeReport {
    /// A report for a skipped smoke run.
    pub fn skipped(key: String) -> SmokeReport {
        SmokeReport {
            key,
            verdict: Verdict::Unsmoked,
            reasons: vec!["smoke skipped (--no-smoke)".into()],
            probe: Value::Null,
            cases: Vec::new(),
            boot_id_before: None,
            boot_id_after: None,
            gpus: Vec::new(),
            near_tie_nats: 0.0,
            only_case: None,
            started: jiff::Timestamp::now().to_string(),
            duration_s: 0.0,
        }
    }
}

/// How a smoke run is made.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Where goldens of cases without a `golden:` path are looked up, in
    /// order (see [`golden::dirs`]); recording writes the first and copies
    /// into the others.
    pub goldens_dirs: Vec<PathBuf>,
    /// Run only this case.
    pub only: Option<String>,
    /// `--record-golden`: write each clean case's output as its golden.
    pub record: Option<Record>,
}

/// How `--record-golden` records.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// The oracle identity stamped into each golden.
    pub oracle: Value,
    /// `--force`: replace goldens the new output disagrees with. Without it,
    /// such a golden makes the run fail (exit 2) and no golden is written.
    pub force: bool,
}

/// A golden to write once every case has run.
struct Pending {
    case: String,
    path: PathBuf,
    golden: golden::Golden,
    /// Where the golden already there disagrees with this run, if it does.
    replaces: Option<GoldenDiff>,
    /// Where copies go (the store's copy of a golden kept beside the recipe).
    copies: Vec<PathBuf>,
    /// Why the file already at `path` is not a golden (then it is never replaced).
    foreign: Option<String>,
}

impl Options {
    /// Compare with goldens (none recorded), every case, goldens of `lr` in `store`.
    pub fn new(store: &Store, lr: &LoadedRecipe) -> Options {
        Options {
            goldens_dirs: golden::dirs(store.root(), lr),
            only: None,
            record: None,
        }
    }
}

/// The content key of the smoke inputs for the oracle of `lr` in `store`:
/// see [`smoke_key_in`].
pub fn smoke_key(store: &Store, lr: &LoadedRecipe) -> String {
    smoke_key_in(lr, &golden::dirs(store.root(), lr))
}

/// The content key of everything that can change the gate's outcome: the
/// smoke section (env, runs, probe, timeout, near-tie threshold, logprobs),
/// every case with its model path expanded, every golden's location and
/// content (manifest included), and the driver's text.
pub fn smoke_key_in(lr: &LoadedRecipe, goldens_dirs: &[PathBuf]) -> String {
    let s = &lr.recipe.smoke;
    let cases: Vec<Value> = s
        .cases
        .iter()
        .map(|c| {
            let loc = golden::locate(lr, goldens_dirs, c);
            json!({
                "case": c,
                "model": expand_env(&c.model).unwrap_or_else(|e| format!("unset: {e}")),
                "golden": golden::content_digest(&loc),
                "golden_path": loc.path,
            })
        })
        .collect();
    content_key(&json!({
        "schema": KEY_SCHEMA, "stage": "smoke", "env": s.env, "runs": s.runs, "probe": s.probe,
        "timeout_s": s.timeout_s, "near_tie_nats": s.near_tie_nats, "logprobs": s.logprobs,
        "cases": cases, "driver": hex::encode(sha2_digest(DRIVER_PY.as_bytes())),
    }))
}

fn sha2_digest(bytes: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).to_vec()
}

/// The host's boot id (`/proc/sys/kernel/random/boot_id`), `None` off Linux.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// The reason the gate fails when the boot id changed between `before` and
/// `after` (the host rebooted mid-run, e.g. under unified-memory pressure).
pub fn boot_change(before: Option<&str>, after: Option<&str>) -> Option<String> {
    (before != after).then(|| {
        format!(
            "the host rebooted during the smoke run (boot id {} -> {}); nothing it measured can be trusted",
            before.unwrap_or("?"),
            after.unwrap_or("?")
        )
    })
}

/// Runs the probe (if enabled) and every case (or only `opts.only`) with the
/// venv at `venv`, writing configs, results and logs under `out_dir`; with
/// `opts.record`, writes each clean case's golden once every case has run.
///
/// Errors: failures of the tool itself (cannot write files, cannot start
/// Python); and, when recording without `force`, exit 2 when the output of a
/// case disagrees with the golden already there (then no golden is written).
/// Everything the oracle does wrong becomes a reason in the report.
pub fn run(venv: &Path, lr: &LoadedRecipe, out_dir: &Path, opts: &Options) -> Result<SmokeReport> {
    let recipe = &lr.recipe;
    let started = jiff::Timestamp::now().to_string();
    let t0 = Instant::now();
    fs::create_dir_all(out_dir)?;
    let driver = out_dir.join("smoke_driver.py");
    fs::write(&driver, DRIVER_PY)?;
    let boot_before = boot_id();
    let gpus = toolchain::gpus();
    let mut reasons = Vec::new();
    let python = venv.join("bin/python");
    let timeout = Duration::from_secs(recipe.smoke.timeout_s);
    let device = recipe.build.target_device.clone();

    let probe = match recipe.smoke.probe.describe(&recipe.source.package) {
        None => Value::Null,
        Some(op) => {
            progress::stage("smoke", format!("probe: {op} on {device}"));
            let mut cfg = json!({"package": recipe.source.package, "device": device});
            if let Probe::Custom(p) = &recipe.smoke.probe {
                cfg["module"] = json!(p.module);
                cfg["function"] = json!(p.function);
            }
            let out = run_driver(
                &python,
                &driver,
                "probe",
                "probe",
                &cfg,
                out_dir,
                &recipe.smoke.env,
                timeout,
            )?;
            let mut res = out.result.unwrap_or_else(|| json!({"op": op, "ok": false}));
            if let Some(failure) = out.failure {
                res["error"] = json!({"stage": "process", "exception": failure});
            }
            let ok = res.get("ok").and_then(Value::as_bool).unwrap_or(false);
            if !ok {
                if let Some(err) = res.get_mut("error").and_then(Value::as_object_mut) {
                    err.insert("log_tail".into(), json!(out.log_tail));
                }
                reasons.push(format!("probe: {op} failed: {}", probe_failure(&res)));
            }
            res["log"] = json!(out.log);
            res
        }
    };
    let probe_ok = probe.is_null() || probe["ok"].as_bool().unwrap_or(false);

    let mut cases = Vec::new();
    let mut pending = Vec::new();
    for case in recipe
        .smoke
        .cases
        .iter()
        .filter(|c| opts.only.as_deref().is_none_or(|o| o == c.name))
    {
        let result = run_case(
            &python,
            &driver,
            lr,
            case,
            out_dir,
            timeout,
            opts,
            probe_ok,
            &mut pending,
        )?;
        for p in &result.problems {
            reasons.push(format!("case {}: {p}", result.name));
        }
        cases.push(result);
    }
    if cases.is_empty() {
        reasons.push(match &opts.only {
            Some(name) => format!("the recipe has no case named {name:?}"),
            None => "the recipe has no smoke cases: nothing shows the oracle runs a model".into(),
        });
    }
    if let Some(rec) = &opts.record {
        write_goldens(pending, rec.force, &mut cases)?;
    }
    let boot_after = boot_id();
    if let Some(r) = boot_change(boot_before.as_deref(), boot_after.as_deref()) {
        reasons.push(r);
    }
    Ok(SmokeReport {
        // Computed last: recording goldens changes it.
        key: smoke_key_in(lr, &opts.goldens_dirs),
        verdict: if reasons.is_empty() {
            Verdict::Gateable
        } else {
            Verdict::NotGateable
        },
        reasons,
        probe,
        cases,
        boot_id_before: boot_before,
        boot_id_after: boot_after,
        gpus,
        near_tie_nats: recipe.smoke.near_tie_nats,
        only_case: opts.only.clone(),
        started,
        duration_s: t0.elapsed().as_secs_f64(),
    })
}

/// One line on why a probe result is not ok.
fn probe_failure(res: &Value) -> String {
    if let Some(err) = res.get("error").filter(|e| !e.is_null()) {
        return format!(
            "{} at {}",
            err["exception"].as_str().unwrap_or("?"),
            err["stage"].as_str().unwrap_or("?")
        );
    }
    if let Some(e) = res.get("max_abs_error").filter(|e| !e.is_null()) {
        return format!(
            "result differs from the reference: max abs error {e} over tolerance {}",
            res["tolerance"]
        );
    }
    match res.get("returned") {
        Some(v) => format!("returned {}", v.as_str().unwrap_or("a false value")),
        None => "reported not ok".into(),
    }
}

/// What one driver process left behind.
struct DriverOutcome {
    /// Its JSON result, when it wrote one.
    result: Option<Value>,
    /// Why it wrote none (timeout, crash), when so.
    failure: Option<String>,
    /// The last lines of its log.
    log_tail: Vec<String>,
    /// Its log file.
    log: PathBuf,
}

/// Runs the driver once in its own process group under `timeout`.
#[allow(clippy::too_many_arguments)]
fn run_driver(
    python: &Path,
    driver: &Path,
    mode: &str,
    name: &str,
    cfg: &Value,
    out_dir: &Path,
    env: &BTreeMap<String, String>,
    timeout: Duration,
) -> Result<DriverOutcome> {
    let cfg_path = out_dir.join(format!("{name}.config.json"));
    let out_path = out_dir.join(format!("{name}.result.json"));
    let log = out_dir.join(format!("{name}.log"));
    write_json(&cfg_path, cfg)?;
    let stage_path = out_dir.join(format!("{name}.result.json.stage"));
    let _ = fs::remove_file(&out_path);
    let _ = fs::remove_file(&stage_path);
    let work = tempfile::tempdir().context("creating a scratch directory")?;
    let mut cmd = duct::cmd(
        python,
        [
            "-I".as_ref(),
            driver.as_os_str(),
            mode.as_ref(),
            cfg_path.as_os_str(),
            out_path.as_os_str(),
        ],
    )
    .dir(work.path())
    .env_remove("PYTHONPATH")
    .env_remove("PYTHONHOME");
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    let outcome = crate::host::process::run_with_timeout(cmd, &log, timeout);
    let log_tail: Vec<String> =
        crate::host::process::tail(&std::fs::read_to_string(&log).unwrap_or_default(), 8)
            .lines()
            .map(str::to_string)
            .collect();
    let stage = std::fs::read_to_string(&stage_path).ok();
    let (result, failure) = match outcome {
        Err(e) => (
            None,
            Some(match stage {
                Some(st) => format!("{e:#} (it was at stage: {st})"),
                None => format!("{e:#}"),
            }),
        ),
        Ok(_) if !out_path.exists() => (None, Some("the driver exited without a result".into())),
        Ok(_) => match read_json::<Value>(&out_path) {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(format!("unreadable driver result: {e:#}"))),
        },
    };
    Ok(DriverOutcome {
        result,
        failure,
        log_tail,
        log,
    })
}

/// One run as the driver reports it.
#[derive(Debug, Clone, Default, Deserialize)]
struct DriverRun {
    #[serde(default)]
    prompt_token_ids: Vec<i64>,
    #[serde(default)]
    output_token_ids: Vec<i64>,
    #[serde(default)]
    text: String,
    #[serde(default)]
    tokens_per_s: Option<f64>,
    #[serde(default)]
    logprobs: Vec<Vec<TopLogprob>>,
}

/// A case as the driver reports it.
#[derive(Debug, Clone, Default, Deserialize)]
struct DriverCase {
    #[serde(default)]
    runs: Vec<DriverRun>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    load_s: Option<f64>,
    #[serde(default)]
    engine_config: Value,
    #[serde(default)]
    unread_engine_args: Vec<UnreadKnob>,
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    python: &Path,
    driver: &Path,
    lr: &LoadedRecipe,
    case: &Case,
    out_dir: &Path,
    timeout: Duration,
    opts: &Options,
    probe_ok: bool,
    pending: &mut Vec<Pending>,
) -> Result<CaseResult> {
    let recipe = &lr.recipe;
    let mut env = recipe.smoke.env.clone();
    env.extend(case.env.clone());
    let loc = golden::locate(lr, &opts.goldens_dirs, case);
    let mut result = CaseResult {
        name: case.name.clone(),
        model: case.model.clone(),
        ok: false,
        problems: Vec::new(),
        notes: Vec::new(),
        prompt: case.prompt.clone(),
        prompt_token_ids: Vec::new(),
        output_token_ids: Vec::new(),
        text: String::new(),
        logprobs: Vec::new(),
        runs: 0,
        deterministic: false,
        disagreement: None,
        load_s: None,
        tokens_per_s: None,
        engine_config: Value::Null,
        unread_engine_args: Vec::new(),
        env: env.clone(),
        // Until compared: "not compared" when a golden exists.
        golden: if loc.path.exists() {
            "not compared".into()
        } else {
            "none".into()
        },
        golden_path: loc.path.exists().then(|| loc.path.clone()),
        golden_diff: None,
        config_diffs: Vec::new(),
        error: None,
        log: out_dir.join(format!("case-{}.log", case.name)),
    };
    let model = match expand_env(&case.model) {
        Ok(m) => m,
        Err(e) => {
            result.problems.push(format!("model path: {e}"));
            return Ok(result);
        }
    };
    result.model = model.clone();
    if !Path::new(&model).exists() {
        result.problems.push(format!(
            "model path {model} does not exist; refusing to run the case"
        ));
        return Ok(result);
    }
    progress::stage(
        "smoke",
        format!("case {}: {} x{} runs", case.name, model, recipe.smoke.runs),
    );
    let cfg = json!({
        "name": case.name, "package": recipe.source.package, "model": model, "revision": case.revision,
        "prompt": case.prompt, "prompt_token_ids": case.prompt_token_ids,
        "max_tokens": case.max_tokens, "engine_args": case.engine_args,
        "runs": recipe.smoke.runs, "logprobs": recipe.smoke.logprobs,
    });
    let out = run_driver(
        python,
        driver,
        "case",
        &format!("case-{}", case.name),
        &cfg,
        out_dir,
        &env,
        timeout,
    )?;
    if let Some(p) = out.failure {
        result.error = Some(json!({"stage": "process", "exception": p, "log_tail": out.log_tail}));
        result.problems.push(p);
        return Ok(result);
    }
    let res: DriverCase = match out.result.map(serde_json::from_value).transpose() {
        Ok(r) => r.unwrap_or_default(),
        Err(e) => {
            result
                .problems
                .push(format!("the driver's result is malformed: {e}"));
            return Ok(result);
        }
    };
    if let Some(mut err) = res.error.filter(|e| !e.is_null()) {
        result.problems.push(format!(
            "failed at {}: {}",
            err["stage"].as_str().unwrap_or("?"),
            err["exception"].as_str().unwrap_or("?"),
        ));
        err["log_tail"] = json!(out.log_tail);
        result.error = Some(err);
    }
    result.load_s = res.load_s;
    result.engine_config = res.engine_config;
    for u in &res.unread_engine_args {
        result.notes.push(format!(
            "engine argument {} was set but cannot be read back from the engine ({}); \
             the recorded engine configuration lacks it",
            u.knob, u.reason
        ));
    }
    result.unread_engine_args = res.unread_engine_args;
    let runs = res.runs;
    result.runs = runs.len();
    if let Some(first) = runs.first() {
        result.prompt_token_ids = first.prompt_token_ids.clone();
        result.output_token_ids = first.output_token_ids.clone();
        result.text = first.text.clone();
        result.logprobs = first.logprobs.clone();
        let mut speeds: Vec<f64> = runs.iter().filter_map(|r| r.tokens_per_s).collect();
        speeds.sort_by(f64::total_cmp);
        result.tokens_per_s = speeds.get(speeds.len() / 2).copied();
        result.disagreement = disagreement(&runs);
        result.deterministic = result.disagreement.is_none();
        if let Some(d) = &result.disagreement {
            result.problems.push(format!(
                "the {} runs disagree: first at output position {}: {}",
                runs.len(),
                d.position,
                describe_candidates(&d.candidates)
            ));
        }
    }
    if result.problems.is_empty() && runs.len() != recipe.smoke.runs as usize {
        result.problems.push(format!(
            "expected {} runs, got {}",
            recipe.smoke.runs,
            runs.len()
        ));
    }
    result.golden_path =
        (opts.record.is_some() || loc.explicit || loc.path.exists()).then(|| loc.path.clone());
    if opts.record.is_some() {
        pending.extend(record_golden(&mut result, &loc, lr, case, opts, probe_ok));
    } else if result.problems.is_empty() {
        compare_golden(&mut result, &loc, case, recipe.smoke.near_tie_nats);
    }
    result.ok = result.problems.is_empty();
    Ok(result)
}

/// Where the runs first disagree with run 1, and the tokens each chose there.
fn disagreement(runs: &[DriverRun]) -> Option<Disagreement> {
    let first = &runs.first()?.output_token_ids;
    let position = runs
        .iter()
        .skip(1)
        .filter(|r| &r.output_token_ids != first)
        .map(|r| first_divergence(first, &r.output_token_ids))
        .min()?;
    let mut candidates: Vec<Candidate> = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let token = r.output_token_ids.get(position).copied();
        if let Some(c) = candidates.iter_mut().find(|c| c.token == token) {
            c.runs.push(i + 1);
            continue;
        }
        let entry = token.and_then(|t| {
            r.logprobs
                .get(position)
                .and_then(|s| s.iter().find(|e| e.id == t))
        });
        candidates.push(Candidate {
            token,
            text: entry.and_then(|e| e.token.clone()),
            logprob: entry.and_then(|e| e.logprob),
            runs: vec![i + 1],
        });
    }
    Some(Disagreement {
        position,
        candidates,
    })
}

/// `12 " sits" (logprob -0.34; runs 1, 3) | 34 " shine" (logprob -1.84; run 2)`.
pub fn describe_candidates(cands: &[Candidate]) -> String {
    cands
        .iter()
        .map(|c| {
            let tok = match (c.token, &c.text) {
                (Some(t), Some(s)) => format!("{t} {s:?}"),
                (Some(t), None) => t.to_string(),
                (None, _) => "(ended)".into(),
            };
            let lp = c
                .logprob
                .map_or(String::new(), |l| format!("logprob {l:.2}; "));
            let runs: Vec<String> = c.runs.iter().map(ToString::to_string).collect();
            format!(
                "{tok} ({lp}run{} {})",
                if c.runs.len() == 1 { "" } else { "s" },
                runs.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// One line for a golden divergence: position, both tokens, gaps, near-tie.
pub fn describe_diff(d: &GoldenDiff) -> String {
    let tok = |id: Option<i64>, text: &Option<String>| match (id, text) {
        (Some(i), Some(t)) => format!("{i} {t:?}"),
        (Some(i), None) => i.to_string(),
        (None, _) => "(ended)".into(),
    };
    let mut s = format!(
        "first differs at output position {}: golden {} vs now {}",
        d.position,
        tok(d.golden_token, &d.golden_text),
        tok(d.token, &d.text)
    );
    match (d.gap_nats, d.gap_at_least_nats) {
        (Some(g), _) => s += &format!(", gap {g:.2} nats"),
        (None, Some(g)) => s += &format!(", gap at least {g:.2} nats (golden token outside top-k)"),
        (None, None) if d.golden_token.is_some() && d.token.is_some() => {
            s += ", gap unknown (no logprobs)"
        }
        _ => {}
    }
    if let Some(g) = d.golden_gap_nats {
        s += &format!(" (golden's own gap {g:.2})");
    }
    if d.near_tie {
        s += &format!(
            ": a NEAR-TIE (under {:?} nats): the two tokens were nearly tied, so this may be a tie flipping rather than drift",
            d.near_tie_nats
        );
    } else if d.gap_nats.is_some() || d.golden_gap_nats.is_some() {
        s += &format!(": not a near-tie (threshold {:?} nats)", d.near_tie_nats);
    }
    s
}

fn compare_golden(result: &mut CaseResult, loc: &golden::Location, case: &Case, near_tie: f64) {
    if !loc.path.exists() {
        if loc.explicit {
            result.golden = "missing".into();
            result.problems.push(format!(
                "golden {} named by the recipe does not exist (record it with `oracle-build smoke <PIN> --record-golden`)",
                loc.path.display()
            ));
        }
        return;
    }
    let g = match golden::load(loc, case.prompt.as_deref(), &result.prompt_token_ids) {
        Ok(g) => g,
        Err(e) => {
            result.golden = "unreadable".into();
            result.problems.push(e);
            return;
        }
    };
    let mut refused = Vec::new();
    if let Some(ids) = g
        .prompt_token_ids
        .as_ref()
        .filter(|ids| **ids != result.prompt_token_ids)
    {
        refused.push(format!(
            "it was recorded for prompt ids {ids:?}, this case's prompt is {:?}",
            result.prompt_token_ids
        ));
    }
    match (&g.engine_config, result.engine_config.as_object()) {
        (Some(gc), Some(now)) => {
            result.config_diffs = golden::config_diffs(gc, now, g.config_is_partial);
            if !result.config_diffs.is_empty() {
                refused.push(format!(
                    "it was recorded under a different engine configuration: {}",
                    result
                        .config_diffs
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                ));
            }
        }
        (None, _) => result.notes.push(format!(
            "golden {} records no engine configuration; compared without checking it",
            loc.path.display()
        )),
        (Some(_), None) => refused.push("the engine configuration was not read back".into()),
    }
    if !refused.is_empty() {
        result.golden = "refused".into();
        result.problems.push(format!(
            "golden {} refused for comparison: {}",
            loc.path.display(),
            refused.join("; ")
        ));
        return;
    }
    if !g.env.is_empty() && g.env != result.env {
        result.notes.push(format!(
            "the golden was captured with environment {:?}, this run used {:?}",
            g.env, result.env
        ));
    }
    match golden::diff(
        &g.output_token_ids,
        &g.logprobs,
        &result.output_token_ids,
        &result.logprobs,
        near_tie,
    ) {
        None => result.golden = "matched".into(),
        Some(d) => {
            result.golden = "mismatched".into();
            result.problems.push(format!(
                "output differs from golden {}{}: {}",
                loc.path.display(),
                g.row.map_or(String::new(), |r| format!(" row {r}")),
                describe_diff(&d)
            ));
            result.golden_diff = Some(d);
        }
    }
}

/// The golden `case` would record (see [`write_goldens`]), or `None` (with
/// the reason in the result) when this run must not be recorded.
fn record_golden(
    result: &mut CaseResult,
    loc: &golden::Location,
    lr: &LoadedRecipe,
    case: &Case,
    opts: &Options,
    probe_ok: bool,
) -> Option<Pending> {
    if loc.kind == golden::Kind::Npy {
        result.problems.push(format!(
            "golden {} is a numpy golden; --record-golden writes JSON goldens only",
            loc.path.display()
        ));
        return None;
    }
    if !result.problems.is_empty() || !probe_ok {
        result.notes.push(format!(
            "golden {} not recorded: {}",
            loc.path.display(),
            if probe_ok {
                "the case did not run cleanly"
            } else {
                "the probe failed"
            }
        ));
        return None;
    }
    // Something at the golden path that does not read as a golden (a model's
    // config.json, a directory) is someone else's file: never overwritten.
    let existing = (std::fs::symlink_metadata(&loc.path).is_ok())
        .then(|| golden::load(loc, case.prompt.as_deref(), &result.prompt_token_ids));
    let foreign = match &existing {
        Some(Err(e)) => Some(e.clone()),
        Some(Ok(_)) if !loc.path.is_file() => Some("it is not a regular file".to_string()),
        _ => None,
    };
    let replaces = existing.and_then(Result::ok).and_then(|old| {
        golden::diff(
            &old.output_token_ids,
            &old.logprobs,
            &result.output_token_ids,
            &result.logprobs,
            lr.recipe.smoke.near_tie_nats,
        )
    });
    let golden = golden::Golden {
        format: golden::FORMAT.into(),
        case: case.name.clone(),
        model: Some(result.model.clone()),
        revision: case.revision.clone(),
        prompt: case.prompt.clone(),
        prompt_token_ids: Some(result.prompt_token_ids.clone()),
        output_token_ids: result.output_token_ids.clone(),
        text: Some(result.text.clone()),
        max_tokens: Some(case.max_tokens),
        logprobs_k: Some(lr.recipe.smoke.logprobs),
        logprobs: result.logprobs.clone(),
        engine_config: Some(result.engine_config.clone()),
        env: result.env.clone(),
        oracle: opts
            .record
            .as_ref()
            .map_or(Value::Null, |r| r.oracle.clone()),
        captured: Some(jiff::Timestamp::now().to_string()),
        host: json!({"boot_id": boot_id(), "gpus": toolchain::gpus()}),
    };
    // A golden found only in the store's copy is recorded beside the recipe
    // again; the store keeps a copy of every JSON golden.
    let file = format!("{}.json", case.name);
    let path = match (loc.explicit, opts.goldens_dirs.first()) {
        (false, Some(d)) => d.join(&file),
        _ => loc.path.clone(),
    };
    let copies = opts
        .goldens_dirs
        .iter()
        .map(|d| d.join(&file))
        .filter(|p| *p != path)
        .collect();
    result.golden_path = Some(path.clone());
    Some(Pending {
        case: case.name.clone(),
        path,
        golden,
        replaces,
        copies,
        foreign,
    })
}

/// Writes the recorded goldens, all or none: without `force`, a golden the
/// new output disagrees with is not replaced and nothing is written (exit 2,
/// naming each such golden, where it diverges, and the fix). A golden that
/// matches, or none yet, is (re)written.
fn write_goldens(pending: Vec<Pending>, force: bool, cases: &mut [CaseResult]) -> Result<()> {
    let foreign: Vec<String> = pending
        .iter()
        .filter_map(|p| {
            p.foreign
                .as_ref()
                .map(|why| format!("  case {}: {}: {why}", p.case, p.path.display()))
        })
        .collect();
    if !foreign.is_empty() {
        return Err(crate::exit::bad_input(format!(
            "--record-golden refuses to overwrite {} not a golden (not even with --force):\n{}\nno golden was written and the recorded verdict is unchanged. Point the case's `golden:` at a new file, or move the file away.",
            if foreign.len() == 1 {
                "a file that is"
            } else {
                "files that are"
            },
            foreign.join("\n")
        )));
    }
    let diverging: Vec<String> = pending
        .iter()
        .filter_map(|p| {
            p.replaces.as_ref().map(|d| {
                format!(
                    "  case {}: golden {}: {}",
                    p.case,
                    p.path.display(),
                    describe_diff(d)
                )
            })
        })
        .collect();
    if !diverging.is_empty() && !force {
        return Err(crate::exit::bad_input(format!(
            "--record-golden refuses to replace {} the new output disagrees with:\n{}\nno golden was written and the recorded verdict is unchanged. If the new output is the right one, rerun with `--record-golden --force`; to see the mismatch as a gate failure, run `smoke` without --record-golden.",
            if diverging.len() == 1 {
                "a golden"
            } else {
                "goldens"
            },
            diverging.join("\n")
        )));
    }
    for p in pending {
        for path in std::iter::once(&p.path).chain(&p.copies) {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            write_json(path, &p.golden)
                .with_context(|| format!("recording golden {}", path.display()))?;
        }
        progress::stage(
            "smoke",
            format!("case {}: golden recorded in {}", p.case, p.path.display()),
        );
        if let Some(result) = cases.iter_mut().find(|c| c.name == p.case) {
            result.golden = "recorded".into();
            if let Some(d) = &p.replaces {
                result.notes.push(format!(
                    "replaced (--force) the previous golden, which {}",
                    describe_diff(d)
                ));
            }
        }
    }
    Ok(())
}

/// The first index where `a` and `b` differ (their common length when one is a prefix).
pub fn first_divergence(a: &[i64], b: &[i64]) -> usize {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ids: &[i64]) -> DriverRun {
        DriverRun {
            output_token_ids: ids.to_vec(),
            ..DriverRun::default()
        }
    }

    #[test]
    fn disagreement_names_the_first_position_and_who_chose_what() {
        let d = disagreement(&[run(&[1, 2, 3]), run(&[1, 9, 3]), run(&[1, 2, 3])]).unwrap();
        assert_eq!(d.position, 1);
        assert_eq!(d.candidates.len(), 2);
        assert_eq!(
            (d.candidates[0].token, d.candidates[0].runs.clone()),
            (Some(2), vec![1, 3])
        );
        assert_eq!(
            (d.candidates[1].token, d.candidates[1].runs.clone()),
            (Some(9), vec![2])
        );
        assert!(disagreement(&[run(&[1, 2]), run(&[1, 2])]).is_none());
        let short = disagreement(&[run(&[1, 2]), run(&[1])]).unwrap();
        assert_eq!(short.position, 1);
        assert_eq!(short.candidates[1].token, None);
    }

    #[test]
    fn a_changed_boot_id_fails() {
        assert!(boot_change(Some("a"), Some("a")).is_none());
        assert!(
            boot_change(Some("a"), Some("b"))
                .unwrap()
                .contains("a -> b")
        );
        assert!(boot_change(Some("a"), None).is_some());
    }
}
