//! `oracle-build golden export|import <PIN> --case NAME`: a case's golden in
//! the team's files (`greedy_ids.npy`, `greedy_dist.npy`, `p<i>_prompt.i32`),
//! out of and into this tool's JSON golden ([`team_golden`], docs/smoke.md).

use std::path::Path;

use anyhow::Result;

use crate::ops::{Session, print_json};
use crate::stages::smoke::team_golden;

/// `golden export`: writes the golden of case `name` of PIN into `out` as
/// the team's files and a copy of the JSON golden, and lists them.
///
/// Errors: exit 2 for an unknown PIN or case, an `--out` that is not a
/// directory (a file, `/dev/null`), or a golden that cannot be exported
/// ([`team_golden::export`]).
pub fn export(s: &Session, pin: &str, name: &str, out: &Path) -> Result<()> {
    crate::ops::check_output_dir("--out", out, "nothing was exported")?;
    let lr = s.recipe(pin)?;
    let root = s.root()?;
    let done = team_golden::export(&lr, &root, crate::ops::case_named(&lr, name)?, out)?;
    if s.json {
        return print_json(&done);
    }
    println!(
        "case {}: golden {} exported",
        done.case,
        done.golden.display()
    );
    for f in &done.files {
        let shape = f
            .shape
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        if f.dtype == "json" {
            println!("  {}  this tool's JSON golden", f.path.display());
        } else {
            println!("  {}  {} [{shape}]", f.path.display(), f.dtype);
        }
    }
    Ok(())
}

/// `golden import`: records row `row` of the team's files in `dir` as the
/// JSON golden of case `name` of PIN, which the gate then compares with.
///
/// Errors: exit 2 for an unknown PIN or case, a bad file, or a golden it
/// would replace that disagrees, without `force` ([`team_golden::import`]).
pub fn import(
    s: &Session,
    pin: &str,
    name: &str,
    dir: &Path,
    row: Option<usize>,
    force: bool,
) -> Result<()> {
    let lr = s.recipe(pin)?;
    let root = s.root()?;
    let done = team_golden::import(
        &lr,
        &root,
        crate::ops::case_named(&lr, name)?,
        dir,
        row,
        force,
    )?;
    if s.json {
        return print_json(&done);
    }
    let runs = done.runs.map_or("no greedy_dist.npy".to_string(), |k| {
        format!("{k} identical runs")
    });
    if done.kept {
        println!(
            "case {}: golden {} already holds this prompt and output (row {} of {} in {}); kept as it is (--force replaces it)",
            done.case,
            done.golden.display(),
            done.row,
            done.rows,
            done.from.display()
        );
        return Ok(());
    }
    println!(
        "case {}: golden imported from {} (row {} of {}, {} tokens, {runs}) into {}",
        done.case,
        done.from.display(),
        done.row,
        done.rows,
        done.tokens,
        done.golden.display()
    );
    for c in &done.copies {
        println!("  copy {}", c.display());
    }
    if let Some(d) = &done.replaced {
        println!(
            "  replaced (--force) the previous golden, which {}",
            crate::stages::smoke::describe_diff(d)
        );
    }
    Ok(())
}
