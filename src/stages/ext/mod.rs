//! Stage "stage external sources": what CMake's FetchContent would download
//! at configure time (CUTLASS, flash-attention, FlashMLA, DeepGEMM, ...),
//! fetched ahead of the build into `store/ext/<name>-<rev>/` and handed to
//! the build through the variables the checkout itself reads.
//!
//! Everything is read from the checkout (never from a
//! hard-coded table): `CMakeLists.txt` and `cmake/external_projects/*.cmake`
//! are scanned for `FetchContent_Declare(<name> GIT_REPOSITORY .. GIT_TAG ..)`
//! and `(<name> URL .. URL_HASH SHA256=..)`, with `${VAR}` expanded from the
//! files' `set(VAR value)`. The variable a source is passed through is found
//! the same way: vLLM declares each source twice, once from git and once as
//! `FetchContent_Declare(<name> SOURCE_DIR ${X})` where `set(X $ENV{X})`, so
//! `X` (e.g. `VLLM_CUTLASS_SRC_DIR`) is the environment variable to set. When
//! the git declaration has a `SOURCE_SUBDIR` the override does not repeat,
//! the variable points inside (`TRITON_KERNELS_SRC_DIR` ->
//! `.../python/triton_kernels/triton_kernels`). A source without such an
//! override is passed as the CMake cache variable
//! `-DFETCHCONTENT_SOURCE_DIR_<NAME>=<dir>` in `CMAKE_ARGS`, which vLLM's
//! `setup.py` forwards to CMake (CMake docs, FetchContent). Sources that
//! cannot be redirected (`ExternalProject_Add`, a direct
//! `FetchContent_Populate(<name> GIT_REPOSITORY ..)`, an unresolvable
//! `${VAR}`) are reported, never silently ignored.
//!
//! A name declared more than once under `if()` branches is resolved as the
//! target's configure would take it ([`condition`] over the target's
//! processor, system and device): branches false for the target are not
//! read; one live declaration is staged as above ([`Decided::Target`]);
//! several the tree decides at configure time are all staged and handed to
//! CMake by a dependency provider that takes the one CMake evaluated
//! ([`Decided::Configure`], [`build_env`]); several of which one cannot be
//! staged are refused, naming each ([`Discovery::refused`]). `build.json`
//! records the declaration each source was taken from ([`taken`]).
//!
//! An entry holds `src/` (the tree at the revision, submodules included,
//! without `.git`), `ext.json` (origin and resolved commit) and
//! `manifest.json`. Builds copy `src/` into their staging directory, so a
//! build can never write into the store.

mod cmake;
pub mod condition;
pub mod messages;
pub mod proof;
pub mod requirement;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use fs_err as fs;
use git2::{FetchOptions, Repository};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The CMake command reader, for other readers of the tree's CMake
/// (the toolchain requirement reader).
pub(crate) use cmake::{Call, calls};
pub use cmake::{discover_for, discover_with, parse};

use crate::progress;
use crate::store::{Bucket, Entry, Manifest, Store, copy_tree, read_json, sha256_file, write_json};

/// Where an external source comes from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// `GIT_REPOSITORY` + `GIT_TAG` (a tag, branch or commit).
    Git {
        /// Repository URL.
        repo: String,
        /// The `GIT_TAG` as written (after `${VAR}` expansion).
        tag: String,
    },
    /// `URL` + `URL_HASH SHA256=...` (a tarball).
    Url {
        /// Archive URL (`file://`, `http(s)://`).
        url: String,
        /// The sha256 from `URL_HASH`, if it gives one.
        sha256: Option<String>,
    },
}

/// How the build is told where a staged source is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Variable {
    /// An environment variable the checkout reads (`$ENV{X}`), e.g. `VLLM_CUTLASS_SRC_DIR`.
    Env(String),
    /// A CMake cache variable passed as `-D<NAME>=<dir>` in `CMAKE_ARGS`,
    /// e.g. `FETCHCONTENT_SOURCE_DIR_CUTLASS`.
    Cmake(String),
}

impl Variable {
    /// The variable's name.
    pub fn name(&self) -> &str {
        match self {
            Variable::Env(n) | Variable::Cmake(n) => n,
        }
    }
}

/// One FetchContent source found in the checkout.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExtSource {
    /// The FetchContent name, e.g. `cutlass`, `vllm-flash-attn`.
    pub name: String,
    /// The CMake file that declares it, relative to the checkout.
    pub file: String,
    /// Where it comes from.
    pub origin: Origin,
    /// Whether git submodules are fetched too (FetchContent's default; off
    /// when the declaration says `GIT_SUBMODULES ""`).
    pub submodules: bool,
    /// The variable the build reads it from.
    pub variable: Variable,
    /// A path inside the source that the variable must point at.
    pub subdir: Option<String>,
    /// The `if()` conditions it is declared under that cannot be evaluated
    /// here (file and branch each): it is staged anyway (conservative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// The line of `file` its `FetchContent_Declare` starts on (0: not known).
    #[serde(default)]
    pub line: usize,
    /// Whether it is the one declaration the target takes, or one of
    /// several the tree's CMake chooses between at configure time.
    #[serde(default, skip_serializing_if = "Decided::is_target")]
    pub decided: Decided,
}

