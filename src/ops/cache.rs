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
//!   them and what each root keeps. A store whose roots keep none of a
//!   cache's tags (no roots at all, or none reaching the cache) is refused
//!   (exit 2, nothing deleted) unless `--allow-empty-roots`.
//!   Tags of other tools (other artifact types) are never touched.

use std::path::Path;

use anyhow::{Result, bail};

use crate::cache::artifact::Kind;
use crate::cache::config;
use crate::cache::inspect::Trust;
use crate::exit::bad_input;
use crate::ops::print_json;
use crate::pipeline::cache_admin::{self, Collected, Listing};
use crate::store::Store;

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
        /// Delete every tag of a cache even when this store's roots keep
        /// none of them (no roots, or none reaching the cache).
        allow_empty_roots: bool,
    },
}

/// Runs `action` on the caches of the store at `store_arg` (its
/// `config.toml` and the user's), or on the one cache `cache` names.
///
/// Errors: exit 2 for a bad configuration, no cache at all, `gc` without a
/// store, or `gc` (not a dry run) where this store's roots keep none of a
/// cache's tags and `allow_empty_roots` is not set (nothing deleted); 1
/// when a cache cannot be read or (`verify`) an artifact fails.
pub fn run(
    action: Action,
    cache: Option<&str>,
    store_arg: Option<&Path>,
    lockfiles: Option<&Path>,
    json: bool,
) -> Result<()> {
    let lockfiles = lockfiles.map_or_else(cache_admin::lockfiles_root, Path::to_path_buf);
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
    for c in &caches {
        c.check_exists()?;
    }
    let store = Store::open_existing(&root);
    match action {
        Action::Ls | Action::Verify => {
            let deep = action == Action::Verify;
            let mut listings = Vec::new();
            for c in &caches {
                listings.push(cache_admin::list(c, deep, store.as_ref(), &lockfiles)?);
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
        Action::Gc {
            dry_run,
            allow_empty_roots,
        } => {
            if store.is_none() {
                return Err(bad_input(format!(
                    "cache gc: {} is not a store (nothing was ever built there), so no root keeps anything and every tag would be deleted; point --store (or ORACLE_BUILD_HOME) at the store whose roots (`oracle-build keep PIN`) say what to keep",
                    root.display()
                )));
            }
            let out = cache_admin::collect(&caches, store.as_ref(), dry_run, allow_empty_roots)?;
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
    // Every row listed below is counted: provenance statements too.
    let provenance = if l.provenance.is_empty() {
        String::new()
    } else {
        format!(" and {} provenance statement(s)", l.provenance.len())
    };
    println!(
        "cache {} ({}): {} artifact(s){provenance}",
        l.name,
        l.identity,
        l.artifacts.len()
    );
    for a in &l.artifacts {
        let trust = match &a.trust {
            Trust::Pinned => "pinned (digest)".to_string(),
            Trust::Signed { verdict } => verdict.to_string(),
            Trust::Statement { signs } => signs.clone(),
            Trust::Lock { lock } => lock.to_string(),
            Trust::Source { tags } => tags.to_string(),
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
    if c.dry_run {
        for r in &c.kept_by {
            println!("root {} keeps {} tag(s)", r.root, r.tags.len());
            for t in &r.tags {
                println!("  {t}");
            }
        }
    }
    for t in &c.deleted {
        println!("{verb} {t}");
    }
    if c.dry_run && c.empty_roots {
        let roots = if c.roots == 0 {
            "this store has no roots".to_string()
        } else {
            format!("none of this store's {} root(s) reaches it", c.roots)
        };
        println!(
            "cache {} ({}): {roots}, so `cache gc` without --dry-run refuses to delete every tag (pass --allow-empty-roots to delete them)",
            c.name, c.identity
        );
    }
    println!(
        "cache {} ({}): {verb} {} tag(s), kept {} a root reaches{}",
        c.name,
        c.identity,
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
