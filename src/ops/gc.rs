//! `oracle-build gc [--dry-run]`, `keep <PIN>` and `unkeep <PIN>`.

use std::path::Path;

use anyhow::{Result, anyhow};

use crate::gc;
use crate::ops::print_json;
use crate::pin;
use crate::stages::venv::OracleRecord;
use crate::store::{Bucket, Entry, Store};

/// `gc`: deletes (or lists) unreachable entries and the bytes freed.
pub fn run(store_arg: Option<&Path>, dry_run: bool, json: bool) -> Result<()> {
    let root = Store::default_root(store_arg)?;
    let Some(store) = Store::open_existing(&root) else {
        return Err(anyhow!("no store at {}", root.display()));
    };
    let report = gc::collect(&store, dry_run)?;
    if json {
        return print_json(&report);
    }
    let verb = if dry_run { "would delete" } else { "deleted" };
    for d in &report.deleted {
        println!(
            "{verb} {:<56} {:>10.1} MiB",
            d.entry,
            d.bytes as f64 / (1 << 20) as f64
        );
    }
    println!(
        "{verb} {} entr{}, {:.1} MiB; kept {} reachable from roots",
        report.deleted.len(),
        if report.deleted.len() == 1 {
            "y"
        } else {
            "ies"
        },
        report.freed_bytes as f64 / (1 << 20) as f64,
        report.kept.len()
    );
    Ok(())
}

/// The newest oracle venv in the store built from `recipe` at its commit.
pub fn newest_oracle(
    store: &Store,
    name: &str,
    commit: &str,
) -> Result<Option<(Entry, OracleRecord)>> {
    let mut best: Option<(Entry, OracleRecord)> = None;
    for e in store.entries(Bucket::Venvs)? {
        let Ok(rec) = OracleRecord::read(&e.path) else {
            continue;
        };
        if rec.recipe == name
            && rec.identity.commit == commit
            && best.as_ref().is_none_or(|(_, b)| rec.created > b.created)
        {
            best = Some((e, rec));
        }
    }
    Ok(best)
}

/// `keep <PIN>`: roots the newest oracle of PIN as `roots/<name>`.
/// `unkeep <PIN>`: removes that root (its entries become collectable).
pub fn keep(pin_arg: &str, store_arg: Option<&Path>, keep: bool) -> Result<()> {
    let lr = pin::resolve(pin_arg)?;
    let r = &lr.recipe;
    let root = Store::default_root(store_arg)?;
    let Some(store) = Store::open_existing(&root) else {
        return Err(anyhow!("no store at {}", root.display()));
    };
    if keep {
        let (entry, _) = newest_oracle(&store, &r.name, &r.source.commit)?.ok_or_else(|| {
            anyhow!(
                "no oracle of {} in {}; build it first (`oracle-build {pin_arg}`)",
                r.name,
                root.display()
            )
        })?;
        store.set_root(&r.name, &entry)?;
        println!("kept {} -> {}", r.name, entry.path.display());
    } else if store.remove_root(&r.name)? {
        println!(
            "removed root {}; `oracle-build gc` can now delete what only it reached",
            r.name
        );
    } else {
        println!("{} had no root", r.name);
    }
    Ok(())
}
