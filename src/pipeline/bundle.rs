//! Export and import of bundles: everything needed to rebuild an oracle,
//! moved to a box without network, prepared on a box that need not build it
//! (docs/offline.md). The archive format and its checks are
//! [`crate::store::bundle`]; this module gathers what goes in and puts what
//! comes out in its place.
//!
//! `export` builds nothing: it fetches, locks (for `--platform`), downloads
//! and stages (see [`export`]). `import` ([`import`]) checks the archive
//! without writing ([`bundle::check_archive`]), extracts it into
//! `<root>/tmp/` and checks it again ([`bundle::extract`],
//! [`bundle::check_extracted`]), then moves each store entry into place by
//! rename (entries already present are kept). The git bundle is fetched
//! into the repository's mirror; the uv goes to the tools directory; the
//! lock becomes the store's lock of the recipe (so it builds by its usual
//! PIN); goldens (each checked before anything is written: at most
//! [`MAX_GOLDEN_JSON`], golden JSON) go to `<root>/goldens/<name>/` when
//! the lock is taken; recipe, lockfiles and goldens also to
//! `<root>/imported/<name>/`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use fs_err as fs;
use serde::Serialize;

use crate::cache::trust::{self, Attestation, FileDigest};
use crate::exit::bad_input;
use crate::host::platform::Platform;
use crate::host::process::capture;
use crate::host::toolchain::{self, Toolchain, UV_VERSION};
use crate::host::uv_wheels;
use crate::progress;
use crate::recipe::{LoadedRecipe, MAX_GOLDEN_JSON};
use crate::regular_file;
use crate::stages::oracle::OracleRecord;
use crate::stages::smoke::golden;
use crate::stages::wheelhouse;
use crate::stages::{Ctx, ext, installer, lock, source};
use crate::store::bundle::{self, BundleManifest, BundledUv, Member, SOURCE_BUNDLE, add_entry};
use crate::store::{Bucket, Entry, Store, TempRoots, make_writable};

/// What `export` reports.
#[derive(Debug, Serialize)]
pub struct ExportReport {
    /// The archive written.
    pub file: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Files in it.
    pub files: usize,
    /// Store entries in it.
    pub entries: Vec<String>,
    /// The platform it was prepared for.
    pub platform: String,
    /// The cases whose goldens it carries.
    pub goldens: Vec<String>,
}

/// What `export` writes.
#[derive(Debug, Clone)]
pub struct Export<'a> {
    /// `--lockfiles DIR`.
    pub lockfiles: Option<&'a Path>,
    /// `-o FILE`.
    pub output: &'a Path,
    /// `--platform P` (`None`: this host).
    pub target: Option<Platform>,
    /// The platform it is prepared for: `target`, else this host's.
    pub platform: Platform,
}

/// The lock to bundle for `target` (`None`: this host): the recipe's
/// lockfile for that platform ([`lock::pick`]: `lockfiles/<name>/` or
/// `lockfiles/<name>/<P>/`) when it has one, else the store's lock for it, else
/// one resolved now into the store (for another platform with `uv pip
/// compile --python-platform`, needing no interpreter of it).
///
/// Errors (exit 2): the recipe's lockfile is stale. Errors: uv cannot resolve.
fn lock_for(
    cx: &Ctx<'_>,
    src: &Entry,
    lock_dir: &Path,
    target: Option<&Platform>,
    temp: &TempRoots,
) -> Result<lock::Locked> {
    let Ctx { store, lr, tc, .. } = *cx;
    let r = &lr.recipe;
    if let lock::Pick::Dir(d) = lock::pick(lock_dir, target)?
        && let Some(l) = lock::load_for(lock_dir, lr, target)?
    {
        progress::stage("lock", format!("using {}", d.display()));
        return Ok(l);
    }
    let entry = match target {
        None => lock::auto_entry(store, r),
        Some(p) => lock::platform_entry(store, r, p),
    };
    temp.add(store, &entry)?;
    if let Ok(Some(l)) = lock::load_for(&entry.path, lr, target) {
        return Ok(l);
    }
    if target.is_none() && !tc.python.version.starts_with(&format!("{}.", r.python)) {
        return Err(anyhow!(
            "cannot lock {} for this host: Python {} not found (found {} at {}); install it, or export with --platform to resolve without it",
            r.name,
            r.python,
            tc.python.version,
            tc.python.path.display()
        ));
    }
    let _lock = entry.lock()?;
    if !entry.exists() {
        let staging = store.stage("autolock")?;
        let dir = staging.path().join("lock");
        lock::resolve_for(cx, &src.path, &dir, target, &|b, w| {
            crate::pipeline::inputs::metadata_runtime(cx, &src.path, b, w, target, temp)
        })?;
        store.persist(&dir, &entry)?;
    }
    lock::load_for(&entry.path, lr, target)?
        .ok_or_else(|| anyhow!("{} holds no lock", entry.path.display()))
}

/// The Python that resolves and downloads for a preparation that builds
/// nothing: the recipe's Python `minor` (found as a build finds it, `uv`
/// helping), else any `python3` on PATH (uv needs none to resolve for
/// another platform).
///
/// Errors: neither runs; the error says why the recipe's was not found.
fn resolving_python(
    minor: &str,
    uv: Option<&toolchain::Tool>,
) -> Result<toolchain::Python, String> {
    toolchain::find_python(minor, uv).or_else(|e| {
        which::which("python3")
            .ok()
            .and_then(|p| toolchain::probe_python(&p).ok())
            .ok_or(e)
    })
}

/// The toolchain and uv of a preparation that builds nothing (`export`,
/// the uv wheel `push` sends): `python`, the pinned uv (`found`, else
/// provisioned into the store's tools), git; no compiler; `indexes` for
/// uv, which uses the store's uv cache.
///
/// Errors: the pinned uv can be neither found nor provisioned.
fn preparing(
    store: &Store,
    python: toolchain::Python,
    found: Option<toolchain::Tool>,
    indexes: Vec<String>,
) -> Result<(Toolchain, crate::host::uv::Uv)> {
    let uv_tool = match found {
        Some(u) => u,
        None => crate::stages::installer::find_or_provision_uv(store)?,
    };
    let tc = Toolchain {
        python,
        uv: uv_tool.clone(),
        git: toolchain::find_git(),
        libgit2: toolchain::libgit2_version(),
        gcc: None,
        nvcc: None,
        compilers: Default::default(),
        rust: None,
    };
    let uv = crate::host::uv::Uv {
        tool: uv_tool,
        indexes,
        offline: false,
        cache_dir: Some(store.uv_cache_dir()),
        tmp_dir: Some(store.uv_tmp_dir()),
    };
    Ok((tc, uv))
}

