//! Taking store entries from a cache instead of doing the work: what
//! `pull` and `build`'s substitution share.
//!
//! Two phases. [`Fetcher::prepare`] (and [`Fetcher::prepare_source`]) look
//! a tag up, download its config and layers into one staging directory
//! (every blob checked against its digest by the transport, then every
//! file against the config's list) and check the entry the way its stage
//! would: a wheelhouse file against the sha256 the lock gives it (its
//! name), a wheel against its `build.json` and `manifest.json`, a tree
//! against the path rules `import` applies. Nothing is in the store yet.
//! [`Fetcher::commit`] then moves each prepared entry into the store by one
//! rename under the entry's lock (entries that appeared meanwhile are kept),
//! and fetches a source bundle into the mirror. A pull that fails in the
//! first phase writes nothing.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use fs_err as fs;

use std::cell::RefCell;
use std::rc::Rc;

use super::Transport;

/// How many blob requests a pull keeps in flight (see [`Fetcher::prefetch`]).
pub const PARALLEL: usize = 8;
use super::artifact::{self, Config, Kind, layer_title};
use super::listing::{self, TagList};
use super::trust::Attestation;
use crate::stages::{source, wheel, wheelhouse};
use crate::store::{Bucket, Entry, Manifest, Staging, Store, TempRoots, sha256_file};

/// What the trust policy says of the config of a signed kind (a wheel, a
/// store lock) and every attestation of its key the cache holds
/// ([`listing::signed`]): `Ok` to accept it, an error naming why not (see
/// [`accept`]).
pub type WheelPolicy<'a> = &'a dyn Fn(&Config, &[Attestation]) -> Result<()>;

/// How a lock from a cache is trusted (`cache ls`, `pull`, `build`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "lock_trust", rename_all = "kebab-case")]
pub enum LockTrust {
    /// Its lock files are exactly those of a reviewed lockfile on this box
    /// (same sha256): the digests are enough.
    Lockfile,
    /// A store lock: the policy's verdict on its signed statements.
    Signed {
        /// The verdict.
        verdict: super::trust::Verdict,
    },
}

impl LockTrust {
    /// Whether the lock may decide what is installed.
    pub fn is_trusted(&self) -> bool {
        match self {
            LockTrust::Lockfile => true,
            LockTrust::Signed { verdict } => verdict.is_trusted(),
        }
    }
}

impl std::fmt::Display for LockTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockTrust::Lockfile => write!(f, "pinned (lockfile)"),
            LockTrust::Signed { verdict } if verdict.is_trusted() => {
                write!(f, "{}", verdict.to_string().trim_start_matches("trusted: "))
            }
            LockTrust::Signed { verdict } => write!(f, "{verdict}"),
        }
    }
}

/// The files a lock statement names for the lock artifact `config`: every
/// file of the lock (`pylock.*.toml`, `lock.json`) with sha256 and size.
pub fn lock_files(config: &Config) -> Vec<super::trust::FileDigest> {
    config
        .files
        .iter()
        .map(|f| super::trust::FileDigest {
            path: f.path.clone(),
            sha256: f.sha256.clone(),
            size: f.size,
        })
        .collect()
}

/// Whether the lock artifact `config` holds exactly the lock files
/// (`pylock.build.toml`, `pylock.runtime.toml`) of a reviewed lockfile
/// under `lockfiles` (a lockfiles root: see [`pinned_by_lockfile_files`]).
pub fn pinned_by_lockfile(config: &Config, lockfiles: Option<&Path>) -> bool {
    use crate::stages::lock::{BUILD_LOCK, RUNTIME_LOCK};
    let theirs = |name: &str| {
        config
            .files
            .iter()
            .find(|f| f.path == name)
            .map(|f| f.sha256.clone())
    };
    pinned_by_lockfile_files((theirs(BUILD_LOCK), theirs(RUNTIME_LOCK)), lockfiles)
}

/// How many recipe directories of a lockfiles root are looked through.
const LOCKFILE_DIRS_LIMIT: usize = 10_000;

/// Whether `wanted`, the sha256 of a lock's `pylock.build.toml` and
/// `pylock.runtime.toml` (`None`: absent), are exactly those of a reviewed
/// lockfile under `lockfiles`: a lockfiles root, whose recipe directories
/// `<root>/<recipe>/` and their platform directories `<root>/<recipe>/<P>/`
/// hold lockfiles (at most [`LOCKFILE_DIRS_LIMIT`] recipe directories).
/// Any recipe's: a lock is pinned by its bytes, whichever recipe name the
/// box that made it used (a lock names none). Also for a bundle's lock, by
/// `import`.
pub fn pinned_by_lockfile_files(
    wanted: (Option<String>, Option<String>),
    lockfiles: Option<&Path>,
) -> bool {
    use crate::stages::lock::{BUILD_LOCK, LOCK_JSON, LockInfo, RUNTIME_LOCK};
    let Some(root) = lockfiles else {
        return false;
    };
    if wanted.0.is_none() && wanted.1.is_none() {
        return false;
    }
    let subdirs = |d: &Path| -> Vec<PathBuf> {
        fs::read_dir(d).map_or_else(
            |_| Vec::new(),
            |rd| {
                rd.flatten()
                    .take(LOCKFILE_DIRS_LIMIT)
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            },
        )
    };
    let mut dirs = Vec::new();
    for recipe in subdirs(root) {
        dirs.extend(subdirs(&recipe));
        dirs.push(recipe);
    }
    dirs.iter().any(|d| {
        let Ok(info) = crate::store::read_json::<LockInfo>(&d.join(LOCK_JSON)) else {
            return false;
        };
        let claimed = (
            info.files.get(BUILD_LOCK).cloned(),
            info.files.get(RUNTIME_LOCK).cloned(),
        );
        if claimed != wanted {
            return false;
        }
        // The files on disk, not only what their lock.json claims.
        let on_disk = |name: &str| {
            let f = d.join(name);
            f.is_file().then(|| sha256_file(&f).ok()).flatten()
        };
        (on_disk(BUILD_LOCK), on_disk(RUNTIME_LOCK)) == wanted
    })
}

/// How the lock artifact `config` is trusted under `policy`, with the
/// reviewed lockfiles under `lockfiles` ([`pinned_by_lockfile`]), else from
/// `attestations`, every attestation of its key the cache holds (the
/// attestation artifacts `att-lock-<key>-...` and any its config embeds, as
/// [`listing::signed`] with [`Kind::Lock`] reads them): the verdict
/// [`listing::Signed::verdict`] gives, the same for every reader.
pub fn lock_trust(
    config: &Config,
    attestations: &[Attestation],
    policy: &super::trust::Policy,
    lockfiles: Option<&Path>,
) -> LockTrust {
    if pinned_by_lockfile(config, lockfiles) {
        return LockTrust::Lockfile;
    }
    LockTrust::Signed {
        verdict: super::trust::verify_lock(&config.name, &lock_files(config), attestations, policy),
    }
}

/// The files a bytecode statement names for the bytecode artifact
/// `config`: the content it restores (the `.pyc` files and
/// `bytecode.json`), with sha256 and size; not the entry's manifest, which
/// records the building box's directory times
/// ([`super::trust::bytecode_content`]).
pub fn bytecode_files(config: &Config) -> Vec<super::trust::FileDigest> {
    super::trust::bytecode_content(lock_files(config))
}

/// The trust policy on the config of a signed kind, given `attestations`
/// (every attestation of its key the cache holds): a wheel needs a trusted
/// verdict ([`wheel_verdict`]); a lock is pinned by a reviewed lockfile
/// under `lockfiles` or needs a trusted verdict ([`lock_trust`]); other
/// kinds are pinned by their names. `Ok` to accept, else an error naming why.
pub fn accept(
    config: &Config,
    attestations: &[Attestation],
    policy: &super::trust::Policy,
    lockfiles: Option<&Path>,
) -> Result<()> {
    match config.kind {
        Kind::Wheel => {
            let v = wheel_verdict(config, attestations, policy);
            if v.is_trusted() {
                Ok(())
            } else {
                Err(anyhow!("the wheel is not trusted: {v}"))
            }
        }
        Kind::Lock => {
            let t = lock_trust(config, attestations, policy, lockfiles);
            if t.is_trusted() {
                Ok(())
            } else {
                Err(anyhow!(
                    "the store lock is not trusted ({t}); this box resolves its own"
                ))
            }
        }
        Kind::Bytecode => {
            let v = super::trust::verify_bytecode(
                &config.name,
                &bytecode_files(config),
                attestations,
                policy,
            );
            if v.is_trusted() {
                Ok(())
            } else {
                Err(anyhow!("the bytecode is not trusted ({v})"))
            }
        }
        _ => Ok(()),
    }
}

/// An entry downloaded and checked in staging, not yet in the store.
#[derive(Debug)]
pub struct Prepared {
    /// The store entry it becomes.
    pub entry: Entry,
    /// Its directory in staging (or, for a source, the git bundle file).
    pub dir: PathBuf,
    /// The config it came with.
    pub config: Config,
    /// The manifest's digest.
    pub digest: String,
    /// For a source: the repository URL whose mirror it goes to.
    pub repo: Option<String>,
    /// Bytes downloaded.
    pub bytes: u64,
    /// For a source: whether the tags its bundle carries are trusted.
    pub tags: Option<super::source_bundle::TagTrust>,
}

