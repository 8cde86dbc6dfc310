//! Stage "lock deps": resolve, with uv, the build set and the runtime set of
//! a pin into PEP 751 lock files with a sha256 for every artifact.
//!
//! - build set: the checkout's build requirements (`requirements/build/<device>.txt`,
//!   `requirements/build.txt`, or `pyproject.toml [build-system].requires`);
//! - runtime set: `requirements/<device>.txt` plus the recipe's pins;
//!
//! both with the recipe's pins as overrides (as the venv stage installs them)
//! and its indexes in order, for the recipe's Python, and cut off at the
//! commit's committer time (`--exclude-newer`) unless the recipe's
//! `lock.exclude_newer` says otherwise, so a lock made today and one made in
//! a year agree. Output is `uv pip compile --format pylock.toml
//! --generate-hashes --no-header --no-annotate`: no timestamps, no paths.
//!
//! The lock directory of a recipe (see [`lock_dir`]) holds
//! `pylock.build.toml`, `pylock.runtime.toml` and `lock.json` (the inputs it
//! was made for and the sha256 of each file). uv cannot install a pylock
//! file from a local wheelhouse (it fetches its URLs), so builds install
//! from a hash-pinned requirements list derived from it
//! ([`pylock::requirements_text`]) with `--require-hashes`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::stages::Ctx;
use anyhow::{Context, Result};
use fs_err as fs;
use serde::{Deserialize, Serialize};

use crate::exit::bad_input;
use crate::host::platform::Platform;
use crate::host::uv::pin_lines;
use crate::progress;
use crate::recipe::{LoadedRecipe, Recipe};
use crate::stages::requires::RuntimeSource;
use crate::stages::source::commit_time;
use crate::store::{Store, read_json, sha256_file, write_atomic};
pub mod indexes;
pub mod pylock;

use crate::stages::lock::pylock::{LockedPackage, parse_pylock};

/// The build set's lock file.
pub const BUILD_LOCK: &str = "pylock.build.toml";
/// The runtime set's lock file.
pub const RUNTIME_LOCK: &str = "pylock.runtime.toml";
/// The lock's record: inputs and file hashes.
pub const LOCK_JSON: &str = "lock.json";

/// What a lock was made for; a lock whose inputs differ from the recipe's is stale.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LockInputs {
    /// The pinned commit.
    pub commit: String,
    /// The recipe's Python (`major.minor`).
    pub python: String,
    /// `build.target_device`.
    pub target_device: String,
    /// The recipe's pins.
    pub pins: BTreeMap<String, String>,
    /// The recipe's indexes, in order.
    pub indexes: Vec<crate::recipe::Index>,
    /// `lock.exclude_newer` as written (`commit` when absent).
    pub exclude_newer: String,
    /// `install.extras`: extras of the package resolved into the runtime
    /// set (absent when none, so earlier locks keep their inputs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extras: Vec<String>,
    /// `install.with`: added exact pins resolved into the runtime set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
}

impl LockInputs {
    /// The inputs `r` asks for.
    pub fn of(r: &Recipe) -> LockInputs {
        LockInputs {
            commit: r.source.commit.clone(),
            python: r.python.clone(),
            target_device: r.build.target_device.clone(),
            pins: r.pins.clone(),
            indexes: r.indexes.clone(),
            exclude_newer: r
                .lock
                .exclude_newer
                .clone()
                .unwrap_or_else(|| "commit".into()),
            extras: r.install.extras.clone(),
            with: r.install.with.clone(),
        }
    }
}

/// `lock.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LockInfo {
    /// Format version.
    pub schema: u32,
    /// Recipe name. Its bytes are signed with the lock's: two boxes that
    /// lock one pin under two recipe names push two locks for one key, a
    /// reproducibility failure every reader sees (kept so that a lock made
    /// by an earlier version and one made now by the same recipe agree).
    pub recipe: String,
    /// What it was made for.
    pub inputs: LockInputs,
    /// The cut-off passed to uv (`--exclude-newer`), if any.
    pub exclude_newer: Option<String>,
    /// Where the build set came from.
    pub build_requirements: BuildRequirements,
    /// The runtime requirements file of the checkout, if any.
    pub runtime_requirements: Option<String>,
    /// Where the runtime set came from: the tree's metadata (PEP 517 hook)
    /// or, where the hook cannot run here, the requirement files.
    #[serde(default)]
    pub runtime_source: RuntimeSource,
    /// The uv that resolved it.
    pub uv: String,
    /// The platform it was resolved for (uv's `--python-platform` value; for
    /// a lock resolved with this host's interpreter, the host's own, see
    /// [`Platform::host`]). Absent in locks written before it was recorded:
    /// those are taken to be for the host that reads them.
    #[serde(default)]
    pub platform: Option<String>,
    /// Artifact file name -> the index it comes from (an explicit index's
    /// name, a plain index's URL, or `default`), see [`crate::host::uv::index_of`].
    #[serde(default)]
    pub artifact_index: BTreeMap<String, String>,
    /// File name -> sha256 of each lock file.
    pub files: BTreeMap<String, String>,
}

/// A loaded, verified lock.
#[derive(Debug, Clone)]
pub struct Locked {
    /// The lock directory.
    pub dir: PathBuf,
    /// Its record.
    pub info: LockInfo,
    /// The build set.
    pub build: Vec<LockedPackage>,
    /// The runtime set.
    pub runtime: Vec<LockedPackage>,
}

