//! `oracle-build build <PIN>` (and the bare `oracle-build <PIN>`): the main job.
//!
//! Options in, one call to [`crate::pipeline::run`], the report out.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use crate::exit::{bad_input, not_gateable};
use crate::ops::{Opened, Session, print_json};
use crate::pipeline::{self, Keys};
use crate::stages::smoke::Verdict;

/// Options of `build`.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// The PIN argument.
    pub pin: String,
    /// `--offline`: no network at all.
    pub offline: bool,
    /// `--no-smoke`.
    pub no_smoke: bool,
    /// `--deep`: hash every file of an existing oracle before trusting it.
    pub deep: bool,
    /// `--jobs N`: overrides `build.max_jobs`.
    pub jobs: Option<usize>,
    /// `--activate PATH`: after a gateable build, point the alias PATH at the oracle.
    pub activate: Option<PathBuf>,
    /// `--cache URL|NAME`: substitute from this one cache (else the configured ones).
    pub cache: Option<String>,
    /// `--no-substitute`: take nothing from a cache.
    pub no_substitute: bool,
}

/// What `build` reports (stdout; `--json` prints it whole).
#[derive(Debug, Serialize)]
pub struct BuildReport {
    /// Recipe name.
    pub recipe: String,
    /// The pinned commit.
    pub commit: String,
    /// The oracle venv (`store/venvs/<key>`).
    pub oracle: PathBuf,
    /// The venv key.
    pub key: String,
    /// `<package>.__version__`.
    pub runtime_version: Option<String>,
    /// Gate verdict.
    pub verdict: Verdict,
    /// Why not gateable.
    pub reasons: Vec<String>,
    /// The gate this build ran could not run on this box (an unset
    /// variable, a missing model): `verdict` is the one recorded before,
    /// which stands.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate_not_run: Option<crate::stages::smoke::GateAttempt>,
    /// Why the gate's online leg could not measure (a server that never
    /// answered `/health`): the build then exits 1, not 4.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub instrument_failures: Vec<String>,
    /// Warnings recorded with the oracle (see `OracleRecord::warnings`).
    pub warnings: Vec<String>,
    /// Stages done now (the rest came from the store or a cache).
    pub built: Vec<String>,
    /// Stages taken from a cache instead of being done here.
    pub substituted: Vec<String>,
    /// What `push = "auto"` did, per cache (left out when nothing).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pushed: Vec<crate::pipeline::push::AutoPushed>,
    /// Wall time of this run, seconds.
    pub seconds: f64,
    /// `--activate`: the alias switched to this oracle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activated: Option<crate::ops::activate::Activation>,
    /// The keys used: the same object `plan --json` reports.
    pub keys: Keys,
    /// The version this pin's oracle had before, when the same commit
    /// gives another now (left out when not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version_change: Option<crate::pipeline::VersionChange>,
}

/// Runs the main job in session `s` and prints its report. Errors carry
/// their exit code (2 bad input, 3 identity mismatch, 4 not gateable, 1
/// anything else).
pub fn run(s: &Session, opts: &BuildOptions) -> Result<BuildReport> {
    let report = execute(s, opts)?;
    if s.json {
        print_json(&report)?;
    } else {
        print_report(&report);
    }
    match report.verdict {
        Verdict::Gateable => {}
        Verdict::NotGateable if !report.instrument_failures.is_empty() => {
            // The gate could not measure (the online leg): exit 1, not 4.
            anyhow::bail!(
                "{} was built, but its gate could not measure: {}",
                report.recipe,
                report.instrument_failures.join("; ")
            );
        }
        Verdict::NotGateable => {
            return Err(not_gateable(format!(
                "{} was built but is not gateable{}",
                report.recipe,
                if opts.activate.is_some() {
                    "; no alias was created or switched"
                } else {
                    ""
                }
            )));
        }
        Verdict::Unsmoked => {
            return Err(not_gateable(format!(
                "{} was built but not smoked (--no-smoke), so it is not gateable; `oracle-build build {}{}` runs the gate on it",
                report.recipe,
                crate::shell::shell_quote(&opts.pin),
                s.store.as_ref().map_or(String::new(), |s| format!(
                    " --store {}",
                    crate::shell::shell_quote(&s.display().to_string())
                ))
            )));
        }
    }
    Ok(report)
}

