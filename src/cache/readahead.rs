//! A cache read ahead (issue 23). `pull` reads the manifest and config of
//! every artifact of a pin's entries and of every attestation of their
//! keys, one after another: about 80 manifests and 60 configs for an
//! oracle, each a round trip. [`ReadAhead::warm`] takes the tags such an
//! operation will read and fetches their manifests
//! ([`Transport::manifests`]) many requests at a time; their config blobs
//! are fetched with the next batch of blobs asked of it (`pull` asks for
//! every layer next, so the configs cost no round trip of their own), or
//! at once when one of them is read first. The [`Transport`] it
//! implements then serves those from memory and from its own staging
//! directory and passes everything else to the cache.
//!
//! Nothing is trusted more for being read ahead: each manifest and blob was
//! checked against its digest by the cache's transport on arrival, exactly
//! as a direct read is, and the reader checks it again as before. A read
//! ahead that failed (an error, a stall) is remembered and returned when
//! that tag or blob is asked for, so the error is reported where it always
//! was, and a stalled cache costs one timeout, not one ahead and one again.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};

use super::artifact::{self, Kind};
use super::bounds::{Unreachable, is_unreachable};
use super::{BlobGet, Fetched, Transport};
use crate::store::{Staging, Store};

/// A [`Transport`] in front of `inner` that serves what
/// [`ReadAhead::warm`] fetched.
pub struct ReadAhead<'a> {
    inner: &'a dyn Transport,
    staging: Staging,
    /// Manifests read ahead by tag (`None`: the cache has no such tag).
    manifests: RefCell<HashMap<String, Ahead<Option<Fetched>>>>,
    /// Config blobs read ahead: digest -> (size, checked file in `staging`).
    blobs: RefCell<HashMap<String, (u64, PathBuf)>>,
    /// Config blobs whose read ahead failed: digest -> (size, the failure).
    failed: RefCell<HashMap<String, (u64, Failure)>>,
    /// Config blobs named by manifests read ahead, not fetched yet: they
    /// go with the next [`Transport::get_blobs`] (see [`ReadAhead::fetch`]).
    pending: RefCell<Vec<BlobGet>>,
}

/// What a read ahead gave: the value, or how it failed.
type Ahead<T> = std::result::Result<T, Failure>;

/// A failed read ahead, kept to be returned when it is asked for: its
/// message and whether the cache was unreachable ([`Unreachable`], which
/// `build` reports and skips the cache for).
#[derive(Debug, Clone)]
struct Failure {
    message: String,
    unreachable: bool,
}

impl Failure {
    fn of(e: &anyhow::Error) -> Failure {
        Failure {
            message: format!("{e:#}"),
            unreachable: is_unreachable(e),
        }
    }

    fn error(&self) -> anyhow::Error {
        if self.unreachable {
            anyhow!(Unreachable(self.message.clone()))
        } else {
            anyhow!(self.message.clone())
        }
    }
}

