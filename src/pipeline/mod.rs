//! The pipeline layer: the only place that knows the stage order.
//!
//! Both `plan` and `build` (and `export`, through [`inputs`]) go through
//! here, so they cannot disagree about a key: [`plan`] computes every key
//! and entry it can without writing anything, [`run`] ensures them in order,
//! and both get the wheel and venv plans from [`wheel_plan`] and
//! [`venv_plan`].
//!
//! A build, in order:
//!
//! 1. Resolve the PIN to a recipe (`recipe::pin`), open the store.
//! 2. Substitute the hermetic inputs the store lacks (source, lock,
//!    wheelhouse, ext) from the caches (`cache::substitute::inputs`).
//!    `--offline`: name everything an offline build would miss
//!    ([`inputs::offline_problems`], [`preflight::inspect`]) before any work.
//! 3. Preflight: find the toolchain ([`preflight::toolchain`]); clean the
//!    staging directories of killed runs.
//! 4. Register the mirror and checkout as temporary GC roots; ensure the
//!    mirror holds the commit and the read-only checkout exists
//!    (`stages::source`).
//!    The tree's compiler requirements (its CMake files'
//!    `message(FATAL_ERROR ...)` under a condition on the compiler's id or
//!    version) are evaluated with the measured compilers
//!    ([`preflight::check_tree_requirements`]): one they fail is refused
//!    before anything is compiled, one the tree decides at configure time
//!    is a warning. A family of the recipe's `expect.kernel_families` no
//!    `message()` of the tree can report is refused (exit 2,
//!    [`preflight::check_expected_families_known`]). A tree whose build needs Rust has its toolchain
//!    measured and held against the channels it declares
//!    ([`preflight::check_tree_rust`]): exit 2 when nothing installed
//!    satisfies one.
//! 5. Check the recipe's `expect.runtime_version` and
//!    `expect.distribution_version` against what the commit's history fixes
//!    of its version, read from the mirror (`stages::source::history`: the
//!    tag `git describe` finds, the distance, the commit): a contradicted
//!    one fails (exit 3) before any wheel-stage work.
//! 6. Gather the hermetic inputs ([`inputs::prepare`]): the lock (or one
//!    resolved now), its artifacts in the wheelhouse, the staged external
//!    sources, the compiler cache.
//! 7. Plan the wheel from complete inputs ([`wheel_plan`]: one key), take
//!    it from a cache when a trusted one has it, else ensure it
//!    (`stages::wheel`): built in staging, persisted by rename.
//! 8. Plan the venv from the wheel's record ([`venv_plan`]); a damaged wheel
//!    about to be installed is quarantined and rebuilt; a kernel family the
//!    recipe's `expect.kernel_families` names and the tree's configure did
//!    not build fails the build (exit 3, `stages::wheel::check_expected_families`;
//!    the wheel is kept, no venv is made); a runtime lock that
//!    misses or contradicts the wheel's `Requires-Dist` is refused
//!    (`stages::venv::check_requires`) before anything is installed; the
//!    empty venv is made meanwhile (`stages::venv::shell`).
//! 9. Ensure the oracle (`stages::oracle`): install the venv
//!    (`stages::venv`), check its identity (`stages::identity`) while the
//!    gate's probe runs (`stages::smoke`: its cases wait for the identity's
//!    verdict), record `oracle.json`, persist.
//! 10. Point the pin's GC root at the oracle; drop the temporary roots.
//! 11. When the wheel was built here, push to the `push = "auto"` caches
//!     ([`push::auto`]); a failed push is reported, not a build failure.

pub mod advance;
pub mod bundle;
pub mod cache_admin;
pub mod compile_cost;
pub mod doctor;
pub mod inputs;
pub mod pin_check;
pub mod plan_extras;
pub mod preflight;
pub mod provenance;
pub mod push;
pub mod sbom;
pub mod verify;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::host::disk::{self, Stage};
use crate::host::rust;
use crate::host::toolchain::{self, Toolchain};
use crate::host::uv::Uv;
use crate::progress;
use crate::recipe::{LoadedRecipe, expand_env};
use crate::stages::oracle::{self, OracleRecord};
use crate::stages::venv::{self, VenvHermetic, VenvPlan};
use crate::stages::wheel::{self, BuildRecord, StableWorkDir, WheelHermetic, WheelPlan};
use crate::stages::{Ctx, lock, source};
use crate::store::{Entry, Store};

/// The keys of one build: the pinned commit (the source entry's name), the
/// wheel and venv keys and the store lock's, `None` where they cannot be
/// known without doing work (no lock yet, no checkout, the wheel not built).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Keys {
    /// The pinned commit.
    pub source: String,
    /// The wheel key.
    pub wheel: Option<String>,
    /// The venv key.
    pub venv: Option<String>,
    /// The store lock's key (`store/lockfiles/<key>`, a cache's
    /// `lock-<key>`), when the build takes its lock from the store rather
    /// than from a lockfile beside the recipe: known once the mirror holds
    /// the commit (it reads the tree's requirement files for the indexes
    /// the site drops, [`lock::dropped_indexes`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
}

