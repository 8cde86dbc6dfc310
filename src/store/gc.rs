//! Garbage collection of the store, Nix-style: delete every entry that no
//! root reaches, never anything a running build uses.
//!
//! Roots are the symlinks under `<root>/roots/` (pins, `keep`s, aliases) and
//! the temporary roots of running builds (`<root>/locks/build-<pid>.roots`).
//! Entries reference what they were made from: an oracle venv its wheel
//! (`oracle.json` `requires`), a wheel its checkout and mirror (`build.json`
//! `requires`). `gc` holds the store's gc lock exclusively from mark to sweep;
//! builds take it shared to register a temporary root before they look an entry up.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::Result;
use fs_err as fs;
use serde::Serialize;

use serde::Deserialize;

use crate::store::{Bucket, Entry, Manifest, Store, disk_usage, make_writable, read_json};

/// The one field of an entry's record `gc` reads: the labels
/// (`<bucket>/<name>`) of the entries it was made from. Every other field
/// of the record is the stage's own business.
#[derive(Debug, Default, Deserialize)]
struct Requires {
    #[serde(default)]
    requires: Vec<String>,
}

/// The entries `entry` needs: its record's (see [`Bucket::record_file`])
/// `requires`, each label that names an entry of the store. An entry without
/// a record, or with an unreadable one, needs nothing.
pub fn references(store: &Store, entry: &Entry) -> Vec<Entry> {
    let Some(file) = entry.bucket.record_file() else {
        return Vec::new();
    };
    let rec: Requires = read_json(&entry.path.join(file)).unwrap_or_default();
    rec.requires
        .iter()
        .filter_map(|l| store.entry_by_label(l))
        .collect()
}

/// The labels of every entry reachable from a root or a running build.
pub fn reachable(store: &Store) -> Result<BTreeSet<String>> {
    let mut todo: Vec<Entry> = Vec::new();
    for root in store.roots()? {
        if let Some(e) = root
            .path
            .canonicalize()
            .ok()
            .and_then(|t| store.entry_of_path(&t))
        {
            todo.push(e);
        }
    }
    todo.extend(store.live_temp_roots()?);
    let mut seen = BTreeSet::new();
    while let Some(e) = todo.pop() {
        if seen.insert(e.label()) {
            todo.extend(references(store, &e));
        }
    }
    Ok(seen)
}

/// One entry deleted (or that would be).
#[derive(Debug, Serialize)]
pub struct Deleted {
    /// `<bucket>/<name>`.
    pub entry: String,
    /// Its path.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
}

/// What a `gc` did.
#[derive(Debug, Serialize)]
pub struct GcReport {
    /// Whether this was a dry run (nothing deleted).
    pub dry_run: bool,
    /// Entries deleted (or that would be).
    pub deleted: Vec<Deleted>,
    /// Bytes freed (or that would be).
    pub freed_bytes: u64,
    /// Entries kept because a root reaches them.
    pub kept: Vec<String>,
}

/// Deletes (or with `dry_run` lists) every entry no root reaches.
///
/// Each deleted entry is first renamed into `<root>/tmp/` (it vanishes from
/// the store atomically) and then removed.
pub fn collect(store: &Store, dry_run: bool) -> Result<GcReport> {
    let _gc = store.gc_lock(true)?;
    let live = reachable(store)?;
    let mut deleted = Vec::new();
    let mut kept = Vec::new();
    for bucket in Bucket::ALL {
        for e in store.entries(bucket)? {
            if live.contains(&e.label()) {
                kept.push(e.label());
                continue;
            }
            let bytes = Manifest::read(&e.path)
                .map(|m| m.total_size())
                .unwrap_or_else(|_| disk_usage(&e.path));
            if !dry_run {
                let aside = store.tmp_dir().join(format!(
                    "gc-{}-{}.{}",
                    bucket.dir_name(),
                    e.name,
                    std::process::id()
                ));
                fs::rename(&e.path, &aside)?;
                make_writable(&aside);
                if aside.is_dir() {
                    fs::remove_dir_all(&aside)?;
                } else {
                    fs::remove_file(&aside)?;
                }
            }
            deleted.push(Deleted {
                entry: e.label(),
                path: e.path.clone(),
                bytes,
            });
        }
    }
    if !dry_run {
        store.clean_stale_staging()?;
        // Links to wheelhouse entries just deleted (see [`Store::wheelhouse_links_dir`]).
        if let Ok(rd) = fs::read_dir(store.wheelhouse_links_dir()) {
            for e in rd.flatten() {
                if !e.path().exists() {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
    let freed_bytes = deleted.iter().map(|d| d.bytes).sum();
    Ok(GcReport {
        dry_run,
        deleted,
        freed_bytes,
        kept,
    })
}