impl Locked {
    /// sha256 of `pylock.build.toml`.
    pub fn build_sha256(&self) -> Option<&String> {
        self.info.files.get(BUILD_LOCK)
    }
    /// sha256 of `pylock.runtime.toml`.
    pub fn runtime_sha256(&self) -> Option<&String> {
        self.info.files.get(RUNTIME_LOCK)
    }
}

/// The lock directory of `lr`: `<lockfiles>/<recipe name>/`, where
/// `<lockfiles>` is `explicit` (`--lockfiles`), else `$ORACLE_BUILD_LOCKFILES`,
/// else `lockfiles/` beside the recipe's `recipes/` directory (a recipe in
/// `<repo>/recipes/x.yaml` locks into `<repo>/lockfiles/`), else `lockfiles/`
/// in the recipe file's directory, else (built-in recipes) `./lockfiles`.
pub fn lock_dir(lr: &LoadedRecipe, explicit: Option<&Path>) -> PathBuf {
    let root = explicit
        .map(Path::to_path_buf)
        .or_else(|| {
            std::env::var_os("ORACLE_BUILD_LOCKFILES")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| default_root(lr));
    root.join(&lr.recipe.name)
}

/// The lockfiles directory of `lr` when neither `--lockfiles` nor
/// `ORACLE_BUILD_LOCKFILES` names one: `lockfiles/` beside the recipe
/// (beside its `recipes/` directory), else `./lockfiles`.
fn default_root(lr: &LoadedRecipe) -> PathBuf {
    match &lr.dir {
        Some(d) if d.file_name().is_some_and(|n| n == "recipes") => d
            .parent()
            .map_or_else(|| PathBuf::from("lockfiles"), |p| p.join("lockfiles")),
        Some(d) => d.join("lockfiles"),
        None => PathBuf::from("lockfiles"),
    }
}

/// How a printed `oracle-build lock` names the recipe of `lr` whose lock
/// directory is `dir`: the recipe ([`crate::recipe::shell_arg`]), with
/// `--lockfiles <root>` when `dir` is `<root>/<name>` for another root than
/// the recipe's own ([`default_root`]), so the command writes the lock
/// where this one was looked for.
pub fn lock_pin_arg(lr: &LoadedRecipe, dir: &Path) -> String {
    let pin = crate::recipe::shell_arg(lr);
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    match dir.parent() {
        Some(root)
            if dir.file_name().is_some_and(|n| *n == *lr.recipe.name)
                && abs(root) != abs(&default_root(lr)) =>
        {
            format!(
                "{pin} --lockfiles {}",
                crate::shell::shell_quote(&abs(root).display().to_string())
            )
        }
        _ => pin,
    }
}

/// The store entry keeping the lock resolved for a build of `r` made without
/// a lockfile: `store/lockfiles/<key>`, keyed by [`LockInputs`] (the commit
/// fixes the requirement files; the cut-off fixes the index state), this
/// host's platform (OS, machine, libc: [`Platform::host`]), so a store
/// shared by an x86_64 and an aarch64 box keeps one lock for each, and the
/// indexes the site drops ([`dropped_indexes`]).
pub fn auto_entry(store: &Store, r: &Recipe) -> crate::store::Entry {
    let key = crate::store::key::content_key(&auto_key_inputs(store, r));
    store.entry(crate::store::Bucket::Locks, &key)
}

/// The key inputs of [`auto_entry`] for `r` on this host and the site of
/// `store`: what a signed statement of the store lock names as its inputs.
/// `dropped_indexes` is there only when the site drops an index of `r`, so
/// a box without such a mirror keeps the key it always had.
pub fn auto_key_inputs(store: &Store, r: &Recipe) -> serde_json::Value {
    let mut v = serde_json::json!({
        "schema": crate::store::key::KEY_SCHEMA, "stage": "autolock", "inputs": LockInputs::of(r),
        "host": Platform::host().map(|p| p.spelled),
    });
    with_dropped(&mut v, dropped_indexes(store, r));
    v
}

/// The store entry keeping the lock `export --platform P` resolved for
/// another box: like [`auto_entry`], keyed by the platform as well, so it
/// never stands in for this host's own lock.
pub fn platform_entry(store: &Store, r: &Recipe, platform: &Platform) -> crate::store::Entry {
    let mut v = serde_json::json!({
        "schema": crate::store::key::KEY_SCHEMA, "stage": "autolock", "inputs": LockInputs::of(r),
        "platform": platform.spelled,
    });
    with_dropped(&mut v, dropped_indexes(store, r));
    let key = crate::store::key::content_key(&v);
    store.entry(crate::store::Bucket::Locks, &key)
}

/// Adds `dropped` to the key inputs `v` as `dropped_indexes`, when any.
fn with_dropped(v: &mut serde_json::Value, dropped: Vec<String>) {
    if !dropped.is_empty()
        && let Some(o) = v.as_object_mut()
    {
        o.insert("dropped_indexes".into(), serde_json::json!(dropped));
    }
}

/// The largest requirement file [`dropped_indexes`] reads from a mirror.
const MAX_REQUIREMENTS_BYTES: usize = 1 << 20;

/// The package indexes the site's `[[mirror]]` tables (the two
/// `config.toml` files of `store`) drop with `url = "none"` from a lock of
/// `r`: each URL as the recipe's `indexes` or a requirement file of the
/// pinned tree writes it, sorted ([`indexes::dropped`]). The tree is read
/// from the store's mirror of the repository at the commit, without a
/// checkout: the build and runtime requirement files a lock may read
/// ([`build_requirements`], [`fallback_files`]) and what they include.
///
/// Empty when no mirror drops anything (the tree is then not read), so the
/// key of a box without such a mirror is the one it always had. A mirror
/// that maps an index to another URL serves the same index: not here.
/// Until the mirror holds the commit, only the recipe's indexes are known
/// (every build, `push` and `export` reads the tree: a lookup made before
/// the source is there may miss, never take another box's lock). A
/// `config.toml` that does not parse counts as none here: every stage that
/// fetches reads it again and stops on it (exit 2).
pub fn dropped_indexes(store: &Store, r: &Recipe) -> Vec<String> {
    let Ok(mirrors) = crate::host::mirror::load(store.root()) else {
        return Vec::new();
    };
    if !mirrors.drops_any() {
        return Vec::new();
    }
    let mirror = crate::stages::source::mirror_entry(store, &r.source.repo);
    let lines = match crate::stages::source::CommitFiles::open(&mirror.path, &r.source.commit) {
        Some(tree) => {
            let read = |rel: &str| tree.read(rel, MAX_REQUIREMENTS_BYTES);
            let files = requirement_files(&|rel| read(rel).is_some(), &r.build.target_device);
            indexes::scan_with(&read, &files)
        }
        None => Vec::new(),
    };
    indexes::dropped(&mirrors, &r.indexes, &lines)
}

/// Where a tree's build requirements may be, in the order looked for
/// (`requirements/build/<device>.txt`, then `requirements/build.txt`).
pub fn build_candidates(device: &str) -> [String; 2] {
    [
        format!("requirements/build/{device}.txt"),
        "requirements/build.txt".into(),
    ]
}

/// Where a tree's runtime requirements may be, in the order looked for.
fn runtime_candidates(device: &str) -> [String; 2] {
    [
        format!("requirements/{device}.txt"),
        "requirements/common.txt".into(),
    ]
}

/// The requirement files a lock of a tree for `device` may read, given
/// which paths are files (`is_file`): the first build requirements file
/// and the first runtime one (read when the tree's metadata cannot be
/// asked), each found as [`build_requirements`] and [`fallback_files`] find it.
fn requirement_files(is_file: &dyn Fn(&str) -> bool, device: &str) -> Vec<String> {
    let first = |c: [String; 2]| c.into_iter().find(|rel| is_file(rel));
    first(build_candidates(device))
        .into_iter()
        .chain(first(runtime_candidates(device)))
        .collect()
}

/// The platform recorded in the lock in `dir`: `Ok(None)` when there is no
/// lock, `Ok(Some(None))` for a lock that records none.
///
/// Errors: `lock.json` does not parse.
pub fn recorded_platform(dir: &Path) -> Result<Option<Option<String>>> {
    let json = dir.join(LOCK_JSON);
    if !json.is_file() {
        return Ok(None);
    }
    let info: LockInfo = read_json(&json)?;
    Ok(Some(info.platform))
}

/// Whether a lock recording `recorded` may be used for `target`:
/// `None` (this host) accepts an unrecorded platform and any platform the
/// host runs ([`Platform::runs`]); an explicit target accepts only a lock
/// made for a platform it runs.
pub fn platform_fits(recorded: Option<&str>, target: Option<&Platform>) -> Result<(), String> {
    let host = Platform::host();
    let (want, label) = match target {
        Some(t) => (Some(t.clone()), format!("platform {t}")),
        None => (
            host.clone(),
            format!(
                "this host ({})",
                host.as_ref().map_or("unknown".into(), |h| h.to_string())
            ),
        ),
    };
    match (recorded, want) {
        (None, _) if target.is_none() => Ok(()),
        (None, _) => Err(format!(
            "it records no platform (it was resolved for the box that made it), not {label}"
        )),
        (Some(p), Some(w)) => match Platform::parse(p) {
            Ok(lp) if w.runs(&lp) => Ok(()),
            _ => Err(format!("it was resolved for platform {p}, not for {label}")),
        },
        (Some(p), None) => Err(format!(
            "it was resolved for platform {p}, and this host's platform is unknown"
        )),
    }
}

/// Which lock directory a build on `target` (`None`: this host) uses among
/// the locks side by side in a recipe's lock directory (see [`pick`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Pick {
    /// No lock at all.
    None,
    /// This directory: `<dir>` itself or `<dir>/<platform>/`.
    Dir(PathBuf),
    /// Locks exist, none for the target: why (names the platforms found).
    Unfit(String),
}

