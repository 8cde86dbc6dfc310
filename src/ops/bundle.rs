//! `oracle-build export <PIN> -o FILE.tar.gz [--platform P]` and
//! `oracle-build import FILE`: options in, one call to
//! [`crate::pipeline::bundle`], the report rendered. The archive format and
//! its hostile-archive checks are [`crate::store::bundle`].

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::exit::bad_input;
use crate::host::platform::Platform;
use crate::ops::{Session, print_json};
use crate::pipeline::bundle::{self, Export};
use crate::store::Store;

/// Options of `export`.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// `-o FILE`.
    pub output: PathBuf,
    /// `--platform P` (default: this host).
    pub platform: Option<String>,
}

/// `export`: writes the bundle of `pin_arg` (see [`bundle::export`]) and
/// prints what it holds (`--json`: the [`bundle::ExportReport`]).
///
/// Errors (exit 2): a bad PIN or `--platform`, a stale lockfile. Errors: as
/// [`bundle::export`].
pub fn export(s: &Session, pin_arg: &str, opts: &ExportOptions) -> Result<()> {
    let lr = s.recipe(pin_arg)?;
    let r = &lr.recipe;
    let target = opts.platform.as_deref().map(Platform::parse).transpose()?;
    let platform = match &target {
        Some(p) => p.clone(),
        None => Platform::host().ok_or_else(|| {
            bad_input(
                "this host is not a glibc x86_64/aarch64 Linux: name the target with --platform",
            )
        })?,
    };
    // The bundle's directory must exist before any work (exit 2, nothing
    // fetched or written): the bundle is written beside it, then renamed.
    crate::ops::check_output_file(
        "--output",
        &opts.output,
        &format!("{}.tar.gz", r.name),
        "nothing was exported",
    )?;
    let store = s.store()?;
    let report = bundle::export(
        &store,
        &lr,
        &Export {
            lockfiles: s.lockfiles(),
            output: opts.output.as_path(),
            target,
            platform,
        },
    )?;
    if s.json {
        return print_json(&report);
    }
    println!(
        "exported {} for {} ({} files, {} store entries, {} golden(s), {:.1} MiB) to {}",
        r.name,
        report.platform,
        report.files,
        report.entries.len(),
        report.goldens.len(),
        report.bytes as f64 / (1u64 << 20) as f64,
        report.file.display()
    );
    Ok(())
}

/// `import`: verifies the bundle `file` and adds it to the store (see
/// [`bundle::import`]), then prints what it did and how to build offline.
///
/// Errors (exit 2): the archive is hostile or tampered with (nothing is
/// written). Errors: as [`bundle::import`].
pub fn import(s: &Session, file: &Path) -> Result<()> {
    let root = s.root()?;
    let store = Store::at(&root)?;
    crate::store::report_stale_staging(&store, "import")?;
    let report = bundle::import(&store, &root, file, s.lockfiles())?;
    if s.json {
        return print_json(&report);
    }
    println!(
        "imported {}: {} entries added, {} already present",
        report.recipe,
        report.added.len(),
        report.present.len()
    );
    if let Some(uv) = &report.uv {
        println!("uv       {}", uv.display());
    }
    if let Some(t) = &report.lock_trust {
        println!("lock     {t}");
    }
    if let Some(t) = &report.wheel_trust {
        println!("wheel    {t}");
    }
    for g in &report.goldens {
        println!("golden   {}", g.display());
    }
    for n in &report.notes {
        println!("note     {n}");
    }
    if report
        .lock_trust
        .as_deref()
        .is_some_and(|t| t.starts_with("untrusted"))
    {
        // No lock was taken: an offline build would have none.
        println!(
            "the bundle's lock was not taken, so build it online (this box resolves its own lock) with: oracle-build build {} --store {}",
            report.recipe_file.display(),
            root.display()
        );
        println!(
            "  (or offline, after trusting the lock: a reviewed lockfile given to `import --lockfiles`, or the exporting box's key in trusted_signers)"
        );
        return Ok(());
    }
    println!(
        "build it offline with: oracle-build build {} --offline --store {}",
        report.recipe_file.display(),
        root.display()
    );
    println!(
        "  (or by its usual PIN: the same recipe file anywhere, its name when the recipe is in ./recipes/, $ORACLE_BUILD_RECIPES or built in)"
    );
    Ok(())
}
