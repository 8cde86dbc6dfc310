//! The files a recipe names for its gate, checked before any work: each
//! case's `prompts_file` (read whole and parsed) and what is at its
//! `golden:` path (docs/recipes.md, docs/smoke.md).
//!
//! A prompts file is read only when it is a regular file (links followed)
//! of at most [`MAX_PROMPTS_FILE`] bytes, opened without blocking
//! ([`crate::regular_file`]): a FIFO, a device, a directory or a file too
//! large is refused with exit 2 when the recipe is opened for a command,
//! not after the build, and never hangs or fills memory. A golden may be
//! absent (it is recorded later); what is there must be a regular file
//! within [`MAX_GOLDEN_JSON`] (a JSON golden and a numpy golden's
//! `manifest.json`) or [`MAX_GOLDEN_NPY`] (a numpy golden), or a
//! directory whose `greedy_ids.npy` is one. The golden is only looked at
//! (`stat`), not read: its readers read it bounded the same way.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::{Case, LoadedRecipe, locate};
use crate::exit::bad_input;
use crate::regular_file::{self, ReadError};

/// The most bytes of a `prompts_file` read.
pub const MAX_PROMPTS_FILE: u64 = 1 << 20;

/// The most bytes of a JSON golden (and of a numpy golden's
/// `manifest.json`) read. A recorded golden of 16 tokens with 5
/// log-probabilities a step is a few KiB; a golden set of a 1 MiB prompts
/// file, or a model manifest of many files, stays far under this.
pub const MAX_GOLDEN_JSON: u64 = 64 << 20;

/// The most bytes of a numpy golden (`greedy_ids.npy`) read: as the
/// team's files (`golden import`).
pub const MAX_GOLDEN_NPY: u64 = 256 << 20;

/// Where `case.prompts_file` is: relative to the recipe's directory (the
/// working directory for recipes compiled into the binary).
pub fn prompts_path(lr: &LoadedRecipe, case: &Case) -> Option<PathBuf> {
    let f = PathBuf::from(case.prompts_file.as_deref()?);
    Some(if f.is_absolute() {
        f
    } else {
        lr.dir.clone().unwrap_or_default().join(f)
    })
}

/// The prompts of the prompts file at `path`: a `.json` file holds a JSON
/// list of strings, a `.yaml` or `.yml` file a YAML list of strings, any
/// other file one prompt per non-blank line (the line's end stripped).
///
/// Errors: what is wrong, to follow the file's name (`is a FIFO, not a
/// regular file`, `does not exist`, `is larger than 1048576 bytes, the
/// limit`, `is not UTF-8 text`, `is not a JSON list of strings (...)`,
/// `holds no prompt`, `holds an empty prompt (prompt 2)`).
pub fn read_prompts(path: &Path) -> Result<Vec<String>, String> {
    let bytes = regular_file::read(path, MAX_PROMPTS_FILE).map_err(|e| e.to_string())?;
    let text = String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default();
    let list: Vec<String> = match ext {
        "json" => serde_json::from_str(&text)
            .map_err(|e| format!("is not a JSON list of strings ({e})"))?,
        "yaml" | "yml" => serde_saphyr::from_str(&text)
            .map_err(|e| format!("is not a YAML list of strings ({e})"))?,
        _ => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
    };
    if list.is_empty() {
        return Err("holds no prompt".into());
    }
    if let Some(i) = list.iter().position(String::is_empty) {
        return Err(format!("holds an empty prompt (prompt {i})"));
    }
    Ok(list)
}

/// What is wrong with what is at `path`, to be read as a golden of at most
/// `limit` bytes: `None` when nothing is there or a regular file (links
/// followed) within the limit is. Only `stat`, never an open.
fn golden_problem(path: &Path, limit: u64) -> Option<String> {
    let m = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return None;
        }
        Err(e) => return Some(ReadError::Io(e).to_string()),
    };
    if !m.is_file() {
        return Some(ReadError::NotRegular(regular_file::kind_of(m.file_type())).to_string());
    }
    (m.len() > limit).then(|| ReadError::TooLarge(limit).to_string())
}

