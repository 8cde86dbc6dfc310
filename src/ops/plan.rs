//! `oracle-build plan <PIN>`: each stage, cached or to do, and the disk it
//! needs. Changes nothing: no fetch, no store directories created.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::disk::{self, Stage};
use crate::ops::print_json;
use crate::pin;
use crate::recipe::{LoadedRecipe, expand_env};
use crate::stages::{source, venv, wheel};
use crate::store::Store;
use crate::toolchain::{self, Toolchain};

const GIB: u64 = 1 << 30;

/// One stage of the plan.
#[derive(Debug, Serialize)]
pub struct Step {
    /// Stage name: toolchain, source, checkout, wheel, venv, smoke.
    pub stage: String,
    /// `cached`, `to do`, or `blocked`.
    pub state: String,
    /// What it would do or what it found.
    pub detail: String,
    /// Disk it needs when done now, bytes.
    pub disk_bytes: u64,
}

/// The whole plan.
#[derive(Debug, Serialize)]
pub struct Plan {
    /// Recipe name.
    pub recipe: String,
    /// Where it was read.
    pub origin: String,
    /// The store root.
    pub store: PathBuf,
    /// Free bytes at the store root (or its nearest existing ancestor).
    pub free_bytes: Option<u64>,
    /// Total disk the to-do stages need.
    pub needed_bytes: u64,
    /// The stages in order.
    pub steps: Vec<Step>,
    /// Problems that would stop a build now.
    pub problems: Vec<String>,
    /// The lock directory and its state.
    pub lock: LockRow,
    /// Every FetchContent source of the checkout and whether it is staged
    /// (empty until the mirror holds the commit).
    pub ext_sources: Vec<crate::ops::hermetic::ExtRow>,
    /// Downloads the build would make that cannot be redirected to a staged copy.
    pub ext_unmapped: Vec<String>,
    /// What an `--offline` build would miss now (empty: it can run offline).
    pub offline_missing: Vec<String>,
}

/// The lock as `plan` shows it.
#[derive(Debug, Serialize)]
pub struct LockRow {
    /// The lock directory.
    pub dir: PathBuf,
    /// `locked`, `none` (a build resolves one), or `stale: ...`.
    pub state: String,
    /// The `--exclude-newer` cut-off it was made with.
    pub exclude_newer: Option<String>,
}

fn step(stage: &str, state: &str, detail: impl Into<String>, disk: u64) -> Step {
    Step {
        stage: stage.into(),
        state: state.into(),
        detail: detail.into(),
        disk_bytes: disk,
    }
}

/// Computes the plan for `pin` against the store at `store_arg`.
pub fn plan(pin_arg: &str, store_arg: Option<&Path>, lockfiles: Option<&Path>) -> Result<Plan> {
    let lr = pin::resolve(pin_arg)?;
    let root = Store::default_root(store_arg)?;
    let store = Store::at(&root)?;
    let lock_dir = crate::stages::lock::lock_dir(&lr, lockfiles);
    Ok(compute(&lr, &store, &root, &lock_dir))
}

