//! Stage 9, oracle: the venv made by [`crate::stages::venv`], its measured
//! identity ([`crate::stages::identity`]) and its gate verdict
//! ([`crate::stages::smoke`]), recorded in `oracle.json` and persisted as
//! the entry `store/venvs/<key>/`.
//!
//! The entry *is* the venv (`bin/python`, `lib/...`), with `oracle.json`,
//! `manifest.json` and `install.log` at its top. It is staged in `<root>/tmp`,
//! identity-checked and smoked there (uv's `--relocatable` venvs do not care
//! where they live), and renamed into place. Every file of the venv is in the
//! manifest and read-only; `oracle.json` is the entry's record and is
//! replaced atomically (never edited) when the gate is re-run under a
//! different smoke configuration.

use std::path::Path;

use anyhow::Result;
use fs_err as fs;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::exit::mismatch;
use crate::host::toolchain::Toolchain;
use crate::progress;
use crate::recipe::LoadedRecipe;
use crate::stages::Ctx;
use crate::stages::identity::{self, Check, Identity};
use crate::stages::smoke::{self, SmokeReport};
use crate::stages::venv::{self, VenvPlan};
use crate::stages::wheel::BuildRecord;
use crate::store::{self, Bucket, Entry, MANIFEST, Manifest, STAMPS, Store, read_json, write_json};

/// The record file of an oracle venv.
pub const ORACLE_JSON: &str = "oracle.json";

/// The directory of an oracle venv holding its install log and the gate's
/// configs, results and logs.
pub const LOGS_DIR: &str = "oracle-build";

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
    /// Measured identity (see [`crate::stages::identity`]).
    pub identity: Identity,
    /// Identity checks against the recipe.
    pub checks: Vec<Check>,
    /// The gate (see [`crate::stages::smoke`]).
    pub smoke: SmokeReport,
    /// Tools used.
    pub tools: Toolchain,
    /// The packages it holds besides what its package requires (recipe
    /// `install.extras`, `install.with`), as installed when it was built;
    /// `verify` checks each again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<crate::stages::added::Added>,
    /// Store entries this oracle needs to be rebuilt (its wheel and what the
    /// wheel requires); `gc` keeps them as long as the oracle is rooted.
    #[serde(default)]
    pub requires: Vec<String>,
    /// Things a reviewer should know that do not refuse the oracle (e.g. no
    /// tag reachable from the commit, so the version is setuptools-scm's fallback).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Checks that were not made when it was built, and why (the fork-only
    /// check on a mirror from a bundle or a cache): not warnings, since
    /// nothing was found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// When the venv was made (RFC 3339).
    pub created: String,
    /// Seconds spent creating and installing the venv.
    pub install_s: f64,
    /// Where the venv's bytecode came from.
    #[serde(default)]
    pub bytecode: venv::BytecodeStats,
    /// Where the time of making this venv went.
    #[serde(default)]
    pub timings: Timings,
    /// The latest gate that could not run on a box (an unset variable, a
    /// missing model) since `smoke` was recorded: kept beside the verdict,
    /// which it leaves in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_not_run: Option<smoke::GateAttempt>,
}

/// Seconds spent in each part of making an oracle venv (`oracle.json`'s `timings`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Timings {
    /// Creating the venv and linking its files (uv).
    pub link_s: f64,
    /// Its bytecode, linked from the store's pool or compiled.
    pub bytecode_s: f64,
    /// Measuring and checking the identity.
    pub identity_s: f64,
    /// The smoke gate (0 with `--no-smoke`).
    pub smoke_s: f64,
    /// Building the manifest.
    pub manifest_s: f64,
}

impl OracleRecord {
    /// Reads `<venv>/oracle.json`.
    pub fn read(venv: &Path) -> Result<OracleRecord> {
        read_json(&venv.join(ORACLE_JSON))
    }

