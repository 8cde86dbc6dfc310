//! Stage 6, venv: install the wheel non-editably into a content-addressed,
//! relocatable venv (uv's `--relocatable`), in staging.
//!
//! [`plan`] computes the venv key once from complete inputs (Python, package,
//! recipe name, commit, build mode, the wheel's key and sha256, pins, indexes, the checkout's runtime
//! requirements file and the runtime lock's sha256); [`install`] makes the
//! venv in a staging directory. The identity check, the gate and the record
//! that turn it into the entry `store/venvs/<key>/` are
//! the oracle stage's (`stages::oracle`, which runs after this one).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use fs_err as fs;
use serde_json::{Value, json};

use crate::host::bytecode;
use crate::host::toolchain::Toolchain;
use crate::host::uv::pin_lines;
use crate::progress;
use crate::recipe::LoadedRecipe;
use crate::stages::Ctx;
use crate::stages::lock::pylock::LockedPackage;
use crate::stages::lock::runtime_requirements;
use crate::stages::requires::{self, LockedVersion};
use crate::stages::tree_requires;
use crate::stages::wheel::BuildRecord;
use crate::stages::wheelhouse;
use crate::stages::wheelhouse::LockedInstall;
use crate::store::key::{KEY_SCHEMA, content_key};
use crate::store::{Bucket, Entry, Store, sha256_file};

/// What the venv stage takes beyond its own plan.
#[derive(Debug, Clone, Default)]
pub struct VenvHermetic {
    /// The runtime set, installed with the wheel.
    pub runtime_lock: Option<LockedInstall>,
    /// The store entry holding that lock, when it came from the store (a
    /// lock a build resolved, or one a bundle brought), not a lockfile: the
    /// oracle's record requires it, so `gc` keeps it while the oracle is
    /// rooted and an `--offline` rebuild finds it.
    pub lock_entry: Option<crate::store::Entry>,
}

/// The venv stage's key and entry, known before any work.
#[derive(Debug, Clone)]
pub struct VenvPlan {
    /// Content key.
    pub key: String,
    /// The hashed inputs.
    pub inputs: Value,
    /// `store/venvs/<key>`.
    pub entry: Entry,
    /// The checkout's runtime requirements file, if any.
    pub runtime: Option<String>,
    /// The locked runtime set.
    pub hermetic: VenvHermetic,
    /// Warnings about the source (a fork-only commit), recorded with the oracle.
    pub source_warnings: Vec<String>,
    /// Checks of the source that were not made (the fork-only check on a
    /// mirror whose branches were not fetched), recorded with the oracle.
    pub source_notes: Vec<String>,
}

/// The venv plan for installing `wheel` (built from the checkout at `src`)
/// with `tc` and the locked runtime set of `hermetic`: the key is computed
/// once, from every input (see [`crate::store::key`]).
pub fn plan(
    store: &Store,
    lr: &LoadedRecipe,
    tc: &Toolchain,
    wheel: &BuildRecord,
    src: &Path,
    hermetic: VenvHermetic,
) -> VenvPlan {
    let r = &lr.recipe;
    let runtime = runtime_requirements(src, &r.build.target_device);
    let mut inputs = json!({
        "schema": KEY_SCHEMA,
        "stage": "venv",
        "python": {"version": tc.python.version, "implementation": tc.python.implementation, "platform": tc.python.platform},
        "uv": crate::host::toolchain::uv_version_number(&tc.uv.version),
        "package": r.source.package,
        // The oracle's record and root belong to the recipe of this name.
        "recipe": r.name,
        "commit": r.source.commit,
        // Every input that can change the oracle: the wheel's key covers the
        // build mode, device, build environment and toolchain; the mode is
        // named too, so a precompiled recipe never shares a source venv even
        // when the two wheels are byte-identical.
        "mode": r.build.mode.as_str(),
        "wheel_key": wheel.key,
        "wheel_sha256": wheel.sha256,
        "pins": r.pins,
        "indexes": r.indexes,
        "runtime_requirements": runtime,
        "runtime_lock": hermetic.runtime_lock.as_ref().map(|l| l.lock_sha256.clone()),
    });
    // The recipe's added packages (`install.extras`, `install.with`): named
    // only when asked for, so an oracle without them keeps its key.
    if !r.install.is_empty()
        && let Some(o) = inputs.as_object_mut()
    {
        o.insert("install".into(), json!(r.install));
    }
    let key = content_key(&inputs);
    VenvPlan {
        entry: store.entry(Bucket::Venvs, &key),
        key,
        inputs,
        runtime,
        hermetic,
        source_warnings: Vec::new(),
        source_notes: Vec::new(),
    }
}

