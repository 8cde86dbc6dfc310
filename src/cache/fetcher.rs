//! Downloading store entries from one cache into one staging directory,
//! then into the store: what `pull` and `build`'s substitution share.
//!
//! Two phases. [`Fetcher::prepare`] (and [`Fetcher::prepare_source`]) look
//! a tag up, download its config and layers into one staging directory
//! (every blob checked against its digest by the transport, then every
//! file against the config's list) and check the entry the way its stage
//! would: a wheelhouse file against the sha256 the lock gives it (its
//! name), a wheel against its `build.json` and `manifest.json`, a tree
//! against the path rules `import` applies, an external tree against its
//! commit. Nothing is in the store yet. [`Fetcher::commit`] then moves each
//! prepared entry into the store by one rename under the entry's lock
//! (entries that appeared meanwhile are kept), and fetches a source bundle
//! into the mirror ([`super::source_bundle`]). A pull that fails in the
//! first phase writes nothing.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::{Context, Result, anyhow, bail};
use fs_err as fs;

use super::Transport;
use super::accept::{WheelPolicy, bytecode_files, crates_files, lock_files};
use super::artifact::{self, Config, Kind, layer_title};
use super::inputs_record::InputsRecord;
use super::listing::{self, TagList};
use crate::stages::{source, wheel, wheelhouse};
use crate::store::{Bucket, Entry, Manifest, Staging, Store, TempRoots, sha256_file};

