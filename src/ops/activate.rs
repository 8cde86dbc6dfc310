//! `oracle-build activate <PIN> <PATH>` (and `build --activate PATH`): point
//! the symlink PATH at the verified, gateable oracle of PIN, atomically, and
//! make PATH a GC root (see [`crate::store::alias`]).
//!
//! Refused with exit 3, leaving PATH untouched, when the oracle fails
//! `verify` against the recipe or its gate verdict is not `gateable`.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use serde::Serialize;

use crate::exit::mismatch;
use crate::ops::{Opened, Session, print_json};
use crate::pipeline::verify::{Depth, verify_venv};
use crate::recipe::LoadedRecipe;
use crate::shell::{command_at, shell_quote};
use crate::stages::identity;
use crate::stages::oracle::OracleRecord;
use crate::stages::smoke::Verdict;
use crate::store::alias::{self, Switched};
use crate::store::{Bucket, Entry, Store};

/// What `activate` did.
#[derive(Debug, Clone, Serialize)]
pub struct Activation {
    /// The alias (the symlink), absolute.
    pub path: PathBuf,
    /// The oracle venv it now points at.
    pub oracle: PathBuf,
    /// The recipe.
    pub recipe: String,
    /// The recipe's commit.
    pub commit: String,
    /// The oracle's runtime version, measured now.
    pub runtime_version: Option<String>,
    /// The GC root holding the oracle.
    pub root: String,
    /// The oracle the alias pointed at before (if different).
    pub previous: Option<PathBuf>,
    /// The GC root keeping the previous oracle, when it is a store entry.
    pub rollback_root: Option<String>,
    /// The recipe PATH was the alias of before, when it was another one:
    /// said, since those using the path expect that recipe's oracle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub was_alias_of: Option<String>,
}

/// The recipe the alias `path` of `store` is registered for, when it is
/// another recipe than `lr` (another name): `activate` would re-point a
/// path others use as recipe A's oracle to recipe B. `None` when PATH is
/// no alias, or `lr`'s.
///
/// Errors: the alias registry cannot be read.
pub fn other_recipe(store: &Store, lr: &LoadedRecipe, path: &Path) -> Result<Option<String>> {
    let registry = crate::store::alias::Registry::load(store)?;
    let Some(a) = registry.get(path) else {
        return Ok(None);
    };
    // A recipe of the same name in another file is refused by ownership
    // (`stages::oracle::check_owner`); a moved file is the same recipe.
    if a.recipe == lr.recipe.name {
        return Ok(None);
    }
    Ok(Some(match &a.recipe_file {
        Some(f) => format!("{} ({})", a.recipe, f.display()),
        None => a.recipe.clone(),
    }))
}

/// The oracle venv entry of recipe `lr`: the target of `roots/<name>`.
///
/// Errors: it was never built (or its root dangles).
pub fn oracle_entry(store: &Store, lr: &LoadedRecipe) -> Result<Entry> {
    let name = &lr.recipe.name;
    let root = store.roots_dir().join(name);
    let entry = alias::entry_at(store, &root)
        .filter(|e| e.bucket == Bucket::Venvs)
        .ok_or_else(|| {
            anyhow!(
                "no oracle of {name} in {} (build it: `{}`)",
                store.root().display(),
                command_at(
                    &format!("build {} --activate PATH", crate::recipe::shell_arg(lr)),
                    store.root()
                )
            )
        })?;
    // The oracle under roots/<name> is another recipe's when a recipe of the
    // same name in another file built it (exit 2).
    crate::stages::oracle::check_owner(lr, &entry.path)?;
    Ok(entry)
}

/// Refuses (exit 2) an alias `path` inside the store's root: what is there
/// is the store's (`gc` deletes a link among the venvs, `unkeep` a root),
/// so an alias there would not last. Its directory is resolved through
/// symlinks; a relative `path` is taken from the working directory.
///
/// Errors: exit 2 naming PATH and the store root.
fn refuse_inside_store(store: &Store, path: &Path) -> Result<()> {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = abs
        .parent()
        .and_then(|d| d.canonicalize().ok())
        .map(|d| abs.file_name().map_or(d.clone(), |n| d.join(n)))
        .unwrap_or(abs);
    let root = store
        .root()
        .canonicalize()
        .unwrap_or_else(|_| store.root().to_path_buf());
    if dir.starts_with(&root) {
        return Err(crate::exit::bad_input(format!(
            "PATH {} is inside the store {}: an alias must live outside it (what is in the store is the store's: gc and unkeep would remove it); give a path outside, e.g. ~/venvs/vllm-oracle",
            path.display(),
            root.display()
        )));
    }
    Ok(())
}