/// The staged crates of every `Cargo.lock` of the checkout at `src`, when
/// its build needs Rust (`stages::rust`), vendored now when missing with
/// the toolchain the tree declares, else this machine's default one (only
/// cargo vendors them; nothing is compiled). Each entry is registered in
/// `temp` first.
///
/// Errors: no cargo; a toolchain file that does not parse; cargo fails.
fn stage_crates(
    store: &Store,
    lr: &LoadedRecipe,
    src: &Path,
    temp: &TempRoots,
) -> Result<Vec<Entry>> {
    use crate::host::rust::{Problem, measure};
    use crate::stages::rust::{crates, discover_in_tree};
    let Some(tree) = discover_in_tree(src, &lr.recipe.build.target_device)? else {
        return Ok(Vec::new());
    };
    if tree.locks.iter().all(|l| crates::entry(store, l).exists()) {
        return Ok(tree.locks.iter().map(|l| crates::entry(store, l)).collect());
    }
    let rust = match measure(&tree.toolchain_files).or_else(|_| measure(&[])) {
        Ok(t) => t,
        Err(Problem::Missing(why) | Problem::Mismatch(why)) => {
            bail!("cannot stage the crates of {}: {why}", lr.recipe.name)
        }
    };
    let mut out = Vec::new();
    for l in &tree.locks {
        temp.add(store, &crates::entry(store, l))?;
        out.push(crates::ensure(store, &rust, src, l, false)?.0);
    }
    Ok(out)
}

/// The pinned uv's wheel for this host, in the wheelhouse (fetched by its
/// compiled-in sha256 as [`export`] does, registered in `temp`): what
/// `push` sends so that a pulling box without uv can `build --offline`
/// (issue 23).
///
/// Errors: the host platform is not one uv has a pinned wheel for; the
/// download or hash check fails.
pub fn host_uv_wheel(store: &Store, temp: &TempRoots) -> Result<Entry> {
    let platform =
        Platform::host().ok_or_else(|| anyhow!("this host's platform has no uv wheel to send"))?;
    Ok(installer::wheel_entry(store, &platform, Some(temp))?.0)
}

/// Writes the bundle of `lr` from `store` to `opts.output` (through a temporary
/// file and a rename), preparing it without building: fetches the source
/// with its history, reads or resolves the lock for the target platform,
/// downloads every artifact of it and the pinned uv's wheel into the
/// wheelhouse, stages every external source the checkout's build
/// configures, and adds the recorded goldens. No compiler, nvcc or GPU is
/// needed. The built wheel goes in too when the store has one built from
/// exactly the bundled build lock.
///
/// Returns what it wrote. Errors (exit 2): a stale lockfile. Errors: the
/// source cannot be fetched; uv cannot resolve; a download or hash check
/// fails; git fails.
pub fn export(store: &Store, lr: &LoadedRecipe, opts: &Export<'_>) -> Result<ExportReport> {
    let r = &lr.recipe;
    let (target, platform, output) = (&opts.target, &opts.platform, opts.output);
    let found_uv = toolchain::find_uv(store).ok();
    // The recipe's Python resolves a lock for this host; any Python does
    // for another platform (uv needs none) and for the downloads.
    let python = resolving_python(&r.python, found_uv.as_ref())
        .map_err(|e| anyhow!("cannot export {}: {e}", r.name))?;
    store.init()?;
    // What killed exports left: their staging, and their bundle beside the output.
    crate::store::report_stale_staging(store, "export")?;
    let beside = crate::store::bundle::remove_stale_temps(output);
    if beside > 0 {
        progress::stage(
            "export",
            format!(
                "removed {beside} unfinished bundle(s) of killed exports beside {}",
                output.display()
            ),
        );
    }
    let (tc, uv) = preparing(
        store,
        python,
        found_uv,
        crate::host::uv::plain_indexes(&crate::stages::lock::indexes::site_indexes(
            store, &r.indexes,
        )?),
    )?;
    let cx = Ctx {
        store,
        lr,
        tc: &tc,
        uv: &uv,
    };
    let temp = store.temp_roots()?;
    temp.add(store, &source::mirror_entry(store, &r.source.repo))?;
    temp.add(store, &source::checkout_entry(store, &r.source.commit))?;
    let mirror = source::ensure_mirror(store, &r.source.repo, &r.source.commit, false)?;
    let (src, _) = source::ensure_checkout(store, &mirror, &r.source.commit)?;
    let lock_dir = lock::lock_dir(lr, opts.lockfiles);
    let locked = lock_for(&cx, &src, &lock_dir, target.as_ref(), &temp)?;

    let mut files: Vec<Member> = Vec::new();
    let mut entries = Vec::new();
    for pkgs in [&locked.build, &locked.runtime] {
        for e in wheelhouse::ensure(store, pkgs, &locked.dir, false, Some(&temp))? {
            add_entry(&e, &mut entries, &mut files)?;
        }
    }
    // The target platform's branches of the CMake files, not this host's.
    let found = ext::discover_in_tree_for(&src.path, &r.build.target_device, &platform.arch)?;
    for line in &found.unmapped {
        progress::stage(
            "ext",
            format!("cannot redirect (the offline build would download): {line}"),
        );
    }
    for line in &found.not_blocking {
        progress::stage("ext", format!("not bundled, blocks nothing: {line}"));
    }
    for s in &found.sources {
        temp.add(store, &ext::entry(store, s))?;
        let (e, _) = ext::ensure(store, s, false)?;
        add_entry(&e, &mut entries, &mut files)?;
    }
    // The crates of the tree's Cargo.lock files (the same for every
    // platform: cargo vendors every target's packages).
    for e in stage_crates(store, lr, &src.path, &temp)? {
        add_entry(&e, &mut entries, &mut files)?;
    }
    let (uv_entry, uv_artifact) = installer::wheel_entry(store, platform, Some(&temp))?;
    add_entry(&uv_entry, &mut entries, &mut files)?;

    // The built wheel of the pin's oracle, when it was built from this very build lock.
    let mut wheel_entry = None;
    if let Some(root_link) = store
        .roots()?
        .into_iter()
        .find(|x| x.name == r.name && x.live)
        && let Ok(target) = root_link.path.canonicalize()
        && let Ok(rec) = OracleRecord::read(&target)
        && rec.identity.commit == r.source.commit
    {
        let e = store.entry(Bucket::Wheels, &rec.wheel_key);
        let built_from: Option<String> =
            crate::store::read_json::<serde_json::Value>(&e.path.join("build.json"))
                .ok()
                .and_then(|b| b["inputs"]["build_lock"].as_str().map(str::to_string));
        if e.exists() && built_from.as_ref() == locked.build_sha256() {
            add_entry(&e, &mut entries, &mut files)?;
            wheel_entry = Some(e);
        }
    }
    // Recorded JSON goldens, beside the recipe or in the store: a regular
    // file within the bound every golden reader keeps (not a FIFO, a
    // device or a sparse file of GiB, which would hang or fill the bundle).
    let mut goldens = Vec::new();
    let gdirs = golden::dirs(store.root(), lr);
    for c in &r.smoke.cases {
        let loc = golden::locate(lr, &gdirs, c);
        if loc.kind != golden::Kind::Json {
            continue;
        }
        let refused = match regular_file::open(&loc.path)
            .and_then(|f| f.metadata().map_err(regular_file::ReadError::Io))
        {
            Err(regular_file::ReadError::Missing) => continue,
            Err(e) => Some(e),
            Ok(m) if m.len() > MAX_GOLDEN_JSON => {
                Some(regular_file::ReadError::TooLarge(MAX_GOLDEN_JSON))
            }
            Ok(_) => None,
        };
        if let Some(e) = refused {
            return Err(bad_input(format!(
                "case {}: the golden {} {e}; nothing was exported",
                c.name,
                loc.path.display()
            )));
        }
        files.push(Member {
            name: format!("goldens/{}/{}.json", r.name, c.name),
            path: loc.path.clone(),
            symlink: false,
        });
        goldens.push(c.name.clone());
    }
    let staging = store.stage("export")?;
    let gitb = staging.path().join(SOURCE_BUNDLE);
    git_bundle(store, &r.source.repo, &r.source.commit, &gitb)?;
    files.push(Member {
        name: SOURCE_BUNDLE.into(),
        path: gitb,
        symlink: false,
    });
    let recipe_file = staging.path().join("recipe.yaml");
    fs::write(&recipe_file, &lr.text)?;
    files.push(Member {
        name: format!("recipe/{}.yaml", r.name),
        path: recipe_file,
        symlink: false,
    });
    for name in std::iter::once(lock::LOCK_JSON).chain(locked.info.files.keys().map(String::as_str))
    {
        files.push(Member {
            name: format!("lockfiles/{}/{name}", r.name),
            path: locked.dir.join(name),
            symlink: false,
        });
    }
    // The tags of the git bundle travel signed, as `push` signs a source's:
    // an importing box with a trust policy takes them only when trusted.
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let tag_atts = sign_tags(
        store,
        &r.source.repo,
        &r.source.commit,
        &staging.path().join(SOURCE_BUNDLE),
        &now,
    )?;
    bundle_attestations(
        staging.path(),
        &r.name,
        TAGS_ATTESTATIONS,
        &tag_atts,
        &mut files,
    )?;
    // And the commits its external sources' tags named (`import` checks
    // each tree against its commit, and the tag's commit by this).
    let ext_atts = sign_ext_tags(store, &entries, &now)?;
    let crates_atts = sign_crates(store, &entries, &now)?;
    bundle_attestations(
        staging.path(),
        &r.name,
        CRATES_ATTESTATIONS,
        &crates_atts,
        &mut files,
    )?;
    bundle_attestations(
        staging.path(),
        &r.name,
        EXT_ATTESTATIONS,
        &ext_atts,
        &mut files,
    )?;
    // The lock travels signed, as `push` signs a store lock: one
    // attestation per signing key of the store's caches, beside the lock.
    let atts = sign_lock(store, lr, &locked, target.as_ref())?;
    bundle_attestations(
        staging.path(),
        &r.name,
        LOCK_ATTESTATIONS,
        &atts,
        &mut files,
    )?;
    // Every entry as `import` will check it (a wheelhouse file against its
    // sha256, the others against their manifests, hashes included): a
    // damaged one would be found only on the offline box, which cannot
    // repair it. It is moved aside (as `pull` does), so the next build here
    // fetches or makes it again.
    let mut damaged = Vec::new();
    for label in &entries {
        if let Some(e) = store.entry_by_label(label) {
            let problems = crate::cache::fetcher::damage_of(&e);
            if !problems.is_empty() {
                let _lock = e.lock()?;
                if e.exists() {
                    store.quarantine(&e, &problems)?;
                }
                damaged.push(format!("{label}: {}", problems.join("; ")));
            }
        }
    }
    if !damaged.is_empty() {
        bail!(
            "refusing to export {}: damaged store entries, which the importing box would refuse (moved aside):\n  - {}\nbuild the pin here again (`{}`, online), which fetches or makes them anew, then export",
            r.name,
            damaged.join("\n  - "),
            crate::shell::command_at(
                &format!("build {}", crate::recipe::shell_arg(lr)),
                store.root()
            )
        );
    }
    // The wheel travels signed too, as `push` signs it: an importing box
    // whose caches name trusted_signers takes it only when they trust it.
    if let Some(e) = &wheel_entry {
        let atts = sign_wheel(store, e)?;
        bundle_attestations(
            staging.path(),
            &r.name,
            WHEEL_ATTESTATIONS,
            &atts,
            &mut files,
        )?;
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));

    let mut manifest = BundleManifest {
        format: 1,
        recipe: r.name.clone(),
        commit: r.source.commit.clone(),
        repo: r.source.repo.clone(),
        files: Vec::new(),
        symlinks: Vec::new(),
        platform: Some(platform.spelled.clone()),
        uv: Some(BundledUv {
            version: UV_VERSION.into(),
            sha256: uv_artifact.sha256.clone(),
        }),
    };
    bundle::list_members(&mut manifest, &files)?;
    progress::stage(
        "export",
        format!(
            "writing {} files into {}",
            files.len() + 1,
            output.display()
        ),
    );
    bundle::write_archive(output, &manifest, &files)?;
    let report = ExportReport {
        file: output.to_path_buf(),
        bytes: fs::metadata(output)?.len(),
        files: files.len() + 1,
        entries,
        platform: platform.spelled.clone(),
        goldens,
    };
    drop(temp);
    Ok(report)
}