/// A venv installed in staging by [`install`].
#[derive(Debug, Clone)]
pub struct Installed {
    /// The venv (`<staging>/venv`).
    pub venv: PathBuf,
    /// Scratch files and logs that travel with the entry (`<staging>/scratch`).
    pub scratch: PathBuf,
    /// The install log (`<root>/logs/install-<key>.log`).
    pub log: PathBuf,
    /// When the install started (RFC 3339).
    pub created: String,
    /// Seconds spent creating and installing the venv (links and bytecode).
    pub install_s: f64,
    /// Of which: creating the venv and linking the files (uv).
    pub link_s: f64,
    /// Of which: bytecode, linked from the pool or compiled.
    pub bytecode_s: f64,
    /// Where the bytecode came from.
    pub bytecode: InstalledBytecode,
    /// sha256 of files known without reading them (path relative to the
    /// venv), for the manifest: see [`record_hashes`] and `host::bytecode`.
    pub known: HashMap<String, String>,
}

/// Where an oracle venv's `.pyc` files came from (`oracle.json`'s
/// `bytecode`): linked from the store's bytecode entries (one per wheel and
/// Python, made here or pulled from a cache) or its pool, or compiled here.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct BytecodeStats {
    /// `.pyc` files hard-linked from bytecode entries and the pool.
    pub linked: usize,
    /// `.pyc` files compiled by this box for this venv (0 when every
    /// wheel's bytecode entry was in the store already, e.g. pulled).
    pub compiled: usize,
    /// Sources Python refused to compile.
    pub failed: usize,
}

/// The install's bytecode line: every `.pyc` of the venv is linked from
/// the store's pool, and those this box compiled now went into the pool
/// first, so the compiled ones are a part of the linked ones, said as such
/// (`43 .pyc linked from the store's pool: 40 compiled now into it, 3 there
/// from earlier builds or pulls`), never as two counts side by side.
pub fn describe_bytecode(stats: &BytecodeStats, entries_made: usize, wheels: usize) -> String {
    let earlier = stats.linked.saturating_sub(stats.compiled);
    let origin = match (stats.compiled, earlier) {
        (0, 0) => String::new(),
        (0, e) => format!(": all {e} there from earlier builds or pulls"),
        (c, 0) => format!(": all {c} compiled now into it"),
        (c, e) => format!(": {c} compiled now into it, {e} there from earlier builds or pulls"),
    };
    format!(
        "bytecode: {} .pyc linked from the store's pool{origin}; {} source(s) not compilable; {entries_made} of {wheels} wheels' bytecode entries made now",
        stats.linked, stats.failed
    )
}

/// Where an installed venv's bytecode came from.
#[derive(Debug, Clone, Default)]
pub struct InstalledBytecode {
    /// The counts, for `oracle.json`.
    pub stats: BytecodeStats,
    /// The labels of the bytecode entries used (`pyc/<name>`), for the
    /// oracle's `requires`.
    pub entries: Vec<String>,
}