/// How the declaration a build takes of a name is decided.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Decided {
    /// Before the build, for the target: the only declaration of its name
    /// whose conditions are not false for the target's processor, system
    /// and device ([`condition::Facts::for_target`]). Passed through its
    /// variable.
    #[default]
    Target,
    /// At configure time, by the tree's CMake: one of several declarations
    /// of its name under conditions the tree computes (vLLM's oneDNN under
    /// `ASIMD_FOUND`). Every one is staged, none is passed through a
    /// variable; the dependency provider ([`build_env`]) hands CMake the
    /// staged copy of the declaration it evaluated.
    Configure,
}

impl Decided {
    /// Whether it is [`Decided::Target`] (left out of records).
    pub fn is_target(&self) -> bool {
        *self == Decided::Target
    }
}

impl ExtSource {
    /// `file:line` of its declaration.
    pub fn declared_at(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }

    /// What the build hands it through: its variable's name, or, for one of
    /// several declarations the tree's CMake chooses between
    /// ([`Decided::Configure`]), no variable but the dependency provider
    /// (`the dependency provider (<file:line>)`): CMake asks the provider
    /// only while `FETCHCONTENT_SOURCE_DIR_<NAME>` is empty.
    pub fn passed_through(&self) -> String {
        match self.decided {
            Decided::Configure => format!("the dependency provider ({})", self.declared_at()),
            Decided::Target => self.variable.name().to_string(),
        }
    }

    /// The store entry name, `<name>-<rev>`: the `GIT_TAG` (or the first 16
    /// hex of the URL's sha256) made path-safe, plus 8 hex of the origin so
    /// two repositories with the same name and tag do not collide.
    pub fn entry_name(&self) -> String {
        let rev = match &self.origin {
            Origin::Git { tag, .. } => tag.clone(),
            Origin::Url {
                sha256: Some(h), ..
            } => h.chars().take(16).collect(),
            Origin::Url { .. } => "url".into(),
        };
        let digest = hex::encode(Sha256::digest(
            serde_json::to_string(&self.origin)
                .unwrap_or_default()
                .as_bytes(),
        ));
        format!("{}-{}-{}", safe(&self.name), safe(&rev), &digest[..8])
    }
}

fn safe(s: &str) -> String {
    let t: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    t.trim_start_matches('.').chars().take(60).collect()
}

/// Every source found, and every fetch the build would make that cannot be
/// redirected to a staged copy.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct Discovery {
    /// Sources that are staged and passed to the build.
    pub sources: Vec<ExtSource>,
    /// What cannot be staged or passed, one line each (file: what and why):
    /// each blocks an `--offline` build.
    pub unmapped: Vec<String>,
    /// What is named and blocks nothing, one line each: a declaration
    /// CMake never takes (an earlier one of its name always runs first),
    /// and a download that cannot be redirected but sits under a condition
    /// the tree's configure decides (vLLM's Arm Compute Library:
    /// `FetchContent_Populate(arm_compute ...)` under `if(ASIMD_FOUND)`, a
    /// `find_isa` of `/proc/cpuinfo`, in `cmake/cpu_extension.cmake`). Such
    /// a download is never staged nor keyed: a configure that takes it
    /// downloads it (an offline one fails there, and the build log names
    /// it); a configure that does not (x86) builds offline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_blocking: Vec<String>,
    /// Why nothing was read (a target whose build runs no CMake).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_cmake: Option<String>,
    /// Names declared more than once under conditions the tree decides,
    /// not all of which can be staged: each names every declaration
    /// (`file:line` and revision). A build is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
}

impl Discovery {
    /// Errors: a name is refused ([`Discovery::refused`]), naming each.
    pub fn check(self) -> Result<Discovery> {
        if !self.refused.is_empty() {
            bail!("ext stage: {}", self.refused.join("; "));
        }
        Ok(self)
    }
}

/// Whether a build for `device` runs CMake at all: vLLM's `setup.py` builds
/// no extension for `empty` (`ext_modules = []`), so nothing is staged for it.
pub fn runs_cmake(device: &str) -> bool {
    device != "empty"
}