/// Prints `report` as text: oracle, recipe, version, verdict (with reasons),
/// warnings, what was built and how long it took, and the activation.
pub fn print_report(report: &BuildReport) {
    println!("oracle   {}", report.oracle.display());
    println!("recipe   {} @ {}", report.recipe, report.commit);
    println!(
        "version  {}",
        report.runtime_version.as_deref().unwrap_or("(none)")
    );
    if let Some(v) = &report.version_change {
        println!("changed  {}", v.describe());
    }
    println!("verdict  {}", report.verdict.as_str());
    for reason in &report.reasons {
        println!("  - {reason}");
    }
    if let Some(a) = &report.gate_not_run {
        println!(
            "gate     could not run on this box, so the verdict above (recorded before) stands:"
        );
        for reason in &a.reasons {
            println!("  - {reason}");
        }
    }
    for warning in &report.warnings {
        println!("warning  {warning}");
    }
    let built = if report.built.is_empty() {
        "nothing (all stages found in the store)".to_string()
    } else {
        report.built.join(", ")
    };
    println!("built    {built} in {:.2} s", report.seconds);
    if !report.substituted.is_empty() {
        println!(
            "cached   {} (taken from a cache)",
            report.substituted.join(", ")
        );
    }
    if let Some(a) = &report.activated {
        crate::ops::activate::print(a);
    }
}

/// Runs the main job in session `s` without printing: the report whatever
/// the verdict. Errors: bad input (exit 2), identity mismatch (exit 3), any
/// failure (exit 1).
pub fn execute(s: &Session, opts: &BuildOptions) -> Result<BuildReport> {
    if opts.activate.is_some() && opts.no_smoke {
        return Err(bad_input(
            "--activate needs a gateable oracle, and --no-smoke skips the gate; drop one of them",
        ));
    }
    let Opened {
        recipe: lr, store, ..
    } = s.open(&opts.pin)?;

    // roots/<name> and its oracle belong to the recipe that built it.
    crate::stages::oracle::check_root_owner(&store, &lr)?;
    let lock_dir = pipeline::lock_dir(&lr, s.lockfiles());
    // Substitution: the configured caches (`--offline`: file:// ones only).
    let caches: Vec<crate::cache::config::Cache> = if opts.no_substitute {
        Vec::new()
    } else {
        crate::cache::config::load(store.root(), opts.cache.as_deref())?
            .substituters(opts.offline)
            .cloned()
            .collect()
    };
    // `push = "auto"` caches (`--offline`: file:// ones only).
    let push: Vec<crate::cache::config::Cache> =
        crate::cache::config::load(store.root(), opts.cache.as_deref())?
            .caches
            .into_iter()
            .filter(|c| {
                c.push == crate::cache::config::PushPolicy::Auto
                    && (!opts.offline || c.url.is_local())
            })
            .collect();
    let done = pipeline::run(pipeline::RunOptions {
        lr: &lr,
        store: &store,
        lock_dir: &lock_dir,
        offline: opts.offline,
        no_smoke: opts.no_smoke,
        deep: opts.deep,
        jobs: opts.jobs,
        caches: &caches,
        push: &push,
    })?;
    let r = &lr.recipe;
    let rec = done.record();
    let mut report = BuildReport {
        recipe: r.name.clone(),
        commit: r.source.commit.clone(),
        oracle: done.oracle.entry.path.clone(),
        key: rec.key.clone(),
        runtime_version: rec.identity.runtime_version.clone(),
        verdict: rec.smoke.verdict,
        reasons: rec.smoke.reasons.clone(),
        gate_not_run: done.oracle.gate_not_run.clone(),
        instrument_failures: rec.smoke.instrument_failures(),
        warnings: rec.warnings.clone(),
        built: done.built.clone(),
        substituted: done.substituted.clone(),
        pushed: done.pushed.clone(),
        seconds: done.seconds,
        activated: None,
        keys: done.keys.clone(),
        version_change: done.version_change.clone(),
    };
    if let Some(path) = &opts.activate
        && report.verdict == Verdict::Gateable
    {
        // Said when PATH was another recipe's alias.
        let was_alias_of = crate::ops::activate::other_recipe(&store, &lr, path)?;
        let mut a = crate::ops::activate::activate(&store, &lr, &done.oracle.entry, path)?;
        a.was_alias_of = was_alias_of;
        report.activated = Some(a);
    }
    Ok(report)
}