/// The sha256 that the installed distributions' `RECORD` files (PEP 376,
/// `sha256=<urlsafe base64, no padding>`) give for their files under
/// `<venv>/lib/*/site-packages`, by path relative to the venv, for the files
/// where it can be trusted: a hard link (the file is the uv cache's, unpacked
/// from a hash-checked artifact) with the recorded size. Files uv wrote for
/// this venv (scripts, `RECORD` itself) are left out and hashed as usual.
///
/// Errors: the venv's `lib` cannot be read.
pub fn record_hashes(venv: &Path) -> Result<HashMap<String, String>> {
    use base64::Engine;
    use std::os::unix::fs::MetadataExt;
    let mut out = HashMap::new();
    for rec in records(venv)? {
        for line in rec.text.lines() {
            let Some((path, hash, size)) = record_row(line) else {
                continue;
            };
            let (Some(b64), Ok(size)) = (hash.strip_prefix("sha256="), size.parse::<u64>()) else {
                continue;
            };
            let Ok(raw) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(b64) else {
                continue;
            };
            if raw.len() != 32 {
                continue;
            }
            let file = rec.site.join(path);
            let Ok(meta) = std::fs::symlink_metadata(&file) else {
                continue;
            };
            if !meta.is_file() || meta.nlink() < 2 || meta.len() != size {
                continue;
            }
            if let Ok(rel) = file.strip_prefix(venv) {
                out.insert(rel.to_string_lossy().into_owned(), hex::encode(raw));
            }
        }
    }
    Ok(out)
}

/// One installed distribution's `RECORD` (PEP 376) in a venv.
struct Record {
    /// The `site-packages` holding its `.dist-info`.
    site: PathBuf,
    /// The `.dist-info` directory's name (`<name>-<version>.dist-info`, PEP 427).
    dist_info: String,
    /// The `RECORD`'s text.
    text: String,
}

/// The readable `RECORD` of every `.dist-info` under `<venv>/lib/*/site-packages`.
///
/// Errors: the venv's `lib` cannot be read.
fn records(venv: &Path) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for e in fs::read_dir(venv.join("lib"))? {
        let site = e?.path().join("site-packages");
        let Ok(rd) = std::fs::read_dir(&site) else {
            continue;
        };
        for d in rd.flatten() {
            let dist_info = d.file_name().to_string_lossy().into_owned();
            if !dist_info.ends_with(".dist-info") {
                continue;
            }
            if let Ok(text) = std::fs::read_to_string(d.path().join("RECORD")) {
                out.push(Record {
                    site: site.clone(),
                    dist_info,
                    text,
                });
            }
        }
    }
    Ok(out)
}

/// `(path, hash, size)` of one `RECORD` line (`path,sha256=...,size`; the
/// path may itself hold commas, then quoted), for a path inside
/// site-packages (not absolute, no `..` or empty component).
fn record_row(line: &str) -> Option<(&str, &str, &str)> {
    let mut it = line.rsplitn(3, ',');
    let (size, hash, path) = (it.next()?, it.next()?, it.next()?);
    let path = path.trim_matches('"');
    if path.starts_with('/') || path.split('/').any(|c| c == ".." || c.is_empty()) {
        return None;
    }
    Some((path, hash, size))
}

/// The files of a damaged venv entry whose damage the store's caches share,
/// found by [`shared_damage`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SharedDamage {
    /// Damaged files (absolute paths) that share their inode with another
    /// link (the uv cache's unpacked wheel, the bytecode pool, other venvs).
    pub files: Vec<PathBuf>,
    /// The distributions whose `RECORD` lists one of `files`, by their
    /// normalized name (PEP 503): uv's cache holds their unpacked wheels.
    pub dists: Vec<String>,
    /// Files of `files` no `RECORD` lists, other than `__pycache__/*.pyc`
    /// (those come from the bytecode pool), by path relative to the venv:
    /// where in uv's cache they live is not known.
    pub unowned: Vec<String>,
}

