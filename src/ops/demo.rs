//! `oracle-build demo [--python X.Y]`: every stage, on a machine without a GPU,
//! in seconds (docs/demo.md).
//!
//! The demo package `demollm` (`demo/pkg/` in the repository: setuptools +
//! setuptools-scm, a C extension, `_custom_ops`, vLLM's `LLM` /
//! `SamplingParams` over a tiny model in `demo/model/`) is compiled into the
//! binary. At run time the demo
//!
//! 1. commits the package into the bare repository `<root>/demo/repo` with
//!    git2: `demollm 0.1.0` (tagged `v0.1.0`), then one more commit, each
//!    with a fixed author, committer, time and message, so the pinned commit
//!    id ([`Demo::commit`]) is the same on every machine;
//! 2. writes the model into `<root>/demo/models/model`;
//! 3. writes the recipe `<root>/demo/recipes/demo.yaml` for that commit
//!    (Python: `--python`, else the newest Python 3.10+ found, see
//!    [`newest_python`]);
//! 4. runs `build` on that recipe file ([`crate::ops::build::execute`]) and
//!    then `verify` ([`crate::ops::verify::verify`]): the same code as the
//!    commands, no special path. A second `demo` finds every stage in the
//!    store and builds nothing.
//!
//! Only the package index (PyPI) is needed: the lock's cut-off is the commit's
//! fixed time, so the resolution is the same on every run.
//!
//! Exit codes as `build` and `verify`: 2 bad input, 1 a failure, 3 the
//! identity does not match, 4 built but not gateable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use fs_err as fs;
use git2::{ObjectType, Oid, Repository, RepositoryInitOptions, Signature, Time};
use serde::Serialize;

use crate::exit::{bad_input, mismatch, not_gateable};
use crate::host::toolchain;
use crate::ops::build::{self, BuildOptions, BuildReport};
use crate::ops::verify::{self, Verification, VerifyOptions};
use crate::ops::{Session, print_json};
use crate::progress;
use crate::stages::identity;
use crate::stages::smoke::Verdict;
use crate::store::Store;
use crate::store::write_atomic;

/// Embeds the files `$path...` of `demo/$dir/` as `(path, bytes)` pairs.
macro_rules! embed {
    ($dir:literal; $($path:literal),* $(,)?) => {
        &[$(($path, include_bytes!(concat!("../../demo/", $dir, "/", $path)) as &[u8])),*]
    };
}

/// The package tree of the demo's first commit (`demo/pkg/`, without `README.md`).
const PACKAGE: &[(&str, &[u8])] = embed!("pkg";
    ".gitignore",
    "csrc/ops.c",
    "demollm/__init__.py",
    "demollm/_custom_ops.py",
    "demollm/_mode.py",
    "demollm/config.py",
    "demollm/entrypoints/__init__.py",
    "demollm/entrypoints/llm.py",
    "demollm/logprobs.py",
    "demollm/model.py",
    "demollm/outputs.py",
    "demollm/sampling_params.py",
    "pyproject.toml",
    "requirements/build.txt",
    "requirements/cpu.txt",
    "setup.py",
);

/// The file the second commit adds (`demo/pkg/README.md`).
const SECOND: &[(&str, &[u8])] = embed!("pkg"; "README.md");

/// The model the gate runs (`demo/model/`).
const MODEL: &[(&str, &[u8])] = embed!("model"; "config.json", "vocab.json", "weights.json");

/// The demo's distribution and import name.
pub const PACKAGE_NAME: &str = "demollm";
/// The recipe's name (and so the name of its GC root, `roots/demo`).
pub const RECIPE_NAME: &str = "demo";
/// The tag on the first commit.
pub const TAG: &str = "v0.1.0";
/// Author, committer and tagger of the demo's history.
const AUTHOR: (&str, &str) = ("oracle-build demo", "demo@oracle-build.invalid");
/// The first commit's time: 2025-06-01T00:00:00Z; the second is an hour later.
const TIME: i64 = 1_748_736_000;
/// Branch of the demo repository.
const BRANCH: &str = "refs/heads/main";

