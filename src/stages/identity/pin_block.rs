//! The users' pin record: a fenced ```` ```parity-pin ```` block of
//! `key = value` lines kept in their sync notes (docs/identity.md, "`--pin-file FILE` and
//! `--emit-pin-block`: the users' pin record").
//!
//! ````text
//! ```parity-pin
//! vllm_commit = 5559679229bc961848b121ccdeaa8fa5d79bec98
//! vllm_runtime_version = 0.23.1rc1.dev1511+g555967922
//! vllm_distribution_version = 0.23.1rc1.dev1511+g555967922.cu130
//! flashinfer_version = 0.6.15.post1
//! ```
//! ````
//!
//! One such block must be in the file (repeated identical blocks count as
//! one), with exactly these four keys.
//! `flashinfer_version = none` records an oracle without FlashInfer
//! (`flashinfer.__version__` absent), and matches only such an oracle.
//! Blank lines and lines starting with `#` inside the block are ignored.

use std::path::Path;

use anyhow::Result;

use crate::exit::bad_input;
use crate::stages::identity::{Check, Identity, scm_sha};

/// The info string that opens the block.
pub const INFO: &str = "parity-pin";

/// The value of `flashinfer_version` for an oracle without FlashInfer.
pub const NONE: &str = "none";

/// The keys of the block, in the order they are written.
pub const KEYS: [&str; 4] = [
    "vllm_commit",
    "vllm_runtime_version",
    "vllm_distribution_version",
    "flashinfer_version",
];

/// One parsed pin record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PinRecord {
    /// `vllm_commit`: the full 40-hex commit.
    pub commit: String,
    /// `vllm_runtime_version`: `<package>.__version__`.
    pub runtime_version: String,
    /// `vllm_distribution_version`: `importlib.metadata.version(<package>)`.
    pub distribution_version: String,
    /// `flashinfer_version`: `flashinfer.__version__`, `None` for `none`.
    pub flashinfer_version: Option<String>,
}

/// Reads the one ```` ```parity-pin ```` block of the file at `path`.
///
/// Errors (exit 2): the file cannot be read, or [`parse`] fails; the message
/// names the file.
pub fn read(path: &Path) -> Result<PinRecord> {
    let text = fs_err::read_to_string(path)
        .map_err(|e| bad_input(format!("cannot read the pin file: {e}")))?;
    parse(&text, &path.display().to_string())
}

/// Parses the ```` ```parity-pin ```` record of `text` (`origin` names it in errors).
///
/// Repeated blocks are accepted when they are identical (appending the same
/// block twice, e.g. `verify --emit-pin-block >> SYNC.md` run again, keeps
/// the file valid); blocks that differ are refused (keep one, or let
/// `verify --write-pin-block FILE` replace them).
///
/// Errors (exit 2), each naming the line: no block; blocks that differ; an
/// unclosed block; a line that is not `key = value`; an unknown, repeated or
/// missing key; a `vllm_commit` that is not 40 hex digits; an empty value.
pub fn parse(text: &str, origin: &str) -> Result<PinRecord> {
    let lines: Vec<&str> = text.lines().collect();
    let blocks = find_blocks(&lines, origin)?;
    let Some(&(open, close)) = blocks.first() else {
        return Err(bad_input(format!(
            "{origin}: no ```{INFO} block (expected one fenced block with {})",
            KEYS.join(", ")
        )));
    };
    let first = parse_block(&lines, open, close, origin)?;
    for &(o, c) in &blocks[1..] {
        if parse_block(&lines, o, c, origin)? != first {
            let at: Vec<String> = blocks
                .iter()
                .map(|(o, _)| format!("line {}", o + 1))
                .collect();
            return Err(bad_input(format!(
                "{origin}: {} ```{INFO} blocks (at {}) that differ; keep exactly one (`oracle-build verify <PIN> --write-pin-block {origin}` replaces them with the measured one)",
                blocks.len(),
                at.join(", ")
            )));
        }
    }
    Ok(first)
}