/// Downloads from one cache into one staging directory of one store.
pub struct Fetcher<'a> {
    /// The cache.
    pub cache: &'a dyn Transport,
    /// The store.
    pub store: &'a Store,
    staging: Staging,
    n: usize,
    tags: Option<Rc<TagList>>,
    /// Entries [`Fetcher::commit`] refused, each with why.
    pub refused: Vec<String>,
    /// What [`Fetcher::commit`] has to say of what it took (a source's
    /// tags kept aside as unconfirmed).
    pub notes: Vec<String>,
    /// Checked blobs kept in [`Store::downloads_dir`] for a resumed pull;
    /// removed once [`Fetcher::commit`] has put their entries in the store.
    kept: Vec<PathBuf>,
    /// Blobs taken from there instead of the cache.
    pub resumed: usize,
    /// Digests of the blobs [`Fetcher::prefetch`] downloaded and checked
    /// into the download area in this run (taken from there unhashed).
    prefetched: std::collections::HashSet<String>,
    /// Files of this run's staging whose sha256 is known because they are
    /// a blob checked against its digest as it arrived: path -> hex.
    verified: std::collections::HashMap<PathBuf, String>,
    /// Tree layers [`Fetcher::prefetch`] unpacked while the other blobs
    /// downloaded, by digest: the directory in staging and the sha256 of
    /// each file, by its path relative to that directory.
    unpacked: std::collections::HashMap<String, (PathBuf, Hashes)>,
    /// The repository of the pin fetched for: its mirror fixes the version
    /// a wheel taken must have ([`check_wheel_history`]).
    pub repo: Option<String>,
}

/// The sha256 (hex) of files, by path.
type Hashes = std::collections::HashMap<PathBuf, String>;

