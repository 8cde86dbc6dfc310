//! The hermetic inputs of a build, gathered for `build`, `plan` and the
//! `--offline` preflight: the lock (or one resolved now), its artifacts in
//! the wheelhouse, the staged external sources and the compiler cache.

use std::path::{Path, PathBuf};

use crate::stages::Ctx;
use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::progress;
use crate::recipe::LoadedRecipe;
use crate::stages::ext::{self, Discovery, ExtSource};
use crate::stages::lock::pylock::parse_pylock;
use crate::stages::lock::{self, Locked};
use crate::stages::requires;
use crate::stages::rust::{TreeRust, crates};
use crate::stages::source;
use crate::stages::venv::VenvHermetic;
use crate::stages::wheel::{CompilerCache, RustInputs, SCRUBBED_ENV, WheelHermetic, is_scrubbed};
use crate::stages::wheelhouse;
use crate::stages::wheelhouse::LockedInstall;
use crate::store::{Entry, Store, TempRoots, read_json};

/// The hermetic inputs of one build.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The store entry of the lock, when it was resolved by a build (no lockfile).
    pub lock_entry: Option<Entry>,
    /// The directory of the lock used: the lockfile directory picked for
    /// this host (`lockfiles/<name>/` or `lockfiles/<name>/<P>/`), or the
    /// store entry's.
    pub lock_dir: PathBuf,
    /// For the wheel stage.
    pub wheel: WheelHermetic,
    /// For the venv stage.
    pub venv: VenvHermetic,
}

fn installs(store: &Store, locked: &Locked, entries: (Vec<Entry>, Vec<Entry>)) -> Prepared {
    let mk = |packages: &Vec<crate::stages::lock::pylock::LockedPackage>,
              entries: Vec<Entry>,
              sha: Option<&String>| {
        sha.map(|s| LockedInstall {
            packages: packages.clone(),
            entries,
            lock_sha256: s.clone(),
            links: store.wheelhouse_links_dir(),
        })
    };
    Prepared {
        lock_entry: None,
        lock_dir: locked.dir.clone(),
        wheel: WheelHermetic {
            build_lock: mk(&locked.build, entries.0, locked.build_sha256()),
            ..Default::default()
        },
        venv: VenvHermetic {
            runtime_lock: mk(&locked.runtime, entries.1, locked.runtime_sha256()),
            lock_entry: None,
        },
    }
}