    /// The record of the wheel this oracle was installed from:
    /// `store/wheels/<wheel_key>/build.json` of the store owning `venv`
    /// (`<X>/store/venvs/<key>`), if it can be read.
    pub fn wheel_record(&self, venv: &Path) -> Option<BuildRecord> {
        let root = crate::store::alias::owning_root(venv)?;
        let store = Store::open_existing(&root)?;
        BuildRecord::read(&store.entry(Bucket::Wheels, &self.wheel_key).path).ok()
    }
}

/// Whether two recipe origins (a file path, or `<builtin>/<file>`) name the same recipe file.
fn same_origin(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (Path::new(a).canonicalize(), Path::new(b).canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// The other recipe that owns the oracle record `record`: its origin, when
/// `record` was written for a recipe of `lr`'s name read from another file
/// (or built-in), and that recipe still exists there under that name.
/// `None` when `lr` owns it (same file: its content may have been edited
/// since), or when the owner is gone (removed, moved, or renamed: ownership lapses).
///
/// A recipe's identity is its file (path) and its text: the record holds
/// both (`recipe_origin`, `recipe_text`), and the oracle's root
/// `roots/<name>` and record belong to it.
pub fn foreign_owner(lr: &LoadedRecipe, record: &OracleRecord) -> Option<String> {
    if record.recipe != lr.recipe.name || same_origin(&record.recipe_origin, &lr.origin) {
        return None;
    }
    let origin = &record.recipe_origin;
    let alive = match origin.strip_prefix("<builtin>/") {
        Some(file) => crate::recipe::pin::BUILTIN.iter().any(|(f, text)| {
            *f == file && crate::recipe::parse(text, origin).is_ok_and(|r| r.name == lr.recipe.name)
        }),
        None => {
            Path::new(origin).is_file()
                && crate::recipe::load_file(Path::new(origin))
                    .is_ok_and(|o| o.recipe.name == lr.recipe.name)
        }
    };
    alive.then(|| origin.clone())
}

/// Refuses (exit 2) to let `lr` touch the oracle at `venv` (rewrite its
/// record, point its root) when its record belongs to another recipe of the
/// same name (see [`foreign_owner`]). An unreadable record belongs to no one.
pub fn check_owner(lr: &LoadedRecipe, venv: &Path) -> Result<()> {
    let Ok(record) = OracleRecord::read(venv) else {
        return Ok(());
    };
    match foreign_owner(lr, &record) {
        None => Ok(()),
        Some(owner) => Err(crate::exit::bad_input(format!(
            "{}: recipe name {:?} belongs to the recipe {owner}, whose oracle {} (root roots/{}) is not this recipe's to touch; give one of the two recipes another `name:` (nothing was changed)",
            lr.origin,
            lr.recipe.name,
            venv.display(),
            lr.recipe.name
        ))),
    }
}

/// [`check_owner`] for the oracle the root `roots/<name>` of `lr` points at, if any.
pub fn check_root_owner(store: &Store, lr: &LoadedRecipe) -> Result<()> {
    match store.roots_dir().join(&lr.recipe.name).canonicalize() {
        Ok(venv) if venv.join(ORACLE_JSON).is_file() => check_owner(lr, &venv),
        _ => Ok(()),
    }
}

/// Measures the venv at `venv` as the oracle of `commit` ([`identity::measure`]),
/// with what the build recorded: the build mode evidence of the wheel it was
/// installed from (its `build.json`, found through `record`), and, when
/// `record` was built from `commit`, the tags at the commit and the version
/// the commit's history gives. Shared by `verify`, `activate` and `doctor`.
///
/// Errors: the venv's Python cannot be run or reports garbage.
pub fn measure_oracle(
    venv: &Path,
    package: &str,
    commit: &str,
    record: Option<&OracleRecord>,
) -> Result<Identity> {
    let wheel = record.and_then(|r| r.wheel_record(venv));
    let mut id = identity::measure(venv, package, commit, wheel.as_ref().map(|w| &w.env))?;
    // The tree's Rust extensions as its wheel's record lists them, measured
    // in the venv now (else as the oracle's record says they were).
    let declared = wheel.as_ref().map_or_else(
        || {
            record
                .map(|r| r.identity.rust_extensions.clone())
                .unwrap_or_default()
        },
        |w| w.rust_extensions.clone(),
    );
    id.rust_extensions = crate::stages::rust::declared::measure_in_venv(venv, &declared);
    if let Some(rec) = record.filter(|r| r.identity.commit == commit) {
        id.tags_at_commit = rec.identity.tags_at_commit.clone();
        id.history_version = rec
            .identity
            .history_version
            .clone()
            .or_else(|| wheel.and_then(|w| w.history_version));
    }
    Ok(id)
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
    /// Whether the smoke run happened now (and its verdict was recorded).
    pub smoked: bool,
    /// A gate run now that could not run on this box (the recorded verdict
    /// stands; see [`OracleRecord::gate_not_run`]).
    pub gate_not_run: Option<smoke::GateAttempt>,
}

/// Options of the venv stage.
#[derive(Debug)]
pub struct Options<'a> {
    /// Skip the smoke run (verdict `unsmoked`).
    pub no_smoke: bool,
    /// Check an existing entry by hashing every file against its manifest
    /// (`build --deep`), instead of the quick check of its stamps: finds a
    /// file rewritten in place with its size and time restored.
    pub deep: bool,
    /// The build's temporary GC roots: the bytecode entries the install
    /// makes or uses are registered there until the oracle's record
    /// requires them.
    pub temp: Option<&'a crate::store::TempRoots>,
    /// The empty venv to install into, made beforehand ([`venv::shell`]);
    /// `None`: made when the venv is built.
    pub shell: Option<venv::Shell>,
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
    opts: Options<'_>,
) -> Result<Outcome> {
    let Ctx { store, lr, .. } = *cx;
    let entry = plan.entry.clone();
    let smoke_key = smoke::smoke_key(store, lr);
    if entry.exists() {
        // The quick check: the entry's stamps (see `Manifest::check_quick`);
        // with `deep`, every file hashed.
        let problems = if opts.deep {
            Manifest::read(&entry.path)
                .map_or_else(|e| vec![format!("{e:#}")], |m| m.check(&entry.path, true))
        } else {
            Manifest::check_quick(&entry.path)
        };
        if !problems.is_empty() {
            let _lock = plan.entry.lock()?;
            // A file rewritten in place is shared with the store's caches.
            venv::evict_shared_damage(cx, &entry, &problems)?;
            store.quarantine(&entry, &problems)?;
        }
    }
    if !entry.exists() {
        let _lock = plan.entry.lock()?;
        if !entry.exists() {
            let smoked = !opts.no_smoke;
            let record = build(cx, wheel_entry, wheel, src, plan, opts)?;
            return Ok(Outcome {
                entry,
                record,
                built: true,
                smoked,
                gate_not_run: None,
            });
        }
    }
    // Shared by key, but its record (and verdict) is another recipe's.
    check_owner(lr, &entry.path)?;
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
            gate_not_run: None,
        });
    }
    let _lock = plan.entry.lock()?;
    progress::stage(
        "smoke",
        if unsmoked {
            "this oracle was built with --no-smoke; running the gate now"
        } else {
            "the smoke configuration changed since this oracle was gated; re-running the gate"
        },
    );
    let report = gate(store, &entry.path, lr)?;
    let smoked = settle_gate(&mut record, report, "build");
    write_record(&entry.path, &record)?;
    let gate_not_run = (!smoked).then(|| record.gate_not_run.clone()).flatten();
    Ok(Outcome {
        entry,
        record,
        built: false,
        smoked,
        gate_not_run,
    })
}