/// Verifies the oracle `entry` against `lr`, checks it is gateable, then
/// points the alias `path` at it (see [`activate_with`]; someone else's
/// symlink at PATH is refused).
///
/// Errors: as [`activate_with`] without `force`.
pub fn activate(
    store: &Store,
    lr: &LoadedRecipe,
    entry: &Entry,
    path: &Path,
) -> Result<Activation> {
    activate_with(store, lr, entry, path, false)
}

/// Verifies the oracle `entry` against `lr`, checks it is gateable, then
/// points the alias `path` at it. `force` replaces a symlink at PATH that is
/// neither a registered alias nor points into the store.
///
/// Errors: exit 3 when a check fails or the verdict is not `gateable`; exit 2
/// when PATH exists and is not a symlink, or is someone else's symlink and
/// not `force`; exit 1 when the alias registry cannot be read. In each case
/// PATH, the roots and the registry are untouched.
pub fn activate_with(
    store: &Store,
    lr: &LoadedRecipe,
    entry: &Entry,
    path: &Path,
    force: bool,
) -> Result<Activation> {
    refuse_inside_store(store, path)?;
    // Content, not only sizes: a same-size edit of any file is refused.
    let v = verify_venv(
        &entry.path,
        &lr.recipe,
        "its recipe",
        Depth::Content,
        None,
        Some(store),
    )?;
    if !v.ok {
        return Err(mismatch(format!(
            "refusing to activate {}: it is not the pin of {}:\n{}",
            entry.path.display(),
            lr.recipe.name,
            identity::describe_failures(&v.checks)
        )));
    }
    let record = OracleRecord::read(&entry.path)?;
    if record.smoke.verdict != Verdict::Gateable {
        let reasons = if record.smoke.reasons.is_empty() {
            String::new()
        } else {
            format!(": {}", record.smoke.reasons.join("; "))
        };
        return Err(mismatch(format!(
            "refusing to activate {}: its gate verdict is {}{reasons} (once the reasons are fixed, gate it again: `{}`)",
            entry.path.display(),
            record.smoke.verdict.as_str(),
            command_at(
                &format!("smoke {}", crate::recipe::shell_arg(lr)),
                store.root()
            )
        )));
    }
    let Switched {
        alias,
        rollback_root,
    } = alias::point(store, path, entry, lr, force)?;
    Ok(Activation {
        path: alias.path,
        oracle: alias.oracle,
        recipe: alias.recipe,
        commit: alias.commit,
        runtime_version: v.identity.runtime_version,
        root: alias.root,
        previous: alias.previous,
        rollback_root,
        was_alias_of: None,
    })
}

/// Prints what `activate` did.
pub fn print(a: &Activation) {
    println!("alias    {} -> {}", a.path.display(), a.oracle.display());
    println!("recipe   {} @ {}", a.recipe, a.commit);
    println!(
        "version  {}",
        a.runtime_version.as_deref().unwrap_or("(none)")
    );
    println!("root     roots/{}", a.root);
    if let (Some(prev), Some(root)) = (&a.previous, &a.rollback_root) {
        println!("rollback roots/{root} -> {}", prev.display());
    }
    if let Some(other) = &a.was_alias_of {
        println!(
            "note     {} was the alias of recipe {other}; it now points at recipe {}'s oracle (its rollback root keeps the old one)",
            a.path.display(),
            a.recipe
        );
    }
}

/// `activate PIN PATH [--force]`.
///
/// Errors: exit 2 for a bad PIN or PATH (someone else's symlink without
/// `force`); exit 1 when the oracle of PIN is not built or the registry is
/// unreadable; exit 3 when it fails `verify` or is not gateable.
pub fn run(s: &Session, pin: &str, path: &Path, force: bool) -> Result<()> {
    let Opened {
        recipe: lr,
        root,
        store,
    } = s.open(pin)?;
    if !store.bucket_dir(Bucket::Venvs).is_dir() {
        return Err(anyhow!(
            "no store at {} (build first: `{}`)",
            root.display(),
            command_at(
                &format!(
                    "build {} --activate {}",
                    crate::recipe::shell_arg(&lr),
                    shell_quote(&path.display().to_string())
                ),
                &root
            )
        ));
    }
    let entry = oracle_entry(&store, &lr)?;
    let was_alias_of = other_recipe(&store, &lr, path)?;
    let mut a = activate_with(&store, &lr, &entry, path, force)?;
    a.was_alias_of = was_alias_of;
    if s.json {
        print_json(&a)
    } else {
        print(&a);
        Ok(())
    }
}