/// The active `Requires-Dist` of the tree at `src`, asked through the PEP 517
/// hook `prepare_metadata_for_build_wheel` in a venv holding exactly the
/// locked build set `build_lock` (its artifacts fetched into the wheelhouse),
/// with the build's `VLLM_TARGET_DEVICE` and the recipe's `build.env`, and
/// the variables every build scrubs removed. Markers are evaluated for the
/// recipe's Python on `platform` (`None`: this host; see
/// [`requires::marker_env_on`]). Scratch files go to `work`. This is how
/// `stages::lock::resolve` asks the tree for its runtime set (vLLM's
/// `setup.py` computes `install_requires` from `VLLM_TARGET_DEVICE`).
/// The recipe's `install.extras` are requested in the marker evaluation
/// (`extra == "bench"` holds for each), so the extras' requirements are in it.
/// Every wheelhouse entry it fetches is registered in `temp` first, so a
/// concurrent `gc` cannot take the build set between download and install.
///
/// Errors: the backend has no hook, or the hook fails (vLLM's cuda metadata
/// needs nvcc): a [`requires::TreeDeclined`], after which the caller falls
/// back to the requirement files; an extra of `install.extras` the
/// metadata does not declare (`Provides-Extra`; exit 2, naming those it
/// declares); anything else (the build set cannot be
/// fetched or installed, the tree cannot be copied, a full disk) is a
/// failure of the step, which the caller reports.
pub fn metadata_runtime(
    cx: &Ctx<'_>,
    src: &Path,
    build_lock: &Path,
    work: &Path,
    platform: Option<&crate::host::platform::Platform>,
    temp: &TempRoots,
) -> Result<Vec<String>> {
    let Ctx { store, lr, tc, uv } = *cx;
    let r = &lr.recipe;
    // A full disk in this step, for the tests on boxes where they cannot
    // mount a small tmpfs (docs/testing.md; debug builds only).
    if cfg!(debug_assertions)
        && std::env::var_os("ORACLE_BUILD_TEST_FAULT").is_some_and(|v| v == "metadata-enospc")
    {
        return Err(
            anyhow::Error::new(std::io::Error::from_raw_os_error(libc::ENOSPC)).context(format!(
                "creating {} (ORACLE_BUILD_TEST_FAULT)",
                work.join("meta-venv").display()
            )),
        );
    }
    let lock_dir = build_lock.parent().unwrap_or(work);
    let packages = parse_pylock(build_lock)?;
    let entries = wheelhouse::ensure(store, &packages, lock_dir, false, Some(temp))?;
    let venv = work.join("meta-venv");
    // Outside staging: the log an error names must outlive it.
    let log = store.stage_log(&format!("lock-metadata-{}", r.name))?;
    uv.venv(&tc.python.path, &venv, false, &log)?;
    LockedInstall {
        packages,
        entries,
        lock_sha256: String::new(),
        links: store.wheelhouse_links_dir(),
    }
    .install(uv, &venv, work, &[], &[], &log)
    .context("installing the locked build set to read the metadata")?;
    let tree = work.join("meta-src");
    crate::store::copy_tree(src, &tree)?;
    let mut env: Vec<(String, String)> =
        vec![("VLLM_TARGET_DEVICE".into(), r.build.target_device.clone())];
    env.extend(r.build.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut remove: Vec<String> = SCRUBBED_ENV.iter().map(|k| k.to_string()).collect();
    remove.extend(std::env::vars().map(|(k, _)| k).filter(|k| is_scrubbed(k)));
    let remove: Vec<&str> = remove.iter().map(String::as_str).collect();
    let meta = requires::hook_metadata(
        &venv.join("bin/python"),
        &tree,
        &work.join("meta-out"),
        &env,
        &remove,
    )?
    .ok_or_else(|| {
        anyhow::Error::new(requires::TreeDeclined(
            "the build backend has no prepare_metadata_for_build_wheel hook".into(),
        ))
    })?;
    let reqs = requires::requires_dist(&meta, "the tree's METADATA")?;
    let extras = requires::requested_extras(&meta, &r.install.extras, &lr.origin)?;
    let target = requires::marker_env_on(&tc.python.path, platform)?;
    let _ = fs_err::remove_file(&log);
    // uv evaluates each marker again with no extra requested: the extras'
    // own `extra == "..."` terms, true here, are taken out of the markers.
    Ok(requires::active(&reqs, &target, &extras)
        .into_iter()
        .map(|mut r| {
            r.marker = r.marker.simplify_extras(&extras);
            r.to_string()
        })
        .collect())
}

/// Gathers the hermetic inputs for building `lr` from the checkout `src`:
/// the lock from `lock_dir` (or, online and without one, a lock resolved
/// now into staging, the same way `oracle-build lock` would), every locked
/// artifact in the wheelhouse (downloaded unless `offline`), and every
/// FetchContent source staged in `store/ext` (fetched unless `offline`).
/// Every entry used is registered in `temp` first.
///
/// Errors: the lock is stale; `offline` and something is missing; a
/// download, fetch or hash check fails.
pub fn prepare(
    cx: &Ctx<'_>,
    src: &Entry,
    lock_dir: &Path,
    offline: bool,
    temp: &TempRoots,
    tree_rust: Option<&TreeRust>,
) -> Result<Prepared> {
    let Ctx { store, lr, .. } = *cx;
    let r = &lr.recipe;
    let mut lock_entry = None;
    let locked = match lock::load(lock_dir, lr)? {
        Some(l) => {
            progress::stage("lock", format!("using {}", lock_dir.display()));
            l
        }
        None => {
            // No lockfile: the lock a previous build resolved is in the store;
            // else resolve one now and keep it there, so a rebuild needs
            // neither the network nor a new resolution.
            let entry = lock::auto_entry(store, r);
            temp.add(store, &entry)?;
            if !entry.exists() {
                if offline {
                    bail!(
                        "--offline: no lockfile in {} and no lock in the store; run `oracle-build lock {}` while online, or import a bundle{}",
                        lock_dir.display(),
                        lock::lock_pin_arg(cx.lr, lock_dir),
                        imported_note(store, lr)
                    );
                }
                let _lock = entry.lock()?;
                if !entry.exists() {
                    progress::stage(
                        "lock",
                        format!(
                            "no lockfile in {}: resolving one into {} (`oracle-build lock {}` writes it beside the recipe)",
                            lock_dir.display(),
                            entry.label(),
                            lock::lock_pin_arg(cx.lr, lock_dir)
                        ),
                    );
                    let staging = store.stage("autolock")?;
                    let dir = staging.path().join("lock");
                    lock::resolve(cx, &src.path, &dir, &|b, w| {
                        metadata_runtime(cx, &src.path, b, w, None, temp)
                    })?;
                    store.persist(&dir, &entry)?;
                }
            }
            let l = lock::load(&entry.path, lr)?
                .ok_or_else(|| anyhow::anyhow!("{} holds no lock", entry.path.display()))?;
            lock_entry = Some(entry);
            l
        }
    };
    // Both sets' missing artifacts in one parallel batch, then each set's entries.
    let both: Vec<_> = locked
        .build
        .iter()
        .chain(&locked.runtime)
        .cloned()
        .collect();
    wheelhouse::ensure(store, &both, &locked.dir, offline, Some(temp))?;
    let b = wheelhouse::ensure(store, &locked.build, &locked.dir, offline, Some(temp))?;
    let rt = wheelhouse::ensure(store, &locked.runtime, &locked.dir, offline, Some(temp))?;
    let mut prepared = installs(store, &locked, (b, rt));
    prepared.venv.lock_entry = lock_entry.clone();
    prepared.lock_entry = lock_entry;

    let found = ext::discover_in_tree(&src.path, &r.build.target_device)?;
    if let Some(why) = &found.no_cmake {
        progress::stage("ext", why.clone());
    }
    for line in &found.unmapped {
        progress::stage("ext", format!("cannot redirect: {line}"));
    }
    for line in &found.not_blocking {
        progress::stage("ext", format!("not staged, blocks nothing: {line}"));
    }
    let mut staged = Vec::new();
    let mut records = Vec::new();
    for s in &found.sources {
        temp.add(store, &ext::entry(store, s))?;
        let (e, rec) = ext::ensure(store, s, offline)?;
        staged.push((s.clone(), e));
        records.push((s.clone(), rec));
    }
    prepared.wheel.ext = staged;
    prepared.wheel.ext_key = ext::key_inputs(&records);
    prepared.wheel.compiler_cache = compiler_cache(store)?;
    if let (Some(tree), Some(tc)) = (tree_rust, &cx.tc.rust) {
        let mut staged = Vec::new();
        for l in &tree.locks {
            temp.add(store, &crates::entry(store, l))?;
            staged.push(crates::ensure(store, tc, &src.path, l, offline)?);
        }
        prepared.wheel.rust = Some(RustInputs {
            tree: tree.clone(),
            crates: staged,
        });
    }
    if !prepared.wheel.ext.is_empty() {
        progress::stage(
            "ext",
            format!(
                "{} staged source(s) passed as {}",
                prepared.wheel.ext.len(),
                prepared.wheel.variables().join(", ")
            ),
        );
    }
    Ok(prepared)
}

/// The compiler cache of a build in `store`: with a team cache configured
/// (`[compiler_cache]`, [`crate::cache::compiler`]), ccache with it as its
/// remote storage; else sccache or ccache with the store's directory only
/// ([`CompilerCache::find`]). A team cache without ccache on PATH is said
/// once and the build goes on without it (it changes time, never bytes).
///
/// Errors (exit 2): a bad `[compiler_cache]` table.
pub fn compiler_cache(store: &Store) -> Result<Option<CompilerCache>> {
    let Some(team) = crate::cache::compiler::load(store.root())? else {
        return Ok(CompilerCache::find(store));
    };
    let remote = team.remote.to_string();
    match CompilerCache::with_remote(store, team.remote) {
        Some(c) => {
            progress::stage(
                "build",
                format!(
                    "team compiler cache {remote} (from {}), through {}",
                    team.file.display(),
                    c.tool.version
                ),
            );
            Ok(Some(c))
        }
        None => {
            progress::stage(
                "build",
                format!(
                    "{} sets the team compiler cache {remote}, but ccache is not on PATH: building without it (install ccache 4.4 or later)",
                    team.file.display()
                ),
            );
            Ok(CompilerCache::find(store))
        }
    }
}

/// The same key inputs as [`prepare`], computed without any network or
/// write (for `plan`): the lock (a lockfile, or one a build resolved into
/// the store) and every external source's staged revision; `None` when
/// either is missing. Only the wheelhouse entries already present are listed.
pub fn known(store: &Store, lr: &LoadedRecipe, src: &Path, lock_dir: &Path) -> Option<Prepared> {
    let (locked, lock_entry) = match lock::load(lock_dir, lr).ok()? {
        Some(l) => (l, None),
        None => {
            let e = lock::auto_entry(store, &lr.recipe);
            (lock::load(&e.path, lr).ok()??, Some(e))
        }
    };
    // The keys depend on the lock's sha256, not on its artifacts being
    // downloaded: the entries present are listed, the rest are fetched by
    // `prepare` when a build runs.
    let pick = |pkgs: &[crate::stages::lock::pylock::LockedPackage]| -> Vec<Entry> {
        pkgs.iter()
            .flat_map(|p| p.wanted())
            .map(|a| wheelhouse::entry(store, &a.sha256))
            .filter(Entry::exists)
            .collect()
    };
    let b = pick(&locked.build);
    let rt = pick(&locked.runtime);
    let mut prepared = installs(store, &locked, (b, rt));
    prepared.venv.lock_entry = lock_entry.clone();
    prepared.lock_entry = lock_entry;
    let found = ext::discover_in_tree(src, &lr.recipe.build.target_device).ok()?;
    let mut staged = Vec::new();
    let mut records = Vec::new();
    for s in &found.sources {
        let e = ext::entry(store, s);
        let rec: ext::ExtRecord = read_json(&e.path.join("ext.json")).ok()?;
        staged.push((s.clone(), e));
        records.push((s.clone(), rec));
    }
    prepared.wheel.ext = staged;
    prepared.wheel.ext_key = ext::key_inputs(&records);
    prepared.wheel.rust =
        match crate::stages::rust::discover_in_tree(src, &lr.recipe.build.target_device).ok()? {
            None => None,
            Some(tree) => Some(RustInputs {
                crates: crates::known(store, &tree.locks)?,
                tree,
            }),
        };
    Some(prepared)
}

/// `"; <why>"` when a bundle imported another recipe of this name (see
/// [`imported_differs`]), else empty.
fn imported_note(store: &Store, lr: &LoadedRecipe) -> String {
    imported_differs(store.root(), lr).map_or(String::new(), |why| format!("; {why}"))
}

/// When the recipe `lr` is not the one a bundle imported under its name
/// into the store at `root`: a line naming the imported file and every
/// differing field (dotted paths); `None` when none was imported or it is
/// the same recipe.
pub fn imported_differs(root: &Path, lr: &crate::recipe::LoadedRecipe) -> Option<String> {
    let name = &lr.recipe.name;
    let file = root
        .join("imported")
        .join(name)
        .join("recipes")
        .join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&file).ok()?;
    if text == lr.text {
        return None;
    }
    let theirs = crate::recipe::parse(&text, &file.display().to_string()).ok()?;
    let a = serde_json::to_value(&theirs).ok()?;
    let b = serde_json::to_value(&lr.recipe).ok()?;
    let mut fields = Vec::new();
    diff_fields("", &a, &b, &mut fields);
    if fields.is_empty() {
        return None;
    }
    Some(format!(
        "recipe {} differs from the one imported from a bundle ({}) in: {}; build that file, or export this recipe on a box with network",
        lr.origin,
        file.display(),
        fields.join(", ")
    ))
}