/// Records the gate run `report` (made by `by`: `build`, `smoke`) in
/// `record`: as its verdict, unless the gate could not run on this box
/// ([`SmokeReport::could_not_run`]: an unset variable, a missing model, and
/// nothing else wrong), which tells nothing about the oracle, and a gate
/// made the recorded verdict (not `--no-smoke`); then that verdict stands,
/// the attempt is kept beside it (`gate_not_run`) and it is said on
/// stderr. Returns whether `report` became the verdict.
pub fn settle_gate(record: &mut OracleRecord, report: SmokeReport, by: &str) -> bool {
    if report.could_not_run() && record.smoke.verdict != smoke::Verdict::Unsmoked {
        progress::stage(
            "smoke",
            format!(
                "the gate could not run on this box ({}); the {} verdict of {} stands",
                report.not_run.join("; "),
                record.smoke.verdict.as_str(),
                record.smoke.started
            ),
        );
        record.gate_not_run = Some(report.attempt(by));
        return false;
    }
    record.smoke = report;
    record.gate_not_run = None;
    true
}

/// Replaces the note `note` (a check not made when the oracle at `entry`
/// was built: [`OracleRecord::notes`]) with what the check found now, by a
/// later build: `warning` among its warnings when it warns, else nothing.
/// Done under the entry's lock, on the record as it is then; `record`
/// becomes the one written. Nothing is written when the record holds no
/// such note.
///
/// Errors: the record cannot be read or written.
pub fn settle_note(
    entry: &Entry,
    record: &mut OracleRecord,
    note: &str,
    warning: Option<String>,
) -> Result<()> {
    let _lock = entry.lock()?;
    let mut now = OracleRecord::read(&entry.path)?;
    if !now.notes.iter().any(|n| n == note) {
        *record = now;
        return Ok(());
    }
    now.notes.retain(|n| n != note);
    if let Some(w) = warning
        && !now.warnings.contains(&w)
    {
        now.warnings.push(w);
    }
    write_record(&entry.path, &now)?;
    *record = now;
    Ok(())
}

