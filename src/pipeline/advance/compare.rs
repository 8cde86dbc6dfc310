//! The comparison of two oracles: recipe, identity, installed packages and
//! smoke cases (the data of the [`super::AdvanceReport`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::{CaseComparison, Delta, FamilyDelta, PackageDelta};
use crate::recipe::Recipe;
use crate::stages::identity::Identity;
use crate::stages::smoke::golden;
use crate::stages::smoke::{CaseResult, SmokeReport};
use crate::stages::wheel::families::{KernelFamily, built_names};

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

/// The kernel families built by TO and not FROM (gained) and by FROM and
/// not TO (lost, with TO's reason), from each wheel's `kernel_families`.
pub fn family_delta(from: Option<&[KernelFamily]>, to: Option<&[KernelFamily]>) -> FamilyDelta {
    let (Some(from), Some(to)) = (from, to) else {
        let side = if from.is_none() { "FROM" } else { "TO" };
        return FamilyDelta {
            not_known: Some(format!(
                "{side}'s wheel records no kernel families (built before they were read, and no build.log to read them from)"
            )),
            ..FamilyDelta::default()
        };
    };
    let (a, b) = (built_names(from), built_names(to));
    let gained = b
        .iter()
        .filter(|n| !a.contains(n))
        .map(|n| {
            to.iter()
                .find(|f| &f.name == n && f.built)
                .map_or_else(|| n.clone(), KernelFamily::describe)
        })
        .collect();
    let lost = a
        .iter()
        .filter(|n| !b.contains(n))
        .map(|n| {
            let said: Vec<String> = to
                .iter()
                .filter(|f| &f.name == n)
                .map(KernelFamily::describe)
                .collect();
            if said.is_empty() {
                format!("{n}: TO's configure did not report it")
            } else {
                said.join("; ")
            }
        })
        .collect();
    FamilyDelta {
        gained,
        lost,
        kept: a.iter().filter(|n| b.contains(n)).count(),
        not_known: None,
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

/// Compares every case of TO's smoke run with FROM's run of the same case
/// (per prompt, for a case with several).
pub fn compare_cases(
    from: &SmokeReport,
    to: &SmokeReport,
    near_tie_nats: f64,
) -> Vec<CaseComparison> {
    to.cases
        .iter()
        .map(|t| {
            let f = from
                .cases
                .iter()
                .find(|c| c.name == t.name && c.prompt_index == t.prompt_index);
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
        prompt_index: to.prompt_index,
        prompt: to.prompt.clone(),
        to_runs: super::goldens::determinism(to),
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
            out.status = if d.near_tie {
                "near-tie flip"
            } else {
                "drifted"
            }
            .into();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_gained_and_lost_name_to_s_line_and_reason() {
        use crate::stages::wheel::families::parse;
        let from = parse(
            "-- Building SM12x NVFP4 for archs: 12.0a;12.1a\n-- Building Marlin kernels for archs: 8.0\n-- Not building CUTLASS MLA as no compatible archs were found.\n",
        );
        let to = parse(
            "-- Not building SM12x NVFP4 as no compatible archs were found.\n-- Building Marlin kernels for archs: 8.0\n-- Building CUTLASS MLA for archs: 10.0a\n",
        );
        let d = family_delta(Some(&from[..]), Some(&to[..]));
        assert_eq!(d.gained, ["CUTLASS MLA: built for 10.0a"]);
        assert_eq!(
            d.lost,
            ["SM12x NVFP4: not built: no compatible archs were found"]
        );
        assert_eq!((d.kept, d.not_known.is_none()), (1, true));
        let gone = family_delta(Some(&from[..]), Some(&to[1..]));
        assert_eq!(
            gone.lost[0],
            "SM12x NVFP4: TO's configure did not report it"
        );
        assert!(
            family_delta(None, Some(&to[..]))
                .not_known
                .unwrap()
                .starts_with("FROM's")
        );
    }

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
