//! `oracle-build plan <PIN>`: each stage, cached or to do, the disk it
//! needs and the keys a build would use. Changes nothing: no fetch, no store
//! directories created. The plan itself is [`crate::pipeline::plan`]'s, the
//! same code `build` runs.

use anyhow::Result;

use crate::ops::{Opened, Session, print_json};
use crate::pipeline::plan_extras::{self, CacheRow};
use crate::pipeline::{self, Plan, StepState};
use crate::recipe::pin;
use crate::stages::identity::coverage::Planned;

const GIB: u64 = 1 << 30;

/// Computes the plan for `pin_arg` against the store of session `s`; `offline`:
/// the plan of `build --offline` (no reachability check of the repository,
/// and what an offline build would miss counts as a problem); `jobs`: as
/// `build --jobs N`.
///
/// Errors (exit 2): the PIN or the store root is bad.
pub fn plan(s: &Session, pin_arg: &str, offline: bool, jobs: Option<usize>) -> Result<Plan> {
    let Opened {
        recipe: lr,
        root,
        store,
    } = s.open(pin_arg)?;
    let lock_dir = pipeline::lock_dir(&lr, s.lockfiles());
    let mut p = pipeline::plan(&lr, &store, &root, &lock_dir, offline, jobs);
    if offline {
        p.problems.extend(p.offline_missing.iter().cloned());
    }
    Ok(p)
}

/// The error `plan` exits with when a build now would stop before any work
/// (exit 1, as that build would), naming each problem.
fn blocked(p: &Plan) -> Result<()> {
    if p.problems.is_empty() {
        return Ok(());
    }
    Err(anyhow::anyhow!(
        "a build of {} now would stop:\n  - {}",
        p.recipe,
        p.problems.join("\n  - ")
    ))
}

/// `plan`: prints the plan (text or `--json`). Exits 0 when a build could
/// run now, 1 when it would stop before any work (the problems are listed),
/// 2 when the PIN is bad. Changes nothing either way.
pub fn run(s: &Session, pin_arg: &str, offline: bool, jobs: Option<usize>) -> Result<()> {
    let p = plan(s, pin_arg, offline, jobs)?;
    let lr = s.recipe(pin_arg)?;
    let caches = plan_extras::cache_rows(&pin::resolve(pin_arg)?, &p, offline)?;
    let kernels = plan_extras::planned_kernels(&lr);
    if s.json {
        print_json(&PlanReport {
            plan: &p,
            caches: &caches.rows,
            cache_problems: &caches.problems,
            kernels: kernels.as_ref().map(|k| match k {
                Ok(p) => serde_json::to_value(p).unwrap_or_default(),
                Err(e) => serde_json::json!({ "error": e }),
            }),
        })?;
    } else {
        print!("{}", render(&p));
        if let Some(k) = &kernels {
            println!("{}", render_kernels(k));
        }
        for c in &caches.rows {
            let state = match (&c.cache, &c.verdict) {
                (None, _) if c.not_known.is_some() => {
                    format!("not known: {}", c.not_known.as_deref().unwrap_or_default())
                }
                (None, _) => "no cache has it".to_string(),
                (Some(url), None) => format!("in {url}"),
                (Some(url), Some(v)) => format!("in {url}; {v}"),
            };
            println!("cache    {:<10} {:<44} {state}", c.stage, c.tag);
        }
        for problem in &caches.problems {
            println!("problem  {problem}");
        }
    }
    blocked(&p)
}

/// `plan --json`: the plan and, per stage, what the caches hold.
#[derive(Debug, serde::Serialize)]
struct PlanReport<'a> {
    #[serde(flatten)]
    plan: &'a Plan,
    /// Per stage whose key is known and whose entry the store lacks: which
    /// substituting cache has it and, for the wheel, who signed it.
    caches: &'a [CacheRow],
    /// Each substituting cache that could not be read (a timeout, a
    /// refused connection), named with why: what it holds is not known.
    cache_problems: &'a [String],
    /// For a `cuda` recipe: the device code the build will ask for
    /// (`arch_list`, `cubins`, `ptx`), or `{"error": why it is not known}`.
    kernels: Option<serde_json::Value>,
}

