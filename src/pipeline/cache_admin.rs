//! The engine of `oracle-build cache ls|verify|gc` (docs/cache.md): every
//! artifact of a cache inspected under its policy ([`list`]), and what a
//! cache `gc` deletes and keeps for this store's roots ([`collect`]); the
//! command (`ops::cache`) renders them.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use crate::cache::artifact::{self, Kind};
use crate::cache::catalog;
use crate::cache::config::Cache;
use crate::cache::inspect::{self, Inspected};
use crate::cache::substitute::InputsRecord;
use crate::cache::trust::Policy;
use crate::exit::bad_input;
use crate::store::{Bucket, Store, gc};

/// The artifacts of one cache (`ls`, `verify`).
#[derive(Debug, Serialize)]
pub struct Listing {
    /// The cache's name.
    pub name: String,
    /// Its URL.
    pub url: String,
    /// Its oracle-build artifacts, by tag.
    pub artifacts: Vec<Inspected>,
    /// Tags that are not oracle-build artifacts (left alone).
    pub other_tags: Vec<String>,
    /// The wheels' signed provenance artifacts, each checked
    /// ([`crate::cache::provenance::inspect`]).
    pub provenance: Vec<crate::cache::provenance::Checked>,
}

/// What `gc` did (or would do) to one cache.
#[derive(Debug, Serialize)]
pub struct Collected {
    /// The cache's name.
    pub name: String,
    /// Its URL.
    pub url: String,
    /// Whether nothing was deleted.
    pub dry_run: bool,
    /// The tags deleted (or that would be).
    pub deleted: Vec<String>,
    /// The tags kept because a root reaches them.
    pub kept: Vec<String>,
    /// Blobs no tag references any more, removed (or that would be);
    /// layouts only.
    pub blobs: Vec<String>,
    /// Their bytes.
    pub blob_bytes: u64,
}

/// The reviewed lockfiles a lock may be pinned by without `--lockfiles`:
/// `$ORACLE_BUILD_LOCKFILES`, else `./lockfiles`.
pub fn lockfiles_root() -> std::path::PathBuf {
    std::env::var_os("ORACLE_BUILD_LOCKFILES")
        .filter(|v| !v.is_empty())
        .map_or_else(|| std::path::PathBuf::from("lockfiles"), Into::into)
}

/// A scratch directory: in the store's `tmp/` when there is a writable
/// store (big wheels), else the system's.
fn scratch(store: Option<&Store>) -> Result<tempfile::TempDir> {
    Ok(match store {
        Some(s) if !s.read_only() => {
            fs_err::create_dir_all(s.tmp_dir())?;
            tempfile::Builder::new()
                .prefix("cache-")
                .tempdir_in(s.tmp_dir())?
        }
        _ => tempfile::tempdir()?,
    })
}

/// Every artifact of cache `c`, inspected (`deep`: layers too; a lock
/// pinned by a reviewed lockfile under `lockfiles` is labelled so), for
/// `cache ls` and `cache verify`.
///
/// Errors: the cache cannot be opened or listed; its policy's key files
/// are bad (exit 2).
pub fn list(c: &Cache, deep: bool, store: Option<&Store>, lockfiles: &Path) -> Result<Listing> {
    let t = crate::cache::open(c)?;
    let policy = Policy::for_cache(c)?;
    let tmp = scratch(store)?;
    let mut artifacts = Vec::new();
    let mut other_tags = Vec::new();
    let tags = t.tags()?;
    let atts = inspect::attestations(t.as_ref(), &tags, &tmp.path().join("atts"))?;
    let mut provenance = Vec::new();
    for (i, tag) in tags.into_iter().enumerate() {
        let dir = tmp.path().join(i.to_string());
        if crate::cache::provenance::key_of_tag(&tag).is_some() {
            provenance.push(crate::cache::provenance::inspect(
                t.as_ref(),
                &tag,
                &policy,
                &dir,
            ));
            continue;
        }
        match inspect::inspect(
            t.as_ref(),
            &tag,
            &policy,
            Some(lockfiles),
            deep,
            &dir,
            &atts,
        )? {
            Some(a) => artifacts.push(a),
            None => other_tags.push(tag),
        }
    }
    Ok(Listing {
        name: c.name.clone(),
        url: c.url.to_string(),
        artifacts,
        other_tags,
        provenance,
    })
}

