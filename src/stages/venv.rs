//! Stage 4, venv: install the wheel non-editably into a content-addressed,
//! relocatable venv, measure its identity, gate it, and record `oracle.json`.
//!
//! The entry `store/venvs/<key>/` *is* the venv (`bin/python`, `lib/...`),
//! with `oracle.json`, `manifest.json` and `install.log` at its top. It is
//! staged in `<root>/tmp`, identity-checked and smoked there (uv's
//! `--relocatable` venvs do not care where they live), and renamed into place.
//! Every file of the venv is in the manifest and read-only; `oracle.json` is
//! the entry's record and is replaced atomically (never edited) when the gate
//! is re-run under a different smoke configuration.

use std::path::Path;
use std::time::Instant;

use crate::stages::Ctx;
use anyhow::{Context, Result, bail};
use fs_err as fs;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::exit::mismatch;
use crate::key::{KEY_SCHEMA, content_key};
use crate::progress;
use crate::recipe::{BuildMode, LoadedRecipe};
use crate::stages::identity::{self, Check, Identity};
use crate::stages::smoke::{self, SmokeReport};
use crate::stages::wheel::BuildRecord;
use crate::store::{
    self, Bucket, Entry, MANIFEST, Manifest, Store, read_json, sha256_file, write_json,
};
use crate::toolchain::Toolchain;
use crate::uv::pin_lines;

/// The record file of an oracle venv.
pub const ORACLE_JSON: &str = "oracle.json";

/// `oracle.json`: what the oracle is, where it came from, and its gate verdict.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OracleRecord {
    /// Record format version.
    pub schema: u32,
    /// Recipe name.
    pub recipe: String,
    /// Where the recipe was read.
    pub recipe_origin: String,
    /// The recipe's exact text.
    pub recipe_text: String,
    /// The venv key (the entry's name).
    pub key: String,
    /// The hashed inputs of the venv.
    pub inputs: Value,
    /// The wheel key and sha256 installed.
    pub wheel_key: String,
    /// sha256 of the installed wheel.
    pub wheel_sha256: String,
    /// Measured identity (DESIGN.md "Identity").
    pub identity: Identity,
    /// Identity checks against the recipe.
    pub checks: Vec<Check>,
    /// The gate (DESIGN.md "Smoke and the gate").
    pub smoke: SmokeReport,
    /// Tools used.
    pub tools: Toolchain,
    /// Store entries this oracle needs to be rebuilt (its wheel and what the
    /// wheel requires); `gc` keeps them as long as the oracle is rooted.
    #[serde(default)]
    pub requires: Vec<String>,
    /// Things a reviewer should know that do not refuse the oracle (e.g. no
    /// tag reachable from the commit, so the version is setuptools-scm's fallback).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// When the venv was made (RFC 3339).
    pub created: String,
    /// Seconds spent creating and installing the venv.
    pub install_s: f64,
}

impl OracleRecord {
    /// Reads `<venv>/oracle.json`.
    pub fn read(venv: &Path) -> Result<OracleRecord> {
        read_json(&venv.join(ORACLE_JSON))
    }
}

/// The venv key: Python identity, package, the wheel's sha256, the pins and
/// indexes, and the runtime requirements file used.
pub fn key(
    lr: &LoadedRecipe,
    tc: &Toolchain,
    wheel: &BuildRecord,
    runtime_reqs: Option<&str>,
) -> (String, Value) {
    let r = &lr.recipe;
    let inputs = json!({
        "schema": KEY_SCHEMA,
        "stage": "venv",
        "python": {"version": tc.python.version, "implementation": tc.python.implementation, "platform": tc.python.platform},
        "package": r.source.package,
        "commit": r.source.commit,
        "wheel_sha256": wheel.sha256,
        "pins": r.pins,
        "indexes": r.indexes,
        "runtime_requirements": runtime_reqs,
    });
    (content_key(&inputs), inputs)
}

/// The checkout's runtime requirements file for `device`
/// (`requirements/<device>.txt`, vLLM's layout), relative to `src`, if present.
pub fn runtime_requirements(src: &Path, device: &str) -> Option<String> {
    let rel = format!("requirements/{device}.txt");
    src.join(&rel).is_file().then_some(rel)
}

