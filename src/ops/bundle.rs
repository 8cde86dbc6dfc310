//! `oracle-build export <PIN> -o FILE.tar.gz [--platform P]` and
//! `oracle-build import FILE`: move everything needed to rebuild an oracle
//! to a box without network, prepared on a box that need not build it.
//!
//! A bundle is a gzip'd tar (the `tar` and `flate2` crates) holding
//!
//! ```text
//! oracle-bundle.json               format, recipe, commit, repo, platform, uv; every file with size and sha256
//! source.bundle                    `git bundle` of the commit, its history and the tags in it
//! recipe/<name>.yaml               the recipe's exact text
//! lockfiles/<name>/...             lock.json and the pylock files, for the bundle's platform
//! goldens/<name>/<case>.json       the recorded goldens
//! store/wheelhouse/<sha256>/...    every locked artifact, and the pinned uv's wheel
//! store/ext/<name>-<rev>/...       every staged external source
//! store/wheels/<key>/...           the built wheel, when built from the bundled build lock
//! ```
//!
//! `export` builds nothing: it fetches, locks (for `--platform`), downloads
//! and stages (see [`export`]). `import` reads the archive twice. The first
//! pass writes nothing: it refuses absolute paths, `..`, entries other than
//! files, directories and symlinks, symlinks whose target leaves the
//! archive, paths through a symlink, duplicates, any file whose sha256 or
//! size differs from the manifest (or that the manifest does not list), and
//! wheelhouse or wheel files not named as wheels (PEP 427) or sdists. Only
//! then is the archive extracted into `<root>/tmp/`, hashed again, each
//! wheel's metadata checked against its name, and each store entry moved
//! into place by rename (entries already present are kept). The git bundle
//! is fetched into the repository's mirror; the uv goes to the tools
//! directory; the lock becomes the store's lock of the recipe (so it builds
//! by its usual PIN); goldens go to `<root>/goldens/<name>/`; recipe,
//! lockfiles and goldens also to `<root>/imported/<name>/`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use fs_err as fs;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::exit::bad_input;
use crate::host::platform::Platform;
use crate::host::process::capture;
use crate::host::toolchain::{self, Toolchain, UV_VERSION};
use crate::ops::print_json;
use crate::progress;
use crate::recipe::pin;
use crate::stages::oracle::OracleRecord;
use crate::stages::smoke::golden;
use crate::stages::wheelhouse;
use crate::stages::{Ctx, ext, lock, source};
use crate::store::{
    Bucket, Entry, MANIFEST, ManifestFile, Store, TempRoots, make_writable, sha256_file,
};

/// The manifest's name inside a bundle.
pub const BUNDLE_MANIFEST: &str = "oracle-bundle.json";
/// The git bundle's name inside a bundle.
pub const SOURCE_BUNDLE: &str = "source.bundle";
/// The largest `oracle-bundle.json` `import` reads (it is held in memory;
/// a real one lists a few hundred files in some 100 KiB).
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// `oracle-bundle.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BundleManifest {
    /// Format version (1).
    pub format: u32,
    /// Recipe name.
    pub recipe: String,
    /// The pinned commit.
    pub commit: String,
    /// The recipe's repository URL (the mirror the git bundle goes to).
    pub repo: String,
    /// Every regular file except the manifest, sorted by path.
    pub files: Vec<ManifestFile>,
    /// Every symlink: path, target.
    pub symlinks: Vec<(String, String)>,
    /// The platform the bundle was prepared for (uv's `--python-platform`).
    #[serde(default)]
    pub platform: Option<String>,
    /// The pinned uv it carries: the wheelhouse entry of its wheel.
    #[serde(default)]
    pub uv: Option<BundledUv>,
}

/// The uv a bundle carries for the offline box.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BundledUv {
    /// Its version ([`UV_VERSION`] of the exporting tool).
    pub version: String,
    /// The sha256 of its wheel: the name of its `store/wheelhouse/` entry.
    pub sha256: String,
}

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

/// Adds the store entry `e` (once) to the bundle: its label to `entries`,
/// its files to `files` under `store/<bucket>/<name>/`.
fn add_entry(
    e: &Entry,
    entries: &mut Vec<String>,
    files: &mut Vec<(String, PathBuf, bool)>,
) -> Result<()> {
    if entries.contains(&e.label()) {
        return Ok(());
    }
    entries.push(e.label());
    walk_files(&e.path, &e.path, &format!("store/{}", e.label()), files)
}

