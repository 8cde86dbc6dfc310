//! The built oracle a `<PIN|VENV>` argument names, for the commands that
//! read one without measuring it (`sbom`, `contains`): the venv, its
//! `oracle.json`, its recipe, and the store that holds it.
//!
//! A venv path (an oracle directory, or a symlink to one such as an alias)
//! is read as is, with the store that owns it (`<X>/store/venvs/<key>`);
//! a PIN names its recipe, whose root `roots/<name>` in the session's store
//! names the oracle (as `verify` finds them, `ops/verify.rs`).

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};

use crate::exit::bad_input;
use crate::ops::Session;
use crate::recipe::{self, Recipe};
use crate::stages::oracle::{ORACLE_JSON, OracleRecord};
use crate::store::Store;
use crate::store::alias;

/// A built oracle, located.
#[derive(Debug)]
pub struct Target {
    /// The venv, canonical.
    pub venv: PathBuf,
    /// Its `oracle.json`.
    pub record: OracleRecord,
    /// The recipe it was built from (its `oracle.json` copy).
    pub recipe: Recipe,
    /// The store that holds it.
    pub store: Store,
}

/// Finds the oracle `target` names (see the module docs).
///
/// Errors (exit 2): a directory that is not a venv, a venv without a
/// readable `oracle.json`, a PIN naming no recipe. Errors: the PIN is not
/// built in the store; the venv lies in no store.
pub fn locate(s: &Session, target: &str) -> Result<Target> {
    let p = Path::new(target);
    let venv = if p.join("pyvenv.cfg").is_file() {
        p.canonicalize()?
    } else if p.is_dir() {
        return Err(bad_input(format!(
            "{} is a directory but not a venv (no pyvenv.cfg)",
            p.display()
        )));
    } else {
        let lr = s.recipe(target)?;
        let root = s.root()?;
        let link = root.join("roots").join(&lr.recipe.name);
        link.canonicalize().map_err(|_| {
            anyhow!(
                "no oracle of {} in {} (run `{}`)",
                lr.recipe.name,
                root.display(),
                crate::shell::command_at(
                    &format!("build {}", crate::recipe::shell_arg(&lr)),
                    &root
                )
            )
        })?
    };
    let record = OracleRecord::read(&venv).map_err(|e| {
        bad_input(format!(
            "{}: {ORACLE_JSON} cannot be read ({e:#}): not an oracle built by oracle-build",
            venv.display()
        ))
    })?;
    let recipe = recipe::parse(
        &record.recipe_text,
        &format!("{}/{ORACLE_JSON} recipe", venv.display()),
    )?;
    let store = alias::owning_root(&venv)
        .and_then(|r| Store::open_existing(&r))
        .ok_or_else(|| {
            anyhow!(
                "{} is not inside a store (<root>/store/venvs/<key>), so its mirror and entries cannot be found",
                venv.display()
            )
        })?;
    Ok(Target {
        venv,
        record,
        recipe,
        store,
    })
}