/// What [`ensure`] did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The venv entry.
    pub entry: Entry,
    /// Its record.
    pub record: OracleRecord,
    /// Whether the venv was built now (false: found in the store).
    pub built: bool,
    /// Whether the smoke run happened now.
    pub smoked: bool,
}

/// Options of the venv stage.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Skip the smoke run (verdict `unsmoked`).
    pub no_smoke: bool,
}

/// The venv stage's key and entry, known before any work.
#[derive(Debug, Clone)]
pub struct VenvPlan {
    /// Content key.
    pub key: String,
    /// The hashed inputs.
    pub inputs: Value,
    /// `store/venvs/<key>`.
    pub entry: Entry,
    /// The checkout's runtime requirements file, if any.
    pub runtime: Option<String>,
    /// The locked runtime set (set by [`crate::stages::hermetic::apply_venv`]).
    pub hermetic: crate::stages::hermetic::VenvHermetic,
}

/// Computes the venv key for installing `wheel` (built from the checkout at `src`).
pub fn plan(
    store: &Store,
    lr: &LoadedRecipe,
    tc: &Toolchain,
    wheel: &BuildRecord,
    src: &Path,
) -> VenvPlan {
    let runtime = runtime_requirements(src, &lr.recipe.build.target_device);
    let (key, inputs) = key(lr, tc, wheel, runtime.as_deref());
    VenvPlan {
        entry: store.entry(Bucket::Venvs, &key),
        key,
        inputs,
        runtime,
        hermetic: Default::default(),
    }
}

/// Returns the oracle venv of `plan`, building it when absent (or when the
/// entry fails its manifest check: the damaged entry is moved aside to
/// `<root>/tmp` and rebuilt), and re-running the gate when its smoke key changed.
///
/// Errors: install fails; exit 3 when the measured identity fails a check
/// (nothing is persisted).
pub fn ensure(
    cx: &Ctx<'_>,
    wheel_entry: &Entry,
    wheel: &BuildRecord,
    src: &Entry,
    plan: &VenvPlan,
    opts: Options,
) -> Result<Outcome> {
    let Ctx { store, lr, .. } = *cx;
    let entry = plan.entry.clone();
    let smoke_key = smoke::smoke_key(store, lr);
    if entry.exists() {
        let problems = Manifest::read(&entry.path)
            .map_or_else(|e| vec![format!("{e:#}")], |m| m.check(&entry.path, false));
        if !problems.is_empty() {
            let _lock = store.lock(&format!("venv-{}", plan.key))?;
            store.quarantine(&entry, &problems)?;
        }
    }
    if !entry.exists() {
        let _lock = store.lock(&format!("venv-{}", plan.key))?;
        if !entry.exists() {
            let record = build(cx, wheel_entry, wheel, src, plan, opts)?;
            return Ok(Outcome {
                entry,
                record,
                built: true,
                smoked: !opts.no_smoke,
            });
        }
    }
    let mut record = OracleRecord::read(&entry.path)?;
    // An unsmoked oracle (built with --no-smoke) is gated by the first build
    // that does not skip the gate, whatever its smoke key.
    let unsmoked = record.smoke.verdict == smoke::Verdict::Unsmoked;
    if opts.no_smoke || (record.smoke.key == smoke_key && !unsmoked) {
        return Ok(Outcome {
            entry,
            record,
            built: false,
            smoked: false,
        });
    }
    let _lock = store.lock(&format!("venv-{}", plan.key))?;
    progress::stage(
        "smoke",
        if unsmoked {
            "this oracle was built with --no-smoke; running the gate now"
        } else {
            "the smoke configuration changed since this oracle was gated; re-running the gate"
        },
    );
    record.smoke = gate(store, &entry.path, lr)?;
    write_record(&entry.path, &record)?;
    Ok(Outcome {
        entry,
        record,
        built: false,
        smoked: true,
    })
}

