//! `oracle-build lock <PIN>`: resolve the build and runtime sets with uv and
//! write hash-pinned PEP 751 lockfiles (see [`crate::stages::lock`]).
//!
//! Needs the recipe's Python, uv and the source (mirrored and checked out
//! into the store, fetched when missing); not nvcc or a GPU.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Result, anyhow};
use serde::Serialize;

use crate::host::toolchain::{self, Toolchain};
use crate::host::uv::Uv;
use crate::ops::{Opened, Session, print_json};
use crate::stages::{lock, source};

/// What `lock` reports.
#[derive(Debug, Serialize)]
pub struct LockReport {
    /// Recipe name.
    pub recipe: String,
    /// The lock directory written.
    pub dir: PathBuf,
    /// The `--exclude-newer` cut-off used.
    pub exclude_newer: Option<String>,
    /// File name -> sha256.
    pub files: BTreeMap<String, String>,
    /// Packages in the build set.
    pub build_packages: usize,
    /// Packages in the runtime set.
    pub runtime_packages: usize,
}

/// Runs `lock` for `pin_arg`, writing into [`lock::lock_dir`].
///
/// Errors: bad PIN (exit 2); no Python or uv; the source cannot be fetched;
/// uv cannot resolve.
pub fn run(s: &Session, pin_arg: &str) -> Result<()> {
    let Opened {
        recipe: lr, store, ..
    } = s.open(pin_arg)?;
    let r = &lr.recipe;
    let found_uv = toolchain::find_uv(&store, None, false).ok();
    let python = toolchain::find_python(&r.python, found_uv.as_ref())
        .map_err(|e| anyhow!("cannot lock {}: {e}", r.name))?;
    store.init()?;
    let uv_tool = match found_uv {
        Some(u) => u,
        None => toolchain::find_uv(&store, Some(&python), true)?,
    };
    let tc = Toolchain {
        python,
        uv: uv_tool.clone(),
        git: toolchain::find_git(),
        libgit2: toolchain::libgit2_version(),
        gcc: toolchain::find_gcc(),
        nvcc: None,
    };
    let uv = Uv {
        tool: uv_tool,
        indexes: crate::host::uv::plain_indexes(&r.indexes),
        offline: false,
        cache_dir: Some(store.uv_cache_dir()),
    };
    let temp = store.temp_roots()?;
    temp.add(&store, &source::mirror_entry(&store, &r.source.repo))?;
    temp.add(&store, &source::checkout_entry(&store, &r.source.commit))?;
    let mirror = source::ensure_mirror(&store, &r.source.repo, &r.source.commit, false)?;
    let (src, _) = source::ensure_checkout(&store, &mirror, &r.source.commit)?;
    let dir = lock::lock_dir(&lr, s.lockfiles());
    let cx = crate::stages::Ctx {
        store: &store,
        lr: &lr,
        tc: &tc,
        uv: &uv,
    };
    let locked = lock::resolve(&cx, &src.path, &dir, &|b, w| {
        crate::pipeline::inputs::metadata_runtime(&cx, &src.path, b, w)
    })?;
    drop(temp);
    let report = LockReport {
        recipe: r.name.clone(),
        dir: dir.clone(),
        exclude_newer: locked.info.exclude_newer.clone(),
        files: locked.info.files.clone(),
        build_packages: locked.build.len(),
        runtime_packages: locked.runtime.len(),
    };
    if s.json {
        return print_json(&report);
    }
    println!("locked   {} into {}", report.recipe, report.dir.display());
    println!(
        "cut-off  {}",
        report.exclude_newer.as_deref().unwrap_or("none")
    );
    for (name, sha) in &report.files {
        println!("  {name:<22} sha256 {sha}");
    }
    println!(
        "packages {} build, {} runtime (every artifact hash-pinned)",
        report.build_packages, report.runtime_packages
    );
    Ok(())
}