/// The file beside a bundle's lock (`lockfiles/<name>/`) holding the
/// attestations that sign it: a JSON array of [`Attestation`]s, at most
/// [`MAX_LOCK_ATTESTATIONS_BYTES`].
pub const LOCK_ATTESTATIONS: &str = "attestations.json";

/// The bound on [`LOCK_ATTESTATIONS`] when read.
pub const MAX_LOCK_ATTESTATIONS_BYTES: u64 = 1 << 20;

/// The key a bundled lock is signed under: the store lock's key of `lr`
/// for `target` (this host: [`lock::auto_entry`]).
fn lock_key(store: &Store, lr: &LoadedRecipe, target: Option<&Platform>) -> String {
    match target {
        None => lock::auto_entry(store, &lr.recipe).name,
        Some(p) => lock::platform_entry(store, &lr.recipe, p).name,
    }
}

/// Every file of the lock in `dir` (`lock.json` and the pylock files it
/// lists) with its sha256 and size: what a lock statement names.
fn lock_digests(dir: &Path, info: &lock::LockInfo) -> Result<Vec<FileDigest>> {
    let mut out = Vec::new();
    for name in std::iter::once(lock::LOCK_JSON).chain(info.files.keys().map(String::as_str)) {
        let p = dir.join(name);
        out.push(FileDigest {
            path: name.to_string(),
            sha256: crate::store::sha256_file(&p)?,
            size: fs::metadata(&p)?.len(),
        });
    }
    out.sort();
    Ok(out)
}

/// The lock statement of `locked` (key [`lock_key`], inputs the store
/// lock's key inputs, every lock file), signed by each `signing_key` of
/// the store's caches (`config.toml`), one attestation per key.
///
/// Errors: a cache's configuration or key cannot be read; signing fails.
fn sign_lock(
    store: &Store,
    lr: &LoadedRecipe,
    locked: &lock::Locked,
    target: Option<&Platform>,
) -> Result<Vec<Attestation>> {
    let keys = signing_keys(store)?;
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    // As `push` writes a statement's time: RFC 3339 to the second, UTC.
    let time = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let st = trust::Statement::for_lock(
        &lock_key(store, lr, target),
        &lock::auto_key_inputs(store, &lr.recipe),
        lock_digests(&locked.dir, &locked.info)?,
        &trust::builder_name(),
        &time,
    );
    keys.iter().map(|k| trust::sign(&st, k)).collect()
}

/// Adds `atts` (none: nothing) to the bundle's `files` as
/// `lockfiles/<recipe>/<name>`, written into `staging`.
///
/// Errors: the file cannot be written.
fn bundle_attestations(
    staging: &Path,
    recipe: &str,
    name: &str,
    atts: &[Attestation],
    files: &mut Vec<Member>,
) -> Result<()> {
    if atts.is_empty() {
        return Ok(());
    }
    let path = staging.join(name);
    fs::write(&path, serde_json::to_vec_pretty(atts)?)?;
    files.push(Member {
        name: format!("lockfiles/{recipe}/{name}"),
        path,
        symlink: false,
    });
    Ok(())
}

