//! Aliases: the user-facing symlinks (e.g. `~/venvs/vllm-oracle`) that point
//! at oracle venvs in the store (docs/identity.md, "`activate <PIN> <PATH>`").
//!
//! An alias is three things, kept together under the `aliases` lock:
//!
//! - the symlink itself, replaced atomically: a new link is made beside it and
//!   renamed over it ([`replace_symlink`]), so a reader sees the old target or
//!   the new one, never nothing;
//! - a GC root `<root>/roots/alias-<name>-<hash>` on the store entry it points
//!   at, and `<...>-rollback` on the entry it pointed at before (so the
//!   previous oracle stays reachable for a rollback);
//! - a row in the registry `<root>/aliases.json` (written atomically): path ->
//!   recipe name and file, commit, oracle, previous oracle. `doctor` checks
//!   every registered alias against its recipe; `verify PATH` of a registered
//!   alias checks it against the recipe it was registered for, not against
//!   whatever oracle it happens to point at.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::exit::bad_input;
use crate::recipe::pin;
use crate::recipe::{self, LoadedRecipe};
use crate::store::{Bucket, Entry, Store, read_json, write_json};

/// The registry file, `<root>/aliases.json`.
pub const REGISTRY: &str = "aliases.json";

/// One registered alias.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Alias {
    /// The symlink, absolute (its parent directory resolved).
    pub path: PathBuf,
    /// The GC root that keeps its oracle: `<root>/roots/<root>`.
    pub root: String,
    /// The recipe it must be the pin of (name).
    pub recipe: String,
    /// The recipe file it was activated from, absolute (absent for built-in recipes).
    pub recipe_file: Option<PathBuf>,
    /// The recipe's commit at activation.
    pub commit: String,
    /// The store entry it was pointed at.
    pub oracle: PathBuf,
    /// The oracle it pointed at before, if any (rooted as `<root>-rollback` when in the store).
    pub previous: Option<PathBuf>,
    /// When it was last switched (RFC 3339).
    pub activated: String,
}

/// The alias registry.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Registry {
    /// Format version.
    pub schema: u32,
    /// Alias path (as text) -> alias.
    pub aliases: BTreeMap<String, Alias>,
}

impl Registry {
    /// `<root>/aliases.json`.
    pub fn file(store: &Store) -> PathBuf {
        store.root().join(REGISTRY)
    }

    /// Reads the registry (empty when there is none yet).
    ///
    /// Errors: the file exists but cannot be read or parsed.
    pub fn load(store: &Store) -> Result<Registry> {
        let file = Registry::file(store);
        if !file.exists() {
            return Ok(Registry {
                schema: 1,
                aliases: BTreeMap::new(),
            });
        }
        read_json(&file)
    }

    /// Writes the registry atomically (temporary file + rename).
    pub fn save(&self, store: &Store) -> Result<()> {
        write_json(&Registry::file(store), self)
    }

    /// The alias registered at `path` (normalized with [`normalize`]), if any.
    pub fn get(&self, path: &Path) -> Option<&Alias> {
        let key = normalize(path).ok()?;
        self.aliases.get(&key.display().to_string())
    }

    /// The alias registered at `path` or at any symlink on the way from
    /// `path` to what it finally points at (a link to an alias is checked as
    /// that alias), if any.
    pub fn find(&self, path: &Path) -> Option<&Alias> {
        link_chain(path).iter().find_map(|hop| self.get(hop))
    }
}

/// `path`, then each symlink target it leads to (relative targets resolved
/// against the link's directory), up to 40 hops.
fn link_chain(path: &Path) -> Vec<PathBuf> {
    let mut hops = vec![path.to_path_buf()];
    while hops.len() < 40 {
        let Some(cur) = hops.last() else { break };
        let Ok(t) = std::fs::read_link(cur) else {
            break;
        };
        let next = match cur.parent() {
            Some(dir) if t.is_relative() => dir.join(t),
            _ => t,
        };
        hops.push(next);
    }
    hops
}