/// Discovers the sources of the checkout at `src` for `device`: every CMake
/// file reached from `CMakeLists.txt` through `include()` is read.
///
/// Errors: a name declared more than once cannot be resolved
/// ([`Discovery::refused`]); a file that cannot be read is reported in
/// `unmapped`.
pub fn discover_in_tree(src: &Path, device: &str) -> Result<Discovery> {
    let read = |rel: &str| -> Option<String> {
        let p = src.join(rel);
        p.is_file().then(|| fs::read_to_string(&p).ok()).flatten()
    };
    discover_with(&read, device).check()
}

/// [`discover_in_tree`] for a build on another processor (`x86_64`,
/// `aarch64`): the conditions on `CMAKE_SYSTEM_PROCESSOR` are evaluated for
/// it (`export --platform`).
///
/// Errors: as [`discover_in_tree`].
pub fn discover_in_tree_for(src: &Path, device: &str, processor: &str) -> Result<Discovery> {
    let read = |rel: &str| -> Option<String> {
        let p = src.join(rel);
        p.is_file().then(|| fs::read_to_string(&p).ok()).flatten()
    };
    let facts = condition::Facts::for_platform(device, processor, "linux");
    discover_for(&read, device, &facts).check()
}

/// Discovers the sources of `commit` from the bare mirror at `mirror`
/// without checking it out (for `plan` and the `--offline` preflight).
///
/// Errors: the mirror cannot be opened or lacks the commit; a name is
/// refused ([`Discovery::refused`]).
pub fn discover_in_mirror(mirror: &Path, commit: &str, device: &str) -> Result<Discovery> {
    let repo = Repository::open_bare(mirror)
        .with_context(|| format!("opening mirror {}", mirror.display()))?;
    let tree = repo
        .find_commit(git2::Oid::from_str(commit)?)
        .with_context(|| format!("commit {commit} is not in {}", mirror.display()))?
        .tree()?;
    let read = |rel: &str| -> Option<String> {
        let e = tree.get_path(Path::new(rel)).ok()?;
        let b = repo.find_blob(e.id()).ok()?;
        Some(String::from_utf8_lossy(b.content()).into_owned())
    };
    discover_with(&read, device).check()
}

/// The record of a staged source: `store/ext/<name>-<rev>/ext.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExtRecord {
    /// The source as declared.
    pub source: ExtSource,
    /// The commit `GIT_TAG` resolved to (git sources).
    pub commit: Option<String>,
    /// The archive's sha256 (URL sources).
    pub archive_sha256: Option<String>,
    /// Submodules fetched: path -> commit.
    pub submodules: BTreeMap<String, String>,
    /// The URL actually fetched (git sources): the declared repository
    /// through the site's `[[mirror]]` tables. Not keyed (the entry's name
    /// and the wheel key keep the declared URL); absent in entries staged
    /// before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched_from: Option<String>,
    /// The commit objects that fix the staged tree (git sources): see
    /// [`proof`]. Absent in entries staged before it was recorded (and when
    /// it could not be read): such an entry is used by the store that
    /// staged it, never taken from a cache or a bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<proof::GitProof>,
}

/// The entry of `src`: `store/ext/<name>-<rev>`.
pub fn entry(store: &Store, src: &ExtSource) -> Entry {
    store.entry(Bucket::Ext, &src.entry_name())
}