/// How many blob requests a pull keeps in flight (see [`Fetcher::prefetch`]).
pub const PARALLEL: usize = 8;

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
    /// Whether an ext entry's tag may be confirmed over the network
    /// ([`super::ext_trust::judge`]).
    pub reach: super::ext_trust::Reach,
    /// The commits a trusted wheel's key inputs vouch for (`pull`).
    pub vouched: Vec<super::ext_trust::Vouched>,
    /// The cache's trust policy, for what a reader judges by signatures
    /// outside a wheel's or a lock's own policy (an ext entry's tag claim);
    /// `None`: nothing is trusted by signature.
    pub policy: Option<super::trust::Policy>,
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
            reach: super::ext_trust::Reach::Online,
            vouched: Vec::new(),
            policy: None,
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
    pub(crate) fn tag_list(&mut self) -> Result<Rc<TagList>> {
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
        let mut tags = self.candidates(kind, name, preferred)?;
        let url = self.cache.describe();
        if kind == Kind::Lock
            && tags.len() > 1
            && preferred.is_none_or(|p| tags.first().map(String::as_str) != Some(p))
        {
            // Under a trust policy, a lock no trusted key vouches for is an
            // untrusted pusher's: it is never taken, so it cannot make the
            // trusted one ambiguous (as an untrusted wheel cannot), nor be
            // the one tried (unless every one is: then the first is
            // refused, naming why).
            let attestations = match &self.policy {
                Some(_) => {
                    let list = self.tag_list()?;
                    let dir = self.fresh_dir()?;
                    listing::signed(self.cache, &list, kind, name, lock_files, &dir)?.attestations
                }
                None => Vec::new(),
            };
            let mut contents = Vec::new();
            let mut untrusted = Vec::new();
            for (i, t) in tags.iter().enumerate() {
                let dir = self.staging.path().join(format!("lock-{i}"));
                if let Ok(Some(r)) = self.read_config(t, kind, &dir) {
                    if let Some(policy) = &self.policy
                        && matches!(
                            super::trust::verify_lock(
                                name,
                                &lock_files(&r.config),
                                &attestations,
                                policy
                            ),
                            super::trust::Verdict::Untrusted { .. }
                        )
                    {
                        untrusted.push(t.clone());
                        continue;
                    }
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
            if untrusted.len() < tags.len() {
                tags.retain(|t| !untrusted.contains(t));
            }
        }
        let mut refused = Vec::new();
        let mut unreachable = false;
        for t in &tags {
            match self.download_tag(kind, name, t) {
                // An external tree must be its commit's (and the commit the
                // declaration's): else the next artifact is tried.
                Ok(Some(got)) if kind == Kind::Ext => {
                    let scratch = self.fresh_dir()?.join("git");
                    // A signed statement of its tag's commit vouches too.
                    let mut vouched = self.vouched.clone();
                    vouched.extend(self.signed_ext_claim(&got.1, name)?);
                    let judged = super::ext_trust::judge(
                        self.store, &got.1, name, &scratch, self.reach, &vouched,
                    );
                    match judged {
                        Ok(_) => return Ok(Some(got)),
                        Err(e) => refused.push(format!("cache {url}: refusing {t}: {e:#}")),
                    }
                }
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

    pub(crate) fn fresh_dir(&mut self) -> Result<PathBuf> {
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
    pub(crate) fn read_config(
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

    /// Every attestation of entry `kind` `name` this cache holds, read with
    /// its artifacts ([`listing::signed`]; `files_of` gives the files a
    /// statement names): what a signed kind is judged with.
    ///
    /// Errors: the cache cannot be read.
    fn attestations_of(
        &mut self,
        kind: Kind,
        name: &str,
        files_of: fn(&Config) -> Vec<super::trust::FileDigest>,
    ) -> Result<Vec<super::trust::Attestation>> {
        let tags = self.tag_list()?;
        let scratch = self.fresh_dir()?;
        let signed = listing::signed(self.cache, &tags, kind, name, files_of, &scratch)?;
        let _ = fs::remove_dir_all(&scratch);
        Ok(signed.attestations)
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
    pub(crate) fn choose_wheel(
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
            Bucket::Crates => {
                let problems = crate::stages::rust::crates::check(&dir, &entry.name);
                if !problems.is_empty() {
                    return Err(refuse(problems.join("; ")));
                }
                // What the check cannot see (a vendored file rewritten with
                // its checksum line): taken only when signed.
                let atts = self.attestations_of(Kind::Crates, &entry.name, crates_files)?;
                policy(&config, &atts).map_err(|e| refuse(format!("{e:#}")))?;
            }
            Bucket::Locks if !dir.join(crate::stages::lock::LOCK_JSON).is_file() => {
                return Err(refuse("no lock.json".into()));
            }
            Bucket::Bytecode => {
                // Code: its record and headers checked, then judged with
                // every attestation of its key the cache holds.
                crate::host::bytecode::check_entry(&dir, &entry.name)
                    .map_err(|e| refuse(format!("{e:#}")))?;
                let atts = self.attestations_of(Kind::Bytecode, &entry.name, bytecode_files)?;
                policy(&config, &atts).map_err(|e| refuse(format!("{e:#}")))?;
            }
            Bucket::Locks => {
                // Judged with every attestation of its key the cache holds.
                let atts = self.attestations_of(Kind::Lock, &entry.name, lock_files)?;
                policy(&config, &atts).map_err(|e| refuse(format!("{e:#}")))?;
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
    pub(crate) fn inputs(
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

    /// The claim of the ext entry downloaded at `dir` (for entry `name`)
    /// that its tag named its commit, when every `att-ext-tag-` statement
    /// of it this cache holds is trusted under [`Fetcher::policy`].
    ///
    /// Errors: the cache cannot be read.
    fn signed_ext_claim(
        &mut self,
        dir: &Path,
        name: &str,
    ) -> Result<Option<super::ext_trust::Vouched>> {
        let (Some(policy), Some((repo, tag, commit))) =
            (self.policy.clone(), super::ext_trust::claim_of(dir))
        else {
            return Ok(None);
        };
        use super::trust::{EXT_TAG, ext_tag_inputs};
        let key = crate::store::key::content_key(&ext_tag_inputs(&repo, &tag, &commit));
        let list = self.tag_list()?;
        let scratch = self.fresh_dir()?;
        let found = listing::attestations(self.cache, &list, EXT_TAG, &key, &scratch)?;
        Ok(super::ext_trust::signed_claim(
            dir,
            name,
            &found.attestations,
            &[policy],
        ))
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