fn walk_files(
    base: &Path,
    dir: &Path,
    prefix: &str,
    out: &mut Vec<(String, PathBuf, bool)>,
) -> Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)?.flatten().collect();
    names.sort_by_key(|e| e.file_name());
    for e in names {
        let p = e.path();
        let rel = p
            .strip_prefix(base)
            .unwrap_or(&p)
            .to_string_lossy()
            .into_owned();
        let arc = format!("{prefix}/{rel}");
        let ft = e.file_type()?;
        if ft.is_symlink() {
            out.push((arc, p, true));
        } else if ft.is_dir() {
            walk_files(base, &p, prefix, out)?;
        } else {
            out.push((arc, p, false));
        }
    }
    Ok(())
}

/// Options of `export`.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// `--lockfiles DIR`.
    pub lockfiles: Option<PathBuf>,
    /// `-o FILE`.
    pub output: PathBuf,
    /// `--platform P` (default: this host).
    pub platform: Option<String>,
    /// `--json`.
    pub json: bool,
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
        && let Some(l) = lock::load_for(lock_dir, r, target)?
    {
        progress::stage("lock", format!("using {}", d.display()));
        return Ok(l);
    }
    let entry = match target {
        None => lock::auto_entry(store, r),
        Some(p) => lock::platform_entry(store, r, p),
    };
    temp.add(store, &entry)?;
    if let Ok(Some(l)) = lock::load_for(&entry.path, r, target) {
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
            crate::pipeline::inputs::metadata_runtime(cx, &src.path, b, w, target)
        })?;
        store.persist(&dir, &entry)?;
    }
    lock::load_for(&entry.path, r, target)?
        .ok_or_else(|| anyhow!("{} holds no lock", entry.path.display()))
}

/// The pinned uv's wheel for `platform`, from the package index, in the
/// wheelhouse: resolved with `uv pip compile --python-platform` (so its
/// sha256 comes from the index, as every locked artifact's), the lock kept
/// in the store (`store/lockfiles/<key>/pylock.tools.toml`), one wheel of it
/// downloaded and hash-checked like every artifact.
///
/// Errors: uv cannot resolve it; the download or hash check fails.
fn uv_wheel(
    cx: &Ctx<'_>,
    platform: &Platform,
    temp: &TempRoots,
) -> Result<(Entry, lock::pylock::Artifact)> {
    let Ctx { store, lr, tc, uv } = *cx;
    let key = crate::store::key::content_key(&serde_json::json!({
        "schema": crate::store::key::KEY_SCHEMA, "stage": "tools-lock", "uv": UV_VERSION,
        "platform": platform.spelled, "python": lr.recipe.python,
    }));
    let entry = store.entry(Bucket::Locks, &key);
    temp.add(store, &entry)?;
    let file = "pylock.tools.toml";
    {
        let _lock = entry.lock()?;
        if !entry.exists() {
            let staging = store.stage("tools-lock")?;
            let dir = staging.path().join("lock");
            fs::create_dir_all(&dir)?;
            let input = staging.path().join("tools.in");
            fs::write(&input, format!("uv=={UV_VERSION}\n"))?;
            // The recipe's indexes serve its stack, not the tool.
            let plain = crate::host::uv::Uv {
                indexes: Vec::new(),
                ..uv.clone()
            };
            let args: Vec<String> = vec![
                "--format".into(),
                "pylock.toml".into(),
                "--generate-hashes".into(),
                "--no-header".into(),
                "--no-annotate".into(),
                "--python-version".into(),
                lr.recipe.python.clone(),
                "--python-platform".into(),
                platform.spelled.clone(),
                "-o".into(),
                dir.join(file).display().to_string(),
                input.display().to_string(),
            ];
            progress::stage("export", format!("locking uv {UV_VERSION} for {platform}"));
            plain
                .pip_compile(&args, &staging.path().join("tools.log"))
                .with_context(|| format!("locking uv {UV_VERSION} for {platform}"))?;
            store.persist(&dir, &entry)?;
        }
    }
    let pkgs = lock::pylock::parse_pylock(&entry.path.join(file))?;
    let mut pkg = pkgs
        .into_iter()
        .find(|p| p.name == "uv" && p.version == UV_VERSION)
        .ok_or_else(|| anyhow!("the index has no uv {UV_VERSION} for {platform}"))?;
    let wheel = pkg
        .wheels
        .first()
        .cloned()
        .ok_or_else(|| anyhow!("the index has no uv {UV_VERSION} wheel for {platform}"))?;
    pkg.wheels = vec![wheel.clone()];
    let got = wheelhouse::ensure(
        store,
        std::slice::from_ref(&pkg),
        &entry.path,
        &tc.python.path,
        false,
        Some(temp),
    )?;
    let e = got
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("uv's wheel is not in the wheelhouse"))?;
    Ok((e, wheel))
}