/// The (opening, closing) line indexes of every ```` ```parity-pin ```` block.
///
/// Errors (exit 2): a block that is never closed.
fn find_blocks(lines: &[&str], origin: &str) -> Result<Vec<(usize, usize)>> {
    let mut blocks: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some((fence, info)) = fence_open(lines[i]) else {
            i += 1;
            continue;
        };
        let close = (i + 1..lines.len()).find(|&j| is_fence_close(lines[j], fence));
        if info == INFO {
            let Some(close) = close else {
                return Err(bad_input(format!(
                    "{origin}:{}: the ```{INFO} block is never closed",
                    i + 1
                )));
            };
            blocks.push((i, close));
        }
        // Skip over any fenced block, so a fence inside another block is not counted.
        i = close.map_or(lines.len(), |c| c + 1);
    }
    Ok(blocks)
}

/// `text` with its ```` ```parity-pin ```` record replaced by `block` (a
/// rendered block, see [`PinRecord::render`]): the first block is replaced,
/// any further ones are removed, and without one `block` is appended
/// (after a blank line). Everything else is kept byte for byte.
///
/// Errors (exit 2): a block that is never closed (nothing is replaced).
pub fn replace_block(text: &str, block: &str, origin: &str) -> Result<String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let trimmed: Vec<&str> = lines
        .iter()
        .map(|l| l.trim_end_matches(['\n', '\r']))
        .collect();
    let blocks = find_blocks(&trimmed, origin)?;
    let mut out = String::with_capacity(text.len() + block.len());
    if blocks.is_empty() {
        out.push_str(text);
        if !text.is_empty() && !text.ends_with('\n') {
            out.push('\n');
        }
        if !text.is_empty() {
            out.push('\n');
        }
        out.push_str(block);
        return Ok(out);
    }
    let mut n = 0;
    while n < lines.len() {
        if let Some(b) = blocks.iter().position(|(o, _)| *o == n) {
            if b == 0 {
                out.push_str(block);
            }
            n = blocks[b].1 + 1;
            continue;
        }
        out.push_str(lines[n]);
        n += 1;
    }
    Ok(out)
}

/// Parses the block between the fence lines `open` and `close`.
fn parse_block(lines: &[&str], open: usize, close: usize, origin: &str) -> Result<PinRecord> {
    let mut values: [Option<String>; 4] = Default::default();
    for (n, raw) in lines.iter().enumerate().take(close).skip(open + 1) {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = format!("{origin}:{}", n + 1);
        let Some((key, value)) = line.split_once('=') else {
            return Err(bad_input(format!(
                "{at}: expected `key = value`, found {line:?}"
            )));
        };
        let (key, value) = (key.trim(), value.trim());
        let Some(slot) = KEYS.iter().position(|k| *k == key) else {
            return Err(bad_input(format!(
                "{at}: unknown key {key:?} (the keys are {})",
                KEYS.join(", ")
            )));
        };
        if values[slot].is_some() {
            return Err(bad_input(format!("{at}: {key} is given twice")));
        }
        if value.is_empty() {
            return Err(bad_input(format!("{at}: {key} has no value")));
        }
        if key == "vllm_commit"
            && !(value.len() == 40 && value.chars().all(|c| c.is_ascii_hexdigit()))
        {
            return Err(bad_input(format!(
                "{at}: vllm_commit must be the full 40-hex commit, found {value:?} ({} characters)",
                value.len()
            )));
        }
        values[slot] = Some(value.to_string());
    }
    let missing: Vec<&str> = KEYS
        .iter()
        .zip(&values)
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| *k)
        .collect();
    if !missing.is_empty() {
        return Err(bad_input(format!(
            "{origin}:{}: the ```{INFO} block lacks {}",
            open + 1,
            missing.join(", ")
        )));
    }
    let [commit, runtime, distribution, flashinfer] = values.map(Option::unwrap_or_default);
    Ok(PinRecord {
        commit: commit.to_ascii_lowercase(),
        runtime_version: runtime,
        distribution_version: distribution,
        flashinfer_version: (flashinfer != NONE).then_some(flashinfer),
    })
}