/// Ensures `src` is staged in the store, fetching it unless `offline`.
/// Returns the entry and its record.
///
/// Errors: `offline` and it is not staged; the fetch fails (names the
/// repository or URL); the tag does not exist; a URL's sha256 differs.
pub fn ensure(store: &Store, src: &ExtSource, offline: bool) -> Result<(Entry, ExtRecord)> {
    let e = entry(store, src);
    if e.exists() {
        return Ok((e.clone(), read_json(&e.path.join("ext.json"))?));
    }
    if offline {
        bail!(
            "--offline: external source {} ({}) is not staged in {}",
            src.name,
            describe(&src.origin),
            e.path.display()
        );
    }
    let _lock = e.lock()?;
    if e.exists() {
        return Ok((e.clone(), read_json(&e.path.join("ext.json"))?));
    }
    progress::stage(
        "ext",
        format!(
            "staging {} ({}) into {}",
            src.name,
            describe(&src.origin),
            e.label()
        ),
    );
    let staging = store.stage(&format!("ext-{}", safe(&src.name)))?;
    let dir = staging.path().join("entry");
    let tree = dir.join("src");
    fs::create_dir_all(&dir)?;
    let mut rec = ExtRecord {
        source: src.clone(),
        commit: None,
        archive_sha256: None,
        submodules: BTreeMap::new(),
        fetched_from: None,
        git: None,
    };
    match &src.origin {
        Origin::Git { repo, tag } => {
            let mirrors = crate::host::mirror::load(store.root())?;
            let from =
                mirrors.git_url(repo, &format!("CMake source {} ({})", src.name, src.file))?;
            if &from != repo {
                progress::stage("ext", format!("{} through the mirror {from}", src.name));
            }
            // One git path for the source and the ext stage: the command
            // line when on PATH (it reads a mirror that is a partial
            // clone), libgit2 only on a box without git.
            let timeouts = crate::host::git_timeouts::load(store.root())?;
            let (commit, subs) = match crate::host::git::Git::find() {
                Some(git) => {
                    let git = git.with_timeouts(timeouts);
                    git.fetch_tree(&from, tag, src.submodules, &tree, &mirrors.git_config())
                        .with_context(|| format!("staging CMake source {} from {from}", src.name))?
                }
                None => {
                    timeouts.apply_to_libgit2()?;
                    fetch_git(&from, tag, src.submodules, &tree)?
                }
            };
            // The commit objects that fix the tree, read before `.git` goes.
            match proof::record(&tree, &commit, &subs) {
                Ok(p) => rec.git = Some(p),
                Err(e) => progress::stage(
                    "ext",
                    format!(
                        "warning: {}: the commit objects could not be read ({e:#}); no other box will take this entry from a cache",
                        src.name
                    ),
                ),
            }
            remove_git_dirs(&tree)?;
            rec.commit = Some(commit);
            rec.submodules = subs;
            rec.fetched_from = Some(from);
        }
        Origin::Url { url, sha256 } => {
            rec.archive_sha256 = Some(fetch_url(store, url, sha256.as_deref(), &tree)?);
        }
    }
    write_json(&dir.join("ext.json"), &rec)?;
    Manifest::build(&dir, &[crate::store::MANIFEST])?.write(&dir)?;
    store.persist(&dir, &e)?;
    Ok((e, rec))
}

/// The URL the staged git source at `e` was fetched from (its `ext.json`
/// `fetched_from`); `None` for a URL source, an entry staged before it was
/// recorded, or one that cannot be read.
pub fn fetched_from(e: &Entry) -> Option<String> {
    read_json::<ExtRecord>(&e.path.join("ext.json"))
        .ok()?
        .fetched_from
}

/// `repo @ tag` or the URL, for messages.
pub fn describe(o: &Origin) -> String {
    match o {
        Origin::Git { repo, tag } => format!("{repo} @ {tag}"),
        Origin::Url { url, .. } => url.clone(),
    }
}

/// libgit2's fetch of `tag` of `url` into `dir`, on a box without git
/// (it cannot read a mirror that is a partial clone, nor apply the site's
/// mirrors to submodule URLs). The `.git` directories are left for the
/// caller to read and remove.
fn fetch_git(
    url: &str,
    tag: &str,
    submodules: bool,
    dir: &Path,
) -> Result<(String, BTreeMap<String, String>)> {
    let repo = Repository::init(dir).with_context(|| format!("creating {}", dir.display()))?;
    repo.remote("origin", url)?;
    let mut remote = repo.find_remote("origin")?;
    let is_sha = crate::host::git::is_full_id(tag);
    let mut specs: Vec<String> = vec![
        "+refs/heads/*:refs/remotes/origin/*".into(),
        "+refs/tags/*:refs/tags/*".into(),
    ];
    if is_sha {
        specs.push(format!("+{tag}:refs/oracle-build/ext"));
    }
    let mut opts = FetchOptions::new();
    opts.download_tags(git2::AutotagOption::All);
    let first = remote.fetch(&specs, Some(&mut opts), None);
    if first.is_err() && is_sha {
        // Servers that refuse a fetch by id: branches and tags only.
        let mut opts = FetchOptions::new();
        remote
            .fetch(&specs[..2], Some(&mut opts), None)
            .map_err(|e| anyhow::anyhow!("fetching {url}: {}", e.message()))?;
    } else {
        first.map_err(|e| anyhow::anyhow!("fetching {url}: {}", e.message()))?;
    }
    let commit = [
        format!("refs/tags/{tag}"),
        format!("refs/remotes/origin/{tag}"),
        tag.to_string(),
    ]
    .iter()
    .find_map(|r| {
        repo.revparse_single(r)
            .ok()
            .and_then(|o| o.peel_to_commit().ok())
    })
    .with_context(|| format!("{url} has no tag, branch or commit {tag}"))?;
    let id = commit.id().to_string();
    repo.set_head_detached(commit.id())?;
    repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))?;
    let mut subs = BTreeMap::new();
    if submodules {
        update_submodules(&repo, "", &mut subs)?;
    }
    drop(commit);
    drop(remote);
    drop(repo);
    Ok((id, subs))
}

