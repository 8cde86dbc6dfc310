//! The packages an oracle holds besides what its package requires (recipe
//! `install.extras` and `install.with`, issue 38), measured in its venv:
//! recorded in `oracle.json` (`added`) at build time and checked again by
//! `verify` (one `added <name>` check each).
//!
//! What an extra adds is the package's own answer: the `Requires-Dist` of
//! its installed metadata whose PEP 508 marker holds with the extra
//! requested and not without it (`pep508_rs`, see [`requires::active`]);
//! the installed versions are what the venv's `importlib.metadata` lists.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use anyhow::{Context, Result};
use pep508_rs::PackageName;
use serde::{Deserialize, Serialize};

use crate::host::process::capture;
use crate::recipe::Recipe;
use crate::stages::requires;

/// Prints, as JSON, the package's core metadata (`argv[1]`) and every
/// installed distribution's name and version. Run isolated and without
/// bytecode (`-I -B`): it writes nothing into the venv.
const PROBE_PY: &str = r#"
import importlib.metadata as md, json, sys
try:
    meta = md.distribution(sys.argv[1]).read_text("METADATA") or ""
except md.PackageNotFoundError:
    meta = ""
print(json.dumps({"metadata": meta,
    "installed": [[d.metadata["Name"] or "", d.version or ""] for d in md.distributions()]}))
"#;

/// One added package of an oracle.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Added {
    /// The distribution name (PEP 503 normalized).
    pub name: String,
    /// The installed version; `None`: not installed.
    pub version: Option<String>,
    /// Why it is there: `install.with` (the pinned version is in
    /// [`Added::pinned`]) or `install.extras[<extra>]: <requirement>`.
    pub via: String,
    /// The version `install.with` pins, when it came from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
}

#[derive(Deserialize)]
struct Probe {
    metadata: String,
    installed: Vec<(String, String)>,
}

/// The added packages of the venv at `venv` for `recipe`: each
/// `install.with` entry, then each requirement an `install.extras` extra
/// adds to the package's installed metadata (markers evaluated for the
/// venv's Python), with the version installed now. Empty, without running
/// anything, when the recipe asks for none.
///
/// Errors: the venv's Python cannot be run or prints no such listing, or
/// the package's `Requires-Dist` does not parse (exit 1).
pub fn measure(venv: &Path, recipe: &Recipe) -> Result<Vec<Added>> {
    let install = &recipe.install;
    if install.is_empty() {
        return Ok(Vec::new());
    }
    let python = venv.join("bin/python");
    let out = capture(
        "python (added packages)",
        duct::cmd(
            &python,
            ["-I", "-B", "-c", PROBE_PY, recipe.source.package.as_str()],
        ),
    )?;
    let probe: Probe = serde_json::from_str(&out)
        .with_context(|| format!("{} printed no package listing: {out}", python.display()))?;
    let installed: BTreeMap<String, String> = probe
        .installed
        .into_iter()
        .filter_map(|(n, v)| Some((PackageName::from_str(&n).ok()?.to_string(), v)))
        .collect();
    let mut added = Vec::new();
    for (name, version) in install.with_pins() {
        added.push(Added {
            version: installed.get(&name).cloned(),
            name,
            via: "install.with".into(),
            pinned: Some(version),
        });
    }
    if !install.extras.is_empty() {
        let reqs = requires::requires_dist(&probe.metadata, &recipe.source.package)?;
        let env = requires::marker_env(&python)?;
        let base = requires::active(&reqs, &env, &[]);
        for extra in &install.extras {
            let Ok(x) = pep508_rs::ExtraName::from_str(extra) else {
                continue;
            };
            for r in requires::active(&reqs, &env, std::slice::from_ref(&x)) {
                let name = r.name.to_string();
                if base.contains(&r) || added.iter().any(|a: &Added| a.name == name) {
                    continue;
                }
                added.push(Added {
                    version: installed.get(&name).cloned(),
                    via: format!("install.extras[{extra}]: {r}"),
                    name,
                    pinned: None,
                });
            }
        }
    }
    Ok(added)
}
