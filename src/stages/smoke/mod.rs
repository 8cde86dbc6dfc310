//! Stage 6, smoke: run the probe and the gate cases in the oracle venv and
//! decide *gateable* (docs/smoke.md).
//!
//! One process per case, each under a timeout (its whole process group is
//! killed when it runs over), with the embedded driver `py/smoke_driver.py`.
//! The verdict is `gateable` only when the probe passed, every case ran,
//! every run of a case produced the same tokens, every golden matched under
//! the same engine configuration, and the host's boot id did not change.
//! [`golden`] reads and compares goldens; [`npy`] reads numpy goldens.

mod confine;
mod driver;
pub mod golden;
pub mod model;
pub mod npy;
pub mod prompts;
mod record_golden;
mod report;
pub mod serve;
pub mod team_golden;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use fs_err as fs;
use serde_json::{Value, json};

pub use confine::{CacheRequest, KVCACHE_DEFAULT_GIB, KVCACHE_VAR};
use driver::{DRIVER_PY, DriverCase, DriverRun, run_driver};
use golden::compare_golden;
pub use golden::{ConfigDiff, GoldenDiff, GoldenState};
pub use record_golden::record_report;
use record_golden::{Pending, record_golden, write_goldens};
pub use report::{
    CacheUse, Candidate, CaseResult, Disagreement, EngineRecord, GateAttempt, KvCacheSpace,
    ServeOutcome, ServeResult, SmokeReport, TmpLeft, TopLogprob, UnreadKnob, Usage, Verdict,
    describe_candidates, describe_diff,
};

use crate::host::toolchain;
use crate::progress;
use crate::recipe::{CONFINED_SMOKE_VARS, Case, LoadedRecipe, Probe, expand_env};
use crate::stages::identity::loaded::{MAX_MAPPED, MAX_PATH};
use crate::store::Store;
use crate::store::key::{KEY_SCHEMA, content_key};

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
    /// Where each engine process's `TMPDIR` is made: the store's `tmp`
    /// (`None`: inside the run directory; see `confine`).
    pub tmp_root: Option<PathBuf>,
    /// Where the sha256 of each model file is kept between gates
    /// ([`model::take`]; `None`: every file hashed every time).
    pub model_hashes: Option<PathBuf>,
    /// The oracle's engine cache the warm caches are kept in (`None`:
    /// scratch caches, deleted after the run; see `confine`).
    pub engine_cache: Option<CacheRequest>,
}

/// How `--record-golden` records.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// The oracle identity stamped into each golden.
    pub oracle: Value,
    /// `--force`: replace goldens the new output disagrees with. Without it,
    /// such a golden makes the run fail (exit 2) and no golden is written.
    pub force: bool,
    /// Per case name, what `advance --accept` stamps into the golden
    /// ([`golden::Golden::advance`]); empty for `smoke --record-golden`.
    pub advance: std::collections::BTreeMap<String, Value>,
}

impl Options {
    /// Compare with goldens (none recorded), every case, goldens of `lr` in `store`.
    pub fn new(store: &Store, lr: &LoadedRecipe) -> Options {
        Options {
            goldens_dirs: golden::dirs(store.root(), lr),
            only: None,
            record: None,
            tmp_root: (!store.read_only()).then(|| store.tmp_dir()),
            model_hashes: (!store.read_only()).then(|| store.model_hashes_dir()),
            engine_cache: None,
        }
    }