impl<'a> Fetcher<'a> {
    /// A fetcher from `cache` into `store` (a fresh staging directory).
    ///
    /// Errors: the staging directory cannot be made.
    pub fn new(cache: &'a dyn Transport, store: &'a Store) -> Result<Fetcher<'a>> {
        Ok(Fetcher {
            cache,
            store,
            staging: store.stage("pull")?,
            n: 0,
            tags: None,
            refused: Vec::new(),
            notes: Vec::new(),
            kept: Vec::new(),
            resumed: 0,
            prefetched: Default::default(),
            verified: Default::default(),
            unpacked: Default::default(),
            repo: None,
        })
    }

    /// A fetcher that uses `tags`, the cache's tag list read already.
    ///
    /// Errors: as [`Fetcher::new`].
    pub fn with_tags(
        cache: &'a dyn Transport,
        store: &'a Store,
        tags: Rc<TagList>,
    ) -> Result<Fetcher<'a>> {
        let mut f = Fetcher::new(cache, store)?;
        f.tags = Some(tags);
        Ok(f)
    }

    /// The cache's tags, listed on first use.
    fn tag_list(&mut self) -> Result<Rc<TagList>> {
        if let Some(t) = &self.tags {
            return Ok(t.clone());
        }
        let t = Rc::new(TagList::read(self.cache)?);
        self.tags = Some(t.clone());
        Ok(t)
    }

    /// The tags a pull of the entries `entries` (kind, name) reads: every
    /// artifact of each and every attestation of its key, each with its
    /// kind, for [`super::readahead::ReadAhead::warm`].
    ///
    /// Errors: the cache's tags cannot be listed.
    pub fn read_ahead_tags(&mut self, entries: &[(Kind, String)]) -> Result<Vec<(Kind, String)>> {
        let tags = self.tag_list()?;
        let mut out = Vec::new();
        for (kind, name) in entries {
            out.extend(tags.of(*kind, name).into_iter().map(|t| (*kind, t)));
            out.extend(
                tags.attestations(kind.name(), name)
                    .into_iter()
                    .map(|t| (Kind::Attestation, t)),
            );
        }
        Ok(out)
    }

    /// The tags to try for entry `kind` `name`: `preferred` first (a tag a
    /// pin's inputs name, when listed), then every tag of the entry.
    fn candidates(
        &mut self,
        kind: Kind,
        name: &str,
        preferred: Option<&str>,
    ) -> Result<Vec<String>> {
        let tags = self.tag_list()?;
        let mut out: Vec<String> = preferred
            .filter(|p| tags.contains(p))
            .map(str::to_string)
            .into_iter()
            .collect();
        for t in tags.of(kind, name) {
            if !out.contains(&t) {
                out.push(t);
            }
        }
        Ok(out)
    }

    /// Downloads entry `kind` `name` from the first of its tags
    /// ([`Fetcher::candidates`]) whose artifact passes every check; `None`
    /// when it has none. Content pinned by its name (a commit, a sha256, a
    /// URL_HASH) may come from any of its artifacts; a lock without
    /// `preferred` only when every artifact of it holds the same files,
    /// since a lock is resolved, not pinned, and no reader picks one.
    ///
    /// Errors: every artifact of it is refused (naming each); several
    /// different locks.
    fn download(
        &mut self,
        kind: Kind,
        name: &str,
        preferred: Option<&str>,
    ) -> Result<Option<(Config, PathBuf, String, u64)>> {
        let tags = self.candidates(kind, name, preferred)?;
        let url = self.cache.describe();
        if kind == Kind::Lock
            && tags.len() > 1
            && preferred.is_none_or(|p| tags.first().map(String::as_str) != Some(p))
        {
            let mut contents = Vec::new();
            for (i, t) in tags.iter().enumerate() {
                let dir = self.staging.path().join(format!("lock-{i}"));
                if let Ok(Some(r)) = self.read_config(t, kind, &dir) {
                    let mut files = r.config.files.clone();
                    files.sort_by(|a, b| a.path.cmp(&b.path));
                    if !contents.contains(&files) {
                        contents.push(files);
                    }
                }
            }
            if contents.len() > 1 {
                bail!(
                    "cache {url} holds {} different locks for lock {name} ({}); taking none: `pull` takes the one the pin's inputs name, or commit a lock beside the recipe",
                    contents.len(),
                    tags.join(", ")
                );
            }
        }
        let mut refused = Vec::new();
        let mut unreachable = false;
        for t in &tags {
            match self.download_tag(kind, name, t) {
                Ok(Some(got)) => return Ok(Some(got)),
                Ok(None) => {}
                Err(e) => {
                    unreachable |= super::bounds::is_unreachable(&e);
                    refused.push(format!("{e:#}"));
                }
            }
        }
        if refused.is_empty() {
            return Ok(None);
        }
        let text = refused.join("; ");
        // A cache that timed out stays one (its callers stop asking it).
        if unreachable {
            return Err(anyhow!(super::bounds::Unreachable(text)));
        }
        bail!("{text}")
    }

    /// Gets blob `digest` of `size` bytes into the new file `dest`: from the
    /// store's download area when an earlier pull (or this one: a config
    /// read twice) checked it there (checked again), else from the cache
    /// (which checks it), then kept there by a hard link until
    /// [`Fetcher::commit`].
    ///
    /// Errors: as [`Transport::get_blob`].
    fn get_blob(&mut self, digest: &str, size: u64, dest: &Path) -> Result<()> {
        let kept = self
            .store
            .downloads_dir()
            .join("sha256")
            .join(super::digest_hex(digest)?);
        if fs::metadata(&kept).is_ok_and(|m| m.len() == size)
            && std::fs::hard_link(&kept, dest).is_ok()
        {
            // Checked as it arrived, by this run's prefetch.
            if self.prefetched.contains(digest) {
                return Ok(());
            }
            if sha256_file(dest).is_ok_and(|h| format!("sha256:{h}") == digest) {
                if !self.kept.contains(&kept) {
                    self.resumed += 1;
                    self.kept.push(kept);
                }
                return Ok(());
            }
            let _ = fs::remove_file(dest);
            let _ = fs::remove_file(&kept);
        }
        self.cache.get_blob(digest, size, dest)?;
        if let Some(dir) = kept.parent()
            && fs::create_dir_all(dir).is_ok()
        {
            let tmp = dir.join(format!(".{}.{}", std::process::id(), self.kept.len()));
            let _ = fs::remove_file(&tmp);
            if std::fs::hard_link(dest, &tmp).is_ok() && fs::rename(&tmp, &kept).is_ok() {
                self.kept.push(kept);
            }
        }
        Ok(())
    }

    /// Downloads the layers of the artifacts tagged `tags` (of their kinds)
    /// into the store's download area, [`PARALLEL`] requests at a time
    /// ([`Transport::get_blobs`]), each checked against its digest as it
    /// arrives; [`Fetcher::get_blob`] then takes them from there without
    /// hashing them again. Tree layers (bytecode: thousands of small files)
    /// come first and are unpacked into staging by a second thread while
    /// the other blobs download; [`Fetcher::download_tag`] takes the
    /// unpacked tree by a rename. Blobs already there are left for
    /// `get_blob` to check. Nothing fails here: a tag or blob that cannot
    /// be had now is fetched (and its error reported) by the sequential path.
    pub fn prefetch(&mut self, tags: &[(Kind, String)]) {
        let area = self.store.downloads_dir().join("sha256");
        if fs::create_dir_all(&area).is_err() {
            return;
        }
        // (get, its path once checked, whether it is a tree layer)
        let mut planned: Vec<(super::BlobGet, PathBuf, bool)> = Vec::new();
        for (kind, tag) in tags {
            let Ok(Some(fetched)) = self.cache.manifest(tag) else {
                continue;
            };
            let Ok(m) = artifact::parse_manifest(&fetched.bytes, *kind, tag) else {
                continue;
            };
            for l in &m.layers {
                let Ok(hex) = super::digest_hex(&l.digest) else {
                    continue;
                };
                let kept = area.join(hex);
                if kept.exists() || planned.iter().any(|(_, k, _)| *k == kept) {
                    continue;
                }
                let tmp = area.join(format!(".{}.pre.{}", std::process::id(), planned.len()));
                let _ = fs::remove_file(&tmp);
                let tree = artifact::is_tree_layer(l);
                let get = super::BlobGet {
                    digest: l.digest.clone(),
                    size: u64::try_from(l.size).unwrap_or(0),
                    dest: tmp,
                };
                planned.push((get, kept, tree));
            }
        }
        let (trees, rest): (Vec<_>, Vec<_>) = planned.into_iter().partition(|(_, _, t)| *t);
        let trees = self.fetch_planned(trees);
        let rest: Vec<_> = rest.into_iter().map(|(g, k, _)| (g, k)).collect();
        let into = self.staging.path().join("trees");
        let cache = self.cache;
        let (unpacked, results) = std::thread::scope(|s| {
            let unpacking = s.spawn(|| {
                let mut out = Vec::new();
                for (digest, file) in &trees {
                    let Ok(hex) = super::digest_hex(digest) else {
                        continue;
                    };
                    let dir = into.join(hex);
                    match artifact::unpack_tree(file, &dir) {
                        Ok(hashes) => {
                            let rel = hashes
                                .into_iter()
                                .filter_map(|(p, h)| {
                                    Some((p.strip_prefix(&dir).ok()?.to_path_buf(), h))
                                })
                                .collect();
                            out.push((digest.clone(), (dir, rel)));
                        }
                        // Unpacked again, and refused with its reason, by `download_tag`.
                        Err(_) => {
                            let _ = fs::remove_dir_all(&dir);
                        }
                    }
                }
                out
            });
            let gets: Vec<super::BlobGet> = rest.iter().map(|(g, _)| g.clone()).collect();
            let results = cache.get_blobs(&gets);
            (unpacking.join().unwrap_or_default(), results)
        });
        self.unpacked.extend(unpacked);
        for (r, (get, kept)) in results.into_iter().zip(rest) {
            self.keep_prefetched(r.is_ok(), &get, kept);
        }
    }

    /// Downloads the blobs `planned` (see [`Fetcher::prefetch`]) and keeps
    /// those that arrived checked; returns their digests and paths.
    fn fetch_planned(
        &mut self,
        planned: Vec<(super::BlobGet, PathBuf, bool)>,
    ) -> Vec<(String, PathBuf)> {
        let gets: Vec<super::BlobGet> = planned.iter().map(|(g, _, _)| g.clone()).collect();
        let results = self.cache.get_blobs(&gets);
        let mut out = Vec::new();
        for (r, (get, kept, _)) in results.into_iter().zip(planned) {
            if self.keep_prefetched(r.is_ok(), &get, kept.clone()) {
                out.push((get.digest, kept));
            }
        }
        out
    }

    /// Moves the prefetched blob `get` to `kept` when it arrived checked
    /// (`ok`), else removes what was written; returns whether it is kept.
    fn keep_prefetched(&mut self, ok: bool, get: &super::BlobGet, kept: PathBuf) -> bool {
        if ok && fs::rename(&get.dest, &kept).is_ok() {
            self.kept.push(kept);
            self.prefetched.insert(get.digest.clone());
            true
        } else {
            let _ = fs::remove_file(&get.dest);
            false
        }
    }

    fn fresh_dir(&mut self) -> Result<PathBuf> {
        self.n += 1;
        let d = self.staging.path().join(format!("{}", self.n));
        fs::create_dir_all(&d)?;
        Ok(d)
    }

    /// The manifest and config of `tag` ([`listing::read_config`]), the
    /// config blob through [`Fetcher::get_blob`] (so an unfinished pull's
    /// checked configs are taken from the store's download area too).
    ///
    /// Errors: as [`listing::read_config`].
    fn read_config(
        &mut self,
        tag: &str,
        kind: Kind,
        scratch: &Path,
    ) -> Result<Option<listing::Read>> {
        let cache = self.cache;
        listing::read_config_with(cache, tag, kind, scratch, &mut |d, s, p| {
            self.get_blob(d, s, p)
        })
    }

    /// Downloads the artifact tagged `tag` of `kind` for the entry `name`:
    /// `None` when the cache has no such tag. Returns the config, the
    /// directory with the entry's files and the manifest digest.
    fn download_tag(
        &mut self,
        kind: Kind,
        name: &str,
        tag: &str,
    ) -> Result<Option<(Config, PathBuf, String, u64)>> {
        let work = self.fresh_dir()?;
        let Some(read) = self.read_config(tag, kind, &work.join("cfg"))? else {
            return Ok(None);
        };
        let url = self.cache.describe();
        let (m, config, got_digest) = (read.manifest, read.config, read.digest);
        let size = u64::try_from(m.config.size).unwrap_or(0);
        if config.kind != kind || config.name != name {
            bail!(
                "cache {url}: {tag} carries {} {}, not {} {name}",
                config.kind.name(),
                config.name,
                kind.name()
            );
        }
        let dir = work.join("entry");
        fs::create_dir_all(&dir)?;
        let layers = work.join("layers");
        fs::create_dir_all(&layers)?;
        let mut bytes = size;
        for l in &m.layers {
            let title = layer_title(l).unwrap_or_default();
            let size = u64::try_from(l.size).unwrap_or(0);
            let dest = layers.join(title);
            if dest.exists() {
                bail!("cache {url}: {tag} has two layers titled {title}");
            }
            let tree = artifact::is_tree_layer(l);
            // A tree the prefetch unpacked (from the checked blob) becomes
            // the entry's directory, its only layer, by a rename.
            if tree
                && m.layers.len() == 1
                && let Some((unpacked, hashes)) = self.unpacked.remove(&l.digest)
                && fs::remove_dir(&dir).is_ok()
                && fs::rename(&unpacked, &dir).is_ok()
            {
                self.verified
                    .extend(hashes.into_iter().map(|(rel, h)| (dir.join(rel), h)));
                bytes += size;
                continue;
            }
            fs::create_dir_all(&dir)?;
            self.get_blob(&l.digest, size, &dest)?;
            bytes += size;
            if tree {
                let hashes = artifact::unpack_tree(&dest, &dir)
                    .with_context(|| format!("cache {url}: refusing {tag} (layer {})", l.digest))?;
                // Hashed as they were written: not read again by the checks.
                self.verified.extend(hashes);
            } else {
                fs::rename(&dest, dir.join(title))?;
                self.verified
                    .insert(dir.join(title), super::digest_hex(&l.digest)?.to_string());
            }
        }
        check_files(&dir, &config, &self.verified)
            .with_context(|| format!("cache {url}: refusing {tag}"))?;
        Ok(Some((config, dir, got_digest, bytes)))
    }

    /// The tag of the wheel of key `key` to take: every wheel artifact of
    /// the key and every attestation of it are read ([`listing::wheels`]),
    /// and the first artifact (`preferred` first) that `policy` accepts
    /// is taken. `None` when the cache has no wheel for the key.
    ///
    /// Errors: the cache fails; the policy accepts none (its reason, a
    /// reproducibility failure when two trusted builders disagree).
    fn choose_wheel(
        &mut self,
        key: &str,
        policy: WheelPolicy<'_>,
        preferred: Option<&str>,
    ) -> Result<Option<String>> {
        let tags = self.tag_list()?;
        let scratch = self.fresh_dir()?;
        let w = listing::wheels(self.cache, &tags, key, &scratch)?;
        let _ = fs::remove_dir_all(&scratch);
        if w.candidates.is_empty() {
            if w.problems.is_empty() {
                return Ok(None);
            }
            bail!("{}", w.problems.join("; "));
        }
        let mut order: Vec<&listing::Read> = w.candidates.iter().collect();
        order.sort_by_key(|c| Some(c.tag.as_str()) != preferred);
        let mut why = Vec::new();
        for c in order {
            match policy(&c.config, &w.attestations) {
                Ok(()) => return Ok(Some(c.tag.clone())),
                Err(e) => why.push(format!("{e:#}")),
            }
        }
        why.dedup();
        let shas = w.shas();
        let many = if shas.len() > 1 {
            format!(
                " ({} different wheels for this key: {})",
                shas.len(),
                shas.join(", ")
            )
        } else {
            String::new()
        };
        bail!("{}{many}", why.join("; "))
    }

    /// Prepares the store entry `entry` (lock, wheelhouse, ext or wheel)
    /// from the cache: `None` on a miss. A wheel must satisfy `policy`;
    /// `preferred` is the tag a pin's inputs name for it, tried first.
    ///
    /// Errors: the cache fails; a digest, file or record does not match
    /// (the message names the digest or file); the policy refuses.
    pub fn prepare(
        &mut self,
        entry: &Entry,
        policy: WheelPolicy<'_>,
        preferred: Option<&str>,
    ) -> Result<Option<Prepared>> {
        let kind = Kind::of_bucket(entry.bucket)
            .ok_or_else(|| anyhow!("{} entries are not in caches", entry.bucket.dir_name()))?;
        let url = self.cache.describe();
        let got = if kind == Kind::Wheel {
            let tag = artifact::tag(kind, &entry.name);
            let refuse = |e: anyhow::Error| anyhow!("cache {url}: refusing {tag}: {e:#}");
            match self
                .choose_wheel(&entry.name, policy, preferred)
                .map_err(refuse)?
            {
                Some(t) => self.download_tag(kind, &entry.name, &t)?,
                None => None,
            }
        } else {
            self.download(kind, &entry.name, preferred)?
        };
        let Some((config, dir, digest, bytes)) = got else {
            return Ok(None);
        };
        let tag = artifact::tag(kind, &entry.name);
        let refuse = |why: String| anyhow!("cache {url}: refusing {tag}: {why}");
        match entry.bucket {
            Bucket::Wheelhouse => {
                let e = Entry {
                    path: dir.clone(),
                    ..entry.clone()
                };
                let f = wheelhouse::file_of(&e).map_err(|e| refuse(format!("{e:#}")))?;
                let got = match self.verified.get(&f) {
                    Some(h) => h.clone(),
                    None => sha256_file(&f)?,
                };
                if got != entry.name {
                    return Err(refuse(format!(
                        "its file has sha256 {got}, the lock says {}",
                        entry.name
                    )));
                }
            }
            Bucket::Wheels => {
                let rec = wheel::BuildRecord::read(&dir).map_err(|e| refuse(format!("{e:#}")))?;
                if rec.key != entry.name {
                    return Err(refuse(format!("its build.json is for key {}", rec.key)));
                }
                let wheel_file = rec.wheel_path(&dir);
                let got = match self.verified.get(&wheel_file) {
                    Some(h) => h.clone(),
                    None => sha256_file(&wheel_file).map_err(|e| refuse(format!("{e:#}")))?,
                };
                if got != rec.sha256 {
                    return Err(refuse(format!(
                        "{} has sha256 {got}, its build.json says {}",
                        rec.wheel, rec.sha256
                    )));
                }
                // Sizes and extra files checked; the hashes of files that
                // arrived as checked blobs compared, the others read.
                let problems = Manifest::read(&dir).map_or_else(
                    |e| vec![format!("{e:#}")],
                    |m| {
                        let mut p = m.check(&dir, false);
                        for f in &m.files {
                            let path = dir.join(&f.path);
                            let got = match self.verified.get(&path) {
                                Some(h) => Some(h.clone()),
                                None => sha256_file(&path).ok(),
                            };
                            if got.as_deref() != Some(f.sha256.as_str()) {
                                p.push(format!("changed content: {}", f.path));
                            }
                        }
                        p
                    },
                );
                if !problems.is_empty() {
                    return Err(refuse(problems.join("; ")));
                }
            }
            Bucket::Ext if !dir.join("ext.json").is_file() => {
                return Err(refuse("no ext.json".into()));
            }
            Bucket::Locks if !dir.join(crate::stages::lock::LOCK_JSON).is_file() => {
                return Err(refuse("no lock.json".into()));
            }
            Bucket::Bytecode => {
                // Code: its record and headers checked, then judged with
                // every attestation of its key the cache holds.
                crate::host::bytecode::check_entry(&dir, &entry.name)
                    .map_err(|e| refuse(format!("{e:#}")))?;
                let tags = self.tag_list()?;
                let scratch = self.fresh_dir()?;
                let signed = listing::signed(
                    self.cache,
                    &tags,
                    Kind::Bytecode,
                    &entry.name,
                    bytecode_files,
                    &scratch,
                )?;
                let _ = fs::remove_dir_all(&scratch);
                policy(&config, &signed.attestations).map_err(|e| refuse(format!("{e:#}")))?;
            }
            Bucket::Locks => {
                // Judged with every attestation of its key the cache holds.
                let tags = self.tag_list()?;
                let scratch = self.fresh_dir()?;
                let signed = listing::signed(
                    self.cache,
                    &tags,
                    Kind::Lock,
                    &entry.name,
                    lock_files,
                    &scratch,
                )?;
                let _ = fs::remove_dir_all(&scratch);
                policy(&config, &signed.attestations).map_err(|e| refuse(format!("{e:#}")))?;
            }
            _ => {}
        }
        Ok(Some(Prepared {
            entry: entry.clone(),
            dir,
            config,
            digest,
            repo: None,
            bytes,
            tags: None,
        }))
    }

    /// The inputs artifact of key `key` for the recipe `r` (the config and
    /// the bytes read), with the inputs artifacts skipped, each with why:
    /// `None` when the cache has none. Several (two boxes pushed one recipe)
    /// are fine when they name the same wheel key, and the first in tag
    /// order is taken. Naming different wheel keys (boxes locked or built
    /// differently, or a box pushed what it liked: inputs are not signed),
    /// each is judged ([`Fetcher::inputs_trust`]): those of the most trusted
    /// kind (a trusted wheel, else a trusted lock) are taken when they name
    /// one wheel key, and those naming another are skipped. One for another
    /// recipe or commit, or that cannot be read, is skipped too.
    ///
    /// Errors: the cache fails; inputs naming different wheel keys of which
    /// none is trusted, or the most trusted name several (no reader picks
    /// one); none can be read.
    fn inputs(
        &mut self,
        key: &str,
        r: &crate::recipe::Recipe,
        policy: WheelPolicy<'_>,
    ) -> Result<Option<(Config, u64, Vec<String>)>> {
        let url = self.cache.describe();
        let tags = self.candidates(Kind::Inputs, key, None)?;
        let mut read: Vec<(String, InputsRecord)> = Vec::new();
        let mut skipped: Vec<String> = Vec::new();
        for (i, t) in tags.iter().enumerate() {
            let dir = self.staging.path().join(format!("inputs-{i}"));
            match self.read_config(t, Kind::Inputs, &dir) {
                Ok(Some(got)) => match serde_json::from_value::<InputsRecord>(got.config.record) {
                    Ok(rec) if rec.commit == r.source.commit && rec.recipe == r.name => {
                        read.push((t.clone(), rec));
                    }
                    Ok(rec) => skipped.push(format!(
                        "{t}: it is for {} @ {}, not {} @ {}",
                        rec.recipe, rec.commit, r.name, r.source.commit
                    )),
                    Err(e) => skipped.push(format!("{t}: its record does not parse: {e}")),
                },
                Ok(None) => {}
                Err(e) => skipped.push(format!("{t}: {e:#}")),
            }
        }
        let mut wheels: Vec<&str> = Vec::new();
        for (_, rec) in &read {
            if !wheels.contains(&rec.wheel_key.as_str()) {
                wheels.push(&rec.wheel_key);
            }
        }
        let take: Vec<String> = if wheels.len() <= 1 {
            read.iter().map(|(t, _)| t.clone()).collect()
        } else {
            let mut judged = Vec::new();
            for (t, rec) in &read {
                let (tier, why) = self.inputs_trust(rec, policy);
                judged.push((t, rec, tier, why));
            }
            // The most trusted: a trusted wheel, else a trusted lock.
            let best = judged.iter().map(|j| j.2).max().unwrap_or(0);
            let top: Vec<_> = judged.iter().filter(|j| j.2 == best).collect();
            let (wheel, chosen, chosen_why) = match top.first() {
                Some((t, rec, _, why))
                    if best > 0 && top.iter().all(|j| j.1.wheel_key == rec.wheel_key) =>
                {
                    (rec.wheel_key.as_str(), *t, why)
                }
                _ => {
                    let which = if best == 0 {
                        "none of them trusted here"
                    } else {
                        "trusted builders locked or built it differently"
                    };
                    bail!(
                        "cache {url} holds inputs for this recipe naming different wheels, {which} ({}); no reader picks one",
                        judged
                            .iter()
                            .map(|(t, rec, _, why)| format!("{t}: wheel {}, {why}", rec.wheel_key))
                            .collect::<Vec<_>>()
                            .join("; ")
                    );
                }
            };
            for (t, rec, _, why) in &judged {
                if rec.wheel_key != wheel {
                    skipped.push(format!(
                        "{t}: it names wheel {} (venv {}), {why}, where {chosen} names wheel {wheel}, {chosen_why}",
                        rec.wheel_key, rec.venv_key
                    ));
                }
            }
            top.iter().map(|j| j.0.clone()).collect()
        };
        let mut refused = Vec::new();
        for t in &take {
            match self.download_tag(Kind::Inputs, key, t) {
                Ok(Some((config, _, _, bytes))) => return Ok(Some((config, bytes, skipped))),
                Ok(None) => {}
                Err(e) => refused.push(format!("{e:#}")),
            }
        }
        refused.extend(skipped);
        if refused.is_empty() {
            return Ok(None);
        }
        bail!(
            "cache {url} holds no usable inputs for this recipe: {}",
            refused.join("; ")
        )
    }

    /// How far the inputs record `rec` is trusted under `policy`, with
    /// why: 2 when its wheel key has a wheel the policy accepts, else 1
    /// when the lock it lists is accepted (a reviewed lockfile's, or
    /// signed: any pusher may list another box's signed lock, so this
    /// ranks below a trusted wheel), else 0.
    ///
    /// Never fails: a cache error is part of the reason.
    fn inputs_trust(&mut self, rec: &InputsRecord, policy: WheelPolicy<'_>) -> (u8, String) {
        let wheel_label = format!("{}/{}", Bucket::Wheels.dir_name(), rec.wheel_key);
        let preferred = rec.tags.get(&wheel_label).map(String::as_str);
        let wheel = match self.choose_wheel(&rec.wheel_key, policy, preferred) {
            Ok(Some(t)) => return (2, format!("its wheel {t} trusted")),
            Ok(None) => "the cache has no wheel of its key".to_string(),
            Err(e) => format!("{e:#}"),
        };
        let mut why = vec![format!("its wheel not trusted ({wheel})")];
        for label in &rec.entries {
            let Some(entry) = self
                .store
                .entry_by_label(label)
                .filter(|e| e.bucket == Bucket::Locks)
            else {
                continue;
            };
            let Some(tag) = rec.tags.get(label) else {
                continue;
            };
            let judged = (|| -> Result<()> {
                let scratch = self.fresh_dir()?;
                let Some(got) = self.read_config(tag, Kind::Lock, &scratch)? else {
                    bail!("{tag} is not in the cache");
                };
                if got.config.name != entry.name {
                    bail!("{tag} is a lock of key {}", got.config.name);
                }
                let tags = self.tag_list()?;
                let signed = listing::signed(
                    self.cache,
                    &tags,
                    Kind::Lock,
                    &entry.name,
                    lock_files,
                    &scratch.join("att"),
                )?;
                let _ = fs::remove_dir_all(&scratch);
                policy(&got.config, &signed.attestations)
            })();
            match judged {
                Ok(()) => {
                    why.push(format!("its lock {tag} trusted"));
                    return (1, why.join(", "));
                }
                Err(e) => why.push(format!("its lock not trusted ({e:#})")),
            }
        }
        (0, why.join(", "))
    }

    /// Prepares the source of `commit` of `repo` (a git bundle for the
    /// mirror): `None` on a miss. Its tags are judged under `policy`
    /// ([`super::source_bundle::tag_trust`], over every `att-tags-` attestation
    /// of the set of tags it carries): the first artifact (`preferred`
    /// first) whose tags are confirmed is taken; when none is, the first
    /// that passes every check, its tags then kept aside as unconfirmed.
    ///
    /// Errors: as [`Fetcher::prepare`]; every artifact of the source is
    /// refused (naming each).
    pub fn prepare_source(
        &mut self,
        repo: &str,
        commit: &str,
        preferred: Option<&str>,
        policy: &super::trust::Policy,
    ) -> Result<Option<Prepared>> {
        let url = self.cache.describe();
        let mut fallback = None;
        let mut refused = Vec::new();
        for tag in self.candidates(Kind::Source, commit, preferred)? {
            let got = self
                .download_tag(Kind::Source, commit, &tag)
                .and_then(|got| {
                    let Some((config, dir, digest, bytes)) = got else {
                        return Ok(None);
                    };
                    let bundle = dir.join(SOURCE_BUNDLE);
                    if !bundle.is_file() {
                        bail!("cache {url}: {tag} has no {SOURCE_BUNDLE}");
                    }
                    let tags = crate::host::git::bundle_tags(&bundle)
                        .with_context(|| format!("cache {url}: refusing {tag}"))?;
                    let trust = self.tag_trust(repo, commit, &tags, policy)?;
                    Ok(Some(Prepared {
                        entry: source::mirror_entry(self.store, repo),
                        dir: bundle,
                        config,
                        digest,
                        repo: Some(repo.to_string()),
                        bytes,
                        tags: Some(trust),
                    }))
                });
            match got {
                Ok(Some(p)) if p.tags.as_ref().is_some_and(|t| t.is_confirmed()) => {
                    return Ok(Some(p));
                }
                Ok(Some(p)) => {
                    if fallback.is_none() {
                        fallback = Some(p);
                    }
                }
                Ok(None) => {}
                Err(e) if super::bounds::is_unreachable(&e) => return Err(e),
                Err(e) => refused.push(format!("{e:#}")),
            }
        }
        if fallback.is_none() && !refused.is_empty() {
            bail!("{}", refused.join("; "));
        }
        Ok(fallback)
    }

    /// The trust of `tags`, the tags a source of `commit` of `repo` from
    /// this cache carries, under `policy`: every attestation of the tags
    /// statement's key is read ([`listing::attestations`]).
    ///
    /// Errors: the cache cannot be read.
    fn tag_trust(
        &mut self,
        repo: &str,
        commit: &str,
        tags: &std::collections::BTreeMap<String, String>,
        policy: &super::trust::Policy,
    ) -> Result<super::source_bundle::TagTrust> {
        use super::trust::{TAGS, tags_inputs};
        if tags.is_empty() {
            return Ok(super::source_bundle::tag_trust(
                repo,
                commit,
                tags,
                &[],
                policy,
            ));
        }
        let key = crate::store::key::content_key(&tags_inputs(repo, commit, tags));
        let list = self.tag_list()?;
        let scratch = self.fresh_dir()?;
        let found = listing::attestations(self.cache, &list, TAGS, &key, &scratch)?;
        Ok(super::source_bundle::tag_trust(
            repo,
            commit,
            tags,
            &found.attestations,
            policy,
        ))
    }

    /// Moves every prepared entry into the store (see the module docs),
    /// each registered in `temp` first; returns the labels added.
    ///
    /// Errors: a rename or the git fetch fails.
    pub fn commit(&mut self, items: Vec<Prepared>, temp: &TempRoots) -> Result<Vec<String>> {
        let added = self.commit_items(items, temp)?;
        for k in self.kept.drain(..) {
            let _ = fs::remove_file(k);
        }
        Ok(added)
    }

    /// [`Fetcher::commit`]'s moves, before the kept blobs are removed;
    /// an entry refused here is noted in `refused`.
    fn commit_items(&mut self, items: Vec<Prepared>, temp: &TempRoots) -> Result<Vec<String>> {
        let mut added = Vec::new();
        for p in items {
            temp.add(self.store, &p.entry)?;
            if let (Some(repo), Some(commit)) = (&p.repo, Some(&p.config.name)) {
                let had = source::mirror_has(self.store, repo, commit);
                let trust = p.tags.clone().unwrap_or_else(|| {
                    super::source_bundle::TagTrust::Unconfirmed("not judged".into())
                });
                let got = super::source_bundle::fetch_bundle(
                    self.store,
                    repo,
                    &p.dir,
                    self.staging.path(),
                    &trust,
                )?;
                if !source::mirror_has(self.store, repo, commit) {
                    bail!("the source bundle from the cache does not hold commit {commit}");
                }
                let from = format!(
                    "{} ({})",
                    self.cache.describe(),
                    artifact::tag(Kind::Source, commit)
                );
                self.notes.extend(got.notes(&from, &trust));
                // Not when a pull beside this one brought it first.
                if !had && !got.added.is_empty() {
                    added.push(format!("{} ({commit})", p.entry.label()));
                }
                continue;
            }
            if p.entry.bucket == Bucket::Wheels
                && let Err(why) = check_wheel_history(self.store, &p.dir, self.repo.as_deref())
            {
                let why = format!(
                    "cache {}: refusing {}: {why}; the wheel stage builds here",
                    self.cache.describe(),
                    artifact::tag(Kind::Wheel, &p.entry.name)
                );
                crate::progress::stage("wheel", why.clone());
                self.refused.push(why);
                continue;
            }
            let _lock = p.entry.lock()?;
            if p.entry.exists() {
                continue;
            }
            fs::create_dir_all(self.store.bucket_dir(p.entry.bucket))?;
            self.store.persist(&p.dir, &p.entry)?;
            added.push(p.entry.label());
        }
        Ok(added)
    }
}