/// Options of `demo`.
#[derive(Debug, Clone, Default)]
pub struct DemoOptions {
    /// `--python X.Y` (default: the newest Python 3.10+ found).
    pub python: Option<String>,
}

/// What the demo set up before running the pipeline.
#[derive(Debug, Clone, Serialize)]
pub struct Demo {
    /// The bare repository holding the demo's history (`<root>/demo/repo`).
    pub repo: PathBuf,
    /// The pinned commit (the second one; the same on every machine).
    pub commit: String,
    /// The recipe file written for it (`<root>/demo/recipes/demo.yaml`).
    pub recipe: PathBuf,
    /// The model directory the gate runs (`<root>/demo/models/model`).
    pub model: PathBuf,
    /// The recipe's Python `major.minor`.
    pub python: String,
}

/// What `demo --json` prints: the setup, the build report and the verification.
#[derive(Debug, Serialize)]
pub struct DemoReport {
    /// The setup.
    pub demo: Demo,
    /// The report of `build` (the same object `build --json` prints).
    pub build: BuildReport,
    /// The verification (the same object `verify --json` prints).
    pub verify: Verification,
}

/// Runs the demo and prints the build report and the verification (or, with
/// `--json`, one [`DemoReport`]).
///
/// Errors: `--python` is not a Python 3.10+ `major.minor` (exit 2, before
/// anything is written); no Python 3.10+ is found (exit 1); then as `build`
/// (1, 2, 3) and `verify` (3 when a check fails); 4 when the oracle was built
/// but is not gateable.
pub fn run(s: &Session, opts: &DemoOptions) -> Result<DemoReport> {
    let python = match &opts.python {
        Some(v) => parse_minor(v).map_err(|e| bad_input(format!("--python {v:?}: {e}")))?,
        None => newest_python()?,
    };
    let store = s.store()?;
    let demo = prepare(&store, &python)?;
    let pin = demo.recipe.display().to_string();
    // Build and verify the demo's own recipe file (its lock beside it) in
    // the store just opened.
    let here = Session {
        store: Some(store.root().to_path_buf()),
        lockfiles: None,
        json: s.json,
    };
    let report = build::execute(
        &here,
        &BuildOptions {
            pin: pin.clone(),
            ..BuildOptions::default()
        },
    )?;
    let v = verify::verify(&here, &pin, &VerifyOptions::default())?;
    let gateable = report.verdict == Verdict::Gateable;
    let out = DemoReport {
        demo,
        build: report,
        verify: v,
    };
    if s.json {
        print_json(&out)?;
    } else {
        build::print_report(&out.build);
        println!();
        verify::print_checks(&out.verify, false);
    }
    if !out.verify.ok {
        return Err(mismatch(format!(
            "the demo oracle {} is not the pin:\n{}",
            out.verify.venv.display(),
            identity::describe_failures(&out.verify.checks)
        )));
    }
    if !gateable {
        return Err(not_gateable(format!(
            "the demo oracle {} was built but is not gateable",
            out.build.oracle.display()
        )));
    }
    Ok(out)
}

/// Writes the demo's repository, model and recipe under `store`'s
/// `<root>/demo/` (each atomically, each left alone when already right) and
/// returns where they are. `python` is the recipe's `major.minor`.
///
/// Errors: a write fails (names the path); the store root's path cannot be
/// written into the recipe (not UTF-8, or holds `${`), exit 2.
pub fn prepare(store: &Store, python: &str) -> Result<Demo> {
    let dir = store.demo_dir();
    let root_text = dir.to_str().ok_or_else(|| {
        bad_input(format!(
            "store root {} is not valid UTF-8, so the demo recipe cannot name it; choose another --store",
            store.root().display()
        ))
    })?;
    if root_text.contains("${") {
        return Err(bad_input(format!(
            "store root {root_text} holds `${{`, which a recipe reads as a variable; choose another --store"
        )));
    }
    fs::create_dir_all(dir.join("recipes"))?;
    fs::create_dir_all(dir.join("models"))?;
    let repo = dir.join("repo");
    let commit = ensure_repo(&repo)?;
    let model = dir.join("models").join("model");
    ensure_files(&model, MODEL)?;
    let recipe = dir.join("recipes").join(format!("{RECIPE_NAME}.yaml"));
    let text = recipe_text(&repo, &commit, python, &model)?;
    if fs::read(&recipe).ok().as_deref() != Some(text.as_bytes()) {
        write_atomic(&recipe, text.as_bytes())?;
    }
    progress::stage(
        "demo",
        format!(
            "{PACKAGE_NAME} at {commit} ({TAG} + 1) in {}, Python {python}, recipe {}",
            repo.display(),
            recipe.display()
        ),
    );
    Ok(Demo {
        repo,
        commit,
        recipe,
        model,
        python: python.to_string(),
    })
}

