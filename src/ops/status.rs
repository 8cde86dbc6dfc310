//! `oracle-build status`: recipes, store entries, roots, and their health.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::ops::{Session, print_json};
use crate::recipe::pin;
use crate::stages::oracle::OracleRecord;
use crate::store::engine_cache::EngineCacheRow;
use crate::store::gc;
use crate::store::{Bucket, Manifest, Root, Store, disk_usage};

/// A recipe as listed by `status`.
#[derive(Debug, Serialize)]
pub struct RecipeRow {
    /// Name.
    pub name: String,
    /// Commit.
    pub commit: String,
    /// Where it was read.
    pub origin: String,
    /// The oracle its root points at, if built.
    pub oracle: Option<PathBuf>,
    /// That oracle's verdict.
    pub verdict: Option<String>,
}

/// A store entry as listed by `status`.
#[derive(Debug, Serialize)]
pub struct EntryRow {
    /// `<bucket>/<name>`.
    pub entry: String,
    /// Path.
    pub path: PathBuf,
    /// Size in bytes (from the manifest when there is one).
    pub bytes: u64,
    /// `ok`, or what is wrong.
    pub health: String,
    /// Names of the roots that point at it.
    pub roots: Vec<String>,
    /// For venvs: recipe, runtime version and verdict.
    pub oracle: Option<String>,
}

/// The status document.
#[derive(Debug, Serialize)]
pub struct Status {
    /// Store root.
    pub store: PathBuf,
    /// Known recipes.
    pub recipes: Vec<RecipeRow>,
    /// Recipes that failed to parse.
    pub recipe_errors: Vec<String>,
    /// Entries.
    pub entries: Vec<EntryRow>,
    /// GC roots.
    pub roots: Vec<Root>,
    /// The oracles' engine caches (`engine-cache/<venv key>-<device>`),
    /// with their sizes.
    pub engine_caches: Vec<EngineCacheRow>,
}

fn entry_health(path: &Path, bucket: Bucket) -> (u64, String) {
    match bucket {
        Bucket::Wheels | Bucket::Venvs => match Manifest::read(path) {
            Ok(m) => {
                // A wheel is one file: hash it; a venv is thousands: sizes only.
                let mut problems = m.check(path, bucket == Bucket::Wheels);
                // The record must read too (manifests of older stores do not list it).
                if bucket == Bucket::Venvs
                    && let Err(e) = OracleRecord::read(path)
                {
                    let e = format!("{e:#}");
                    problems.push(format!(
                        "unreadable oracle.json: {}",
                        e.lines().next().unwrap_or("")
                    ));
                }
                let health = if problems.is_empty() {
                    "ok".into()
                } else {
                    format!("damaged: {}", problems.join("; "))
                };
                (m.total_size(), health)
            }
            Err(_) => (disk_usage(path), "no manifest".into()),
        },
        _ => (disk_usage(path), "ok".into()),
    }
}

/// For every entry label, the names of the roots that reach it (directly or
/// through `requires`).
fn reached_by(store: &Store, roots: &[Root]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for root in roots {
        let mut todo = store.root_entries(root);
        let mut seen = std::collections::BTreeSet::new();
        while let Some(e) = todo.pop() {
            if seen.insert(e.label()) {
                out.entry(e.label()).or_default().push(root.name.clone());
                todo.extend(gc::references(store, &e));
            }
        }
    }
    out
}

/// Adds to `rows` the recipes of the oracles the store holds (their
/// `oracle.json`) that no row lists at that commit: a store lists what it
/// holds wherever `status` runs. The oracle shown is the one a root reaches
/// when there is one.
fn held_recipes(store: &Store, roots: &[Root], rows: &mut Vec<RecipeRow>) -> Result<()> {
    let rooted: Vec<PathBuf> = roots
        .iter()
        .filter_map(|r| r.path.canonicalize().ok())
        .collect();
    let listed = rows.len();
    for e in store.entries(Bucket::Venvs)? {
        let Ok(rec) = OracleRecord::read(&e.path) else {
            continue;
        };
        let commit = rec.identity.commit.clone();
        let row = RecipeRow {
            name: rec.recipe.clone(),
            commit: commit.clone(),
            origin: format!("store ({})", rec.recipe_origin),
            oracle: Some(e.path.clone()),
            verdict: Some(rec.smoke.verdict.as_str().to_string()),
        };
        let same = |r: &RecipeRow| r.name == rec.recipe && r.commit == commit;
        if rows[..listed].iter().any(same) {
            continue;
        }
        match rows[listed..].iter().position(same) {
            Some(i) if rooted.contains(&e.path.canonicalize().unwrap_or_default()) => {
                rows[listed + i] = row
            }
            Some(_) => {}
            None => rows.push(row),
        }
    }
    Ok(())
}