/// Whether the wheel entry prepared at `dir` was built from the version
/// this box's own history gives: its `build.json` inputs hash to its key,
/// and the tag they name (`describe`) is the tag this store's mirror of the
/// commit describes now ([`source::describe`]). Checked after the source
/// is in the mirror, before the wheel is (by `pull`, substitution and `import`).
/// The mirror is `repo`'s (the pin's repository) when it holds the commit,
/// else the one the wheel's record requires.
///
/// Errors: a string naming both tags and both versions (the wheel's, and
/// the one this box's history gives, [`source::history::History::gives`]).
pub fn check_wheel_history(
    store: &Store,
    dir: &Path,
    repo: Option<&str>,
) -> std::result::Result<(), String> {
    let rec = wheel::BuildRecord::read(dir).map_err(|e| format!("{e:#}"))?;
    let computed = crate::store::key::content_key(&rec.inputs);
    if computed != rec.key {
        return Err(format!(
            "its build.json inputs hash to key {computed}, not {}",
            rec.key
        ));
    }
    let commit = rec.inputs["commit"].as_str().unwrap_or_default();
    // The mirror of the pin's repository (a box may name it by another URL
    // than the box that built the wheel), else the one the wheel names.
    let mirror = repo
        .filter(|r| source::mirror_has(store, r, commit))
        .map(|r| source::mirror_entry(store, r))
        .or_else(|| {
            rec.requires
                .iter()
                .filter(|l| l.starts_with("git/"))
                .find_map(|l| store.entry_by_label(l))
                .filter(Entry::exists)
        });
    let Some(mirror) = mirror else {
        return Err(format!(
            "this box holds no mirror of commit {commit} to check the wheel's version against"
        ));
    };
    let theirs: Option<source::Describe> =
        serde_json::from_value(rec.inputs["describe"].clone()).unwrap_or(None);
    let ours = source::describe(&mirror.path, commit);
    if theirs == ours {
        return Ok(());
    }
    let show = |d: &Option<source::Describe>| {
        d.as_ref()
            .map_or_else(|| "no tag".to_string(), ToString::to_string)
    };
    // The version this box's history gives, as far as the mirror fixes it
    // (the tree computes the rest when the wheel is built here).
    let gives = source::history::of(&mirror.path, commit)
        .map_or_else(|| "another version".to_string(), |h| h.gives());
    Err(format!(
        "it was built as version {} from {}, but this box's history of {commit} gives version {gives} from {}",
        rec.history_version.as_deref().unwrap_or("(unknown)"),
        show(&theirs),
        show(&ours),
    ))
}