/// The directory, for a lock made for `platform`, under a recipe's lock
/// directory `dir`: `<dir>/<platform>/` (written by `lock --platform`).
pub fn platform_dir(dir: &Path, platform: &Platform) -> PathBuf {
    dir.join(&platform.spelled)
}

/// Picks the lock a build on `target` (`None`: this host) uses in the lock
/// directory `dir` of a recipe, where locks for several platforms live side
/// by side: `<dir>/lock.json` (made by `lock <PIN>` for the host that made
/// it) and `<dir>/<P>/lock.json` (made by `lock <PIN> --platform P`).
///
/// In order: `<dir>/<target>/` when a target is named and it holds a lock;
/// `<dir>` when its recorded platform fits ([`platform_fits`]); else the
/// `<dir>/<P>/` the target runs ([`Platform::runs`]) with the newest glibc.
/// `Pick::Unfit` names every platform found when none fits.
///
/// Errors: a `lock.json` does not parse.
pub fn pick(dir: &Path, target: Option<&Platform>) -> Result<Pick> {
    if let Some(t) = target
        && platform_dir(dir, t).join(LOCK_JSON).is_file()
    {
        return Ok(Pick::Dir(platform_dir(dir, t)));
    }
    let mut found = Vec::new();
    if let Some(recorded) = recorded_platform(dir)? {
        match platform_fits(recorded.as_deref(), target) {
            Ok(()) => return Ok(Pick::Dir(dir.to_path_buf())),
            Err(_) => found.push(format!(
                "{} for {}",
                dir.join(LOCK_JSON).display(),
                recorded.as_deref().unwrap_or("an unrecorded platform")
            )),
        }
    }
    let want = target.cloned().or_else(Platform::host);
    let mut best: Option<Platform> = None;
    let mut subdirs: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .filter(|e| e.path().join(LOCK_JSON).is_file())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect(),
        Err(_) => Vec::new(),
    };
    subdirs.sort();
    for name in subdirs {
        let Ok(p) = Platform::parse(&name) else {
            continue;
        };
        if want.as_ref().is_some_and(|w| w.runs(&p))
            && best.as_ref().is_none_or(|b| p.glibc_minor > b.glibc_minor)
        {
            best = Some(p);
        } else {
            found.push(format!("{}/ for {name}", dir.join(&name).display()));
        }
    }
    if let Some(b) = best {
        return Ok(Pick::Dir(platform_dir(dir, &b)));
    }
    if found.is_empty() {
        return Ok(Pick::None);
    }
    let label = match (target, &want) {
        (Some(t), _) => format!("platform {t}"),
        (None, Some(h)) => format!("this host ({h})"),
        (None, None) => "this host (platform unknown)".into(),
    };
    Ok(Pick::Unfit(format!(
        "no lock in {} is for {label}: it holds {}",
        dir.display(),
        found.join(", ")
    )))
}

