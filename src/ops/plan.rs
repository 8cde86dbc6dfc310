//! `oracle-build plan <PIN>`: each stage, cached or to do, the disk it
//! needs and the keys a build would use. Changes nothing: no fetch, no store
//! directories created. The plan itself is [`crate::pipeline::plan`]'s, the
//! same code `build` runs.

use std::path::Path;

use anyhow::Result;

use crate::ops::print_json;
use crate::pipeline::{self, Plan, StepState};
use crate::recipe::pin;
use crate::store::Store;

const GIB: u64 = 1 << 30;

/// Computes the plan for `pin` against the store at `store_arg`; `offline`:
/// the plan of `build --offline` (no reachability check of the repository,
/// and what an offline build would miss counts as a problem).
///
/// Errors (exit 2): the PIN or the store root is bad.
pub fn plan(
    pin_arg: &str,
    store_arg: Option<&Path>,
    lockfiles: Option<&Path>,
    offline: bool,
) -> Result<Plan> {
    let lr = pin::resolve(pin_arg)?;
    let root = Store::default_root(store_arg)?;
    let store = Store::at(&root)?;
    let lock_dir = pipeline::lock_dir(&lr, lockfiles);
    let mut p = pipeline::plan(&lr, &store, &root, &lock_dir, offline);
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
pub fn run(
    pin_arg: &str,
    store_arg: Option<&Path>,
    lockfiles: Option<&Path>,
    offline: bool,
    json: bool,
) -> Result<()> {
    let p = plan(pin_arg, store_arg, lockfiles, offline)?;
    if json {
        print_json(&p)?;
    } else {
        print!("{}", render(&p));
    }
    blocked(&p)
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
    if p.offline_missing.is_empty() {
        line("offline  ready: an --offline build needs nothing more".into());
    } else {
        line("offline  not ready:".into());
        for m in &p.offline_missing {
            line(format!("  - {m}"));
        }
    }
    let free = p.free_bytes.map_or("unknown".into(), |f| {
        format!("{:.1} GiB", f as f64 / GIB as f64)
    });
    line(format!(
        "disk     needs ~{:.1} GiB, free {free}",
        p.needed_bytes as f64 / GIB as f64
    ));
    if !p.problems.is_empty() {
        line("a build now would stop:".into());
        for problem in &p.problems {
            line(format!("  - {problem}"));
        }
    }
    out
}
