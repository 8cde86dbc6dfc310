//! The pin-advance review report (README.md, "Advancing a pin"): what changed
//! between two oracles and what did not, as data and as Markdown.
//!
//! Everything here compares records that already exist (recipes, oracle
//! records, smoke results, installed distributions); the command layer
//! (`ops::advance`) builds and gates the oracles first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::recipe::Recipe;
use crate::stages::identity::Identity;
use crate::stages::smoke::golden::{self, GoldenDiff};
use crate::stages::smoke::{CaseResult, SmokeReport};
use crate::stages::source::Range;

/// One side of the advance (FROM or TO).
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Recipe name.
    pub recipe: String,
    /// Where the recipe was read.
    pub origin: String,
    /// The commit.
    pub commit: String,
    /// Source repository URL.
    pub repo: String,
    /// The oracle venv.
    pub oracle: PathBuf,
    /// Measured identity.
    pub identity: Identity,
    /// `source` or `precompiled`.
    pub build_mode: String,
    /// sha256 of the installed wheel.
    pub wheel_sha256: String,
    /// Seconds the wheel build took (when it was built by this store).
    pub build_seconds: Option<f64>,
    /// Gate verdict and reasons, under the shared smoke configuration.
    pub verdict: String,
    /// Why not gateable.
    pub reasons: Vec<String>,
}

/// A field that may differ between the two sides.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Delta {
    /// Dotted field name.
    pub field: String,
    /// FROM's value (null: absent).
    pub from: Value,
    /// TO's value (null: absent).
    pub to: Value,
    /// Whether they differ.
    pub changed: bool,
}

/// How the installed distributions differ.
#[derive(Debug, Clone, Serialize, Default)]
pub struct PackageDelta {
    /// Only in TO: (name, version).
    pub added: Vec<(String, String)>,
    /// Only in FROM: (name, version).
    pub removed: Vec<(String, String)>,
    /// In both at different versions: (name, FROM version, TO version).
    pub changed: Vec<(String, String, String)>,
    /// Distributions at the same version in both.
    pub unchanged: usize,
}

/// The commits between the two pins.
#[derive(Debug, Clone, Serialize)]
pub struct Commits {
    /// `FROM..TO` with short ids.
    pub range: String,
    /// Counts and ancestry, when both commits are in one repository.
    pub counts: Option<Range>,
    /// The upstream repository (FROM's).
    pub upstream: String,
    /// Upstream branches and tags that contain TO (empty: none; null: TO is
    /// not in the upstream repository at all).
    pub upstream_refs: Option<Vec<String>>,
    /// Set when TO is not reachable from any upstream branch or tag (a fork
    /// or an unmerged pull request): what a reviewer must know.
    pub flag: Option<String>,
}

/// One smoke case compared between FROM and TO.
#[derive(Debug, Clone, Serialize)]
pub struct CaseComparison {
    /// Case name.
    pub name: String,
    /// `identical`, `drifted` or `not comparable`.
    pub status: String,
    /// Why not comparable, or a one-line description of the drift.
    pub detail: String,
    /// The first divergence (drifted only): position, both tokens, gap, near-tie.
    pub divergence: Option<GoldenDiff>,
    /// FROM's output text.
    pub from_text: String,
    /// TO's output text.
    pub to_text: String,
}

/// The whole review.
#[derive(Debug, Clone, Serialize)]
pub struct AdvanceReport {
    /// The pin in force.
    pub from: Side,
    /// The candidate.
    pub to: Side,
    /// The candidate recipe written for a commit TO, if any.
    pub candidate_recipe: Option<PathBuf>,
    /// Commit range and upstream reachability.
    pub commits: Commits,
    /// Recipe fields that differ.
    pub recipe_delta: Vec<Delta>,
    /// Installed distributions that differ (the resolved lock of each oracle).
    pub package_delta: PackageDelta,
    /// Identity fields side by side.
    pub identity: Vec<Delta>,
    /// Per smoke case.
    pub cases: Vec<CaseComparison>,
    /// What this comparison does not establish.
    pub does_not_establish: Vec<String>,
    /// `--accept`: where the alias now points, and the rollback root.
    pub accepted: Option<Value>,
}