/// The distinct signing keys of the store's caches (`config.toml`).
///
/// Errors: a cache's configuration or key cannot be read.
fn signing_keys(store: &Store) -> Result<Vec<trust::SigningKey>> {
    let caches = crate::cache::config::load(store.root(), None)?.caches;
    let mut keys: Vec<trust::SigningKey> = Vec::new();
    for c in &caches {
        if let Some(k) = trust::SigningKey::for_cache(c)?
            && !keys.iter().any(|x| x.fingerprint() == k.fingerprint())
        {
            keys.push(k);
        }
    }
    Ok(keys)
}

/// The file beside a bundle's lock holding the attestations that sign the
/// bundle's built wheel (a JSON array of [`Attestation`]s, bounded as
/// [`LOCK_ATTESTATIONS`]).
pub const WHEEL_ATTESTATIONS: &str = "wheel-attestations.json";

/// The wheel statement of the wheel entry `entry` (as `push` signs it: the
/// build's time), signed by each signing key of the store's caches.
///
/// Errors: the entry's `build.json` cannot be read; a key cannot be read;
/// signing fails.
fn sign_wheel(store: &Store, entry: &Entry) -> Result<Vec<Attestation>> {
    let keys = signing_keys(store)?;
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let record = crate::stages::wheel::BuildRecord::read(&entry.path)?;
    let time = trust::statement_time(&record.started)?;
    let st = trust::Statement::for_wheel(&record, &trust::builder_name(), &time);
    keys.iter().map(|k| trust::sign(&st, k)).collect()
}

/// Reads the attestations file `path` of a bundle (a JSON array), then
/// removes it; empty when there is none.
///
/// Errors (exit 2): it is larger than [`MAX_LOCK_ATTESTATIONS_BYTES`] or
/// does not parse.
fn take_attestations(path: &Path) -> Result<Vec<Attestation>> {
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if fs::metadata(path)?.len() > MAX_LOCK_ATTESTATIONS_BYTES {
        return Err(bad_input(format!(
            "the bundle's {name} is larger than {MAX_LOCK_ATTESTATIONS_BYTES} bytes"
        )));
    }
    let v = serde_json::from_slice(&fs::read(path)?)
        .map_err(|e| bad_input(format!("the bundle's {name} does not parse: {e}")))?;
    fs::remove_file(path)?;
    Ok(v)
}

/// The trust policies of the store's caches that name `trusted_signers`.
///
/// Errors: the configuration or a `trusted_signers` file cannot be read.
fn store_policies(store: &Store) -> Result<Vec<trust::Policy>> {
    crate::cache::config::load(store.root(), None)?
        .caches
        .iter()
        .filter(|c| c.trusted_signers.is_some())
        .map(trust::Policy::for_cache)
        .collect()
}

/// How `import` judges the bundle's built wheel at `dir` (an entry of its
/// `store/wheels/`) given `atts`, as a wheel from a cache is judged
/// ([`trust::verify_wheel`]): trusted when one policy of the store's caches
/// trusts it; not checked when no cache names `trusted_signers` (an
/// unconfigured offline box takes the bundle as a whole, as its lock).
///
/// Errors: the store's cache configuration cannot be read.
fn judge_wheel(store: &Store, dir: &Path, atts: &[Attestation]) -> Result<BundleLockTrust> {
    let policies = store_policies(store)?;
    if policies.is_empty() {
        return Ok(BundleLockTrust::NotChecked(NO_POLICY.into()));
    }
    let Ok(record) = crate::stages::wheel::BuildRecord::read(dir) else {
        return Ok(BundleLockTrust::Untrusted(
            "it has no readable build.json".into(),
        ));
    };
    Ok(judge_signed(
        &policies,
        |p| trust::verify_wheel(&record, atts, p),
        |v| v.to_string(),
    ))
}

/// The file beside a bundle's lock holding the attestations that sign the
/// tags its git bundle carries ([`trust::Statement::for_tags`]; a JSON
/// array of [`Attestation`]s, bounded as [`LOCK_ATTESTATIONS`]).
pub const TAGS_ATTESTATIONS: &str = "tags-attestations.json";

/// The tags statement of the git bundle `bundle` (the source of `commit` of
/// `repo`; `time` RFC 3339 to the second), signed by each signing key of
/// the store's caches; none when the bundle carries no tag.
///
/// Errors: the bundle cannot be read; a key cannot be read; signing fails.
pub(crate) fn sign_tags(
    store: &Store,
    repo: &str,
    commit: &str,
    bundle: &Path,
    time: &str,
) -> Result<Vec<Attestation>> {
    let tags = crate::host::git::bundle_tags(bundle)?;
    let keys = signing_keys(store)?;
    if keys.is_empty() || tags.is_empty() {
        return Ok(Vec::new());
    }
    let st = trust::Statement::for_tags(repo, commit, &tags, &trust::builder_name(), time);
    keys.iter().map(|k| trust::sign(&st, k)).collect()
}

/// The file beside a bundle's lock holding the attestations that sign its
/// crates entries ([`trust::Statement::for_crates`]; a JSON array of
/// [`Attestation`]s, bounded as [`LOCK_ATTESTATIONS`]).
pub const CRATES_ATTESTATIONS: &str = "crates-attestations.json";

/// The content files of a crates entry whose manifest is `m` (what a
/// crates statement names: not the manifest itself).
fn crates_content(m: &crate::store::Manifest) -> Vec<trust::FileDigest> {
    trust::entry_content(
        m.files
            .iter()
            .map(|f| trust::FileDigest {
                path: f.path.clone(),
                sha256: f.sha256.clone(),
                size: f.size,
            })
            .collect(),
    )
}

/// The statement of each crates entry among `entries` (store labels),
/// signed by each signing key of the store's caches at `time`.
///
/// Errors: a manifest or key cannot be read; signing fails.
fn sign_crates(store: &Store, entries: &[String], time: &str) -> Result<Vec<Attestation>> {
    let keys = signing_keys(store)?;
    let mut out = Vec::new();
    for e in entries.iter().filter_map(|l| store.entry_by_label(l)) {
        if e.bucket != Bucket::Crates {
            continue;
        }
        let files = crates_content(&crate::store::Manifest::read(&e.path)?);
        let st = trust::Statement::for_crates(&e.name, files, &trust::builder_name(), time);
        for k in &keys {
            out.push(trust::sign(&st, k)?);
        }
    }
    Ok(out)
}

/// The file beside a bundle's lock holding the attestations that sign the
/// tag claims of its external sources ([`trust::Statement::for_ext_tag`];
/// a JSON array of [`Attestation`]s, bounded as [`LOCK_ATTESTATIONS`]).
pub const EXT_ATTESTATIONS: &str = "ext-attestations.json";

/// The statement of each tag claim among the ext entries `entries` (store
/// labels; [`crate::cache::ext_trust::claim_of`]), signed by each signing
/// key of the store's caches at `time`.
///
/// Errors: a key cannot be read; signing fails.
pub(crate) fn sign_ext_tags(
    store: &Store,
    entries: &[String],
    time: &str,
) -> Result<Vec<Attestation>> {
    let keys = signing_keys(store)?;
    let mut out = Vec::new();
    for e in entries.iter().filter_map(|l| store.entry_by_label(l)) {
        if e.bucket != Bucket::Ext {
            continue;
        }
        if let Some((repo, tag, commit)) = crate::cache::ext_trust::claim_of(&e.path) {
            let st =
                trust::Statement::for_ext_tag(&repo, &tag, &commit, &trust::builder_name(), time);
            for k in &keys {
                out.push(trust::sign(&st, k)?);
            }
        }
    }
    Ok(out)
}