/// The wheel plan for `lr` built from the checkout at `src` with `tc` and
/// the hermetic inputs `hermetic` (step 7): the one place the wheel key is
/// computed, for `plan` and `build` alike.
///
/// Errors: as [`wheel::settings`].
pub fn wheel_plan(
    store: &Store,
    lr: &LoadedRecipe,
    tc: &Toolchain,
    src: &Path,
    jobs: Option<usize>,
    hermetic: WheelHermetic,
) -> Result<WheelPlan> {
    let mut settings = wheel::settings(lr, src, jobs)?;
    let r = &lr.recipe;
    settings.describe = source::describe(
        &source::mirror_entry(store, &r.source.repo).path,
        &r.source.commit,
    );
    Ok(wheel::plan(store, lr, tc, settings, hermetic))
}

/// The venv plan for installing the wheel `record` (step 8): the one place
/// the venv key is computed, for `plan` and `build` alike.
pub fn venv_plan(
    store: &Store,
    lr: &LoadedRecipe,
    tc: &Toolchain,
    record: &BuildRecord,
    src: &Path,
    hermetic: VenvHermetic,
) -> VenvPlan {
    venv::plan(store, lr, tc, record, src, hermetic)
}

/// The state of one step of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum StepState {
    /// Its entry is in the store.
    #[serde(rename = "cached")]
    Cached,
    /// A build would do it now.
    #[serde(rename = "to do")]
    ToDo,
    /// A build would stop here.
    #[serde(rename = "blocked")]
    Blocked,
}

impl StepState {
    /// How `plan` prints it: `cached`, `to do`, `blocked`.
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Cached => "cached",
            StepState::ToDo => "to do",
            StepState::Blocked => "blocked",
        }
    }
}

/// The lock's state as `plan` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    /// A lock is present and current.
    Locked,
    /// No lock: a build resolves one.
    None,
    /// The lock does not match the recipe (the reason).
    Stale(String),
}

impl Serialize for LockState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.describe())
    }
}

impl LockState {
    /// `locked`, `none (...)` or `stale: <reason>`, as `plan` prints it.
    pub fn describe(&self) -> String {
        match self {
            LockState::Locked => "locked".into(),
            LockState::None => "none (a build resolves one; `oracle-build lock` keeps it)".into(),
            LockState::Stale(e) => format!("stale: {e}"),
        }
    }
}

/// One stage of the plan.
#[derive(Debug, Serialize)]
pub struct Step {
    /// Stage name: toolchain, source, checkout, wheel, venv, smoke.
    pub stage: String,
    /// `cached`, `to do`, or `blocked`.
    pub state: StepState,
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
    /// Where that estimate comes from (the wheel stage's, the largest:
    /// [`disk::basis`]).
    pub disk_basis: String,
    /// The stages in order.
    pub steps: Vec<Step>,
    /// `MAX_JOBS` a wheel build here would use now, and why
    /// ([`wheel::jobs::decide`]; `plan --jobs N` as `build --jobs N`).
    pub jobs: wheel::jobs::Jobs,
    /// Problems that would stop a build now.
    pub problems: Vec<String>,
    /// The lock directory and its state.
    pub lock: LockRow,
    /// The URL the recipe's repository is fetched from: `source.repo`
    /// through the site's `[[mirror]]` tables (`None`: a mirror of `none`,
    /// which a build refuses).
    pub source_fetched_from: Option<String>,
    /// Every FetchContent source of the checkout and whether it is staged
    /// (empty until the mirror holds the commit).
    pub ext_sources: Vec<inputs::ExtRow>,
    /// Downloads the build would make that cannot be redirected to a staged copy.
    pub ext_unmapped: Vec<String>,
    /// What is named and blocks nothing ([`ext::Discovery::not_blocking`]):
    /// declarations never taken, downloads the tree's configure decides.
    pub ext_not_blocking: Vec<String>,
    /// Why no external source is read (a target whose build runs no CMake).
    pub ext_no_cmake: Option<String>,
    /// What an `--offline` build would miss now (empty: it can run offline).
    pub offline_missing: Vec<String>,
    /// The keys a build would use now (see [`Keys`]).
    pub keys: Keys,
    /// When the wheel is to be built: the extension sources changed since
    /// the wheel this store built last from the repository, and what the
    /// compiler cache will do ([`compile_cost::for_plan`]).
    pub compile_cost: Option<compile_cost::CompileCost>,
    /// Checks of the source that cannot be made from what the store holds
    /// (the fork-only check on a mirror from a bundle or a cache).
    pub not_checked: Vec<String>,
    /// Each recipe pin that contradicts an exact pin of its tree, naming
    /// both ([`pin_check::warnings`]; empty until the mirror holds the commit).
    pub pin_warnings: Vec<String>,
    /// Once a build of the wheel key has configured (its entry is in the
    /// store): every kernel family the tree's configure reported
    /// (`build.json` `kernel_families`); `None` before.
    pub kernel_families: Option<Vec<crate::stages::wheel::families::KernelFamily>>,
}