/// Dotted-path differences between two recipes (name aside, which always differs).
pub fn recipe_delta(from: &Recipe, to: &Recipe) -> Vec<Delta> {
    let mut a = BTreeMap::new();
    let mut b = BTreeMap::new();
    flatten(
        "",
        &serde_json::to_value(from).unwrap_or(Value::Null),
        &mut a,
    );
    flatten("", &serde_json::to_value(to).unwrap_or(Value::Null), &mut b);
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| k.as_str() != "name")
        .filter_map(|k| {
            let (x, y) = (
                a.get(k).cloned().unwrap_or(Value::Null),
                b.get(k).cloned().unwrap_or(Value::Null),
            );
            (x != y).then(|| Delta {
                field: k.clone(),
                from: x,
                to: y,
                changed: true,
            })
        })
        .collect()
}

fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::Null => {}
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// Identity fields of both sides; `changed` marks the ones that differ.
pub fn identity_delta(from: &Identity, to: &Identity) -> Vec<Delta> {
    let pick = |id: &Identity| -> Vec<(&'static str, Value)> {
        vec![
            ("commit", id.commit.clone().into()),
            ("runtime_version", id.runtime_version.clone().into()),
            (
                "distribution_version",
                id.distribution_version.clone().into(),
            ),
            ("flashinfer_version", id.flashinfer_version.clone().into()),
            ("torch_version", id.torch_version.clone().into()),
            ("torch_cuda", id.torch_cuda.clone().into()),
            ("python_version", id.python_version.clone().into()),
            ("platform", id.platform.clone().into()),
            ("editable", id.editable.into()),
            ("build_mode", id.build_mode.clone().into()),
            (
                "compiled_extensions",
                Value::from(
                    id.compiled_extensions
                        .iter()
                        .map(|e| e.path.clone())
                        .collect::<Vec<_>>(),
                ),
            ),
        ]
    };
    pick(from)
        .into_iter()
        .zip(pick(to))
        .map(|((field, x), (_, y))| Delta {
            field: field.to_string(),
            changed: x != y,
            from: x,
            to: y,
        })
        .collect()
}

/// The distributions installed in the venv at `venv`: normalized name -> version,
/// read from `*.dist-info` directory names (PEP 376/PEP 427 naming).
pub fn installed(venv: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(lib) = std::fs::read_dir(venv.join("lib")) else {
        return out;
    };
    for py in lib.flatten() {
        let Ok(site) = std::fs::read_dir(py.path().join("site-packages")) else {
            continue;
        };
        for e in site.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".dist-info")
                && let Some((dist, version)) = stem.split_once('-')
            {
                out.insert(normalize(dist), version.to_string());
            }
        }
    }
    out
}

/// PEP 503 normalized distribution name.
pub fn normalize(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    let mut out = String::new();
    for c in lower.chars() {
        let c = if matches!(c, '_' | '.') { '-' } else { c };
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
    }
    out
}

/// Added, removed and changed distributions from FROM to TO.
pub fn package_delta(
    from: &BTreeMap<String, String>,
    to: &BTreeMap<String, String>,
) -> PackageDelta {
    let mut d = PackageDelta::default();
    for (name, v) in from {
        match to.get(name) {
            None => d.removed.push((name.clone(), v.clone())),
            Some(w) if w != v => d.changed.push((name.clone(), v.clone(), w.clone())),
            Some(_) => d.unchanged += 1,
        }
    }
    for (name, v) in to {
        if !from.contains_key(name) {
            d.added.push((name.clone(), v.clone()));
        }
    }
    d
}

/// Compares every case of TO's smoke run with FROM's run of the same case.
pub fn compare_cases(
    from: &SmokeReport,
    to: &SmokeReport,
    near_tie_nats: f64,
) -> Vec<CaseComparison> {
    to.cases
        .iter()
        .map(|t| {
            let f = from.cases.iter().find(|c| c.name == t.name);
            compare_case(f, t, near_tie_nats)
        })
        .collect()
}

fn failed(c: &CaseResult) -> Option<String> {
    (c.runs == 0 || c.error.is_some()).then(|| {
        c.problems
            .first()
            .cloned()
            .unwrap_or_else(|| "it did not run".into())
    })
}

