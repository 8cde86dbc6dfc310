//! Goldens in the team's files (`golden export` / `golden import`): the
//! layout the team's capture scripts write with numpy, beside this tool's
//! JSON golden.
//!
//! In a directory, for N prompts, T = `max_tokens`, K greedy runs:
//!
//! - `greedy_ids.npy`: int32 (`'<i4'`) `[N, T]`, row i = run 0's output ids
//!   of prompt i. Short outputs (an early stop) are right-padded: the team's
//!   script pads this file with 0, this tool writes -1.
//! - `greedy_dist.npy`: int32 `[N, T, K]`, `[i, j, k]` = the token run k
//!   chose at output position j of prompt i, right-padded with -1. Token ids
//!   of K runs, not log-probabilities.
//! - `p<i>_prompt.i32`: prompt i's token ids as the engine saw them
//!   (`RequestOutput.prompt_token_ids`), raw little-endian int32, no header.
//!
//! A golden of this tool holds one prompt, so an export writes N = 1 and an
//! import takes one row (`--row`). Every file is read bounded
//! ([`MAX_FILE_BYTES`]); a bad file is refused (exit 2) naming the file and
//! what is wrong with it, and nothing is written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use fs_err as fs;
use serde::Serialize;
use serde_json::{Value, json};

use super::golden::{self, GoldenDiff};
use super::npy;
use crate::exit::bad_input;
use crate::recipe::{Case, LoadedRecipe};
use crate::regular_file::{self, ReadError};
use crate::store::{write_atomic, write_json};

/// The run-0 output ids, int32 `[N, T]`.
pub const IDS_FILE: &str = "greedy_ids.npy";
/// The output ids of every run, int32 `[N, T, K]`.
pub const DIST_FILE: &str = "greedy_dist.npy";
/// The most bytes any one of the team's files may hold.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// `p<i>_prompt.i32`: the name of prompt `i`'s token-id file.
pub fn prompt_file(i: usize) -> String {
    format!("p{i}_prompt.i32")
}

/// One prompt of a golden: what the engine was given and what it generated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamRow {
    /// The prompt's token ids.
    pub prompt_token_ids: Vec<i64>,
    /// The generated token ids (every run produced these).
    pub output_token_ids: Vec<i64>,
}

/// The team's files for `rows` recorded over `runs` identical runs: (file
/// name, bytes), `greedy_ids.npy` first. T is the longest output; shorter
/// rows are padded with -1.
///
/// Errors: no rows, `runs` 0, or a token id that does not fit in int32.
pub fn encode(rows: &[TeamRow], runs: usize) -> Result<Vec<(String, Vec<u8>)>, String> {
    if rows.is_empty() || runs == 0 {
        return Err("nothing to write (no prompt, or no run)".into());
    }
    let to_i32 =
        |v: i64| i32::try_from(v).map_err(|_| format!("token id {v} does not fit in int32"));
    let t = rows
        .iter()
        .map(|r| r.output_token_ids.len())
        .max()
        .unwrap_or(0);
    let mut ids = Vec::with_capacity(rows.len() * t);
    let mut dist = Vec::with_capacity(rows.len() * t * runs);
    for r in rows {
        for j in 0..t {
            let v = r.output_token_ids.get(j).copied().map_or(Ok(-1), to_i32)?;
            ids.push(v);
            dist.extend(std::iter::repeat_n(v, runs));
        }
    }
    let mut files = vec![
        (
            IDS_FILE.to_string(),
            npy::write_i32(&[rows.len(), t], &ids)?,
        ),
        (
            DIST_FILE.to_string(),
            npy::write_i32(&[rows.len(), t, runs], &dist)?,
        ),
    ];
    for (i, r) in rows.iter().enumerate() {
        let mut bytes = Vec::with_capacity(4 * r.prompt_token_ids.len());
        for &v in &r.prompt_token_ids {
            bytes.extend_from_slice(&to_i32(v)?.to_le_bytes());
        }
        files.push((prompt_file(i), bytes));
    }
    Ok(files)
}