/// The command that re-makes the lock in `dir` for the recipe named `name`
/// as the user gave it (see [`load`]): `oracle-build lock <name>`, with
/// `--platform P` when `dir` is a `<P>/` platform directory.
fn relock_hint(dir: &Path, name: &str) -> String {
    match dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| Platform::parse(n).is_ok())
    {
        Some(p) => format!("oracle-build lock {name} --platform {p}"),
        None => format!("oracle-build lock {name}"),
    }
}

/// Loads the lock a build of the recipe of `lr` on this host uses in `dir`
/// ([`pick`]): `Ok(None)` when there is none.
///
/// Errors (exit 2): the lock was made for other inputs (names them), for
/// another platform, or a lock file no longer has the sha256 recorded in
/// `lock.json`. The fix each names (`oracle-build lock <PIN>`) names the
/// recipe as `lr` was given: its file, else its name
/// ([`crate::recipe::shell_arg`]).
pub fn load(dir: &Path, lr: &LoadedRecipe) -> Result<Option<Locked>> {
    load_for(dir, lr, None)
}

/// [`load`] for a build on `target` (`None`: this host).
///
/// Errors (exit 2): as [`load`], and no lock in `dir` is for a platform
/// `target` runs ([`pick`], [`platform_fits`]).
pub fn load_for(
    dir: &Path,
    lr: &LoadedRecipe,
    target: Option<&Platform>,
) -> Result<Option<Locked>> {
    let r = &lr.recipe;
    let pin = lock_pin_arg(lr, dir);
    let dir = match pick(dir, target)? {
        Pick::None => return Ok(None),
        Pick::Dir(d) => d,
        Pick::Unfit(why) => {
            let relock = match target {
                Some(t) => format!("oracle-build lock {pin} --platform {t}"),
                None => format!("oracle-build lock {pin}"),
            };
            let p = target
                .cloned()
                .or_else(Platform::host)
                .map_or("<P>".to_string(), |p| p.spelled);
            return Err(bad_input(format!(
                "the lock cannot be used here: {why}; lock it for this platform (`{relock}`, or `oracle-build export {pin} --platform {p}` on a box with network)"
            )));
        }
    };
    let dir = dir.as_path();
    let info: LockInfo = read_json(&dir.join(LOCK_JSON))?;
    if let Err(why) = platform_fits(info.platform.as_deref(), target) {
        return Err(bad_input(format!(
            "the lock in {} cannot be used here: {why}; run `{}`",
            dir.display(),
            relock_hint(dir, &pin)
        )));
    }
    let want = LockInputs::of(r);
    if info.inputs != want {
        let a = serde_json::to_value(&info.inputs).unwrap_or_default();
        let b = serde_json::to_value(&want).unwrap_or_default();
        let diff: Vec<String> = b
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| a.get(k.as_str()) != Some(v))
            .map(|(k, v)| format!("{k}: lock has {}, recipe has {v}", a[k.as_str()]))
            .collect();
        return Err(bad_input(format!(
            "the lock in {} is stale ({}); run `{}`",
            dir.display(),
            diff.join("; "),
            relock_hint(dir, &pin)
        )));
    }
    for (name, sha) in &info.files {
        let got = sha256_file(&dir.join(name))?;
        if &got != sha {
            return Err(bad_input(format!(
                "{} changed since it was locked (sha256 {got}, lock.json says {sha}); run `{}`",
                dir.join(name).display(),
                relock_hint(dir, &pin)
            )));
        }
    }
    let read = |name: &str| -> Result<Vec<LockedPackage>> {
        if info.files.contains_key(name) {
            parse_pylock(&dir.join(name))
        } else {
            Ok(Vec::new())
        }
    };
    Ok(Some(Locked {
        dir: dir.to_path_buf(),
        build: read(BUILD_LOCK)?,
        runtime: read(RUNTIME_LOCK)?,
        info,
    }))
}