/// The problems of what is at `case.golden` (see the module docs), each
/// `(path, what is wrong)`; none for a case without `golden:`, or a
/// relative one of a recipe compiled into the binary (it lies in the
/// store, which its readers read bounded).
fn golden_problems(lr: &LoadedRecipe, case: &Case) -> Vec<(PathBuf, String)> {
    let Some(g) = case.golden.as_deref() else {
        return Vec::new();
    };
    let p = Path::new(g);
    let path = match (&lr.dir, p.is_absolute()) {
        (_, true) => p.to_path_buf(),
        (Some(d), false) => d.join(p),
        (None, false) => return Vec::new(),
    };
    // A directory is a numpy golden: its greedy_ids.npy (as the gate finds it).
    let path = if path.is_dir() {
        path.join("greedy_ids.npy")
    } else {
        path
    };
    let npy = path.extension().is_some_and(|e| e == "npy");
    let mut files = vec![(
        path.clone(),
        if npy { MAX_GOLDEN_NPY } else { MAX_GOLDEN_JSON },
    )];
    if npy {
        let dir = path.parent().unwrap_or(Path::new("."));
        files.push((dir.join("manifest.json"), MAX_GOLDEN_JSON));
    }
    files
        .into_iter()
        .filter_map(|(f, limit)| golden_problem(&f, limit).map(|why| (f, why)))
        .collect()
}

/// Checks the files `lr`'s gate cases name (see the module docs), all of
/// them, before any work: each `prompts_file` read and parsed, what is at
/// each `golden:` path looked at.
///
/// Errors (exit 2): every problem, one line each, naming the recipe file,
/// the line, the field (`smoke.cases[i].prompts_file`,
/// `smoke.cases[i].golden`), its value, the path it resolves to when that
/// differs, and what is wrong.
pub fn check_files(lr: &LoadedRecipe) -> Result<()> {
    let mut problems = Vec::new();
    let mut fail = |field: String, value: &str, path: &Path, why: &str| {
        let line = locate(&lr.text, &field).map_or(String::new(), |l| format!("line {l}: "));
        let at = if Path::new(value) == path {
            String::new()
        } else {
            format!(" ({})", path.display())
        };
        problems.push(format!(
            "{}: {line}field `{field}`: {value:?}{at} {why}",
            lr.origin
        ));
    };
    for (i, case) in lr.recipe.smoke.cases.iter().enumerate() {
        if let (Some(value), Some(path)) = (&case.prompts_file, prompts_path(lr, case))
            && let Err(why) = read_prompts(&path)
        {
            fail(format!("smoke.cases[{i}].prompts_file"), value, &path, &why);
        }
        if let Some(value) = &case.golden {
            for (path, why) in golden_problems(lr, case) {
                fail(format!("smoke.cases[{i}].golden"), value, &path, &why);
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(bad_input(problems.join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompts_file_is_json_yaml_or_lines() {
        let d = tempfile::tempdir().unwrap();
        let j = d.path().join("p.json");
        std::fs::write(&j, r#"["a b", "c"]"#).unwrap();
        assert_eq!(read_prompts(&j).unwrap(), ["a b", "c"]);
        let y = d.path().join("p.yaml");
        std::fs::write(&y, "- a b\n- \"c: d\"\n").unwrap();
        assert_eq!(read_prompts(&y).unwrap(), ["a b", "c: d"]);
        let t = d.path().join("p.txt");
        std::fs::write(&t, "first one\n\n  second\n").unwrap();
        assert_eq!(read_prompts(&t).unwrap(), ["first one", "  second"]);
        std::fs::write(&t, "\n\n").unwrap();
        assert!(read_prompts(&t).unwrap_err().contains("holds no prompt"));
        std::fs::write(&j, r#"{"a": 1}"#).unwrap();
        assert!(read_prompts(&j).unwrap_err().contains("JSON list"));
        assert_eq!(
            read_prompts(&d.path().join("none")).unwrap_err(),
            "does not exist"
        );
    }
}
