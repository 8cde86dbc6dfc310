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
use crate::cache::inputs_record::InputsRecord;
use crate::cache::inspect::{self, Inspected};
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
    /// The cache it names, however spelled ([`crate::cache::config::CacheUrl::identity`]):
    /// `registry localhost:5000/team`, `file:///dir`.
    pub identity: String,
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
    /// The cache it names ([`Listing::identity`]).
    pub identity: String,
    /// Whether nothing was deleted.
    pub dry_run: bool,
    /// Whether this store's roots keep none of the cache's tags while it
    /// has some: `gc` then refuses without `--allow-empty-roots` (a dry run
    /// says so).
    pub empty_roots: bool,
    /// How many roots the store has.
    pub roots: usize,
    /// The tags deleted (or that would be).
    pub deleted: Vec<String>,
    /// The tags kept because a root reaches them.
    pub kept: Vec<String>,
    /// What each root of the store keeps of the cache, by root name (a
    /// running build's temporary roots keep what they reach too, listed
    /// under no root).
    pub kept_by: Vec<RootKeeps>,
    /// Blobs no tag references any more, removed (or that would be);
    /// layouts only.
    pub blobs: Vec<String>,
    /// Their bytes.
    pub blob_bytes: u64,
}

/// The tags of a cache one root of the store keeps.
#[derive(Debug, Serialize)]
pub struct RootKeeps {
    /// The root's name (`roots/<name>`).
    pub root: String,
    /// The tags it keeps.
    pub tags: Vec<String>,
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
        identity: c.url.identity().to_string(),
        artifacts,
        other_tags,
        provenance,
    })
}

/// The entry (kind and name) a store label (`<bucket>/<name>`) is pushed as.
fn entry_of(label: &str) -> Option<(Kind, String)> {
    let (bucket, name) = label.split_once('/')?;
    let bucket = Bucket::from_dir_name(bucket)?;
    let kind = match bucket {
        Bucket::Src => Kind::Source,
        b => Kind::of_bucket(b)?,
    };
    Some((kind, name.to_string()))
}

/// The `inputs` artifacts of a cache with their records (those whose
/// config reads as one), read once for every set of roots asked about.
fn inputs_records(
    c: &Cache,
    artifacts: &[Inspected],
    tmp: &Path,
) -> Result<Vec<(String, InputsRecord)>> {
    let t = crate::cache::open(c)?;
    let mut out = Vec::new();
    for (i, a) in artifacts.iter().enumerate() {
        if a.kind != Kind::Inputs {
            continue;
        }
        if let Some(rec) = inputs_record(t.as_ref(), &a.tag, &tmp.join(format!("in{i}")))? {
            out.push((a.tag.clone(), rec));
        }
    }
    Ok(out)
}

