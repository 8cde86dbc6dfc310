//! `oracle-build export <PIN> -o FILE.tar.gz` and `oracle-build import FILE`:
//! move everything needed to rebuild an oracle to a box without network.
//!
//! A bundle is a gzip'd tar (the `tar` and `flate2` crates) holding
//!
//! ```text
//! oracle-bundle.json               format, recipe, commit, repo; every file with size and sha256
//! source.bundle                    `git bundle` of the commit, its history and the tags in it
//! recipe/<name>.yaml               the recipe's exact text
//! lockfiles/<name>/...             lock.json and the pylock files
//! store/wheelhouse/<sha256>/...    every locked artifact
//! store/ext/<name>-<rev>/...       every staged external source
//! store/wheels/<key>/...           the built wheel, when the pin's oracle has one
//! ```
//!
//! `import` reads the archive twice. The first pass writes nothing: it
//! refuses absolute paths, `..`, entries other than files, directories and
//! symlinks, symlinks whose target leaves the archive, paths through a
//! symlink, duplicates, and any file whose sha256 or size differs from the
//! manifest (or that the manifest does not list). Only then is the archive
//! extracted into `<root>/tmp/`, hashed again, and each store entry moved
//! into place by rename (entries already present are kept). The git bundle
//! is fetched into the repository's mirror; the recipe and lockfiles go to
//! `<root>/imported/<name>/{recipes,lockfiles}/`, so
//! `oracle-build build <root>/imported/<name>/recipes/<name>.yaml --offline`
//! finds its lock there.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use fs_err as fs;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::exit::bad_input;
use crate::host::process::capture;
use crate::ops::print_json;
use crate::pipeline::inputs as hermetic;
use crate::progress;
use crate::recipe::pin;
use crate::stages::lock;
use crate::stages::oracle::OracleRecord;
use crate::stages::source;
use crate::stages::wheelhouse;
use crate::store::{Bucket, Entry, ManifestFile, Store, make_writable, sha256_file};

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

/// Writes the bundle of `pin_arg` to `output` (through a temporary file and a rename).
///
/// Errors (exit 2): no lockfile, or the store lacks the mirror, a locked
/// artifact or a staged source (each named). Errors: git fails.
pub fn export(
    pin_arg: &str,
    store_arg: Option<&Path>,
    lockfiles: Option<&Path>,
    output: &Path,
    json: bool,
) -> Result<()> {
    let lr = pin::resolve(pin_arg)?;
    let r = &lr.recipe;
    let root = Store::default_root(store_arg)?;
    let store = Store::open_existing(&root)
        .ok_or_else(|| bad_input(format!("no store at {}", root.display())))?;
    let lock_dir = lock::lock_dir(&lr, lockfiles);
    // The recipe's lockfile, else the lock a build kept in the store.
    let locked = match lock::load(&lock_dir, r)? {
        Some(l) => l,
        None => lock::load(&lock::auto_entry(&store, r).path, r)?.ok_or_else(|| {
            bad_input(format!(
                "no lockfile in {} and no lock in the store: run `oracle-build lock {}` (or build it) first",
                lock_dir.display(),
                crate::recipe::shell_arg(&lr)
            ))
        })?,
    };
    let mut problems = Vec::new();
    if !source::mirror_has(&store, &r.source.repo, &r.source.commit) {
        problems.push(format!(
            "the mirror lacks commit {} of {}",
            r.source.commit, r.source.repo
        ));
    }
    let mut files: Vec<(String, PathBuf, bool)> = Vec::new();
    let mut entries = Vec::new();
    for p in locked.build.iter().chain(&locked.runtime) {
        let present: Vec<_> = p
            .wanted()
            .iter()
            .map(|a| wheelhouse::entry(&store, &a.sha256))
            .filter(|e| e.exists())
            .collect();
        if present.is_empty() {
            problems.push(format!("the wheelhouse lacks {}=={}", p.name, p.version));
        }
        for e in present {
            add_entry(&e, &mut entries, &mut files)?;
        }
    }
    if let Some(found) = hermetic::discover(&store, &lr) {
        for row in hermetic::ext_rows(&store, &found) {
            if !row.staged {
                problems.push(format!(
                    "{} ({}) is not staged in {}",
                    row.name, row.origin, row.entry
                ));
                continue;
            }
            let e = store
                .entry_by_label(&row.entry)
                .context("bad ext entry label")?;
            add_entry(&e, &mut entries, &mut files)?;
        }
    }
    if !problems.is_empty() {
        return Err(bad_input(format!(
            "cannot export {}: the store is incomplete (build it online first):\n  - {}",
            r.name,
            problems.join("\n  - ")
        )));
    }
    // The built wheel of the pin's oracle, when there is one.
    if let Some(root_link) = store
        .roots()?
        .into_iter()
        .find(|x| x.name == r.name && x.live)
        && let Ok(target) = root_link.path.canonicalize()
        && let Ok(rec) = OracleRecord::read(&target)
        && rec.identity.commit == r.source.commit
    {
        let e = store.entry(Bucket::Wheels, &rec.wheel_key);
        if e.exists() {
            add_entry(&e, &mut entries, &mut files)?;
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
    };
    if json {
        return print_json(&report);
    }
    println!(
        "exported {} ({} files, {} store entries, {:.1} MiB) to {}",
        r.name,
        report.files,
        report.entries.len(),
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
    };
    for p in scanned.files.keys().chain(scanned.symlinks.keys()) {
        if !ok_place(p) {
            return Err(format!("{p} is not a place a bundle may write to"));
        }
    }
    if !scanned.files.contains_key(SOURCE_BUNDLE) {
        return Err(format!("no {SOURCE_BUNDLE}"));
    }
    Ok(m)
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
    println!(
        "build it offline with: oracle-build build {} --offline --store {}",
        report.recipe_file.display(),
        root.display()
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