/// The store root that owns `path`: when `path`, symlinks resolved, lies
/// inside `<X>/store/venvs/<key>`, X (whatever `--store` says). `verify` and
/// `doctor` consult X's alias registry too, so an alias is checked against
/// the recipe it was registered for even when no `--store` names its store.
pub fn owning_root(path: &Path) -> Option<PathBuf> {
    let canon = path.canonicalize().ok()?;
    canon.ancestors().find_map(|a| {
        let bucket = a.parent()?;
        let store = bucket.parent()?;
        (bucket.file_name()? == Bucket::Venvs.dir_name()
            && store.file_name()? == "store"
            && a.file_name().is_some())
        .then(|| store.parent().map(Path::to_path_buf))
        .flatten()
    })
}

/// Whether the symlink `link` points (or, dangling, pointed) into `store`'s entries.
fn points_into(store: &Store, link: &Path) -> bool {
    let dir = store.root().join("store");
    let canon_dir = dir.canonicalize().unwrap_or_else(|_| dir.clone());
    let target = link.canonicalize().unwrap_or_else(|_| {
        let raw = std::fs::read_link(link).unwrap_or_default();
        let joined = match link.parent() {
            Some(d) if raw.is_relative() => d.join(raw),
            _ => raw,
        };
        std::path::absolute(&joined).unwrap_or(joined)
    });
    target != dir
        && target != canon_dir
        && (target.starts_with(&canon_dir) || target.starts_with(&dir))
}

/// `path` made absolute with its parent directory resolved (the link itself is
/// not followed), so one alias has one spelling.
///
/// Errors (exit 2): `path` has no file name (`/`, `..`).
pub fn normalize(path: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))?;
    let name = abs.file_name().filter(|n| *n != "..").ok_or_else(|| {
        bad_input(format!(
            "{} cannot be an alias (no file name)",
            path.display()
        ))
    })?;
    let parent = abs.parent().unwrap_or(Path::new("/"));
    let parent = parent
        .canonicalize()
        .unwrap_or_else(|_| parent.to_path_buf());
    Ok(parent.join(name))
}

/// The GC root name of the alias at `path` (already normalized):
/// `alias-<file name>-<8 hex of sha256(path)>`, e.g. `alias-vllm-oracle-3fa2b1c0`.
pub fn root_name(path: &Path) -> String {
    let name: String = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let digest = hex::encode(Sha256::digest(path.display().to_string().as_bytes()));
    format!(
        "{}{}-{}",
        crate::recipe::ALIAS_ROOT_PREFIX,
        name.trim_start_matches('.'),
        &digest[..8]
    )
}

/// The root that keeps an alias's previous oracle: `<root>-rollback`.
pub fn rollback_root_name(root: &str) -> String {
    format!("{root}-rollback")
}

/// Points the symlink `link` at `target` atomically: a new symlink is created
/// beside it and renamed over it (rename(2) replaces the old link in one step),
/// never delete-then-create.
///
/// Errors: the directory of `link` is not writable, or the rename fails (the
/// temporary link is then removed and `link` is unchanged).
pub fn replace_symlink(link: &Path, target: &Path) -> Result<()> {
    let dir = link.parent().context("the link has a parent directory")?;
    let tmp = stage_symlink(link, target)?;
    if let Err(e) = fs_err::rename(&tmp, link) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.into());
    }
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
    Ok(())
}

/// A new symlink to `target` beside `link` (`.<name>.oracle-build.<pid>.<n>.tmp`),
/// to be renamed over `link`. Returns its path.
///
/// Errors: the directory of `link` cannot be written (read-only, full).
pub fn stage_symlink(link: &Path, target: &Path) -> Result<PathBuf> {
    let dir = link.parent().context("the link has a parent directory")?;
    let name = link
        .file_name()
        .context("the link has a file name")?
        .to_string_lossy();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(
        ".{name}.oracle-build.{}.{nanos}.tmp",
        std::process::id()
    ));
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("creating symlink {}", tmp.display()))?;
    Ok(tmp)
}