/// The damage of the venv entry at `venv` that the store's caches share,
/// from the problems its manifest check reported (`problems`, as
/// `Manifest::check` words them, `<kind>: <path>[ (<detail>)]`): every
/// file a problem names, other than `missing:` and `added:` ones, that is
/// still a regular file with more than one link. Such a file was rewritten
/// in place (a file replaced by a new one has a link of its own), so the
/// other links (uv's cache, the bytecode pool) hold the damaged bytes too.
/// Each is attributed to the distributions whose `RECORD` (PEP 376) lists it.
pub fn shared_damage(venv: &Path, problems: &[String]) -> SharedDamage {
    use std::os::unix::fs::MetadataExt;
    use std::str::FromStr;
    let mut rels: Vec<String> = Vec::new();
    for p in problems {
        let Some((kind, rest)) = p.split_once(": ") else {
            continue;
        };
        if matches!(kind, "missing" | "added") {
            continue;
        }
        let shared = |rel: &str| {
            std::fs::symlink_metadata(venv.join(rel)).is_ok_and(|m| m.is_file() && m.nlink() > 1)
        };
        // The path, or the path before a detail (`changed size: <path> (a -> b bytes)`).
        let rel = [Some(rest), rest.rsplit_once(" (").map(|(a, _)| a)]
            .into_iter()
            .flatten()
            .find(|r| !r.is_empty() && !Path::new(r).is_absolute() && shared(r));
        if let Some(rel) = rel
            && !rels.iter().any(|r| r == rel)
        {
            rels.push(rel.to_string());
        }
    }
    let mut out = SharedDamage {
        files: rels.iter().map(|r| venv.join(r)).collect(),
        ..SharedDamage::default()
    };
    if rels.is_empty() {
        return out;
    }
    let index: HashMap<PathBuf, usize> = rels
        .iter()
        .enumerate()
        .map(|(i, r)| (PathBuf::from(r), i))
        .collect();
    let mut owned = vec![false; rels.len()];
    for rec in records(venv).unwrap_or_default() {
        let stem = rec.dist_info.trim_end_matches(".dist-info");
        let name = stem.split_once('-').map_or(stem, |(n, _)| n);
        let Ok(name) = pep508_rs::PackageName::from_str(name) else {
            continue;
        };
        for line in rec.text.lines() {
            let Some((path, _, _)) = record_row(line) else {
                continue;
            };
            let file = rec.site.join(path);
            let Ok(rel) = file.strip_prefix(venv) else {
                continue;
            };
            if let Some(&i) = index.get(rel) {
                owned[i] = true;
                if !out.dists.contains(&name.to_string()) {
                    out.dists.push(name.to_string());
                }
            }
        }
    }
    out.dists.sort();
    out.unowned = rels
        .iter()
        .zip(&owned)
        .filter(|(r, o)| {
            let pyc = Path::new(r.as_str())
                .parent()
                .is_some_and(|d| d.ends_with("__pycache__"))
                && r.ends_with(".pyc");
            !**o && !pyc
        })
        .map(|(r, _)| r.clone())
        .collect();
    out
}

/// Before the damaged venv entry at `venv` is moved aside and rebuilt (the
/// caller holds its lock): takes out of the store's caches what shares the
/// damaged files' inodes ([`shared_damage`] of `problems`), so the rebuild
/// neither links the damaged bytes again nor records them as right
/// ([`record_hashes`] trusts a hard link of the recorded size):
/// - uv's cache: every entry of the distributions owning a damaged file
///   (`uv cache clean <name>...`), or the whole cache when a damaged shared
///   file belongs to no distribution's `RECORD`;
/// - the bytecode pool: the damaged `.pyc` files and the bytecode of
///   damaged sources (`host::bytecode::evict`).
///
/// Says on stderr what was evicted (one line), nothing when no damaged file
/// is shared. Other venvs that link the same files hold the damaged bytes
/// too; the inode's new time shows in their stamps, so their own next build
/// (or `verify`) finds them. Logged to `<root>/logs/evict-<name>.log`.
///
/// Errors: uv fails or the pool cannot be changed; the entry is then left
/// in place (the next run finds it damaged again).
pub fn evict_shared_damage(cx: &Ctx<'_>, entry: &Entry, problems: &[String]) -> Result<()> {
    use crate::host::uv::CacheClean;
    let damage = shared_damage(&entry.path, problems);
    if damage.files.is_empty() {
        return Ok(());
    }
    let log = cx.store.stage_log(&format!("evict-{}", entry.name))?;
    let clean = if damage.unowned.is_empty() {
        CacheClean::Packages(damage.dists.clone())
    } else {
        CacheClean::Everything
    };
    cx.uv.cache_clean(&clean, &log).with_context(|| {
        format!(
            "evicting the damaged files of {} from uv's cache",
            entry.label()
        )
    })?;
    let pyc = bytecode::evict(&cx.store.bytecode_dir(), &damage.files).with_context(|| {
        format!(
            "evicting the damaged files of {} from the bytecode pool",
            entry.label()
        )
    })?;
    let aside = bytecode::evict_entries(cx.store, &damage.files).with_context(|| {
        format!(
            "moving aside the bytecode entries holding damaged files of {}",
            entry.label()
        )
    })?;
    let pyc = if aside > 0 {
        format!("{pyc} file(s) from the bytecode pool and {aside} bytecode entry(ies)")
    } else {
        format!("{pyc} file(s) from the bytecode pool")
    };
    let uv = match &clean {
        CacheClean::Packages(d) if d.is_empty() => "nothing from uv's cache".to_string(),
        CacheClean::Packages(d) => format!("{} from uv's cache", d.join(", ")),
        CacheClean::Everything => format!(
            "all of uv's cache ({} belongs to no RECORD)",
            damage.unowned.join(", ")
        ),
    };
    progress::stage(
        "venv",
        format!(
            "{}: {} damaged file(s) share their inode with the store's caches; evicted {uv} and {pyc}, so the rebuild unpacks and compiles them again",
            entry.label(),
            damage.files.len()
        ),
    );
    Ok(())
}