/// The recipe of the demo: `commit` of `repo`, built for CPU with `python`,
/// gated on `model`. Paths are written as JSON strings (valid YAML
/// double-quoted scalars), so any UTF-8 path is read back as written.
fn recipe_text(repo: &Path, commit: &str, python: &str, model: &Path) -> Result<String> {
    let q = |p: &Path| serde_json::to_string(&p.display().to_string());
    Ok(format!(
        "# Written by `oracle-build demo`: the demo package {PACKAGE_NAME}, built for CPU.\n\
         name: {RECIPE_NAME}\n\
         source:\n  repo: {repo}\n  commit: {commit}\n  package: {PACKAGE_NAME}\n\
         python: \"{python}\"\n\
         build:\n  target_device: cpu\n\
         smoke:\n  runs: 3\n  cases:\n    - name: small\n      model: {model}\n      \
         prompt: \"The capital of France is Paris, and the\"\n      max_tokens: 16\n      \
         engine_args: {{enforce_eager: true, max_model_len: 256, gpu_memory_utilization: 0.5, max_num_seqs: 1, dtype: bfloat16}}\n",
        repo = q(repo)?,
        model = q(model)?,
    ))
}

/// Parses a Python `major.minor` of 3.10 or later (`"3.12"`), returning it.
fn parse_minor(v: &str) -> Result<String, String> {
    let bad = || "not a Python `major.minor` of 3.10 or later (e.g. 3.12)".to_string();
    let (major, minor) = v.split_once('.').ok_or_else(bad)?;
    let (major, minor) = (
        major.parse::<u32>().map_err(|_| bad())?,
        minor.parse::<u32>().map_err(|_| bad())?,
    );
    if major != 3 || minor < 10 {
        return Err(bad());
    }
    Ok(format!("{major}.{minor}"))
}

/// The `major.minor` of the newest Python 3.10+ on this machine:
/// `$ORACLE_BUILD_PYTHON` when set, else the newest of `python3.10` ..
/// `python3.30`, `python3` and `python` on `PATH` that runs (each is probed
/// as the preflight does, so a failing version-manager shim is skipped). The
/// preflight then finds that Python again by its version.
///
/// Errors (exit 1): none found; the message names what was tried and `--python`.
pub fn newest_python() -> Result<String> {
    let minor_of = |version: &str| -> Option<u32> {
        let mut parts = version.split('.');
        (parts.next()? == "3").then_some(())?;
        parts.next()?.parse().ok()
    };
    if let Some(explicit) = std::env::var_os("ORACLE_BUILD_PYTHON").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(&explicit);
        let p = toolchain::probe_python(&path)
            .with_context(|| format!("ORACLE_BUILD_PYTHON={} does not run", path.display()))?;
        return match minor_of(&p.version) {
            Some(m) if m >= 10 => Ok(format!("3.{m}")),
            _ => Err(bad_input(format!(
                "ORACLE_BUILD_PYTHON={} is Python {}; the demo needs 3.10 or later",
                path.display(),
                p.version
            ))),
        };
    }
    let names = (10..=30)
        .rev()
        .map(|m| format!("python3.{m}"))
        .chain(["python3".to_string(), "python".to_string()]);
    let mut seen = std::collections::BTreeSet::new();
    let mut best: Option<u32> = None;
    let mut tried = Vec::new();
    for name in names {
        for path in which::which_all(&name).into_iter().flatten() {
            if !seen.insert(path.canonicalize().unwrap_or_else(|_| path.clone())) {
                continue;
            }
            match toolchain::probe_python(&path) {
                Ok(p) => match minor_of(&p.version) {
                    Some(m) if m >= 10 => best = best.max(Some(m)),
                    _ => tried.push(format!("{} is {}", path.display(), p.version)),
                },
                Err(_) => tried.push(format!("{} does not run", path.display())),
            }
        }
    }
    best.map(|m| format!("3.{m}")).ok_or_else(|| {
        anyhow!(
            "no Python 3.10 or later found on PATH (tried: {}); install one (e.g. `uv python install 3.12`), or name one with --python X.Y or ORACLE_BUILD_PYTHON",
            if tried.is_empty() {
                "nothing on PATH".to_string()
            } else {
                tried.join("; ")
            }
        )
    })
}

