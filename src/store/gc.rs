//! Garbage collection of the store, Nix-style: delete every entry that no
//! root reaches, never anything a running build uses.
//!
//! Roots are the symlinks under `<root>/roots/` (pins, `keep`s, aliases),
//! the list roots there (`imported-<recipe>`: what `import` and `pull`
//! brought, see [`Store::set_list_root`]) and
//! the temporary roots of running builds (`<root>/locks/build-<pid>.roots`).
//! Entries reference what they were made from: an oracle venv its wheel
//! (`oracle.json` `requires`), a wheel its checkout and mirror (`build.json`
//! `requires`). An oracle's engine caches (`engine-cache/<venv key>-<device>`)
//! are deleted with its venv entry. `gc` holds the store's gc lock exclusively from mark to sweep;
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
    reachable_with(store, || {})
}

/// [`reachable`], calling `between` after the running builds' temporary
/// roots are read and before the roots are.
///
/// The order is what keeps a build that ends during the mark: a build sets
/// its pin's root *before* it drops its temporary roots, so each of its
/// entries is in what is read first or in what is read second. Read the
/// other way round, a build that set its root just after the roots were read
/// and dropped its temporary roots just before they were lost its new
/// oracle, its lock and its wheel (seen once in `gc` looping during two
/// builds). `between` lets a test be that build.
fn reachable_with(store: &Store, between: impl FnOnce()) -> Result<BTreeSet<String>> {
    let mut todo: Vec<Entry> = store.live_temp_roots()?;
    between();
    for root in store.roots()? {
        todo.extend(store.root_entries(&root));
    }
    Ok(closure(store, todo))
}

/// The labels of every entry one root reaches: the entries it names and
/// what they were made from, for saying what each root keeps (`cache gc
/// --dry-run`). [`reachable`] is what `gc` acts on.
pub fn reachable_from(store: &Store, root: &crate::store::Root) -> BTreeSet<String> {
    closure(store, store.root_entries(root))
}

/// The labels of `todo` and of every entry they reference, transitively.
fn closure(store: &Store, mut todo: Vec<Entry>) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    while let Some(e) = todo.pop() {
        if seen.insert(e.label()) {
            todo.extend(references(store, &e));
        }
    }
    seen
}

/// One entry deleted (or that would be).
#[derive(Debug, Serialize)]
pub struct Deleted {
    /// `<bucket>/<name>` (for what a killed run left: its path relative to
    /// the store's root, e.g. `tmp/pull.<pid>.<rand>`).
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
    /// The list roots of `import` and `pull` (`imported-<recipe>`) and how
    /// many entries each names: what they keep from this `gc`.
    pub imported: Vec<(String, usize)>,
    /// What killed runs left (staging directories, partial downloads):
    /// removed (or that would be), with their size; not in `freed_bytes`.
    pub left_by_killed_runs: Vec<Deleted>,
}