/// The `--exclude-newer` cut-off for `lr` whose checkout is `src`: the
/// commit's committer time (RFC 3339, UTC) unless `lock.exclude_newer` says
/// `none` or gives a timestamp.
///
/// Errors (exit 2): `lock.exclude_newer` is neither `commit`, `none` nor RFC 3339.
pub fn exclude_newer(lr: &LoadedRecipe, src: &Path) -> Result<Option<String>> {
    let r = &lr.recipe;
    match r.lock.exclude_newer.as_deref().unwrap_or("commit") {
        "commit" => {
            let t = commit_time(src, &r.source.commit)?;
            let ts = jiff::Timestamp::from_second(t)
                .with_context(|| format!("commit time {t} out of range"))?;
            Ok(Some(ts.to_string()))
        }
        "none" => Ok(None),
        other => other
            .parse::<jiff::Timestamp>()
            .map(|t| Some(t.to_string()))
            .map_err(|e| {
                bad_input(format!(
                    "{}: field `lock.exclude_newer`: {other:?} is not `commit`, `none` or an RFC 3339 timestamp ({e})",
                    lr.origin
                ))
            }),
    }
}

/// How [`resolve`] asks the tree for its runtime set: called with the build
/// lock just written (`pylock.build.toml`, in the lock directory) and a
/// scratch directory, it returns the active `Requires-Dist` of the tree's
/// metadata (PEP 517 `prepare_metadata_for_build_wheel`, run in a venv that
/// holds exactly that build set). The pipeline layer supplies it, as it
/// alone may use the wheelhouse and wheel stages that this needs. An error
/// whose cause is [`crate::stages::requires::TreeDeclined`] (the tree has
/// no hook, or its hook failed) makes [`resolve`] fall back to the
/// requirement files ([`fallback_files`]), naming that reason in
/// `lock.json`; any other error (the step itself failed: a download, the
/// build venv, a full disk, even inside the hook) fails [`resolve`], which
/// then writes nothing.
pub type AskRuntime<'a> = &'a dyn Fn(&Path, &Path) -> Result<Vec<String>>;

/// Resolves the build and runtime sets of `lr` (checkout at `src`) with uv
/// and writes them, then `lock.json`, into `dir` (each file replaced
/// atomically; `lock.json` last), only once everything has succeeded.
/// Scratch files go to a staging directory of `store`.
///
/// Errors: uv cannot resolve (its output is quoted; the log is named); the
/// metadata step fails other than by the tree declining ([`AskRuntime`]):
/// the message says so, and that the disk is full when it is; `dir` is
/// left as it was.
pub fn resolve(cx: &Ctx<'_>, src: &Path, dir: &Path, ask: AskRuntime<'_>) -> Result<Locked> {
    resolve_for(cx, src, dir, None, ask)
}