/// Runs the smoke stage for the venv at `venv`, with logs under a fresh staging directory kept in `<venv>/smoke` when possible.
pub fn gate(store: &Store, venv: &Path, lr: &LoadedRecipe) -> Result<SmokeReport> {
    gate_with(store, venv, lr, &smoke::Options::new(store, lr))
}

/// [`gate`] with smoke options (`smoke --case`, `--record-golden`). Logs are
/// kept in `<root>/logs/smoke-<smoke key>` (`-<case>` appended for one-case runs).
///
/// Errors: as [`smoke::run`] (the tool itself failing, not the oracle).
pub fn gate_with(
    store: &Store,
    venv: &Path,
    lr: &LoadedRecipe,
    opts: &smoke::Options,
) -> Result<SmokeReport> {
    let staging = store.stage("smoke")?;
    let report = smoke::run(venv, lr, staging.path(), opts)?;
    // A one-case run must not replace the logs a full run's record points at.
    let name = match &opts.only {
        Some(case) => format!("smoke-{}-{case}", report.key),
        None => format!("smoke-{}", report.key),
    };
    let keep = store.root().join("logs").join(name);
    let _ = fs::create_dir_all(store.root().join("logs"));
    let _ = std::fs::remove_dir_all(&keep);
    let _ = std::fs::rename(staging.path(), &keep);
    Ok(relocate_logs(report, staging.path(), &keep))
}

fn relocate_logs(mut report: SmokeReport, from: &Path, to: &Path) -> SmokeReport {
    for c in &mut report.cases {
        if let Ok(rel) = c.log.strip_prefix(from) {
            c.log = to.join(rel);
        }
    }
    if let Some(log) = report.probe.get_mut("log")
        && let Some(rel) = log
            .as_str()
            .and_then(|l| Path::new(l).strip_prefix(from).ok())
    {
        *log = json!(to.join(rel));
    }
    report
}

/// Replaces `<venv>/oracle.json` atomically (the entry's top directory is
/// opened for writing only for the rename).
pub fn write_record(venv: &Path, record: &OracleRecord) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(venv)?.permissions().mode();
    fs::set_permissions(venv, std::fs::Permissions::from_mode(mode | 0o200))?;
    let res = write_json(&venv.join(ORACLE_JSON), record);
    if let Ok(meta) = fs::metadata(venv.join(ORACLE_JSON)) {
        let m = meta.permissions().mode() & !0o222;
        let _ = fs::set_permissions(venv.join(ORACLE_JSON), std::fs::Permissions::from_mode(m));
    }
    fs::set_permissions(venv, std::fs::Permissions::from_mode(mode))?;
    res
}