fn compare_case(from: Option<&CaseResult>, to: &CaseResult, near_tie_nats: f64) -> CaseComparison {
    let mut out = CaseComparison {
        name: to.name.clone(),
        status: "not comparable".into(),
        detail: String::new(),
        divergence: None,
        from_text: from.map(|f| f.text.clone()).unwrap_or_default(),
        to_text: to.text.clone(),
    };
    let Some(from) = from else {
        out.detail = "FROM has no such case".into();
        return out;
    };
    if let Some(why) = failed(from) {
        out.detail = format!("FROM failed: {why}");
        return out;
    }
    if let Some(why) = failed(to) {
        out.detail = format!("TO failed: {why}");
        return out;
    }
    let empty = serde_json::Map::new();
    let diffs = golden::config_diffs(
        from.engine_config.as_object().unwrap_or(&empty),
        to.engine_config.as_object().unwrap_or(&empty),
        false,
    );
    if !diffs.is_empty() {
        out.detail = format!(
            "engine configurations differ: {}",
            diffs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        );
        return out;
    }
    if from.prompt_token_ids != to.prompt_token_ids {
        out.detail = "the prompt tokenizes differently (tokenizer changed); outputs are not comparable token by token".into();
        return out;
    }
    if !from.deterministic || !to.deterministic {
        out.detail = "a side is not deterministic (its runs disagree)".into();
        return out;
    }
    match golden::diff(
        &from.output_token_ids,
        &from.logprobs,
        &to.output_token_ids,
        &to.logprobs,
        near_tie_nats,
    ) {
        None => {
            out.status = "identical".into();
            out.detail = format!("{} tokens identical", to.output_token_ids.len());
        }
        Some(d) => {
            out.status = "drifted".into();
            let gap = d
                .gap_nats
                .or(d.golden_gap_nats)
                .map_or("gap unknown".to_string(), |g| {
                    format!("gap {:.3} nats", g.abs())
                });
            out.detail = format!(
                "first divergent position {}: FROM {} {:?} vs TO {} {:?}, {gap}{}",
                d.position,
                d.golden_token.map_or("(end)".into(), |t| t.to_string()),
                d.golden_text.clone().unwrap_or_default(),
                d.token.map_or("(end)".into(), |t| t.to_string()),
                d.text.clone().unwrap_or_default(),
                if d.near_tie {
                    " — near-tie (under the threshold): not evidence of a regression"
                } else {
                    ""
                }
            );
            out.divergence = Some(d);
        }
    }
    out
}

/// The standing limits of the comparison, plus any that apply to this one.
pub fn does_not_establish(r: &AdvanceReport) -> Vec<String> {
    let mut out = vec![
        "A match on these prompts does not establish parity on other prompts, lengths, batch sizes or sampling settings.".to_string(),
        "A near-tie flip is not evidence of a regression: the two candidates were within the threshold, and a different engine configuration can flip them.".to_string(),
        "Identical identities and outputs do not establish identical performance; tokens/s here are smoke-run figures, not benchmarks.".to_string(),
        "Greedy agreement at batch 1 does not establish agreement of log-probabilities beyond the recorded top-k.".to_string(),
    ];
    if r.commits.flag.is_some() {
        out.push("TO is not on an upstream branch or tag: nothing here says it was reviewed or released upstream.".into());
    }
    if r.cases.iter().any(|c| c.status == "not comparable") {
        out.push("Cases marked not comparable say nothing about drift either way.".into());
    }
    out
}