/// How `import` judges the tags of the bundle's git bundle `bundle` (the
/// source of `commit` of `repo`) given `atts`, as a source from a cache is
/// judged ([`crate::cache::source_bundle::tag_trust`]): confirmed when one
/// policy of the store's caches trusts them, or when no cache names
/// `trusted_signers` (an unconfigured offline box takes the bundle as a
/// whole, as its lock and wheel).
///
/// Errors: the git bundle cannot be read; the store's cache configuration
/// cannot be read.
fn judge_tags(
    store: &Store,
    repo: &str,
    commit: &str,
    bundle: &Path,
    atts: &[Attestation],
) -> Result<crate::cache::source_bundle::TagTrust> {
    use crate::cache::source_bundle::{TagTrust, tag_trust};
    let policies = store_policies(store)?;
    if policies.is_empty() {
        return Ok(TagTrust::Confirmed(format!("not checked: {NO_POLICY}")));
    }
    let tags = crate::host::git::bundle_tags(bundle)?;
    let mut why = Vec::new();
    for p in &policies {
        match tag_trust(repo, commit, &tags, atts, p) {
            TagTrust::Confirmed(c) => return Ok(TagTrust::Confirmed(c)),
            TagTrust::Unconfirmed(u) => why.push(u),
        }
    }
    Ok(TagTrust::Unconfirmed(why.join("; ")))
}

/// How `import` judges the bundle's ext entry at `dir` (for the store
/// entry `name`): its tree must be the commit's it records, and a
/// declaration by commit that commit
/// ([`crate::stages::ext::proof::check_received`], else untrusted). A
/// tag's commit is the claim of the box that staged it, which `import`
/// does not confirm over the network: trusted when one of `vouched` (the
/// bundle's trusted wheel's key inputs) names it, else untrusted on a
/// store whose caches name `trusted_signers` and not checked on one whose
/// caches name none (an unconfigured offline box takes the bundle as a
/// whole, as its lock and wheel). `scratch`: a new directory.
///
/// Errors: the store's cache configuration cannot be read.
fn judge_ext(
    store: &Store,
    dir: &Path,
    name: &str,
    scratch: &Path,
    vouched: &[crate::cache::ext_trust::Vouched],
) -> Result<BundleLockTrust> {
    use crate::stages::ext::proof::{Received, check_received};
    Ok(match check_received(dir, name, scratch) {
        Err(e) => BundleLockTrust::Untrusted(format!("{e:#}")),
        Ok(Received::Pinned) => {
            BundleLockTrust::Trusted("its tree is the declared commit's".into())
        }
        Ok(Received::Claimed { repo, tag, commit }) => {
            if let Some(v) = crate::cache::ext_trust::vouch(vouched, name, &commit) {
                return Ok(BundleLockTrust::Trusted(format!(
                    "{tag} at commit {commit}, vouched for by {}",
                    v.by
                )));
            }
            let claim =
                format!("its tree is commit {commit}'s, which it says {tag} of {repo} names");
            if store_policies(store)?.is_empty() {
                BundleLockTrust::NotChecked(format!("{claim}; {NO_POLICY}"))
            } else {
                BundleLockTrust::Untrusted(format!(
                    "{claim}; no trusted signature vouches for that (the bundle's wheel is not trusted here, or was built from another commit), and import uses no network to confirm it"
                ))
            }
        }
    })
}

/// Why a bundle's lock or wheel is taken unchecked: no trust policy here.
const NO_POLICY: &str =
    "this store's caches name no trusted_signers, so its signatures cannot be checked";

/// How `import` judged a bundle's lock (its `lock_trust`), or its wheel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleLockTrust {
    /// Trusted: `pinned (lockfile)` or `signed by …`.
    Trusted(String),
    /// Not judged: this store's caches name no `trusted_signers`, so no
    /// signature can be checked (the lock is taken, as before such a policy).
    NotChecked(String),
    /// Refused: why.
    Untrusted(String),
}

impl std::fmt::Display for BundleLockTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BundleLockTrust::Trusted(s) => write!(f, "{s}"),
            BundleLockTrust::NotChecked(s) => write!(f, "not checked: {s}"),
            BundleLockTrust::Untrusted(s) => write!(f, "untrusted: {s}"),
        }
    }
}

/// The trust of the lock in `dir` (a bundle's `lockfiles/<name>/`, its
/// [`LOCK_ATTESTATIONS`] removed from it here) for `lr` on this box, as a
/// lock from a cache is judged: pinned when its pylock files are a reviewed
/// lockfile's under `lockfiles` ([`crate::cache::accept::pinned_by_lockfile`]);
/// else by its attestations under each policy of the store's caches that
/// names `trusted_signers` ([`trust::verify_lock`]: the key is this host's
/// store lock key), trusted when one policy trusts it; not checked when no
/// cache names `trusted_signers`.
///
/// Errors: the attestations file is larger than its bound or does not
/// parse (exit 2); the store's cache configuration cannot be read.
fn judge_lock(
    store: &Store,
    lr: &LoadedRecipe,
    dir: &Path,
    lockfiles: Option<&Path>,
) -> Result<BundleLockTrust> {
    let atts = take_attestations(&dir.join(LOCK_ATTESTATIONS))?;
    let Ok(info) = crate::store::read_json::<lock::LockInfo>(&dir.join(lock::LOCK_JSON)) else {
        return Ok(BundleLockTrust::Untrusted(
            "it has no readable lock.json".into(),
        ));
    };
    let digests = lock_digests(dir, &info)?;
    let sha = |name: &str| {
        digests
            .iter()
            .find(|d| d.path == name)
            .map(|d| d.sha256.clone())
    };
    if crate::cache::accept::pinned_by_lockfile_files(
        (sha(lock::BUILD_LOCK), sha(lock::RUNTIME_LOCK)),
        lockfiles,
    ) {
        return Ok(BundleLockTrust::Trusted("pinned (lockfile)".into()));
    }
    let policies = store_policies(store)?;
    if policies.is_empty() {
        return Ok(BundleLockTrust::NotChecked(NO_POLICY.into()));
    }
    let key = lock::auto_entry(store, &lr.recipe).name;
    Ok(judge_signed(
        &policies,
        |p| trust::verify_lock(&key, &digests, &atts, p),
        |v| crate::cache::accept::LockTrust::Signed { verdict: v }.to_string(),
    ))
}

/// What `policies` (at least one) say of a signed lock or wheel: trusted
/// by the first whose verdict (`verify`) trusts it, said by `trusted`;
/// else untrusted, with each policy's reason.
fn judge_signed(
    policies: &[trust::Policy],
    verify: impl Fn(&trust::Policy) -> trust::Verdict,
    trusted: impl Fn(trust::Verdict) -> String,
) -> BundleLockTrust {
    let mut why = Vec::new();
    for p in policies {
        let v = verify(p);
        if v.is_trusted() {
            return BundleLockTrust::Trusted(trusted(v));
        }
        let v = v.to_string();
        why.push(v.strip_prefix("untrusted: ").unwrap_or(&v).to_string());
    }
    BundleLockTrust::Untrusted(why.join("; "))
}