/// [`resolve`] for `platform` (`None`: this host, with the toolchain's
/// interpreter). For another platform uv resolves with `--python-version
/// <recipe python> --python-platform <P>` and needs no interpreter of it.
/// The platform is recorded in `lock.json`.
///
/// Errors: as [`resolve`].
pub fn resolve_for(
    cx: &Ctx<'_>,
    src: &Path,
    dir: &Path,
    platform: Option<&Platform>,
    ask: AskRuntime<'_>,
) -> Result<Locked> {
    let Ctx { store, lr, tc, .. } = *cx;
    let r = &lr.recipe;
    let cutoff = exclude_newer(lr, src)?;
    progress::stage(
        "lock",
        format!(
            "resolving {} for Python {} on {} (uploads up to {})",
            r.name,
            platform.map_or(tc.python.version.clone(), |_| r.python.clone()),
            platform.map_or("this host".to_string(), |p| p.to_string()),
            cutoff.as_deref().unwrap_or("now: no cut-off")
        ),
    );
    let staging = store.stage("lock")?;
    let work = staging.path();
    let log = work.join("lock.log");
    let overrides = work.join("overrides.txt");
    fs::write(&overrides, pin_lines(&r.pins))?;
    let mut common: Vec<String> = vec![
        "--format".into(),
        "pylock.toml".into(),
        "--generate-hashes".into(),
        "--no-header".into(),
        "--no-annotate".into(),
    ];
    match platform {
        None => common.extend(["--python".into(), tc.python.path.display().to_string()]),
        Some(p) => common.extend([
            "--python-version".into(),
            r.python.clone(),
            "--python-platform".into(),
            p.spelled.clone(),
        ]),
    }
    common.extend(["--override".into(), overrides.display().to_string()]);
    if let Some(ts) = &cutoff {
        common.extend(["--exclude-newer".into(), ts.clone()]);
    }
    // The site's mirrors of every index (docs/cache.md "Mirrors").
    let mirrors = crate::host::mirror::load(store.root())?;
    let mirrored = work.join("requirements-mirrored");
    // Packages of explicit indexes come only from them.
    if let Some(project) =
        crate::host::uv::explicit_project(&indexes::map_indexes(&mirrors, &r.indexes))
    {
        let dir = work.join("explicit-indexes");
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("pyproject.toml"), project)?;
        common.push(dir.join("pyproject.toml").display().to_string());
    }
    let mut files = BTreeMap::new();

    let build_reqs = build_requirements(src, &r.build.target_device)?;
    let build_in = work.join("build.in");
    let online = !cx.uv.offline;
    match &build_reqs {
        BuildRequirements::File(rel) => {
            let files = [rel.clone()];
            if online {
                indexes::check_reachable(&mirrors, &indexes::scan(src, &files), &r.indexes)?;
            }
            let root = indexes::rewrite(src, &files, &mirrors, &mirrored)?;
            let root = root.as_deref().unwrap_or(src);
            fs::write(&build_in, format!("-r {}\n", root.join(rel).display()))?
        }
        BuildRequirements::Pyproject(reqs) => {
            if online {
                indexes::check_reachable(&mirrors, &[], &r.indexes)?;
            }
            fs::write(
                &build_in,
                reqs.iter().map(|l| format!("{l}\n")).collect::<String>(),
            )?
        }
    }
    let build_in_text = fs::read_to_string(&build_in)?;
    // Nothing reaches `dir` before every step has succeeded: the files are
    // made in `work` and written into `dir` at the end.
    let mut made: Vec<(&str, Vec<u8>)> = Vec::new();
    let runtime;
    let mut runtime_in = String::new();
    let runtime_source;
    {
        // The build set first: the runtime set is asked of the tree in it.
        let name = BUILD_LOCK;
        let asked = if build_in_text.trim().is_empty() {
            Err(anyhow::Error::new(crate::stages::requires::TreeDeclined(
                "the tree declares no build requirements".into(),
            )))
        } else {
            compile(cx, &common, work, name, &build_in_text, &log)?;
            made.push((name, fs::read(work.join(name))?));
            ask(&work.join(name), work)
        };
        // Only the tree's own answer that it cannot say (no hook, its hook
        // failing) falls back to the requirement files; a failure of the
        // step itself (a download, the build venv, a full disk) fails the
        // lock, and nothing of it is kept.
        let asked = match asked {
            Err(why) if crate::host::disk::is_disk_full(&why) => {
                return Err(why.context(format!(
                    "the metadata step of the lock of {} (PEP 517 prepare_metadata_for_build_wheel) failed: the disk is full (ENOSPC); no lock was written",
                    r.name
                )));
            }
            Err(why) => match why.downcast_ref::<crate::stages::requires::TreeDeclined>() {
                Some(d) => Err(d.0.clone()),
                None => {
                    return Err(why.context(format!(
                        "the metadata step of the lock of {} (PEP 517 prepare_metadata_for_build_wheel) failed; no lock was written",
                        r.name
                    )));
                }
            },
            Ok(reqs) => Ok(reqs),
        };
        match asked {
            Ok(reqs) => {
                for l in &reqs {
                    runtime_in.push_str(l);
                    runtime_in.push('\n');
                }
                runtime = None;
                runtime_source = RuntimeSource::Metadata {
                    requires_dist: reqs,
                };
            }
            Err(reason) if !r.install.extras.is_empty() => {
                // Extras are the package's own metadata's to say: no
                // requirement file tells them.
                return Err(bad_input(format!(
                    "{}: field `install.extras`: {:?} cannot be resolved: the tree's metadata could not be asked ({reason}), and extras are evaluated with it; name the packages in `install.with` instead",
                    lr.origin, r.install.extras
                )));
            }
            Err(reason) => {
                let files = fallback_files(src, &r.build.target_device);
                if online {
                    indexes::check_reachable(&mirrors, &indexes::scan(src, &files), &r.indexes)?;
                }
                let root = indexes::rewrite(src, &files, &mirrors, &mirrored)?;
                let root = root.as_deref().unwrap_or(src);
                for rel in &files {
                    runtime_in.push_str(&format!("-r {}\n", root.join(rel).display()));
                }
                runtime = files.first().cloned();
                runtime_source = RuntimeSource::Files { files, reason };
            }
        }
        progress::stage(
            "lock",
            format!("runtime set from {}", runtime_source.describe()),
        );
    }
    let package_reqs = runtime_in.clone();
    runtime_in.push_str(&pin_lines(&r.pins));
    for w in &r.install.with {
        runtime_in.push_str(w);
        runtime_in.push('\n');
    }
    let sets = [(RUNTIME_LOCK, runtime_in)];
    for (name, input) in sets {
        if input.trim().is_empty() {
            continue;
        }
        compile(cx, &common, work, name, &input, &log)
            .map_err(|e| with_conflict(e, lr, &package_reqs))?;
        made.push((name, fs::read(work.join(name))?));
    }
    fs::create_dir_all(dir)?;
    for (name, bytes) in &made {
        write_atomic(&dir.join(name), bytes)?;
        files.insert(name.to_string(), sha256_file(&dir.join(name))?);
    }
    for stale in [BUILD_LOCK, RUNTIME_LOCK] {
        if !files.contains_key(stale) && dir.join(stale).exists() {
            fs::remove_file(dir.join(stale))?;
        }
    }
    let mut artifact_index = BTreeMap::new();
    for name in files.keys() {
        for p in parse_pylock(&dir.join(name))? {
            for a in p.wheels.iter().chain(p.sdist.iter()) {
                if let Some(url) = &a.url {
                    artifact_index.insert(
                        a.filename.clone(),
                        indexes::index_of(&mirrors, &r.indexes, url),
                    );
                }
            }
        }
    }
    let info = LockInfo {
        artifact_index,
        schema: 1,
        recipe: r.name.clone(),
        inputs: LockInputs::of(r),
        exclude_newer: cutoff,
        build_requirements: build_reqs,
        runtime_requirements: runtime,
        runtime_source,
        uv: tc.uv.version.clone(),
        platform: platform.cloned().or_else(Platform::host).map(|p| p.spelled),
        files,
    };
    crate::store::write_json(&dir.join(LOCK_JSON), &info)?;
    load_for(dir, lr, platform)?.context("the lock just written cannot be read back")
}