/// The name of the git bundle layer of a source artifact.
pub const SOURCE_BUNDLE: &str = "source.bundle";

/// Every regular file under `dir` matches the config's list (same paths,
/// sizes and sha256) and nothing else is there; the sha256 of a file in
/// `verified` (a blob checked against its digest) is taken from there.
fn check_files(
    dir: &Path,
    config: &Config,
    verified: &std::collections::HashMap<PathBuf, String>,
) -> Result<()> {
    let mut found = Vec::new();
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) -> Result<()> {
        for e in fs::read_dir(d)? {
            let e = e?;
            let ft = e.file_type()?;
            if ft.is_dir() {
                walk(base, &e.path(), out)?;
            } else if ft.is_file() {
                out.push(
                    e.path()
                        .strip_prefix(base)
                        .unwrap_or(&e.path())
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
        Ok(())
    }
    walk(dir, dir, &mut found)?;
    found.sort();
    let mut listed: Vec<&str> = config.files.iter().map(|f| f.path.as_str()).collect();
    listed.sort();
    if found != listed {
        bail!("its files {found:?} are not the ones its config lists {listed:?}");
    }
    for f in &config.files {
        let p = dir.join(&f.path);
        let size = fs::metadata(&p)?.len();
        let sha = match verified.get(&p) {
            Some(h) => h.clone(),
            None => sha256_file(&p)?,
        };
        if size != f.size || sha != f.sha256 {
            bail!(
                "{} has sha256 {sha} ({size} bytes), its config says {} ({} bytes)",
                f.path,
                f.sha256,
                f.size
            );
        }
    }
    Ok(())
}

/// The record of an `inputs-<key>` artifact: what a box needs to build a
/// pin, as the pushing box found it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InputsRecord {
    /// Recipe name.
    pub recipe: String,
    /// The pinned commit.
    pub commit: String,
    /// The recipe's repository URL.
    pub repo: String,
    /// The platform it was built for (uv's `--python-platform` spelling).
    pub platform: Option<String>,
    /// The store entries it needs (`wheelhouse/<sha>`, `ext/<name>`,
    /// `lockfiles/<key>`, `wheels/<key>`), in pipeline order.
    pub entries: Vec<String>,
    /// The wheel key of the pushing box's oracle.
    pub wheel_key: String,
    /// The venv key of the pushing box's oracle (evidence: the pulling box
    /// installs and measures its own).
    pub venv_key: String,
    /// The tag each entry was pushed under (by label; the source as
    /// `src/<commit>`), so `pull` takes exactly what the pushing box built
    /// with; empty in inputs pushed before issue 23.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tags: std::collections::BTreeMap<String, String>,
    /// The wheelhouse entry (`wheelhouse/<sha256>`, also in `entries`) of
    /// the pinned uv's wheel for the platform, which `pull` installs into
    /// the store's tools; absent from older pushes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uv: Option<String>,
}

/// The key of the `inputs-<key>` artifact of recipe `lr` on this host: the
/// sha256 of the recipe's exact text and the host platform, so any box with
/// the same recipe finds it without a lock or a checkout.
pub fn inputs_key(lr: &crate::recipe::LoadedRecipe) -> String {
    use sha2::{Digest, Sha256};
    crate::store::key::content_key(&serde_json::json!({
        "schema": crate::store::key::KEY_SCHEMA, "stage": "inputs",
        "recipe_sha256": hex::encode(Sha256::digest(lr.text.as_bytes())),
        "platform": crate::host::platform::Platform::host().map(|p| p.spelled),
    }))
}

/// The statement's view of a wheel entry: only the wheel file (its
/// `build.json` and `build.log` name paths and times of the box that built
/// it; the reproducible part is the wheel).
pub fn wheel_files(record: &wheel::BuildRecord) -> Vec<super::trust::FileDigest> {
    vec![super::trust::FileDigest {
        path: record.wheel.clone(),
        sha256: record.sha256.clone(),
        size: record.size,
    }]
}

/// The trust settings of `cache` (its `allowed_signers` loaded).
///
/// Errors: the allowed_signers file cannot be read or parsed.
pub fn policy_of(cache: &super::config::Cache) -> Result<super::trust::Policy> {
    // One reading of the key file, whose errors name the config line.
    super::trust::Policy::for_cache(cache)
}

/// The verdict of `policy` on the wheel artifact config `config` from
/// `attestations`, every attestation of its key ([`listing::verdict`]).
pub fn wheel_verdict(
    config: &Config,
    attestations: &[Attestation],
    policy: &super::trust::Policy,
) -> super::trust::Verdict {
    listing::verdict(config, attestations, policy)
}

/// What [`pull_pin`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Pulled {
    /// The cache.
    pub cache: String,
    /// The inputs the pushing box recorded.
    pub inputs: InputsRecord,
    /// Other inputs artifacts of the recipe not taken, each with why (one
    /// naming another wheel that is not trusted, for another recipe, unreadable).
    pub skipped: Vec<String>,
    /// Entries added to the store (the mirror with its commit included).
    pub added: Vec<String>,
    /// Entries already present.
    pub present: Vec<String>,
    /// Entries not taken, each with why: a store lock without trusted
    /// signatures (the box resolves its own), a wheel whose version this
    /// box's history contradicts (built here).
    pub refused: Vec<String>,
    /// Bytes downloaded.
    pub bytes: u64,
    /// Blobs taken from the store's download area, checked there by an
    /// earlier pull that did not finish.
    pub resumed: usize,
    /// Entries that were present but damaged (each with its problems):
    /// moved aside and fetched again, so they are in `added` too.
    pub repaired: Vec<String>,
    /// The pinned uv, installed into the store's tools from the pushed wheel.
    pub uv: Option<PathBuf>,
    /// What the pull could not do (the rest was done).
    pub notes: Vec<String>,
}