/// The tags of `artifacts` and `provenance` that the store entries
/// `labels` (what some roots reach) keep: every artifact of an entry
/// among them (each of its tags, the legacy one included) and every
/// attestation of it; what the `inputs` artifact of a rooted oracle, or of
/// a rooted wheel, lists (a box that only pulled the pin roots its
/// entries, `imported-<recipe>`: without its inputs no box can pull the pin
/// the store keeps), that artifact and its source; a wheel's `provenance-`
/// tags with the wheel.
fn keeps(
    labels: &BTreeSet<String>,
    artifacts: &[Inspected],
    provenance: &[crate::cache::provenance::Checked],
    inputs: &[(String, InputsRecord)],
) -> BTreeSet<String> {
    let mut reach: BTreeSet<(Kind, String)> = labels.iter().filter_map(|l| entry_of(l)).collect();
    let mut keep: BTreeSet<String> = BTreeSet::new();
    let rooted =
        |bucket: Bucket, key: &str| labels.contains(&format!("{}/{}", bucket.dir_name(), key));
    for (tag, rec) in inputs {
        if rooted(Bucket::Venvs, &rec.venv_key) || rooted(Bucket::Wheels, &rec.wheel_key) {
            keep.insert(tag.clone());
            reach.insert((Kind::Source, rec.commit.clone()));
            reach.extend(rec.entries.iter().filter_map(|l| entry_of(l)));
            keep.extend(rec.tags.values().cloned());
        }
    }
    // The statements that vouch for what an artifact claims (a source's
    // tags, an external source's tag) are named by their own keys: kept
    // with every artifact kept.
    let mut claims = BTreeSet::new();
    for a in artifacts {
        if reach.contains(&(a.kind, a.name.clone())) {
            claims.extend(a.claims.iter().cloned());
        }
    }
    for a in artifacts {
        let reached = match a.kind {
            // `<kind>-<key>` of what it signs: kept with the entry whose
            // name is that key, whatever the statement's kind (a wheel's
            // own statement, or another kind about the same key).
            Kind::Attestation => {
                claims.contains(&a.name)
                    || a.name
                        .split_once('-')
                        .is_some_and(|(_, n)| reach.iter().any(|(_, rn)| rn == n))
            }
            k => reach.contains(&(k, a.name.clone())),
        };
        if reached {
            keep.insert(a.tag.clone());
        }
    }
    // A wheel's provenance goes with its wheel.
    for p in provenance {
        let key = crate::cache::provenance::key_of_tag(&p.tag).unwrap_or_default();
        if keep
            .iter()
            .any(|t| crate::cache::provenance::is_wheel_tag_of(t, key))
        {
            keep.insert(p.tag.clone());
        }
    }
    keep
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

/// What `gc` of cache `c` would delete and keep for this store's roots,
/// and what each root keeps; deletes nothing (`dry_run` is set).
fn plan(c: &Cache, store: &Store) -> Result<Collected> {
    let listing = list(c, false, Some(store), &lockfiles_root())?;
    let tmp = scratch(Some(store))?;
    let inputs = inputs_records(c, &listing.artifacts, tmp.path())?;
    let keep = keeps(
        &gc::reachable(store)?,
        &listing.artifacts,
        &listing.provenance,
        &inputs,
    );
    let roots = store.roots()?;
    let kept_by = roots
        .iter()
        .map(|r| RootKeeps {
            root: r.name.clone(),
            tags: keeps(
                &gc::reachable_from(store, r),
                &listing.artifacts,
                &listing.provenance,
                &inputs,
            )
            .into_iter()
            .collect(),
        })
        .collect();
    let (mut deleted, mut kept) = (Vec::new(), Vec::new());
    let tags = listing.artifacts.iter().map(|a| &a.tag);
    for tag in tags.chain(listing.provenance.iter().map(|p| &p.tag)) {
        if keep.contains(tag) {
            kept.push(tag.clone());
        } else {
            deleted.push(tag.clone());
        }
    }
    Ok(Collected {
        name: c.name.clone(),
        url: c.url.to_string(),
        identity: c.url.identity().to_string(),
        dry_run: true,
        empty_roots: kept.is_empty() && !deleted.is_empty(),
        roots: roots.len(),
        deleted,
        kept,
        kept_by,
        blobs: Vec::new(),
        blob_bytes: 0,
    })
}

/// Why `gc` refuses cache `plan`: this store's roots keep none of its tags,
/// so every one would go (see [`collect`]).
fn refusal(plan: &Collected, store: &Store, roots: &[String]) -> String {
    let why = if roots.is_empty() {
        format!(
            "the store {} has no roots (nothing built, kept or pulled there: a fresh box, or one whose pull failed)",
            store.root().display()
        )
    } else {
        format!(
            "none of the store {}'s {} root(s) ({}) reaches any of them",
            store.root().display(),
            roots.len(),
            roots.join(", ")
        )
    };
    format!(
        "cache gc: refusing to delete every tag of cache `{}` ({}): {} tag(s), and {why}; nothing was deleted. Run it on the box whose roots (`oracle-build keep PIN`) say what the team keeps (`cache gc --dry-run` lists what each root keeps), or pass --allow-empty-roots to delete them all",
        plan.name,
        plan.identity,
        plan.deleted.len()
    )
}

/// `gc` of `caches` for this store's roots: every cache is planned first;
/// then, unless `dry_run`, the tags no root reaches are deleted (through
/// the registry API, or from a layout's `index.json` followed by the blobs
/// no tag references).
///
/// Errors: exit 2 without a store (its roots decide what is kept), and,
/// before anything is deleted from any cache, exit 2 when this store's
/// roots keep none of a cache's tags while it has some (no roots at all,
/// or none reaching that cache: every tag would go), unless
/// `allow_empty_roots`; a dry run reports that in `empty_roots` instead.
/// A cache that cannot be listed or deleted from fails.
pub fn collect(
    caches: &[Cache],
    store: Option<&Store>,
    dry_run: bool,
    allow_empty_roots: bool,
) -> Result<Vec<Collected>> {
    let Some(store) = store else {
        return Err(bad_input(
            "cache gc: there is no store here, so no root keeps anything and every tag would be deleted; run it with --store on the box whose roots (`oracle-build keep PIN`) say what to keep".to_string(),
        ));
    };
    let mut prunes = Vec::new();
    for c in caches {
        prunes.push(catalog::pruner(c)?);
    }
    let mut plans = Vec::new();
    for c in caches {
        plans.push(plan(c, store)?);
    }
    if !dry_run
        && !allow_empty_roots
        && let Some(p) = plans.iter().find(|p| p.empty_roots)
    {
        let roots: Vec<String> = store.roots()?.into_iter().map(|r| r.name).collect();
        return Err(bad_input(refusal(p, store, &roots)));
    }
    if dry_run {
        return Ok(plans);
    }
    for (plan, prune) in plans.iter_mut().zip(prunes) {
        for tag in &plan.deleted {
            prune.delete_tag(tag)?;
        }
        (plan.blobs, plan.blob_bytes) = prune.sweep(false)?;
        plan.dry_run = false;
    }
    Ok(plans)
}