/// `e`, uv's failure to resolve the runtime set, told as a conflict of the
/// recipe's `install.with` when uv's answer names an added package: the
/// message names each such entry (file, line, field) and the package's own
/// requirements of that name (`package_reqs`, the runtime set's input
/// before the recipe's additions), then uv's own explanation; exit 2.
/// Any other failure is returned as it was.
fn with_conflict(e: anyhow::Error, lr: &LoadedRecipe, package_reqs: &str) -> anyhow::Error {
    use std::str::FromStr;
    let text = format!("{e:#}").to_lowercase();
    if !text.contains("no solution found") && !text.contains("unsatisfiable") {
        return e;
    }
    let own: Vec<pep508_rs::Requirement> = package_reqs
        .lines()
        .filter_map(|l| pep508_rs::Requirement::from_str(l.trim()).ok())
        .collect();
    let mut named = Vec::new();
    for (i, w) in lr.recipe.install.with.iter().enumerate() {
        let Ok((name, _)) = crate::recipe::parse_with(w) else {
            continue;
        };
        if !text.contains(&name) && !text.contains(&name.replace('-', "_")) {
            continue;
        }
        let field = format!("install.with[{i}]");
        let line = crate::recipe::locate(&lr.text, &field)
            .map_or(String::new(), |l| format!("line {l}: "));
        let theirs: Vec<String> = own
            .iter()
            .filter(|r| r.name.to_string() == name)
            .map(ToString::to_string)
            .collect();
        let theirs = if theirs.is_empty() {
            "a requirement of its dependencies (see uv's answer below)".to_string()
        } else {
            format!(
                "{} requires {}",
                lr.recipe.source.package,
                theirs.join(", ")
            )
        };
        named.push(format!(
            "{}: {line}field `{field}`: {w:?} conflicts with the package's own requirements: {theirs}",
            lr.origin
        ));
    }
    if named.is_empty() {
        return e;
    }
    bad_input(format!(
        "{}; the runtime set cannot be resolved, no lock was written. uv says: {e:#}",
        named.join("; ")
    ))
}

/// `uv pip compile` of `input` into `<work>/<name>` with the shared arguments.
fn compile(
    cx: &Ctx<'_>,
    common: &[String],
    work: &Path,
    name: &str,
    input: &str,
    log: &Path,
) -> Result<()> {
    let inp = work.join(format!("{name}.in"));
    fs::write(&inp, input)?;
    let mut args = common.to_vec();
    args.extend([
        "-o".into(),
        work.join(name).display().to_string(),
        inp.display().to_string(),
    ]);
    cx.uv
        .pip_compile(&args, log)
        .with_context(|| format!("resolving {name} for {}", cx.lr.recipe.name))
}

/// The requirement files the tree's setup.py reads for `device` when its
/// metadata cannot be asked: `requirements/<device>.txt`, else (vLLM's
/// `empty`, which has no file of its own) `requirements/common.txt`.
pub fn fallback_files(src: &Path, device: &str) -> Vec<String> {
    runtime_candidates(device)
        .into_iter()
        .find(|rel| src.join(rel).is_file())
        .into_iter()
        .collect()
}

/// Where the build requirements come from, in the order they are looked for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum BuildRequirements {
    /// A requirements file of the checkout (path relative to it).
    /// (`File`: how locks written before the lower-case names spelled it.)
    #[serde(alias = "File")]
    File(String),
    /// `pyproject.toml` `[build-system].requires`.
    #[serde(alias = "Pyproject")]
    Pyproject(Vec<String>),
}