/// A CommonMark fence opener: up to 3 spaces, then 3+ backticks or tildes,
/// then the info string. Returns (fence, first word of the info string).
fn fence_open(line: &str) -> Option<(&str, &str)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let ch = rest.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = rest.len() - rest.trim_start_matches(ch).len();
    if len < 3 {
        return None;
    }
    let info = rest[len..].split_whitespace().next().unwrap_or("");
    Some((&rest[..len], info))
}

/// Whether `line` closes a block opened by `fence` (same character, at least as long, nothing after).
fn is_fence_close(line: &str, fence: &str) -> bool {
    let t = line.trim();
    let ch = fence.chars().next().unwrap_or('`');
    line.len() - line.trim_start_matches(' ').len() <= 3
        && t.len() >= fence.len()
        && t.chars().all(|c| c == ch)
}

impl PinRecord {
    /// The block measured from an oracle: its commit and its identity.
    pub fn from_identity(commit: &str, id: &Identity) -> PinRecord {
        PinRecord {
            commit: commit.to_string(),
            runtime_version: id.runtime_version.clone().unwrap_or_default(),
            distribution_version: id.distribution_version.clone().unwrap_or_default(),
            flashinfer_version: id.flashinfer_version.clone(),
        }
    }

    /// The fenced block, ready to paste into the users' record (ends with a newline).
    pub fn render(&self) -> String {
        format!(
            "```{INFO}\nvllm_commit = {}\nvllm_runtime_version = {}\nvllm_distribution_version = {}\nflashinfer_version = {}\n```\n",
            self.commit,
            self.runtime_version,
            self.distribution_version,
            self.flashinfer_version.as_deref().unwrap_or(NONE)
        )
    }

