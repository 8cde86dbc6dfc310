//! The golden campaign of an advance (docs/advance.md): TO's own
//! determinism per case and prompt, which cases need a reviewer's reason
//! before `--accept` records TO's goldens, the record stamped into each
//! golden, and the paths where TO's goldens would overwrite FROM's.

use std::path::PathBuf;

use serde::Serialize;
use serde_json::{Value, json};

use super::CaseComparison;
use crate::stages::smoke::CaseResult;

/// What `--accept` recorded.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct Campaign {
    /// TO's goldens written, one per case.
    pub recorded: Vec<RecordedGolden>,
    /// The drift accepted, with the reviewer's reason (`--accept-drift CASE --reason TEXT`).
    pub accepted_drift: Vec<AcceptedDrift>,
}

/// One golden of TO written by `--accept`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RecordedGolden {
    /// The case.
    pub case: String,
    /// The golden file (TO's goldens location; FROM's are not touched).
    pub path: PathBuf,
}

/// A case whose drift the reviewer accepted.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AcceptedDrift {
    /// The case.
    pub case: String,
    /// The reviewer's reason.
    pub reason: String,
}

/// Why `--accept` cannot record TO's goldens.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// Cases that drifted (or cannot be compared) and that no
    /// `--accept-drift` names: one line each (exit 4).
    Unaccepted(Vec<String>),
    /// Cases `--accept-drift` names that did not drift (exit 2).
    NotDrifted(Vec<String>),
}

/// TO's own determinism for one case and prompt: whether its K runs agreed.
pub fn determinism(c: &CaseResult) -> String {
    match (&c.disagreement, c.runs) {
        (_, 0) => "did not run".into(),
        (None, n) if c.deterministic => format!("{n} runs agree"),
        (Some(d), n) => format!("{n} runs DISAGREE at position {}", d.position),
        (None, n) => format!("{n} runs, agreement unknown"),
    }
}

/// Whether a comparison needs a reviewer's reason before TO's golden
/// replaces it: a drift, or a case that could not be compared (nothing
/// says it did not drift). Identical outputs and near-tie flips do not.
pub fn needs_reason(c: &CaseComparison) -> bool {
    c.status == "drifted" || c.status == "not comparable"
}

/// The comparison's label: the case, with `[N]` for prompt N of a case
/// with several prompts.
pub fn label(c: &CaseComparison) -> String {
    match c.prompt_index {
        Some(i) => format!("{}[{i}]", c.name),
        None => c.name.clone(),
    }
}

/// Checks the reviewer's `--accept-drift` cases against the comparisons.
///
/// Errors: [`Refusal::NotDrifted`] when a named case did not drift (checked
/// first), else [`Refusal::Unaccepted`] when a case drifted unnamed.
pub fn check(cases: &[CaseComparison], accepted: &[AcceptedDrift]) -> Result<(), Refusal> {
    let not_drifted: Vec<String> = accepted
        .iter()
        .filter(|a| !cases.iter().any(|c| c.name == a.case && needs_reason(c)))
        .map(|a| a.case.clone())
        .collect();
    if !not_drifted.is_empty() {
        return Err(Refusal::NotDrifted(not_drifted));
    }
    let unaccepted: Vec<String> = cases
        .iter()
        .filter(|c| needs_reason(c) && !accepted.iter().any(|a| a.case == c.name))
        .map(|c| format!("{} {}: {}", label(c), c.status, c.detail))
        .collect();
    if unaccepted.is_empty() {
        Ok(())
    } else {
        Err(Refusal::Unaccepted(unaccepted))
    }
}

/// The record `--accept` stamps into `case`'s golden: FROM and TO, each
/// prompt's result against FROM, and the reviewer's reason when its drift
/// was accepted.
pub fn record(
    case: &str,
    cases: &[CaseComparison],
    from: (&str, &str),
    to: (&str, &str),
    reason: Option<&str>,
) -> Value {
    let results: Vec<Value> = cases
        .iter()
        .filter(|c| c.name == case)
        .map(|c| {
            json!({"prompt_index": c.prompt_index, "status": c.status, "detail": c.detail,
                   "to_runs": c.to_runs})
        })
        .collect();
    json!({
        "from": {"recipe": from.0, "commit": from.1},
        "to": {"recipe": to.0, "commit": to.1},
        "accepted": jiff::Timestamp::now().to_string(),
        "results": results,
        "accepted_drift": reason.map(|r| json!({"reason": r})),
    })
}

/// The paths in both lists: where recording TO's goldens would overwrite
/// one of FROM's.
pub fn overlap(from: &[PathBuf], to: &[PathBuf]) -> Vec<PathBuf> {
    let canon = |p: &PathBuf| {
        p.parent()
            .and_then(|d| d.canonicalize().ok())
            .zip(p.file_name())
            .map_or_else(|| p.clone(), |(d, f)| d.join(f))
    };
    let from: Vec<PathBuf> = from.iter().map(canon).collect();
    let mut out: Vec<PathBuf> = to
        .iter()
        .filter(|p| from.contains(&canon(p)))
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(name: &str, prompt: Option<usize>, status: &str) -> CaseComparison {
        CaseComparison {
            name: name.into(),
            status: status.into(),
            detail: "d".into(),
            divergence: None,
            from_text: String::new(),
            to_text: String::new(),
            prompt_index: prompt,
            prompt: None,
            to_runs: "2 runs agree".into(),
        }
    }

    #[test]
    fn drift_needs_a_named_reason_and_a_named_case_must_have_drifted() {
        let cases = [
            cmp("a", Some(0), "drifted"),
            cmp("a", Some(1), "identical"),
            cmp("b", None, "near-tie flip"),
        ];
        let accept = |c: &str| AcceptedDrift {
            case: c.into(),
            reason: "r".into(),
        };
        assert_eq!(
            check(&cases, &[]),
            Err(Refusal::Unaccepted(vec!["a[0] drifted: d".into()]))
        );
        assert_eq!(check(&cases, &[accept("a")]), Ok(()));
        assert_eq!(
            check(&cases, &[accept("a"), accept("b")]),
            Err(Refusal::NotDrifted(vec!["b".into()]))
        );
        let r = record("a", &cases, ("fx", "c1"), ("fx-2", "c2"), Some("why"));
        assert_eq!(r["accepted_drift"]["reason"], "why");
        assert_eq!(r["results"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn overlap_finds_the_same_file() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.json");
        let b = d.path().join(".").join("a.json");
        assert_eq!(
            overlap(std::slice::from_ref(&a), std::slice::from_ref(&b)),
            vec![b]
        );
        assert!(overlap(&[a], &[d.path().join("b.json")]).is_empty());
    }
}
