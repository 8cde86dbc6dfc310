//! What every command opens the same way: the store root named on the
//! command line (or by the environment), `--lockfiles`, and `--json`.
//!
//! `main` builds one [`Session`] from the global options and hands it to the
//! command. Nothing is opened when it is built (`completions`, `man` and
//! `watchdog` need no store): the root, the store and the recipe are opened
//! when a command asks, always in the same order (PIN first, then the store).

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::recipe::{LoadedRecipe, pin};
use crate::store::Store;

/// The global options of one invocation (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Session {
    /// `--store DIR`, when given (else `$ORACLE_BUILD_HOME`, `$XDG_DATA_HOME`
    /// or `$HOME`: see [`Store::default_root`]).
    pub store: Option<PathBuf>,
    /// `--lockfiles DIR`: where lock directories live (see `stages::lock::lock_dir`).
    pub lockfiles: Option<PathBuf>,
    /// `--json`: one JSON document on stdout.
    pub json: bool,
}

/// A PIN and the store, opened for a command (see [`Session::open`]).
#[derive(Debug)]
pub struct Opened {
    /// The recipe the PIN names.
    pub recipe: LoadedRecipe,
    /// The store root as named (`--store`, or the environment's default),
    /// for messages that name the root as the user gave it.
    pub root: PathBuf,
    /// The store at `root`, validated, not created.
    pub store: Store,
}

impl Session {
    /// `--store` as given, for commands that pass it on.
    pub fn store_arg(&self) -> Option<&Path> {
        self.store.as_deref()
    }

    /// `--lockfiles` as given.
    pub fn lockfiles(&self) -> Option<&Path> {
        self.lockfiles.as_deref()
    }

    /// The store root: `--store`, else the environment's default.
    ///
    /// Errors: no `--store`, and neither `ORACLE_BUILD_HOME` nor `HOME` is set.
    pub fn root(&self) -> Result<PathBuf> {
        Store::default_root(self.store_arg())
    }

    /// The store at [`Session::root`], validated but not created.
    ///
    /// Errors: as [`Session::root`]; exit 2 when the root is not a
    /// directory or lies inside a git checkout ([`Store::at`]).
    pub fn store(&self) -> Result<Store> {
        Store::at(&self.root()?)
    }

    /// Checks the site configuration of the store root whole before any
    /// work ([`crate::cache::site::check`]): both `config.toml` files, every
    /// table. Nothing to check when the root cannot be named (the command
    /// says why).
    ///
    /// Errors: exit 2 naming file, line and field of every bad table.
    pub fn check_config(&self) -> Result<()> {
        match self.root() {
            Ok(root) => crate::cache::site::check(&root),
            Err(_) => Ok(()),
        }
    }

    /// The recipe `pin_arg` names ([`pin::resolve`]), the files its gate
    /// cases name checked ([`crate::recipe::check_files`]: each
    /// `prompts_file` read, what is at each `golden:` path), and its
    /// repository checked against the site's `[[mirror]]` tables: a git URL
    /// a mirror drops (`url = "none"`) is a configuration this recipe
    /// cannot be fetched with.
    ///
    /// Errors (exit 2): the PIN names no recipe, the recipe is invalid, a
    /// file it names is not one it can read, or a `[[mirror]]` drops its
    /// repository (naming the entry).
    pub fn recipe(&self, pin_arg: &str) -> Result<LoadedRecipe> {
        let lr = pin::resolve(pin_arg)?;
        crate::recipe::check_files(&lr)?;
        // A file that does not load is [`Session::check_config`]'s to report.
        if let Ok(mirrors) = self.root().and_then(|r| crate::host::mirror::load(&r)) {
            mirrors.git_url(&lr.recipe.source.repo, "the recipe's repository")?;
        }
        Ok(lr)
    }

    /// The recipe `pin_arg` names, then the store: what most commands open.
    ///
    /// Errors: as [`Session::recipe`], then as [`Session::store`].
    pub fn open(&self, pin_arg: &str) -> Result<Opened> {
        let recipe = self.recipe(pin_arg)?;
        let root = self.root()?;
        let store = Store::at(&root)?;
        Ok(Opened {
            recipe,
            root,
            store,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_store_is_the_root_as_given() {
        let s = Session {
            store: Some(PathBuf::from("some/store")),
            lockfiles: Some(PathBuf::from("locks")),
            json: true,
        };
        assert_eq!(s.root().unwrap(), PathBuf::from("some/store"));
        assert_eq!(s.lockfiles(), Some(Path::new("locks")));
    }
}
