//! The layering rules of `docs/architecture.md`, checked on the source tree.
//!
//! Every `crate::<module>` reference in a file under `src/` (code, `use`
//! lines and doc links alike) must point to the same layer or a lower one,
//! no two modules may reference each other through a cycle (`super::`
//! paths count as the `crate::` paths they name), and within
//! `stages` no stage may reference a stage that runs after it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, top to bottom; a module may use its own layer and those after it.
const LAYERS: &[(&str, &[&str])] = &[
    ("cli", &["main", "cli"]),
    ("ops", &["ops"]),
    ("pipeline", &["pipeline"]),
    ("cache", &["cache"]),
    ("stages", &["stages"]),
    ("host", &["host"]),
    ("store", &["store"]),
    ("recipe", &["recipe"]),
    (
        "leaf",
        &["exit", "progress", "shell", "config_text", "regular_file"],
    ),
];

/// The stages in the order a build runs them.
const STAGE_ORDER: &[&str] = &[
    "source",
    "requires",
    "lock",
    "wheelhouse",
    "ext",
    "rust",
    "wheel",
    "venv",
    "identity",
    "smoke",
    "oracle",
];

fn rank(top: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, mods)| mods.contains(&top))
}

/// The module a file is (`store/gc.rs` -> `store::gc`, `store/mod.rs` ->
/// `store`, `stages/smoke/golden.rs` -> `stages::smoke`: a stage's own
/// submodules count as the stage).
fn module_of(rel: &str) -> String {
    let rel = rel.trim_end_matches(".rs");
    let parts: Vec<&str> = rel.split('/').filter(|p| *p != "mod").collect();
    parts.iter().take(2).copied().collect::<Vec<_>>().join("::")
}

/// Every `crate::a::b` reference of `text`, as the module path `a` or
/// `a::b` (the latter when `a::b` is a module of `modules`). A group
/// (`crate::{a, b}`, `crate::a::{b, c}`) gives one reference per item.
fn references(text: &str, modules: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        // `oracle_build::` in main.rs is the same crate seen from the binary.
        let before_ok = i == 0 || {
            let c = rest.as_bytes()[i - 1];
            !(c.is_ascii_alphanumeric() || c == b'_')
        };
        rest = &rest[i + "crate::".len()..];
        if !before_ok {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let prefix = &rest[..end];
        let mut paths: Vec<String> = Vec::new();
        match rest[end..].strip_prefix('{') {
            Some(group) if prefix.is_empty() || prefix.ends_with("::") => {
                let close = group.find('}').unwrap_or(group.len());
                for item in group[..close].split(',') {
                    paths.push(format!("{prefix}{}", item.trim()));
                }
            }
            _ => paths.push(prefix.to_string()),
        }
        for p in paths {
            let segs: Vec<&str> = p.split("::").filter(|s| !s.is_empty()).collect();
            let Some(first) = segs.first() else { continue };
            let two = segs.get(1).map(|s| format!("{first}::{s}"));
            match two {
                Some(t) if modules.contains(&t) => out.push(t),
                _ => out.push(first.to_string()),
            }
        }
    }
    out
}

/// `text` of the file `rel` with every `super::` written as the `crate::`
/// path it names, so that a reference between two files of one directory
/// (`use super::manifest::X` in `store/stamps.rs`) is an edge like any
/// other. Below the file's `mod tests`, `super::` is the file itself.
/// A `mod.rs` using its own children by plain paths (`pub use gc::X`) is
/// not an edge: a module may hold its submodules.
fn with_super_resolved(rel: &str, text: &str) -> String {
    let segs: Vec<&str> = rel
        .trim_end_matches(".rs")
        .split('/')
        .filter(|p| *p != "mod")
        .collect();
    let path = |segs: &[&str]| segs.iter().map(|s| format!("{s}::")).collect::<String>();
    let parent = format!("crate::{}", path(&segs[..segs.len().saturating_sub(1)]));
    let own = format!("crate::{}", path(&segs));
    let split = text.find("\nmod tests").unwrap_or(text.len());
    let (code, tests) = text.split_at(split);
    format!(
        "{}{}",
        code.replace("super::", &parent),
        tests.replace("super::", &own)
    )
}