/// `git bundle create` of `commit` (under `refs/oracle-build/pins/<commit>`,
/// created in the mirror if missing) and every tag reachable from it, so
/// setuptools-scm finds the same version on the other side.
pub(crate) fn git_bundle(store: &Store, repo_url: &str, commit: &str, out: &Path) -> Result<()> {
    let git = which::which("git").context("export needs the git command line (git bundle)")?;
    let mirror = source::mirror_entry(store, repo_url);
    let _lock = mirror.lock()?;
    let pin_ref = format!("refs/oracle-build/pins/{commit}");
    let oid = git2::Oid::from_str(commit)?;
    // A read-only store: the refs go into a scratch repository that borrows
    // the mirror's objects (git alternates), so nothing is written to the store.
    let scratch = if store.read_only() {
        let tmp = tempfile::tempdir().context("creating a scratch git repository")?;
        git2::Repository::init_bare(tmp.path())?;
        fs_err::write(
            tmp.path().join("objects/info/alternates"),
            format!("{}\n", mirror.path.join("objects").display()),
        )?;
        let scratch = git2::Repository::open_bare(tmp.path())?;
        let m = git2::Repository::open_bare(&mirror.path)?;
        for r in m.references_glob("refs/tags/*")? {
            let r = r?;
            if let (Some(name), Some(target)) = (r.name(), r.target()) {
                scratch.reference(name, target, true, "oracle-build export")?;
            }
        }
        scratch.reference(&pin_ref, oid, true, "oracle-build export")?;
        Some(tmp)
    } else {
        let repo = git2::Repository::open_bare(&mirror.path)?;
        repo.reference(&pin_ref, oid, true, "oracle-build export")?;
        None
    };
    let dir = scratch
        .as_ref()
        .map_or(mirror.path.as_path(), |t| t.path())
        .display()
        .to_string();
    let tags = capture(
        "git tag --merged",
        duct::cmd(&git, ["-C", &dir, "tag", "--merged", commit]),
    )?;
    let mut args: Vec<String> = vec![
        "-C".into(),
        dir,
        "bundle".into(),
        "create".into(),
        "--quiet".into(),
        out.display().to_string(),
        pin_ref,
    ];
    args.extend(
        tags.lines()
            .filter(|t| !t.is_empty())
            .map(|t| format!("refs/tags/{t}")),
    );
    capture("git bundle create", duct::cmd(&git, args))?;
    Ok(())
}

/// What `import` reports.
#[derive(Debug, Serialize)]
pub struct ImportReport {
    /// Recipe name.
    pub recipe: String,
    /// Store entries added.
    pub added: Vec<String>,
    /// Store entries that were already present.
    pub present: Vec<String>,
    /// The imported recipe file (build it with `--offline`).
    pub recipe_file: PathBuf,
    /// The lock directory.
    pub lockfiles: PathBuf,
    /// The platform the bundle was prepared for.
    pub platform: Option<String>,
    /// The uv installed into the tools directory, if the bundle carries one.
    pub uv: Option<PathBuf>,
    /// The store entry that now holds the lock for this host's builds by PIN.
    pub lock_entry: Option<String>,
    /// How the bundle's lock was judged: `pinned (lockfile)`, `signed by …`,
    /// `untrusted: …` (not taken), `not checked: …` (see [`BundleLockTrust`]).
    pub lock_trust: Option<String>,
    /// How the bundle's built wheel was judged, when it carries one and
    /// this box's history gives its version: `signed by …`, `untrusted: …`
    /// (not taken), `not checked: …`.
    pub wheel_trust: Option<String>,
    /// Goldens copied into `<root>/goldens/<recipe>/`.
    pub goldens: Vec<PathBuf>,
    /// Anything the import could not do (the rest was done).
    pub notes: Vec<String>,
}

