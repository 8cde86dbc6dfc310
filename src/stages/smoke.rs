//! Stage 6, smoke: run the probe and the gate cases in the oracle venv and
//! decide *gateable* (DESIGN.md, "Smoke and the gate").
//!
//! One process per case, each under a timeout, with the embedded driver
//! `py/smoke_driver.py`. The verdict is `gateable` only when the probe passed,
//! every case ran, every run of a case produced the same tokens, every recorded
//! golden matched, and the host's boot id did not change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fs_err as fs;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::key::{KEY_SCHEMA, content_key};
use crate::progress;
use crate::recipe::{Case, LoadedRecipe, expand_env};
use crate::store::{read_json, write_json};
use crate::toolchain::{self, Gpu};

const DRIVER_PY: &str = include_str!("../py/smoke_driver.py");

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
    /// Prompt token ids of the first run.
    pub prompt_token_ids: Vec<i64>,
    /// Output token ids of the first run.
    pub output_token_ids: Vec<i64>,
    /// Output text of the first run.
    pub text: String,
    /// Number of runs made.
    pub runs: usize,
    /// Whether every run produced the same output tokens.
    pub deterministic: bool,
    /// Seconds to construct `LLM(...)`.
    pub load_s: Option<f64>,
    /// Median tokens per second over the runs.
    pub tokens_per_s: Option<f64>,
    /// The engine configuration read back from the engine.
    pub engine_config: Value,
    /// `matched`, `mismatched`, or `none` (no golden recorded).
    pub golden: String,
    /// The driver's log file.
    pub log: PathBuf,
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
    /// GPUs seen by `nvidia-smi` (empty when none).
    pub gpus: Vec<Gpu>,
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
            started: jiff::Timestamp::now().to_string(),
            duration_s: 0.0,
        }
    }
}

/// The content key of the smoke inputs: the smoke section with model paths
/// expanded, every golden's content, and the driver's text.
pub fn smoke_key(lr: &LoadedRecipe) -> String {
    let s = &lr.recipe.smoke;
    let cases: Vec<Value> = s
        .cases
        .iter()
        .map(|c| {
            let golden = golden_path(lr, c).and_then(|p| std::fs::read(p).ok()).map(|b| hex::encode(sha2_digest(&b)));
            json!({"case": c, "model": expand_env(&c.model).unwrap_or_else(|e| format!("unset: {e}")), "golden": golden})
        })
        .collect();
    content_key(&json!({
        "schema": KEY_SCHEMA, "stage": "smoke", "env": s.env, "runs": s.runs, "probe": s.probe,
        "timeout_s": s.timeout_s, "cases": cases, "driver": hex::encode(sha2_digest(DRIVER_PY.as_bytes())),
    }))
}

fn sha2_digest(bytes: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).to_vec()
}

fn golden_path(lr: &LoadedRecipe, case: &Case) -> Option<PathBuf> {
    let g = case.golden.as_ref()?;
    let p = Path::new(g);
    Some(if p.is_absolute() {
        p.to_path_buf()
    } else {
        lr.dir.clone().unwrap_or_default().join(p)
    })
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Runs the probe (if enabled) and every case (or only `only`) with the venv
/// at `venv`, writing configs, results and logs under `out_dir`.
///
/// Errors: only for failures of the tool itself (cannot write files, cannot
/// start Python); everything the oracle does wrong becomes a reason in the report.
pub fn run(
    venv: &Path,
    lr: &LoadedRecipe,
    out_dir: &Path,
    only: Option<&str>,
) -> Result<SmokeReport> {
    let recipe = &lr.recipe;
    let started = jiff::Timestamp::now().to_string();
    let t0 = Instant::now();
    fs::create_dir_all(out_dir)?;
    let driver = out_dir.join("smoke_driver.py");
    fs::write(&driver, DRIVER_PY)?;
    let boot_before = boot_id();
    let mut reasons = Vec::new();
    let python = venv.join("bin/python");
    let timeout = Duration::from_secs(recipe.smoke.timeout_s);
    let device = recipe.build.target_device.clone();

    let probe = if recipe.smoke.probe {
        progress::stage(
            "smoke",
            format!("probe: {}._custom_ops.rms_norm", recipe.source.package),
        );
        let cfg = json!({"package": recipe.source.package, "device": device});
        let (res, problem) = run_driver(
            &python,
            &driver,
            "probe",
            "probe",
            &cfg,
            out_dir,
            &recipe.smoke.env,
            timeout,
        )?;
        let ok = res.get("ok").and_then(Value::as_bool).unwrap_or(false);
        if let Some(p) = problem {
            reasons.push(format!("probe: {p}"));
        } else if !ok {
            let why = res
                .pointer("/error/exception")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| {
                    format!(
                        "max abs error {} over tolerance {}",
                        res["max_abs_error"], res["tolerance"]
                    )
                });
            reasons.push(format!(
                "probe: {} failed: {why}",
                res["op"].as_str().unwrap_or("custom op")
            ));
        }
        res
    } else {
        Value::Null
    };

    let mut cases = Vec::new();
    for case in recipe
        .smoke
        .cases
        .iter()
        .filter(|c| only.is_none_or(|o| o == c.name))
    {
        let result = run_case(&python, &driver, lr, case, out_dir, timeout)?;
        for p in &result.problems {
            reasons.push(format!("case {}: {p}", result.name));
        }
        cases.push(result);
    }
    if cases.is_empty() {
        reasons.push(match only {
            Some(name) => format!("the recipe has no case named {name:?}"),
            None => "the recipe has no smoke cases: nothing shows the oracle runs a model".into(),
        });
    }
    let boot_after = boot_id();
    if boot_before != boot_after {
        reasons.push(format!(
            "the host rebooted during the smoke run (boot id {} -> {})",
            boot_before.as_deref().unwrap_or("?"),
            boot_after.as_deref().unwrap_or("?")
        ));
    }
    Ok(SmokeReport {
        key: smoke_key(lr),
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
        gpus: toolchain::gpus(),
        started,
        duration_s: t0.elapsed().as_secs_f64(),
    })
}