/// Fetches everything a `build --offline` of `lr` needs from `cache` into
/// `store`: the inputs artifact, the source (unless mirrored), the lock
/// (kept as the store's lock of the recipe when `lock_dir` has none), every
/// wheelhouse, ext and wheel entry it lists (the wheel only when `policy`
/// accepts it) and the pinned uv (installed into the store's tools).
/// Everything is downloaded and checked before any entry is added (see the
/// module docs); a present entry is checked too and fetched again when
/// damaged; blobs an unfinished pull checked are taken from the store's
/// download area. What it brings is kept by the list root
/// `roots/imported-<recipe>`.
///
/// Errors: the cache has no inputs for this recipe and platform; any
/// download or check fails (no entry is added; checked blobs are kept for
/// the next pull); the policy refuses the wheel.
pub fn pull_pin(
    cache: &dyn Transport,
    store: &Store,
    lr: &crate::recipe::LoadedRecipe,
    lock_dir: &Path,
    policy: WheelPolicy<'_>,
    tags_policy: &super::trust::Policy,
    temp: &TempRoots,
) -> Result<Pulled> {
    let r = &lr.recipe;
    let key = inputs_key(lr);
    let ahead = super::readahead::ReadAhead::new(cache, store)?;
    let mut f = Fetcher::new(&ahead, store)?;
    f.repo = Some(r.source.repo.clone());
    let Some((config, mut bytes, skipped)) = f.inputs(&key, r, policy)? else {
        bail!(
            "cache {} has no inputs for {} on this platform (tags {}-*); push it from a box that built it: oracle-build push {}",
            cache.describe(),
            r.name,
            artifact::tag(Kind::Inputs, &key),
            r.name
        );
    };
    let inputs: InputsRecord = serde_json::from_value(config.record.clone())
        .with_context(|| format!("cache {}: the record of inputs-{key}", cache.describe()))?;
    if inputs.commit != r.source.commit || inputs.recipe != r.name {
        bail!(
            "cache {}: inputs-{key} is for {} @ {}, not {} @ {}",
            cache.describe(),
            inputs.recipe,
            inputs.commit,
            r.name,
            r.source.commit
        );
    }
    let mut items = Vec::new();
    let mut present = Vec::new();
    let mut damaged: Vec<(Entry, Vec<String>)> = Vec::new();
    let mut labels = inputs.entries.clone();
    let has_lock = matches!(crate::stages::lock::load(lock_dir, lr), Ok(Some(_)));
    let auto = crate::stages::lock::auto_entry(store, r);
    if !has_lock && !labels.contains(&auto.label()) {
        labels.insert(0, auto.label());
    }
    // The manifest and config of every artifact of the entries the store
    // lacks and of every attestation of their keys, many at a time; then
    // every layer the store lacks, the same way; then the entries are read
    // and checked one by one.
    let mut lacking: Vec<(Kind, String)> = labels
        .iter()
        .filter_map(|l| store.entry_by_label(l))
        .filter(|e| !e.exists())
        .filter_map(|e| Kind::of_bucket(e.bucket).map(|k| (k, e.name.clone())))
        .collect();
    let mirrored = source::mirror_has(store, &r.source.repo, &r.source.commit);
    if !mirrored {
        lacking.push((Kind::Source, r.source.commit.clone()));
    }
    ahead.warm(&f.read_ahead_tags(&lacking)?);
    let mut wanted: Vec<(Kind, String)> = Vec::new();
    if !mirrored {
        let src_label = format!("{}/{}", Bucket::Src.dir_name(), r.source.commit);
        if let Some(t) = inputs.tags.get(&src_label) {
            wanted.push((Kind::Source, t.clone()));
        }
    }
    for label in &inputs.entries {
        if let (Some(e), Some(t)) = (store.entry_by_label(label), inputs.tags.get(label))
            && let Some(kind) = Kind::of_bucket(e.bucket)
            && !e.exists()
        {
            wanted.push((kind, t.clone()));
        }
    }
    f.prefetch(&wanted);
    if !mirrored {
        let src_label = format!("{}/{}", Bucket::Src.dir_name(), r.source.commit);
        let p = f
            .prepare_source(
                &r.source.repo,
                &r.source.commit,
                inputs.tags.get(&src_label).map(String::as_str),
                tags_policy,
            )?
            .ok_or_else(|| {
                anyhow!(
                    "cache {} has no source for {} ({})",
                    cache.describe(),
                    r.source.commit,
                    artifact::tag(Kind::Source, &r.source.commit)
                )
            })?;
        items.push(p);
    } else {
        present.push(source::mirror_entry(store, &r.source.repo).label());
    }
    for label in &labels {
        let entry = store
            .entry_by_label(label)
            .filter(|e| Kind::of_bucket(e.bucket).is_some())
            .ok_or_else(|| anyhow!("cache {}: inputs-{key} lists {label:?}", cache.describe()))?;
        temp.add(store, &entry)?;
        if entry.exists() {
            let problems = damage_of(&entry);
            if problems.is_empty() {
                present.push(entry.label());
                continue;
            }
            // Fetched again; the damaged one is moved aside at commit.
            damaged.push((entry.clone(), problems));
        }
        let prepared = match f.prepare(&entry, policy, inputs.tags.get(label).map(String::as_str)) {
            // A lock that is refused (untrusted, damaged) is not taken:
            // the box resolves its own; refused bytecode, it compiles its own.
            Err(e) if matches!(entry.bucket, Bucket::Locks | Bucket::Bytecode) => {
                let why = if entry.bucket == Bucket::Bytecode {
                    format!("{}: {e:#}; this box compiles its own", entry.label())
                } else {
                    format!("{e:#}")
                };
                let stage = if entry.bucket == Bucket::Locks {
                    "lock"
                } else {
                    "bytecode"
                };
                crate::progress::stage(stage, why.clone());
                f.refused.push(why);
                continue;
            }
            other => other?,
        };
        match prepared {
            Some(p) => {
                bytes += p.bytes;
                items.push(p);
            }
            None => bail!(
                "cache {} lacks {} ({}), which inputs-{key} lists",
                cache.describe(),
                label,
                artifact::tag(
                    Kind::of_bucket(entry.bucket).unwrap_or(Kind::Lock),
                    &entry.name
                )
            ),
        }
    }
    let mut repaired = Vec::new();
    for (e, problems) in &damaged {
        let _lock = e.lock()?;
        if e.exists() {
            store.quarantine(e, problems)?;
        }
        repaired.push(format!("{} (damaged: {})", e.label(), problems.join("; ")));
    }
    // No sync of the pulled bytes, as for a build's own entries (and Nix's
    // store paths): a killed pull leaves the page cache intact, the rename
    // that commits an entry is made durable (`Store::persist`), and an entry
    // a power loss damaged fails its checks (manifest sizes and hashes, the
    // wheelhouse file's sha256) and is fetched again by the next pull or
    // substituted by the next build. Syncing here cost 0.17 s of a 1 s pull.
    let added = f.commit(items, temp)?;
    // Rooted until a build of this pin roots its oracle (or `unkeep`).
    let mut kept: Vec<Entry> = vec![source::mirror_entry(store, &r.source.repo)];
    for label in &labels {
        kept.extend(store.entry_by_label(label));
    }
    store.set_list_root(
        &crate::store::imported_root_name(&r.name),
        &format!("{} {} pulled", r.name, r.source.commit),
        &kept,
    )?;
    // The pinned uv, into the tools directory, as `import` does.
    let mut notes = std::mem::take(&mut f.notes);
    let mut uv = None;
    match inputs.uv.as_deref().and_then(|l| store.entry_by_label(l)) {
        Some(e) if e.exists() => {
            match wheelhouse::file_of(&e)
                .and_then(|f| crate::host::toolchain::install_uv_wheel(store, &f))
            {
                Ok(tool) => uv = Some(tool.path),
                Err(err) => notes.push(format!("the pushed uv was not installed: {err:#}")),
            }
        }
        _ => notes.push(
            "the cache carries no uv for this pin (pushed by an older oracle-build): `build --offline` needs uv on PATH".into(),
        ),
    }
    Ok(Pulled {
        cache: cache.describe(),
        inputs,
        skipped,
        added,
        present,
        refused: f.refused.clone(),
        bytes,
        resumed: f.resumed,
        repaired,
        uv,
        notes,
    })
}