/// The violations of the rules in `files` (path relative to `src/`, text).
pub(crate) fn violations(files: &[(String, String)]) -> Vec<String> {
    let mut modules: BTreeSet<String> = BTreeSet::new();
    for (rel, _) in files {
        if rel != "lib.rs" {
            modules.insert(module_of(rel));
        }
    }
    let mut problems = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in files {
        if rel == "lib.rs" || rel == "layering.rs" {
            continue;
        }
        let from = module_of(rel);
        let from_top = from.split("::").next().unwrap_or_default().to_string();
        let Some(from_rank) = rank(&from_top) else {
            problems.push(format!("{rel}: module `{from_top}` is in no layer"));
            continue;
        };
        let text = if rel == "main.rs" {
            text.replace("oracle_build::", "crate::")
        } else {
            with_super_resolved(rel, text)
        };
        for to in references(&text, &modules) {
            let to_top = to.split("::").next().unwrap_or_default().to_string();
            let Some(to_rank) = rank(&to_top) else {
                problems.push(format!("{rel}: `crate::{to}` is in no layer"));
                continue;
            };
            if to_rank < from_rank {
                problems.push(format!(
                    "{rel}: `crate::{to}` points up, from layer {} to layer {}",
                    LAYERS[from_rank].0, LAYERS[to_rank].0
                ));
            }
            if from_top == "stages" && to_top == "stages" {
                let stage = |m: &str| {
                    m.split("::")
                        .nth(1)
                        .and_then(|s| STAGE_ORDER.iter().position(|x| *x == s))
                };
                if let (Some(a), Some(b)) = (stage(&from), stage(&to))
                    && b > a
                {
                    problems.push(format!(
                        "{rel}: stage `{}` uses the later stage `{}`",
                        STAGE_ORDER[a], STAGE_ORDER[b]
                    ));
                }
            }
            if to != from {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    problems.extend(cycles(&edges));
    problems
}

/// One line per cycle found in `edges` (depth-first search).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        out: &mut Vec<String>,
    ) {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(n.to_string());
            out.push(format!("modules form a cycle: {}", cycle.join(" -> ")));
            return;
        }
        if done.contains(n) {
            return;
        }
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            visit(m, edges, stack, done, out);
        }
        stack.pop();
        done.insert(n.to_string());
    }
    let mut out = Vec::new();
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        visit(n, edges, &mut Vec::new(), &mut done, &mut out);
    }
    out
}

fn source_files(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            source_files(&p, base, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p
                .strip_prefix(base)
                .unwrap_or(&p)
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            out.push((rel, text));
        }
    }
}

#[test]
fn the_source_tree_keeps_its_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &src, &mut files);
    assert!(
        files.len() > 20,
        "found only {} files under src/",
        files.len()
    );
    let problems = violations(&files);
    assert!(
        problems.is_empty(),
        "layering violations (docs/architecture.md):\n{}",
        problems.join("\n")
    );
}

#[cfg(test)]
fn tree(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

#[test]
fn an_upward_reference_is_reported() {
    let files = tree(&[
        ("store/mod.rs", "use crate::exit::bad_input;"),
        ("store/gc.rs", "use crate::stages::oracle::OracleRecord;"),
        ("stages/venv.rs", "use crate::store::Store;"),
    ]);
    let p = violations(&files);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains("store/gc.rs") && p[0].contains("points up"),
        "{p:?}"
    );
}

#[test]
fn a_grouped_import_and_the_binary_are_checked() {
    let files = tree(&[
        ("recipe/mod.rs", "use crate::{exit, store};"),
        ("store/mod.rs", ""),
        ("main.rs", "use oracle_build::ops;"),
        ("ops/mod.rs", ""),
    ]);
    let p = violations(&files);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].contains("recipe/mod.rs") && p[0].contains("crate::store"));
}

#[test]
fn a_cycle_inside_one_layer_is_reported() {
    let files = tree(&[
        ("ops/a.rs", "use crate::ops::b::X;"),
        ("ops/b.rs", "use crate::ops::a::Y;"),
        ("ops/c.rs", "use crate::ops::a::Y;"),
    ]);
    let p = violations(&files);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].contains("cycle"), "{p:?}");
}

#[test]
fn a_cycle_through_super_paths_is_reported() {
    // The circle of issue 26: two files of one directory naming each other
    // as `super::x`, which the `crate::` paths alone never showed.
    let files = tree(&[
        (
            "store/mod.rs",
            "mod manifest;\nmod stamps;\npub use stamps::Stamps;",
        ),
        ("store/manifest.rs", "use super::stamps::{STAMPS, Stamps};"),
        (
            "store/stamps.rs",
            "use super::manifest::Manifest;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}",
        ),
    ]);
    let p = violations(&files);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains("cycle") && p[0].contains("store::manifest -> store::stamps"),
        "{p:?}"
    );
    // One way only, and a test module's `super::*`, are no cycle.
    let files = tree(&[
        ("store/mod.rs", "pub use stamps::Stamps;"),
        ("store/manifest.rs", "use super::fsutil::write_json;"),
        (
            "store/stamps.rs",
            "use super::manifest::Manifest;\nuse super::{Bucket, fsutil};\nmod tests {\n    use super::*;\n}",
        ),
        ("store/fsutil.rs", "pub fn write_json() {}"),
    ]);
    let p = violations(&files);
    assert!(p.is_empty(), "{p:?}");
}

#[test]
fn a_stage_using_a_later_stage_is_reported() {
    let files = tree(&[
        ("stages/lock.rs", "use crate::stages::wheel::plan;"),
        ("stages/wheel.rs", "use crate::stages::lock::Locked;"),
        (
            "stages/smoke/golden.rs",
            "use crate::stages::source::Range;",
        ),
        ("stages/source.rs", ""),
        ("stages/smoke/mod.rs", ""),
    ]);
    let p = violations(&files);
    assert!(
        p.iter()
            .any(|l| l.contains("stage `lock` uses the later stage `wheel`")),
        "{p:?}"
    );
    assert!(p.iter().all(|l| !l.contains("golden")), "{p:?}");
}

#[test]
fn an_unknown_top_level_module_is_reported() {
    let files = tree(&[("gc.rs", "use crate::store::Store;"), ("store/mod.rs", "")]);
    let p = violations(&files);
    assert!(p.iter().any(|l| l.contains("in no layer")), "{p:?}");
}
