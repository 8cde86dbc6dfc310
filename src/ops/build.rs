//! `oracle-build build <PIN>` (and the bare `oracle-build <PIN>`): the main job.
//!
//! recipe -> preflight -> source -> wheel -> venv (install, identity, smoke) -> roots.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::disk::{self, Stage};
use crate::exit::{bad_input, not_gateable};
use crate::ops::print_json;
use crate::pin;
use crate::progress;
use crate::stages::smoke::Verdict;
use crate::stages::{source, venv, wheel};
use crate::store::{Entry, Store};
use crate::uv::Uv;

/// Options of `build`.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// The PIN argument.
    pub pin: String,
    /// `--store`.
    pub store: Option<PathBuf>,
    /// `--offline`: no network at all.
    pub offline: bool,
    /// `--no-smoke`.
    pub no_smoke: bool,
    /// `--jobs N`: overrides `build.max_jobs`.
    pub jobs: Option<usize>,
    /// `--json`.
    pub json: bool,
    /// `--activate PATH`: after a gateable build, point the alias PATH at the oracle.
    pub activate: Option<PathBuf>,
    /// `--lockfiles DIR`: where lock directories live (see `stages::lock::lock_dir`).
    pub lockfiles: Option<PathBuf>,
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
    /// Warnings recorded with the oracle (see `OracleRecord::warnings`).
    pub warnings: Vec<String>,
    /// Stages done now (the rest came from the store).
    pub built: Vec<String>,
    /// Wall time of this run, seconds.
    pub seconds: f64,
    /// `--activate`: the alias switched to this oracle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activated: Option<crate::ops::activate::Activation>,
}

/// Runs the main job and prints its report. Errors carry their exit code
/// (2 bad input, 3 identity mismatch, 4 not gateable, 1 anything else).
pub fn run(opts: &BuildOptions) -> Result<BuildReport> {
    let report = execute(opts)?;
    if opts.json {
        print_json(&report)?;
    } else {
        println!("oracle   {}", report.oracle.display());
        println!("recipe   {} @ {}", report.recipe, report.commit);
        println!(
            "version  {}",
            report.runtime_version.as_deref().unwrap_or("(none)")
        );
        println!("verdict  {}", report.verdict.as_str());
        for reason in &report.reasons {
            println!("  - {reason}");
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
        if let Some(a) = &report.activated {
            crate::ops::activate::print(a);
        }
    }
    match report.verdict {
        Verdict::Gateable => {}
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
                crate::ops::shell_quote(&opts.pin),
                opts.store.as_ref().map_or(String::new(), |s| format!(
                    " --store {}",
                    crate::ops::shell_quote(&s.display().to_string())
                ))
            )));
        }
    }
    Ok(report)
}