/// One row read from the team's files by [`read_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamRead {
    /// The row taken (0-based; `p<row>_prompt.i32`).
    pub row: usize,
    /// N: the rows the files hold.
    pub rows: usize,
    /// T: the width of each row (the capture's `max_tokens`).
    pub width: usize,
    /// K: the runs in `greedy_dist.npy`, when it is there.
    pub runs: Option<usize>,
    /// The prompt and the output of the row (padding dropped).
    pub golden: TeamRow,
    /// sha256 of each file read, by name.
    pub files: BTreeMap<String, String>,
}

/// Reads `path`: a regular file (links followed) of at most
/// [`MAX_FILE_BYTES`], opened without blocking ([`regular_file::read`]);
/// `Ok(None)` when absent.
fn read_team_file(path: &Path) -> Result<Option<Vec<u8>>, String> {
    match regular_file::read(path, MAX_FILE_BYTES) {
        Ok(b) => Ok(Some(b)),
        Err(ReadError::Missing) => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// `seq` when every value fits in int32 (the team's dtype: `golden export`
/// writes int32); else an error naming `what`, the value and its position.
fn int32_only(seq: Vec<i64>, what: &str) -> Result<Vec<i64>, String> {
    match seq.iter().position(|&v| i32::try_from(v).is_err()) {
        Some(j) => Err(format!(
            "{what} holds {} at output position {j}, outside int32 (token ids are int32; `golden export` could not write it back)",
            seq[j]
        )),
        None => Ok(seq),
    }
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// `seq` without its trailing padding (negative values); an error naming
/// `what` when a negative value is left inside it.
fn unpad(mut seq: Vec<i64>, what: &str) -> Result<Vec<i64>, String> {
    while seq.last().is_some_and(|&v| v < 0) {
        seq.pop();
    }
    match seq.iter().position(|&v| v < 0) {
        Some(j) => Err(format!(
            "{what} holds {} at position {j} before its last token (only trailing padding may be negative)",
            seq[j]
        )),
        None => Ok(seq),
    }
}

/// Reads row `row` (default: the only one) of the team's files in `dir`:
/// `greedy_ids.npy` and `p<row>_prompt.i32` are required, `greedy_dist.npy`
/// is checked when present (its shape `[N, T, K]` matching, its K runs
/// identical for the row, run 0 equal to `greedy_ids.npy`) and then gives
/// the output's length (its -1 padding; `greedy_ids.npy` alone: trailing
/// negative values are padding).
///
/// Errors (text naming the file and what is wrong): a file missing,
/// unreadable, too large, not int32/int64 `.npy`, of another shape,
/// truncated; a row that is not there or holds no token; runs that disagree.
pub fn read_dir(dir: &Path, row: Option<usize>) -> Result<TeamRead, String> {
    let ids_path = dir.join(IDS_FILE);
    let mut files = BTreeMap::new();
    let bytes = read_team_file(&ids_path)?.ok_or_else(|| {
        format!(
            "{}: missing (a team golden is {IDS_FILE}, {DIST_FILE} and p<i>_prompt.i32)",
            ids_path.display()
        )
    })?;
    files.insert(IDS_FILE.to_string(), sha256(&bytes));
    let ids = npy::parse(&bytes).map_err(|e| format!("{}: {e}", ids_path.display()))?;
    let [n, t] = ids.shape[..] else {
        return Err(format!(
            "{}: has shape {:?}; {IDS_FILE} is int32 [N prompts, T tokens]",
            ids_path.display(),
            ids.shape
        ));
    };
    let row = match row {
        Some(r) if r < n => r,
        Some(r) => {
            return Err(format!(
                "{}: has {n} rows, so there is no row {r} (rows count from 0)",
                ids_path.display()
            ));
        }
        None if n == 1 => 0,
        None => {
            return Err(format!(
                "{}: has {n} rows (prompts); say which is this case with --row I (its prompt is p<I>_prompt.i32)",
                ids_path.display()
            ));
        }
    };
    let ids_row = int32_only(
        ids.data[row * t..(row + 1) * t].to_vec(),
        &format!("{} row {row}", ids_path.display()),
    )?;

    let dist_path = dir.join(DIST_FILE);
    let (output, runs) = match read_team_file(&dist_path)? {
        None => (
            unpad(ids_row, &format!("{} row {row}", ids_path.display()))?,
            None,
        ),
        Some(bytes) => {
            files.insert(DIST_FILE.to_string(), sha256(&bytes));
            let dist = npy::parse(&bytes).map_err(|e| format!("{}: {e}", dist_path.display()))?;
            let k = match dist.shape[..] {
                [dn, dt, k] if dn == n && dt == t && k > 0 => k,
                _ => {
                    return Err(format!(
                        "{}: has shape {:?}; beside {IDS_FILE} of shape [{n}, {t}] it is int32 [{n}, {t}, K runs]",
                        dist_path.display(),
                        dist.shape
                    ));
                }
            };
            let run = |kk: usize| -> Result<Vec<i64>, String> {
                let seq = (0..t).map(|j| dist.data[(row * t + j) * k + kk]).collect();
                let what = format!("{} row {row} run {kk}", dist_path.display());
                unpad(int32_only(seq, &what)?, &what)
            };
            let first = run(0)?;
            for kk in 1..k {
                let other = run(kk)?;
                if other != first {
                    let j = super::first_divergence(&first, &other);
                    return Err(format!(
                        "{}: row {row}: run {kk} differs from run 0 at output position {j} ({:?} vs {:?}); this tool's goldens are taken from identical runs only (a near-tie the team's distributional gate covers)",
                        dist_path.display(),
                        other.get(j),
                        first.get(j)
                    ));
                }
            }
            if ids_row[..first.len()] != first[..] {
                let j = super::first_divergence(&ids_row[..first.len()], &first);
                return Err(format!(
                    "{}: row {row} differs from {} run 0 at output position {j} ({} vs {})",
                    ids_path.display(),
                    DIST_FILE,
                    ids_row[j],
                    first[j]
                ));
            }
            (first, Some(k))
        }
    };
    if output.is_empty() {
        return Err(format!("{}: row {row} holds no token", ids_path.display()));
    }

    let p_path = dir.join(prompt_file(row));
    let bytes = read_team_file(&p_path)?.ok_or_else(|| {
        format!(
            "{}: missing (the prompt's token ids, raw little-endian int32: a golden is only compared for the prompt it was captured for)",
            p_path.display()
        )
    })?;
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return Err(format!(
            "{}: holds {} bytes; it is raw little-endian int32 token ids (a non-zero multiple of 4 bytes: truncated?)",
            p_path.display(),
            bytes.len()
        ));
    }
    files.insert(prompt_file(row), sha256(&bytes));
    let prompt: Vec<i64> = bytes
        .chunks_exact(4)
        .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    if let Some(j) = prompt.iter().position(|&v| v < 0) {
        return Err(format!(
            "{}: holds {} at position {j}, not a token id",
            p_path.display(),
            prompt[j]
        ));
    }
    Ok(TeamRead {
        row,
        rows: n,
        width: t,
        runs,
        golden: TeamRow {
            prompt_token_ids: prompt,
            output_token_ids: output,
        },
        files,
    })
}

/// One file written by [`export`].
#[derive(Debug, Clone, Serialize)]
pub struct ExportedFile {
    /// Where it was written.
    pub path: PathBuf,
    /// `int32` for the team's files, `json` for this tool's golden.
    pub dtype: String,
    /// Its array shape (empty for the JSON golden).
    pub shape: Vec<usize>,
}

/// What [`export`] wrote.
#[derive(Debug, Clone, Serialize)]
pub struct Exported {
    /// The case.
    pub case: String,
    /// The golden exported.
    pub golden: PathBuf,
    /// The files written, the team's first.
    pub files: Vec<ExportedFile>,
}

/// Writes the JSON golden of `case` (found as the gate finds it) into `out`
/// as the team's files (N = 1, K = the recipe's `smoke.runs`: a golden is
/// recorded only from identical runs) plus a copy of the JSON golden,
/// `<case>.json`; each file atomically, replacing one of the same name.
///
/// Errors: exit 2 when the case has no golden, a numpy one, one without
/// `prompt_token_ids`, or a token id outside int32.
pub fn export(lr: &LoadedRecipe, root: &Path, case: &Case, out: &Path) -> Result<Exported> {
    let loc = golden::locate(lr, &golden::dirs(root, lr), case);
    if std::fs::symlink_metadata(&loc.path).is_err() {
        return Err(bad_input(format!(
            "case {}: no golden at {} (record one with `oracle-build smoke <PIN> --record-golden`, or `golden import` the team's files)",
            case.name,
            loc.path.display()
        )));
    }
    if loc.kind == golden::Kind::Npy {
        return Err(bad_input(format!(
            "case {}: golden {} is already a numpy golden; export reads JSON goldens",
            case.name,
            loc.path.display()
        )));
    }
    // Read once, bounded and only as a regular file: parsed, then copied.
    let json_bytes =
        golden::read(&loc).map_err(|e| bad_input(format!("case {}: {e}", case.name)))?;
    let g = golden::load_from(&loc, &json_bytes, case.prompt.as_deref(), &[]).map_err(bad_input)?;
    let prompt = g.prompt_token_ids.ok_or_else(|| {
        bad_input(format!(
            "golden {} has no prompt_token_ids; the team's files need the prompt's ids (record it again with `smoke --record-golden`)",
            loc.path.display()
        ))
    })?;
    let rows = [TeamRow {
        prompt_token_ids: prompt,
        output_token_ids: g.output_token_ids,
    }];
    let runs = lr.recipe.smoke.runs.max(1) as usize;
    let encoded = encode(&rows, runs)
        .map_err(|e| bad_input(format!("golden {}: {e}", loc.path.display())))?;
    fs::create_dir_all(out)?;
    let t = rows[0].output_token_ids.len();
    let mut files = Vec::new();
    for (name, bytes) in &encoded {
        let path = out.join(name);
        write_atomic(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        let shape = match name.as_str() {
            IDS_FILE => vec![1, t],
            DIST_FILE => vec![1, t, runs],
            _ => vec![bytes.len() / 4],
        };
        files.push(ExportedFile {
            path,
            dtype: "int32".into(),
            shape,
        });
    }
    let path = out.join(format!("{}.json", case.name));
    write_atomic(&path, &json_bytes).with_context(|| format!("writing {}", path.display()))?;
    files.push(ExportedFile {
        path,
        dtype: "json".into(),
        shape: Vec::new(),
    });
    Ok(Exported {
        case: case.name.clone(),
        golden: loc.path,
        files,
    })
}

/// What [`import`] recorded.
#[derive(Debug, Clone, Serialize)]
pub struct Imported {
    /// The case.
    pub case: String,
    /// The directory read.
    pub from: PathBuf,
    /// The row taken, of how many.
    pub row: usize,
    /// N.
    pub rows: usize,
    /// K, when `greedy_dist.npy` was there.
    pub runs: Option<usize>,
    /// The output tokens of the golden.
    pub tokens: usize,
    /// The JSON golden written (the gate reads it).
    pub golden: PathBuf,
    /// Its copies (the store's).
    pub copies: Vec<PathBuf>,
    /// True when the golden there already holds this prompt and output: it
    /// is kept as it is (it records more), and nothing is written.
    pub kept: bool,
    /// Where the golden replaced (with `force`) disagreed with the import.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaced: Option<GoldenDiff>,
}

/// Imports row `row` of the team's files in `dir` ([`read_dir`]) as the
/// JSON golden of `case`, where `smoke --record-golden` would write it (and
/// its copies), so the gate compares the case with it: the prompt ids
/// (refused when the run's differ) and the output ids. It records no engine
/// configuration, log-probabilities or model manifest (the team's files hold
/// none); `oracle` says where it came from (`imported`).
///
/// A golden already there with the same prompt and output is kept (it
/// records more); without `force`, nothing is written then.
///
/// Errors: exit 2 for a bad file (nothing written), a width T other than the
/// case's `max_tokens`, a case whose golden is a numpy golden, a path inside
/// the store's entries or a file there that is not a golden, and, without
/// `force`, a golden there that disagrees with the import.
pub fn import(
    lr: &LoadedRecipe,
    root: &Path,
    case: &Case,
    dir: &Path,
    row: Option<usize>,
    force: bool,
) -> Result<Imported> {
    let read = read_dir(dir, row).map_err(bad_input)?;
    if read.width != case.max_tokens as usize {
        return Err(bad_input(format!(
            "{}: rows of {} tokens, but case {} asks max_tokens {}; a golden gates a case run with the capture's max_tokens",
            dir.join(IDS_FILE).display(),
            read.width,
            case.name,
            case.max_tokens
        )));
    }
    let dirs = golden::dirs(root, lr);
    let loc = golden::locate(lr, &dirs, case);
    if loc.kind == golden::Kind::Npy {
        return Err(bad_input(format!(
            "case {}: its golden {} is a numpy golden (`golden:`); import writes a JSON golden: point `golden:` at a .json path, or remove it",
            case.name,
            loc.path.display()
        )));
    }
    let store_dir = std::path::absolute(root.join("store")).unwrap_or(root.join("store"));
    if std::path::absolute(&loc.path)
        .unwrap_or(loc.path.clone())
        .starts_with(&store_dir)
    {
        return Err(bad_input(format!(
            "case {}: golden {} lies inside the store's read-only entries; choose a path outside {}",
            case.name,
            loc.path.display(),
            store_dir.display()
        )));
    }
    let new = &read.golden;
    let mut replaced = None;
    if std::fs::symlink_metadata(&loc.path).is_ok() {
        // Read bounded and only as a regular file (a FIFO never blocks):
        // what cannot be read as a golden is never overwritten.
        let old = golden::load(&loc, case.prompt.as_deref(), &new.prompt_token_ids).map_err(
            |e| {
                bad_input(format!(
                    "case {}: {e}; import never overwrites what is not a golden (not even with --force)",
                    case.name
                ))
            },
        )?;
        let other_prompt = old
            .prompt_token_ids
            .as_ref()
            .is_some_and(|p| *p != new.prompt_token_ids);
        let d = golden::diff(
            &old.output_token_ids,
            &old.logprobs,
            &new.output_token_ids,
            &[],
            lr.recipe.smoke.near_tie_nats,
        );
        if (other_prompt || d.is_some()) && !force {
            let why = match (&d, other_prompt) {
                (_, true) => "it was recorded for another prompt".to_string(),
                (Some(d), _) => super::describe_diff(d),
                (None, false) => String::new(),
            };
            return Err(bad_input(format!(
                "case {}: import refuses to replace golden {}, which the imported one disagrees with: {why}; nothing was written (rerun with --force to replace it)",
                case.name,
                loc.path.display()
            )));
        }
        if !force && !other_prompt && d.is_none() {
            // The same prompt and output: the golden there records more
            // (log-probabilities, engine configuration, model files).
            return Ok(Imported {
                case: case.name.clone(),
                from: dir.to_path_buf(),
                row: read.row,
                rows: read.rows,
                runs: read.runs,
                tokens: new.output_token_ids.len(),
                golden: loc.path.clone(),
                copies: Vec::new(),
                kept: true,
                replaced: None,
            });
        }
        replaced = d;
    }
    let file = format!("{}.json", case.name);
    let path = match (loc.explicit, dirs.first()) {
        (false, Some(d)) => d.join(&file),
        _ => loc.path.clone(),
    };
    let copies: Vec<PathBuf> = dirs
        .iter()
        .map(|d| d.join(&file))
        .filter(|p| *p != path)
        .collect();
    let g = golden::Golden {
        format: golden::FORMAT.into(),
        case: case.name.clone(),
        model: None,
        revision: None,
        prompt: None,
        prompt_token_ids: Some(new.prompt_token_ids.clone()),
        output_token_ids: new.output_token_ids.clone(),
        text: None,
        max_tokens: Some(case.max_tokens),
        logprobs_k: None,
        logprobs: Vec::new(),
        engine_config: None,
        env: BTreeMap::new(),
        oracle: json!({"imported": {
            "from": std::path::absolute(dir).unwrap_or(dir.to_path_buf()),
            "row": read.row,
            "rows": read.rows,
            "runs": read.runs,
            "files": read.files,
        }}),
        captured: Some(jiff::Timestamp::now().to_string()),
        host: Value::Null,
        model_manifest: None,
        // The team's files say neither: gated without a mode check.
        mode: None,
        advance: None,
    };
    for p in std::iter::once(&path).chain(&copies) {
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent)?;
        }
        write_json(p, &g).with_context(|| format!("writing golden {}", p.display()))?;
    }
    Ok(Imported {
        case: case.name.clone(),
        from: dir.to_path_buf(),
        row: read.row,
        rows: read.rows,
        runs: read.runs,
        tokens: new.output_token_ids.len(),
        golden: path,
        copies,
        kept: false,
        replaced,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(p: &[i64], o: &[i64]) -> TeamRow {
        TeamRow {
            prompt_token_ids: p.to_vec(),
            output_token_ids: o.to_vec(),
        }
    }

    fn write(dir: &Path, files: &[(String, Vec<u8>)]) {
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }

    #[test]
    fn encode_then_read_round_trips_each_row_with_padding() {
        let d = tempfile::tempdir().unwrap();
        let rows = [row(&[2, 3, 4], &[10, 11, 12]), row(&[5], &[7])];
        let files = encode(&rows, 3).unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(
            names,
            [IDS_FILE, DIST_FILE, "p0_prompt.i32", "p1_prompt.i32"]
        );
        let dist = npy::parse(&files[1].1).unwrap();
        assert_eq!(dist.shape, [2, 3, 3]);
        // [1, 1, k] is padding for the short row, every run.
        assert_eq!(dist.data[(3 + 1) * 3..(3 + 2) * 3], [-1, -1, -1]);
        write(d.path(), &files);
        for (i, r) in rows.iter().enumerate() {
            let got = read_dir(d.path(), Some(i)).unwrap();
            assert_eq!(got.golden, *r);
            assert_eq!((got.rows, got.width, got.runs), (2, 3, Some(3)));
            assert_eq!(got.files.len(), 3);
        }
        assert!(read_dir(d.path(), None).unwrap_err().contains("--row"));
        assert!(
            read_dir(d.path(), Some(2))
                .unwrap_err()
                .contains("no row 2")
        );
        assert!(
            encode(&[row(&[1], &[1 << 40])], 1)
                .unwrap_err()
                .contains("int32")
        );
    }

    #[test]
    fn greedy_ids_alone_suffice_and_zero_padding_needs_the_dist() {
        // The team's script pads greedy_ids.npy with 0, which only the -1
        // padding of greedy_dist.npy tells apart from token 0.
        let d = tempfile::tempdir().unwrap();
        let ids = npy::write_i32(&[1, 4], &[9, 8, 0, 0]).unwrap();
        std::fs::write(d.path().join(IDS_FILE), ids).unwrap();
        std::fs::write(d.path().join("p0_prompt.i32"), 5i32.to_le_bytes()).unwrap();
        let got = read_dir(d.path(), None).unwrap();
        assert_eq!(got.golden, row(&[5], &[9, 8, 0, 0]));
        assert_eq!(got.runs, None);
        let dist = npy::write_i32(&[1, 4, 2], &[9, 9, 8, 8, -1, -1, -1, -1]).unwrap();
        std::fs::write(d.path().join(DIST_FILE), dist).unwrap();
        let got = read_dir(d.path(), None).unwrap();
        assert_eq!(got.golden, row(&[5], &[9, 8]));
        assert_eq!(got.runs, Some(2));
    }

    #[test]
    fn ids_outside_int32_are_refused_naming_the_file_row_and_position() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        // An int64 array: the int32 layout with `<i8` and 8-byte values.
        let i8 = |shape: &[usize], data: &[i64]| {
            let mut f = npy::write_i32(shape, &vec![0; data.len()]).unwrap();
            let at = f.windows(3).position(|w| w == b"<i4").unwrap();
            f[at..at + 3].copy_from_slice(b"<i8");
            f.truncate(f.len() - 4 * data.len());
            f.extend(data.iter().flat_map(|v| v.to_le_bytes()));
            f
        };
        std::fs::write(p.join("p0_prompt.i32"), 5i32.to_le_bytes()).unwrap();
        for (ids, at) in [
            (1i64 << 31, "2147483648"),
            (-(1i64 << 40), "-1099511627776"),
        ] {
            std::fs::write(p.join(IDS_FILE), i8(&[1, 3], &[7, ids, 8])).unwrap();
            let e = read_dir(p, None).unwrap_err();
            assert!(
                e.contains(&format!(
                    "{IDS_FILE} row 0 holds {at} at output position 1, outside int32"
                )),
                "{e}"
            );
        }
        std::fs::write(p.join(IDS_FILE), i8(&[1, 2], &[7, i64::from(i32::MAX)])).unwrap();
        assert_eq!(
            read_dir(p, None).unwrap().golden,
            row(&[5], &[7, i64::from(i32::MAX)])
        );
        std::fs::write(p.join(DIST_FILE), i8(&[1, 2, 2], &[7, 7, 1 << 32, 9])).unwrap();
        let e = read_dir(p, None).unwrap_err();
        assert!(
            e.contains(&format!(
                "{DIST_FILE} row 0 run 0 holds 4294967296 at output position 1, outside int32"
            )),
            "{e}"
        );
    }

    #[test]
    fn bad_files_are_named_with_what_is_wrong() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        let err = |row| read_dir(p, row).unwrap_err();
        assert!(err(None).contains("greedy_ids.npy: missing"));
        // dtype
        let mut f = npy::write_i32(&[1, 2], &[1, 2]).unwrap();
        let at = f.windows(3).position(|w| w == b"<i4").unwrap();
        f[at..at + 3].copy_from_slice(b"<f4");
        std::fs::write(p.join(IDS_FILE), &f).unwrap();
        assert!(
            err(None).contains("greedy_ids.npy: has dtype \"<f4\""),
            "{}",
            err(None)
        );
        // shape
        std::fs::write(p.join(IDS_FILE), npy::write_i32(&[2], &[1, 2]).unwrap()).unwrap();
        assert!(err(None).contains("has shape [2]"));
        // truncated data
        let f = npy::write_i32(&[1, 2], &[1, 2]).unwrap();
        std::fs::write(p.join(IDS_FILE), &f[..f.len() - 2]).unwrap();
        assert!(err(None).contains("needs 8"));
        std::fs::write(p.join(IDS_FILE), &f).unwrap();
        // prompt: missing, truncated
        assert!(err(None).contains("p0_prompt.i32: missing"));
        std::fs::write(p.join("p0_prompt.i32"), [1, 0, 0, 0, 2]).unwrap();
        assert!(err(None).contains("p0_prompt.i32: holds 5 bytes"));
        std::fs::write(p.join("p0_prompt.i32"), 3i32.to_le_bytes()).unwrap();
        assert!(read_dir(p, None).is_ok());
        // dist: another shape; runs that disagree; run 0 not greedy_ids
        let dist = |data: &[i32]| {
            std::fs::write(p.join(DIST_FILE), npy::write_i32(&[1, 2, 2], data).unwrap()).unwrap();
        };
        std::fs::write(
            p.join(DIST_FILE),
            npy::write_i32(&[1, 3, 1], &[1, 2, 3]).unwrap(),
        )
        .unwrap();
        assert!(err(None).contains("greedy_dist.npy: has shape [1, 3, 1]"));
        dist(&[1, 1, 2, 5]);
        assert!(err(None).contains("run 1 differs from run 0 at output position 1"));
        dist(&[1, 1, 4, 4]);
        assert!(err(None).contains("differs from greedy_dist.npy run 0 at output position 1"));
        dist(&[1, 1, 2, 2]);
        assert_eq!(read_dir(p, None).unwrap().runs, Some(2));
    }
}