fn show(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(show).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

fn short(c: &str) -> &str {
    &c[..12.min(c.len())]
}

/// The report as Markdown.
pub fn markdown(r: &AdvanceReport) -> String {
    let mut m = String::new();
    let mut line = |s: String| {
        m.push_str(&s);
        m.push('\n');
    };
    line(format!(
        "# Pin advance: {} → {}",
        r.from.recipe, r.to.recipe
    ));
    line(String::new());
    line(format!(
        "- FROM `{}` ({}) — verdict **{}**",
        r.from.commit, r.from.origin, r.from.verdict
    ));
    line(format!(
        "- TO `{}` ({}) — verdict **{}**",
        r.to.commit, r.to.origin, r.to.verdict
    ));
    if let Some(p) = &r.candidate_recipe {
        line(format!("- candidate recipe written: `{}`", p.display()));
    }
    for (side, s) in [("FROM", &r.from), ("TO", &r.to)] {
        for reason in &s.reasons {
            line(format!("  - {side} not gateable: {reason}"));
        }
    }
    line(String::new());
    line("## Commits".into());
    line(String::new());
    line(format!("- range `{}`", r.commits.range));
    match &r.commits.counts {
        Some(c) => line(format!(
            "- {} commit(s) in FROM..TO, {} in TO..FROM; TO {} FROM",
            c.ahead,
            c.behind,
            if c.descends {
                "descends from"
            } else {
                "does not descend from"
            }
        )),
        None => line("- the commits are not in one repository: no count".into()),
    }
    match &r.commits.upstream_refs {
        Some(refs) if !refs.is_empty() => {
            let shown: Vec<&str> = refs.iter().take(5).map(String::as_str).collect();
            line(format!(
                "- TO is reachable from upstream `{}`: {}",
                r.commits.upstream,
                shown.join(", ")
            ))
        }
        _ => {}
    }
    if let Some(flag) = &r.commits.flag {
        line(format!("- **FLAG:** {flag}"));
    }
    line(String::new());
    line("## Recipe delta".into());
    line(String::new());
    if r.recipe_delta.is_empty() {
        line("No field differs besides the name.".into());
    } else {
        line("| field | FROM | TO |".into());
        line("|---|---|---|".into());
        for d in &r.recipe_delta {
            line(format!(
                "| `{}` | {} | {} |",
                d.field,
                show(&d.from),
                show(&d.to)
            ));
        }
    }
    line(String::new());
    line("## Lock delta (installed distributions)".into());
    line(String::new());
    let p = &r.package_delta;
    line(format!(
        "{} added, {} removed, {} changed, {} unchanged.",
        p.added.len(),
        p.removed.len(),
        p.changed.len(),
        p.unchanged
    ));
    if !(p.added.is_empty() && p.removed.is_empty() && p.changed.is_empty()) {
        line(String::new());
        line("| package | FROM | TO |".into());
        line("|---|---|---|".into());
        for (n, a, b) in &p.changed {
            line(format!("| {n} | {a} | {b} |"));
        }
        for (n, v) in &p.added {
            line(format!("| {n} | — | {v} |"));
        }
        for (n, v) in &p.removed {
            line(format!("| {n} | {v} | — |"));
        }
    }
    line(String::new());
    line("## Identity".into());
    line(String::new());
    line("| field | FROM | TO | |".into());
    line("|---|---|---|---|".into());
    for d in &r.identity {
        line(format!(
            "| {} | {} | {} | {} |",
            d.field,
            show(&d.from),
            show(&d.to),
            if d.changed { "**changed**" } else { "" }
        ));
    }
    line(String::new());
    line("## Build".into());
    line(String::new());
    line("| | FROM | TO |".into());
    line("|---|---|---|".into());
    line(format!(
        "| build mode | {} | {} |",
        r.from.build_mode, r.to.build_mode
    ));
    line(format!(
        "| wheel sha256 | `{}` | `{}` |",
        short(&r.from.wheel_sha256),
        short(&r.to.wheel_sha256)
    ));
    let secs = |s: Option<f64>| s.map_or("—".into(), |s| format!("{s:.1} s"));
    line(format!(
        "| build time | {} | {} |",
        secs(r.from.build_seconds),
        secs(r.to.build_seconds)
    ));
    line(String::new());
    line("## Smoke cases (same configuration on both sides)".into());
    line(String::new());
    line("| case | result | detail |".into());
    line("|---|---|---|".into());
    for c in &r.cases {
        line(format!(
            "| {} | **{}** | {} |",
            c.name,
            c.status,
            c.detail.replace('|', "\\|")
        ));
    }
    line(String::new());
    line("## Verdict".into());
    line(String::new());
    line(format!("- FROM: {}", r.from.verdict));
    line(format!("- TO: {}", r.to.verdict));
    if let Some(a) = &r.accepted {
        line(format!(
            "- accepted: the alias now points at TO ({})",
            show(&a["path"])
        ));
    }
    line(String::new());
    line("## What this comparison does not establish".into());
    line(String::new());
    for s in &r.does_not_establish {
        line(format!("- {s}"));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_pep503_normalized() {
        assert_eq!(normalize("Flashinfer_Python"), "flashinfer-python");
        assert_eq!(normalize("a.__b"), "a-b");
    }

    #[test]
    fn package_delta_sorts_changes() {
        let a: BTreeMap<String, String> =
            [("x".into(), "1".into()), ("y".into(), "1".into())].into();
        let b: BTreeMap<String, String> =
            [("x".into(), "2".into()), ("z".into(), "1".into())].into();
        let d = package_delta(&a, &b);
        assert_eq!(d.changed, vec![("x".into(), "1".into(), "2".into())]);
        assert_eq!(d.added, vec![("z".into(), "1".into())]);
        assert_eq!(d.removed, vec![("y".into(), "1".into())]);
    }
}