/// An empty relocatable venv at `<staging>/venv`, made by `uv venv` before
/// anything is installed into it ([`install`]).
#[derive(Debug)]
pub struct Shell {
    /// The staging directory (`<root>/tmp/venv-<key>.<pid>.*`), removed when
    /// the shell is dropped unused.
    pub staging: crate::store::Staging,
}

impl Shell {
    /// The venv inside [`Shell::staging`].
    pub fn venv(&self) -> std::path::PathBuf {
        self.staging.path().join("venv")
    }
}

/// Makes the [`Shell`] of the venv keyed `key`: a staging directory of the
/// store and `uv venv --relocatable` with the toolchain's Python in it. A
/// build makes it while the runtime lock is checked against the wheel
/// (`uv venv` queries the interpreter: tens of milliseconds).
///
/// Errors: the staging directory cannot be made; uv fails (its log is
/// `<root>/logs/venv-<key>.log`).
pub fn shell(cx: &Ctx<'_>, key: &str) -> Result<Shell> {
    let staging = cx.store.stage(&format!("venv-{key}"))?;
    let log = cx.store.stage_log(&format!("venv-{key}"))?;
    cx.uv
        .venv(&cx.tc.python.path, &staging.path().join("venv"), true, &log)?;
    let _ = fs::remove_file(&log);
    Ok(Shell { staging })
}