/// The lock as `plan` shows it.
#[derive(Debug, Serialize)]
pub struct LockRow {
    /// The lock directory a build uses: the recipe's `lockfiles/<name>/`,
    /// or the `lockfiles/<name>/<P>/` picked for this host (`stages::lock::pick`).
    pub dir: PathBuf,
    /// The platform that lock was resolved for (`None`: no lock, or one that
    /// records none).
    pub platform: Option<String>,
    /// This host's platform (the one a build here picks a lock for).
    pub host: Option<String>,
    /// `locked`, `none` (a build resolves one), or `stale: ...`.
    pub state: LockState,
    /// The `--exclude-newer` cut-off it was made with.
    pub exclude_newer: Option<String>,
}

fn step(stage: &str, state: StepState, detail: impl Into<String>, disk: u64) -> Step {
    Step {
        stage: stage.into(),
        state,
        detail: detail.into(),
        disk_bytes: disk,
    }
}

/// The plan of building `lr` against `store` (at `root`) with the lock in
/// `lock_dir`: each stage cached, to do or blocked, the disk it needs, and
/// every key that can be known without doing work; `offline`: as for a
/// `build --offline` (the repository's reachability is not checked);
/// `jobs`: as `build --jobs N`. Writes nothing: no fetch, no store
/// directory created.
pub fn plan(
    lr: &LoadedRecipe,
    store: &Store,
    root: &Path,
    lock_dir: &Path,
    offline: bool,
    jobs: Option<usize>,
) -> Plan {
    let r = &lr.recipe;
    let host = crate::host::platform::Platform::host().map(|p| p.spelled);
    let lock = match lock::load(lock_dir, lr) {
        Ok(Some(l)) => LockRow {
            dir: l.dir.clone(),
            platform: l.info.platform.clone(),
            host,
            state: LockState::Locked,
            exclude_newer: l.info.exclude_newer,
        },
        Ok(None) => {
            // The lock a previous build resolved into the store, if any.
            let stored = lock::load(&lock::auto_entry(store, r).path, lr)
                .ok()
                .flatten();
            LockRow {
                dir: lock_dir.to_path_buf(),
                platform: stored.and_then(|l| l.info.platform),
                host,
                state: LockState::None,
                exclude_newer: None,
            }
        }
        Err(e) => LockRow {
            dir: lock_dir.to_path_buf(),
            platform: None,
            host,
            state: LockState::Stale(format!("{e:#}")),
            exclude_newer: None,
        },
    };
    let found = inputs::discover(store, lr).unwrap_or_default();
    let ext_sources = inputs::ext_rows(store, &found);
    let offline_missing = inputs::offline_problems(store, lr, lock_dir);
    let mut findings = preflight::inspect(store, lr, offline);
    if !offline && !inputs::lock_problems(store, lr, lock_dir).is_empty() {
        findings
            .problems
            .extend(preflight::index_blockers(store, lr));
    }
    // nvcc's CUDA against the locked torch's, as the build checks it
    // before its wheel stage (the lock given, else the store's).
    if r.build.device() == crate::recipe::TargetDevice::Cuda
        && let Some(nvcc) = &findings.nvcc
        && let Some(l) = lock::load(lock_dir, lr).ok().flatten().or_else(|| {
            lock::load(&lock::auto_entry(store, r).path, lr)
                .ok()
                .flatten()
        })
        && let Some(torch) = [("build lock", &l.build), ("runtime lock", &l.runtime)]
            .into_iter()
            .find_map(|(n, p)| wheel::torch_cuda::of_locked(store, p, n))
        && let Err(e) =
            wheel::torch_cuda::check(&nvcc.version, &nvcc.path.display().to_string(), &torch)
    {
        findings.problems.push(format!("{e:#}"));
    }
    let mut steps = Vec::new();
    let mut tools = format!(
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
    if let Some(c) = &findings.compilers {
        for (name, c) in [("cc", &c.cc), ("cxx", &c.cxx)] {
            if let Some(c) = c {
                tools.push_str(&format!(
                    "; {name}: {} {} ({})",
                    c.id,
                    c.version,
                    c.path.display()
                ));
            }
        }
    }
    // Cached only when nothing is left to find or install: a uv still to be
    // provisioned is work (and a download), a missing Python blocks the build.
    steps.push(step(
        "toolchain",
        if findings.python.is_none() || !findings.compiler_problems.is_empty() {
            StepState::Blocked
        } else if findings.uv.is_none() {
            StepState::ToDo
        } else {
            StepState::Cached
        },
        tools,
        0,
    ));
    let mirror = source::mirror_entry(store, &r.source.repo);
    steps.push(if findings.source_mirrored {
        step(
            "source",
            StepState::Cached,
            format!("{} holds {}", mirror.label(), r.source.commit),
            0,
        )
    } else {
        step(
            "source",
            StepState::ToDo,
            format!(
                "fetch {} (full history) into {}",
                r.source.repo,
                mirror.label()
            ),
            disk::needed(r, Stage::Source),
        )
    });
    let src = source::checkout_entry(store, &r.source.commit);
    let mut keys = Keys {
        source: r.source.commit.clone(),
        wheel: None,
        venv: None,
        lock: (matches!(lock.state, LockState::None)
            && source::mirror_has(store, &r.source.repo, &r.source.commit))
        .then(|| lock::auto_entry(store, r).name),
    };
    let mut wheel_state = step(
        "wheel",
        StepState::ToDo,
        "key known once the checkout exists",
        disk::needed(r, Stage::Wheel),
    );
    let mut venv_state = step(
        "venv",
        StepState::ToDo,
        "key known once the wheel exists",
        disk::needed(r, Stage::Venv),
    );
    // The verdict of a built oracle whose gate a build would not run again.
    let mut gated: Option<String> = None;
    let mut tree_refusals = Vec::new();
    let mut kernel_families = None;
    let mut family_problems: Vec<String> = Vec::new();
    if src.exists() {
        steps.push(step("checkout", StepState::Cached, src.label(), 0));
        if let Some(c) = &findings.compilers {
            tree_refusals = preflight::tree_requirements(lr, &src.path, c).0;
        }
        tree_refusals.extend(preflight::unknown_families(lr, &src.path));
        // The tree's Rust: its toolchain measured (a refusal is a problem).
        let mut plan_rust = None;
        match preflight::tree_rust(lr, &src.path) {
            Ok(None) => {}
            Ok(Some((tree, measured))) => {
                let (state, detail) = match measured {
                    Ok(t) => {
                        let mut d = t.describe();
                        let mut state = StepState::Cached;
                        for l in &tree.locks {
                            let e = crate::stages::rust::crates::entry(store, l);
                            let staged = if e.exists() {
                                "staged"
                            } else {
                                state = StepState::ToDo;
                                "to stage"
                            };
                            d.push_str(&format!(
                                "; crates of {}: {staged} in {}",
                                l.file,
                                e.label()
                            ));
                        }
                        plan_rust = Some(t);
                        (state, d)
                    }
                    Err(rust::Problem::Mismatch(w) | rust::Problem::Missing(w)) => {
                        tree_refusals.push(w.clone());
                        (StepState::Blocked, w)
                    }
                };
                steps.push(step(
                    "rust",
                    state,
                    format!("{detail} ({})", tree.needs.join("; ")),
                    0,
                ));
            }
            Err(e) => tree_refusals.push(format!("{e:#}")),
        }
        if let Some(mut tc) = known_toolchain(&findings) {
            tc.rust = plan_rust;
            let known = inputs::known(store, lr, &src.path, lock_dir);
            match (wheel::settings(lr, &src.path, None), known) {
                (Err(e), _) => {
                    wheel_state = step(
                        "wheel",
                        StepState::Blocked,
                        format!("{e:#}"),
                        disk::needed(r, Stage::Wheel),
                    )
                }
                (Ok(_), None) => {
                    wheel_state = step(
                        "wheel",
                        StepState::ToDo,
                        "key known once there is a lock and the external sources are staged",
                        disk::needed(r, Stage::Wheel),
                    )
                }
                (Ok(_), Some(h)) => {
                    // The same function `run` uses: the same key.
                    if let Ok(p) = wheel_plan(store, lr, &tc, &src.path, None, h.wheel) {
                        keys.wheel = Some(p.key.clone());
                        if !p.entry.exists() {
                            wheel_state = step(
                                "wheel",
                                StepState::ToDo,
                                format!(
                                    "build {} (mode {})",
                                    p.entry.label(),
                                    r.build.mode.as_str()
                                ),
                                disk::needed(r, Stage::Wheel),
                            );
                        } else {
                            wheel_state = step("wheel", StepState::Cached, p.entry.label(), 0);
                            if let Ok(rec) = BuildRecord::read(&p.entry.path) {
                                kernel_families = rec.kernel_families(&p.entry.path);
                                family_problems = crate::stages::wheel::families::unmet(
                                    &r.expect.kernel_families,
                                    kernel_families.as_deref(),
                                )
                                .into_iter()
                                .map(|u| format!("expect.kernel_families: the wheel {} lacks {u} (a build stops before the venv, exit 3)", p.entry.label()))
                                .collect();
                                let e = venv_plan(store, lr, &tc, &rec, &src.path, h.venv).entry;
                                keys.venv = Some(e.name.clone());
                                venv_state = if e.exists() {
                                    gated = gate_recorded(store, lr, &e.path);
                                    step("venv", StepState::Cached, e.label(), 0)
                                } else {
                                    step(
                                        "venv",
                                        StepState::ToDo,
                                        format!("install {} into {}", rec.wheel, e.label()),
                                        disk::needed(r, Stage::Venv),
                                    )
                                };
                            }
                        }
                    }
                }
            }
        }
    } else {
        steps.push(step(
            "checkout",
            StepState::ToDo,
            format!("check out {} into {}", r.source.commit, src.label()),
            0,
        ));
    }
    let compile_cost = (wheel_state.state != StepState::Cached)
        .then(|| compile_cost::for_plan(store, lr))
        .flatten();
    // A build that would compile the wheel and then could not gate.
    if wheel_state.state != StepState::Cached {
        tree_refusals.extend(preflight::gate_blockers(lr));
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
    let (smoke_state, smoke_note) = match gated {
        Some(verdict) => (
            StepState::Cached,
            format!(
                "{verdict}, recorded in oracle.json (`{}` runs the gate again); ",
                crate::shell::command_at(&format!("smoke {}", crate::recipe::shell_arg(lr)), root)
            ),
        ),
        None => (StepState::ToDo, String::new()),
    };
    steps.push(step(
        "smoke",
        smoke_state,
        format!(
            "{smoke_note}probe {}; {} runs of: {}",
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
        .filter(|s| s.state != StepState::Cached)
        .map(|s| s.disk_bytes)
        .sum();
    Plan {
        recipe: r.name.clone(),
        origin: lr.origin.clone(),
        store: root.to_path_buf(),
        free_bytes: disk::free_bytes(root),
        needed_bytes: needed,
        disk_basis: disk::basis(r, Stage::Wheel),
        steps,
        jobs: wheel::jobs::decide(&r.build, jobs, &wheel::jobs::Host::measure()),
        problems: findings
            .compiler_problems
            .into_iter()
            .chain(tree_refusals)
            .chain(findings.problems)
            .chain(family_problems)
            .collect(),
        lock,
        source_fetched_from: source::origin_url(store, &r.source.repo).ok(),
        ext_sources,
        ext_unmapped: found.unmapped,
        ext_not_blocking: found.not_blocking,
        ext_no_cmake: found.no_cmake,
        offline_missing,
        keys,
        compile_cost,
        not_checked: if findings.source_mirrored && !source::has_branches(&mirror.path) {
            vec![source::fork_check_not_made(
                &r.source.repo,
                &r.source.commit,
            )]
        } else {
            Vec::new()
        },
        kernel_families,
        pin_warnings: pin_check::warnings(store, lr),
    }
}

/// What [`run`] takes: the recipe, the store, and the build's options.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions<'a> {
    /// The recipe to build.
    pub lr: &'a LoadedRecipe,
    /// The store to build into.
    pub store: &'a Store,
    /// The lock directory (see `stages::lock::lock_dir`).
    pub lock_dir: &'a Path,
    /// `--offline`: no network at all.
    pub offline: bool,
    /// `--no-smoke`: skip the gate (verdict `unsmoked`).
    pub no_smoke: bool,
    /// `--deep`: hash every file of an existing oracle before trusting it.
    pub deep: bool,
    /// `--jobs N`: overrides `build.max_jobs`.
    pub jobs: Option<usize>,
    /// The caches to substitute stages from, in lookup order (empty: none;
    /// see `cache::config::CacheConfig::substituters`).
    pub caches: &'a [crate::cache::config::Cache],
    /// The caches with `push = "auto"`: a build that built the wheel
    /// pushes to them after the oracle is made ([`push::auto`]).
    pub push: &'a [crate::cache::config::Cache],
}

/// What [`run`] did.
#[derive(Debug, Clone)]
pub struct Built {
    /// The oracle entry and its record.
    pub oracle: oracle::Outcome,
    /// The stages done now (the rest came from the store), in order.
    pub built: Vec<String>,
    /// The keys used.
    pub keys: Keys,
    /// The stages taken from a cache instead of being done here, in order.
    pub substituted: Vec<String>,
    /// What `push = "auto"` did, per cache (empty: nothing was pushed).
    pub pushed: Vec<push::AutoPushed>,
    /// Wall time, seconds.
    pub seconds: f64,
    /// The version this pin's oracle had before, when it is another now
    /// for the same commit (a tag moved, deleted or made upstream).
    pub version_change: Option<VersionChange>,
}

/// The version of a recipe's oracle changed under the same commit: the
/// previous oracle's (the one its GC root named before this build) and
/// this one's, and the tag changes the source stage saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionChange {
    /// The previous oracle's `runtime_version`.
    pub from: String,
    /// This oracle's.
    pub to: String,
    /// The previous oracle's venv.
    pub previous_oracle: std::path::PathBuf,
    /// The tag moves of this build's refresh (empty: none seen now; the
    /// tags changed before, or a tag was made upstream).
    pub tag_moves: Vec<source::TagMove>,
}

impl VersionChange {
    /// One line: `0.1.1.dev1+g… -> 0.1.0 under the same commit: tag v0.1.0 moved upstream from commit … to …`.
    pub fn describe(&self) -> String {
        let why = if self.tag_moves.is_empty() {
            "the tags of its history changed upstream".to_string()
        } else {
            self.tag_moves
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        };
        format!(
            "{} -> {} under the same commit (the previous oracle: {}): {why}",
            self.from,
            self.to,
            self.previous_oracle.display()
        )
    }
}

impl Built {
    /// The oracle's record.
    pub fn record(&self) -> &OracleRecord {
        &self.oracle.record
    }
}

/// Runs the build of the outline above, steps 2-10, ensuring each stage's
/// entry in order; every entry looked at is a temporary GC root first, so a
/// concurrent `gc` cannot delete it between the lookup and its use.
///
/// Errors: bad input (exit 2), identity mismatch (exit 3), any failure (exit 1);
/// `offline` and something missing (all of it named, nothing written).
pub fn run(o: RunOptions<'_>) -> Result<Built> {
    let t0 = Instant::now();
    let (lr, store) = (o.lr, o.store);
    let r = &lr.recipe;
    // 1b. Substitution of the hermetic inputs (source, lock, wheelhouse,
    // ext) from the configured caches, before anything checks for them.
    let subs = crate::cache::substitute::Substituter::new(store, o.caches)?
        .for_repo(&r.source.repo)
        .offline(o.offline);
    let mut substituted = Vec::new();
    let early_temp = if subs.is_empty() {
        None
    } else {
        store.init()?;
        let t = store.temp_roots()?;
        substituted = crate::cache::substitute::inputs(&subs, lr, o.lock_dir, &t)?;
        Some(t)
    };
    // 2. Offline: name everything an offline build would miss before any
    // work; the toolchain's probes (3) run meanwhile, writing nothing.
    let (missing, findings) = std::thread::scope(|s| {
        let probes = s.spawn(|| preflight::inspect(store, lr, o.offline));
        let missing = if o.offline {
            inputs::offline_problems(store, lr, o.lock_dir)
        } else {
            Vec::new()
        };
        let findings = probes
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (missing, findings)
    });
    if !missing.is_empty() {
        let mut problems = missing;
        problems.extend(findings.problems);
        // What it misses may be what a killed import or pull was bringing.
        let interrupted: Vec<String> = store
            .left_by_dead()
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .filter(|n| n.starts_with("import.") || n.starts_with("pull."))
            .collect();
        if !interrupted.is_empty() {
            problems.push(format!(
                "a run bringing inputs into this store was interrupted (an import, a pull, or a build taking them from a cache; it left {}): run it again",
                interrupted.join(", ")
            ));
        }
        return Err(anyhow::anyhow!(
            "cannot build {} offline:\n  - {}\n(nothing was written to {})",
            r.name,
            problems.join("\n  - "),
            store.root().display()
        ));
    }
    // 3. Preflight, with what would stop the build after hours of work:
    // the gate's models (the first build of a recipe that gates: a rebuild
    // is checked before its compile, 7), and the package indexes the lock
    // and the wheelhouse still need (online).
    let mut findings = findings;
    let first_build = std::fs::symlink_metadata(store.roots_dir().join(&r.name)).is_err();
    if !o.no_smoke && first_build {
        findings.problems.extend(preflight::gate_blockers(lr));
    }
    if !o.offline && !inputs::lock_problems(store, lr, o.lock_dir).is_empty() {
        findings
            .problems
            .extend(preflight::index_blockers(store, lr));
    }
    let mut tc = preflight::toolchain_of(store, lr, findings)?;
    let cleaned = store.clean_stale_staging()? + StableWorkDir::clean_stale(store);
    let partial = store.clean_stale_downloads()?;
    if partial > 0 {
        progress::stage(
            "store",
            format!("removed {partial} partial download(s) of killed runs"),
        );
    }
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
        indexes: crate::host::uv::plain_indexes(&lock::indexes::site_indexes(store, &r.indexes)?),
        offline: o.offline,
        cache_dir: Some(store.uv_cache_dir()),
        tmp_dir: Some(store.uv_tmp_dir()),
    };
    let mut built = Vec::new();

    // 4. Source.
    let temp = match early_temp {
        Some(t) => t,
        None => store.temp_roots()?,
    };
    let mirror_entry = source::mirror_entry(store, &r.source.repo);
    let src_entry = source::checkout_entry(store, &r.source.commit);
    temp.add(store, &mirror_entry)?;
    temp.add(store, &src_entry)?;
    if !src_entry.exists() {
        disk::check(store.root(), r, Stage::Source)?;
    }
    let source::Refreshed {
        entry: mirror,
        fetched,
        moved: tag_moves,
    } = source::ensure_mirror_refreshed(
        store,
        &r.source.repo,
        &r.source.commit,
        o.offline,
        r.source.moved_tags,
    )?;
    let (src, src_built) = source::ensure_checkout(store, &mirror, &r.source.commit)?;
    // A pin against an exact pin of the tree: said, never refused.
    for w in pin_check::warnings(store, lr) {
        progress::stage("source", format!("warning: {w}"));
    }
    // Whether a fork-only commit is reached by no branch or tag: asked only
    // when something is built (the answer goes into the oracle's record,
    // which a no-op prints), since libgit2's start-up alone costs a no-op
    // about 40 ms (it loads every system CA certificate).
    // Only against branches fetched from the repository now: a mirror from
    // a bundle or a cache has none, so the check is said not to be made.
    let fork_warning = || {
        if fetched != source::Fetched::Now {
            return None;
        }
        let w = source::fork_only_warning(&mirror.path, &r.source.repo, &r.source.commit);
        if let Some(w) = &w {
            progress::stage("source", format!("warning: {w}"));
        }
        w
    };
    if src_built {
        built.push("source".to_string());
    }
    // Tags a cache or bundle brought unsigned decide no version: said.
    let unconfirmed = source::unconfirmed_tags(&mirror.path, &r.source.commit);
    if !unconfirmed.is_empty() {
        progress::stage(
            "source",
            format!(
                "warning: tags {} of {} came from a cache or bundle without trusted signatures and are not used for the version; a build that reaches the repository confirms them",
                unconfirmed.join(", "),
                r.source.repo
            ),
        );
    }
    // 4b. The tree's compiler requirement, before anything is compiled.
    preflight::check_tree_requirements(lr, &src.path, &tc.compilers)?;
    // The kernel families the recipe expects: each a name the tree's
    // configure can report (a typo is said now, not after the wheel).
    preflight::check_expected_families_known(lr, &src.path)?;
    // 4c. The tree's Rust: the toolchain its files declare, measured.
    let tree_rust = preflight::check_tree_rust(lr, &src.path)?;
    tc.rust = tree_rust.as_ref().map(|(_, t)| t.clone());
    let cx = Ctx {
        store,
        lr,
        tc: &tc,
        uv: &uv,
    };

    // 5. The versions the recipe expects, against what the history fixes:
    // a wrong one fails now, not after the lock, the build venv and the compile.
    source::history::check_expected(lr, &mirror.path, &src.path)?;

    // 6. Hermetic inputs.
    let hermetic = inputs::prepare(
        &cx,
        &src,
        o.lock_dir,
        o.offline,
        &temp,
        tree_rust.as_ref().map(|(t, _)| t),
    )?;
    let lock_entry = hermetic.lock_entry.clone();

    // 7. Wheel.
    let plan = wheel_plan(store, lr, &tc, &src.path, o.jobs, hermetic.wheel)?;
    // Said before the wheel is built (hours, for vLLM), else once the venv is known.
    let warned_early = src_built || !plan.entry.exists();
    let mut source_warning = if warned_early { fork_warning() } else { None };
    temp.add(store, &plan.entry)?;
    if !plan.entry.exists() && !subs.is_empty() && subs.entry(&plan.entry, &temp)?.is_some() {
        substituted.push("wheel".to_string());
    }
    if !plan.entry.exists() {
        // nvcc's CUDA against the locked torch's, before anything compiles.
        if r.build.device() == crate::recipe::TargetDevice::Cuda {
            let locks: Vec<(&str, &[_])> = [
                ("build lock", plan.hermetic.build_lock.as_ref()),
                ("runtime lock", hermetic.venv.runtime_lock.as_ref()),
            ]
            .into_iter()
            .filter_map(|(n, l)| Some((n, l?.packages.as_slice())))
            .collect();
            wheel::torch_cuda::check_build(store, &tc, &locks)?;
        }
        disk::check(store.root(), r, Stage::Wheel)?;
        let blockers = if o.no_smoke {
            Vec::new()
        } else {
            preflight::gate_blockers(lr)
        };
        if !blockers.is_empty() {
            return Err(anyhow::anyhow!(
                "not compiling {}: the gate could not run after it:\n  - {}",
                plan.entry.label(),
                blockers.join("\n  - ")
            ));
        }
    }
    let mut requires = vec![src.label(), mirror.label()];
    requires.extend(plan.hermetic.labels());
    requires.extend(lock_entry.iter().map(Entry::label));
    let (mut record, mut wheel_built) = wheel::ensure(&cx, &plan, &src, &requires)?;

    // 8. Venv plan; the wheel is about to be installed: a damaged one is
    // rebuilt, as a damaged venv is (the build is reproducible, so the key
    // stays valid).
    let mut vplan = venv_plan(store, lr, &tc, &record, &src.path, hermetic.venv);
    if !warned_early && !vplan.entry.exists() {
        source_warning = fork_warning();
    }
    vplan.source_warnings.extend(source_warning);
    if fetched != source::Fetched::Now {
        vplan.source_notes.push(source::fork_check_not_made(
            &r.source.repo,
            &r.source.commit,
        ));
    }
    temp.add(store, &vplan.entry)?;
    if !vplan.entry.exists() && wheel::quarantine_if_damaged(store, &plan.entry, &record)? {
        // A trusted cache's copy first: rebuilding a vLLM wheel takes hours.
        if !subs.is_empty()
            && subs.entry(&plan.entry, &temp)?.is_some()
            && !substituted.iter().any(|s| s == "wheel")
        {
            substituted.push("wheel".to_string());
        }
        (record, wheel_built) = wheel::ensure(&cx, &plan, &src, &requires)?;
    }
    if wheel_built {
        built.push("wheel".to_string());
    }
    // The kernel families the recipe requires, as the tree's configure
    // reported them: one not built fails here, before the venv is made
    // (the wheel is kept: it is what the tree builds for these inputs).
    wheel::check_expected_families(lr, &plan.entry, &record)?;
    let mut shell = None;
    if !vplan.entry.exists() {
        // The runtime set is what the built wheel declares: refuse a lock
        // that misses or contradicts it before anything is installed. The
        // empty venv is made meanwhile (each runs an interpreter).
        let lock_file = hermetic.lock_dir.join(lock::RUNTIME_LOCK);
        let locked = vplan
            .hermetic
            .runtime_lock
            .as_ref()
            .map_or(&[][..], |l| l.packages.as_slice());
        let (made, checked) = std::thread::scope(|s| {
            let made = s.spawn(|| venv::shell(&cx, &vplan.key));
            let checked = venv::check_requires(
                store,
                &tc.python.path,
                &record.wheel_path(&plan.entry.path),
                locked,
                &r.pins,
                &r.install.extras,
                &lock_file,
                // As the user can run it: the recipe file, or a name PIN resolution finds.
                &crate::recipe::shell_arg(lr),
            );
            let made = made
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("making the venv panicked")));
            (made, checked)
        });
        checked?;
        shell = Some(made?);
        disk::check(store.root(), r, Stage::Venv)?;
    }

    // 9. Oracle: install, identity, gate, record.
    let mut outcome = oracle::ensure(
        &cx,
        &plan.entry,
        &record,
        &src,
        &vplan,
        oracle::Options {
            no_smoke: o.no_smoke,
            deep: o.deep,
            temp: Some(&temp),
            shell,
        },
    )?;
    if outcome.built {
        built.push("venv".to_string());
    }
    if outcome.smoked {
        built.push("smoke".to_string());
    }
    // An oracle built from a bundle's or a cache's mirror says the
    // fork-only check was not made: the first build that fetched the
    // branches from the repository makes it (a no-op included).
    let not_made = source::fork_check_not_made(&r.source.repo, &r.source.commit);
    if fetched == source::Fetched::Now && outcome.record.notes.contains(&not_made) {
        // Asked once a run: before the wheel stage when it had work to do.
        let warning = if warned_early {
            vplan.source_warnings.first().cloned()
        } else {
            fork_warning()
        };
        oracle::settle_note(&outcome.entry, &mut outcome.record, &not_made, warning)?;
    }
    // The version this pin's oracle had before, when the same commit now
    // gives another: said, with the tag moves seen now.
    let version_change = store
        .roots()?
        .into_iter()
        .find(|x| x.name == r.name && !x.is_list() && x.live)
        // The root is `../store/venvs/<key>`: the venv beside this one.
        .and_then(|root| {
            root.target
                .file_name()
                .map(|n| outcome.entry.path.with_file_name(n))
        })
        .filter(|prev| *prev != outcome.entry.path)
        .and_then(|path| Some((OracleRecord::read(&path).ok()?, path)))
        .and_then(|(prev, path)| {
            let (from, to) = (
                prev.identity.runtime_version?,
                outcome.record.identity.runtime_version.clone()?,
            );
            (prev.identity.commit == r.source.commit && from != to).then(|| VersionChange {
                from,
                to,
                previous_oracle: path,
                tag_moves: tag_moves.clone(),
            })
        });
    if let Some(v) = &version_change {
        progress::stage("version", format!("{}: {}", r.name, v.describe()));
    }
    // 10. One root per pin: the oracle; its record's `requires` keeps the rest.
    store.set_root(&r.name, &outcome.entry)?;
    // What an import or pull of this pin brought is now kept through that
    // root: its list root goes (another commit's stays).
    let imported = crate::store::imported_root_name(&r.name);
    if let Some(list) = store.roots()?.into_iter().find(|x| x.name == imported)
        && list
            .header
            .as_deref()
            .and_then(|h| h.split_whitespace().nth(1))
            == Some(r.source.commit.as_str())
    {
        store.remove_root(&imported)?;
    }
    drop(temp);
    // 11. `push = "auto"`: a wheel built here is pushed; a failed push is
    // reported and the build stands.
    let pushed = if built.iter().any(|b| b == "wheel") {
        push::auto(lr, store.root(), o.push, o.lock_dir)
    } else {
        Vec::new()
    };
    Ok(Built {
        keys: Keys {
            source: r.source.commit.clone(),
            wheel: Some(plan.key.clone()),
            venv: Some(vplan.key.clone()),
            lock: lock_entry.as_ref().map(|e| e.name.clone()),
        },
        oracle: outcome,
        built,
        substituted,
        pushed,
        seconds: t0.elapsed().as_secs_f64(),
        version_change,
    })
}