/// A directory tree of files, for building git trees.
#[derive(Default)]
struct Dir<'a> {
    files: BTreeMap<&'a str, &'a [u8]>,
    dirs: BTreeMap<&'a str, Dir<'a>>,
}

impl<'a> Dir<'a> {
    fn of(files: &[(&'a str, &'a [u8])]) -> Dir<'a> {
        let mut root = Dir::default();
        for (path, bytes) in files {
            let mut parts: Vec<&str> = path.split('/').collect();
            let name = parts.pop().unwrap_or(path);
            let mut d = &mut root;
            for p in parts {
                d = d.dirs.entry(p).or_default();
            }
            d.files.insert(name, bytes);
        }
        root
    }

    /// Writes the blobs and trees into `repo`; returns the tree id.
    fn write(&self, repo: &Repository) -> Result<Oid> {
        let mut tb = repo.treebuilder(None)?;
        for (name, bytes) in &self.files {
            tb.insert(name, repo.blob(bytes)?, 0o100644)?;
        }
        for (name, d) in &self.dirs {
            tb.insert(name, d.write(repo)?, 0o040000)?;
        }
        Ok(tb.write()?)
    }
}

/// Writes the demo history into the bare repository at `dir`: commit 1
/// (the package, tagged [`TAG`] by an annotated tag), commit 2 (adds
/// `README.md`), branch `main` at commit 2. Returns commit 2's id.
fn write_history(dir: &Path) -> Result<Oid> {
    let mut init = RepositoryInitOptions::new();
    init.bare(true).initial_head(BRANCH);
    let repo = Repository::init_opts(dir, &init)
        .with_context(|| format!("creating the demo repository {}", dir.display()))?;
    let sig = |t: i64| Signature::new(AUTHOR.0, AUTHOR.1, &Time::new(t, 0));
    let first_tree = repo.find_tree(Dir::of(PACKAGE).write(&repo)?)?;
    let first = repo.commit(
        Some(BRANCH),
        &sig(TIME)?,
        &sig(TIME)?,
        &format!("{PACKAGE_NAME} 0.1.0\n"),
        &first_tree,
        &[],
    )?;
    let first_obj = repo.find_object(first, Some(ObjectType::Commit))?;
    repo.tag(
        TAG,
        &first_obj,
        &sig(TIME)?,
        &format!("{PACKAGE_NAME} 0.1.0\n"),
        false,
    )?;
    let all: Vec<(&str, &[u8])> = PACKAGE.iter().chain(SECOND).copied().collect();
    let second_tree = repo.find_tree(Dir::of(&all).write(&repo)?)?;
    let parent = repo.find_commit(first)?;
    let second = repo.commit(
        Some(BRANCH),
        &sig(TIME + 3600)?,
        &sig(TIME + 3600)?,
        "Add README.md\n",
        &second_tree,
        &[&parent],
    )?;
    Ok(second)
}

/// The ids `main` and the tag point at in the repository at `dir`, if it opens.
fn heads(dir: &Path) -> Option<(Oid, Oid)> {
    let repo = Repository::open_bare(dir).ok()?;
    let main = repo.refname_to_id(BRANCH).ok()?;
    let tag = repo.refname_to_id(&format!("refs/tags/{TAG}")).ok()?;
    Some((main, tag))
}