/// The store entry at `path` (any spelling that resolves to `store/<bucket>/<name>`), if any.
pub fn entry_at(store: &Store, path: &Path) -> Option<Entry> {
    let canon = path.canonicalize().ok()?;
    let parent = canon.parent()?;
    let name = canon.file_name()?.to_string_lossy().into_owned();
    Bucket::ALL.into_iter().find_map(|b| {
        let dir = store.bucket_dir(b).canonicalize().ok()?;
        (dir == parent).then(|| store.entry(b, &name))
    })
}

/// The recipe an alias was registered for, as it reads now: from its recipe
/// file when that still exists, else by name (see [`pin::resolve`]).
///
/// Errors (exit 2): neither can be found or parsed.
pub fn recipe_of(alias: &Alias) -> Result<LoadedRecipe> {
    match &alias.recipe_file {
        Some(f) if f.is_file() => recipe::load_file(f),
        _ => pin::resolve(&alias.recipe),
    }
}

/// What [`point`] did.
#[derive(Debug, Clone, Serialize)]
pub struct Switched {
    /// The alias as now registered.
    pub alias: Alias,
    /// The root now holding the previous oracle, when it was a different store entry.
    pub rollback_root: Option<String>,
}

/// Points the alias `path` at the venv `entry` for recipe `lr`: the new
/// link is staged beside PATH, then the roots are set (previous oracle as
/// `<root>-rollback`, then the new one as `<root>`), the registry written,
/// and last the staged link renamed over PATH. A failure at any step (a
/// read-only alias directory, a full disk) undoes the steps before it, so
/// there is never an orphan root or an unregistered alias. Creates `path`'s
/// parent directories. Callers verify the oracle first (see `ops::activate`).
///
/// Everything that can be checked is checked before anything is changed: the
/// registry is read and parsed, PATH is inspected, and the entry resolved; a
/// failure there leaves PATH, its directory, the roots and the registry as
/// they were.
///
/// Errors (exit 2): `path` exists and is not a symlink (a real venv or file is
/// never replaced); `path` is a symlink that is neither a registered alias
/// nor points into this store (someone else's link), unless `force`.
/// Otherwise (exit 1): the registry cannot be read or parsed, or the store or
/// the link cannot be written.
pub fn point(
    store: &Store,
    path: &Path,
    entry: &Entry,
    lr: &LoadedRecipe,
    force: bool,
) -> Result<Switched> {
    let abs = std::path::absolute(path)?;
    let _lock = store.lock(crate::store::LockName::Aliases)?;
    let registry = Registry::load(store)?;
    let target = entry
        .path
        .canonicalize()
        .with_context(|| format!("resolving {}", entry.path.display()))?;
    let seen = normalize(&abs)?;
    let previous = match std::fs::symlink_metadata(&seen) {
        Ok(m) if !m.file_type().is_symlink() => {
            return Err(bad_input(format!(
                "{} exists and is not a symlink; refusing to replace it (move it away first)",
                seen.display()
            )));
        }
        Ok(_) => {
            if !force && registry.get(&seen).is_none() && !points_into(store, &seen) {
                let to = std::fs::read_link(&seen).unwrap_or_default();
                return Err(bad_input(format!(
                    "{} is a symlink to {}, which is neither an alias registered in {} nor an oracle of this store; refusing to replace someone else's link (move it away, or replace it anyway with `oracle-build activate {} {} --force {}`)",
                    seen.display(),
                    to.display(),
                    Registry::file(store).display(),
                    crate::recipe::shell_arg(lr),
                    crate::shell::shell_quote(&seen.display().to_string()),
                    crate::shell::store_option(store.root()),
                )));
            }
            seen.canonicalize().ok()
        }
        Err(_) => None,
    };
    if let Some(parent) = abs.parent() {
        fs_err::create_dir_all(parent)?;
    }
    let path = normalize(&abs)?;
    let root = root_name(&path);
    // The new link is made beside PATH first: an alias directory that cannot
    // be written fails here, before any root or the registry changes.
    let staged = stage_symlink(&path, &target)?;
    let registry_before = std::fs::read(Registry::file(store)).ok();
    let mut roots_before: Vec<(String, Option<PathBuf>)> = Vec::new();
    let result = switch(
        store,
        SwitchArgs {
            path: &path,
            staged: &staged,
            target: &target,
            entry,
            lr,
            root,
            previous,
        },
        registry,
        &mut roots_before,
    );
    if result.is_err() {
        // Undo in reverse: the staged link, the registry, then the roots.
        let _ = std::fs::remove_file(&staged);
        match &registry_before {
            Some(bytes) => {
                let _ = crate::store::write_atomic(&Registry::file(store), bytes);
            }
            None => {
                let _ = std::fs::remove_file(Registry::file(store));
            }
        }
        for (name, before) in roots_before.iter().rev() {
            let link = store.roots_dir().join(name);
            match before {
                Some(t) => {
                    let _ = replace_symlink(&link, t);
                }
                None => {
                    let _ = std::fs::remove_file(&link);
                }
            }
        }
    }
    result
}