/// Collects the status of the store at `root` (empty when it does not exist).
pub fn status(root: &Path) -> Result<Status> {
    let store = Store::open_existing(root);
    let roots = match &store {
        Some(s) => s.roots()?,
        None => Vec::new(),
    };
    let resolve = |r: &Root| r.path.canonicalize().ok();
    let mut entries = Vec::new();
    if let Some(s) = &store {
        let reached = reached_by(s, &roots);
        for bucket in Bucket::ALL {
            for e in s.entries(bucket)? {
                let (bytes, health) = entry_health(&e.path, bucket);
                let rooted = reached.get(&e.label()).cloned().unwrap_or_default();
                let oracle = (bucket == Bucket::Venvs)
                    .then(|| OracleRecord::read(&e.path).ok())
                    .flatten()
                    .map(|o| {
                        format!(
                            "{} {} {}",
                            o.recipe,
                            o.identity.runtime_version.unwrap_or_default(),
                            o.smoke.verdict.as_str()
                        )
                    });
                entries.push(EntryRow {
                    entry: e.label(),
                    path: e.path.clone(),
                    bytes,
                    health,
                    roots: rooted,
                    oracle,
                });
            }
        }
    }
    let (recipes, recipe_errors) = pin::all_recipes();
    let mut recipes: Vec<RecipeRow> = recipes
        .into_iter()
        .map(|lr| {
            let root = roots.iter().find(|r| r.name == lr.recipe.name && r.live);
            let rec = root.and_then(|r| OracleRecord::read(&r.path).ok());
            RecipeRow {
                name: lr.recipe.name.clone(),
                commit: lr.recipe.source.commit.clone(),
                origin: lr.origin.clone(),
                oracle: root.and_then(resolve),
                verdict: rec.map(|r| r.smoke.verdict.as_str().to_string()),
            }
        })
        .collect();
    let mut engine_caches = Vec::new();
    if let Some(s) = &store {
        held_recipes(s, &roots, &mut recipes)?;
        for c in s.engine_caches()? {
            engine_caches.push(c.row(s));
        }
    }
    Ok(Status {
        store: root.to_path_buf(),
        recipes,
        recipe_errors,
        entries,
        roots,
        engine_caches,
    })
}

/// `status`: prints the status (text or `--json`).
pub fn run(session: &Session) -> Result<()> {
    let root = session.root()?;
    // A root that is a file, or inside a checkout, is refused (exit 2).
    session.store()?;
    let s = status(&root)?;
    if session.json {
        return print_json(&s);
    }
    println!("store {}", s.store.display());
    println!("recipes:");
    for r in &s.recipes {
        let state = match (&r.oracle, &r.verdict) {
            (Some(o), Some(v)) => format!("{v}  {}", o.display()),
            _ => "not built".into(),
        };
        println!(
            "  {:<24} {}  {state}",
            r.name,
            &r.commit[..12.min(r.commit.len())]
        );
    }
    for e in &s.recipe_errors {
        println!("  (unreadable) {e}");
    }
    println!("entries:");
    if s.entries.is_empty() {
        println!("  (none)");
    }
    for e in &s.entries {
        let roots = if e.roots.is_empty() {
            "no root".into()
        } else {
            format!("roots: {}", e.roots.join(", "))
        };
        let oracle = e
            .oracle
            .as_deref()
            .map(|o| format!("  [{o}]"))
            .unwrap_or_default();
        println!(
            "  {:<52} {:>10.1} MiB  {}  {roots}{oracle}",
            e.entry,
            e.bytes as f64 / (1 << 20) as f64,
            e.health
        );
    }
    println!("engine caches:");
    if s.engine_caches.is_empty() {
        println!("  (none)");
    }
    for c in &s.engine_caches {
        println!(
            "  {:<52} {:>10.1} MiB  {}{}",
            c.entry,
            c.bytes as f64 / (1 << 20) as f64,
            c.oracle,
            if c.orphaned {
                "  (its oracle is gone: `gc` removes it)"
            } else {
                ""
            }
        );
    }
    println!("roots:");
    for r in &s.roots {
        if r.is_list() {
            println!(
                "  {:<28} lists {} entr{} ({}; kept until a build of it roots its oracle, or `unkeep`)",
                r.name,
                r.entries.len(),
                if r.entries.len() == 1 { "y" } else { "ies" },
                r.header.as_deref().unwrap_or("a list root")
            );
            continue;
        }
        println!(
            "  {:<28} -> {}{}",
            r.name,
            r.target.display(),
            if r.live { "" } else { "  (dangling)" }
        );
    }
    Ok(())
}