fn update_submodules(
    repo: &Repository,
    prefix: &str,
    out: &mut BTreeMap<String, String>,
) -> Result<()> {
    for mut sm in repo.submodules()? {
        let path = format!("{prefix}{}", sm.path().display());
        sm.update(true, None)
            .map_err(|e| anyhow::anyhow!("updating submodule {path}: {}", e.message()))?;
        if let Some(id) = sm.workdir_id().or(sm.head_id()) {
            out.insert(path.clone(), id.to_string());
        }
        let sub = sm.open()?;
        update_submodules(&sub, &format!("{path}/"), out)?;
    }
    Ok(())
}

fn remove_git_dirs(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let p = e.path();
        let ft = e.file_type()?;
        if e.file_name() == ".git" {
            if ft.is_dir() {
                fs::remove_dir_all(&p)?;
            } else {
                fs::remove_file(&p)?;
            }
        } else if ft.is_dir() {
            remove_git_dirs(&p)?;
        }
    }
    Ok(())
}

/// Downloads (or copies, for `file://`) the archive at `url`, checks its
/// sha256, and extracts it into `dir`, dropping a single top-level
/// directory as CMake does. Returns the archive's sha256.
fn fetch_url(store: &Store, url: &str, sha256: Option<&str>, dir: &Path) -> Result<String> {
    let staging = store.stage("ext-download")?;
    let file = staging.path().join("archive");
    if let Some(path) = url.strip_prefix("file://") {
        fs::copy(path, &file)?;
    } else {
        let curl = which::which("curl").context(
            "downloading a URL source needs `curl` on PATH (or stage it as a file:// URL)",
        )?;
        crate::host::process::capture(
            &format!("curl {url}"),
            duct::cmd(curl, ["-fsSL", "-o", &file.display().to_string(), url]),
        )?;
    }
    let got = sha256_file(&file)?;
    match sha256 {
        Some(want) if want != got => {
            bail!("{url} has sha256 {got}, but URL_HASH says {want}; refusing it")
        }
        _ => {}
    }
    let lower = url.to_ascii_lowercase();
    if !(lower.ends_with(".tar.gz") || lower.ends_with(".tgz") || lower.ends_with(".tar")) {
        bail!("{url}: only .tar.gz/.tgz/.tar archives can be staged");
    }
    let raw = staging.path().join("x");
    fs::create_dir_all(&raw)?;
    let reader = fs::File::open(&file)?;
    let mut ar: tar::Archive<Box<dyn std::io::Read>> = if lower.ends_with(".tar") {
        tar::Archive::new(Box::new(reader))
    } else {
        tar::Archive::new(Box::new(flate2::read::GzDecoder::new(reader)))
    };
    for entry in ar.entries()? {
        let mut entry = entry?;
        if !entry.unpack_in(&raw)? {
            bail!("{url}: archive entry leaves the extraction directory; refusing it");
        }
    }
    let tops: Vec<PathBuf> = fs::read_dir(&raw)?.flatten().map(|e| e.path()).collect();
    let root = match tops.as_slice() {
        [one] if one.is_dir() => one.clone(),
        _ => raw.clone(),
    };
    copy_tree(&root, dir)?;
    Ok(got)
}

/// Copies each staged source into `<work>/ext/` and returns the build
/// environment that points the checkout at the copies: one entry per
/// environment variable, and `CMAKE_ARGS` (appended to `base_cmake_args`)
/// with a `-D<VAR>=<dir>` per CMake variable. Sources decided at configure
/// time ([`Decided::Configure`]) are passed through no variable (CMake
/// consults a dependency provider only when `FETCHCONTENT_SOURCE_DIR_<NAME>`
/// is empty): the provider file [`PROVIDER_FILE`] is written and loaded with
/// `-DCMAKE_PROJECT_TOP_LEVEL_INCLUDES=<file>` (CMake >= 3.24, CMake docs,
/// "Dependency Providers"). It receives each `FetchContent_MakeAvailable` of
/// those names with the declaration CMake evaluated, hands over the staged
/// copy whose origin it matches (`FETCHCONTENT_SOURCE_DIR_<NAME>`, then
/// `FetchContent_MakeAvailable`, which does not recurse into the provider),
/// appends `name, origin, tag, dir` to [`PROVIDER_RECORD`], and stops the
/// configure with `FATAL_ERROR` naming a declaration none matches: nothing
/// is downloaded.
///
/// Errors: a copy fails, or a path contains whitespace (`CMAKE_ARGS` is split on it).
pub fn build_env(
    staged: &[(ExtSource, Entry)],
    work: &Path,
    base_cmake_args: Option<&str>,
) -> Result<BTreeMap<String, String>> {
    let mut env = BTreeMap::new();
    let mut cmake: Vec<String> = base_cmake_args
        .filter(|s| !s.trim().is_empty())
        .map(|s| vec![s.trim().to_string()])
        .unwrap_or_default();
    let mut any_cmake = false;
    let mut provided: Vec<(&ExtSource, String)> = Vec::new();
    for (src, e) in staged {
        let dest = work.join("ext").join(&e.name);
        copy_tree(&e.path.join("src"), &dest)?;
        if src.decided == Decided::Configure {
            let dir = dest.display().to_string();
            if dir.chars().any(char::is_whitespace) {
                bail!("the staged source path {dir} contains whitespace");
            }
            provided.push((src, dir));
            continue;
        }
        let value = match &src.subdir {
            Some(sub) => dest.join(sub),
            None => dest,
        };
        let value = value.display().to_string();
        if value.chars().any(char::is_whitespace) {
            bail!("the staged source path {value} contains whitespace");
        }
        match &src.variable {
            Variable::Env(v) => {
                env.insert(v.clone(), value);
            }
            Variable::Cmake(v) => {
                cmake.push(format!("-D{v}={value}"));
                any_cmake = true;
            }
        }
    }
    if !provided.is_empty() {
        let file = work.join("ext").join(PROVIDER_FILE);
        let record = work.join("ext").join(PROVIDER_RECORD);
        fs::write(&file, provider_cmake(&provided, &record))?;
        cmake.push(format!(
            "-DCMAKE_PROJECT_TOP_LEVEL_INCLUDES={}",
            file.display()
        ));
        any_cmake = true;
    }
    if any_cmake {
        env.insert("CMAKE_ARGS".into(), cmake.join(" "));
    }
    Ok(env)
}

