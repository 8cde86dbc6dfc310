//! The bundle archive format of `export` / `import`, and its hostile-archive
//! checks (docs/offline.md).
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
//! store/crates/<sha256>/...         the vendored crates of each Cargo.lock
//! store/wheels/<key>/...           the built wheel, when built from the bundled build lock
//! ```
//!
//! Writing ([`write_archive`]): members in path order, mtime 0, uid/gid 0,
//! through a temporary file and a rename. Reading happens twice. The first
//! pass ([`check_archive`]) writes nothing: it refuses absolute paths, `..`,
//! entries other than files, directories and symlinks, symlinks whose target
//! leaves the archive, paths through a symlink, duplicates, any file whose
//! sha256 or size differs from the manifest (or that the manifest does not
//! list), and wheelhouse or wheel files not named as wheels (PEP 427) or
//! sdists. Only then is the archive extracted ([`extract`]), hashed again,
//! and each wheel's metadata checked against its name ([`check_extracted`]).
//!
//! The format knows store entries only by their place in the archive
//! (`store/<bucket>/<name>/`) and reads a wheelhouse entry's
//! `artifact.json` as plain names ([`ArtifactNames`]), without stage types.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use fs_err as fs;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::store::{ARTIFACT_JSON, Entry, MANIFEST, ManifestFile, sha256_file};

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
    /// Its version (the exporting tool's pinned uv).
    pub version: String,
    /// The sha256 of its wheel: the name of its `store/wheelhouse/` entry.
    pub sha256: String,
}

/// One member to write into a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its path inside the archive.
    pub name: String,
    /// The file (or symlink) on disk it is read from.
    pub path: PathBuf,
    /// Whether it is a symlink (written as one, never followed).
    pub symlink: bool,
}

/// Adds the store entry `e` (once) to the bundle: its label to `entries`,
/// its files to `files` under `store/<bucket>/<name>/`.
///
/// Errors: the entry's directory cannot be read.
pub fn add_entry(e: &Entry, entries: &mut Vec<String>, files: &mut Vec<Member>) -> Result<()> {
    if entries.contains(&e.label()) {
        return Ok(());
    }
    entries.push(e.label());
    walk_files(&e.path, &e.path, &format!("store/{}", e.label()), files)
}

fn walk_files(base: &Path, dir: &Path, prefix: &str, out: &mut Vec<Member>) -> Result<()> {
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
            out.push(Member {
                name: arc,
                path: p,
                symlink: true,
            });
        } else if ft.is_dir() {
            walk_files(base, &p, prefix, out)?;
        } else {
            out.push(Member {
                name: arc,
                path: p,
                symlink: false,
            });
        }
    }
    Ok(())
}

