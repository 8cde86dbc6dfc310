//! The external sources CMake fetches at each side of an advance (issue
//! 37): each name with its URL and revision at FROM and at TO, as the ext
//! stage discovers them in each commit's tree
//! ([`crate::stages::ext::discover_in_mirror`]: `FetchContent_Declare`
//! read from the CMake files, `${VAR}` expanded, branches false for the
//! target left out), marked added, removed, changed or same.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::recipe::LoadedRecipe;
use crate::stages::ext::{self, Discovery, ExtSource, Origin};
use crate::store::Store;

/// One declaration of a source at one side.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ExtAt {
    /// `GIT_REPOSITORY` or `URL`.
    pub url: String,
    /// `GIT_TAG`, or the `URL_HASH` sha256 (`—` when none).
    pub revision: String,
    /// `file:line` of its `FetchContent_Declare`.
    pub at: String,
}

/// One external source compared.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ExtRow {
    /// The FetchContent name.
    pub name: String,
    /// Its declarations at FROM (several: the tree's configure chooses).
    pub from: Vec<ExtAt>,
    /// Its declarations at TO.
    pub to: Vec<ExtAt>,
    /// `added`, `removed`, `changed` (URL or revision) or `same`.
    pub status: String,
}

/// The external sources of both sides.
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct ExtDelta {
    /// Every name declared at either side, by name.
    pub sources: Vec<ExtRow>,
    /// Why a side could not be read (names the side); empty when both were.
    pub not_known: Vec<String>,
}

fn at(s: &ExtSource) -> ExtAt {
    let (url, revision) = match &s.origin {
        Origin::Git { repo, tag } => (repo.clone(), tag.clone()),
        Origin::Url { url, sha256 } => (
            url.clone(),
            sha256.clone().map_or("—".into(), |h| format!("sha256 {h}")),
        ),
    };
    ExtAt {
        url,
        revision,
        at: s.declared_at(),
    }
}

/// The rows of two discoveries (pure).
pub fn compare(from: &Discovery, to: &Discovery) -> Vec<ExtRow> {
    let mut rows: BTreeMap<String, (Vec<ExtAt>, Vec<ExtAt>)> = BTreeMap::new();
    for s in &from.sources {
        rows.entry(s.name.clone()).or_default().0.push(at(s));
    }
    for s in &to.sources {
        rows.entry(s.name.clone()).or_default().1.push(at(s));
    }
    rows.into_iter()
        .map(|(name, (from, to))| {
            let key = |v: &[ExtAt]| {
                let mut k: Vec<(String, String)> = v
                    .iter()
                    .map(|a| (a.url.clone(), a.revision.clone()))
                    .collect();
                k.sort();
                k
            };
            let status = match (from.is_empty(), to.is_empty()) {
                (true, _) => "added",
                (_, true) => "removed",
                _ if key(&from) != key(&to) => "changed",
                _ => "same",
            };
            ExtRow {
                name,
                from,
                to,
                status: status.into(),
            }
        })
        .collect()
}

/// The sources of each side's commit, read from its repository's mirror in
/// the store for its recipe's `build.target_device`.
pub fn ext_delta(store: &Store, from: &LoadedRecipe, to: &LoadedRecipe) -> ExtDelta {
    let (a, b, not_known) = super::deltas::read_sides(store, from, to, ext::discover_in_mirror);
    ExtDelta {
        sources: compare(&a, &b),
        not_known,
    }
}

/// The section as Markdown lines.
pub fn markdown(d: &ExtDelta) -> Vec<String> {
    let mut out = vec![
        "## External sources (what CMake fetches at each commit)".to_string(),
        String::new(),
    ];
    for why in &d.not_known {
        out.push(format!("- not read: {}", why.replace('|', "\\|")));
    }
    if d.sources.is_empty() {
        out.push("No FetchContent source is declared at either commit.".into());
        return out;
    }
    out.push(super::deltas::status_counts(
        d.sources.iter().map(|r| r.status.as_ref()),
    ));
    out.push(String::new());
    out.push("| name | URL | FROM | TO | |".into());
    out.push("|---|---|---|---|---|".into());
    let revs = |v: &[ExtAt]| {
        if v.is_empty() {
            "—".to_string()
        } else {
            v.iter()
                .map(|a| format!("`{}` ({})", a.revision, a.at))
                .collect::<Vec<_>>()
                .join("<br>")
        }
    };
    for r in &d.sources {
        let mut urls: Vec<&str> = r.from.iter().chain(&r.to).map(|a| a.url.as_str()).collect();
        urls.dedup();
        let status = if r.status == "same" {
            "same".to_string()
        } else {
            format!("**{}**", r.status)
        };
        out.push(format!(
            "| {} | {} | {} | {} | {} |",
            r.name,
            urls.join(" → "),
            revs(&r.from),
            revs(&r.to),
            status
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disc(files: &[(&str, &str)]) -> Discovery {
        let read = |p: &str| {
            files
                .iter()
                .find(|(q, _)| *q == p)
                .map(|(_, t)| t.to_string())
        };
        ext::discover_with(&read, "cuda")
    }

    #[test]
    fn sources_are_added_removed_changed_or_the_same() {
        let from = disc(&[(
            "CMakeLists.txt",
            "include(FetchContent)\nset(CUTLASS_REVISION \"v4.0.0\")\nFetchContent_Declare(cutlass GIT_REPOSITORY https://github.com/nvidia/cutlass.git GIT_TAG ${CUTLASS_REVISION})\nFetchContent_Declare(oneDNN GIT_REPOSITORY https://github.com/oneapi-src/oneDNN.git GIT_TAG v3.8)\nFetchContent_Declare(gone GIT_REPOSITORY https://example.com/gone.git GIT_TAG abc)\n",
        )]);
        let to = disc(&[(
            "CMakeLists.txt",
            "include(FetchContent)\nset(CUTLASS_REVISION \"v4.2.1\")\nFetchContent_Declare(cutlass GIT_REPOSITORY https://github.com/nvidia/cutlass.git GIT_TAG ${CUTLASS_REVISION})\nFetchContent_Declare(oneDNN GIT_REPOSITORY https://github.com/oneapi-src/oneDNN.git GIT_TAG v3.8)\nFetchContent_Declare(flashmla GIT_REPOSITORY https://github.com/vllm-project/FlashMLA GIT_TAG 0123abcd)\n",
        )]);
        let rows = compare(&from, &to);
        let got: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r.name.as_str(), r.status.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("cutlass", "changed"),
                ("flashmla", "added"),
                ("gone", "removed"),
                ("oneDNN", "same")
            ]
        );
        assert_eq!(rows[0].from[0].revision, "v4.0.0");
        assert_eq!(rows[0].to[0].revision, "v4.2.1");
        assert_eq!(rows[0].to[0].at, "CMakeLists.txt:3");
        let md = markdown(&ExtDelta {
            sources: rows,
            not_known: vec![],
        })
        .join("\n");
        assert!(
            md.contains("1 added, 1 removed, 1 changed, 1 same."),
            "{md}"
        );
        assert!(
            md.contains("| cutlass | https://github.com/nvidia/cutlass.git | `v4.0.0` (CMakeLists.txt:3) | `v4.2.1` (CMakeLists.txt:3) | **changed** |"),
            "{md}"
        );
    }
}