/// Writes the bundle of `pin_arg` to `opts.output` (through a temporary
/// file and a rename), preparing it without building: fetches the source
/// with its history, reads or resolves the lock for the target platform,
/// downloads every artifact of it and the pinned uv's wheel into the
/// wheelhouse, stages every external source the checkout's build
/// configures, and adds the recorded goldens. No compiler, nvcc or GPU is
/// needed. The built wheel goes in too when the store has one built from
/// exactly the bundled build lock.
///
/// Errors (exit 2): a bad `--platform`, a stale lockfile. Errors: the
/// source cannot be fetched; uv cannot resolve; a download or hash check
/// fails; git fails.
pub fn export(pin_arg: &str, store_arg: Option<&Path>, opts: &ExportOptions) -> Result<()> {
    let lr = pin::resolve(pin_arg)?;
    let r = &lr.recipe;
    let target = opts.platform.as_deref().map(Platform::parse).transpose()?;
    let platform = match &target {
        Some(p) => p.clone(),
        None => Platform::host().ok_or_else(|| {
            bad_input(
                "this host is not a glibc x86_64/aarch64 Linux: name the target with --platform",
            )
        })?,
    };
    let output = opts.output.as_path();
    let root = Store::default_root(store_arg)?;
    let store = Store::at(&root)?;
    let found_uv = toolchain::find_uv(&store, None, false).ok();
    // The recipe's Python resolves a lock for this host; any Python does
    // for another platform (uv needs none) and for the downloads.
    let python = match toolchain::find_python(&r.python, found_uv.as_ref()) {
        Ok(p) => p,
        Err(e) => which::which("python3")
            .ok()
            .and_then(|p| toolchain::probe_python(&p).ok())
            .ok_or_else(|| anyhow!("cannot export {}: {e}", r.name))?,
    };
    store.init()?;
    let uv_tool = match found_uv {
        Some(u) => u,
        None => toolchain::find_uv(&store, Some(&python), true)?,
    };
    let tc = Toolchain {
        python,
        uv: uv_tool.clone(),
        git: toolchain::find_git(),
        libgit2: toolchain::libgit2_version(),
        gcc: None,
        nvcc: None,
    };
    let uv = crate::host::uv::Uv {
        tool: uv_tool,
        indexes: crate::host::uv::plain_indexes(&r.indexes),
        offline: false,
        cache_dir: Some(store.root().join("uv-cache")),
    };
    let cx = Ctx {
        store: &store,
        lr: &lr,
        tc: &tc,
        uv: &uv,
    };
    let temp = store.temp_roots()?;
    temp.add(&store, &source::mirror_entry(&store, &r.source.repo))?;
    temp.add(&store, &source::checkout_entry(&store, &r.source.commit))?;
    let mirror = source::ensure_mirror(&store, &r.source.repo, &r.source.commit, false)?;
    let (src, _) = source::ensure_checkout(&store, &mirror, &r.source.commit)?;
    let lock_dir = lock::lock_dir(&lr, opts.lockfiles.as_deref());
    let locked = lock_for(&cx, &src, &lock_dir, target.as_ref(), &temp)?;

    let mut files: Vec<(String, PathBuf, bool)> = Vec::new();
    let mut entries = Vec::new();
    let py = tc.python.path.clone();
    for pkgs in [&locked.build, &locked.runtime] {
        for e in wheelhouse::ensure(&store, pkgs, &locked.dir, &py, false, Some(&temp))? {
            add_entry(&e, &mut entries, &mut files)?;
        }
    }
    let found = ext::discover_in_tree(&src.path, &r.build.target_device)?;
    for line in &found.unmapped {
        progress::stage(
            "ext",
            format!("cannot redirect (the offline build would download): {line}"),
        );
    }
    for s in &found.sources {
        temp.add(&store, &ext::entry(&store, s))?;
        let (e, _) = ext::ensure(&store, s, false)?;
        add_entry(&e, &mut entries, &mut files)?;
    }
    let (uv_entry, uv_artifact) = uv_wheel(&cx, &platform, &temp)?;
    add_entry(&uv_entry, &mut entries, &mut files)?;

    // The built wheel of the pin's oracle, when it was built from this very build lock.
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
        }
    }
    // Recorded JSON goldens, beside the recipe or in the store.
    let mut goldens = Vec::new();
    let gdirs = golden::dirs(store.root(), &lr);
    for c in &r.smoke.cases {
        let loc = golden::locate(&lr, &gdirs, c);
        if loc.kind == golden::Kind::Json && loc.path.is_file() {
            files.push((
                format!("goldens/{}/{}.json", r.name, c.name),
                loc.path.clone(),
                false,
            ));
            goldens.push(c.name.clone());
        }
    }
    let staging = store.stage("export")?;
    let gitb = staging.path().join(SOURCE_BUNDLE);
    git_bundle(&store, &r.source.repo, &r.source.commit, &gitb)?;
    files.push((SOURCE_BUNDLE.into(), gitb, false));
    let recipe_file = staging.path().join("recipe.yaml");
    fs::write(&recipe_file, &lr.text)?;
    files.push((format!("recipe/{}.yaml", r.name), recipe_file, false));
    for name in std::iter::once(lock::LOCK_JSON).chain(locked.info.files.keys().map(String::as_str))
    {
        files.push((
            format!("lockfiles/{}/{name}", r.name),
            locked.dir.join(name),
            false,
        ));
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));

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
    for (arc, path, link) in &files {
        if *link {
            manifest.symlinks.push((
                arc.clone(),
                fs::read_link(path)?.to_string_lossy().into_owned(),
            ));
        } else {
            manifest.files.push(ManifestFile {
                path: arc.clone(),
                size: fs::metadata(path)?.len(),
                sha256: sha256_file(path)?,
            });
        }
    }
    progress::stage(
        "export",
        format!(
            "writing {} files into {}",
            files.len() + 1,
            output.display()
        ),
    );
    let tmp = output.with_file_name(format!(
        ".{}.{}.tmp",
        output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let result = (|| -> Result<()> {
        let out = fs::File::create(&tmp)?;
        let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        tar.follow_symlinks(false);
        let manifest_bytes = serde_json::to_vec_pretty(&manifest)?;
        append_file(
            &mut tar,
            BUNDLE_MANIFEST,
            &manifest_bytes[..],
            manifest_bytes.len() as u64,
            0o644,
        )?;
        for (arc, path, link) in &files {
            if *link {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_mtime(0);
                h.set_size(0);
                tar.append_link(&mut h, arc, fs::read_link(path)?)?;
            } else {
                let meta = fs::metadata(path)?;
                use std::os::unix::fs::PermissionsExt;
                let mode = if meta.permissions().mode() & 0o111 != 0 {
                    0o755
                } else {
                    0o644
                };
                append_file(&mut tar, arc, fs::File::open(path)?, meta.len(), mode)?;
            }
        }
        let gz = tar.into_inner()?;
        let mut f = gz.finish()?;
        f.flush()?;
        f.sync_all()?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, output)?;
    let report = ExportReport {
        file: output.to_path_buf(),
        bytes: fs::metadata(output)?.len(),
        files: files.len() + 1,
        entries,
        platform: platform.spelled.clone(),
        goldens,
    };
    drop(temp);
    if opts.json {
        return print_json(&report);
    }
    println!(
        "exported {} for {} ({} files, {} store entries, {} golden(s), {:.1} MiB) to {}",
        r.name,
        report.platform,
        report.files,
        report.entries.len(),
        report.goldens.len(),
        report.bytes as f64 / (1u64 << 20) as f64,
        report.file.display()
    );
    Ok(())
}

fn append_file<W: Write, R: Read>(
    tar: &mut tar::Builder<W>,
    path: &str,
    data: R,
    size: u64,
    mode: u32,
) -> Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    tar.append_data(&mut h, path, data)
        .with_context(|| format!("adding {path}"))?;
    Ok(())
}

/// `git bundle create` of `commit` (under `refs/oracle-build/pins/<commit>`,
/// created in the mirror if missing) and every tag reachable from it, so
/// setuptools-scm finds the same version on the other side.
fn git_bundle(store: &Store, repo_url: &str, commit: &str, out: &Path) -> Result<()> {
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

/// One archive member as seen by the checking pass.
struct Scanned {
    manifest: Option<Vec<u8>>,
    files: BTreeMap<String, (u64, String)>,
    symlinks: BTreeMap<String, String>,
}

/// Validates a member path: relative, only normal components, UTF-8.
fn member_path(raw: &[u8]) -> Result<String, String> {
    let s = std::str::from_utf8(raw).map_err(|_| "a member path is not UTF-8".to_string())?;
    let s = s.trim_end_matches('/');
    if s.is_empty() {
        return Err("a member has an empty path".into());
    }
    if s.starts_with('/') {
        return Err(format!("member {s:?} has an absolute path"));
    }
    for c in Path::new(s).components() {
        match c {
            Component::Normal(_) => {}
            Component::ParentDir => return Err(format!("member {s:?} contains `..`")),
            _ => return Err(format!("member {s:?} is not a plain relative path")),
        }
    }
    Ok(s.to_string())
}

/// Whether the symlink at `path` with `target` stays inside the archive root.
fn link_stays_inside(path: &str, target: &str) -> bool {
    if target.starts_with('/') || target.is_empty() {
        return false;
    }
    // A link inside a store entry must stay inside that entry.
    let floor: i64 = if path.starts_with("store/") { 3 } else { 0 };
    let mut depth: i64 = path.matches('/').count() as i64;
    for c in Path::new(target).components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < floor {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}

fn open_archive(file: &Path) -> Result<tar::Archive<flate2::read::GzDecoder<fs::File>>> {
    let f = fs::File::open(file)?;
    Ok(tar::Archive::new(flate2::read::GzDecoder::new(f)))
}

/// Checks a bundle without writing anything: reads the gzip-compressed tar
/// from `reader`, refuses hostile members (absolute or `..` paths, links out
/// of the archive, devices, duplicates, members under a symlink), then checks
/// the members against `oracle-bundle.json`. This is the pure first half of
/// [`import`] (and what the `bundle` fuzz targets run).
///
/// Returns the manifest. Errors: why the bundle is refused, as one sentence.
pub fn check_archive<R: Read>(reader: R) -> Result<BundleManifest, String> {
    check(&scan(tar::Archive::new(flate2::read::GzDecoder::new(
        reader,
    )))?)
}

/// The first pass: reads every member, writes nothing.
fn scan<R: Read>(mut ar: tar::Archive<R>) -> Result<Scanned, String> {
    let mut out = Scanned {
        manifest: None,
        files: BTreeMap::new(),
        symlinks: BTreeMap::new(),
    };
    let mut seen = BTreeSet::new();
    let entries = ar
        .entries()
        .map_err(|e| format!("not a tar.gz archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("corrupt archive: {e}"))?;
        let path = member_path(&entry.path_bytes())?;
        if !seen.insert(path.clone()) {
            return Err(format!("member {path:?} appears twice"));
        }
        match entry.header().entry_type() {
            tar::EntryType::Directory => {}
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mut h = Sha256::new();
                let mut buf = Vec::new();
                let is_manifest = path == BUNDLE_MANIFEST;
                let n = if is_manifest {
                    // Read at most one byte past the cap: a huge manifest is
                    // refused instead of filling memory.
                    let n = (&mut entry)
                        .take(MAX_MANIFEST_BYTES + 1)
                        .read_to_end(&mut buf)
                        .map_err(|e| format!("reading {path}: {e}"))?
                        as u64;
                    if n > MAX_MANIFEST_BYTES {
                        return Err(format!("{path} is larger than {MAX_MANIFEST_BYTES} bytes"));
                    }
                    n
                } else {
                    std::io::copy(&mut entry, &mut h).map_err(|e| format!("reading {path}: {e}"))?
                };
                if is_manifest {
                    out.manifest = Some(buf);
                } else {
                    out.files.insert(path, (n, hex::encode(h.finalize())));
                }
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                if !link_stays_inside(&path, &target) {
                    return Err(format!(
                        "symlink {path:?} -> {target:?} points outside the archive"
                    ));
                }
                out.symlinks.insert(path, target);
            }
            other => {
                return Err(format!(
                    "member {path:?} is a {other:?}; only files, directories and symlinks are allowed"
                ));
            }
        }
    }
    for p in seen.iter() {
        for l in out.symlinks.keys() {
            if p.len() > l.len() && p.starts_with(l.as_str()) && p.as_bytes()[l.len()] == b'/' {
                return Err(format!("member {p:?} lies under the symlink {l:?}"));
            }
        }
    }
    Ok(out)
}

/// Checks the scanned members against the manifest: the same files with the
/// same sizes and sha256, the same symlinks, and only known top-level places.
fn check(scanned: &Scanned) -> Result<BundleManifest, String> {
    let bytes = scanned
        .manifest
        .as_ref()
        .ok_or_else(|| format!("no {BUNDLE_MANIFEST}"))?;
    let m: BundleManifest =
        serde_json::from_slice(bytes).map_err(|e| format!("{BUNDLE_MANIFEST}: {e}"))?;
    if m.format != 1 {
        return Err(format!("unknown bundle format {}", m.format));
    }
    if !crate::recipe::is_valid_name(&m.recipe) || !crate::recipe::is_full_commit(&m.commit) {
        return Err("the manifest's recipe name or commit is invalid".into());
    }
    let listed: BTreeMap<String, (u64, String)> = m
        .files
        .iter()
        .map(|f| (f.path.clone(), (f.size, f.sha256.clone())))
        .collect();
    for (path, (size, sha)) in &scanned.files {
        match listed.get(path) {
            None => return Err(format!("{path} is not in the manifest")),
            Some((s, h)) if s != size || h != sha => {
                return Err(format!(
                    "{path} was changed: sha256 {sha} ({size} bytes), the manifest says {h} ({s} bytes)"
                ));
            }
            Some(_) => {}
        }
    }
    for path in listed.keys() {
        if !scanned.files.contains_key(path) {
            return Err(format!("{path} is listed in the manifest but missing"));
        }
    }
    let links: BTreeMap<String, String> = m.symlinks.iter().cloned().collect();
    if links != scanned.symlinks {
        return Err("the symlinks differ from the manifest".into());
    }
    let ok_place = |p: &str| {
        let parts: Vec<&str> = p.split('/').collect();
        p == SOURCE_BUNDLE
            || p == format!("recipe/{}.yaml", m.recipe)
            || (parts.len() == 3 && parts[0] == "lockfiles" && parts[1] == m.recipe)
            || (parts.len() >= 4
                && parts[0] == "store"
                && matches!(parts[1], "wheelhouse" | "ext" | "wheels"))
            || (parts.len() == 3
                && parts[0] == "goldens"
                && parts[1] == m.recipe
                && parts[2].ends_with(".json"))
    };
    for p in scanned.files.keys().chain(scanned.symlinks.keys()) {
        if !ok_place(p) {
            return Err(format!("{p} is not a place a bundle may write to"));
        }
    }
    for p in scanned.files.keys().chain(scanned.symlinks.keys()) {
        check_artifact_place(p)?;
    }
    if let Some(uv) = &m.uv {
        let prefix = format!("store/wheelhouse/{}/", uv.sha256);
        if !scanned.files.keys().any(|p| p.starts_with(&prefix)) {
            return Err(format!(
                "the manifest names uv {}'s wheel {}, which the bundle does not hold",
                uv.version, uv.sha256
            ));
        }
    }
    if !scanned.files.contains_key(SOURCE_BUNDLE) {
        return Err(format!("no {SOURCE_BUNDLE}"));
    }
    Ok(m)
}

/// Refuses a wheelhouse or wheel member whose name is not an artifact's:
/// in `store/wheelhouse/<sha256>/` only `artifact.json`, `manifest.json` and
/// one file named as a wheel (PEP 427) or an sdist; in `store/wheels/<key>/`
/// every `*.whl` named as a wheel.
fn check_artifact_place(p: &str) -> Result<(), String> {
    let parts: Vec<&str> = p.split('/').collect();
    let file = parts.last().copied().unwrap_or("");
    let named = |r: Result<(), String>| {
        r.map_err(|why| format!("{p}: {file:?} is not a valid wheel file name: {why}"))
    };
    match parts.as_slice() {
        ["store", "wheelhouse", _, f] if *f == wheelhouse::ARTIFACT_JSON || *f == MANIFEST => {
            Ok(())
        }
        ["store", "wheelhouse", _, _] => {
            named(crate::store::wheelname::check_artifact_name(file).map(|_| ()))
        }
        ["store", "wheelhouse", ..] => Err(format!("{p} is not an artifact of a wheelhouse entry")),
        ["store", "wheels", _, f] if f.ends_with(".whl") => {
            named(crate::store::wheelname::parse_wheel(file).map(|_| ()))
        }
        _ => Ok(()),
    }
}

/// After extraction, before anything is stored: every wheel's own metadata
/// (`.dist-info/WHEEL`, `METADATA` name and version) agrees with its file
/// name, and every wheelhouse entry's `artifact.json` names the file it
/// holds, its package and version agreeing with the file name.
fn check_artifacts(x: &Path, m: &BundleManifest) -> Result<(), String> {
    for f in &m.files {
        let parts: Vec<&str> = f.path.split('/').collect();
        let path = x.join(&f.path);
        match parts.as_slice() {
            ["store", "wheelhouse", _, file]
                if *file != wheelhouse::ARTIFACT_JSON && *file != MANIFEST =>
            {
                let dir = path.parent().unwrap_or(x);
                let a: lock::pylock::Artifact =
                    crate::store::read_json(&dir.join(wheelhouse::ARTIFACT_JSON))
                        .map_err(|e| format!("{}: {e:#}", f.path))?;
                if a.filename != *file {
                    return Err(format!(
                        "{}: artifact.json names {:?}, the entry holds {file:?}",
                        f.path, a.filename
                    ));
                }
                let (name, version) = crate::store::wheelname::check_artifact_name(file)
                    .map_err(|why| format!("{}: not a valid wheel file name: {why}", f.path))?;
                let same_name = a.package.parse::<pep508_rs::PackageName>().ok() == Some(name);
                let same_version = a.version.parse::<pep440_rs::Version>().ok() == Some(version);
                if !same_name || !same_version {
                    return Err(format!(
                        "{}: the file name disagrees with artifact.json ({} {})",
                        f.path, a.package, a.version
                    ));
                }
                if file.ends_with(".whl") {
                    crate::store::wheelname::check_wheel_metadata(&path)
                        .map_err(|why| format!("{}: {why}", f.path))?;
                }
            }
            ["store", "wheels", _, file] if file.ends_with(".whl") => {
                crate::store::wheelname::check_wheel_metadata(&path)
                    .map_err(|why| format!("{}: {why}", f.path))?;
            }
            _ => {}
        }
    }
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
    /// Goldens copied into `<root>/goldens/<recipe>/`.
    pub goldens: Vec<PathBuf>,
    /// Anything the import could not do (the rest was done).
    pub notes: Vec<String>,
}

/// Verifies the bundle `file` and adds it to the store (see the module docs).
///
/// Errors (exit 2): the archive is hostile or tampered with (nothing is
/// written). Errors: git cannot read the source bundle.
pub fn import(file: &Path, store_arg: Option<&Path>, json: bool) -> Result<()> {
    let root = Store::default_root(store_arg)?;
    let store = Store::at(&root)?;
    let refuse = |why: String| {
        bad_input(format!(
            "refusing {}: {why}; nothing was written",
            file.display()
        ))
    };
    let f = fs::File::open(file).map_err(|e| refuse(e.to_string()))?;
    let m = check_archive(f).map_err(refuse)?;

    store.init()?;
    let staging = store.stage("import")?;
    let x = staging.path().join("x");
    fs::create_dir_all(&x)?;
    let mut ar = open_archive(file)?;
    ar.set_preserve_permissions(true);
    for entry in ar.entries()? {
        let mut entry = entry?;
        if !entry.unpack_in(&x)? {
            bail!("archive member escapes the extraction directory");
        }
    }
    for f in &m.files {
        let got = sha256_file(&x.join(&f.path))?;
        if got != f.sha256 {
            bail!("{} changed while importing (sha256 {got})", f.path);
        }
    }
    // Wheelhouse entries are named by their artifact's sha256: check that too.
    let mut tops: BTreeSet<(String, String)> = BTreeSet::new();
    for p in m
        .files
        .iter()
        .map(|f| &f.path)
        .chain(m.symlinks.iter().map(|l| &l.0))
    {
        let parts: Vec<&str> = p.split('/').collect();
        if parts.len() >= 4 && parts[0] == "store" {
            tops.insert((parts[1].to_string(), parts[2].to_string()));
        }
    }
    for (bucket, name) in &tops {
        if bucket == "wheelhouse" {
            let dir = x.join("store/wheelhouse").join(name);
            let e = crate::store::Entry {
                bucket: Bucket::Wheelhouse,
                name: name.clone(),
                path: dir,
            };
            let f = wheelhouse::file_of(&e)?;
            if sha256_file(&f)? != *name {
                return Err(refuse(format!(
                    "wheelhouse entry {name} holds a file with another sha256"
                )));
            }
        }
    }

    check_artifacts(&x, &m).map_err(refuse)?;
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

    // The source: fetch the git bundle into the mirror.
    let git = which::which("git").context("import needs the git command line (git bundle)")?;
    let mirror = source::mirror_entry(&store, &m.repo);
    {
        let _lock = mirror.lock()?;
        let bundle = x.join(SOURCE_BUNDLE).display().to_string();
        let fetch = |dir: &Path| {
            capture(
                "git fetch <bundle>",
                duct::cmd(
                    &git,
                    [
                        "-C",
                        &dir.display().to_string(),
                        "fetch",
                        "--quiet",
                        &bundle,
                        "+refs/tags/*:refs/tags/*",
                        "+refs/oracle-build/*:refs/oracle-build/*",
                    ],
                ),
            )
        };
        if mirror.exists() {
            fetch(&mirror.path)?;
        } else {
            let dir = staging.path().join("mirror.git");
            git2::Repository::init_bare(&dir)?;
            fetch(&dir)?;
            fs::rename(&dir, &mirror.path)?;
        }
    }
    if !source::mirror_has(&store, &m.repo, &m.commit) {
        bail!("the source bundle does not hold commit {}", m.commit);
    }
    let mut added = vec![mirror.label()];
    let mut present = Vec::new();
    for (bucket, name) in &tops {
        let b = Bucket::from_dir_name(bucket).ok_or_else(|| anyhow!("unknown bucket {bucket}"))?;
        let e = store.entry(b, name);
        let _lock = e.lock()?;
        if e.exists() {
            present.push(e.label());
            continue;
        }
        store.persist(&x.join("store").join(bucket).join(name), &e)?;
        added.push(e.label());
    }
    let mut notes = Vec::new();
    // The pinned uv, into the tools directory, when it runs here.
    let mut uv_installed = None;
    if let Some(u) = &m.uv {
        let e = store.entry(Bucket::Wheelhouse, &u.sha256);
        let fits = m
            .platform
            .as_deref()
            .is_none_or(|p| lock::platform_fits(Some(p), None).is_ok());
        if u.version != UV_VERSION {
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
            let tool = toolchain::install_uv_wheel(&store, &wheelhouse::file_of(&e)?)?;
            uv_installed = Some(tool.path);
        }
    }
    // The lock, also as the store's lock for builds of this recipe by its
    // usual PIN (the built-in recipe, its name, or the same file anywhere).
    let lock_src = x.join("lockfiles").join(&m.recipe);
    let mut lock_entry = None;
    match lock::load(&lock_src, &recipe) {
        Ok(Some(_)) => {
            let e = lock::auto_entry(&store, &recipe);
            let _lock = e.lock()?;
            if !e.exists() {
                let copy = staging.path().join("autolock");
                crate::store::copy_tree(&lock_src, &copy)?;
                store.persist(&copy, &e)?;
                added.push(e.label());
            } else if lock::load(&e.path, &recipe)
                .ok()
                .flatten()
                .is_some_and(|l| {
                    Some(&l.info.files)
                        != lock::load(&lock_src, &recipe)
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
        Ok(None) => notes.push("the bundle carries no lock".into()),
        Err(e) => notes.push(format!("its lock cannot be used on this host: {e:#}")),
    }
    // Goldens: the store keeps a copy (an existing one is kept).
    let mut goldens = Vec::new();
    let gsrc = x.join("goldens").join(&m.recipe);
    if gsrc.is_dir() {
        let gdst = golden::default_dir(&root, &m.recipe);
        fs::create_dir_all(&gdst)?;
        let mut names: Vec<_> = fs::read_dir(&gsrc)?
            .flatten()
            .map(|e| e.file_name())
            .collect();
        names.sort();
        for n in names {
            let dst = gdst.join(&n);
            let bytes = fs::read(gsrc.join(&n))?;
            if dst.exists() {
                if fs::read(&dst)? != bytes {
                    notes.push(format!(
                        "kept the golden already at {} (the bundle's differs)",
                        dst.display()
                    ));
                }
                continue;
            }
            crate::store::write_atomic(&dst, &bytes)?;
            goldens.push(dst);
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
    fs::rename(
        x.join("lockfiles").join(&m.recipe),
        new.join("lockfiles").join(&m.recipe),
    )?;
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
    let report = ImportReport {
        recipe: m.recipe.clone(),
        added,
        present,
        recipe_file: dest.join("recipes").join(format!("{}.yaml", m.recipe)),
        lockfiles: dest.join("lockfiles").join(&m.recipe),
        platform: m.platform.clone(),
        uv: uv_installed,
        lock_entry,
        goldens,
        notes,
    };
    if json {
        return print_json(&report);
    }
    println!(
        "imported {}: {} entries added, {} already present",
        report.recipe,
        report.added.len(),
        report.present.len()
    );
    if let Some(uv) = &report.uv {
        println!("uv       {}", uv.display());
    }
    for g in &report.goldens {
        println!("golden   {}", g.display());
    }
    for n in &report.notes {
        println!("note     {n}");
    }
    println!(
        "build it offline with: oracle-build build {} --offline --store {}",
        report.recipe_file.display(),
        root.display()
    );
    println!(
        "  (or by its usual PIN: the same recipe file anywhere, its name when the recipe is in ./recipes/, $ORACLE_BUILD_RECIPES or built in)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_paths_and_link_targets_are_confined() {
        assert!(member_path(b"store/ext/a/src/x.h").is_ok());
        assert!(member_path(b"../x").is_err());
        assert!(member_path(b"a/../../x").is_err());
        assert!(member_path(b"/etc/passwd").is_err());
        assert!(link_stays_inside("store/ext/a/src/l", "../b"));
        assert!(link_stays_inside("store/ext/a/src/l", "../x"));
        assert!(!link_stays_inside("store/ext/a/src/l", "../../x"));
        assert!(!link_stays_inside("store/ext/a/src/l", "../../../../../x"));
        assert!(!link_stays_inside("a/l", "/etc"));
    }

    #[test]
    fn an_oversized_manifest_is_refused_without_reading_it_whole() {
        // A manifest of spaces compresses to almost nothing but would be
        // held in memory whole; it is refused at the cap.
        let big = vec![b' '; MAX_MANIFEST_BYTES as usize + 1];
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_size(big.len() as u64);
        h.set_mode(0o644);
        tar.append_data(&mut h, BUNDLE_MANIFEST, &big[..]).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar.into_inner().unwrap()).unwrap();
        let err = check_archive(&gz.finish().unwrap()[..]).unwrap_err();
        assert!(err.contains("is larger than"), "{err}");
    }
}
