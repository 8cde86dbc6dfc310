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
pub fn plan(pin_arg: &str, store_arg: Option<&Path>) -> Result<Plan> {
    let lr = pin::resolve(pin_arg)?;
    let root = Store::default_root(store_arg)?;
    let store = Store::at(&root)?;
    Ok(compute(&lr, &store, &root))
}

fn compute(lr: &LoadedRecipe, store: &Store, root: &Path) -> Plan {
    let r = &lr.recipe;
    let device = &r.build.target_device;
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
    steps.push(step(
        "toolchain",
        if findings.python.is_some() {
            "cached"
        } else {
            "blocked"
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
            match wheel::plan(store, lr, &tc, &src.path, None) {
                Ok(p) if p.entry.exists() => {
                    wheel_state = step("wheel", "cached", p.entry.label(), 0);
                    if let Ok(rec) = wheel::BuildRecord::read(&p.entry.path) {
                        let runtime = venv::runtime_requirements(&src.path, device);
                        let (key, _) = venv::key(lr, &tc, &rec, runtime.as_deref());
                        let e = store.entry(crate::store::Bucket::Venvs, &key);
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
                Ok(p) => {
                    wheel_state = step(
                        "wheel",
                        "to do",
                        format!("build {} (mode {})", p.entry.label(), r.build.mode.as_str()),
                        disk::needed(r, Stage::Wheel),
                    )
                }
                Err(e) => {
                    wheel_state = step(
                        "wheel",
                        "blocked",
                        format!("{e:#}"),
                        disk::needed(r, Stage::Wheel),
                    )
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
    }
}

/// `plan`: prints the plan (text or `--json`). Always exits 0 unless the PIN is bad.
pub fn run(pin_arg: &str, store_arg: Option<&Path>, json: bool) -> Result<()> {
    let p = plan(pin_arg, store_arg)?;
    if json {
        return print_json(&p);
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
    Ok(())
}