/// Makes `dir` the demo repository: the history is written into a sibling
/// temporary directory; when `dir` already holds the same branch and tag it
/// is kept, otherwise the new one replaces it (renames only). Returns the
/// pinned commit id.
fn ensure_repo(dir: &Path) -> Result<String> {
    let parent = dir.parent().context("the demo repository has no parent")?;
    let tmp = tempfile::Builder::new()
        .prefix(".repo-")
        .tempdir_in(parent)
        .with_context(|| format!("creating a temporary directory in {}", parent.display()))?;
    let fresh = tmp.path().join("repo.git");
    let commit = write_history(&fresh)?;
    let want = heads(&fresh).context("reading back the demo repository just written")?;
    if heads(dir) != Some(want) {
        replace_dir(&fresh, dir, |d| heads(d) == Some(want))?;
    }
    Ok(commit.to_string())
}

/// Makes `dir` hold exactly `files` (0644): left alone when every file is
/// already there with the same bytes, else written into a sibling temporary
/// directory that replaces it.
fn ensure_files(dir: &Path, files: &[(&str, &[u8])]) -> Result<()> {
    let same = |d: &Path| {
        files
            .iter()
            .all(|(p, bytes)| std::fs::read(d.join(p)).ok().as_deref() == Some(*bytes))
    };
    if same(dir) {
        return Ok(());
    }
    let parent = dir.parent().context("the demo directory has no parent")?;
    let tmp = tempfile::Builder::new()
        .prefix(".files-")
        .tempdir_in(parent)
        .with_context(|| format!("creating a temporary directory in {}", parent.display()))?;
    let fresh = tmp.path().join("files");
    for (p, bytes) in files {
        let path = fresh.join(p);
        if let Some(d) = path.parent() {
            fs::create_dir_all(d)?;
        }
        fs::write(&path, bytes)?;
    }
    replace_dir(&fresh, dir, same)
}

/// Moves the directory `fresh` to `dir`. A `dir` already there is first moved
/// aside (and deleted after). When another process put a good `dir` in place
/// meanwhile (`good(dir)`), that one is kept.
fn replace_dir(fresh: &Path, dir: &Path, good: impl Fn(&Path) -> bool) -> Result<()> {
    let parent = dir.parent().context("the demo directory has no parent")?;
    let aside = tempfile::Builder::new()
        .prefix(".old-")
        .tempdir_in(parent)
        .with_context(|| format!("creating a temporary directory in {}", parent.display()))?;
    if dir.exists() {
        fs::rename(dir, aside.path().join("old"))?;
    }
    if let Err(e) = std::fs::rename(fresh, dir) {
        if good(dir) {
            return Ok(());
        }
        return Err(e).with_context(|| format!("moving {} to {}", fresh.display(), dir.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file under `demo/<dir>/`, relative, sorted.
    fn files_under(dir: &str) -> Vec<String> {
        fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(base, &p, out);
                } else {
                    let rel = p.strip_prefix(base).unwrap();
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
        }
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("demo").join(dir);
        let mut out = Vec::new();
        walk(&base, &base, &mut out);
        out.sort();
        out
    }

    /// The embedded lists name every file of `demo/pkg` and `demo/model`.
    #[test]
    fn every_demo_file_is_embedded() {
        let mut pkg: Vec<String> = PACKAGE
            .iter()
            .chain(SECOND)
            .map(|(p, _)| p.to_string())
            .collect();
        pkg.sort();
        assert_eq!(pkg, files_under("pkg"));
        let mut model: Vec<String> = MODEL.iter().map(|(p, _)| p.to_string()).collect();
        model.sort();
        assert_eq!(model, files_under("model"));
    }

    /// The history is the same wherever and whenever it is written.
    #[test]
    fn history_is_deterministic() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let x = write_history(&a.path().join("r")).unwrap();
        let y = write_history(&b.path().join("r")).unwrap();
        assert_eq!(x, y);
        assert_eq!(heads(&a.path().join("r")), heads(&b.path().join("r")));
    }

    #[test]
    fn python_versions() {
        assert_eq!(parse_minor("3.12").unwrap(), "3.12");
        assert_eq!(parse_minor("3.10").unwrap(), "3.10");
        for bad in ["3.9", "2.7", "3", "3.x", "4.0", "3.12.1", ""] {
            assert!(parse_minor(bad).is_err(), "{bad}");
        }
    }
}