/// Runs the main job without printing: the report whatever the verdict.
/// Errors: bad input (exit 2), identity mismatch (exit 3), any failure (exit 1).
pub fn execute(opts: &BuildOptions) -> Result<BuildReport> {
    let t0 = Instant::now();
    if opts.activate.is_some() && opts.no_smoke {
        return Err(bad_input(
            "--activate needs a gateable oracle, and --no-smoke skips the gate; drop one of them",
        ));
    }
    let lr = pin::resolve(&opts.pin)?;
    let r = &lr.recipe;
    let store = Store::at(&Store::default_root(opts.store.as_deref())?)?;
    let lock_dir = crate::stages::lock::lock_dir(&lr, opts.lockfiles.as_deref());
    if opts.offline {
        // Name everything an offline build would miss before any work.
        let mut problems = crate::ops::hermetic::offline_problems(&store, &lr, &lock_dir);
        if !problems.is_empty() {
            problems.extend(crate::ops::preflight::inspect(&store, &lr, true).problems);
            return Err(anyhow::anyhow!(
                "cannot build {} offline:\n  - {}\n(nothing was written to {})",
                r.name,
                problems.join("\n  - "),
                store.root().display()
            ));
        }
    }
    let tc = crate::ops::preflight::toolchain(&store, &lr, opts.offline)?;
    let cleaned =
        store.clean_stale_staging()? + crate::stages::hermetic::StableWorkDir::clean_stale(&store);
    if cleaned > 0 {
        progress::stage(
            "store",
            format!(
                "removed {cleaned} stale staging director{} of killed runs",
                if cleaned == 1 { "y" } else { "ies" }
            ),
        );
    }
    let uv = Uv {
        tool: tc.uv.clone(),
        indexes: r.indexes.clone(),
        offline: opts.offline,
        cache_dir: Some(store.root().join("uv-cache")),
    };
    let cx = crate::stages::Ctx {
        store: &store,
        lr: &lr,
        tc: &tc,
        uv: &uv,
    };
    let mut built = Vec::new();

    // Every entry this build looks at is a temporary GC root first, so a
    // concurrent `gc` cannot delete it between the lookup and its use.
    let temp = store.temp_roots()?;
    let mirror_entry = source::mirror_entry(&store, &r.source.repo);
    let src_entry = source::checkout_entry(&store, &r.source.commit);
    temp.add(&store, &mirror_entry)?;
    temp.add(&store, &src_entry)?;
    if !src_entry.exists() {
        disk::check(store.root(), r, Stage::Source)?;
    }
    let mirror = source::ensure_mirror(&store, &r.source.repo, &r.source.commit, opts.offline)?;
    let (src, src_built) = source::ensure_checkout(&store, &mirror, &r.source.commit)?;
    if src_built {
        built.push("source".to_string());
    }

    let hermetic = crate::ops::hermetic::prepare(&cx, &src, &lock_dir, opts.offline, &temp)?;
    let lock_entry = hermetic.lock_entry.clone();
    let plan = wheel::plan(&store, &lr, &tc, &src.path, opts.jobs)?;
    let plan = crate::stages::hermetic::apply_wheel(&store, plan, hermetic.wheel);
    temp.add(&store, &plan.entry)?;
    if !plan.entry.exists() {
        disk::check(store.root(), r, Stage::Wheel)?;
    }
    let mut requires = vec![src.label(), mirror.label()];
    requires.extend(plan.hermetic.labels());
    requires.extend(lock_entry.iter().map(Entry::label));
    let (mut record, mut wheel_built) = wheel::ensure(&cx, &plan, &src, &requires)?;

    let vplan = venv::plan(&store, &lr, &tc, &record, &src.path);
    let vplan = crate::stages::hermetic::apply_venv(&store, vplan, hermetic.venv);
    temp.add(&store, &vplan.entry)?;
    // The wheel is about to be installed: a damaged one is rebuilt, as a
    // damaged venv is (the build is reproducible, so the key stays valid).
    if !vplan.entry.exists() && wheel::quarantine_if_damaged(&store, &plan.entry, &record)? {
        (record, wheel_built) = wheel::ensure(&cx, &plan, &src, &requires)?;
    }
    if wheel_built {
        built.push("wheel".to_string());
    }
    if !vplan.entry.exists() {
        disk::check(store.root(), r, Stage::Venv)?;
    }
    let outcome = venv::ensure(
        &cx,
        &plan.entry,
        &record,
        &src,
        &vplan,
        venv::Options {
            no_smoke: opts.no_smoke,
        },
    )?;
    if outcome.built {
        built.push("venv".to_string());
    }
    if outcome.smoked {
        built.push("smoke".to_string());
    }
    // One root per pin: the oracle; its record's `requires` keeps the rest.
    store.set_root(&r.name, &outcome.entry)?;
    drop(temp);

    let rec = &outcome.record;
    let mut report = BuildReport {
        recipe: r.name.clone(),
        commit: r.source.commit.clone(),
        oracle: outcome.entry.path.clone(),
        key: rec.key.clone(),
        runtime_version: rec.identity.runtime_version.clone(),
        verdict: rec.smoke.verdict,
        reasons: rec.smoke.reasons.clone(),
        warnings: rec.warnings.clone(),
        built,
        seconds: t0.elapsed().as_secs_f64(),
        activated: None,
    };
    if let Some(path) = &opts.activate
        && report.verdict == Verdict::Gateable
    {
        report.activated = Some(crate::ops::activate::activate(
            &store,
            &lr,
            &outcome.entry,
            path,
        )?);
    }
    Ok(report)
}