/// The tags this store's roots reach in cache `c` (see the module docs):
/// every artifact of an entry a root reaches (each of its tags, the legacy
/// one included) and every attestation of it, and what the `inputs`
/// artifact of a rooted oracle lists.
fn referenced(
    store: Option<&Store>,
    artifacts: &[Inspected],
    c: &Cache,
    tmp: &Path,
) -> Result<BTreeSet<String>> {
    let Some(store) = store else {
        return Ok(BTreeSet::new());
    };
    let labels = gc::reachable(store)?;
    let entry_of = |label: &str| -> Option<(Kind, String)> {
        let (bucket, name) = label.split_once('/')?;
        let bucket = Bucket::from_dir_name(bucket)?;
        let kind = match bucket {
            Bucket::Src => Kind::Source,
            b => Kind::of_bucket(b)?,
        };
        Some((kind, name.to_string()))
    };
    let mut reach: BTreeSet<(Kind, String)> = labels.iter().filter_map(|l| entry_of(l)).collect();
    let mut keep: BTreeSet<String> = BTreeSet::new();
    // An inputs artifact whose oracle, or whose wheel, is rooted here (a
    // box that only pulled the pin roots its entries, `imported-<recipe>`)
    // keeps itself, its source and every entry it lists: without it no box
    // can pull the pin the store keeps.
    let t = crate::cache::open(c)?;
    for (i, a) in artifacts.iter().enumerate() {
        if a.kind != Kind::Inputs {
            continue;
        }
        let Some(rec) = inputs_record(t.as_ref(), &a.tag, &tmp.join(format!("in{i}")))? else {
            continue;
        };
        let rooted =
            |bucket: Bucket, key: &str| labels.contains(&format!("{}/{}", bucket.dir_name(), key));
        if rooted(Bucket::Venvs, &rec.venv_key) || rooted(Bucket::Wheels, &rec.wheel_key) {
            keep.insert(a.tag.clone());
            reach.insert((Kind::Source, rec.commit.clone()));
            reach.extend(rec.entries.iter().filter_map(|l| entry_of(l)));
            keep.extend(rec.tags.values().cloned());
        }
    }
    for a in artifacts {
        let reached = match a.kind {
            // `<kind>-<key>` of what it signs: kept with the entry whose
            // name is that key, whatever the statement's kind (a wheel's
            // own statement, or another kind about the same key).
            Kind::Attestation => a
                .name
                .split_once('-')
                .is_some_and(|(_, n)| reach.iter().any(|(_, rn)| rn == n)),
            k => reach.contains(&(k, a.name.clone())),
        };
        if reached {
            keep.insert(a.tag.clone());
        }
    }
    Ok(keep)
}

/// The record of the inputs artifact `tag` (`None` when its config is not one).
fn inputs_record(
    t: &dyn crate::cache::Transport,
    tag: &str,
    dir: &Path,
) -> Result<Option<InputsRecord>> {
    let Some(m) = t.manifest(tag)? else {
        return Ok(None);
    };
    let Ok(m) = artifact::parse_manifest(&m.bytes, Kind::Inputs, tag) else {
        return Ok(None);
    };
    fs_err::create_dir_all(dir)?;
    let p = dir.join("config.json");
    t.get_blob(
        &m.config.digest,
        u64::try_from(m.config.size).unwrap_or(0),
        &p,
    )?;
    let config: artifact::Config = crate::store::read_json(&p)?;
    Ok(serde_json::from_value(config.record).ok())
}

/// `gc` of cache `c`.
///
/// Errors: exit 2 without a store (its roots decide what is kept: with no
/// roots every tag would go).
pub fn collect(c: &Cache, store: Option<&Store>, dry_run: bool) -> Result<Collected> {
    if store.is_none() {
        return Err(bad_input(format!(
            "cache gc: there is no store here, so no root keeps anything and every tag of {} would be deleted; run it with --store on the box whose roots (`oracle-build keep PIN`) say what to keep",
            c.url
        )));
    }
    let prune = catalog::pruner(c);
    let listing = list(c, false, store, &lockfiles_root())?;
    let tmp = scratch(store)?;
    let keep = referenced(store, &listing.artifacts, c, tmp.path())?;
    let (mut deleted, mut kept) = (Vec::new(), Vec::new());
    for a in &listing.artifacts {
        if keep.contains(&a.tag) {
            kept.push(a.tag.clone());
        } else {
            deleted.push(a.tag.clone());
        }
    }
    // A wheel's provenance goes with its wheel.
    for p in &listing.provenance {
        let key = crate::cache::provenance::key_of_tag(&p.tag).unwrap_or_default();
        if keep
            .iter()
            .any(|t| crate::cache::provenance::is_wheel_tag_of(t, key))
        {
            kept.push(p.tag.clone());
        } else {
            deleted.push(p.tag.clone());
        }
    }
    let (blobs, blob_bytes) = match prune {
        Err(e) => return Err(e),
        Ok(_) if dry_run => (Vec::new(), 0),
        Ok(p) => {
            for tag in &deleted {
                p.delete_tag(tag)?;
            }
            p.sweep(false)?
        }
    };
    Ok(Collected {
        name: c.name.clone(),
        url: c.url.to_string(),
        dry_run,
        deleted,
        kept,
        blobs,
        blob_bytes,
    })
}