    /// These options with the warm caches kept in `store`'s engine cache
    /// of the oracle with venv key `venv_key` (emptied first when `cold`);
    /// none in a read-only store.
    pub fn with_engine_cache(mut self, store: &Store, venv_key: &str, cold: bool) -> Options {
        self.engine_cache = (!store.read_only()).then(|| CacheRequest {
            store: store.clone(),
            venv_key: venv_key.to_string(),
            cold,
        });
        self
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
/// content (manifest included), the driver's text, the variables the gate
/// confines and the KV cache bound it gives a CPU engine, and the online
/// leg (`smoke.serve`) when the recipe has one.
pub fn smoke_key_in(lr: &LoadedRecipe, goldens_dirs: &[PathBuf]) -> String {
    let s = &lr.recipe.smoke;
    let cases: Vec<Value> = s
        .cases
        .iter()
        .map(|c| {
            let loc = golden::locate(lr, goldens_dirs, c);
            let mut v = json!({
                "case": c,
                "model": expand_env(&c.model).unwrap_or_else(|e| format!("unset: {e}")),
                "golden": golden::content_digest(&loc),
                "golden_path": loc.path,
            });
            // What the driver passes, when `mode` adds to `engine_args`
            // (only then, so the keys of cases that say it stay as they were).
            let passed = c.driver_engine_args();
            if passed != c.engine_args {
                v["engine_args_passed"] = json!(passed);
            }
            // Only when set, so the keys of single-prompt cases stay as they were.
            if c.prompts_file.is_some() {
                v["prompts"] = json!(prompts::case_prompts(lr, c));
            }
            v
        })
        .collect();
    let mut key = json!({
        "schema": KEY_SCHEMA, "stage": "smoke", "env": s.env, "runs": s.runs, "probe": s.probe,
        "timeout_s": s.timeout_s, "near_tie_nats": s.near_tie_nats, "logprobs": s.logprobs,
        "cases": cases, "driver": hex::encode(sha2_digest(DRIVER_PY.as_bytes())),
    });
    // The confinement changes what the engine may reach (offline, no
    // shared caches): a gate run before it is run again.
    key["confined"] = json!(CONFINED_SMOKE_VARS);
    if let Some(kv) = confine::kv_cache_space(lr).filter(|kv| kv.from == "default") {
        key["kv_cache_space_default"] = json!(kv.gib);
    }
    // Only when set, so the keys of recipes without it stay as they were.
    if let Some(serve) = &s.serve {
        key["serve"] = json!(serve);
    }
    if s.allow_ptx_jit {
        key["allow_ptx_jit"] = Value::Bool(true);
    }
    content_key(&key)
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
    run_held(venv, lr, out_dir, opts, &|| Ok(()))
}

/// [`run`], with `hold` called between the probe and the cases: a build runs
/// the probe while the oracle's identity is measured, and `hold` waits for
/// that verdict, so a venv that is not the pin never loads a model.
///
/// Errors: as [`run`]; `hold`'s error, returned as it is (no case is run).
pub fn run_held(
    venv: &Path,
    lr: &LoadedRecipe,
    out_dir: &Path,
    opts: &Options,
    hold: &dyn Fn() -> Result<()>,
) -> Result<SmokeReport> {
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
    let mut engine = confine::EngineDirs::create(
        out_dir,
        opts.tmp_root.as_deref(),
        opts.engine_cache.as_ref(),
        &confine::device_name(lr, &gpus),
    )?;
    let kv_cache_space = confine::kv_cache_space(lr);
    let mut probe_env = recipe.smoke.env.clone();
    if let Some(kv) = &kv_cache_space {
        probe_env.insert(KVCACHE_VAR.into(), kv.gib.clone());
    }

    let probe = match recipe.smoke.probe.describe(&recipe.source.package) {
        None => Value::Null,
        Some(op) => {
            progress::stage("smoke", format!("probe: {op} on {device}"));
            let mut cfg = json!({"package": recipe.source.package, "device": device});
            if let Probe::Custom(p) = &recipe.smoke.probe {
                cfg["module"] = json!(p.module);
                cfg["function"] = json!(p.function);
            }
            let run = engine.run_env("probe")?;
            let out = run_driver(
                &python, &driver, "probe", "probe", &cfg, out_dir, &probe_env, &run.env, &run.tmp,
                timeout,
            );
            engine.finish_run(run);
            let out = out?;
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
            let mapped: Vec<String> = res
                .get("mapped_objects")
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .unwrap_or_default();
            res["mapped_objects"] = json!(bounded_paths(mapped));
            res
        }
    };
    let probe_ok = probe.is_null() || probe["ok"].as_bool().unwrap_or(false);
    hold()?;

    let mut cases = Vec::new();
    let mut not_run = Vec::new();
    let mut pending = Vec::new();
    for case in recipe
        .smoke
        .cases
        .iter()
        .filter(|c| opts.only.as_deref().is_none_or(|o| o == c.name))
    {
        let results = run_case(
            &python,
            &driver,
            lr,
            case,
            out_dir,
            timeout,
            opts,
            probe_ok,
            &mut pending,
            &mut engine,
        )?;
        for result in results {
            for p in &result.problems {
                let reason = format!("case {}: {p}", result.label());
                if result.not_run {
                    not_run.push(reason.clone());
                }
                reasons.push(reason);
            }
            cases.push(result);
        }
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
    // The online leg: each served case after every offline case ran.
    let mut served = Vec::new();
    if let Some(sv) = &recipe.smoke.serve {
        for case in recipe.smoke.cases.iter().filter(|c| {
            sv.cases.contains(&c.name) && opts.only.as_deref().is_none_or(|o| o == c.name)
        }) {
            let offline = cases.iter().find(|r| r.name == case.name);
            if offline.is_some_and(|o| o.not_run) {
                continue;
            }
            let loc = golden::locate(lr, &opts.goldens_dirs, case);
            let result = serve::serve_case(
                venv,
                lr,
                sv,
                case,
                offline,
                &loc,
                opts.record.is_some(),
                out_dir,
                &mut engine,
            )?;
            for p in &result.problems {
                reasons.push(format!("serve {}: {p}", result.case));
            }
            if let Some(f) = &result.instrument_failure {
                reasons.push(format!("serve {}: instrument failure: {f}", result.case));
            }
            served.push(result);
        }
    }
    let engine = engine.finish(
        kv_cache_space,
        Some(confine::engine_path(
            &venv.join("bin"),
            recipe.smoke.env.get("PATH").map(String::as_str),
        )),
    );
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
        engine: Some(engine),
        not_run,
        kernel_coverage: None,
        serve: served,
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
    engine: &mut confine::EngineDirs,
) -> Result<Vec<CaseResult>> {
    let recipe = &lr.recipe;
    let mut env = recipe.smoke.env.clone();
    if let Some(kv) = confine::kv_cache_space(lr) {
        env.insert(KVCACHE_VAR.into(), kv.gib);
    }
    env.extend(case.env.clone());
    let loc = golden::locate(lr, &opts.goldens_dirs, case);
    let mut result = CaseResult {
        name: case.name.clone(),
        model: case.model.clone(),
        mode: case.mode,
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
            GoldenState::NotCompared
        } else {
            GoldenState::None
        },
        golden_path: loc.path.exists().then(|| loc.path.clone()),
        golden_diff: None,
        config_diffs: Vec::new(),
        error: None,
        log: out_dir.join(format!("case-{}.log", case.name)),
        not_run: false,
        model_manifest: None,
        model_check: None,
        model_diff: None,
        mapped_objects: Vec::new(),
        prompt_index: None,
    };
    // A case with several prompts: each is generated and compared on its own.
    let several = match prompts::case_prompts(lr, case) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => {
            result.problems.push(e);
            return Ok(vec![result]);
        }
    };
    // A model this box does not have: the case cannot run here.
    let model = match expand_env(&case.model) {
        Ok(m) => m,
        Err(e) => {
            result.problems.push(format!("model path: {e}"));
            result.not_run = true;
            return Ok(vec![result]);
        }
    };
    result.model = model.clone();
    match model::presence(Path::new(&model)) {
        model::Presence::Present => {}
        // Nothing there: the model is not on this box.
        model::Presence::Absent => {
            result.problems.push(format!(
                "model path {model} does not exist; refusing to run the case"
            ));
            result.not_run = true;
            return Ok(vec![result]);
        }
        // Something there that does not resolve: a fault of this box's
        // model, not its absence.
        model::Presence::Unresolvable(why) => {
            result.problems.push(format!(
                "model path {model} {why}; refusing to run the case"
            ));
            return Ok(vec![result]);
        }
    }
    // The model's identity, before the engine reads it (compared with the
    // golden's below).
    match model::take(Path::new(&model), opts.model_hashes.as_deref()) {
        Ok(m) => {
            result.problems.extend(m.problems.iter().cloned());
            result.model_manifest = Some(m);
        }
        Err(e) => result
            .problems
            .push(format!("the model's files cannot be hashed: {e:#}")),
    }
    progress::stage(
        "smoke",
        format!("case {}: {} x{} runs", case.name, model, recipe.smoke.runs),
    );
    let mut cfg = json!({
        "name": case.name, "package": recipe.source.package, "model": model, "revision": case.revision,
        "prompt": case.prompt, "prompt_token_ids": case.prompt_token_ids,
        "max_tokens": case.max_tokens, "engine_args": case.driver_engine_args(), "mode": case.mode,
        "runs": recipe.smoke.runs, "logprobs": recipe.smoke.logprobs,
    });
    if let Some(p) = &several {
        cfg["prompts"] = json!(p);
    }
    let name = format!("case-{}", case.name);
    let run = engine.run_env(&name)?;
    let out = run_driver(
        python, driver, "case", &name, &cfg, out_dir, &env, &run.env, &run.tmp, timeout,
    );
    engine.finish_run(run);
    let out = out?;
    if let Some(p) = out.failure {
        result.error = Some(json!({"stage": "process", "exception": p, "log_tail": out.log_tail}));
        result.problems.push(p);
        return Ok(vec![result]);
    }
    let res: DriverCase = match out.result.map(serde_json::from_value).transpose() {
        Ok(r) => r.unwrap_or_default(),
        Err(e) => {
            result
                .problems
                .push(format!("the driver's result is malformed: {e}"));
            return Ok(vec![result]);
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
    result.mapped_objects = bounded_paths(res.mapped_objects);
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
    let Some(several) = several else {
        finish_prompt(
            &mut result,
            res.runs,
            &loc,
            lr,
            case,
            opts,
            probe_ok,
            pending,
        );
        return Ok(vec![result]);
    };
    let mut out = Vec::new();
    for (i, prompt) in several.into_iter().enumerate() {
        let mut r = result.clone();
        r.prompt_index = Some(i);
        r.prompt = Some(prompt);
        let runs = res
            .runs
            .iter()
            .filter(|run| run.prompt_index == Some(i))
            .cloned()
            .collect();
        finish_prompt(&mut r, runs, &loc, lr, case, opts, probe_ok, pending);
        out.push(r);
    }
    Ok(out)
}

/// The rest of a case for one prompt: its runs, their agreement, and the
/// golden compared (or, with `--record-golden`, the golden to record).
#[allow(clippy::too_many_arguments)]
fn finish_prompt(
    result: &mut CaseResult,
    runs: Vec<DriverRun>,
    loc: &golden::Location,
    lr: &LoadedRecipe,
    case: &Case,
    opts: &Options,
    probe_ok: bool,
    pending: &mut Vec<Pending>,
) {
    let recipe = &lr.recipe;
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
        pending.extend(record_golden(result, loc, lr, case, opts, probe_ok));
    } else if result.problems.is_empty() {
        compare_golden(result, loc, recipe.smoke.near_tie_nats);
    }
    result.ok = result.problems.is_empty();
}

/// The mapped paths a driver reported, bounded: absolute, at most
/// [`MAX_PATH`] bytes each, sorted, unique, at most [`MAX_MAPPED`].
fn bounded_paths(mut paths: Vec<String>) -> Vec<String> {
    paths.retain(|p| p.starts_with('/') && p.len() <= MAX_PATH);
    paths.sort();
    paths.dedup();
    paths.truncate(MAX_MAPPED);
    paths
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