/// Runs the smoke stage for the venv at `venv`, with logs under a fresh
/// staging directory kept in `<venv>/smoke` when possible, and the oracle's
/// warm engine caches (by the venv key its `oracle.json` records).
pub fn gate(store: &Store, venv: &Path, lr: &LoadedRecipe) -> Result<SmokeReport> {
    let mut opts = smoke::Options::new(store, lr);
    // The warm caches of the oracle, by its venv key.
    if let Ok(rec) = OracleRecord::read(venv) {
        opts = opts.with_engine_cache(store, &rec.key, false);
    }
    gate_with(store, venv, lr, &opts)
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
    let keep = store.logs_dir().join(name);
    let _ = fs::create_dir_all(store.logs_dir());
    let _ = std::fs::remove_dir_all(&keep);
    let _ = std::fs::rename(staging.path(), &keep);
    let mut report = relocate_logs(report, staging.path(), &keep);
    // The oracle's own record says what its extensions are.
    if let Ok(rec) = OracleRecord::read(venv) {
        let prefix = Path::new(&rec.identity.sys_prefix);
        relocate_mapped(&mut report, &[venv.to_path_buf()], prefix);
        judge_loaded(&mut report, &rec.identity, lr, None);
    }
    Ok(report)
}

/// Rewrites the mapped paths of `report`'s cases that lie under `from` (a
/// staging venv; also as its canonical path, which `/proc/<pid>/maps`
/// shows) to lie under `to` (where the venv is recorded to be).
fn relocate_mapped(report: &mut SmokeReport, from: &[std::path::PathBuf], to: &Path) {
    let mut roots: Vec<std::path::PathBuf> = from.to_vec();
    roots.extend(from.iter().filter_map(|p| p.canonicalize().ok()));
    let relocate = |paths: &mut Vec<String>| {
        for p in paths.iter_mut() {
            if let Some(rel) = roots
                .iter()
                .find_map(|r| Path::new(p.as_str()).strip_prefix(r).ok())
            {
                *p = to.join(rel).display().to_string();
            }
        }
        paths.sort();
        paths.dedup();
    };
    for c in &mut report.cases {
        relocate(&mut c.mapped_objects);
    }
    if let Some(mut probe) = probe_mapped(report) {
        relocate(&mut probe);
        report.probe["mapped_objects"] = json!(probe);
    }
}

/// The shared objects the gate's probe process mapped, when it reported them.
fn probe_mapped(report: &SmokeReport) -> Option<Vec<String>> {
    report
        .probe
        .get("mapped_objects")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
}

