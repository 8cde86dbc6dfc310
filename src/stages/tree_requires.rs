//! A tree's own requirements at a commit, read from the git object
//! database of the store's mirror (no checkout, every file read bounded),
//! each with the file and line that declares it, parsed as PEP 508
//! (`pep508_rs`, never a regular expression).
//!
//! The rule (docs/advance.md, "What a tree asks"):
//!
//! - **build set**: the first of `requirements/build/<device>.txt`,
//!   `requirements/build.txt` (as the lock reads it,
//!   [`crate::stages::lock::build_candidates`]) and `pyproject.toml`
//!   `[build-system] requires`;
//! - **runtime set**: the first of `requirements/<device>.txt`,
//!   `requirements/common.txt` (what vLLM's `setup.py` reads for the
//!   device, as the lock's fallback does), and `pyproject.toml`
//!   `[project] dependencies`;
//!
//! `-r FILE` / `--requirement FILE` lines are followed (relative to the
//! including file, never out of the tree); `-c` constraint files and other
//! options (`--extra-index-url`) declare no requirement and are skipped; a
//! line that is no PEP 508 requirement (`-e .`, a local path) is kept in
//! [`TreeRequirements::unparsed`] with its file and line, not dropped.
//! Markers are kept as written, not evaluated.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use pep508_rs::{PackageName, Requirement, VersionOrUrl};
use serde::{Deserialize, Serialize};

use crate::stages::source::{self, CommitFiles};

/// The largest requirement file or `pyproject.toml` read from a tree.
pub const MAX_FILE_BYTES: usize = 1 << 20;

/// The most files followed through `-r` from one starting file.
const MAX_FILES: usize = 64;

/// Which set a requirement belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Set {
    /// What the build backend needs to build the wheel.
    Build,
    /// What the installed package needs.
    Runtime,
}

impl Set {
    /// `build` or `runtime`.
    pub fn as_str(self) -> &'static str {
        match self {
            Set::Build => "build",
            Set::Runtime => "runtime",
        }
    }
}

/// One requirement a tree declares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeRequirement {
    /// The set it belongs to.
    pub set: Set,
    /// The normalized package name (PEP 503).
    pub name: String,
    /// The requirement as `pep508_rs` writes it back (`packaging==24.2`).
    pub requirement: String,
    /// The version specifier (`==24.2`, `>=69`; empty: any version; a URL
    /// requirement: `@ <url>`).
    pub specifier: String,
    /// The marker as written back (empty: none).
    pub marker: String,
    /// The version when the requirement is an exact pin (`==V` or `===V`,
    /// one specifier, no wildcard).
    pub exact: Option<String>,
    /// The file, relative to the tree's root.
    pub file: String,
    /// Its 1-based line.
    pub line: usize,
}

impl TreeRequirement {
    /// `file:line`.
    pub fn at(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// A line of a requirement file that is not a PEP 508 requirement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unparsed {
    /// The file, relative to the tree's root.
    pub file: String,
    /// Its 1-based line.
    pub line: usize,
    /// The line as written.
    pub text: String,
    /// What `pep508_rs` said.
    pub error: String,
}

/// Everything a tree asks for, for one target device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TreeRequirements {
    /// The commit read.
    pub commit: String,
    /// The target device the files were picked for.
    pub device: String,
    /// The files read, in order (relative to the tree's root).
    pub files: Vec<String>,
    /// The build set, in file order.
    pub build: Vec<TreeRequirement>,
    /// The runtime set, in file order.
    pub runtime: Vec<TreeRequirement>,
    /// Lines that are no PEP 508 requirement.
    pub unparsed: Vec<Unparsed>,
    /// What could not be read (a `pyproject.toml` that does not parse, a
    /// file over [`MAX_FILE_BYTES`]).
    pub problems: Vec<String>,
}

impl TreeRequirements {
    /// Every requirement of both sets, build first.
    pub fn all(&self) -> impl Iterator<Item = &TreeRequirement> {
        self.build.iter().chain(&self.runtime)
    }

    /// The exact pins of package `name` (any spelling), in both sets.
    pub fn exact_pins(&self, name: &str) -> Vec<&TreeRequirement> {
        let n = normalize(name);
        self.all()
            .filter(|r| r.name == n && r.exact.is_some())
            .collect()
    }

    /// The requirements of package `name` (any spelling), in both sets.
    pub fn of(&self, name: &str) -> Vec<&TreeRequirement> {
        let n = normalize(name);
        self.all().filter(|r| r.name == n).collect()
    }
}

