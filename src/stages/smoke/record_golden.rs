//! `--record-golden`: the golden each clean case would record, and writing
//! them all (or none, when one would replace a golden it disagrees with).

use std::path::PathBuf;

use anyhow::{Context, Result};
use fs_err as fs;
use serde_json::{Value, json};

use super::golden::{self, GoldenDiff, GoldenState};
use super::{CaseResult, Options, boot_id, describe_diff};
use crate::host::toolchain;
use crate::progress;
use crate::recipe::{Case, LoadedRecipe};
use crate::store::write_json;

/// A golden to write once every case has run.
pub(super) struct Pending {
    pub(super) case: String,
    pub(super) path: PathBuf,
    pub(super) golden: golden::Golden,
    /// Where the golden already there disagrees with this run, if it does.
    pub(super) replaces: Option<GoldenDiff>,
    /// Where copies go (the store's copy of a golden kept beside the recipe).
    pub(super) copies: Vec<PathBuf>,
    /// Why the file already at `path` is not a golden (then it is never replaced).
    pub(super) foreign: Option<String>,
    /// Which prompt of a several-prompt case this is (`None`: a single-prompt case).
    pub(super) prompt_index: Option<usize>,
    /// How many prompts the case has (1 for a single-prompt case).
    pub(super) prompts: usize,
}

/// The golden `case` would record (see [`write_goldens`]), or `None` (with
/// the reason in the result) when this run must not be recorded.
pub(super) fn record_golden(
    result: &mut CaseResult,
    loc: &golden::Location,
    lr: &LoadedRecipe,
    case: &Case,
    opts: &Options,
    probe_ok: bool,
) -> Option<Pending> {
    if loc.kind == golden::Kind::Npy {
        result.problems.push(format!(
            "golden {} is a numpy golden; --record-golden writes JSON goldens only",
            loc.path.display()
        ));
        return None;
    }
    if !result.problems.is_empty() || !probe_ok {
        result.notes.push(format!(
            "golden {} not recorded: {}",
            loc.path.display(),
            if probe_ok {
                "the case did not run cleanly"
            } else {
                "the probe failed"
            }
        ));
        return None;
    }
    // Something at the golden path that does not read as a golden (a model's
    // config.json, a directory) is someone else's file: never overwritten.
    let existing = (std::fs::symlink_metadata(&loc.path).is_ok())
        .then(|| golden::load(loc, result.prompt.as_deref(), &result.prompt_token_ids));
    let foreign = match &existing {
        Some(Err(e)) => Some(e.clone()),
        Some(Ok(_)) if !loc.path.is_file() => Some("it is not a regular file".to_string()),
        _ => None,
    };
    let replaces = existing.and_then(Result::ok).and_then(|old| {
        golden::diff(
            &old.output_token_ids,
            &old.logprobs,
            &result.output_token_ids,
            &result.logprobs,
            lr.recipe.smoke.near_tie_nats,
        )
    });
    let golden = golden::Golden {
        format: golden::FORMAT.into(),
        case: case.name.clone(),
        model: Some(result.model.clone()),
        revision: case.revision.clone(),
        prompt: result.prompt.clone(),
        prompt_token_ids: Some(result.prompt_token_ids.clone()),
        output_token_ids: result.output_token_ids.clone(),
        text: Some(result.text.clone()),
        max_tokens: Some(case.max_tokens),
        logprobs_k: Some(lr.recipe.smoke.logprobs),
        logprobs: result.logprobs.clone(),
        engine_config: Some(result.engine_config.clone()),
        mode: Some(case.mode),
        env: result.env.clone(),
        oracle: opts
            .record
            .as_ref()
            .map_or(Value::Null, |r| r.oracle.clone()),
        captured: Some(jiff::Timestamp::now().to_string()),
        host: json!({"boot_id": boot_id(), "gpus": toolchain::gpus()}),
        model_manifest: result
            .model_manifest
            .as_ref()
            .map(super::model::ModelManifest::for_golden),
        advance: opts
            .record
            .as_ref()
            .and_then(|r| r.advance.get(&case.name).cloned()),
    };
    // A golden found only in the store's copy is recorded beside the recipe
    // again; the store keeps a copy of every JSON golden.
    let file = format!("{}.json", case.name);
    let path = match (loc.explicit, opts.goldens_dirs.first()) {
        (false, Some(d)) => d.join(&file),
        _ => loc.path.clone(),
    };
    let copies = opts
        .goldens_dirs
        .iter()
        .map(|d| d.join(&file))
        .filter(|p| *p != path)
        .collect();
    result.golden_path = Some(path.clone());
    Some(Pending {
        case: case.name.clone(),
        path,
        golden,
        replaces,
        copies,
        foreign,
        prompt_index: result.prompt_index,
        prompts: result.prompt_index.map_or(1, |_| {
            super::prompts::case_prompts(lr, case)
                .and_then(Result::ok)
                .map_or(1, |p| p.len())
        }),
    })
}