/// What is wrong with the store entry `entry` as `pull` checks one it
/// would skip: a wheelhouse file whose sha256 is not its name, or any entry
/// whose files do not match its manifest (hashes included); empty when
/// healthy. Entries without a manifest are taken as they are.
pub fn damage_of(entry: &Entry) -> Vec<String> {
    if entry.bucket == Bucket::Wheelhouse {
        return match wheelhouse::file_of(entry).and_then(|f| sha256_file(&f)) {
            Ok(got) if got == entry.name => Vec::new(),
            Ok(got) => vec![format!("its file has sha256 {got}")],
            Err(e) => vec![format!("{e:#}")],
        };
    }
    match Manifest::read(&entry.path) {
        Ok(m) => m.check(&entry.path, true),
        Err(_) => Vec::new(),
    }
}

/// The caches `build` substitutes from, opened, each with its trust policy.
pub struct Substituter<'a> {
    store: &'a Store,
    caches: Vec<(Box<dyn Transport>, super::trust::Policy)>,
    /// Each cache's tag list, read on first use (again for a wheel, which
    /// may be looked up long after the inputs).
    tags: Vec<RefCell<Option<Rc<TagList>>>>,
    /// Per cache: it timed out or dropped a connection in this run
    /// ([`super::bounds::Unreachable`]), so it is not asked again.
    down: Vec<std::cell::Cell<bool>>,
    /// What [`Substituter::lookup`] could not learn, one line per cache
    /// (the first failure of each), for `plan`.
    failed: RefCell<Vec<(usize, String)>>,
    /// The repository of the pin substituted for (see [`Fetcher::repo`]).
    repo: Option<String>,
}

impl<'a> Substituter<'a> {
    /// Opens `caches` for substitution into `store`. A cache that cannot be
    /// opened (a bad allowed_signers file) is an error: a build must not
    /// silently trust less or more than configured.
    ///
    /// Errors: a cache or its allowed_signers file cannot be opened.
    pub fn new(store: &'a Store, caches: &[super::config::Cache]) -> Result<Substituter<'a>> {
        let mut out = Vec::new();
        for c in caches {
            out.push((super::open(c)?, policy_of(c)?));
        }
        let tags = out.iter().map(|_| RefCell::new(None)).collect();
        let down = out.iter().map(|_| std::cell::Cell::new(false)).collect();
        Ok(Substituter {
            store,
            caches: out,
            tags,
            down,
            failed: RefCell::new(Vec::new()),
            repo: None,
        })
    }

    /// The same, substituting for a pin of the repository `repo` (its
    /// mirror checks the version of a wheel taken).
    pub fn for_repo(mut self, repo: &str) -> Substituter<'a> {
        self.repo = Some(repo.to_string());
        self
    }

    /// A fetcher from cache `i`, with its tag list (listed now when not
    /// yet, or when `fresh`).
    fn fetcher(&self, i: usize, fresh: bool) -> Result<Fetcher<'_>> {
        let t = self.caches[i].0.as_ref();
        let mut slot = self.tags[i].borrow_mut();
        let list = match &*slot {
            Some(l) if !fresh => l.clone(),
            _ => {
                let l = Rc::new(TagList::read(t)?);
                *slot = Some(l.clone());
                l
            }
        };
        let mut f = Fetcher::with_tags(t, self.store, list)?;
        f.repo.clone_from(&self.repo);
        Ok(f)
    }

    /// The caches still asked in this run, with their index.
    fn live(&self) -> impl Iterator<Item = (usize, &(Box<dyn Transport>, super::trust::Policy))> {
        self.caches
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.down[*i].get())
    }

    /// Reports that taking `what` from cache `i` failed with `e` (the stage
    /// then does the work); an unreachable cache is not asked again.
    fn skipped(&self, i: usize, stage: &str, what: &str, e: &anyhow::Error) {
        let url = self.caches[i].0.describe();
        let mut line = format!("not substituting {what} from {url}: {e:#}");
        if super::bounds::is_unreachable(e) {
            self.down[i].set(true);
            line.push_str(&format!(" (not asking {url} again in this run)"));
        }
        crate::progress::stage(stage, line);
    }

    /// Whether there is no cache to substitute from.
    pub fn is_empty(&self) -> bool {
        self.caches.is_empty()
    }

    /// Takes `entry` from the first cache that has it (the wheel only when
    /// trusted), registered in `temp` first; returns the cache's URL on a
    /// hit. A cache that fails or whose content is refused is reported on
    /// stderr and skipped: the stage then does the work.
    ///
    /// Errors: the store cannot be written.
    pub fn entry(&self, entry: &Entry, temp: &TempRoots) -> Result<Option<String>> {
        temp.add(self.store, entry)?;
        for (i, (t, policy)) in self.live() {
            // Called only for a lock no lockfile gives (`inputs`): a store lock.
            let accept = |cfg: &Config, atts: &[Attestation]| accept(cfg, atts, policy, None);
            let fresh = entry.bucket == Bucket::Wheels;
            let got =
                self.fetcher(i, fresh)
                    .and_then(|mut f| match f.prepare(entry, &accept, None)? {
                        Some(p) => {
                            let added = f.commit(vec![p], temp)?;
                            match f.refused.pop() {
                                Some(why) if added.is_empty() => Err(anyhow!(why)),
                                _ => Ok(Some(added)),
                            }
                        }
                        None => Ok(None),
                    });
            match got {
                Ok(Some(_)) => {
                    crate::progress::stage(
                        entry.bucket.dir_name(),
                        format!("substituted {} from {}", entry.label(), t.describe()),
                    );
                    return Ok(Some(t.describe()));
                }
                Ok(None) => {}
                Err(e) => self.skipped(i, entry.bucket.dir_name(), &entry.label(), &e),
            }
        }
        Ok(None)
    }

    /// Takes the source of `commit` of `repo` from the first cache that has
    /// it, into the mirror (as [`Substituter::entry`]).
    ///
    /// Errors: the store cannot be written.
    pub fn source(&self, repo: &str, commit: &str, temp: &TempRoots) -> Result<Option<String>> {
        for (i, (t, policy)) in self.live() {
            let got = self.fetcher(i, false).and_then(|mut f| {
                match f.prepare_source(repo, commit, None, policy)? {
                    Some(p) => {
                        let added = f.commit(vec![p], temp)?;
                        for n in &f.notes {
                            crate::progress::stage("source", format!("warning: {n}"));
                        }
                        Ok(Some(added))
                    }
                    None => Ok(None),
                }
            });
            match got {
                Ok(Some(_)) => {
                    crate::progress::stage(
                        "source",
                        format!("substituted {commit} from {}", t.describe()),
                    );
                    return Ok(Some(t.describe()));
                }
                Ok(None) => {}
                Err(e) => self.skipped(i, "source", commit, &e),
            }
        }
        Ok(None)
    }

    /// Keeps the failure `e` of a lookup in cache `i` (the first of each
    /// cache) for [`Substituter::failures`]; an unreachable cache is not
    /// asked again.
    fn failed_lookup(&self, i: usize, e: &anyhow::Error) {
        let unreachable = super::bounds::is_unreachable(e);
        if unreachable {
            self.down[i].set(true);
        }
        let mut failed = self.failed.borrow_mut();
        if !failed.iter().any(|(j, _)| *j == i) {
            let url = self.caches[i].0.describe();
            failed.push((
                i,
                format!(
                    "what cache {url} holds is not known (it could not be read): {e:#}{}",
                    if unreachable {
                        " (not asked again in this run)"
                    } else {
                        ""
                    }
                ),
            ));
        }
    }

    /// What the lookups so far could not learn, one line per cache that
    /// failed (timed out, refused, answered garbage), naming it and why;
    /// empty when every cache answered.
    pub fn failures(&self) -> Vec<String> {
        self.failed
            .borrow()
            .iter()
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// What `plan` shows for the artifact of `kind` named `name`: the first
    /// cache holding its tag and, for a wheel or a store lock, the verdict
    /// on its signatures (the artifact a trusted one vouches for first); `None` when no cache has
    /// it. Reads manifests and config blobs only; writes nothing to the store.
    pub fn lookup(&self, kind: Kind, name: &str, scratch: &Path) -> Option<Lookup> {
        for (i, (t, policy)) in self.live() {
            let tags = match self.fetcher(i, false).and_then(|mut f| f.tag_list()) {
                Ok(tags) => tags,
                Err(e) => {
                    self.failed_lookup(i, &e);
                    continue;
                }
            };
            let found = tags.of(kind, name);
            let Some(first) = found.first() else {
                continue;
            };
            let mut hit = Lookup {
                cache: t.describe(),
                tag: first.clone(),
                verdict: None,
            };
            // A wheel and a store lock (a lock `plan` looks up is one no
            // reviewed lockfile gives) are judged over every attestation.
            let files_of: Option<fn(&Config) -> Vec<super::trust::FileDigest>> = match kind {
                Kind::Wheel => Some(super::attest::wheel_files),
                Kind::Lock => Some(lock_files),
                _ => None,
            };
            let signed = files_of.map(|files_of| {
                let w = listing::signed(t.as_ref(), &tags, kind, name, files_of, scratch);
                if let Err(e) = &w {
                    self.failed_lookup(i, e);
                }
                w
            });
            if let Some(Ok(w)) = signed {
                let verdicts: Vec<_> = w
                    .candidates
                    .iter()
                    .map(|c| (c, w.verdict(c, policy)))
                    .collect();
                let pick = verdicts
                    .iter()
                    .find(|(_, v)| v.is_trusted())
                    .or(verdicts.first());
                if let Some((c, v)) = pick {
                    hit.tag = c.tag.clone();
                    hit.verdict = Some(v.clone());
                }
            }
            return Some(hit);
        }
        None
    }
}