/// The dependency provider's file name in `<work>/ext/`.
pub const PROVIDER_FILE: &str = "oracle-build-provider.cmake";
/// The provider's record in `<work>/ext/`: written empty when CMake loads the
/// provider, then one line per declaration it handed over
/// (`name<TAB>repository or URL<TAB>GIT_TAG<TAB>dir`).
pub const PROVIDER_RECORD: &str = "oracle-build-provided.tsv";

/// A CMake quoted argument holding `s` literally.
fn cmake_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if matches!(c, '\\' | '"' | '$' | ';') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The provider's CMake text for the candidates (source, staged dir).
fn provider_cmake(provided: &[(&ExtSource, String)], record: &Path) -> String {
    let rec = cmake_quote(&record.display().to_string());
    let mut names: Vec<String> = Vec::new();
    for (s, _) in provided {
        let lc = s.name.to_ascii_lowercase();
        if !names.contains(&lc) {
            names.push(lc);
        }
    }
    let mut t = String::from(
        "# Written by oracle-build: the dependency provider for FetchContent sources\n\
         # the tree declares more than once under conditions it decides at configure\n\
         # time. Each is staged; CMake's own evaluation picks the declaration.\n\
         if(CMAKE_VERSION VERSION_LESS 3.24)\n  message(FATAL_ERROR \"oracle-build: a source declared more than once needs CMake >= 3.24 (dependency providers); this is ${CMAKE_VERSION}\")\nendif()\n",
    );
    t.push_str(&format!("file(WRITE {rec} \"\")\n"));
    t.push_str("macro(oracle_build_provide _ob_method _ob_name)\n");
    t.push_str(
        "  string(TOLOWER \"${_ob_name}\" _ob_lc)\n  string(TOUPPER \"${_ob_name}\" _ob_uc)\n",
    );
    t.push_str("  cmake_parse_arguments(_ob \"\" \"GIT_REPOSITORY;GIT_TAG;URL\" \"\" ${ARGN})\n");
    t.push_str("  set(_ob_dir \"\")\n  set(_ob_known \"\")\n  set(_ob_governed FALSE)\n");
    for n in &names {
        t.push_str(&format!(
            "  if(_ob_lc STREQUAL {})\n    set(_ob_governed TRUE)\n",
            cmake_quote(n)
        ));
        for (s, dir) in provided
            .iter()
            .filter(|(s, _)| s.name.eq_ignore_ascii_case(n))
        {
            let test = match &s.origin {
                Origin::Git { repo, tag } => format!(
                    "\"${{_ob_GIT_REPOSITORY}}\" STREQUAL {} AND \"${{_ob_GIT_TAG}}\" STREQUAL {}",
                    cmake_quote(repo),
                    cmake_quote(tag)
                ),
                Origin::Url { url, .. } => {
                    format!("\"${{_ob_URL}}\" STREQUAL {}", cmake_quote(url))
                }
            };
            t.push_str(&format!(
                "    string(APPEND _ob_known \" {}\")\n    if({test})\n      set(_ob_dir {})\n    endif()\n",
                cmake_quote(&format!("{} ({})", s.declared_at(), describe(&s.origin))).trim_matches('"'),
                cmake_quote(dir)
            ));
        }
        t.push_str("  endif()\n");
    }
    t.push_str(&format!(
        "  if(_ob_governed)\n\
         \x20   if(_ob_dir STREQUAL \"\")\n\
         \x20     message(FATAL_ERROR \"oracle-build: FetchContent_Declare(${{_ob_name}} ${{ARGN}}) is not one of the declarations staged for it:${{_ob_known}}; nothing is downloaded\")\n\
         \x20   endif()\n\
         \x20   file(APPEND {rec} \"${{_ob_lc}}\\t${{_ob_GIT_REPOSITORY}}${{_ob_URL}}\\t${{_ob_GIT_TAG}}\\t${{_ob_dir}}\\n\")\n\
         \x20   set(FETCHCONTENT_SOURCE_DIR_${{_ob_uc}} \"${{_ob_dir}}\")\n\
         \x20   FetchContent_MakeAvailable(${{_ob_name}})\n\
         \x20 endif()\n\
         endmacro()\n\
         cmake_language(SET_DEPENDENCY_PROVIDER oracle_build_provide SUPPORTED_METHODS FETCHCONTENT_MAKEAVAILABLE_SERIAL)\n"
    ));
    t
}