impl<'a> ReadAhead<'a> {
    /// A read-ahead of `inner`, its blobs in a new staging directory of
    /// `store` (removed when it is dropped).
    ///
    /// Errors: the staging directory cannot be made.
    pub fn new(inner: &'a dyn Transport, store: &Store) -> Result<ReadAhead<'a>> {
        Ok(ReadAhead {
            inner,
            staging: store.stage("read-ahead")?,
            manifests: RefCell::default(),
            blobs: RefCell::default(),
            failed: RefCell::default(),
            pending: RefCell::default(),
        })
    }

    /// Fetches the manifests of `tags` (each an artifact of its kind) not
    /// read ahead yet, many at a time, and notes the config blob each names:
    /// those are fetched with the next batch of blobs asked of this
    /// transport, or as soon as one of them is read. Nothing fails here:
    /// what cannot be had now is left for the read that asks for it.
    pub fn warm(&self, tags: &[(Kind, String)]) {
        let mut seen = HashSet::new();
        let todo: Vec<(Kind, String)> = tags
            .iter()
            .filter(|(_, t)| !self.manifests.borrow().contains_key(t) && seen.insert(t.clone()))
            .cloned()
            .collect();
        let names: Vec<String> = todo.iter().map(|(_, t)| t.clone()).collect();
        let results = self.inner.manifests(&names);
        let mut gets: Vec<BlobGet> = Vec::new();
        for ((kind, tag), got) in todo.into_iter().zip(results) {
            let got = got.map_err(|e| Failure::of(&e));
            if let Ok(Some(f)) = &got
                && let Ok(m) = artifact::parse_manifest(&f.bytes, kind, &tag)
                && let Ok(hex) = super::digest_hex(&m.config.digest)
                && !self.blobs.borrow().contains_key(&m.config.digest)
                && !self.is_pending(&m.config.digest)
                && !gets.iter().any(|g| g.digest == m.config.digest)
            {
                gets.push(BlobGet {
                    digest: m.config.digest.clone(),
                    size: u64::try_from(m.config.size).unwrap_or(0),
                    dest: self.staging.path().join(hex),
                });
            }
            self.manifests.borrow_mut().insert(tag, got);
        }
        self.pending.borrow_mut().extend(gets);
    }

    /// Whether the config blob `digest` waits to be fetched.
    fn is_pending(&self, digest: &str) -> bool {
        self.pending.borrow().iter().any(|g| g.digest == digest)
    }

    /// Fetches `rest` from the cache in one batch with the pending config
    /// blobs (first: they are small), keeps those as read ahead, and
    /// returns the results for `rest`, in order.
    fn fetch(&self, rest: &[BlobGet]) -> Vec<Result<()>> {
        let pending = std::mem::take(&mut *self.pending.borrow_mut());
        if pending.is_empty() {
            return self.inner.get_blobs(rest);
        }
        let all: Vec<BlobGet> = pending.iter().chain(rest).cloned().collect();
        let mut results = self.inner.get_blobs(&all);
        let tail = results.split_off(pending.len().min(results.len()));
        for (g, r) in pending.into_iter().zip(results) {
            if let Err(e) = r {
                let failure = (g.size, Failure::of(&e));
                self.failed.borrow_mut().insert(g.digest, failure);
            } else {
                self.blobs.borrow_mut().insert(g.digest, (g.size, g.dest));
            }
        }
        tail
    }

    /// Fetches the pending config blobs when `digest` is one of them.
    fn settle(&self, digest: &str) {
        if self.is_pending(digest) {
            self.fetch(&[]);
        }
    }

    /// The checked file of blob `digest` of `size` bytes, when read ahead.
    fn blob(&self, digest: &str, size: u64) -> Option<PathBuf> {
        self.blobs
            .borrow()
            .get(digest)
            .filter(|(s, _)| *s == size)
            .map(|(_, p)| p.clone())
    }
}

impl Transport for ReadAhead<'_> {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn manifest(&self, tag: &str) -> Result<Option<Fetched>> {
        if let Some(got) = self.manifests.borrow().get(tag) {
            return got.clone().map_err(|f| f.error());
        }
        self.inner.manifest(tag)
    }

    fn has_blob(&self, digest: &str) -> Result<bool> {
        self.settle(digest);
        if self.blobs.borrow().contains_key(digest) {
            return Ok(true);
        }
        self.inner.has_blob(digest)
    }

    fn get_blob(&self, digest: &str, size: u64, dest: &Path) -> Result<()> {
        self.settle(digest);
        if let Some((s, f)) = self.failed.borrow().get(digest)
            && *s == size
        {
            return Err(f.error());
        }
        if let Some(file) = self.blob(digest, size)
            && (std::fs::hard_link(&file, dest).is_ok() || std::fs::copy(&file, dest).is_ok())
        {
            return Ok(());
        }
        self.inner.get_blob(digest, size, dest)
    }

    fn get_blobs(&self, blobs: &[BlobGet]) -> Vec<Result<()>> {
        if blobs.iter().any(|b| self.is_pending(&b.digest)) {
            self.fetch(&[]);
        }
        let ahead = |b: &BlobGet| {
            self.blob(&b.digest, b.size).is_some() || self.failed.borrow().contains_key(&b.digest)
        };
        let rest: Vec<BlobGet> = blobs.iter().filter(|b| !ahead(b)).cloned().collect();
        let mut from_cache = self.fetch(&rest).into_iter();
        blobs
            .iter()
            .map(|b| {
                if ahead(b) {
                    self.get_blob(&b.digest, b.size, &b.dest)
                } else {
                    from_cache.next().unwrap_or_else(|| {
                        Err(anyhow!(
                            "cache {}: blob {} was not fetched",
                            self.describe(),
                            b.digest
                        ))
                    })
                }
            })
            .collect()
    }

    fn put_blob(&self, src: &Path, digest: &str, size: u64) -> Result<bool> {
        self.inner.put_blob(src, digest, size)
    }

    fn put_manifest(&self, tag: &str, bytes: &[u8]) -> Result<String> {
        self.inner.put_manifest(tag, bytes)
    }

    fn tags(&self) -> Result<Vec<String>> {
        self.inner.tags()
    }

    fn delete_manifest(&self, digest: &str) -> Result<()> {
        self.inner.delete_manifest(digest)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::cache::artifact::Artifact;
    use crate::cache::layout::Layout;
    use crate::cache::listing;

    /// A layout that counts the manifest and blob reads that reach it.
    struct Counting {
        layout: Layout,
        manifests: Cell<usize>,
        blobs: Cell<usize>,
        /// Calls of `get_blobs` (each a batch of requests in flight at once).
        batches: Cell<usize>,
        /// A tag whose manifest read fails as a stall would.
        stalled: String,
    }

    impl Transport for Counting {
        fn describe(&self) -> String {
            self.layout.describe()
        }
        fn manifest(&self, tag: &str) -> Result<Option<Fetched>> {
            self.manifests.set(self.manifests.get() + 1);
            if tag == self.stalled {
                anyhow::bail!(crate::cache::bounds::Unreachable(format!("{tag}: stalled")));
            }
            self.layout.manifest(tag)
        }
        fn has_blob(&self, digest: &str) -> Result<bool> {
            self.layout.has_blob(digest)
        }
        fn get_blob(&self, digest: &str, size: u64, dest: &Path) -> Result<()> {
            self.blobs.set(self.blobs.get() + 1);
            self.layout.get_blob(digest, size, dest)
        }
        fn get_blobs(&self, blobs: &[BlobGet]) -> Vec<Result<()>> {
            self.batches.set(self.batches.get() + 1);
            blobs
                .iter()
                .map(|b| self.get_blob(&b.digest, b.size, &b.dest))
                .collect()
        }
        fn put_blob(&self, src: &Path, digest: &str, size: u64) -> Result<bool> {
            self.layout.put_blob(src, digest, size)
        }
        fn put_manifest(&self, tag: &str, bytes: &[u8]) -> Result<String> {
            self.layout.put_manifest(tag, bytes)
        }
        fn tags(&self) -> Result<Vec<String>> {
            self.layout.tags()
        }
    }

    impl Counting {
        /// `layout`, nothing read yet; a manifest read of `stalled` fails.
        fn new(layout: Layout, stalled: String) -> Counting {
            Counting {
                layout,
                manifests: Cell::new(0),
                blobs: Cell::new(0),
                batches: Cell::new(0),
                stalled,
            }
        }
    }

    fn wheel(key: &str) -> Artifact {
        listing::tests::wheel(key, &"1".repeat(64), Vec::new())
    }

    #[test]
    fn what_was_read_ahead_is_served_without_asking_the_cache_again() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::open(&tmp.path().join("layout"), "file:///layout").unwrap();
        let (a, b) = (wheel(&"a".repeat(32)), wheel(&"b".repeat(32)));
        let (ta, tb) = (a.tag().unwrap(), b.tag().unwrap());
        listing::tests::put(&layout, &a, &ta, tmp.path());
        listing::tests::put(&layout, &b, &tb, tmp.path());
        let cache = Counting::new(layout, format!("wheel-{}", "e".repeat(32)));
        let store = Store::at(&tmp.path().join("store")).unwrap();
        store.init().unwrap();
        let ahead = ReadAhead::new(&cache, &store).unwrap();
        let gone = format!("wheel-{}", "c".repeat(32));
        let stalled = cache.stalled.clone();
        ahead.warm(&[
            (Kind::Wheel, ta.clone()),
            (Kind::Wheel, gone.clone()),
            (Kind::Wheel, stalled.clone()),
        ]);
        // The config is fetched when first read (no batch came first).
        assert_eq!((cache.manifests.get(), cache.blobs.get()), (3, 0));

        // Read as every reader reads: the manifest and config checked.
        let read = listing::read_config(&ahead, &ta, Kind::Wheel, &tmp.path().join("s1"))
            .unwrap()
            .unwrap();
        assert_eq!(read.config.name, "a".repeat(32));
        assert!(ahead.manifest(&gone).unwrap().is_none());
        assert_eq!((cache.manifests.get(), cache.blobs.get()), (3, 1));

        // A read ahead that failed is returned as it failed, not asked again.
        let err = ahead.manifest(&stalled).unwrap_err();
        assert!(crate::cache::bounds::is_unreachable(&err), "{err:#}");
        assert_eq!((cache.manifests.get(), cache.blobs.get()), (3, 1));

        // What was not read ahead goes to the cache.
        let read = listing::read_config(&ahead, &tb, Kind::Wheel, &tmp.path().join("s2"))
            .unwrap()
            .unwrap();
        assert_eq!(read.config.name, "b".repeat(32));
        assert_eq!((cache.manifests.get(), cache.blobs.get()), (4, 2));
    }

    #[test]
    fn configs_read_ahead_go_with_the_next_batch_of_blobs() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::open(&tmp.path().join("layout"), "file:///layout").unwrap();
        let a = wheel(&"a".repeat(32));
        let ta = a.tag().unwrap();
        listing::tests::put(&layout, &a, &ta, tmp.path());
        let layer = tmp.path().join("layer");
        std::fs::write(&layer, b"a layer").unwrap();
        let layer_digest = crate::cache::digest_of(b"a layer");
        layout.put_blob(&layer, &layer_digest, 7).unwrap();
        let cache = Counting::new(layout, String::new());
        let store = Store::at(&tmp.path().join("store")).unwrap();
        store.init().unwrap();
        let ahead = ReadAhead::new(&cache, &store).unwrap();
        ahead.warm(&[(Kind::Wheel, ta.clone())]);
        assert_eq!((cache.blobs.get(), cache.batches.get()), (0, 0));

        // The next batch asked for (the layers) carries the config too.
        let dest = tmp.path().join("got-layer");
        let got = ahead.get_blobs(&[BlobGet {
            digest: layer_digest,
            size: 7,
            dest: dest.clone(),
        }]);
        assert!(got.iter().all(Result::is_ok), "{got:?}");
        assert_eq!(std::fs::read(&dest).unwrap(), b"a layer");
        assert_eq!((cache.blobs.get(), cache.batches.get()), (2, 1));

        // The config is then served from what was read ahead.
        let read = listing::read_config(&ahead, &ta, Kind::Wheel, &tmp.path().join("s"))
            .unwrap()
            .unwrap();
        assert_eq!(read.config.name, "a".repeat(32));
        assert_eq!((cache.manifests.get(), cache.blobs.get()), (1, 2));
    }
}