/// Records in `report` the kernel coverage of what its cases' engines
/// loaded ([`identity::loaded::judge`]): the oracle's extensions (of
/// `ident`) that a case mapped, judged for a CUDA recipe against the GPUs
/// the gate ran on (else `fallback`, the identity's GPU target), the
/// others listed. A loaded extension with nothing that runs there makes
/// the gate not gateable. Nothing for a skipped gate.
fn judge_loaded(
    report: &mut SmokeReport,
    ident: &Identity,
    lr: &LoadedRecipe,
    fallback: Option<&identity::coverage::Target>,
) {
    if report.verdict == smoke::Verdict::Unsmoked {
        return;
    }
    let Some(pkg) = ident.package_dir.as_deref() else {
        return;
    };
    let r = &lr.recipe;
    let target = (r.build.device() == crate::recipe::TargetDevice::Cuda)
        .then(|| identity::coverage::target(&report.gpus, None).or_else(|| fallback.cloned()))
        .flatten();
    // The probe runs a compiled op on the device too: it counts as a case.
    let cases: Vec<(String, Vec<String>)> = probe_mapped(report)
        .map(|m| ("probe".to_string(), m))
        .into_iter()
        .chain(
            report
                .cases
                .iter()
                // One engine per case: its prompts share what it loaded.
                .filter(|c| c.prompt_index.unwrap_or(0) == 0)
                .map(|c| (c.name.clone(), c.mapped_objects.clone())),
        )
        .collect();
    let cov = identity::loaded::judge(
        &ident.compiled_extensions,
        Path::new(pkg),
        Path::new(&ident.sys_prefix),
        &cases,
        target.as_ref(),
        r.smoke.allow_ptx_jit,
    );
    let reasons = cov.reasons();
    if !reasons.is_empty() {
        report.reasons.extend(reasons);
        report.verdict = smoke::Verdict::NotGateable;
    }
    report.kernel_coverage = Some(cov);
}