/// Lists `files` in `manifest`: each symlink with its target, each file with
/// its size and sha256.
///
/// Errors: a file cannot be read.
pub fn list_members(manifest: &mut BundleManifest, files: &[Member]) -> Result<()> {
    for Member {
        name: arc,
        path,
        symlink: link,
    } in files
    {
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
    Ok(())
}

/// The temporary file a run `pid` writes the bundle `output` into, beside
/// it: `.<file name>.<pid>.tmp`.
fn temp_beside(output: &Path, pid: u32) -> std::path::PathBuf {
    output.with_file_name(format!(
        ".{}.{pid}.tmp",
        output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ))
}

/// Removes the temporary bundles that killed runs left beside `output`
/// (see [`write_archive`]: `.<file name>.<pid>.tmp` of a process that no
/// longer runs); returns how many were removed. Best effort.
pub fn remove_stale_temps(output: &Path) -> usize {
    let (Some(dir), Some(name)) = (output.parent(), output.file_name()) else {
        return 0;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = format!(".{}.", name.to_string_lossy());
    let Ok(read) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in read.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let pid = file
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && i32::try_from(pid).is_ok_and(|p| !crate::store::process_alive(p))
            && e.file_type().is_ok_and(|t| t.is_file())
            && std::fs::remove_file(e.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// Writes the bundle `output`: `manifest` first, then `files` in the order
/// given, through a temporary file beside it and a rename (a failed write
/// leaves nothing at `output`; one a killed run left is removed by the next
/// export to the same file, [`remove_stale_temps`]).
///
/// Errors: a file cannot be read, the archive cannot be written.
pub fn write_archive(output: &Path, manifest: &BundleManifest, files: &[Member]) -> Result<()> {
    let tmp = temp_beside(output, std::process::id());
    let result = (|| -> Result<()> {
        let out = fs::File::create(&tmp)?;
        let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        tar.follow_symlinks(false);
        let manifest_bytes = serde_json::to_vec_pretty(manifest)?;
        append_file(
            &mut tar,
            BUNDLE_MANIFEST,
            &manifest_bytes[..],
            manifest_bytes.len() as u64,
            0o644,
        )?;
        for Member {
            name: arc,
            path,
            symlink: link,
        } in files
        {
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

/// One archive member as seen by the checking pass.
struct Scanned {
    manifest: Option<Vec<u8>>,
    files: BTreeMap<String, (u64, String)>,
    symlinks: BTreeMap<String, String>,
}

/// Validates a member path: relative, only normal components, UTF-8. A
/// leading `./` (what `tar czf x.tar.gz -C dir .` writes) is dropped, and
/// the archive's root itself (`.`, `./`) is the empty path.
fn member_path(raw: &[u8]) -> Result<String, String> {
    let s = std::str::from_utf8(raw).map_err(|_| "a member path is not UTF-8".to_string())?;
    let mut s = s.trim_end_matches('/');
    if s == "." {
        return Ok(String::new());
    }
    while let Some(rest) = s.strip_prefix("./") {
        s = rest.trim_start_matches('/');
    }
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

/// Opens the gzip'd tar `file` for reading.
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
        if path.is_empty() {
            if entry.header().entry_type() == tar::EntryType::Directory {
                continue;
            }
            return Err("the member \".\" is not a directory".into());
        }
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
                && matches!(parts[1], "wheelhouse" | "ext" | "crates" | "wheels"))
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
    // The uv it names: its entry must hold that uv's wheel.
    if let Some(uv) = &m.uv {
        let prefix = format!("store/wheelhouse/{}/", uv.sha256);
        let is_uv = |p: &String| {
            p.strip_prefix(&prefix).is_some_and(|name| {
                super::wheelname::parse_wheel(name)
                    .is_ok_and(|w| w.name.as_ref() == "uv" && w.version.to_string() == uv.version)
            })
        };
        if !scanned.files.keys().any(is_uv) {
            return Err(format!(
                "the manifest names uv {} in store/wheelhouse/{}, which holds no uv-{}-*.whl",
                uv.version, uv.sha256, uv.version
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
        ["store", "wheelhouse", _, f] if *f == ARTIFACT_JSON || *f == MANIFEST => Ok(()),
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
            ["store", "wheelhouse", _, file] if *file != ARTIFACT_JSON && *file != MANIFEST => {
                let dir = path.parent().unwrap_or(x);
                let a: ArtifactNames = crate::store::read_json(&dir.join(ARTIFACT_JSON))
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
/// The names a wheelhouse entry's `artifact.json` gives its file: the
/// fields of the lock's artifact record (PEP 751 `[[packages.wheels]]`)
/// that the checks need, read as plain text; the others are ignored.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct ArtifactNames {
    /// Normalized name of the package it belongs to.
    pub package: String,
    /// Its version.
    pub version: String,
    /// The file name the entry holds.
    pub filename: String,
    /// The file's sha256 (required, as in the lock's record).
    pub sha256: String,
}

/// The store entries a bundle holds, as (bucket folder, entry name): every
/// `store/<bucket>/<name>/...` member of `m`.
pub fn store_entries(m: &BundleManifest) -> BTreeSet<(String, String)> {
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
    tops
}

/// Extracts the bundle `file` (already checked by [`check_archive`], which
/// returned `m`) into the directory `x`, keeping permissions, and hashes
/// every file again against `m`.
///
/// Errors: a member escapes `x`; a file changed since the first pass; I/O.
pub fn extract(file: &Path, m: &BundleManifest, x: &Path) -> Result<()> {
    let mut ar = open_archive(file)?;
    ar.set_preserve_permissions(true);
    for entry in ar.entries()? {
        let mut entry = entry?;
        // The archive's root (`./`) is `x` itself: nothing to unpack.
        if member_path(&entry.path_bytes()).is_ok_and(|p| p.is_empty()) {
            continue;
        }
        if !entry.unpack_in(x)? {
            bail!("archive member escapes the extraction directory");
        }
    }
    for f in &m.files {
        let got = sha256_file(&x.join(&f.path))?;
        if got != f.sha256 {
            bail!("{} changed while importing (sha256 {got})", f.path);
        }
    }
    Ok(())
}

/// The checks of an extracted bundle at `x`, before anything is stored:
/// each wheelhouse entry (named by its artifact's sha256) holds a file with
/// that sha256, and [`check_artifacts`]. `refuse` turns a reason into the
/// error the caller reports (a refusal: exit 2).
///
/// Errors: as `refuse`; an `artifact.json` or file cannot be read.
pub fn check_extracted(
    x: &Path,
    m: &BundleManifest,
    refuse: &dyn Fn(String) -> anyhow::Error,
) -> Result<()> {
    for (bucket, name) in &store_entries(m) {
        if bucket == "wheelhouse" {
            let dir = x.join("store/wheelhouse").join(name);
            let a: ArtifactNames = crate::store::read_json(&dir.join(ARTIFACT_JSON))?;
            let f = dir.join(a.filename);
            if sha256_file(&f)? != *name {
                return Err(refuse(format!(
                    "wheelhouse entry {name} holds a file with another sha256"
                )));
            }
        }
    }
    check_artifacts(x, m).map_err(refuse)
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
        assert_eq!(member_path(b"./store/src/a").unwrap(), "store/src/a");
        assert_eq!(member_path(b"./").unwrap(), "");
        assert!(member_path(b"./../x").is_err());
        assert!(member_path(b".//etc").is_ok_and(|p| p == "etc"));
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