/// `name` normalized as PEP 503 says (`pep508_rs::PackageName`); as given
/// (lower-cased) when it is no package name.
pub fn normalize(name: &str) -> String {
    PackageName::from_str(name)
        .map(|n| n.to_string())
        .unwrap_or_else(|_| name.to_ascii_lowercase())
}

/// Whether the versions `a` and `b` are equal as PEP 440 versions
/// (`24.1` and `24.1.0` are); compared as text when either is no version.
pub fn same_version(a: &str, b: &str) -> bool {
    match (
        pep440_rs::Version::from_str(a),
        pep440_rs::Version::from_str(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// The requirements of the tree at `commit` in the bare mirror `mirror`
/// for target `device`, read from git's object database (no checkout).
///
/// Errors: the mirror cannot be opened or lacks the commit (the message
/// names both).
pub fn read_at(mirror: &Path, commit: &str, device: &str) -> anyhow::Result<TreeRequirements> {
    let tree = CommitFiles::open(mirror, commit).ok_or_else(|| {
        anyhow::anyhow!(
            "the mirror {} does not hold commit {commit}: cannot read its requirements",
            mirror.display()
        )
    })?;
    let mut out = read_with(&|rel| tree.read(rel, MAX_FILE_BYTES), device);
    out.commit = commit.to_string();
    Ok(out)
}

/// [`read_at`] of a tree read through `read` (a path relative to the
/// tree's root -> its text; `None`: absent, or over the bound). Pure.
pub fn read_with(read: &dyn Fn(&str) -> Option<String>, device: &str) -> TreeRequirements {
    let mut out = TreeRequirements {
        device: device.to_string(),
        ..Default::default()
    };
    let pyproject = read("pyproject.toml").map(|text| pyproject_lists(&text));
    let pyproject = match pyproject {
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => {
            out.problems
                .push(format!("pyproject.toml does not parse: {e}"));
            None
        }
        None => None,
    };
    let build_files = crate::stages::lock::build_candidates(device);
    let runtime_files = [
        format!("requirements/{device}.txt"),
        "requirements/common.txt".to_string(),
    ];
    for (set, candidates, from_pyproject) in [
        (
            Set::Build,
            &build_files,
            pyproject.as_ref().map(|p| &p.build),
        ),
        (
            Set::Runtime,
            &runtime_files,
            pyproject.as_ref().map(|p| &p.runtime),
        ),
    ] {
        let mut reqs = Vec::new();
        if let Some(first) = candidates.iter().find(|rel| read(rel).is_some()) {
            read_file(read, first, set, &mut reqs, &mut out);
        } else if let Some(list) = from_pyproject.filter(|l| !l.is_empty()) {
            if !out.files.iter().any(|f| f == "pyproject.toml") {
                out.files.push("pyproject.toml".into());
            }
            for (line, text) in list {
                push(set, "pyproject.toml", *line, text, &mut reqs, &mut out);
            }
        }
        match set {
            Set::Build => out.build = reqs,
            Set::Runtime => out.runtime = reqs,
        }
    }
    out
}

/// `[build-system] requires` and `[project] dependencies` of a
/// `pyproject.toml`, each entry with its line.
struct PyprojectLists {
    build: Vec<(usize, String)>,
    runtime: Vec<(usize, String)>,
}

fn pyproject_lists(text: &str) -> Result<PyprojectLists, String> {
    #[derive(Deserialize, Default)]
    struct Doc {
        #[serde(rename = "build-system", default)]
        build_system: Option<List>,
        #[serde(default)]
        project: Option<Deps>,
    }
    #[derive(Deserialize, Default)]
    struct List {
        #[serde(default)]
        requires: Vec<toml::Spanned<String>>,
    }
    #[derive(Deserialize, Default)]
    struct Deps {
        #[serde(default)]
        dependencies: Vec<toml::Spanned<String>>,
    }
    let doc: Doc = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let line_of = |s: &toml::Spanned<String>| {
        text[..s.span().start.min(text.len())]
            .lines()
            .count()
            .max(1)
    };
    let lines = |v: &[toml::Spanned<String>]| {
        v.iter()
            .map(|s| (line_of(s), s.get_ref().clone()))
            .collect::<Vec<_>>()
    };
    Ok(PyprojectLists {
        build: doc
            .build_system
            .map(|b| lines(&b.requires))
            .unwrap_or_default(),
        runtime: doc
            .project
            .map(|p| lines(&p.dependencies))
            .unwrap_or_default(),
    })
}

/// Reads the requirement file `rel` and every file it includes through
/// `-r` (each once, at most [`MAX_FILES`]).
fn read_file(
    read: &dyn Fn(&str) -> Option<String>,
    rel: &str,
    set: Set,
    reqs: &mut Vec<TreeRequirement>,
    out: &mut TreeRequirements,
) {
    let mut seen: Vec<String> = Vec::new();
    let mut todo = vec![rel.to_string()];
    while let Some(file) = todo.pop() {
        if seen.contains(&file) || seen.len() >= MAX_FILES {
            continue;
        }
        seen.push(file.clone());
        let Some(text) = read(&file) else {
            out.problems.push(format!(
                "{file} (included) is absent or larger than {MAX_FILE_BYTES} bytes: not read"
            ));
            continue;
        };
        if !out.files.contains(&file) {
            out.files.push(file.clone());
        }
        let dir = Path::new(&file).parent().unwrap_or(Path::new(""));
        let mut includes = Vec::new();
        for (i, logical) in logical_lines(&text) {
            let t = logical.trim();
            if let Some(inc) = include_of(t) {
                match source::tree_relative(&dir.join(inc)) {
                    Some(p) => includes.push(p),
                    None => out
                        .problems
                        .push(format!("{file}:{i}: `{t}` leaves the tree: not followed")),
                }
                continue;
            }
            if t.starts_with('-') {
                // Options (`-c`, `--extra-index-url`, `-e`, ...): no requirement
                // of this set, except `-e` which is kept as unparsed.
                if t.starts_with("-e") || t.starts_with("--editable") {
                    out.unparsed.push(Unparsed {
                        file: file.clone(),
                        line: i,
                        text: t.to_string(),
                        error: "an editable install, not a PEP 508 requirement".into(),
                    });
                }
                continue;
            }
            push(set, &file, i, t, reqs, out);
        }
        todo.extend(includes.into_iter().rev());
    }
}

/// The lines of a requirement file as pip joins them (a trailing `\`
/// continues the line), comments (`#` at the start or after whitespace)
/// and blank lines dropped: each with the 1-based number of its first line.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let (n, mut acc) = cur.take().unwrap_or((i + 1, String::new()));
        let continued = raw.ends_with('\\');
        acc.push_str(raw.strip_suffix('\\').unwrap_or(raw));
        if continued {
            acc.push(' ');
            cur = Some((n, acc));
            continue;
        }
        let code = strip_comment(&acc).trim().to_string();
        if !code.is_empty() {
            out.push((n, code));
        }
    }
    if let Some((n, acc)) = cur {
        let code = strip_comment(&acc).trim().to_string();
        if !code.is_empty() {
            out.push((n, code));
        }
    }
    out
}

/// `line` without a comment: `#` at its start or after whitespace (pip's
/// rule, so a URL fragment `#egg=` stays).
fn strip_comment(line: &str) -> &str {
    if line.trim_start().starts_with('#') {
        return "";
    }
    let b = line.as_bytes();
    for i in 1..b.len() {
        if b[i] == b'#' && b[i - 1].is_ascii_whitespace() {
            return &line[..i];
        }
    }
    line
}

/// The file a `-r FILE` / `--requirement[=]FILE` line includes.
fn include_of(t: &str) -> Option<&str> {
    for o in ["--requirement", "-r"] {
        if let Some(rest) = t.strip_prefix(o) {
            let v = if let Some(v) = rest.strip_prefix('=') {
                v
            } else if rest.starts_with(char::is_whitespace) || o == "-r" {
                rest
            } else {
                continue;
            };
            let v = v.trim();
            if !v.is_empty() {
                return Some(v);
            }
        }
    }
    None
}

/// Parses `text` (one requirement) and records it, or records why not.
fn push(
    set: Set,
    file: &str,
    line: usize,
    text: &str,
    reqs: &mut Vec<TreeRequirement>,
    out: &mut TreeRequirements,
) {
    match Requirement::<pep508_rs::VerbatimUrl>::from_str(text) {
        Ok(r) => reqs.push(describe(set, file, line, &r)),
        Err(e) => out.unparsed.push(Unparsed {
            file: file.to_string(),
            line,
            text: text.to_string(),
            error: e.message.to_string(),
        }),
    }
}

fn describe(
    set: Set,
    file: &str,
    line: usize,
    r: &Requirement<pep508_rs::VerbatimUrl>,
) -> TreeRequirement {
    let (specifier, exact) = match &r.version_or_url {
        None => (String::new(), None),
        Some(VersionOrUrl::Url(u)) => (format!("@ {u}"), None),
        Some(VersionOrUrl::VersionSpecifier(s)) => (s.to_string(), exact_version(r)),
    };
    TreeRequirement {
        set,
        name: r.name.to_string(),
        requirement: r.to_string(),
        specifier,
        marker: r.marker.try_to_string().unwrap_or_default(),
        exact,
        file: file.to_string(),
        line,
    }
}

/// The version `r` pins exactly (one `==V` or `===V` specifier, no
/// wildcard); `None` for anything else.
pub fn exact_version<T: pep508_rs::Pep508Url>(r: &Requirement<T>) -> Option<String> {
    let Some(VersionOrUrl::VersionSpecifier(s)) = &r.version_or_url else {
        return None;
    };
    match s.iter().collect::<Vec<_>>().as_slice() {
        [one]
            if matches!(
                one.operator(),
                pep440_rs::Operator::Equal | pep440_rs::Operator::ExactEqual
            ) =>
        {
            Some(one.version().to_string())
        }
        _ => None,
    }
}

/// The recipe pins (`pins`: name -> version) that contradict an exact pin
/// of the tree `tree` (no exact pin of the package in either set is that
/// version): each as (package, the recipe's version, the tree's exact
/// requirements). A pin the tree leaves open, or pins to the same version,
/// contradicts nothing. Pure.
pub fn contradictions<'a>(
    pins: &BTreeMap<String, String>,
    tree: &'a TreeRequirements,
) -> Vec<(String, String, Vec<&'a TreeRequirement>)> {
    pins.iter()
        .filter_map(|(name, version)| {
            let exact = tree.exact_pins(name);
            let agrees = exact
                .iter()
                .any(|r| r.exact.as_deref().is_some_and(|v| same_version(v, version)));
            (!exact.is_empty() && !agrees).then(|| (name.clone(), version.clone(), exact))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = files
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |rel: &str| m.get(rel).cloned()
    }

    #[test]
    fn reads_the_device_file_follows_includes_and_keeps_lines() {
        let read = tree(&[
            (
                "requirements/cpu.txt",
                "# cpu\n-r common.txt\n--extra-index-url https://x/simple\ntorch==2.9.0+cpu ; platform_machine == \"x86_64\"\n",
            ),
            (
                "requirements/common.txt",
                "packaging>=20  # comment\nFlashInfer_Python==0.6.18\nnumpy \\\n  <3\n-e .\n-c constraints.txt\n",
            ),
            ("requirements/cuda.txt", "-r common.txt\nflashinfer-cubin\n"),
            ("requirements/build/cpu.txt", "setuptools>=77\n"),
            (
                "pyproject.toml",
                "[build-system]\nrequires = [\n  \"setuptools>=69\",\n  \"wheel\",\n]\n",
            ),
        ]);
        let t = read_with(&read, "cpu");
        assert_eq!(
            t.files,
            [
                "requirements/build/cpu.txt",
                "requirements/cpu.txt",
                "requirements/common.txt"
            ]
        );
        assert_eq!(t.build.len(), 1);
        assert_eq!(t.build[0].at(), "requirements/build/cpu.txt:1");
        let shown: Vec<(String, String, Option<String>)> = t
            .runtime
            .iter()
            .map(|r| (r.name.clone(), r.at(), r.exact.clone()))
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "torch".to_string(),
                    "requirements/cpu.txt:4".to_string(),
                    Some("2.9.0+cpu".to_string())
                ),
                ("packaging".into(), "requirements/common.txt:1".into(), None),
                (
                    "flashinfer-python".into(),
                    "requirements/common.txt:2".into(),
                    Some("0.6.18".into())
                ),
                ("numpy".into(), "requirements/common.txt:3".into(), None),
            ]
        );
        assert!(!t.runtime[0].marker.is_empty());
        assert_eq!(t.unparsed.len(), 1, "{:?}", t.unparsed);
        assert_eq!(t.unparsed[0].line, 5);
        // The pyproject build list is used when no build file exists, with lines.
        let read2 = |rel: &str| {
            if rel.starts_with("requirements/build") {
                None
            } else {
                read(rel)
            }
        };
        let t2 = read_with(&read2, "cpu");
        let b: Vec<String> = t2.build.iter().map(TreeRequirement::at).collect();
        assert_eq!(b, ["pyproject.toml:3", "pyproject.toml:4"]);
    }

    #[test]
    fn a_pin_contradicts_only_a_different_exact_pin() {
        let read = tree(&[(
            "requirements/common.txt",
            "packaging==24.2\nidna>=3\nsix==1.17.0\n",
        )]);
        let t = read_with(&read, "empty");
        let pins = BTreeMap::from([
            ("Packaging".to_string(), "24.1".to_string()),
            ("idna".to_string(), "3.7".to_string()),
            ("six".to_string(), "1.17".to_string()),
            ("absent".to_string(), "1".to_string()),
        ]);
        let c = contradictions(&pins, &t);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].0, "Packaging");
        assert_eq!(c[0].2[0].at(), "requirements/common.txt:1");
    }
}