/// The lock directory for `lr` (`--lockfiles` or beside the recipe).
pub fn lock_dir(lr: &LoadedRecipe, explicit: Option<&Path>) -> PathBuf {
    lock::lock_dir(lr, explicit)
}

/// The toolchain `plan` can know without provisioning anything, from the
/// preflight's findings (`None` without Python or uv).
fn known_toolchain(findings: &preflight::Findings) -> Option<Toolchain> {
    Some(Toolchain {
        python: findings.python.clone()?,
        uv: findings.uv.clone()?,
        git: None,
        libgit2: toolchain::libgit2_version(),
        gcc: preflight::gcc_of(findings.compilers.as_ref()?),
        nvcc: findings.nvcc.clone(),
        compilers: findings.compilers.clone()?,
        rust: None,
    })
}

/// The verdict recorded by the oracle at `venv` when a build would not run
/// its gate again (the same smoke key, not `unsmoked`: as
/// `stages::oracle::ensure` decides); `None` when it would.
fn gate_recorded(store: &Store, lr: &LoadedRecipe, venv: &Path) -> Option<String> {
    let rec = OracleRecord::read(venv).ok()?;
    let unsmoked = rec.smoke.verdict == crate::stages::smoke::Verdict::Unsmoked;
    (rec.smoke.key == crate::stages::smoke::smoke_key(store, lr) && !unsmoked)
        .then(|| rec.smoke.verdict.as_str().to_string())
}