/// Runs the driver once; returns its JSON result and, when it produced none,
/// why (timeout, crash) with the log's last lines.
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
) -> Result<(Value, Option<String>)> {
    let cfg_path = out_dir.join(format!("{name}.config.json"));
    let out_path = out_dir.join(format!("{name}.result.json"));
    let log = out_dir.join(format!("{name}.log"));
    write_json(&cfg_path, cfg)?;
    let _ = fs::remove_file(&out_path);
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
    let outcome = crate::process::run_with_timeout(cmd, &log, timeout);
    let log_tail = || crate::process::tail(&std::fs::read_to_string(&log).unwrap_or_default(), 5);
    match outcome {
        Err(e) => Ok((
            Value::Null,
            Some(format!("{e:#}; log {}:\n{}", log.display(), log_tail())),
        )),
        Ok(_) if !out_path.exists() => Ok((
            Value::Null,
            Some(format!(
                "the driver wrote no result; log {}:\n{}",
                log.display(),
                log_tail()
            )),
        )),
        Ok(_) => Ok((read_json(&out_path)?, None)),
    }
}

fn run_case(
    python: &Path,
    driver: &Path,
    lr: &LoadedRecipe,
    case: &Case,
    out_dir: &Path,
    timeout: Duration,
) -> Result<CaseResult> {
    let recipe = &lr.recipe;
    let mut result = CaseResult {
        name: case.name.clone(),
        model: case.model.clone(),
        ok: false,
        problems: Vec::new(),
        prompt_token_ids: Vec::new(),
        output_token_ids: Vec::new(),
        text: String::new(),
        runs: 0,
        deterministic: false,
        load_s: None,
        tokens_per_s: None,
        engine_config: Value::Null,
        golden: "none".into(),
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
        result
            .problems
            .push(format!("model path {model} does not exist"));
        return Ok(result);
    }
    progress::stage(
        "smoke",
        format!("case {}: {} x{} runs", case.name, model, recipe.smoke.runs),
    );
    let cfg = json!({
        "name": case.name, "package": recipe.source.package, "model": model, "revision": case.revision,
        "prompt": case.prompt, "max_tokens": case.max_tokens, "engine_args": case.engine_args,
        "runs": recipe.smoke.runs, "logprobs": Value::Null,
    });
    let mut env = recipe.smoke.env.clone();
    env.extend(case.env.clone());
    let (res, problem) = run_driver(
        python,
        driver,
        "case",
        &format!("case-{}", case.name),
        &cfg,
        out_dir,
        &env,
        timeout,
    )?;
    if let Some(p) = problem {
        result.problems.push(p);
        return Ok(result);
    }
    if let Some(err) = res.get("error").filter(|e| !e.is_null()) {
        result.problems.push(format!(
            "failed at {}: {}",
            err["stage"].as_str().unwrap_or("?"),
            err["exception"].as_str().unwrap_or("?")
        ));
    }
    result.load_s = res.get("load_s").and_then(Value::as_f64);
    result.engine_config = res.get("engine_config").cloned().unwrap_or(Value::Null);
    let runs = res
        .get("runs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    result.runs = runs.len();
    let ids = |r: &Value, k: &str| -> Vec<i64> {
        r.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default()
    };
    if let Some(first) = runs.first() {
        result.prompt_token_ids = ids(first, "prompt_token_ids");
        result.output_token_ids = ids(first, "output_token_ids");
        result.text = first
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let mut speeds: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.get("tokens_per_s").and_then(Value::as_f64))
            .collect();
        speeds.sort_by(f64::total_cmp);
        result.tokens_per_s = speeds.get(speeds.len() / 2).copied();
        result.deterministic = true;
        for (i, r) in runs.iter().enumerate().skip(1) {
            let other = ids(r, "output_token_ids");
            if other != result.output_token_ids {
                result.deterministic = false;
                let pos = first_divergence(&result.output_token_ids, &other);
                result.problems.push(format!(
                    "runs disagree: run 1 and run {} first differ at output position {pos} ({:?} vs {:?})",
                    i + 1,
                    result.output_token_ids.get(pos),
                    other.get(pos)
                ));
                break;
            }
        }
    }
    if result.problems.is_empty() && runs.len() != recipe.smoke.runs as usize {
        result.problems.push(format!(
            "expected {} runs, got {}",
            recipe.smoke.runs,
            runs.len()
        ));
    }
    if let Some(path) = golden_path(lr, case)
        && path.exists()
    {
        let golden: Value = read_json(&path)?;
        let want = ids(&golden, "output_token_ids");
        if want == result.output_token_ids {
            result.golden = "matched".into();
        } else {
            result.golden = "mismatched".into();
            let pos = first_divergence(&want, &result.output_token_ids);
            result.problems.push(format!(
                "output differs from golden {} at position {pos} (golden {:?}, got {:?})",
                path.display(),
                want.get(pos),
                result.output_token_ids.get(pos)
            ));
        }
    }
    result.ok = result.problems.is_empty();
    Ok(result)
}

/// The first index where `a` and `b` differ (their common length when one is a prefix).
pub fn first_divergence(a: &[i64], b: &[i64]) -> usize {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()))
}