/// `kernels  cubins sm_80, sm_90a; PTX none (TORCH_CUDA_ARCH_LIST 8.0;9.0a)`.
fn render_kernels(k: &Result<Planned, String>) -> String {
    let list = |v: &[crate::stages::identity::fatbin::Arch]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    match k {
        Ok(p) => format!(
            "kernels  cubins {}; PTX {} (TORCH_CUDA_ARCH_LIST {}, as torch's cpp_extension reads it)",
            list(&p.cubins),
            list(&p.ptx),
            p.arch_list
        ),
        Err(e) => format!("kernels  unknown: {e}"),
    }
}

/// `plan`'s text: one line per step, the lock, the external sources, the
/// offline readiness, the disk, the problems.
fn render(p: &Plan) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!("plan for {} ({})", p.recipe, p.origin));
    line(format!("store    {}", p.store.display()));
    for s in &p.steps {
        let disk = if s.disk_bytes > 0 && s.state != StepState::Cached {
            format!("  [~{:.1} GiB]", s.disk_bytes as f64 / GIB as f64)
        } else {
            String::new()
        };
        line(format!(
            "  {:<10} {:<7} {}{disk}",
            s.stage,
            s.state.as_str(),
            s.detail
        ));
    }
    line(format!(
        "  {:<10} {:<7} {}",
        "lock",
        "",
        p.lock.dir.display()
    ));
    line(format!(
        "  {:<10} {:<7} {}",
        "",
        "",
        p.lock.state.describe()
    ));
    let host = p.lock.host.as_deref().unwrap_or("unknown");
    match (&p.lock.platform, &p.lock.state) {
        (Some(pl), _) => line(format!(
            "  {:<10} {:<7} platform {pl}: the lock a build on this host ({host}) uses",
            "", ""
        )),
        (None, pipeline::LockState::Locked) => line(format!(
            "  {:<10} {:<7} platform not recorded: taken to be this host's ({host})",
            "", ""
        )),
        (None, _) => line(format!("  {:<10} {:<7} this host is {host}", "", "")),
    }
    if let Some(from) = &p.source_fetched_from {
        line(format!(
            "  {:<10} {:<7} fetched from {from}",
            "source", "origin"
        ));
    }
    for e in &p.ext_sources {
        line(format!(
            "  {:<10} {:<7} {} = {} -> {}{}",
            "ext",
            if e.staged { "staged" } else { "to do" },
            e.name,
            e.origin,
            e.variable,
            e.subdir
                .as_ref()
                .map_or(String::new(), |s| format!(" (/{s})"))
        ));
        if let Some(from) = &e.fetched_from {
            line(format!("  {:<10} {:<7} fetched from {from}", "", ""));
        }
        if let Some(c) = &e.condition {
            line(format!(
                "  {:<10} {:<7} staged although declared under a condition not evaluated here: {c}",
                "", ""
            ));
        }
    }
    if let Some(why) = &p.ext_no_cmake {
        line(format!("  {:<10} {:<7} {why}", "ext", "none"));
    }
    for u in &p.ext_unmapped {
        line(format!(
            "  {:<10} {:<7} cannot redirect: {u}",
            "ext", "report"
        ));
    }
    for u in &p.ext_not_blocking {
        line(format!(
            "  {:<10} {:<7} blocks nothing: {u}",
            "ext", "named"
        ));
    }
    line(format!("jobs     {}: {}", p.jobs.jobs, p.jobs.why));
    if let Some(c) = &p.compile_cost {
        line(format!("compile  {}", c.summary));
    }
    match &p.kernel_families {
        Some(fs) if fs.is_empty() => {
            line("families the tree's configure reported no kernel family (build.json)".into())
        }
        Some(fs) => {
            line("families as the tree's configure reported them (build.json):".into());
            for f in fs {
                line(format!("  {}", f.describe()));
            }
        }
        None => {}
    }
    if p.offline_missing.is_empty() {
        line("offline  ready: an --offline build needs nothing more".into());
    } else {
        line("offline  not ready:".into());
        for m in &p.offline_missing {
            line(format!("  - {m}"));
        }
    }
    for n in &p.not_checked {
        line(format!("not checked: {n}"));
    }
    for w in &p.pin_warnings {
        line(format!("warning  {w}"));
    }
    let free = p.free_bytes.map_or("unknown".into(), |f| {
        format!("{:.1} GiB", f as f64 / GIB as f64)
    });
    line(format!(
        "disk     needs ~{:.1} GiB, free {free} (estimate: {})",
        p.needed_bytes as f64 / GIB as f64,
        p.disk_basis
    ));
    if !p.problems.is_empty() {
        line("a build now would stop:".into());
        for problem in &p.problems {
            line(format!("  - {problem}"));
        }
    }
    out
}