/// Deletes (or with `dry_run` lists) every entry no root reaches, and the
/// engine caches of every oracle whose venv entry goes (or is gone), but
/// not one a gate holds the lock of.
///
/// Each deleted entry is first renamed into `<root>/tmp/` (it vanishes from
/// the store atomically) and then removed.
///
/// Errors: an entry cannot be moved or removed; the store is read-only
/// ([`Store::read_only`]) and something would be deleted (nothing is).
pub fn collect(store: &Store, dry_run: bool) -> Result<GcReport> {
    if !dry_run && store.read_only() {
        // Nothing is deleted from a store this process cannot write: say
        // what would go instead of failing on the first rename.
        let would = collect(store, true)?;
        if !would.deleted.is_empty() {
            store.refuse_read_only(&format!(
                "delete {} unreachable entr{} (`oracle-build gc --dry-run` lists them; run `gc` where the store is writable)",
                would.deleted.len(),
                if would.deleted.len() == 1 { "y" } else { "ies" }
            ))?;
        }
        return Ok(GcReport {
            dry_run: false,
            ..would
        });
    }
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
    // An oracle's engine caches go with its venv entry; one in use now (a
    // gate holds its lock, or a build its oracle's: that build's gate runs
    // before its venv entry lands) stays.
    for c in store.engine_caches()? {
        if live.contains(&c.venv_label()) || c.busy(store) {
            continue;
        }
        let bytes = c.bytes();
        if !dry_run {
            let Some(_lock) = c.try_lock(store)? else {
                continue;
            };
            c.remove(store)?;
        }
        deleted.push(Deleted {
            entry: c.label(),
            path: c.path.clone(),
            bytes,
        });
    }
    let left_by_killed_runs: Vec<Deleted> = store
        .left_by_dead()?
        .into_iter()
        .map(|path| Deleted {
            entry: path
                .strip_prefix(store.root())
                .unwrap_or(&path)
                .display()
                .to_string(),
            bytes: disk_usage(&path),
            path,
        })
        .collect();
    let mut left_by_killed_runs = left_by_killed_runs;
    if !dry_run {
        store.clean_stale_staging()?;
        store.clean_stale_downloads()?;
        // Only what is gone is said to be removed.
        left_by_killed_runs.retain(|d| !d.path.exists());
        // Blobs of pulls that never finished, after a day.
        let day = std::time::Duration::from_secs(24 * 3600);
        if let Ok(rd) = fs::read_dir(store.downloads_dir().join("sha256")) {
            for e in rd.flatten() {
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > day);
                if old {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
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
    let imported = store
        .roots()?
        .into_iter()
        .filter(|r| r.is_list())
        .map(|r| (r.name, r.entries.len()))
        .collect();
    Ok(GcReport {
        dry_run,
        deleted,
        freed_bytes,
        kept,
        imported,
        left_by_killed_runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry_with(store: &Store, bucket: Bucket, name: &str, requires: &[&str]) -> Entry {
        let e = store.entry(bucket, name);
        fs::create_dir_all(&e.path).unwrap();
        if let Some(file) = bucket.record_file() {
            // Only `requires` is read: the rest of the record is the stage's.
            let rec = serde_json::json!({"key": name, "other": {"x": 1}, "requires": requires});
            fs::write(e.path.join(file), rec.to_string()).unwrap();
        }
        e
    }

    #[test]
    fn what_a_root_reaches_through_requires_is_kept_and_the_rest_collected() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path()).unwrap();
        store.init().unwrap();
        let src = entry_with(&store, Bucket::Src, "c1", &[]);
        let git = entry_with(&store, Bucket::Git, "r.git", &[]);
        let wheel = entry_with(&store, Bucket::Wheels, "w1", &["src/c1", "git/r.git"]);
        let venv = entry_with(&store, Bucket::Venvs, "v1", &["wheels/w1", "nobucket/x"]);
        let stray = entry_with(&store, Bucket::Wheels, "w2", &["src/c1"]);
        store.set_root("fx", &venv).unwrap();
        assert_eq!(references(&store, &wheel), vec![src.clone(), git.clone()]);
        let live = reachable(&store).unwrap();
        for e in [&src, &git, &wheel, &venv] {
            assert!(live.contains(&e.label()), "{} is reachable", e.label());
        }
        assert!(!live.contains(&stray.label()));

        let dry = collect(&store, true).unwrap();
        assert_eq!(dry.deleted.len(), 1);
        assert!(stray.exists(), "a dry run deletes nothing");
        let report = collect(&store, false).unwrap();
        assert_eq!(report.deleted[0].entry, "wheels/w2");
        assert!(!stray.exists());
        assert!(venv.exists() && wheel.exists() && src.exists());
    }

    #[test]
    fn a_build_that_ends_during_the_mark_keeps_its_oracle() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path()).unwrap();
        store.init().unwrap();
        let lock = entry_with(&store, Bucket::Locks, "l1", &[]);
        let venv = entry_with(&store, Bucket::Venvs, "v1", &["lockfiles/l1"]);
        let temp = store.temp_roots().unwrap();
        temp.add(&store, &lock).unwrap();
        temp.add(&store, &venv).unwrap();
        // The build ends between the two reads: its root is set, then its
        // temporary roots are dropped.
        let live = reachable_with(&store, || {
            store.set_root("fx", &venv).unwrap();
            drop(temp);
        })
        .unwrap();
        for e in [&lock, &venv] {
            assert!(live.contains(&e.label()), "{} is reachable", e.label());
        }
    }

    #[test]
    fn two_sets_of_temporary_roots_of_one_process_keep_both_until_each_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path()).unwrap();
        store.init().unwrap();
        let from = entry_with(&store, Bucket::Venvs, "from", &[]);
        let to = entry_with(&store, Bucket::Venvs, "to", &[]);
        // `advance` holds FROM's oracle while TO's build holds its own set.
        let outer = store.temp_roots().unwrap();
        outer.add(&store, &from).unwrap();
        let inner = store.temp_roots().unwrap();
        inner.add(&store, &to).unwrap();
        let live = reachable(&store).unwrap();
        assert!(
            live.contains("venvs/from") && live.contains("venvs/to"),
            "{live:?}"
        );
        drop(inner);
        let live = reachable(&store).unwrap();
        assert!(
            live.contains("venvs/from") && !live.contains("venvs/to"),
            "{live:?}"
        );
        drop(outer);
        assert!(reachable(&store).unwrap().is_empty());
        assert!(from.exists() && to.exists());
    }

    #[test]
    fn the_temporary_roots_of_a_killed_run_are_ignored_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path()).unwrap();
        store.init().unwrap();
        let venv = entry_with(&store, Bucket::Venvs, "v1", &[]);
        // What a build killed by SIGTERM leaves (its handler exits at once,
        // no destructor runs): the file, listing its entries, unlocked.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let left = store.root().join(format!("locks/build-{pid}.roots"));
        fs::write(&left, format!("{}\n", venv.label())).unwrap();
        let report = collect(&store, false).unwrap();
        assert_eq!(report.deleted.len(), 1, "{report:?}");
        assert_eq!(report.deleted[0].entry, "venvs/v1");
        assert!(!venv.exists());
        assert!(!left.exists(), "the dead run's roots file is removed");
    }

    #[test]
    fn a_list_root_keeps_what_it_names_and_what_that_requires() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path()).unwrap();
        store.init().unwrap();
        let src = entry_with(&store, Bucket::Src, "c1", &[]);
        let wheel = entry_with(&store, Bucket::Wheels, "w1", &["src/c1"]);
        let lock = entry_with(&store, Bucket::Locks, "l1", &[]);
        let stray = entry_with(&store, Bucket::Locks, "l2", &[]);
        let name = crate::store::imported_root_name("fx");
        store
            .set_list_root(&name, "fx abc pulled", std::slice::from_ref(&wheel))
            .unwrap();
        // A second pull adds to it; labels of entries gone are dropped, and
        // an entry that never landed (a refused lock) is not listed.
        let refused = store.entry(Bucket::Locks, "never-stored");
        store
            .set_list_root(&name, "fx abc pulled", &[lock.clone(), refused])
            .unwrap();
        let root = store
            .roots()
            .unwrap()
            .into_iter()
            .find(|r| r.name == name)
            .unwrap();
        assert!(root.is_list());
        assert_eq!(root.header.as_deref(), Some("fx abc pulled"));
        assert_eq!(root.entries, vec!["lockfiles/l1", "wheels/w1"]);
        let report = collect(&store, false).unwrap();
        assert_eq!(report.deleted.len(), 1, "{report:?}");
        assert_eq!(report.deleted[0].entry, stray.label());
        assert!(src.exists() && wheel.exists() && lock.exists());
        assert_eq!(report.imported, vec![(name.clone(), 2)]);
        assert!(store.remove_root(&name).unwrap());
        assert_eq!(collect(&store, false).unwrap().deleted.len(), 3);
    }

    #[test]
    fn the_lock_and_uv_wheel_an_oracle_requires_are_kept_though_its_wheel_names_neither() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path()).unwrap();
        store.init().unwrap();
        // As on a box that imported a bundle: the wheel was built elsewhere
        // from a lockfile, so its build.json names no lock of this store.
        let wheel = entry_with(&store, Bucket::Wheels, "w", &["src/c"]);
        let src = entry_with(&store, Bucket::Src, "c", &[]);
        let lock = entry_with(&store, Bucket::Locks, "imported", &[]);
        let uv = entry_with(&store, Bucket::Wheelhouse, "uvsha", &[]);
        let dep = entry_with(&store, Bucket::Wheelhouse, "depsha", &[]);
        // A lock no record uses (resolved for another box by `export`).
        let other = entry_with(&store, Bucket::Locks, "other-platform", &[]);
        let venv = entry_with(
            &store,
            Bucket::Venvs,
            "v",
            &[
                "wheels/w",
                "wheelhouse/depsha",
                "lockfiles/imported",
                "wheelhouse/uvsha",
            ],
        );
        store.set_root("fx", &venv).unwrap();
        let report = collect(&store, false).unwrap();
        let deleted: Vec<&str> = report.deleted.iter().map(|d| d.entry.as_str()).collect();
        assert_eq!(deleted, vec!["lockfiles/other-platform"]);
        for e in [&wheel, &src, &lock, &uv, &dep, &venv] {
            assert!(e.exists(), "{} is kept", e.label());
        }
        assert!(!other.exists());
    }

    #[test]
    fn an_entry_without_a_readable_record_requires_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path()).unwrap();
        store.init().unwrap();
        let v = store.entry(Bucket::Venvs, "v");
        fs::create_dir_all(&v.path).unwrap();
        fs::write(v.path.join("oracle.json"), "not json").unwrap();
        assert!(references(&store, &v).is_empty());
        let src = entry_with(&store, Bucket::Src, "c", &[]);
        assert!(references(&store, &src).is_empty());
    }
}
