//! `oracle-build sbom <PIN|VENV> [--out FILE]`: the oracle's bill of
//! materials, a CycloneDX 1.6 JSON document ([`crate::pipeline::sbom`],
//! docs/sbom.md), on stdout or written atomically to FILE.

use std::path::Path;

use anyhow::Result;

use crate::ops::{Session, target};
use crate::pipeline::sbom::{self, Subject};
use crate::stages::lock;

/// Writes the document of the oracle `target_arg` names (see the module
/// docs). The runtime lock is looked for in the store's lock entries the
/// oracle requires and in the recipe's lock directory (`--lockfiles`,
/// `$ORACLE_BUILD_LOCKFILES`, or `lockfiles/` beside the recipe file).
///
/// Errors: exit 2 when FILE is a directory or its directory does not exist
/// (checked first); as [`target::locate`] and [`sbom::bom`]; FILE cannot be written.
pub fn run(s: &Session, target_arg: &str, out: Option<&Path>) -> Result<()> {
    if let Some(file) = out {
        crate::ops::check_output_file("--out", file, "sbom.json", "nothing was written")?;
    }
    let t = target::locate(s, target_arg)?;
    let mut lock_dirs = Vec::new();
    // The recipe as the build loaded it: its file, when it is still there.
    let origin = Path::new(&t.record.recipe_origin);
    let loaded = if origin.is_file() {
        crate::recipe::load_file(origin).ok()
    } else {
        None
    };
    if let Some(lr) = loaded.filter(|lr| lr.recipe.name == t.recipe.name) {
        lock_dirs.push(lock::lock_dir(&lr, s.lockfiles()));
    }
    if !Path::new(target_arg).join("pyvenv.cfg").is_file()
        && let Ok(lr) = s.recipe(target_arg)
    {
        let d = lock::lock_dir(&lr, s.lockfiles());
        if !lock_dirs.contains(&d) {
            lock_dirs.push(d);
        }
    }
    let doc = sbom::bom(&Subject {
        venv: &t.venv,
        record: &t.record,
        recipe: &t.recipe,
        store: &t.store,
        lock_dirs,
    })?;
    let text = serde_json::to_string_pretty(&doc)? + "\n";
    match out {
        None => print!("{text}"),
        Some(file) => {
            let file = match file.parent() {
                Some(p) if p.as_os_str().is_empty() => Path::new(".").join(file),
                _ => file.to_path_buf(),
            };
            crate::store::write_atomic(&file, text.as_bytes())?;
            crate::progress::line(format!(
                "wrote the bill of materials of {} to {}",
                t.venv.display(),
                file.display()
            ));
        }
    }
    Ok(())
}
