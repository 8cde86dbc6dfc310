//! `oracle-build lock <PIN> [--platform P] [--check]`: resolve the build and
//! runtime sets with uv and write hash-pinned PEP 751 lockfiles (see
//! [`crate::stages::lock`]).
//!
//! `lockfiles/<name>/` holds the lock made for this host; `--platform P`
//! (uv's `--python-platform` value) resolves for another box from this one,
//! into `lockfiles/<name>/<P>/`, side by side, through the same code path
//! as `export --platform` ([`lock::resolve_for`]). A build picks the lock
//! for its host ([`lock::pick`]). `--check` resolves nothing: it says
//! whether the lock a build on P (default: this host) would use is there
//! and current (exit 2 when not).
//!
//! Needs the recipe's Python, uv and the source (mirrored and checked out
//! into the store, fetched when missing); not nvcc or a GPU. `--check`
//! needs none of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use serde::Serialize;

use crate::exit::bad_input;
use crate::host::platform::Platform;
use crate::host::toolchain::{self, Toolchain};
use crate::host::uv::Uv;
use crate::ops::{Session, print_json};
use crate::stages::{lock, source};

/// What `lock` reports.
#[derive(Debug, Serialize)]
pub struct LockReport {
    /// Recipe name.
    pub recipe: String,
    /// The lock directory written (or, with `--check`, the one a build uses).
    pub dir: PathBuf,
    /// The platform the lock is for (uv's `--python-platform` spelling).
    pub platform: Option<String>,
    /// `--check`: nothing was resolved, the lock was only checked.
    pub checked: bool,
    /// The `--exclude-newer` cut-off used.
    pub exclude_newer: Option<String>,
    /// File name -> sha256.
    pub files: BTreeMap<String, String>,
    /// Packages in the build set.
    pub build_packages: usize,
    /// Packages in the runtime set.
    pub runtime_packages: usize,
}

/// What `lock` is asked to do besides the PIN.
#[derive(Debug, Clone, Default)]
pub struct LockOptions {
    /// `--platform P`: lock for that platform, into `lockfiles/<name>/<P>/`.
    pub platform: Option<String>,
    /// `--check`: resolve nothing, check the lock a build on P would use.
    pub check: bool,
}

/// Runs `lock` for `pin_arg`, writing into [`lock::lock_dir`] (for this
/// host) or its `<P>/` directory ([`lock::platform_dir`]).
///
/// Errors: bad PIN or `--platform` (exit 2); with `--check`, no lock for
/// the platform or a stale one (exit 2, naming why and the command that
/// re-locks); no Python or uv; the source cannot be fetched; uv cannot resolve.
pub fn run(s: &Session, pin_arg: &str, opts: &LockOptions) -> Result<()> {
    let json = s.json;
    let lr = s.recipe(pin_arg)?;
    let r = &lr.recipe;
    let target = opts.platform.as_deref().map(Platform::parse).transpose()?;
    if opts.check {
        return check(&lr, s.lockfiles(), target.as_ref(), json);
    }
    let store = s.store()?;
    let found_uv = toolchain::find_uv(&store).ok();
    let python = toolchain::find_python(&r.python, found_uv.as_ref())
        .map_err(|e| anyhow!("cannot lock {}: {e}", r.name))?;
    store.init()?;
    let uv_tool = match found_uv {
        Some(u) => u,
        None => crate::stages::installer::find_or_provision_uv(&store)?,
    };
    let tc = Toolchain {
        python,
        uv: uv_tool.clone(),
        git: toolchain::find_git(),
        libgit2: toolchain::libgit2_version(),
        gcc: toolchain::find_gcc(),
        nvcc: None,
        compilers: Default::default(),
        rust: None,
    };
    let uv = Uv {
        tool: uv_tool,
        indexes: crate::host::uv::plain_indexes(&lock::indexes::site_indexes(&store, &r.indexes)?),
        offline: false,
        cache_dir: Some(store.uv_cache_dir()),
        tmp_dir: Some(store.uv_tmp_dir()),
    };
    let temp = store.temp_roots()?;
    temp.add(&store, &source::mirror_entry(&store, &r.source.repo))?;
    temp.add(&store, &source::checkout_entry(&store, &r.source.commit))?;
    let mirror = source::ensure_mirror(&store, &r.source.repo, &r.source.commit, false)?;
    let (src, _) = source::ensure_checkout(&store, &mirror, &r.source.commit)?;
    let base = lock::lock_dir(&lr, s.lockfiles());
    let dir = match &target {
        Some(p) => lock::platform_dir(&base, p),
        None => base,
    };
    let cx = crate::stages::Ctx {
        store: &store,
        lr: &lr,
        tc: &tc,
        uv: &uv,
    };
    let locked = lock::resolve_for(&cx, &src.path, &dir, target.as_ref(), &|b, w| {
        crate::pipeline::inputs::metadata_runtime(&cx, &src.path, b, w, target.as_ref(), &temp)
    })?;
    drop(temp);
    let report = LockReport {
        recipe: r.name.clone(),
        platform: locked.info.platform.clone(),
        checked: false,
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
        "platform {}",
        report.platform.as_deref().unwrap_or("unrecorded")
    );
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

/// `lock --check`: loads the lock a build of `lr` on `target` (`None`: this
/// host) would use ([`lock::load_for`], which picks among the platform
/// locks) and reports it; resolves and writes nothing.
///
/// Errors (exit 2): no lock for the platform, or it is stale (the message
/// names why and the command that re-locks).
fn check(
    lr: &crate::recipe::LoadedRecipe,
    lockfiles: Option<&Path>,
    target: Option<&Platform>,
    json: bool,
) -> Result<()> {
    let r = &lr.recipe;
    let base = lock::lock_dir(lr, lockfiles);
    let for_what = target.map_or("this host".to_string(), |p| format!("platform {p}"));
    let locked = lock::load_for(&base, lr, target)?.ok_or_else(|| {
        bad_input(format!(
            "no lock for {for_what} in {}; run `oracle-build lock {}{}`",
            base.display(),
            lock::lock_pin_arg(lr, &base),
            target.map_or(String::new(), |p| format!(" --platform {p}"))
        ))
    })?;
    let report = LockReport {
        recipe: r.name.clone(),
        dir: locked.dir.clone(),
        platform: locked.info.platform.clone(),
        checked: true,
        exclude_newer: locked.info.exclude_newer.clone(),
        files: locked.info.files.clone(),
        build_packages: locked.build.len(),
        runtime_packages: locked.runtime.len(),
    };
    if json {
        return print_json(&report);
    }
    println!(
        "current  {} for {for_what}: {} (resolved for {})",
        report.recipe,
        report.dir.display(),
        report
            .platform
            .as_deref()
            .unwrap_or("an unrecorded platform")
    );
    Ok(())
}
