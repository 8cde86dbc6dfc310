//! The resolved lock delta of an advance (issue 37): every package of the
//! build lock and of the runtime lock of FROM and of TO (PEP 751
//! `pylock.build.toml`, `pylock.runtime.toml`, see [`crate::stages::lock`]),
//! added, removed, changed in version, or at the same version with other
//! artifact hashes.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::recipe::LoadedRecipe;
use crate::stages::lock::{self, Locked, pylock::LockedPackage};
use crate::store::Store;

/// One package whose lock entry differs.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PackageChange {
    /// Normalized name.
    pub name: String,
    /// FROM's version (absent: added).
    pub from: Option<String>,
    /// TO's version (absent: removed).
    pub to: Option<String>,
    /// `added`, `removed`, `changed` (another version) or `hashes changed`
    /// (the same version, other artifact sha256s).
    pub status: String,
}

/// How one lock (build or runtime) differs from FROM to TO.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct SetDelta {
    /// Every package that differs, by name.
    pub changes: Vec<PackageChange>,
    /// Packages at the same version with the same hashes.
    pub unchanged: usize,
}

/// The build and runtime lock deltas.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct LockDelta {
    /// The locked build environment.
    pub build: SetDelta,
    /// The runtime set (the oracle's).
    pub runtime: SetDelta,
    /// Why no comparison was made (a side has no lock); `None` when made.
    pub not_known: Option<String>,
}

/// The lock a build of `lr` used: its lockfile (`lockfiles/<name>/` beside
/// the recipe, as `advance` builds), else the one a build resolved into the
/// store; `None` when neither is there or current.
pub fn lock_of(store: &Store, lr: &LoadedRecipe) -> Option<Locked> {
    match lock::load(&lock::lock_dir(lr, None), lr) {
        Ok(Some(l)) => Some(l),
        _ => lock::load(&lock::auto_entry(store, &lr.recipe).path, lr)
            .ok()
            .flatten(),
    }
}

fn by_name(pkgs: &[LockedPackage]) -> BTreeMap<String, (String, BTreeSet<String>)> {
    pkgs.iter()
        .map(|p| {
            let hashes = p.wanted().iter().map(|a| a.sha256.clone()).collect();
            (
                super::compare::normalize(&p.name),
                (p.version.clone(), hashes),
            )
        })
        .collect()
}

/// The packages of `to` against those of `from`, by normalized name.
pub fn set_delta(from: &[LockedPackage], to: &[LockedPackage]) -> SetDelta {
    let (a, b) = (by_name(from), by_name(to));
    let mut d = SetDelta::default();
    let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for n in names {
        let change = |status: &str| PackageChange {
            name: n.clone(),
            from: a.get(n).map(|x| x.0.clone()),
            to: b.get(n).map(|x| x.0.clone()),
            status: status.into(),
        };
        match (a.get(n), b.get(n)) {
            (Some(_), None) => d.changes.push(change("removed")),
            (None, Some(_)) => d.changes.push(change("added")),
            (Some(x), Some(y)) if x.0 != y.0 => d.changes.push(change("changed")),
            (Some(x), Some(y)) if x.1 != y.1 => d.changes.push(change("hashes changed")),
            _ => d.unchanged += 1,
        }
    }
    d
}

/// The delta of the locks of FROM and TO (`None`: that side has no lock).
pub fn lock_delta(from: Option<&Locked>, to: Option<&Locked>) -> LockDelta {
    match (from, to) {
        (Some(f), Some(t)) => LockDelta {
            build: set_delta(&f.build, &t.build),
            runtime: set_delta(&f.runtime, &t.runtime),
            not_known: None,
        },
        _ => LockDelta {
            not_known: Some(format!(
                "{} has no current lock (lockfile or store lock) to compare",
                if from.is_none() { "FROM" } else { "TO" }
            )),
            ..LockDelta::default()
        },
    }
}

/// The section as Markdown lines.
pub fn markdown(d: &LockDelta) -> Vec<String> {
    let mut out = vec![
        "## Resolved lock delta (build and runtime locks)".to_string(),
        String::new(),
    ];
    if let Some(why) = &d.not_known {
        out.push(format!("Not compared: {why}."));
        return out;
    }
    for (what, s) in [("build", &d.build), ("runtime", &d.runtime)] {
        let count = |st: &str| s.changes.iter().filter(|c| c.status == st).count();
        out.push(format!(
            "- {what} lock: {} added, {} removed, {} changed, {} hashes changed, {} unchanged.",
            count("added"),
            count("removed"),
            count("changed"),
            count("hashes changed"),
            s.unchanged
        ));
    }
    let rows: Vec<(&str, &PackageChange)> = [("build", &d.build), ("runtime", &d.runtime)]
        .into_iter()
        .flat_map(|(w, s)| s.changes.iter().map(move |c| (w, c)))
        .collect();
    if !rows.is_empty() {
        out.push(String::new());
        out.push("| lock | package | FROM | TO | |".into());
        out.push("|---|---|---|---|---|".into());
        let v = |x: &Option<String>| x.clone().unwrap_or_else(|| "—".into());
        for (w, c) in rows {
            out.push(format!(
                "| {w} | {} | {} | {} | {} |",
                c.name,
                v(&c.from),
                v(&c.to),
                c.status
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stages::lock::pylock::Artifact;

    fn pkg(name: &str, version: &str, sha: &str) -> LockedPackage {
        LockedPackage {
            name: name.into(),
            version: version.into(),
            marker: None,
            wheels: vec![Artifact {
                package: name.into(),
                version: version.into(),
                filename: format!("{name}-{version}-py3-none-any.whl"),
                url: None,
                path: None,
                sha256: sha.into(),
                size: None,
            }],
            sdist: None,
        }
    }

    #[test]
    fn every_package_is_added_removed_changed_or_rehashed() {
        let from = [
            pkg("Flashinfer_Python", "0.6.15.post1", "a"),
            pkg("torch", "2.13.0", "b"),
            pkg("numpy", "2.2.0", "c"),
            pkg("gone", "1", "d"),
        ];
        let to = [
            pkg("flashinfer-python", "0.6.18", "e"),
            pkg("torch", "2.13.0", "f"),
            pkg("numpy", "2.2.0", "c"),
            pkg("new", "2", "g"),
        ];
        let d = set_delta(&from, &to);
        let got: Vec<(&str, Option<&str>, Option<&str>, &str)> = d
            .changes
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.from.as_deref(),
                    c.to.as_deref(),
                    c.status.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "flashinfer-python",
                    Some("0.6.15.post1"),
                    Some("0.6.18"),
                    "changed"
                ),
                ("gone", Some("1"), None, "removed"),
                ("new", None, Some("2"), "added"),
                ("torch", Some("2.13.0"), Some("2.13.0"), "hashes changed"),
            ]
        );
        assert_eq!(d.unchanged, 1);
        let md = markdown(&LockDelta {
            build: SetDelta::default(),
            runtime: d,
            not_known: None,
        })
        .join("\n");
        assert!(
            md.contains(
                "- runtime lock: 1 added, 1 removed, 1 changed, 1 hashes changed, 1 unchanged."
            ),
            "{md}"
        );
        assert!(
            md.contains("| runtime | flashinfer-python | 0.6.15.post1 | 0.6.18 | changed |"),
            "{md}"
        );
        assert!(
            lock_delta(None, None)
                .not_known
                .unwrap()
                .starts_with("FROM")
        );
    }
}