/// Writes the recorded goldens, all or none: without `force`, a golden the
/// new output disagrees with is not replaced and nothing is written (exit 2,
/// naming each such golden, where it diverges, and the fix). A golden that
/// matches, or none yet, is (re)written.
pub(super) fn write_goldens(
    pending: Vec<Pending>,
    force: bool,
    cases: &mut [CaseResult],
) -> Result<()> {
    let foreign: Vec<String> = pending
        .iter()
        .filter_map(|p| {
            p.foreign
                .as_ref()
                .map(|why| format!("  case {}: {}: {why}", p.case, p.path.display()))
        })
        .collect();
    if !foreign.is_empty() {
        return Err(crate::exit::bad_input(format!(
            "--record-golden refuses to overwrite {} not a golden (not even with --force):\n{}\nno golden was written and the recorded verdict is unchanged. Point the case's `golden:` at a new file, or move the file away.",
            if foreign.len() == 1 {
                "a file that is"
            } else {
                "files that are"
            },
            foreign.join("\n")
        )));
    }
    let diverging: Vec<String> = pending
        .iter()
        .filter_map(|p| {
            p.replaces.as_ref().map(|d| {
                format!(
                    "  case {}: golden {}: {}",
                    p.case,
                    p.path.display(),
                    describe_diff(d)
                )
            })
        })
        .collect();
    if !diverging.is_empty() && !force {
        return Err(crate::exit::bad_input(format!(
            "--record-golden refuses to replace {} the new output disagrees with:\n{}\nno golden was written and the recorded verdict is unchanged. If the new output is the right one, rerun with `--record-golden --force`; to see the mismatch as a gate failure, run `smoke` without --record-golden.",
            if diverging.len() == 1 {
                "a golden"
            } else {
                "goldens"
            },
            diverging.join("\n")
        )));
    }
    let mut sets: Vec<(String, Vec<Pending>)> = Vec::new();
    let mut singles = Vec::new();
    for p in pending {
        if p.prompt_index.is_none() {
            singles.push(p);
        } else if let Some((_, set)) = sets.iter_mut().find(|(c, _)| *c == p.case) {
            set.push(p);
        } else {
            sets.push((p.case.clone(), vec![p]));
        }
    }
    for (case, mut set) in sets {
        // All of a case's prompts, or none of them.
        let want = set.first().map_or(0, |p| p.prompts);
        if set.len() != want {
            for result in cases.iter_mut().filter(|c| c.name == case) {
                result.notes.push(format!(
                    "golden not recorded: {} of the case's {want} prompts ran cleanly (a golden set holds every prompt)",
                    set.len()
                ));
            }
            continue;
        }
        set.sort_by_key(|p| p.prompt_index);
        let first = &set[0];
        let file = golden::GoldenSet {
            format: golden::SET_FORMAT.into(),
            case: case.clone(),
            entries: set.iter().map(|p| p.golden.clone()).collect(),
            advance: first.golden.advance.clone(),
        };
        for path in std::iter::once(&first.path).chain(&first.copies) {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            write_json(path, &file)
                .with_context(|| format!("recording golden {}", path.display()))?;
        }
        progress::stage(
            "smoke",
            format!(
                "case {case}: golden of {} prompts recorded in {}",
                set.len(),
                first.path.display()
            ),
        );
        for p in &set {
            if let Some(result) = cases
                .iter_mut()
                .find(|c| c.name == p.case && c.prompt_index == p.prompt_index)
            {
                result.golden = GoldenState::Recorded;
                if let Some(d) = &p.replaces {
                    result.notes.push(format!(
                        "replaced (--force) the previous golden, which {}",
                        describe_diff(d)
                    ));
                }
            }
        }
    }
    for p in singles {
        for path in std::iter::once(&p.path).chain(&p.copies) {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            write_json(path, &p.golden)
                .with_context(|| format!("recording golden {}", path.display()))?;
        }
        progress::stage(
            "smoke",
            format!("case {}: golden recorded in {}", p.case, p.path.display()),
        );
        if let Some(result) = cases.iter_mut().find(|c| c.name == p.case) {
            result.golden = GoldenState::Recorded;
            if let Some(d) = &p.replaces {
                result.notes.push(format!(
                    "replaced (--force) the previous golden, which {}",
                    describe_diff(d)
                ));
            }
        }
    }
    Ok(())
}

/// Records the goldens of a gate already run (`report`, the gate of the
/// oracle of `lr`) into `opts.goldens_dirs`, as `--record-golden --force`
/// would have: every case that ran cleanly, one golden set per case with
/// several prompts, stamped with `opts.record`'s oracle and per-case
/// `advance` record. Used by `advance --accept`, which decided beforehand
/// which changes are accepted. Returns the paths written, per case.
///
/// Errors: a golden location that holds a file that is not a golden (exit
/// 2, nothing written); failures to write.
pub fn record_report(
    lr: &LoadedRecipe,
    report: &mut super::SmokeReport,
    opts: &Options,
) -> Result<Vec<(String, PathBuf)>> {
    let probe_ok = report.probe.is_null() || report.probe["ok"].as_bool().unwrap_or(false);
    let mut pending = Vec::new();
    for result in report.cases.iter_mut() {
        let Some(case) = lr.recipe.smoke.cases.iter().find(|c| c.name == result.name) else {
            continue;
        };
        let loc = golden::locate(lr, &opts.goldens_dirs, case);
        pending.extend(record_golden(result, &loc, lr, case, opts, probe_ok));
    }
    let mut written: Vec<(String, PathBuf)> = Vec::new();
    for p in &pending {
        if !written.iter().any(|(c, _)| *c == p.case) {
            written.push((p.case.clone(), p.path.clone()));
        }
    }
    write_goldens(pending, true, &mut report.cases)?;
    written.retain(|(c, _)| {
        report
            .cases
            .iter()
            .any(|r| r.name == *c && r.golden == GoldenState::Recorded)
    });
    Ok(written)
}
