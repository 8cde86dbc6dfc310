//! `oracle-build pull <PIN> [--cache URL]`: fetch from a cache everything
//! `build <PIN> --offline` needs (see [`crate::cache::pull::pull_pin`]):
//! the source into the mirror, the lock, every wheelhouse and ext entry, and
//! the built wheel when its signatures satisfy the cache's trust policy.
//! Every blob is checked against its digest and every entry as its stage
//! would check it before anything is written; entries appear by rename
//! under their locks, registered as temporary GC roots first.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::cache::accept;
use crate::cache::pull::{self, Pulled};
use crate::ops::print_json;
use crate::recipe::pin;
use crate::stages::lock;
use crate::store::Store;

/// Options of `pull`.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// `--cache URL|NAME` (else the configured caches, first hit wins).
    pub cache: Option<String>,
    /// `--lockfiles DIR`.
    pub lockfiles: Option<PathBuf>,
    /// `--json`.
    pub json: bool,
}

/// Pulls PIN's inputs from the first cache that has them.
///
/// Errors (exit 2): bad input, no cache; errors: no cache has the pin; a
/// digest or check fails (nothing written); the wheel is not trusted; the
/// cache's inputs for the pin name different wheels and no reader picks
/// one. Each names the fix that runs as printed: a build in this store.
pub fn pull(pin_arg: &str, store_arg: Option<&Path>, opts: &PullOptions) -> Result<()> {
    let lr = pin::resolve(pin_arg)?;
    let root = Store::default_root(store_arg)?;
    let caches = crate::pipeline::push::caches_for(&root, opts.cache.as_deref())?;
    let store = Store::at(&root)?;
    store.init()?;
    crate::store::report_stale_staging(&store, "pull")?;
    let lock_dir = lock::lock_dir(&lr, opts.lockfiles.as_deref());
    let temp = store.temp_roots()?;
    let mut errors = Vec::new();
    let mut done: Option<Pulled> = None;
    for c in &caches {
        let t = crate::cache::open(c)?;
        let policy = accept::policy_of(c)?;
        // A lock is pinned by this recipe's reviewed lockfile, else signed.
        let accept = |cfg: &crate::cache::artifact::Config,
                      atts: &[crate::cache::trust::Attestation]| {
            accept::accept(cfg, atts, &policy, lock_dir.parent())
        };
        match pull::pull_pin(t.as_ref(), &store, &lr, &lock_dir, &accept, &policy, &temp) {
            Ok(p) => {
                done = Some(p);
                break;
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    drop(temp);
    // Every hint runs as printed: from any directory, into this store.
    let store_flag = store_arg.map_or_else(String::new, |_| {
        format!(
            " --store {}",
            crate::shell::shell_quote(&root.display().to_string())
        )
    });
    let Some(mut p) = done else {
        bail!(
            "cannot pull {} (no entry was added to {}):\n  - {}\nbuild it here instead (it takes from the caches what is pinned): oracle-build build {}{store_flag}",
            lr.recipe.name,
            root.display(),
            errors.join("\n  - "),
            crate::shell::shell_quote(pin_arg)
        );
    };
    // What `build --offline` would still miss (a refused lock): said, and
    // the hint below is then a build that may reach the network.
    let missing = crate::pipeline::inputs::offline_problems(&store, &lr, &lock_dir);
    for m in &missing {
        p.notes.push(format!("`build --offline` would miss: {m}"));
    }
    if opts.json {
        return print_json(&p);
    }
    println!(
        "pulled {} from {}: {} entries added ({:.1} MiB), {} already present",
        p.inputs.recipe,
        p.cache,
        p.added.len(),
        p.bytes as f64 / (1u64 << 20) as f64,
        p.present.len()
    );
    for a in &p.added {
        println!("added    {a}");
    }
    for r in &p.refused {
        println!("refused  {r}");
    }
    for s in &p.skipped {
        println!("skipped  {s}");
    }
    if p.resumed > 0 {
        println!("resumed  {} blob(s) an earlier pull had checked", p.resumed);
    }
    for d in &p.repaired {
        println!("repaired {d}");
    }
    if let Some(uv) = &p.uv {
        println!("uv       {}", uv.display());
    }
    for n in &p.notes {
        println!("note     {n}");
    }
    let offline = if missing.is_empty() { " --offline" } else { "" };
    println!(
        "the pushing box's oracle: venv key {} (wheel {}); build it here with: oracle-build build {}{offline}{store_flag}",
        p.inputs.venv_key,
        p.inputs.wheel_key,
        crate::shell::shell_quote(pin_arg)
    );
    Ok(())
}