/// The declaration a build took of one name, as `build.json` records it
/// (`ext_taken`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Taken {
    /// The FetchContent name.
    pub name: String,
    /// `file:line` of the declaration taken.
    pub declared: String,
    /// Where it comes from.
    pub origin: Origin,
    /// The commit its `GIT_TAG` resolved to when staged (git sources).
    pub commit: Option<String>,
    /// `target` (resolved before the build) or `configure` (by the tree's
    /// CMake, through the dependency provider).
    pub decided: Decided,
    /// The store entry it was staged as.
    pub entry: String,
}

/// The declarations the build in `work` took ([`build_env`]'s copies):
/// each source decided for the target, and each one the dependency provider
/// handed over (read from [`PROVIDER_RECORD`]); a name declared for
/// configure that CMake never made available is not listed.
///
/// Errors: there are configure-time candidates and the provider never
/// loaded (CMake ignored `CMAKE_PROJECT_TOP_LEVEL_INCLUDES`: older than
/// 3.24, or no `project()`), or its record names a directory no candidate
/// was copied to; an entry's `ext.json` cannot be read.
pub fn taken(staged: &[(ExtSource, Entry)], work: &Path) -> Result<Vec<Taken>> {
    let commit = |e: &Entry| -> Result<Option<String>> {
        let rec: ExtRecord = read_json(&e.path.join("ext.json"))?;
        Ok(rec.commit)
    };
    let mut out = Vec::new();
    for (s, e) in staged.iter().filter(|(s, _)| s.decided == Decided::Target) {
        out.push(Taken {
            name: s.name.clone(),
            declared: s.declared_at(),
            origin: s.origin.clone(),
            commit: commit(e)?,
            decided: Decided::Target,
            entry: e.label(),
        });
    }
    let cands: Vec<&(ExtSource, Entry)> = staged
        .iter()
        .filter(|(s, _)| s.decided == Decided::Configure)
        .collect();
    if cands.is_empty() {
        return Ok(out);
    }
    let record = work.join("ext").join(PROVIDER_RECORD);
    let text = fs::read_to_string(&record).map_err(|_| {
        let list: Vec<String> = cands
            .iter()
            .map(|(s, _)| format!("{} ({})", s.declared_at(), describe(&s.origin)))
            .collect();
        anyhow::anyhow!(
            "the build's CMake never loaded the dependency provider that chooses between {} (it needs CMake >= 3.24 and a project() call); refusing the wheel",
            list.join(", ")
        )
    })?;
    let mut seen: Vec<String> = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let dir = line.rsplit('\t').next().unwrap_or_default();
        if seen.iter().any(|d| d == dir) {
            continue;
        }
        seen.push(dir.to_string());
        let Some((s, e)) = cands
            .iter()
            .find(|(_, e)| work.join("ext").join(&e.name) == Path::new(dir))
        else {
            bail!(
                "{}: names {dir}, which is no staged candidate",
                record.display()
            );
        };
        out.push(Taken {
            name: s.name.clone(),
            declared: s.declared_at(),
            origin: s.origin.clone(),
            commit: commit(e)?,
            decided: Decided::Configure,
            entry: e.label(),
        });
    }
    Ok(out)
}

