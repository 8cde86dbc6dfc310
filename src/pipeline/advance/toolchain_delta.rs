//! The toolchain requirements of the two trees of an advance (issue 37),
//! side by side: what each tree states of CMake, its compilers, CUDA and
//! Rust ([`crate::stages::toolchain_req`]), matched by key, marked added,
//! removed, changed or same.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::recipe::LoadedRecipe;
use crate::stages::toolchain_req::{self, Kind, Stated};
use crate::store::Store;

/// One statement at one side.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Said {
    /// As written.
    pub text: String,
    /// `file:line`.
    pub at: String,
}

/// One requirement compared.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ToolRow {
    /// Which toolchain.
    pub kind: Kind,
    /// FROM's statement (absent: added).
    pub from: Option<Said>,
    /// TO's statement (absent: removed).
    pub to: Option<Said>,
    /// `added`, `removed`, `changed` or `same`.
    pub status: String,
}

/// The toolchain requirements of both trees.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct ToolchainDelta {
    /// Every requirement stated by either tree, by kind, then as each
    /// tree states them.
    pub rows: Vec<ToolRow>,
    /// Why a side could not be read (names the side); empty when both were.
    pub not_known: Vec<String>,
}

/// The rows of two trees' statements (pure): statements with one key are
/// paired in the order each tree writes them (same text: same; other
/// text: changed); the rest are added or removed.
pub fn compare(from: &[Stated], to: &[Stated]) -> Vec<ToolRow> {
    type Sides<'a> = (Vec<&'a Stated>, Vec<&'a Stated>);
    let mut keys: BTreeMap<(Kind, &str), Sides> = BTreeMap::new();
    let mut order: Vec<(Kind, &str)> = Vec::new();
    for (side, list) in [(0, from), (1, to)] {
        for s in list {
            let k = (s.kind, s.key.as_str());
            let e = keys.entry(k).or_insert_with(|| {
                order.push(k);
                Default::default()
            });
            if side == 0 { e.0.push(s) } else { e.1.push(s) }
        }
    }
    order.sort_by_key(|k| k.0);
    let said = |s: &Stated| Said {
        text: s.text.clone(),
        at: s.at.clone(),
    };
    let mut rows = Vec::new();
    for k in order {
        let (a, b) = &keys[&k];
        for i in 0..a.len().max(b.len()) {
            let (f, t) = (a.get(i), b.get(i));
            let status = match (f, t) {
                (Some(x), Some(y)) if x.text == y.text => "same",
                (Some(_), Some(_)) => "changed",
                (Some(_), None) => "removed",
                _ => "added",
            };
            rows.push(ToolRow {
                kind: k.0,
                from: f.map(|s| said(s)),
                to: t.map(|s| said(s)),
                status: status.into(),
            });
        }
    }
    rows
}

/// The statements of each side's commit, read from its repository's mirror
/// in the store (for its recipe's `build.target_device`).
pub fn toolchain_delta(store: &Store, from: &LoadedRecipe, to: &LoadedRecipe) -> ToolchainDelta {
    let (a, b, not_known) = super::deltas::read_sides(store, from, to, toolchain_req::in_mirror);
    ToolchainDelta {
        rows: compare(&a, &b),
        not_known,
    }
}

/// The section as Markdown lines: every row that differs, and the CMake
/// minimum and Rust rows always; the compiler and CUDA statements both
/// trees make alike are counted.
pub fn markdown(d: &ToolchainDelta) -> Vec<String> {
    let mut out = vec![
        "## Toolchain requirements (as each tree states them)".to_string(),
        String::new(),
    ];
    for why in &d.not_known {
        out.push(format!("- not read: {}", why.replace('|', "\\|")));
    }
    if d.rows.is_empty() {
        out.push("Neither tree states a CMake minimum, a compiler condition, a CUDA list or a Rust build.".into());
        return out;
    }
    out.push(super::deltas::status_counts(
        d.rows.iter().map(|r| r.status.as_ref()),
    ));
    if !d.rows.iter().any(|r| r.kind == Kind::Rust) {
        out.push(String::new());
        out.push("Neither tree's build requires Rust.".into());
    }
    let shown: Vec<&ToolRow> = d
        .rows
        .iter()
        .filter(|r| r.status != "same" || matches!(r.kind, Kind::Cmake | Kind::Rust))
        .collect();
    if shown.is_empty() {
        return out;
    }
    out.push(String::new());
    out.push("| kind | FROM | TO | |".into());
    out.push("|---|---|---|---|".into());
    let cell = |s: &Option<Said>| {
        s.as_ref().map_or("—".to_string(), |s| {
            format!(
                "`{}` ({})",
                s.text.replace('|', "\\|").replace('`', "'"),
                s.at
            )
        })
    };
    for r in shown {
        out.push(format!(
            "| {} | {} | {} | {} |",
            r.kind.word(),
            cell(&r.from),
            cell(&r.to),
            if r.status == "same" {
                "same".to_string()
            } else {
                format!("**{}**", r.status)
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stages::toolchain_req::of_cmake;

    #[test]
    fn a_raised_minimum_is_changed_and_a_new_compiler_floor_is_added() {
        let from = of_cmake(
            "CMakeLists.txt",
            "cmake_minimum_required(VERSION 3.26)\nset(CUDA_SUPPORTED_ARCHS \"8.0;9.0\")\nif(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)\nendif()\n",
        );
        let to = of_cmake(
            "CMakeLists.txt",
            "cmake_minimum_required(VERSION 3.29)\nset(CUDA_SUPPORTED_ARCHS \"8.0;9.0\")\nif(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)\nendif()\nif(CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12.3)\nendif()\n",
        );
        let rows = compare(&from, &to);
        let got: Vec<(Kind, &str)> = rows.iter().map(|r| (r.kind, r.status.as_str())).collect();
        assert_eq!(
            got,
            [
                (Kind::Cmake, "changed"),
                (Kind::Compiler, "same"),
                (Kind::Compiler, "added"),
                (Kind::Cuda, "same"),
            ]
        );
        let md = markdown(&ToolchainDelta {
            rows,
            not_known: vec![],
        })
        .join("\n");
        assert!(
            md.contains("| CMake | `cmake_minimum_required(VERSION 3.26)` (CMakeLists.txt:1) | `cmake_minimum_required(VERSION 3.29)` (CMakeLists.txt:1) | **changed** |"),
            "{md}"
        );
        assert!(md.contains("| compiler | — | `if(CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12.3)` (CMakeLists.txt:5) | **added** |"), "{md}");
        assert!(
            md.contains("1 added, 0 removed, 1 changed, 2 same."),
            "{md}"
        );
        assert!(md.contains("Neither tree's build requires Rust."), "{md}");
        // A statement both make alike, not CMake or Rust, is only counted.
        assert!(!md.contains("CUDA_SUPPORTED_ARCHS"), "{md}");
    }
}