/// Installs the wheel of `wheel_entry` (checked against `wheel`'s sha256)
/// into the empty venv of `shell` ([`shell`]): exactly the locked runtime
/// set plus the wheel when `plan` has one, else the checkout's runtime
/// requirements with the recipe's pins as overrides.
///
/// Errors: the wheel's sha256 differs from its record; uv fails.
pub fn install(
    cx: &Ctx<'_>,
    wheel_entry: &Entry,
    wheel: &BuildRecord,
    src: &Entry,
    plan: &VenvPlan,
    shell: &Shell,
    temp: Option<&crate::store::TempRoots>,
) -> Result<Installed> {
    let staging = shell.staging.path();
    let Ctx { store, lr, tc, uv } = *cx;
    let r = &lr.recipe;
    let (key, entry, runtime) = (plan.key.as_str(), &plan.entry, plan.runtime.as_deref());
    progress::stage(
        "install",
        format!("installing {} into {}", wheel.wheel, entry.label()),
    );
    let t0 = Instant::now();
    let created = jiff::Timestamp::now().to_string();
    let venv = staging.join("venv");
    let scratch = staging.join("scratch");
    fs::create_dir_all(&scratch)?;
    let log = store.stage_log(&format!("install-{key}"))?;
    let wheel_path = wheel.wheel_path(&wheel_entry.path);
    let sha = sha256_file(&wheel_path)?;
    if sha != wheel.sha256 {
        bail!(
            "wheel {} has sha256 {sha}, but build.json records {}",
            wheel_path.display(),
            wheel.sha256
        );
    }
    let overrides = scratch.join("overrides.txt");
    fs::write(&overrides, pin_lines(&r.pins))?;
    // uv only links (hard links from the store's uv cache); the bytecode
    // comes from the store's pool afterwards (`host::bytecode`).
    let mut args: Vec<String> = vec!["--override".into(), overrides.display().to_string()];
    if let Some(locked) = &plan.hermetic.runtime_lock {
        // Exactly the locked runtime set plus the wheel, by path and sha256.
        let wheel_line = format!(
            "{} @ file://{} --hash=sha256:{}",
            r.source.package,
            wheel_path.display(),
            wheel.sha256
        );
        // The lock already applied the pins.
        locked
            .install(uv, &venv, &scratch, &[wheel_line], &[], &log)
            .context("installing the oracle venv from the locked runtime set")?;
    } else {
        if let Some(rel) = runtime {
            args.extend(["-r".into(), src.path.join(rel).display().to_string()]);
        }
        args.extend(r.pins.iter().map(|(n, v)| format!("{n}=={v}")));
        args.push(wheel_path.display().to_string());
        uv.pip_install(&venv, &args, &log)
            .context("installing the oracle venv")?;
    }
    let link_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    // Every installed wheel's bytecode from its entry (made now when the
    // store lacks it), then the pool for any other source.
    let mut wheels: Vec<bytecode::Wheel> = vec![bytecode::Wheel {
        file: wheel_path.clone(),
        sha256: wheel.sha256.clone(),
    }];
    if let Some(locked) = &plan.hermetic.runtime_lock {
        for e in &locked.entries {
            wheels.push(bytecode::Wheel {
                file: wheelhouse::file_of(e)?,
                sha256: e.name.clone(),
            });
        }
    }
    let own_temp;
    let temp = match temp {
        Some(t) => t,
        None => {
            own_temp = store.temp_roots()?;
            &own_temp
        }
    };
    let per = bytecode::from_wheels(store, temp, &venv, &wheels, &scratch, &log)
        .context("giving the oracle venv the bytecode of its wheels")?;
    let code = bytecode::ensure(
        &tc.python,
        &venv,
        &store.bytecode_dir(),
        &per.covered,
        &scratch,
        &log,
    )
    .context("giving the oracle venv its bytecode")?;
    let bytecode_s = t1.elapsed().as_secs_f64();
    let stats = BytecodeStats {
        linked: per.linked + code.linked,
        compiled: per.compiled + code.compiled,
        failed: per.failed + code.failed,
    };
    progress::stage(
        "install",
        describe_bytecode(&stats, per.entries_made, wheels.len()),
    );
    let mut known = record_hashes(&venv)?;
    known.extend(per.hashes);
    known.extend(code.hashes);
    Ok(Installed {
        venv,
        scratch,
        log,
        created,
        install_s: t0.elapsed().as_secs_f64(),
        link_s,
        bytecode_s,
        bytecode: InstalledBytecode {
            stats,
            entries: per.entries.iter().map(Entry::label).collect(),
        },
        known,
    })
}