/// What goes into the wheel key for the staged sources: name, origin and
/// resolved revision of each, in declaration order; every configure-time
/// candidate of a name is there, marked `"decided": "configure"`.
pub fn key_inputs(staged: &[(ExtSource, ExtRecord)]) -> serde_json::Value {
    serde_json::Value::Array(
        staged
            .iter()
            .map(|(s, r)| {
                let mut v = serde_json::json!({
                    "name": s.name, "origin": s.origin, "variable": s.variable, "subdir": s.subdir,
                    "commit": r.commit, "archive_sha256": r.archive_sha256, "submodules": r.submodules,
                });
                // Only a configure-time candidate says so (keys of sources
                // decided for the target are as before).
                if s.decided == Decided::Configure {
                    v["decided"] = serde_json::json!(s.decided);
                }
                v
            })
            .collect(),
    )
}

/// One staged source as the wheel key records it (an item of
/// [`key_inputs`]), read back from a `build.json` for the bill of materials
/// and the provenance.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct KeyedSource {
    /// The FetchContent name.
    pub name: String,
    /// Where it comes from.
    pub origin: Origin,
    /// The variable the build read it from.
    pub variable: Variable,
    /// The path inside the source the variable pointed at.
    #[serde(default)]
    pub subdir: Option<String>,
    /// The commit `GIT_TAG` resolved to (git sources).
    #[serde(default)]
    pub commit: Option<String>,
    /// The archive's sha256 (URL sources).
    #[serde(default)]
    pub archive_sha256: Option<String>,
    /// Submodules fetched: path -> commit.
    #[serde(default)]
    pub submodules: BTreeMap<String, String>,
    /// `configure`: one of several candidates of its name (the build
    /// record's `ext_taken` says which one CMake took).
    #[serde(default)]
    pub decided: Decided,
}

impl KeyedSource {
    /// The store entry it was staged as (`store/ext/<name>-<rev>-<h>`).
    pub fn entry(&self, store: &Store) -> Entry {
        let src = ExtSource {
            name: self.name.clone(),
            file: String::new(),
            origin: self.origin.clone(),
            submodules: !self.submodules.is_empty(),
            variable: self.variable.clone(),
            subdir: self.subdir.clone(),
            condition: None,
            line: 0,
            decided: self.decided,
        };
        entry(store, &src)
    }
}

/// The staged sources a wheel key's `inputs.ext` lists (`None` or null: none).
///
/// Errors: the value is not the shape [`key_inputs`] writes.
pub fn keyed_sources(inputs_ext: Option<&serde_json::Value>) -> Result<Vec<KeyedSource>> {
    match inputs_ext {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(v) => serde_json::from_value(v.clone())
            .context("the wheel's inputs.ext is not a list of staged sources"),
    }
}

/// The sha256 of the staged tree of the ext entry at `dir` (its `src/`), as
/// the bill of materials and the provenance name it: the lowercase hex
/// sha256 of the canonical JSON ([`crate::store::key::canonical_json`]) of
/// `{"files": [[path, size, sha256], ...], "symlinks": [[path, target], ...]}`,
/// paths relative to `src/` and sorted, read from the entry's manifest
/// (every file hashed when it was staged) after the entry's quick check
/// ([`Manifest::check_quick`]), so a changed tree is refused, not described.
///
/// Errors: the entry's manifest cannot be read, or the entry is damaged
/// (names the problems).
pub fn tree_digest(dir: &Path) -> Result<String> {
    let problems = Manifest::check_quick(dir);
    if !problems.is_empty() {
        bail!(
            "the staged source {} is damaged: {}",
            dir.display(),
            problems.join("; ")
        );
    }
    let m = Manifest::read(dir)?;
    let files: Vec<serde_json::Value> = m
        .files
        .iter()
        .filter_map(|f| {
            let rel = f.path.strip_prefix("src/")?;
            Some(serde_json::json!([rel, f.size, f.sha256]))
        })
        .collect();
    let symlinks: Vec<serde_json::Value> = m
        .symlinks
        .iter()
        .filter_map(|(p, t)| Some(serde_json::json!([p.strip_prefix("src/")?, t])))
        .collect();
    let text = crate::store::key::canonical_json(&serde_json::json!({
        "files": files, "symlinks": symlinks,
    }));
    Ok(hex::encode(Sha256::digest(text.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_differ_by_origin_and_are_path_safe() {
        let src = |repo: &str, tag: &str| ExtSource {
            name: "lib".into(),
            file: "CMakeLists.txt".into(),
            origin: Origin::Git {
                repo: repo.into(),
                tag: tag.into(),
            },
            submodules: false,
            variable: Variable::Env("X".into()),
            subdir: None,
            condition: None,
            line: 0,
            decided: Decided::Target,
        };
        let a = src("https://a.invalid/lib.git", "release/1.0").entry_name();
        let b = src("https://b.invalid/lib.git", "release/1.0").entry_name();
        assert_ne!(a, b);
        assert!(!a.contains('/'), "{a}");
        assert!(a.starts_with("lib-"), "{a}");
    }
}