fn diff_fields(prefix: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    match (a, b) {
        (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                let null = serde_json::Value::Null;
                diff_fields(
                    &p,
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        _ if a != b => out.push(prefix.to_string()),
        _ => {}
    }
}

/// One external source as `plan` lists it.
#[derive(Debug, Serialize)]
pub struct ExtRow {
    /// FetchContent name.
    pub name: String,
    /// The declaring CMake file.
    pub file: String,
    /// `repo @ tag` or URL.
    pub origin: String,
    /// The variable it is passed through, or for one of several declarations
    /// the tree's configure chooses between, `the dependency provider
    /// (<file:line>)` ([`ExtSource::passed_through`]).
    pub variable: String,
    /// Where the variable points inside the source, if not at its root.
    pub subdir: Option<String>,
    /// `store/ext/<name>-<rev>`.
    pub entry: String,
    /// Whether that entry exists.
    pub staged: bool,
    /// The conditions it is declared under that the tool cannot evaluate
    /// (it is staged anyway), if any.
    pub condition: Option<String>,
    /// The URL it is fetched from (git sources): the staged entry's
    /// `fetched_from`, else the repository through the site's `[[mirror]]`
    /// tables (`None` for a URL source, or a mirror of `none`).
    #[serde(default)]
    pub fetched_from: Option<String>,
}

/// The external sources of `commit`, read from the checkout when it exists,
/// else from the mirror; `None` when neither holds the commit.
pub fn discover(store: &Store, lr: &LoadedRecipe) -> Option<Discovery> {
    let r = &lr.recipe;
    let src = source::checkout_entry(store, &r.source.commit);
    if src.exists() {
        return ext::discover_in_tree(&src.path, &r.build.target_device).ok();
    }
    let mirror = source::mirror_entry(store, &r.source.repo);
    ext::discover_in_mirror(&mirror.path, &r.source.commit, &r.build.target_device).ok()
}

/// The Rust of `commit`'s tree ([`crate::stages::rust`]), read from the
/// checkout when it exists, else from the mirror; `None` when its build
/// needs no Rust or neither holds the commit.
pub fn discover_rust(store: &Store, lr: &LoadedRecipe) -> Option<TreeRust> {
    let r = &lr.recipe;
    let src = source::checkout_entry(store, &r.source.commit);
    if src.exists() {
        return crate::stages::rust::discover_in_tree(&src.path, &r.build.target_device)
            .ok()
            .flatten();
    }
    let mirror = source::mirror_entry(store, &r.source.repo);
    crate::stages::rust::discover_in_mirror(&mirror.path, &r.source.commit, &r.build.target_device)
        .ok()
        .flatten()
}

/// Rows for `plan`.
pub fn ext_rows(store: &Store, found: &Discovery) -> Vec<ExtRow> {
    let mirrors = crate::host::mirror::load(store.root()).unwrap_or_default();
    found
        .sources
        .iter()
        .map(|s: &ExtSource| {
            let e = ext::entry(store, s);
            ExtRow {
                name: s.name.clone(),
                file: s.file.clone(),
                origin: ext::describe(&s.origin),
                variable: s.passed_through(),
                subdir: s.subdir.clone(),
                entry: e.label(),
                staged: e.exists(),
                condition: s.condition.clone(),
                fetched_from: ext::fetched_from(&e).or_else(|| match &s.origin {
                    ext::Origin::Git { repo, .. } => mirrors.map(repo).url().map(str::to_string),
                    ext::Origin::Url { .. } => None,
                }),
            }
        })
        .collect()
}

/// What the lock and wheelhouse stages would still fetch: no lock, or
/// wheels of the lock missing from the wheelhouse (one line each, worded
/// for `--offline`). Empty: the package indexes are not needed.
pub fn lock_problems(store: &Store, lr: &LoadedRecipe, lock_dir: &Path) -> Vec<String> {
    let r = &lr.recipe;
    let mut problems = Vec::new();
    match lock::load(lock_dir, lr) {
        Ok(Some(locked)) => {
            for (what, pkgs) in [
                ("build venv", &locked.build),
                ("oracle venv", &locked.runtime),
            ] {
                let missing = wheelhouse::missing(store, pkgs);
                if !missing.is_empty() {
                    problems.push(format!(
                        "--offline: wheelhouse ({what} stage) lacks {}",
                        missing.join(", ")
                    ));
                }
            }
        }
        Ok(None) => match lock::load(&lock::auto_entry(store, r).path, lr) {
            Ok(Some(locked)) => {
                for (what, pkgs) in [("build venv", &locked.build), ("oracle venv", &locked.runtime)] {
                    let missing = wheelhouse::missing(store, pkgs);
                    if !missing.is_empty() {
                        problems.push(format!("--offline: wheelhouse ({what} stage) lacks {}", missing.join(", ")));
                    }
                }
            }
            _ => problems.push(format!(
                "--offline: lock stage: no lockfile in {} and no lock in the store; run `oracle-build lock {}` while online, or import a bundle{}",
                lock_dir.display(),
                lock::lock_pin_arg(lr, lock_dir),
                imported_note(store, lr)
            )),
        },
        Err(e) => problems.push(format!("--offline: lock stage: {e:#}")),
    }
    problems
}

/// Everything an `--offline` build of `lr` would miss, one line each naming
/// the stage: no lockfile (or a stale one), locked artifacts not in the
/// wheelhouse, FetchContent sources not staged or not redirectable. The
/// source mirror itself is checked by the preflight.
pub fn offline_problems(store: &Store, lr: &LoadedRecipe, lock_dir: &Path) -> Vec<String> {
    let mut problems = lock_problems(store, lr, lock_dir);
    if let Some(tree) = discover_rust(store, lr) {
        for l in &tree.locks {
            let e = crates::entry(store, l);
            if !e.exists() {
                problems.push(format!(
                    "--offline: rust stage: the crates of {} are not staged in {}",
                    l.file,
                    e.label()
                ));
            }
        }
    }
    if let Some(found) = discover(store, lr) {
        for row in ext_rows(store, &found).iter().filter(|r| !r.staged) {
            problems.push(format!(
                "--offline: ext stage: {} ({}, from {}) is not staged in {}",
                row.name, row.origin, row.file, row.entry
            ));
        }
        for line in &found.unmapped {
            problems.push(format!(
                "--offline: ext stage: the build would download: {line}"
            ));
        }
    }
    problems
}