/// Verifies the bundle `file` and adds it to `store`, whose root is `root`
/// as the user named it (see the module docs).
///
/// Returns what it did. Errors (exit 2): the archive is hostile or tampered
/// with (nothing is written). Errors: git cannot read the source bundle.
pub fn import(
    store: &Store,
    root: &Path,
    file: &Path,
    lockfiles: Option<&Path>,
) -> Result<ImportReport> {
    let refuse = |why: String| {
        bad_input(format!(
            "refusing {}: {why}; nothing was written",
            file.display()
        ))
    };
    let f = fs::File::open(file).map_err(|e| refuse(e.to_string()))?;
    let m = bundle::check_archive(f).map_err(refuse)?;
    // The platform the manifest names, before anything is written (the uv
    // it names is checked with its files, by `check_archive`).
    if let Some(p) = &m.platform
        && crate::host::platform::Platform::parse(p).is_err()
    {
        return Err(refuse(format!(
            "its manifest's platform {p:?} is not one oracle-build builds for"
        )));
    }
    // Its goldens within the bound every golden reader keeps, by the sizes
    // the archive was just checked against, before anything is written.
    if let Some((p, _)) = m.symlinks.iter().find(|(p, _)| p.starts_with("goldens/")) {
        return Err(refuse(format!(
            "its golden {p} is a symbolic link, not a golden file"
        )));
    }
    if let Some(f) = m
        .files
        .iter()
        .find(|f| f.path.starts_with("goldens/") && f.size > MAX_GOLDEN_JSON)
    {
        return Err(refuse(format!(
            "its golden {} is {} bytes, larger than {MAX_GOLDEN_JSON} bytes, the limit",
            f.path, f.size
        )));
    }

    store.init()?;
    let staging = store.stage("import")?;
    let x = staging.path().join("x");
    fs::create_dir_all(&x)?;
    bundle::extract(file, &m, &x)?;
    // Wheelhouse entries are named by their artifact's sha256: check that too.
    let tops: BTreeSet<(String, String)> = bundle::store_entries(&m);
    bundle::check_extracted(&x, &m, &refuse)?;
    let recipe_text = fs::read_to_string(x.join("recipe").join(format!("{}.yaml", m.recipe)))?;
    let recipe = crate::recipe::parse(
        &recipe_text,
        &format!("{} (recipe/{}.yaml)", file.display(), m.recipe),
    )
    .map_err(|e| refuse(format!("its recipe does not parse: {e:#}")))?;
    if recipe.name != m.recipe || recipe.source.commit != m.commit || recipe.source.repo != m.repo {
        return Err(refuse(
            "its recipe is not the one the manifest names".into(),
        ));
    }
    // Each golden is golden JSON (a golden or a golden set), read bounded.
    for f in m.files.iter().filter(|f| f.path.starts_with("goldens/")) {
        regular_file::read(&x.join(&f.path), MAX_GOLDEN_JSON)
            .map_err(|e| e.to_string())
            .and_then(|bytes| golden::check_json(&bytes))
            .map_err(|e| refuse(format!("its golden {} {e}", f.path)))?;
    }
    // The recipe as it will be once imported: hints name that file.
    let imported_dir = root.join("imported").join(&m.recipe).join("recipes");
    let imported = LoadedRecipe {
        recipe,
        origin: imported_dir
            .join(format!("{}.yaml", m.recipe))
            .display()
            .to_string(),
        dir: Some(imported_dir),
        text: recipe_text,
    };

    // The source: fetch the git bundle into the mirror (the same way a pull
    // takes a source from a cache).
    // Everything brought is a temporary root from the moment it lands, and
    // a list root at the end (until a build of the pin roots its oracle).
    // Taken only now: a refused archive leaves nothing but empty directories.
    let temp = store.temp_roots()?;
    let mirror = source::mirror_entry(store, &m.repo);
    temp.add(store, &mirror)?;
    let had = source::mirror_has(store, &m.repo, &m.commit);
    // Its tags decide versions only when trusted, as a cache's.
    let tags_atts =
        take_attestations(&x.join("lockfiles").join(&m.recipe).join(TAGS_ATTESTATIONS))?;
    let tag_trust = judge_tags(
        store,
        &m.repo,
        &m.commit,
        &x.join(SOURCE_BUNDLE),
        &tags_atts,
    )?;
    let got = crate::cache::source_bundle::fetch_bundle(
        store,
        &m.repo,
        &x.join(SOURCE_BUNDLE),
        staging.path(),
        &tag_trust,
    )?;
    if !source::mirror_has(store, &m.repo, &m.commit) {
        bail!("the source bundle does not hold commit {}", m.commit);
    }
    let mut notes = got.notes(&format!("the bundle {}", file.display()), &tag_trust);
    // The mirror counts as added only when it did not hold the commit yet
    // (and no import beside this one brought it first).
    let (mut added, mut present) = if had || got.added.is_empty() {
        (Vec::new(), vec![mirror.label()])
    } else {
        (vec![mirror.label()], Vec::new())
    };
    // The crates entries are what their names say (each Cargo.lock's
    // sha256, every package of it vendored with its checksum), before any
    // entry is moved in; on a store with a trust policy, taken only signed
    // (a vendored file can be rewritten with its checksum line).
    let crates_atts = take_attestations(
        &x.join("lockfiles")
            .join(&m.recipe)
            .join(CRATES_ATTESTATIONS),
    )?;
    for (bucket, name) in &tops {
        if bucket == Bucket::Crates.dir_name() {
            let problems =
                crate::stages::rust::crates::check(&x.join("store").join(bucket).join(name), name);
            if !problems.is_empty() {
                return Err(bad_input(format!(
                    "refusing {}: store/{bucket}/{name} is not the crates of its Cargo.lock: {}",
                    file.display(),
                    problems.join("; ")
                )));
            }
        }
    }
    let wheel_atts =
        take_attestations(&x.join("lockfiles").join(&m.recipe).join(WHEEL_ATTESTATIONS))?;
    let mut wheel_trust = None;
    // The uv it carries is installed only when this binary pins its wheel
    // for the bundle's platform (issue 41): another one is not taken at all.
    let uv_refused = m.uv.as_ref().and_then(|u| {
        let arch = m
            .platform
            .as_deref()
            .and_then(uv_wheels::arch_of)
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let what = format!("the bundle's uv wheel wheelhouse/{}", u.sha256);
        uv_wheels::check(&u.sha256, &arch, &what)
            .err()
            .map(|e| (u.sha256.clone(), format!("{e:#}; not installed")))
    });
    let ext_atts = take_attestations(&x.join("lockfiles").join(&m.recipe).join(EXT_ATTESTATIONS))?;
    // A trusted wheel's key inputs vouch for the commits its staged
    // sources' tags named (crate::cache::ext_trust).
    let mut vouched = Vec::new();
    for (_, name) in tops.iter().filter(|(b, _)| b == Bucket::Wheels.dir_name()) {
        let dir = x.join("store").join(Bucket::Wheels.dir_name()).join(name);
        if let BundleLockTrust::Trusted(by) = judge_wheel(store, &dir, &wheel_atts)?
            && let Ok(record) =
                crate::store::read_json::<serde_json::Value>(&dir.join("build.json"))
        {
            let by = format!("the bundle's wheel {name}, {by}");
            vouched.extend(crate::cache::ext_trust::vouched_by(store, &record, &by));
        }
    }
    for (bucket, name) in &tops {
        let b = Bucket::from_dir_name(bucket).ok_or_else(|| anyhow!("unknown bucket {bucket}"))?;
        if b == Bucket::Wheelhouse && uv_refused.as_ref().is_some_and(|(sha, _)| sha == name) {
            continue;
        }
        let e = store.entry(b, name);
        temp.add(store, &e)?;
        let _lock = e.lock()?;
        if e.exists() {
            present.push(e.label());
            continue;
        }
        // A wheel is taken only when this box's history gives its version.
        let from = x.join("store").join(bucket).join(name);
        if b == Bucket::Wheels
            && let Err(why) =
                crate::cache::fetcher::check_wheel_history(store, &from, Some(&m.repo))
        {
            notes.push(format!(
                "the bundle's wheel {} is not taken: {why}; the wheel stage builds here",
                e.label()
            ));
            continue;
        }
        if b == Bucket::Crates {
            let policies = store_policies(store)?;
            if !policies.is_empty() {
                let files = crate::store::Manifest::read(&from)
                    .map(|m| crates_content(&m))
                    .unwrap_or_default();
                let t = judge_signed(
                    &policies,
                    |p| {
                        trust::rule::verdict(
                            trust::rule::Subject::Crates {
                                key: name,
                                files: &files,
                            },
                            &crates_atts,
                            p,
                        )
                    },
                    |v| v.to_string(),
                );
                if let BundleLockTrust::Untrusted(why) = t {
                    notes.push(format!(
                        "the bundle's {} is not trusted ({why}): not taken; the build vendors its own (online)",
                        e.label()
                    ));
                    continue;
                }
            }
        }
        // An external tree only when it is its commit's, and the commit is
        // the declaration's (crate::cache::ext_trust).
        if b == Bucket::Ext {
            let scratch = staging.path().join(format!("git-{name}"));
            // Or a signed statement of its tag's commit (`export` signs one).
            let mut vouched = vouched.clone();
            vouched.extend(crate::cache::ext_trust::signed_claim(
                &from,
                name,
                &ext_atts,
                &store_policies(store)?,
            ));
            match judge_ext(store, &from, name, &scratch, &vouched)? {
                BundleLockTrust::Untrusted(why) => {
                    notes.push(format!(
                        "the bundle's {} is not taken: {why}; the ext stage stages it here (online)",
                        e.label()
                    ));
                    continue;
                }
                BundleLockTrust::NotChecked(why) => notes.push(format!(
                    "the bundle's {} was taken without confirming its tag: {why}",
                    e.label()
                )),
                BundleLockTrust::Trusted(_) => {}
            }
        }
        // And only when this store's trust policy admits it (as a cache's).
        if b == Bucket::Wheels {
            let t = judge_wheel(store, &from, &wheel_atts)?;
            match &t {
                BundleLockTrust::Untrusted(why) => notes.push(format!(
                    "the bundle's wheel {} is not trusted ({why}): not taken; the wheel stage builds here",
                    e.label()
                )),
                BundleLockTrust::NotChecked(why) => notes.push(format!(
                    "the bundle's wheel {} was taken without a trust check: {why}",
                    e.label()
                )),
                BundleLockTrust::Trusted(_) => {}
            }
            let refused = matches!(t, BundleLockTrust::Untrusted(_));
            wheel_trust = Some(t.to_string());
            if refused {
                continue;
            }
        }
        store.persist(&x.join("store").join(bucket).join(name), &e)?;
        added.push(e.label());
    }
    // The pinned uv, into the tools directory, when it runs here.
    let mut uv_installed = None;
    if let Some(u) = &m.uv {
        let e = store.entry(Bucket::Wheelhouse, &u.sha256);
        let fits = m
            .platform
            .as_deref()
            .is_none_or(|p| lock::platform_fits(Some(p), None).is_ok());
        if let Some((_, why)) = &uv_refused {
            notes.push(why.clone());
        } else if u.version != UV_VERSION {
            notes.push(format!(
                "the bundle carries uv {}, not the pinned {UV_VERSION}; not installed",
                u.version
            ));
        } else if !fits {
            notes.push(format!(
                "the bundle was prepared for {}, which this host cannot run; uv not installed",
                m.platform.as_deref().unwrap_or("?")
            ));
        } else {
            let tool = toolchain::install_uv_wheel(
                store,
                &wheelhouse::file_of(&e)?,
                &format!("the bundle's uv wheel {}", e.label()),
            )?;
            uv_installed = Some(tool.path);
        }
    }
    // The lock, also as the store's lock for builds of this recipe by its
    // usual PIN (the built-in recipe, its name, or the same file anywhere).
    let lock_src = x.join("lockfiles").join(&m.recipe);
    let mut lock_entry = None;
    // Trusted like a lock from a cache; an untrusted one is not taken (not
    // as the store's lock, not beside the imported recipe).
    let trust = if lock_src.is_dir() {
        Some(judge_lock(store, &imported, &lock_src, lockfiles)?)
    } else {
        None
    };
    if let Some(BundleLockTrust::Untrusted(why)) = &trust {
        notes.push(format!(
            "the bundle's lock is not trusted ({why}): not taken; this box resolves its own"
        ));
        make_writable(&lock_src);
        fs::remove_dir_all(&lock_src)?;
    } else if let Some(BundleLockTrust::NotChecked(why)) = &trust {
        notes.push(format!(
            "the bundle's lock was taken without a trust check: {why}"
        ));
    }
    match lock::load(&lock_src, &imported) {
        Ok(Some(_)) => {
            let e = lock::auto_entry(store, &imported.recipe);
            temp.add(store, &e)?;
            let _lock = e.lock()?;
            if !e.exists() {
                let copy = staging.path().join("autolock");
                crate::store::copy_tree(&lock_src, &copy)?;
                store.persist(&copy, &e)?;
                added.push(e.label());
            } else if lock::load(&e.path, &imported)
                .ok()
                .flatten()
                .is_some_and(|l| {
                    Some(&l.info.files)
                        != lock::load(&lock_src, &imported)
                            .ok()
                            .flatten()
                            .map(|k| k.info.files)
                            .as_ref()
                })
            {
                notes.push(format!(
                    "the store already keeps another lock for {} ({}); builds by PIN use that one",
                    m.recipe,
                    e.label()
                ));
            }
            lock_entry = Some(e.label());
        }
        Ok(None) if matches!(trust, Some(BundleLockTrust::Untrusted(_))) => {}
        Ok(None) => notes.push("the bundle carries no lock".into()),
        Err(e) => notes.push(format!("its lock cannot be used on this host: {e:#}")),
    }
    // Goldens: taken only when the bundle's lock is (trusted, or no trust
    // policy here); the store keeps a copy (an existing one is kept, and
    // the imported copy is then the kept one, so both gate alike).
    let goldens_refused = match &trust {
        Some(BundleLockTrust::Untrusted(why)) => {
            Some(format!("the bundle's lock is untrusted ({why})"))
        }
        None if !store_policies(store)?.is_empty() => Some(
            "the bundle carries no lock, and this store's trust policy takes goldens only with a trusted one"
                .to_string(),
        ),
        _ => None,
    };
    let mut goldens = Vec::new();
    let gsrc = x.join("goldens").join(&m.recipe);
    if gsrc.is_dir() {
        make_writable(&gsrc);
        let mut names: Vec<_> = fs::read_dir(&gsrc)?
            .flatten()
            .map(|e| e.file_name())
            .collect();
        names.sort();
        if let Some(why) = &goldens_refused {
            for n in &names {
                notes.push(format!(
                    "not taking golden goldens/{}/{}: {why}",
                    m.recipe,
                    n.to_string_lossy()
                ));
            }
            fs::remove_dir_all(&gsrc)?;
        } else {
            let gdst = golden::default_dir(root, &m.recipe);
            fs::create_dir_all(&gdst)?;
            let imported_dir = root.join("imported").join(&m.recipe).join("goldens");
            for n in names {
                let dst = gdst.join(&n);
                let from = gsrc.join(&n);
                let bytes = fs::read(&from)?;
                if fs::symlink_metadata(&dst).is_ok() {
                    let copy = imported_dir.join(&m.recipe).join(&n);
                    match regular_file::read(&dst, MAX_GOLDEN_JSON) {
                        Ok(kept) if kept == bytes => {}
                        Ok(kept) => {
                            notes.push(format!(
                                "kept the golden already at {} (the bundle's differs); {} is that one too",
                                dst.display(),
                                copy.display()
                            ));
                            crate::store::write_atomic(&from, &kept)?;
                        }
                        Err(e) => {
                            notes.push(format!(
                                "kept the golden already at {} (it {e}; the bundle's is not taken); no copy at {}",
                                dst.display(),
                                copy.display()
                            ));
                            fs::remove_file(&from)?;
                        }
                    }
                    continue;
                }
                crate::store::write_atomic(&dst, &bytes)?;
                goldens.push(dst);
            }
        }
    }

    // The recipe and its lock, beside each other as `lock` expects.
    let dest = root.join("imported").join(&m.recipe);
    let new = staging.path().join("imported");
    fs::create_dir_all(new.join("recipes"))?;
    fs::create_dir_all(new.join("lockfiles"))?;
    fs::rename(
        x.join("recipe").join(format!("{}.yaml", m.recipe)),
        new.join("recipes").join(format!("{}.yaml", m.recipe)),
    )?;
    if lock_src.is_dir() {
        fs::rename(&lock_src, new.join("lockfiles").join(&m.recipe))?;
    }
    if gsrc.is_dir() {
        fs::create_dir_all(new.join("goldens"))?;
        fs::rename(&gsrc, new.join("goldens").join(&m.recipe))?;
    }
    fs::create_dir_all(root.join("imported"))?;
    if dest.exists() {
        let aside = staging.path().join("old");
        fs::rename(&dest, &aside)?;
        make_writable(&aside);
    }
    fs::rename(&new, &dest)?;
    let kept: Vec<Entry> = added
        .iter()
        .chain(&present)
        .chain(lock_entry.iter())
        .filter_map(|l| store.entry_by_label(l))
        .collect();
    store.set_list_root(
        &crate::store::imported_root_name(&m.recipe),
        &format!("{} {} imported", m.recipe, m.commit),
        &kept,
    )?;
    drop(temp);
    let report = ImportReport {
        recipe: m.recipe.clone(),
        added,
        present,
        recipe_file: dest.join("recipes").join(format!("{}.yaml", m.recipe)),
        lockfiles: dest.join("lockfiles").join(&m.recipe),
        platform: m.platform.clone(),
        uv: uv_installed,
        lock_entry,
        lock_trust: trust.map(|t| t.to_string()),
        wheel_trust,
        goldens,
        notes,
    };
    Ok(report)
}
