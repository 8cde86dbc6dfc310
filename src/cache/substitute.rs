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

use super::Transport;
use super::artifact::{self, Config, Kind, TREE_LAYER, layer_title};
use crate::host::process::capture;
use crate::stages::{source, wheel, wheelhouse};
use crate::store::{Bucket, Entry, Manifest, Staging, Store, TempRoots, sha256_file};

/// What the trust policy says of a wheel's config (its signatures): `Ok`
/// to accept it, an error naming why not.
pub type WheelPolicy<'a> = &'a dyn Fn(&Config) -> Result<()>;

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
}

/// Downloads from one cache into one staging directory of one store.
pub struct Fetcher<'a> {
    /// The cache.
    pub cache: &'a dyn Transport,
    /// The store.
    pub store: &'a Store,
    staging: Staging,
    n: usize,
}

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
        })
    }

    fn fresh_dir(&mut self) -> Result<PathBuf> {
        self.n += 1;
        let d = self.staging.path().join(format!("{}", self.n));
        fs::create_dir_all(&d)?;
        Ok(d)
    }

    /// Downloads the artifact tagged `tag` of `kind` for the entry `name`:
    /// `None` when the cache has no such tag. Returns the config, the
    /// directory with the entry's files and the manifest digest.
    fn download(
        &mut self,
        kind: Kind,
        name: &str,
    ) -> Result<Option<(Config, PathBuf, String, u64)>> {
        let tag = artifact::tag(kind, name);
        let Some(got) = self.cache.manifest(&tag)? else {
            return Ok(None);
        };
        let url = self.cache.describe();
        let m = artifact::parse_manifest(&got.bytes, kind, &tag)
            .with_context(|| format!("cache {url}"))?;
        let work = self.fresh_dir()?;
        let config_path = work.join("config.json");
        let size = u64::try_from(m.config.size).unwrap_or(0);
        self.cache.get_blob(&m.config.digest, size, &config_path)?;
        let config: Config = crate::store::read_json(&config_path)
            .with_context(|| format!("cache {url}: the config of {tag}"))?;
        if config.kind != kind || config.name != name {
            bail!(
                "cache {url}: {tag} carries {:?} {}, not {kind:?} {name}",
                config.kind,
                config.name
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
            self.cache.get_blob(&l.digest, size, &dest)?;
            bytes += size;
            if title == TREE_LAYER && l.media_type == artifact::TAR_MEDIA_TYPE {
                artifact::unpack_tree(&dest, &dir)
                    .with_context(|| format!("cache {url}: refusing {tag} (layer {})", l.digest))?;
            } else {
                fs::rename(&dest, dir.join(title))?;
            }
        }
        check_files(&dir, &config).with_context(|| format!("cache {url}: refusing {tag}"))?;
        Ok(Some((config, dir, got.digest, bytes)))
    }

    /// Prepares the store entry `entry` (lock, wheelhouse, ext or wheel)
    /// from the cache: `None` on a miss. A wheel must satisfy `policy`.
    ///
    /// Errors: the cache fails; a digest, file or record does not match
    /// (the message names the digest or file); the policy refuses.
    pub fn prepare(&mut self, entry: &Entry, policy: WheelPolicy<'_>) -> Result<Option<Prepared>> {
        let kind = Kind::of_bucket(entry.bucket)
            .ok_or_else(|| anyhow!("{} entries are not in caches", entry.bucket.dir_name()))?;
        let Some((config, dir, digest, bytes)) = self.download(kind, &entry.name)? else {
            return Ok(None);
        };
        let url = self.cache.describe();
        let tag = artifact::tag(kind, &entry.name);
        let refuse = |why: String| anyhow!("cache {url}: refusing {tag}: {why}");
        match entry.bucket {
            Bucket::Wheelhouse => {
                let e = Entry {
                    path: dir.clone(),
                    ..entry.clone()
                };
                let f = wheelhouse::file_of(&e).map_err(|e| refuse(format!("{e:#}")))?;
                let got = sha256_file(&f)?;
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
                let got =
                    sha256_file(&rec.wheel_path(&dir)).map_err(|e| refuse(format!("{e:#}")))?;
                if got != rec.sha256 {
                    return Err(refuse(format!(
                        "{} has sha256 {got}, its build.json says {}",
                        rec.wheel, rec.sha256
                    )));
                }
                let problems = Manifest::read(&dir)
                    .map_or_else(|e| vec![format!("{e:#}")], |m| m.check(&dir, true));
                if !problems.is_empty() {
                    return Err(refuse(problems.join("; ")));
                }
                policy(&config).map_err(|e| refuse(format!("{e:#}")))?;
            }
            Bucket::Ext => {
                if !dir.join("ext.json").is_file() {
                    return Err(refuse("no ext.json".into()));
                }
            }
            Bucket::Locks => {
                if !dir.join(crate::stages::lock::LOCK_JSON).is_file() {
                    return Err(refuse("no lock.json".into()));
                }
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
        }))
    }

    /// Prepares the source of `commit` of `repo` (a git bundle for the
    /// mirror): `None` on a miss.
    ///
    /// Errors: as [`Fetcher::prepare`]; the bundle is not for that commit.
    pub fn prepare_source(&mut self, repo: &str, commit: &str) -> Result<Option<Prepared>> {
        let Some((config, dir, digest, bytes)) = self.download(Kind::Source, commit)? else {
            return Ok(None);
        };
        let bundle = dir.join(SOURCE_BUNDLE);
        if !bundle.is_file() {
            bail!(
                "cache {}: {} has no {SOURCE_BUNDLE}",
                self.cache.describe(),
                artifact::tag(Kind::Source, commit)
            );
        }
        Ok(Some(Prepared {
            entry: source::mirror_entry(self.store, repo),
            dir: bundle,
            config,
            digest,
            repo: Some(repo.to_string()),
            bytes,
        }))
    }

    /// Moves every prepared entry into the store (see the module docs),
    /// each registered in `temp` first; returns the labels added.
    ///
    /// Errors: a rename or the git fetch fails.
    pub fn commit(&self, items: Vec<Prepared>, temp: &TempRoots) -> Result<Vec<String>> {
        let mut added = Vec::new();
        for p in items {
            temp.add(self.store, &p.entry)?;
            if let (Some(repo), Some(commit)) = (&p.repo, Some(&p.config.name)) {
                fetch_bundle(self.store, repo, &p.dir, self.staging.path())?;
                if !source::mirror_has(self.store, repo, commit) {
                    bail!("the source bundle from the cache does not hold commit {commit}");
                }
                added.push(format!("{} ({commit})", p.entry.label()));
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

/// The name of the git bundle layer of a source artifact.
pub const SOURCE_BUNDLE: &str = "source.bundle";

/// Every regular file under `dir` matches the config's list (same paths,
/// sizes and sha256) and nothing else is there.
fn check_files(dir: &Path, config: &Config) -> Result<()> {
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
        let (size, sha) = (fs::metadata(&p)?.len(), sha256_file(&p)?);
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

/// Fetches the git bundle `bundle` (the commit under
/// `refs/oracle-build/pins/` and its tags) into the mirror of `repo`,
/// creating the mirror in `scratch` and renaming it into place when absent.
///
/// Errors: git fails.
pub fn fetch_bundle(store: &Store, repo: &str, bundle: &Path, scratch: &Path) -> Result<()> {
    let git =
        which::which("git").context("taking a source from a cache needs the git command line")?;
    let mirror = source::mirror_entry(store, repo);
    let _lock = mirror.lock()?;
    let bundle = bundle.display().to_string();
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
        let dir = scratch.join("mirror.git");
        git2::Repository::init_bare(&dir)?;
        fetch(&dir)?;
        fs::create_dir_all(store.bucket_dir(Bucket::Git))?;
        fs::rename(&dir, &mirror.path)?;
    }
    Ok(())
}
