//! `oracle-build cache ls|verify|gc [--dry-run]` (docs/cache.md).
//!
//! - `ls`: every oracle-build artifact of the configured caches (or of
//!   `--cache`): tag, kind, entry, size, and who signed it.
//! - `verify`: the same, with every layer downloaded and checked against
//!   its digest and the config's file list, and every wheel's statements
//!   against the cache's trust policy; exit 1 when anything fails.
//! - `gc`: deletes the tags this store's roots do not reach (directly, or
//!   through the `inputs-<key>` artifact of a rooted oracle), through the
//!   registry API or in the layout's `index.json` (`cache::catalog`), then,
//!   in a `file://` layout, the blobs no tag references; `--dry-run` lists
//!   them.
//!   Tags of other tools (other artifact types) are never touched.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Result, bail};
use serde::Serialize;

use crate::cache::artifact::{self, Kind};
use crate::cache::catalog;
use crate::cache::config::{self, Cache};
use crate::cache::inspect::{self, Inspected, Trust};
use crate::cache::substitute::InputsRecord;
use crate::cache::trust::Policy;
use crate::exit::bad_input;
use crate::ops::print_json;
use crate::store::{Bucket, Store, gc};

/// Which `cache` subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `cache ls`.
    Ls,
    /// `cache verify`.
    Verify,
    /// `cache gc`, deleting only without `dry_run`.
    Gc {
        /// List, delete nothing.
        dry_run: bool,
    },
}

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

/// Runs `action` on the caches of the store at `store_arg` (its
/// `config.toml` and the user's), or on the one cache `cache` names.
///
/// Errors: exit 2 for a bad configuration, no cache at all, or `gc` of a
/// registry; 1 when a cache cannot be read or (`verify`) an artifact fails.
pub fn run(
    action: Action,
    cache: Option<&str>,
    store_arg: Option<&Path>,
    json: bool,
) -> Result<()> {
    let root = Store::default_root(store_arg)?;
    let caches = config::load(&root, cache)?.caches;
    if caches.is_empty() {
        return Err(bad_input(format!(
            "no cache is configured: add a [[cache]] entry to {} (or {}/oracle-build/{}) or pass --cache URL",
            root.join(config::CONFIG_FILE).display(),
            "$XDG_CONFIG_HOME",
            config::CONFIG_FILE
        )));
    }
    let store = Store::open_existing(&root);
    match action {
        Action::Ls | Action::Verify => {
            let deep = action == Action::Verify;
            let mut listings = Vec::new();
            for c in &caches {
                listings.push(list(c, deep, store.as_ref())?);
            }
            let failed: usize = listings
                .iter()
                .flat_map(|l| &l.artifacts)
                .filter(|a| !a.is_sound())
                .count()
                + listings
                    .iter()
                    .flat_map(|l| &l.provenance)
                    .filter(|p| !p.is_sound())
                    .count();
            if json {
                print_json(&serde_json::json!({ "caches": listings, "failed": failed }))?;
            } else {
                for l in &listings {
                    render_listing(l, deep);
                }
            }
            if deep && failed > 0 {
                bail!("{failed} artifact(s) failed verification");
            }
            Ok(())
        }
        Action::Gc { dry_run } => {
            let mut out = Vec::new();
            for c in &caches {
                out.push(collect(c, store.as_ref(), dry_run)?);
            }
            if json {
                return print_json(&serde_json::json!({ "caches": out }));
            }
            for c in &out {
                render_collected(c);
            }
            Ok(())
        }
    }
}

/// A scratch directory: in the store's `tmp/` when there is a store (big
/// wheels), else the system's.
fn scratch(store: Option<&Store>) -> Result<tempfile::TempDir> {
    Ok(match store {
        Some(s) => {
            fs_err::create_dir_all(s.tmp_dir())?;
            tempfile::Builder::new()
                .prefix("cache-")
                .tempdir_in(s.tmp_dir())?
        }
        None => tempfile::tempdir()?,
    })
}

/// Every artifact of cache `c`, inspected (`deep`: layers too).
fn list(c: &Cache, deep: bool, store: Option<&Store>) -> Result<Listing> {
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
        match inspect::inspect(t.as_ref(), &tag, &policy, deep, &dir, &atts)? {
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
    // An inputs artifact whose oracle is rooted here keeps itself, its
    // source and every entry it lists.
    let t = crate::cache::open(c)?;
    for (i, a) in artifacts.iter().enumerate() {
        if a.kind != Kind::Inputs {
            continue;
        }
        let Some(rec) = inputs_record(t.as_ref(), &a.tag, &tmp.join(format!("in{i}")))? else {
            continue;
        };
        if labels.contains(&format!("{}/{}", Bucket::Venvs.dir_name(), rec.venv_key)) {
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
fn collect(c: &Cache, store: Option<&Store>, dry_run: bool) -> Result<Collected> {
    if store.is_none() {
        return Err(bad_input(format!(
            "cache gc: there is no store here, so no root keeps anything and every tag of {} would be deleted; run it with --store on the box whose roots (`oracle-build keep PIN`) say what to keep",
            c.url
        )));
    }
    let prune = catalog::pruner(c);
    let listing = list(c, false, store)?;
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

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// `12.3 MiB`, or `45.6 KiB` below one MiB.
fn human(bytes: u64) -> String {
    if bytes < 1 << 20 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", mib(bytes))
    }
}

/// The kind as `--json` spells it (`source`, `wheel`, ...).
fn kind_name(k: Kind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn render_listing(l: &Listing, deep: bool) {
    println!(
        "cache {} ({}): {} artifact(s)",
        l.name,
        l.url,
        l.artifacts.len()
    );
    for a in &l.artifacts {
        let trust = match &a.trust {
            Trust::Pinned => "pinned (digest)".to_string(),
            Trust::Signed { verdict } => verdict.to_string(),
            Trust::Statement { signs } => signs.clone(),
        };
        let state = if !a.problems.is_empty() {
            format!("  FAILED: {}", a.problems.join("; "))
        } else if deep && a.is_sound() {
            "  ok".to_string()
        } else if deep {
            "  FAILED: not trusted".to_string()
        } else {
            String::new()
        };
        println!(
            "  {:<48} {:<10} {:>10}  {trust}{state}",
            a.tag,
            kind_name(a.kind),
            human(a.size)
        );
    }
    for p in &l.provenance {
        let state = if p.is_sound() { "ok" } else { "FAILED" };
        println!("  {:<48} provenance {state}: {}", p.tag, p.describe());
    }
    if !l.other_tags.is_empty() {
        println!(
            "  other tags (not oracle-build's): {}",
            l.other_tags.join(", ")
        );
    }
}

fn render_collected(c: &Collected) {
    let verb = if c.dry_run { "would delete" } else { "deleted" };
    for t in &c.deleted {
        println!("{verb} {t}");
    }
    println!(
        "cache {} ({}): {verb} {} tag(s), kept {} a root reaches{}",
        c.name,
        c.url,
        c.deleted.len(),
        c.kept.len(),
        if c.dry_run {
            String::new()
        } else {
            format!(
                "; removed {} unreferenced blob(s), {}",
                c.blobs.len(),
                human(c.blob_bytes)
            )
        }
    );
}
