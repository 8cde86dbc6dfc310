//! `oracle-build gc [--dry-run]`, `keep <PIN>` and `unkeep <PIN>`.
//!
//! A store that does not exist is an empty store, as for `status`: `gc` has
//! nothing to delete and `unkeep` no root to remove (both exit 0 and say so);
//! `keep` fails (exit 1, naming the store) because there is no oracle to root.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use serde::Serialize;

use crate::ops::{Session, print_json};
use crate::shell::command_at;
use crate::stages::oracle::OracleRecord;
use crate::store::gc;
use crate::store::{Bucket, Entry, Store};

/// `gc`: deletes (or lists) unreachable entries and the bytes freed.
pub fn run(s: &Session, dry_run: bool) -> Result<()> {
    let root = s.root()?;
    // A root that is a file, or inside a checkout, is refused (exit 2).
    s.store()?;
    let Some(store) = Store::open_existing(&root) else {
        if s.json {
            return print_json(&gc::GcReport {
                dry_run,
                deleted: Vec::new(),
                freed_bytes: 0,
                kept: Vec::new(),
                imported: Vec::new(),
                left_by_killed_runs: Vec::new(),
            });
        }
        println!("no store at {}; nothing to delete", root.display());
        return Ok(());
    };
    let report = gc::collect(&store, dry_run)?;
    if s.json {
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
    if !report.left_by_killed_runs.is_empty() {
        let bytes: u64 = report.left_by_killed_runs.iter().map(|d| d.bytes).sum();
        println!(
            "{} {} staging director{} or partial download{} killed runs left ({:.1} MiB): {}",
            if dry_run { "would remove" } else { "removed" },
            report.left_by_killed_runs.len(),
            if report.left_by_killed_runs.len() == 1 {
                "y"
            } else {
                "ies"
            },
            if report.left_by_killed_runs.len() == 1 {
                ""
            } else {
                "s"
            },
            bytes as f64 / (1 << 20) as f64,
            report
                .left_by_killed_runs
                .iter()
                .map(|d| d.entry.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for (name, n) in &report.imported {
        println!(
            "kept   roots/{name}: {n} entr{} an import or pull brought (until a build roots its oracle; `oracle-build unkeep` drops it)",
            if *n == 1 { "y" } else { "ies" }
        );
    }
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

/// What `keep` / `unkeep` did (`--json` prints it).
#[derive(Debug, Serialize)]
pub struct KeepOutput {
    /// The recipe's name (also the root's name).
    pub recipe: String,
    /// The root symlink, `<store>/roots/<recipe>`.
    pub root: PathBuf,
    /// The oracle the root points (or pointed) at; null when there was none.
    pub oracle: Option<PathBuf>,
    /// `kept` (the root was set), `removed` (it was removed) or `absent`
    /// (`unkeep`: there was no root).
    pub action: &'static str,
}

/// `keep <PIN>`: roots the newest oracle of PIN as `roots/<name>`.
/// `unkeep <PIN>`: removes that root (its entries become collectable).
///
/// Errors: exit 2 for a bad PIN; exit 1 for `keep` when the store does not
/// exist or holds no oracle of the recipe at its commit.
pub fn keep(s: &Session, pin_arg: &str, keep: bool) -> Result<()> {
    let lr = s.recipe(pin_arg)?;
    let r = &lr.recipe;
    let root = s.root()?;
    s.store()?;
    let link = std::path::absolute(&root)
        .unwrap_or_else(|_| root.clone())
        .join("roots")
        .join(&r.name);
    let out = match Store::open_existing(&root) {
        None if keep => {
            return Err(anyhow!(
                "no store at {}: there is no oracle of {} to keep; build it first (`{}`)",
                root.display(),
                r.name,
                command_at(&format!("build {}", crate::recipe::shell_arg(&lr)), &root)
            ));
        }
        None => KeepOutput {
            recipe: r.name.clone(),
            root: link,
            oracle: None,
            action: "absent",
        },
        Some(store) if keep => {
            let (entry, _) =
                newest_oracle(&store, &r.name, &r.source.commit)?.ok_or_else(|| {
                    anyhow!(
                        "no oracle of {} in {}; build it first (`{}`)",
                        r.name,
                        root.display(),
                        command_at(&format!("build {}", crate::recipe::shell_arg(&lr)), &root)
                    )
                })?;
            crate::stages::oracle::check_root_owner(&store, &lr)?;
            crate::stages::oracle::check_owner(&lr, &entry.path)?;
            store.set_root(&r.name, &entry)?;
            KeepOutput {
                recipe: r.name.clone(),
                root: store.roots_dir().join(&r.name),
                oracle: Some(entry.path),
                action: "kept",
            }
        }
        Some(store) => {
            crate::stages::oracle::check_root_owner(&store, &lr)?;
            let link = store.roots_dir().join(&r.name);
            let target = link.canonicalize().ok();
            let removed = store.remove_root(&r.name)?;
            // What an import or pull of it brought is no longer kept either.
            let imported = store.remove_root(&crate::store::imported_root_name(&r.name))?;
            if imported && !s.json {
                println!(
                    "removed root {}; `{}` can now delete what the import or pull brought",
                    crate::store::imported_root_name(&r.name),
                    command_at("gc", &root)
                );
            }
            KeepOutput {
                recipe: r.name.clone(),
                root: link,
                oracle: target.filter(|_| removed),
                action: if removed { "removed" } else { "absent" },
            }
        }
    };
    if s.json {
        return print_json(&out);
    }
    match out.action {
        "kept" => println!(
            "kept {} -> {}",
            out.recipe,
            out.oracle.as_deref().unwrap_or(Path::new("?")).display()
        ),
        "removed" => println!(
            "removed root {}; `{}` can now delete what only it reached",
            out.recipe,
            command_at("gc", &root)
        ),
        _ if Store::open_existing(&root).is_none() => println!(
            "{} had no root (there is no store at {})",
            out.recipe,
            root.display()
        ),
        _ => println!("{} had no root", out.recipe),
    }
    Ok(())
}