/// Finds the build requirements of the checkout at `src` for `device`:
/// `requirements/build/<device>.txt`, else `requirements/build.txt`, else
/// `pyproject.toml` `[build-system].requires`.
///
/// Errors: none of them exists, or `pyproject.toml` does not parse.
pub fn build_requirements(src: &Path, device: &str) -> Result<BuildRequirements> {
    for rel in build_candidates(device) {
        if src.join(&rel).is_file() {
            return Ok(BuildRequirements::File(rel));
        }
    }
    let pyproject = src.join("pyproject.toml");
    if pyproject.is_file() {
        let doc: toml::Table = toml::from_str(&fs::read_to_string(&pyproject)?)
            .with_context(|| format!("parsing {}", pyproject.display()))?;
        let reqs = doc
            .get("build-system")
            .and_then(|b| b.get("requires"))
            .and_then(|r| r.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        return Ok(BuildRequirements::Pyproject(reqs));
    }
    bail!(
        "{} has no requirements/build*.txt and no pyproject.toml: cannot tell its build dependencies",
        src.display()
    )
}

/// The checkout's runtime requirements file for `device`
/// (`requirements/<device>.txt`, vLLM's layout), relative to `src`, if present.
pub fn runtime_requirements(src: &Path, device: &str) -> Option<String> {
    let rel = format!("requirements/{device}.txt");
    src.join(&rel).is_file().then_some(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a `lock.json` recording `platform` into `dir`.
    fn lock_json(dir: &Path, platform: Option<&str>) {
        let info = LockInfo {
            schema: 1,
            recipe: "fx".into(),
            inputs: LockInputs {
                commit: "c".into(),
                python: "3.11".into(),
                target_device: "cpu".into(),
                pins: BTreeMap::new(),
                indexes: Vec::new(),
                exclude_newer: "commit".into(),
                extras: Vec::new(),
                with: Vec::new(),
            },
            exclude_newer: None,
            build_requirements: BuildRequirements::Pyproject(Vec::new()),
            runtime_requirements: None,
            runtime_source: RuntimeSource::default(),
            uv: "uv 0.13.9".into(),
            platform: platform.map(str::to_string),
            artifact_index: BTreeMap::new(),
            files: BTreeMap::new(),
        };
        fs::create_dir_all(dir).unwrap();
        crate::store::write_json(&dir.join(LOCK_JSON), &info).unwrap();
    }

    fn p(s: &str) -> Platform {
        Platform::parse(s).unwrap()
    }

    #[test]
    fn a_build_picks_the_lock_of_its_platform_among_those_side_by_side() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("fx");
        assert_eq!(pick(&d, None).unwrap(), Pick::None);

        // Only an x86_64 lock: stale for an aarch64 target, naming what is there.
        lock_json(
            &d.join("x86_64-manylinux_2_28"),
            Some("x86_64-manylinux_2_28"),
        );
        let arm = p("aarch64-manylinux_2_28");
        match pick(&d, Some(&arm)).unwrap() {
            Pick::Unfit(why) => assert!(
                why.contains("is for platform aarch64-manylinux_2_28")
                    && why.contains("x86_64-manylinux_2_28/ for x86_64-manylinux_2_28"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        // A newer-glibc x86_64 box runs it; an older one does not.
        let x36 = p("x86_64-manylinux_2_36");
        assert_eq!(
            pick(&d, Some(&x36)).unwrap(),
            Pick::Dir(d.join("x86_64-manylinux_2_28"))
        );
        assert!(matches!(
            pick(&d, Some(&p("x86_64-manylinux_2_17"))).unwrap(),
            Pick::Unfit(_)
        ));

        // The newest glibc the target runs wins; an exact name first.
        lock_json(
            &d.join("x86_64-manylinux_2_34"),
            Some("x86_64-manylinux_2_34"),
        );
        lock_json(
            &d.join("x86_64-manylinux_2_39"),
            Some("x86_64-manylinux_2_39"),
        );
        lock_json(
            &d.join("aarch64-manylinux_2_28"),
            Some("aarch64-manylinux_2_28"),
        );
        assert_eq!(
            pick(&d, Some(&x36)).unwrap(),
            Pick::Dir(d.join("x86_64-manylinux_2_34"))
        );
        assert_eq!(
            pick(&d, Some(&p("x86_64-manylinux_2_28"))).unwrap(),
            Pick::Dir(d.join("x86_64-manylinux_2_28"))
        );
        assert_eq!(
            pick(&d, Some(&arm)).unwrap(),
            Pick::Dir(d.join("aarch64-manylinux_2_28"))
        );

        // The host's own lock in the top directory comes before the others
        // when it fits; an unrecorded one is taken to be the host's.
        lock_json(&d, Some("x86_64-manylinux_2_36"));
        assert_eq!(pick(&d, Some(&x36)).unwrap(), Pick::Dir(d.clone()));
        assert_eq!(
            pick(&d, Some(&arm)).unwrap(),
            Pick::Dir(d.join("aarch64-manylinux_2_28"))
        );
        lock_json(&d, None);
        assert_eq!(pick(&d, None).unwrap(), Pick::Dir(d.clone()));
        // A directory that is no platform is not a lock for any.
        lock_json(&d.join("notes"), Some("aarch64-manylinux_2_28"));
        let bare = tmp.path().join("bare");
        lock_json(&bare.join("notes"), Some("aarch64-manylinux_2_28"));
        assert_eq!(pick(&bare, Some(&arm)).unwrap(), Pick::None);
    }

    #[test]
    fn a_lock_key_without_dropped_indexes_is_the_one_it_always_was() {
        let v = serde_json::json!({"schema": 1, "stage": "autolock", "host": "h"});
        let mut same = v.clone();
        with_dropped(&mut same, Vec::new());
        assert_eq!(same, v);
        let mut other = v.clone();
        with_dropped(
            &mut other,
            vec!["https://download.pytorch.org/whl/cpu".into()],
        );
        assert_ne!(
            crate::store::key::content_key(&other),
            crate::store::key::content_key(&v)
        );
        // The files a lock may read: the first build file and the first runtime one.
        let have = [
            "requirements/build.txt",
            "requirements/common.txt",
            "requirements/cpu.txt",
        ];
        let is_file = |rel: &str| have.contains(&rel);
        assert_eq!(
            requirement_files(&is_file, "cpu"),
            ["requirements/build.txt", "requirements/cpu.txt"]
        );
        assert_eq!(
            requirement_files(&is_file, "empty"),
            ["requirements/build.txt", "requirements/common.txt"]
        );
    }

    #[test]
    fn the_relock_command_names_the_platform_of_a_platform_directory() {
        assert_eq!(
            relock_hint(Path::new("/l/fx/aarch64-manylinux_2_28"), "fx"),
            "oracle-build lock fx --platform aarch64-manylinux_2_28"
        );
        assert_eq!(
            relock_hint(Path::new("/l/fx"), "fx"),
            "oracle-build lock fx"
        );
    }
}