fn build(
    cx: &Ctx<'_>,
    wheel_entry: &Entry,
    wheel: &BuildRecord,
    src: &Entry,
    plan: &VenvPlan,
    opts: Options,
) -> Result<OracleRecord> {
    let Ctx { store, lr, tc, uv } = *cx;
    let r = &lr.recipe;
    let (key, entry, runtime) = (plan.key.as_str(), &plan.entry, plan.runtime.as_deref());
    progress::stage(
        "install",
        format!("installing {} into {}", wheel.wheel, entry.label()),
    );
    let t0 = Instant::now();
    let created = jiff::Timestamp::now().to_string();
    let staging = store.stage(&format!("venv-{key}"))?;
    let venv = staging.path().join("venv");
    let scratch = staging.path().join("scratch");
    fs::create_dir_all(&scratch)?;
    let log = store.stage_log(&format!("install-{key}"))?;
    let wheel_path = wheel.wheel_path(&wheel_entry.path);
    let sha = sha256_file(&wheel_path)?;
    if sha != wheel.sha256 {
        bail!(
            "wheel {} has sha256 {sha}, but build.json records {}",
            wheel_path.display(),
            wheel.sha256
        );
    }
    uv.venv(&tc.python.path, &venv, true, &log)?;
    let overrides = scratch.join("overrides.txt");
    fs::write(&overrides, pin_lines(&r.pins))?;
    let mut args: Vec<String> = vec![
        "--compile-bytecode".into(),
        "--override".into(),
        overrides.display().to_string(),
    ];
    if let Some(locked) = &plan.hermetic.runtime_lock {
        // Exactly the locked runtime set plus the wheel, by path and sha256.
        let wheel_line = format!(
            "{} @ file://{} --hash=sha256:{}",
            r.source.package,
            wheel_path.display(),
            wheel.sha256
        );
        // The lock already applied the pins; only bytecode compilation is added.
        locked
            .install(
                uv,
                &venv,
                &scratch,
                &[wheel_line],
                &["--compile-bytecode".into()],
                &log,
            )
            .context("installing the oracle venv from the locked runtime set")?;
    } else {
        if let Some(rel) = runtime {
            args.extend(["-r".into(), src.path.join(rel).display().to_string()]);
        }
        args.extend(r.pins.iter().map(|(n, v)| format!("{n}=={v}")));
        args.push(wheel_path.display().to_string());
        uv.pip_install(&venv, &args, &log)
            .context("installing the oracle venv")?;
    }
    let install_s = t0.elapsed().as_secs_f64();

    progress::stage("identity", "measuring the oracle's identity");
    let mode = wheel
        .inputs
        .get("mode")
        .and_then(Value::as_str)
        .map_or(r.build.mode, |m| {
            if m == "precompiled" {
                BuildMode::Precompiled
            } else {
                BuildMode::Source
            }
        });
    let mut ident = identity::measure(&venv, &r.source.package, &r.source.commit, mode)?;
    ident.tags_at_commit = crate::stages::source::tags_at(&src.path, &r.source.commit);
    let mut warnings = Vec::new();
    if crate::stages::source::nearest_tag(&src.path, &r.source.commit).is_none() {
        let w = format!(
            "no tag is reachable from {} in {} (a shallow or tagless repository): setuptools-scm fell back to {}, which will not match the upstream version string",
            r.source.commit,
            r.source.repo,
            ident
                .runtime_version
                .as_deref()
                .unwrap_or("a 0.1.devN version")
        );
        progress::stage("identity", format!("warning: {w}"));
        warnings.push(w);
    }
    let checks = identity::checks(&ident, r);
    if checks.iter().any(|c| !c.ok) {
        return Err(mismatch(format!(
            "the oracle built from {} is not the pin; refusing it:\n{}",
            r.source.commit,
            identity::describe_failures(&checks)
        )));
    }
    let smoke = if opts.no_smoke {
        SmokeReport::skipped(smoke::smoke_key(store, lr))
    } else {
        smoke::run(
            &venv,
            lr,
            &scratch.join("smoke"),
            &smoke::Options::new(store, lr),
        )?
    };
    // Paths were measured in staging; record the final ones.
    let staged = venv.display().to_string();
    let fin = entry.path.display().to_string();
    ident.package_path = ident.package_path.map(|p| p.replacen(&staged, &fin, 1));
    ident.package_dir = ident.package_dir.map(|p| p.replacen(&staged, &fin, 1));
    ident.sys_prefix = fin.clone();
    let record = OracleRecord {
        schema: 1,
        recipe: r.name.clone(),
        recipe_origin: lr.origin.clone(),
        recipe_text: lr.text.clone(),
        key: key.to_string(),
        inputs: plan.inputs.clone(),
        wheel_key: wheel.key.clone(),
        wheel_sha256: wheel.sha256.clone(),
        identity: ident,
        checks,
        smoke,
        tools: tc.clone(),
        requires: std::iter::once(wheel_entry.label())
            .chain(plan.hermetic.runtime_lock.iter().flat_map(|l| l.labels()))
            .collect(),
        warnings,
        created,
        install_s,
    };
    // Logs and smoke results travel with the entry.
    fs::copy(&log, scratch.join("install.log"))?;
    store::copy_tree(&scratch, &venv.join("oracle-build"))?;
    let mut record = record;
    record.smoke = relocate_logs(record.smoke, &scratch, &entry.path.join("oracle-build"));
    write_json(&venv.join(ORACLE_JSON), &record)?;
    Manifest::build(&venv, &[MANIFEST, ORACLE_JSON])?.write(&venv)?;
    store.persist(&venv, entry)?;
    let _ = fs::remove_file(&log);
    Ok(record)
}
