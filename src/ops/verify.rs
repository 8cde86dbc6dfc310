//! `oracle-build verify <PIN|VENV>`: measure the identity now and check it.
//!
//! Exit 0 when every check passes, 3 when any fails.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use serde::Serialize;

use crate::exit::mismatch;
use crate::ops::print_json;
use crate::pin;
use crate::recipe::{self, BuildMode, Recipe};
use crate::stages::identity::{self, Check, Identity};
use crate::stages::venv::OracleRecord;
use crate::store::Store;

/// The verification document.
#[derive(Debug, Serialize)]
pub struct Verification {
    /// The venv verified.
    pub venv: PathBuf,
    /// The recipe it was checked against.
    pub recipe: String,
    /// Measured now.
    pub identity: Identity,
    /// Every check.
    pub checks: Vec<Check>,
    /// Whether all passed.
    pub ok: bool,
}

/// Finds the venv and recipe for `target`: a venv directory (its
/// `oracle.json` names the recipe) or a PIN (its root names the venv).
fn locate(target: &str, store_arg: Option<&Path>) -> Result<(PathBuf, Recipe)> {
    let p = Path::new(target);
    if p.join("pyvenv.cfg").is_file() {
        let rec = OracleRecord::read(p).map_err(|e| {
            anyhow!("{} has no readable oracle.json ({e:#}); it was not built by oracle-build, so verify it by PIN", p.display())
        })?;
        let r = recipe::parse(
            &rec.recipe_text,
            &format!("{}/oracle.json recipe", p.display()),
        )?;
        return Ok((p.to_path_buf(), r));
    }
    let lr = pin::resolve(target)?;
    let root = Store::default_root(store_arg)?;
    let link = root.join("roots").join(&lr.recipe.name);
    if !link.exists() {
        return Err(anyhow!(
            "no oracle of {} in {} (run `oracle-build {}`)",
            lr.recipe.name,
            root.display(),
            target
        ));
    }
    Ok((link.canonicalize()?, lr.recipe))
}

/// Measures and checks the oracle named by `target`.
pub fn verify(target: &str, store_arg: Option<&Path>) -> Result<Verification> {
    let (venv, recipe) = locate(target, store_arg)?;
    let record = OracleRecord::read(&venv).ok();
    let mode = record.as_ref().map_or(BuildMode::Source, |r| {
        if r.identity.build_mode == "precompiled" {
            BuildMode::Precompiled
        } else {
            BuildMode::Source
        }
    });
    let mut id = identity::measure(&venv, &recipe.source.package, &recipe.source.commit, mode)?;
    if let Some(store) = Store::open_existing(&Store::default_root(store_arg)?) {
        let mirror = crate::stages::source::mirror_entry(&store, &recipe.source.repo);
        id.tags_at_commit = crate::stages::source::tags_at(&mirror.path, &recipe.source.commit);
    }
    let mut checks = identity::checks(&id, &recipe);
    if let Some(rec) = &record {
        let pairs = [
            (
                "recorded runtime_version",
                &rec.identity.runtime_version,
                &id.runtime_version,
            ),
            (
                "recorded distribution_version",
                &rec.identity.distribution_version,
                &id.distribution_version,
            ),
            (
                "recorded flashinfer_version",
                &rec.identity.flashinfer_version,
                &id.flashinfer_version,
            ),
            (
                "recorded torch_version",
                &rec.identity.torch_version,
                &id.torch_version,
            ),
        ];
        for (field, want, got) in pairs {
            checks.push(Check {
                field: field.into(),
                expected: want.clone().unwrap_or_else(|| "(none)".into()),
                found: got.clone().unwrap_or_else(|| "(none)".into()),
                ok: want == got,
            });
        }
    }
    let ok = checks.iter().all(|c| c.ok);
    Ok(Verification {
        venv,
        recipe: recipe.name,
        identity: id,
        checks,
        ok,
    })
}

/// `verify`: prints every check; exit 3 when any fails.
pub fn run(target: &str, store_arg: Option<&Path>, json: bool) -> Result<()> {
    let v = verify(target, store_arg)?;
    if json {
        print_json(&v)?;
    } else {
        println!("oracle {} (recipe {})", v.venv.display(), v.recipe);
        for c in &v.checks {
            println!(
                "  [{}] {:<30} expected {}  found {}",
                if c.ok { "ok" } else { "FAIL" },
                c.field,
                c.expected,
                c.found
            );
        }
    }
    if v.ok {
        Ok(())
    } else {
        Err(mismatch(format!(
            "{} is not the pin:\n{}",
            v.venv.display(),
            identity::describe_failures(&v.checks)
        )))
    }
}
