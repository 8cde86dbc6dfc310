//! Resolving a PIN argument to a recipe (docs/recipes.md).
//!
//! A PIN is a path to a recipe file, a recipe name (file stem or `name:`), or
//! a hex commit prefix of at least 7 digits matching exactly one recipe.
//! Recipes are looked up as a path, then in `./recipes/`, then in each
//! directory of `$ORACLE_BUILD_RECIPES` (colon-separated), then among the
//! recipes compiled into the binary.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::exit::bad_input;
use crate::recipe::{self, LoadedRecipe};

/// Recipes compiled into the binary: (file name, text).
pub const BUILTIN: &[(&str, &str)] = &[(
    "555967922.yaml",
    include_str!("../../recipes/555967922.yaml"),
)];

/// Where recipes are searched, in order (existing directories only).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from("recipes")];
    if let Some(v) = std::env::var_os("ORACLE_BUILD_RECIPES") {
        dirs.extend(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()));
    }
    dirs.into_iter().filter(|d| d.is_dir()).collect()
}

/// A recipe known by its file stem, before parsing.
struct Candidate {
    stem: String,
    origin: String,
    path: Option<PathBuf>,
    text: String,
}

fn candidates() -> Vec<Candidate> {
    let mut out = Vec::new();
    for dir in search_dirs() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .collect();
        files.sort();
        for path in files {
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.push(Candidate {
                stem,
                origin: path.display().to_string(),
                path: Some(path),
                text,
            });
        }
    }
    for (file, text) in BUILTIN {
        out.push(Candidate {
            stem: file.trim_end_matches(".yaml").to_string(),
            origin: format!("<builtin>/{file}"),
            path: None,
            text: (*text).to_string(),
        });
    }
    out
}

fn load(c: &Candidate) -> Result<LoadedRecipe> {
    match &c.path {
        Some(p) => recipe::load_file(p),
        None => Ok(LoadedRecipe {
            recipe: recipe::parse(&c.text, &c.origin)?,
            origin: c.origin.clone(),
            dir: None,
            text: c.text.clone(),
        }),
    }
}

/// Every recipe that parses, first occurrence of each name winning, with the
/// errors of those that do not.
pub fn all_recipes() -> (Vec<LoadedRecipe>, Vec<String>) {
    let mut seen = std::collections::BTreeSet::new();
    let mut ok = Vec::new();
    let mut errors = Vec::new();
    for c in candidates() {
        match load(&c) {
            Ok(r) => {
                if seen.insert(r.recipe.name.clone()) {
                    ok.push(r);
                }
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    (ok, errors)
}

/// Resolves `pin` to one recipe.
///
/// A recipe file's stem is matched before any recipe's `name:`; when `pin` is
/// both, the file is used and a note on stderr names both origins.
///
/// Errors (exit 2): a path that does not exist or does not parse; a name with
/// `/` or `..` that is not a file; no recipe of that name; a commit prefix that
/// matches none (or several: the candidates are listed).
pub fn resolve(pin: &str) -> Result<LoadedRecipe> {
    let as_path = Path::new(pin);
    let looks_like_path = pin.contains('/') || pin.ends_with(".yaml") || pin.ends_with(".yml");
    if as_path.is_file() {
        return recipe::load_file(as_path);
    }
    if looks_like_path {
        return Err(bad_input(format!("recipe file {pin} not found")));
    }
    if pin.contains("..") || pin.is_empty() {
        return Err(bad_input(format!(
            "{pin:?} is not a recipe name (names use [a-z0-9._-], no `/` or `..`)"
        )));
    }
    let all = candidates();
    // 1. By name: a file stem or a `name:` field; a stem wins.
    if let Some(c) = all.iter().find(|c| c.stem == pin) {
        let lr = load(c)?;
        let others: Vec<&str> = all
            .iter()
            .filter(|o| o.origin != c.origin)
            .filter(|o| load(o).is_ok_and(|r| r.recipe.name == pin))
            .map(|o| o.origin.as_str())
            .collect();
        if !others.is_empty() {
            crate::progress::line(format!(
                "note: {pin:?} is the file name of {} (recipe {}), used; it is also the `name:` of {}. File names win; give the path to use another.",
                c.origin,
                lr.recipe.name,
                others.join(", ")
            ));
        }
        return Ok(lr);
    }
    let parsed: Vec<(&Candidate, Option<LoadedRecipe>)> =
        all.iter().map(|c| (c, load(c).ok())).collect();
    for (_, r) in &parsed {
        if let Some(r) = r.as_ref().filter(|r| r.recipe.name == pin) {
            return Ok(r.clone());
        }
    }
    // 2. By commit prefix.
    let is_hex = pin.len() >= 7 && pin.len() <= 40 && pin.chars().all(|c| c.is_ascii_hexdigit());
    if !is_hex {
        let where_ = search_dirs()
            .iter()
            .map(|d| d.display().to_string())
            .chain(["<builtin>".into()])
            .collect::<Vec<_>>();
        return Err(bad_input(format!(
            "no recipe named {pin:?} (looked in {}; a commit prefix needs at least 7 hex digits)",
            where_.join(", ")
        )));
    }
    let needle = pin.to_ascii_lowercase();
    let mut matches: Vec<LoadedRecipe> = Vec::new();
    for (_, r) in parsed.into_iter() {
        if let Some(r) = r.filter(|r| r.recipe.source.commit.starts_with(&needle))
            && !matches.iter().any(|m| m.recipe.name == r.recipe.name)
        {
            matches.push(r);
        }
    }
    match matches.len() {
        1 => Ok(matches.remove(0)),
        0 => Err(bad_input(format!(
            "no recipe has a commit starting with {pin}"
        ))),
        _ => Err(bad_input(format!(
            "commit prefix {pin} is ambiguous; it matches:\n{}",
            matches
                .iter()
                .map(|m| format!(
                    "  {}  {}  ({})",
                    m.recipe.name, m.recipe.source.commit, m.origin
                ))
                .collect::<Vec<_>>()
                .join("\n")
        ))),
    }
}