    /// Compares every field with its own measurement. `recorded_commit` is the
    /// commit the oracle was built from (its `oracle.json`), when known.
    ///
    /// - `vllm_commit`: the measured `+g<sha>` must prefix it, and the
    ///   recorded commit (if any) must equal it;
    /// - `vllm_runtime_version` / `vllm_distribution_version` /
    ///   `flashinfer_version`: equal, as strings, to their own measured value
    ///   (`none` matches an absent FlashInfer).
    pub fn checks(&self, id: &Identity, recorded_commit: Option<&str>) -> Vec<Check> {
        let sha = id.runtime_version.as_deref().and_then(scm_sha);
        let commit_ok = sha.is_some_and(|s| self.commit.starts_with(&s.to_ascii_lowercase()))
            && recorded_commit.is_none_or(|c| c == self.commit);
        let commit_found = match (recorded_commit, sha) {
            (Some(c), Some(s)) => format!("{c} (built from; runtime +g{s})"),
            (Some(c), None) => format!("{c} (built from; runtime version has no +g<sha>)"),
            (None, Some(s)) => format!("+g{s}"),
            (None, None) => "no +g<sha> in the runtime version".to_string(),
        };
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".into());
        vec![
            Check {
                field: "vllm_commit".into(),
                expected: self.commit.clone(),
                found: commit_found,
                ok: commit_ok,
            },
            Check {
                field: "vllm_runtime_version".into(),
                expected: self.runtime_version.clone(),
                found: show(&id.runtime_version),
                ok: id.runtime_version.as_deref() == Some(self.runtime_version.as_str()),
            },
            Check {
                field: "vllm_distribution_version".into(),
                expected: self.distribution_version.clone(),
                found: show(&id.distribution_version),
                ok: id.distribution_version.as_deref() == Some(self.distribution_version.as_str()),
            },
            Check {
                field: "flashinfer_version".into(),
                expected: self
                    .flashinfer_version
                    .clone()
                    .unwrap_or_else(|| NONE.into()),
                found: id.flashinfer_version.clone().unwrap_or_else(|| NONE.into()),
                ok: id.flashinfer_version == self.flashinfer_version,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: &str = "5559679229bc961848b121ccdeaa8fa5d79bec98";

    fn block(body: &str) -> String {
        format!("# notes\n\nsome text\n\n```parity-pin\n{body}```\n\nmore\n")
    }

    fn full() -> String {
        format!(
            "vllm_commit = {C}\nvllm_runtime_version = 0.23.1rc1.dev1511+g555967922\nvllm_distribution_version = 0.23.1rc1.dev1511+g555967922.cu130\nflashinfer_version = 0.6.15.post1\n"
        )
    }

    fn err(text: &str) -> String {
        format!("{:#}", parse(text, "notes.md").unwrap_err())
    }

    #[test]
    fn parses_a_block_in_notes() {
        let p = parse(&block(&full()), "notes.md").unwrap();
        assert_eq!(p.commit, C);
        assert_eq!(p.runtime_version, "0.23.1rc1.dev1511+g555967922");
        assert_eq!(p.flashinfer_version.as_deref(), Some("0.6.15.post1"));
    }

    #[test]
    fn render_round_trips_and_none_is_absent() {
        let mut p = parse(&block(&full()), "x").unwrap();
        assert_eq!(parse(&p.render(), "x").unwrap(), p);
        p.flashinfer_version = None;
        assert!(p.render().contains("flashinfer_version = none\n"));
        assert_eq!(parse(&p.render(), "x").unwrap().flashinfer_version, None);
    }

    #[test]
    fn other_fenced_blocks_are_ignored() {
        let text = format!(
            "```\n```parity-pin\n```\n\n~~~python\nx = 1\n~~~\n{}",
            block(&full())
        );
        assert!(parse(&text, "x").is_ok());
    }

    #[test]
    fn refuses_zero_two_unknown_missing_short_and_unclosed() {
        assert!(err("no block here\n").contains("no ```parity-pin block"));
        let same = format!("{}{}", block(&full()), block(&full()));
        assert!(parse(&same, "x").is_ok(), "identical blocks are one record");
        let two = format!(
            "{}{}",
            block(&full()),
            block(&full().replace("0.6.15.post1", "0.6.16"))
        );
        assert!(
            err(&two).contains("2 ```parity-pin blocks (at line 5, line 17) that differ"),
            "{}",
            err(&two)
        );
        let unknown = block(&format!("{}torch_version = 2.13.0\n", full()));
        assert!(err(&unknown).contains("unknown key \"torch_version\""));
        let missing = block(&full().replace("flashinfer_version = 0.6.15.post1\n", ""));
        assert!(err(&missing).contains("lacks flashinfer_version"));
        let short = block(&full().replace(C, "555967922"));
        assert!(
            err(&short).contains("full 40-hex commit"),
            "{}",
            err(&short)
        );
        let twice = block(&format!("{}vllm_commit = {C}\n", full()));
        assert!(err(&twice).contains("given twice"));
        assert!(err("```parity-pin\nvllm_commit = x\n").contains("never closed"));
        assert!(err(&block("just words\n")).contains("expected `key = value`"));
    }

    #[test]
    fn replace_block_keeps_the_rest_and_leaves_one_block() {
        let b = format!("```parity-pin\n{}```\n", full());
        let new = b.replace("0.6.15.post1", "0.7.0");
        let text = format!("# notes\n\n{b}\nmore text\n{b}tail\n");
        let out = replace_block(&text, &new, "x").unwrap();
        assert_eq!(out, format!("# notes\n\n{new}\nmore text\ntail\n"));
        assert_eq!(
            parse(&out, "x").unwrap().flashinfer_version.as_deref(),
            Some("0.7.0")
        );
        assert_eq!(replace_block("", &new, "x").unwrap(), new);
        assert_eq!(
            replace_block("notes", &new, "x").unwrap(),
            format!("notes\n\n{new}")
        );
    }
}
