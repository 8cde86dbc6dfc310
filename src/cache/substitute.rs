//! `build`'s substitution: taking a stage's entry from the first cache
//! that has it (and trusts it) instead of doing the work ([`Substituter`]),
//! through a [`Fetcher`] per cache; and what `plan` shows of a cache
//! ([`Lookup`]).

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use anyhow::{Result, anyhow};

use super::Transport;
use super::accept::{accept, lock_files, policy_of};
use super::artifact::{Config, Kind};
use super::fetcher::Fetcher;
use super::listing;
use super::listing::TagList;
use super::trust::Attestation;
use crate::stages::{source, wheelhouse};
use crate::store::{Bucket, Entry, Store, TempRoots};

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
    /// See [`Fetcher::reach`].
    reach: super::ext_trust::Reach,
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
            reach: super::ext_trust::Reach::Online,
        })
    }

    /// The same, for a build that may not use the network (`--offline`):
    /// an external tree's tag is not confirmed ([`Fetcher::reach`]).
    pub fn offline(mut self, offline: bool) -> Substituter<'a> {
        if offline {
            self.reach = super::ext_trust::Reach::Offline;
        }
        self
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
        f.policy = Some(self.caches[i].1.clone());
        f.reach = self.reach;
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
    /// it, into the mirror (as [`Substituter::entry`]); with
    /// `confirmed_only` (the mirror holds the commit, with tags kept
    /// aside), only a source whose tags trusted builders signed.
    ///
    /// Errors: the store cannot be written.
    pub fn source(
        &self,
        repo: &str,
        commit: &str,
        confirmed_only: bool,
        temp: &TempRoots,
    ) -> Result<Option<String>> {
        for (i, (t, policy)) in self.live() {
            let got = self.fetcher(i, false).and_then(|mut f| {
                match f.prepare_source(repo, commit, None, policy)? {
                    Some(p)
                        if confirmed_only && !p.tags.as_ref().is_some_and(|t| t.is_confirmed()) =>
                    {
                        Ok(None)
                    }
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
/// lock, every external source the commit's CMake files declare and the
/// crates of each of its `Cargo.lock` files that the store lacks. Returns
/// the stages taken from a cache (`source`, `lock`, `wheelhouse`, `ext`,
/// `crates`), each once.
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
    // A mirror holding the commit with tags kept aside takes a source
    // whose tags trusted builders signed, which confirms them.
    let mirrored = source::mirror_has(store, &r.source.repo, &r.source.commit);
    if source::source_wanted(store, &r.source.repo, &r.source.commit)
        && subs
            .source(&r.source.repo, &r.source.commit, mirrored, temp)?
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
    // The crates of the commit's Cargo.lock files (a tree that builds Rust).
    if let Ok(Some(tree)) = crate::stages::rust::discover_in_mirror(
        &mirror.path,
        &r.source.commit,
        &r.build.target_device,
    ) {
        let mut hit = false;
        for l in &tree.locks {
            let e = crate::stages::rust::crates::entry(store, l);
            if !e.exists() && subs.entry(&e, temp)?.is_some() {
                hit = true;
            }
        }
        if hit {
            taken.push("crates".to_string());
        }
    }
    Ok(taken)
}