/// A cache hit as `plan` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Lookup {
    /// The cache holding it.
    pub cache: String,
    /// Its tag.
    pub tag: String,
    /// For a wheel or a store lock: the trust verdict on its signatures
    /// (who signed it).
    pub verdict: Option<super::trust::Verdict>,
}

/// Substitutes the hermetic inputs of `lr` before they are needed: the
/// source (when the mirror lacks the commit), the lock (when neither
/// `lock_dir` nor the store holds one), every wheelhouse artifact of the
/// lock and every external source the commit's CMake files declare that the
/// store lacks. Returns the stages taken from a cache (`source`, `lock`,
/// `wheelhouse`, `ext`), each once.
///
/// Errors: the store cannot be written (a cache's failure only skips it).
pub fn inputs(
    subs: &Substituter<'_>,
    lr: &crate::recipe::LoadedRecipe,
    lock_dir: &Path,
    temp: &TempRoots,
) -> Result<Vec<String>> {
    let store = subs.store;
    let r = &lr.recipe;
    let mut taken = Vec::new();
    let mirror = source::mirror_entry(store, &r.source.repo);
    temp.add(store, &mirror)?;
    if !source::mirror_has(store, &r.source.repo, &r.source.commit)
        && subs
            .source(&r.source.repo, &r.source.commit, temp)?
            .is_some()
    {
        taken.push("source".to_string());
    }
    let auto = crate::stages::lock::auto_entry(store, r);
    let mut lock = crate::stages::lock::load(lock_dir, lr).ok().flatten();
    if lock.is_none() {
        if !auto.exists() && subs.entry(&auto, temp)?.is_some() {
            taken.push("lock".to_string());
        }
        lock = crate::stages::lock::load(&auto.path, lr).ok().flatten();
    }
    if let Some(l) = lock {
        let mut hit = false;
        for p in l.build.iter().chain(l.runtime.iter()) {
            let wanted = p.wanted();
            if wanted
                .iter()
                .any(|a| wheelhouse::entry(store, &a.sha256).exists())
            {
                continue;
            }
            for a in wanted {
                if subs
                    .entry(&wheelhouse::entry(store, &a.sha256), temp)?
                    .is_some()
                {
                    hit = true;
                    break;
                }
            }
        }
        if hit {
            taken.push("wheelhouse".to_string());
        }
    }
    if source::mirror_has(store, &r.source.repo, &r.source.commit)
        && let Ok(found) = crate::stages::ext::discover_in_mirror(
            &mirror.path,
            &r.source.commit,
            &r.build.target_device,
        )
    {
        let mut hit = false;
        for s in &found.sources {
            let e = crate::stages::ext::entry(store, s);
            if !e.exists() && subs.entry(&e, temp)?.is_some() {
                hit = true;
            }
        }
        if hit {
            taken.push("ext".to_string());
        }
    }
    Ok(taken)
}

/// The store lock's trust as every reader sees it, over a real `file://`
/// layout ([`listing::signed`] and [`lock_trust`] agree).
#[cfg(test)]
mod lock_trust_tests {
    use crate::cache::artifact::{Artifact, Config, Kind};
    use crate::cache::attest;
    use crate::cache::layout::Layout;
    use crate::cache::listing::tests::put;
    use crate::cache::listing::{TagList, signed};
    use crate::cache::trust::Policy;

    /// A lock artifact under its content tag, with `runtime` as the sha256
    /// of its `pylock.runtime.toml`.
    fn lock(key: &str, runtime: &str) -> Artifact {
        let file = |path: &str, sha: &str| crate::store::ManifestFile {
            path: path.into(),
            size: 1,
            sha256: sha.into(),
        };
        Artifact {
            kind: Kind::Lock,
            name: key.to_string(),
            config: Config {
                format: 1,
                kind: Kind::Lock,
                name: key.to_string(),
                record: serde_json::json!({ "recipe": "fx" }),
                files: vec![
                    file("lock.json", &"1".repeat(64)),
                    file("pylock.build.toml", &"2".repeat(64)),
                    file("pylock.runtime.toml", runtime),
                ],
                attestations: Vec::new(),
            },
            layers: Vec::new(),
        }
    }

    #[test]
    fn a_store_lock_is_judged_by_its_own_attestation_artifacts() {
        use crate::cache::substitute::{LockTrust, lock_files, lock_trust};
        use crate::cache::trust::{self, AllowedSigners, SigningKey, Statement};
        let tmp = tempfile::tempdir().unwrap();
        let t = Layout::open(&tmp.path().join("layout"), "file:///layout").unwrap();
        let key_path = tmp.path().join("k");
        let out = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "b", "-f"])
            .arg(&key_path)
            .output()
            .expect("ssh-keygen runs (openssh-client)");
        assert!(out.status.success(), "{out:?}");
        let public = std::fs::read_to_string(key_path.with_extension("pub")).unwrap();
        let policy = Policy {
            allowed: Some(
                AllowedSigners::parse(
                    &format!("b@box namespaces=\"oracle-build\" {}", public.trim()),
                    "allowed_signers",
                )
                .unwrap(),
            ),
            min_signatures: 1,
        };
        let inputs = serde_json::json!({ "stage": "autolock", "host": "x" });
        let key = crate::store::key::content_key(&inputs);
        // The signed lock, and its signature as its own artifact.
        let good = lock(&key, &"3".repeat(64));
        put(&t, &good, &good.tag().unwrap(), tmp.path());
        let st = Statement::for_lock(
            &key,
            &inputs,
            lock_files(&good.config),
            "b@box",
            "2026-12-01T10:00:00Z",
        );
        let att = trust::sign(&st, &SigningKey::load(&key_path).unwrap()).unwrap();
        let art = attest::artifact(&att, &tmp.path().join("att")).unwrap();
        put(&t, &art, &art.tag().unwrap(), tmp.path());
        assert!(art.tag().unwrap().starts_with(&format!("att-lock-{key}-")));
        // The same lock edited (the runtime set changed): the statement is
        // not about its files.
        let edited = lock(&key, &"4".repeat(64));
        put(&t, &edited, &edited.tag().unwrap(), tmp.path());

        let tags = TagList::read(&t).unwrap();
        let s = signed(
            &t,
            &tags,
            Kind::Lock,
            &key,
            lock_files,
            &tmp.path().join("scratch"),
        )
        .unwrap();
        assert_eq!(s.candidates.len(), 2, "{:?}", s.problems);
        assert_eq!(s.attestations, vec![att]);
        assert_eq!(trust::LOCK, Kind::Lock.name());
        for c in &s.candidates {
            let v = s.verdict(c, &policy);
            // Every reader's verdict (cache ls, pull, build) is this one.
            assert_eq!(
                lock_trust(&c.config, &s.attestations, &policy, None),
                LockTrust::Signed { verdict: v.clone() }
            );
            let is_good = c.config.files == good.config.files;
            assert_eq!(v.is_trusted(), is_good, "{}: {v}", c.tag);
        }
    }
}