/// Holds the runtime lock `locked` (read from `lock_file`) against the built
/// wheel at `wheel` before anything is installed: every `Requires-Dist` of
/// the wheel that applies to the recipe's Python (`python`) must be met by
/// a locked version, the recipe's `pins` acting as overrides, and so must
/// those of the package's extras `extras` (`install.extras`); extras are
/// followed through the locked packages' wheels in the wheelhouse of `store`
/// (core metadata `Requires-Dist`, PEP 508 markers, PEP 440 versions: see
/// [`requires::check`]).
///
/// A pin of `pins` that contradicts an exact pin of the wheel's own
/// `Requires-Dist` is said as a warning (docs/advance.md), not refused.
///
/// Errors (exit 2): a requirement is missing from the lock or contradicted by
/// it; the message names each one, the lock file and `oracle-build lock <recipe>`.
/// The wheel's metadata cannot be read (exit 1).
#[allow(clippy::too_many_arguments)] // the inputs of one check, each named
pub fn check_requires(
    store: &Store,
    python: &Path,
    wheel: &Path,
    locked: &[LockedPackage],
    pins: &BTreeMap<String, String>,
    extras: &[String],
    lock_file: &Path,
    recipe: &str,
) -> Result<()> {
    let name = wheel
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let reqs = requires::requires_dist(&requires::wheel_metadata(wheel)?, &name)?;
    let env = requires::marker_env(python)?;
    let versions: Vec<LockedVersion> = locked
        .iter()
        .map(|p| LockedVersion {
            name: p.name.clone(),
            version: p.version.clone(),
        })
        .collect();
    let metadata_of = |v: &LockedVersion| -> Option<String> {
        let p = locked.iter().find(|p| p.name == v.name)?;
        let a = p.wheels.first()?;
        let f = wheelhouse::file_of(&wheelhouse::entry(store, &a.sha256)).ok()?;
        requires::wheel_metadata(&f).ok()
    };
    let extras: Vec<pep508_rs::ExtraName> = extras
        .iter()
        .filter_map(|x| std::str::FromStr::from_str(x).ok())
        .collect();
    // A pin against an exact pin of the built wheel's own metadata: said,
    // never refused (a team may override on purpose).
    let applying = requires::active(&reqs, &env, &extras);
    for (n, v) in pins {
        let want = tree_requires::normalize(n);
        let exact: Vec<(String, String)> = applying
            .iter()
            .filter(|r| r.name.to_string() == want)
            .filter_map(|r| tree_requires::exact_version(r).map(|e| (format!("`{r}`"), e)))
            .collect();
        if !exact.is_empty() && !exact.iter().any(|(_, e)| tree_requires::same_version(e, v)) {
            let said: Vec<&str> = exact.iter().map(|(r, _)| r.as_str()).collect();
            crate::progress::stage(
                "venv",
                format!(
                    "warning: pin `{n}: {v}` contradicts the built wheel's Requires-Dist {} ({name}): the pin overrides it",
                    said.join(", ")
                ),
            );
        }
    }
    let unmet = requires::check(&reqs, &env, &extras, &versions, pins, &metadata_of);
    if unmet.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = unmet
        .iter()
        .map(|u| format!("  - {} (lock: {})", u.requirement, u.found))
        .collect();
    Err(crate::exit::bad_input(format!(
        "the runtime lock {} does not meet what the built wheel {name} declares (Requires-Dist); nothing was installed:\n{}\nre-lock with `oracle-build lock {recipe}`",
        lock_file.display(),
        lines.join("\n")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use sha2::{Digest, Sha256};

    #[test]
    fn the_bytecode_line_says_the_compiled_pyc_are_among_the_linked() {
        let stats = |linked, compiled| BytecodeStats {
            linked,
            compiled,
            failed: 0,
        };
        // The issue's contradiction: every .pyc compiled now, then linked.
        let all_new = describe_bytecode(&stats(17428, 17428), 64, 64);
        assert_eq!(
            all_new,
            "bytecode: 17428 .pyc linked from the store's pool: all 17428 compiled now into it; 0 source(s) not compilable; 64 of 64 wheels' bytecode entries made now"
        );
        assert!(!all_new.contains("17428 linked from the store's pool, 17428 compiled now"));
        assert!(describe_bytecode(&stats(43, 0), 0, 3).contains(
            "43 .pyc linked from the store's pool: all 43 there from earlier builds or pulls"
        ));
        assert!(
            describe_bytecode(&stats(43, 40), 1, 3)
                .contains(": 40 compiled now into it, 3 there from earlier builds or pulls")
        );
    }

    fn b64(data: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(data))
    }

    #[test]
    fn shared_damage_names_the_shared_files_and_their_distributions() {
        let tmp = tempfile::tempdir().unwrap();
        let venv = tmp.path().join("venv");
        let site = venv.join("lib/python3.11/site-packages");
        for d in [
            "pkg/__pycache__",
            "pkg-1.0.dist-info",
            "Other_Pkg-2.0.dist-info",
            "other",
        ] {
            std::fs::create_dir_all(site.join(d)).unwrap();
        }
        let shared = |rel: &str| {
            let outside = tmp.path().join(rel.replace('/', "_"));
            std::fs::write(&outside, rel).unwrap();
            std::fs::hard_link(&outside, site.join(rel)).unwrap();
        };
        shared("pkg/a.py");
        shared("pkg/__pycache__/a.cpython-311.pyc");
        shared("other/b.py");
        shared("stray.py");
        std::fs::write(site.join("pkg/own.py"), "x").unwrap();
        std::fs::write(
            site.join("pkg-1.0.dist-info/RECORD"),
            "pkg/a.py,sha256=x,1\npkg/own.py,,\n",
        )
        .unwrap();
        std::fs::write(
            site.join("Other_Pkg-2.0.dist-info/RECORD"),
            "other/b.py,sha256=x,1\n",
        )
        .unwrap();
        let sp = "lib/python3.11/site-packages";
        let problems: Vec<String> = [
            format!("changed content: {sp}/pkg/a.py"),
            format!("changed size: {sp}/other/b.py (1 -> 2 bytes)"),
            format!("changed content: {sp}/pkg/__pycache__/a.cpython-311.pyc"),
            // A file of its own (replaced, not rewritten in place): not shared.
            format!("changed content: {sp}/pkg/own.py"),
            format!("added: {sp}/stray.py"),
            format!("missing: {sp}/pkg/gone.py"),
        ]
        .into();
        let d = shared_damage(&venv, &problems);
        let rel = |r: &str| venv.join(sp).join(r);
        assert_eq!(
            d.files,
            vec![
                rel("pkg/a.py"),
                rel("other/b.py"),
                rel("pkg/__pycache__/a.cpython-311.pyc")
            ]
        );
        assert_eq!(d.dists, vec!["other-pkg".to_string(), "pkg".to_string()]);
        assert!(d.unowned.is_empty(), "{d:?}");
        // A shared file no RECORD lists (not bytecode): its owner is unknown.
        let d = shared_damage(&venv, &[format!("changed content: {sp}/stray.py")]);
        assert_eq!(d.unowned, vec![format!("{sp}/stray.py")]);
        assert!(d.dists.is_empty());
        assert_eq!(shared_damage(&venv, &[]), SharedDamage::default());
    }

    #[test]
    fn record_hashes_trust_only_hard_links_of_the_recorded_size() {
        let tmp = tempfile::tempdir().unwrap();
        let venv = tmp.path().join("venv");
        let site = venv.join("lib/python3.11/site-packages");
        std::fs::create_dir_all(site.join("pkg")).unwrap();
        std::fs::create_dir_all(site.join("pkg-1.0.dist-info")).unwrap();
        let cache = tmp.path().join("cache.py");
        std::fs::write(&cache, b"x = 1\n").unwrap();
        std::fs::hard_link(&cache, site.join("pkg/linked.py")).unwrap();
        std::fs::write(site.join("pkg/copied.py"), b"y = 2\n").unwrap();
        let other = tmp.path().join("other.py");
        std::fs::write(&other, b"z = 33\n").unwrap();
        std::fs::hard_link(&other, site.join("pkg/resized.py")).unwrap();
        let record = format!(
            "pkg/linked.py,sha256={},6\npkg/copied.py,sha256={},6\npkg/resized.py,sha256={},6\n../../bin/x,sha256={},6\npkg-1.0.dist-info/RECORD,,\n",
            b64(b"x = 1\n"),
            b64(b"y = 2\n"),
            b64(b"z = 33\n"),
            b64(b"x = 1\n"),
        );
        std::fs::write(site.join("pkg-1.0.dist-info/RECORD"), record).unwrap();
        let got = record_hashes(&venv).unwrap();
        assert_eq!(
            got.get("lib/python3.11/site-packages/pkg/linked.py"),
            Some(&hex::encode(Sha256::digest(b"x = 1\n")))
        );
        assert_eq!(got.len(), 1, "{got:?}");
    }
}