/// What [`switch`] changes.
struct SwitchArgs<'a> {
    path: &'a Path,
    staged: &'a Path,
    target: &'a Path,
    entry: &'a Entry,
    lr: &'a LoadedRecipe,
    root: String,
    previous: Option<PathBuf>,
}

/// The changes of [`point`], in order: roots (each one's previous link
/// target pushed to `roots_before` before it is set), the registry, and
/// last the rename of the staged link over PATH (the commit point). The
/// caller undoes what was done when this fails.
fn switch(
    store: &Store,
    a: SwitchArgs<'_>,
    mut registry: Registry,
    roots_before: &mut Vec<(String, Option<PathBuf>)>,
) -> Result<Switched> {
    let mut set_root = |name: &str, entry: &Entry| -> Result<()> {
        let link = store.roots_dir().join(name);
        roots_before.push((name.to_string(), std::fs::read_link(&link).ok()));
        store.set_root(name, entry)
    };
    let mut rollback_root = None;
    if let Some(prev) = a.previous.as_ref().filter(|p| **p != a.target)
        && let Some(prev_entry) = entry_at(store, prev)
    {
        let name = rollback_root_name(&a.root);
        set_root(&name, &prev_entry)?;
        rollback_root = Some(name);
    }
    set_root(&a.root, a.entry)?;

    let key = a.path.display().to_string();
    let kept_previous = registry.aliases.get(&key).and_then(|x| x.previous.clone());
    let recipe_file =
        a.lr.dir
            .as_ref()
            .and_then(|_| Path::new(&a.lr.origin).canonicalize().ok());
    let alias = Alias {
        path: a.path.to_path_buf(),
        root: a.root.clone(),
        recipe: a.lr.recipe.name.clone(),
        recipe_file,
        commit: a.lr.recipe.source.commit.clone(),
        oracle: a.target.to_path_buf(),
        previous: match a.previous {
            Some(p) if p != a.target => Some(p),
            _ => kept_previous,
        },
        activated: jiff::Timestamp::now().to_string(),
    };
    registry.schema = 1;
    registry.aliases.insert(key, alias.clone());
    registry.save(store)?;
    fs_err::rename(a.staged, a.path)?;
    if let Some(dir) = a.path.parent()
        && let Ok(f) = std::fs::File::open(dir)
    {
        let _ = f.sync_all();
    }
    Ok(Switched {
        alias,
        rollback_root,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_names_are_readable_and_distinct() {
        let a = root_name(Path::new("/home/u/venvs/vllm-oracle"));
        let b = root_name(Path::new("/home/u/other/vllm-oracle"));
        assert!(a.starts_with("alias-vllm-oracle-"), "{a}");
        assert_ne!(a, b);
        assert_eq!(root_name(Path::new("/x/a b")).len(), "alias-a_b-".len() + 8);
    }

    #[test]
    fn replacing_a_symlink_never_removes_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        fs_err::create_dir(&a).unwrap();
        fs_err::create_dir(&b).unwrap();
        let link = tmp.path().join("link");
        replace_symlink(&link, &a).unwrap();
        replace_symlink(&link, &b).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), b);
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(left.len(), 3, "no temporary links left behind");
    }
}