fn relocate_logs(mut report: SmokeReport, from: &Path, to: &Path) -> SmokeReport {
    for c in &mut report.cases {
        if let Ok(rel) = c.log.strip_prefix(from) {
            c.log = to.join(rel);
        }
    }
    for s in &mut report.serve {
        if let Ok(rel) = s.log.strip_prefix(from) {
            s.log = to.join(rel);
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

/// Replaces `<venv>/oracle.json` atomically, then the entry's manifest with
/// the new record's size and sha256 (each file by an atomic rename; the
/// entry's top directory is opened for writing only for the renames). A run
/// killed between the two leaves a record the manifest does not match: the
/// entry reads as damaged and is rebuilt, never trusted.
pub fn write_record(venv: &Path, record: &OracleRecord) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(venv)?.permissions().mode();
    fs::set_permissions(venv, std::fs::Permissions::from_mode(mode | 0o200))?;
    let res = write_json(&venv.join(ORACLE_JSON), record).and_then(|()| {
        let mut m = Manifest::read(venv)?;
        m.refresh(venv, ORACLE_JSON)?;
        m.write_stamped(venv)
    });
    for name in [ORACLE_JSON, MANIFEST, STAMPS] {
        if let Ok(meta) = fs::metadata(venv.join(name)) {
            let m = meta.permissions().mode() & !0o222;
            let _ = fs::set_permissions(venv.join(name), std::fs::Permissions::from_mode(m));
        }
    }
    fs::set_permissions(venv, std::fs::Permissions::from_mode(mode))?;
    res
}

/// Measures the identity of the venv at `venv` (installed from `wheel`,
/// built from the checkout `src`) and checks it against the recipe: the
/// identity with the mirror's tags at the commit, its checks, the build's
/// warnings (`plan`'s source warnings, and a missing tag), and the seconds
/// it took.
///
/// Errors (exit 3, [`mismatch`]): a check fails; the probe cannot run.
fn measure_identity(
    cx: &Ctx<'_>,
    venv: &Path,
    wheel: &BuildRecord,
    src: &Entry,
    plan: &VenvPlan,
    by_gate: bool,
) -> Result<(Identity, Vec<Check>, Vec<String>, f64)> {
    let Ctx { store, lr, .. } = *cx;
    let r = &lr.recipe;
    let t_identity = std::time::Instant::now();
    progress::stage("identity", "measuring the oracle's identity");
    // The build mode from what the wheel's own record says the build got.
    let mut ident = identity::measure(venv, &r.source.package, &r.source.commit, Some(&wheel.env))?;
    // Tags as the mirror holds them now (the checkout keeps those of the
    // day it was made; the wheel was built with the mirror's).
    let mirror = crate::stages::source::mirror_entry(store, &r.source.repo);
    let tags_from = if mirror.exists() {
        &mirror.path
    } else {
        &src.path
    };
    ident.tags_at_commit = crate::stages::source::tags_at(tags_from, &r.source.commit);
    ident.history_version = wheel.history_version.clone();
    ident.rust_extensions =
        crate::stages::rust::declared::measure_in_venv(venv, &wheel.rust_extensions);
    let mut warnings = plan.source_warnings.clone();
    if crate::stages::source::nearest_tag(tags_from, &r.source.commit).is_none() {
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
    // Gating on a visible GPU: the gate judges the extensions its engines
    // load; else every extension, as before.
    let rule = if by_gate
        && ident
            .kernel_target
            .as_ref()
            .is_some_and(|t| t.source == identity::coverage::TargetSource::Gpu)
    {
        identity::KernelRule::ByGate
    } else {
        identity::KernelRule::PerExtension
    };
    let checks = identity::checks_with(&ident, r, rule);
    if checks.iter().any(|c| !c.ok) {
        return Err(mismatch(format!(
            "the oracle built from {} is not the pin; refusing it:\n{}",
            r.source.commit,
            identity::describe_failures(&checks)
        )));
    }
    Ok((ident, checks, warnings, t_identity.elapsed().as_secs_f64()))
}

fn build(
    cx: &Ctx<'_>,
    wheel_entry: &Entry,
    wheel: &BuildRecord,
    src: &Entry,
    plan: &VenvPlan,
    opts: Options<'_>,
) -> Result<OracleRecord> {
    let Ctx { store, lr, tc, .. } = *cx;
    let r = &lr.recipe;
    let (key, entry) = (plan.key.as_str(), &plan.entry);
    let shell = match opts.shell {
        Some(shell) => shell,
        None => venv::shell(cx, key)?,
    };
    let venv::Installed {
        venv,
        scratch,
        log,
        created,
        install_s,
        link_s,
        bytecode_s,
        bytecode,
        known,
    } = venv::install(cx, wheel_entry, wheel, src, plan, &shell, opts.temp)?;

    // The identity is measured while the gate's probe runs (two Pythons at
    // once); the gate holds its cases until the identity is known, so a venv
    // that is not the pin never loads a model, and its refusal wins.
    let (measured, smoke, listing) = std::thread::scope(|s| {
        let (verdict, held) = std::sync::mpsc::channel::<bool>();
        let gate = (!opts.no_smoke).then(|| {
            let (venv, scratch) = (&venv, &scratch);
            s.spawn(move || {
                let t_smoke = std::time::Instant::now();
                let hold = || match held.recv() {
                    Ok(true) => Ok(()),
                    _ => Err(anyhow::anyhow!(
                        "the gate's cases were not run: the oracle's identity was refused"
                    )),
                };
                smoke::run_held(
                    venv,
                    lr,
                    &scratch.join("smoke"),
                    &smoke::Options::new(store, lr).with_engine_cache(store, key, false),
                    &hold,
                )
                .map(|report| (report, t_smoke.elapsed().as_secs_f64()))
            })
        });
        // Meanwhile every file is listed: the venv no longer changes (both
        // Pythons run with -B); the logs are added once the gate is done.
        let listing = s.spawn(|| {
            let t = std::time::Instant::now();
            Manifest::build_known(&venv, &[MANIFEST, LOGS_DIR], &known)
                .map(|m| (m, t.elapsed().as_secs_f64()))
        });
        let measured = measure_identity(cx, &venv, wheel, src, plan, !opts.no_smoke);
        let _ = verdict.send(measured.is_ok());
        let smoke = gate.map(|g| {
            g.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the smoke stage panicked")))
        });
        let listing = listing
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("listing the venv's files panicked")));
        (measured, smoke, listing)
    });
    let (mut ident, checks, warnings, identity_s) = measured?;
    let (mut manifest, listing_s) = listing?;
    let (smoke, smoke_s) = match smoke {
        Some(run) => run?,
        None => (SmokeReport::skipped(smoke::smoke_key(store, lr)), 0.0),
    };
    let added = crate::stages::added::measure(&venv, r)?;
    // Paths were measured in staging; record the final ones.
    let staged = venv.display().to_string();
    let fin = entry.path.display().to_string();
    ident.package_path = ident.package_path.map(|p| p.replacen(&staged, &fin, 1));
    ident.package_dir = ident.package_dir.map(|p| p.replacen(&staged, &fin, 1));
    ident.sys_prefix = fin.clone();
    let mut smoke = smoke;
    relocate_mapped(&mut smoke, std::slice::from_ref(&venv), &entry.path);
    let gpu_target = ident
        .kernel_target
        .clone()
        .filter(|t| t.source == identity::coverage::TargetSource::Gpu);
    judge_loaded(&mut smoke, &ident, lr, gpu_target.as_ref());
    if let Some(p) = smoke.engine.as_mut().and_then(|e| e.path.as_mut()) {
        *p = p.replacen(&staged, &fin, 1);
    }
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
        added,
        // The wheel, the mirror of this recipe's repository and the
        // checkout (the wheel's own record names the mirror of the recipe
        // that built it, maybe under another URL of the commit), the runtime
        // set's wheelhouse entries, the store's lock they were installed
        // from, and the wheel the pinned uv came from.
        requires: std::iter::once(wheel_entry.label())
            .chain([
                crate::stages::source::mirror_entry(store, &r.source.repo).label(),
                src.label(),
            ])
            .chain(plan.hermetic.runtime_lock.iter().flat_map(|l| l.labels()))
            .chain(plan.hermetic.lock_entry.iter().map(|e| e.label()))
            .chain(
                // Only when this store holds it (a tools directory shared
                // by several stores got it through another one).
                crate::host::toolchain::uv_wheel_sha256(&tc.uv)
                    .map(|sha| store.entry(Bucket::Wheelhouse, &sha))
                    .filter(|e| e.exists())
                    .map(|e| e.label()),
            )
            // The bytecode entries its `.pyc` files were linked from.
            .chain(bytecode.entries.iter().cloned())
            .collect(),
        warnings,
        notes: plan.source_notes.clone(),
        gate_not_run: None,
        created,
        install_s,
        bytecode: bytecode.stats,
        timings: Timings {
            link_s,
            bytecode_s,
            identity_s,
            smoke_s,
            manifest_s: 0.0,
        },
    };
    // Logs and smoke results travel with the entry.
    fs::copy(&log, scratch.join("install.log"))?;
    store::copy_tree(&scratch, &venv.join(LOGS_DIR))?;
    let mut record = record;
    record.smoke = relocate_logs(record.smoke, &scratch, &entry.path.join(LOGS_DIR));
    // The record is covered too: an edited or corrupt oracle.json is damage.
    let t_manifest = std::time::Instant::now();
    manifest.add_tree(&venv, LOGS_DIR)?;
    record.timings.manifest_s = listing_s + t_manifest.elapsed().as_secs_f64();
    write_json(&venv.join(ORACLE_JSON), &record)?;
    manifest.refresh(&venv, ORACLE_JSON)?;
    manifest.write_stamped(&venv)?;
    store.persist(&venv, entry)?;
    let _ = fs::remove_file(&log);
    Ok(record)
}