fn compute(lr: &LoadedRecipe, store: &Store, root: &Path, lock_dir: &Path) -> Plan {
    let r = &lr.recipe;
    let lock = match crate::stages::lock::load(lock_dir, r) {
        Ok(Some(l)) => LockRow {
            dir: lock_dir.to_path_buf(),
            state: "locked".into(),
            exclude_newer: l.info.exclude_newer,
        },
        Ok(None) => LockRow {
            dir: lock_dir.to_path_buf(),
            state: "none (a build resolves one; `oracle-build lock` keeps it)".into(),
            exclude_newer: None,
        },
        Err(e) => LockRow {
            dir: lock_dir.to_path_buf(),
            state: format!("stale: {e:#}"),
            exclude_newer: None,
        },
    };
    let found = crate::ops::hermetic::discover(store, lr).unwrap_or_default();
    let ext_sources = crate::ops::hermetic::ext_rows(store, &found);
    let offline_missing = crate::ops::hermetic::offline_problems(store, lr, lock_dir);
    let findings = crate::ops::preflight::inspect(store, lr, false);
    let mut steps = Vec::new();
    let tools = format!(
        "python {}: {}; uv: {}; nvcc: {}",
        r.python,
        findings
            .python
            .as_ref()
            .map_or("not found".into(), |p| format!(
                "{} ({})",
                p.version,
                p.path.display()
            )),
        findings
            .uv
            .as_ref()
            .map_or(format!("to provision ({})", toolchain::UV_VERSION), |u| u
                .version
                .clone()),
        findings
            .nvcc
            .as_ref()
            .map_or("not found".into(), |n| n.version.clone()),
    );
    // Cached only when nothing is left to find or install: a uv still to be
    // provisioned is work (and a download), a missing Python blocks the build.
    steps.push(step(
        "toolchain",
        if findings.python.is_none() {
            "blocked"
        } else if findings.uv.is_none() {
            "to do"
        } else {
            "cached"
        },
        tools,
        0,
    ));
    let mirror = source::mirror_entry(store, &r.source.repo);
    steps.push(if findings.source_mirrored {
        step(
            "source",
            "cached",
            format!("{} holds {}", mirror.label(), r.source.commit),
            0,
        )
    } else {
        step(
            "source",
            "to do",
            format!(
                "fetch {} (full history) into {}",
                r.source.repo,
                mirror.label()
            ),
            disk::needed(r, Stage::Source),
        )
    });
    let src = source::checkout_entry(store, &r.source.commit);
    let mut wheel_state = step(
        "wheel",
        "to do",
        "key known once the checkout exists",
        disk::needed(r, Stage::Wheel),
    );
    let mut venv_state = step(
        "venv",
        "to do",
        "key known once the wheel exists",
        disk::needed(r, Stage::Venv),
    );
    if src.exists() {
        steps.push(step("checkout", "cached", src.label(), 0));
        if let (Some(python), Some(uv)) = (&findings.python, &findings.uv) {
            let tc = Toolchain {
                python: python.clone(),
                uv: uv.clone(),
                git: None,
                libgit2: toolchain::libgit2_version(),
                gcc: toolchain::find_gcc(),
                nvcc: findings.nvcc.clone(),
            };
            let known = crate::ops::hermetic::known(store, lr, &src.path, lock_dir);
            match (wheel::plan(store, lr, &tc, &src.path, None), known) {
                (Err(e), _) => {
                    wheel_state = step(
                        "wheel",
                        "blocked",
                        format!("{e:#}"),
                        disk::needed(r, Stage::Wheel),
                    )
                }
                (Ok(_), None) => {
                    wheel_state = step(
                        "wheel",
                        "to do",
                        "key known once the lock's artifacts and the external sources are in the store",
                        disk::needed(r, Stage::Wheel),
                    )
                }
                (Ok(p), Some(h)) => {
                    let p = crate::stages::hermetic::apply_wheel(store, p, h.wheel);
                    if !p.entry.exists() {
                        wheel_state = step(
                            "wheel",
                            "to do",
                            format!("build {} (mode {})", p.entry.label(), r.build.mode.as_str()),
                            disk::needed(r, Stage::Wheel),
                        );
                    } else {
                        wheel_state = step("wheel", "cached", p.entry.label(), 0);
                        if let Ok(rec) = wheel::BuildRecord::read(&p.entry.path) {
                            let vp = venv::plan(store, lr, &tc, &rec, &src.path);
                            let e = crate::stages::hermetic::apply_venv(store, vp, h.venv).entry;
                            venv_state = if e.exists() {
                                step("venv", "cached", e.label(), 0)
                            } else {
                                step(
                                    "venv",
                                    "to do",
                                    format!("install {} into {}", rec.wheel, e.label()),
                                    disk::needed(r, Stage::Venv),
                                )
                            };
                        }
                    }
                }
            }
        }
    } else {
        steps.push(step(
            "checkout",
            "to do",
            format!("check out {} into {}", r.source.commit, src.label()),
            0,
        ));
    }
    steps.push(wheel_state);
    steps.push(venv_state);
    let cases: Vec<String> = r
        .smoke
        .cases
        .iter()
        .map(|c| match expand_env(&c.model) {
            Ok(m) if Path::new(&m).exists() => format!("{} ({m})", c.name),
            Ok(m) => format!("{} (model {m} missing)", c.name),
            Err(e) => format!("{} ({e})", c.name),
        })
        .collect();
    steps.push(step(
        "smoke",
        "to do",
        format!(
            "probe {}; {} runs of: {}",
            r.smoke
                .probe
                .describe(&r.source.package)
                .unwrap_or_else(|| "off".into()),
            r.smoke.runs,
            if cases.is_empty() {
                "no cases".into()
            } else {
                cases.join(", ")
            }
        ),
        0,
    ));
    let needed = steps
        .iter()
        .filter(|s| s.state != "cached")
        .map(|s| s.disk_bytes)
        .sum();
    Plan {
        recipe: r.name.clone(),
        origin: lr.origin.clone(),
        store: root.to_path_buf(),
        free_bytes: disk::free_bytes(root),
        needed_bytes: needed,
        steps,
        problems: findings.problems,
        lock,
        ext_sources,
        ext_unmapped: found.unmapped,
        offline_missing,
    }
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
    json: bool,
) -> Result<()> {
    let p = plan(pin_arg, store_arg, lockfiles)?;
    if json {
        print_json(&p)?;
        return blocked(&p);
    }
    println!("plan for {} ({})", p.recipe, p.origin);
    println!("store    {}", p.store.display());
    for s in &p.steps {
        let disk = if s.disk_bytes > 0 && s.state != "cached" {
            format!("  [~{:.1} GiB]", s.disk_bytes as f64 / GIB as f64)
        } else {
            String::new()
        };
        println!("  {:<10} {:<7} {}{disk}", s.stage, s.state, s.detail);
    }
    println!("  {:<10} {:<7} {}", "lock", "", p.lock.dir.display());
    println!("  {:<10} {:<7} {}", "", "", p.lock.state);
    for e in &p.ext_sources {
        println!(
            "  {:<10} {:<7} {} = {} -> {}{}",
            "ext",
            if e.staged { "staged" } else { "to do" },
            e.name,
            e.origin,
            e.variable,
            e.subdir
                .as_ref()
                .map_or(String::new(), |s| format!(" (/{s})"))
        );
    }
    for u in &p.ext_unmapped {
        println!("  {:<10} {:<7} cannot redirect: {u}", "ext", "report");
    }
    if p.offline_missing.is_empty() {
        println!("offline  ready: an --offline build needs nothing more");
    } else {
        println!("offline  not ready:");
        for m in &p.offline_missing {
            println!("  - {m}");
        }
    }
    let free = p.free_bytes.map_or("unknown".into(), |f| {
        format!("{:.1} GiB", f as f64 / GIB as f64)
    });
    println!(
        "disk     needs ~{:.1} GiB, free {free}",
        p.needed_bytes as f64 / GIB as f64
    );
    if !p.problems.is_empty() {
        println!("a build now would stop:");
        for problem in &p.problems {
            println!("  - {problem}");
        }
    }
    blocked(&p)
}
