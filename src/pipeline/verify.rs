//! The verification engine of `verify` and `activate`: measure a venv's
//! identity now and check each field against its own expected value
//! (docs/identity.md). The command (`ops::verify`) finds the venv and the
//! recipe to check it against and renders the result.
//!
//! Expected values come from, each in its own check:
//! - the recipe: commit (`+g<sha>` prefix), clean tree, non-editable, imported
//!   from inside the venv, compiled extensions, build mode, Python version,
//!   `pins.torch` / `pins.flashinfer-*`, and the `expect` block;
//! - the oracle's own `oracle.json` (`recorded <field>`), when it has one;
//! - the entry's manifest (`files (manifest)`) and the package's `RECORD`
//!   (`files (RECORD)`): present with their sizes, or with `--deep` their hashes;
//! - with `--deep`, each staged source the wheel was built with (`staged
//!   source <name>`): its files are the git tree of the commit the wheel's
//!   key names;
//! - the recipe's added packages (`install.with`, `install.extras`), each
//!   installed at the version `oracle.json` recorded (`added <name>`);
//! - the users' pin record (`--pin-file`): `vllm_commit`,
//!   `vllm_runtime_version`, `vllm_distribution_version`, `flashinfer_version`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::recipe::Recipe;
use crate::stages::identity::pin_block::PinRecord;
use crate::stages::identity::record::{self, RecordCheck};
use crate::stages::identity::{self, Check, Identity};
use crate::stages::oracle::{self, ORACLE_JSON, OracleRecord};
use crate::stages::wheel::BuildRecord;
use crate::stages::wheel::families::{self, KernelFamily};
use crate::stages::{ext, source};
use crate::store::{Manifest, Store};

/// How the `files (RECORD)` and `files (manifest)` checks compare files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Present with the recorded size (`verify` without `--deep`).
    Sizes,
    /// Present with the recorded sha256, each file hashed once: the entry's
    /// manifest (which lists every file of the venv) by hash and RECORD by
    /// size, or, for a venv that is no store entry, RECORD by hash
    /// (`activate`, `doctor`).
    Content,
    /// Both RECORD and the manifest re-hashed (`verify --deep`).
    Deep,
}

/// What `--deep` found, in full (the checks carry a summary).
#[derive(Debug, Serialize, Default)]
pub struct Deep {
    /// The package's files against its `RECORD`, re-hashed (absent when the RECORD could not be read).
    pub record: Option<RecordCheck>,
    /// The entry's files against its `manifest.json`, re-hashed (absent when the venv is not a store entry).
    pub manifest: Option<Vec<String>>,
}

/// The verification document (`--json`).
#[derive(Debug, Serialize)]
pub struct Verification {
    /// The venv verified (resolved).
    pub venv: PathBuf,
    /// The recipe it was checked against.
    pub recipe: String,
    /// Why that recipe: `its oracle.json`, `--pin X`, or `the alias registry`.
    pub checked_against: String,
    /// The recipe the oracle was built from (its `oracle.json`), when it has one.
    pub built_from: Option<String>,
    /// Measured now.
    pub identity: Identity,
    /// Every check, passed or failed.
    pub checks: Vec<Check>,
    /// `--deep` details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deep: Option<Deep>,
    /// The pin file compared with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin_file: Option<PathBuf>,
    /// Warnings recorded with the oracle when it was built (a fork-only
    /// commit, a tagless history).
    pub warnings: Vec<String>,
    /// Checks not made when it was built (see `OracleRecord::notes`).
    #[serde(default)]
    pub notes: Vec<String>,
    /// The kernel families the tree's configure reported when the oracle's
    /// wheel was built (its `build.json` `kernel_families`); `None` when the
    /// wheel's record cannot be read or holds none.
    pub kernel_families: Option<Vec<KernelFamily>>,
    /// The kernel coverage of what the recorded gate's engines loaded
    /// (`oracle.json` `smoke.kernel_coverage`); `None` when no gate run
    /// recorded one (the kernel checks are then per extension).
    pub kernel_coverage: Option<crate::stages::identity::loaded::KernelCoverage>,
    /// Whether all passed.
    pub ok: bool,
    /// `--emit-pin-block`: the block measured from this oracle (only when `ok`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin_block: Option<String>,
}

/// The first line of `s` (an error chain shown in one check or message).
pub fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn summarize(problems: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut s = problems
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > SHOWN {
        s.push_str(&format!("; and {} more", problems.len() - SHOWN));
    }
    s
}

/// Checks of the venv's files: the package's `RECORD` and, for a store
/// entry, its manifest; sizes or hashes as `depth` says.
pub fn file_checks(venv: &Path, package: &str, depth: Depth, out: &mut Vec<Check>) -> Deep {
    let mut d = Deep::default();
    let in_store = venv.join(crate::store::MANIFEST).is_file();
    let (record_deep, manifest_deep) = match depth {
        Depth::Sizes => (false, false),
        Depth::Content => (!in_store, true),
        Depth::Deep => (true, true),
    };
    let kind = if record_deep { "sha256" } else { "size" };
    match record::check(venv, package, record_deep) {
        Ok(rc) => {
            out.push(Check {
                field: "files (RECORD)".into(),
                expected: format!(
                    "every file in {} present, {kind} as recorded ({} files)",
                    rc.record.strip_prefix(venv).unwrap_or(&rc.record).display(),
                    rc.files
                ),
                found: if rc.problems.is_empty() {
                    "intact".into()
                } else {
                    summarize(&rc.problems)
                },
                ok: rc.problems.is_empty(),
            });
            d.record = Some(rc);
        }
        Err(e) => out.push(Check {
            field: "files (RECORD)".into(),
            expected: format!("a readable {package} *.dist-info/RECORD"),
            found: format!("{e:#}"),
            ok: false,
        }),
    }
    if in_store {
        // Without --deep: sizes, and sha256 in directories changed since
        // the build (`Manifest::check_sizes`).
        let kind = if manifest_deep { "sha256" } else { "size" };
        match Manifest::read(venv) {
            Ok(m) => {
                let problems = if manifest_deep {
                    m.check(venv, true)
                } else {
                    m.check_sizes(venv)
                };
                out.push(Check {
                    field: "files (manifest)".into(),
                    expected: format!(
                        "every file of the store entry present, {kind} as recorded ({} files)",
                        m.files.len()
                    ),
                    found: if problems.is_empty() {
                        "intact".into()
                    } else {
                        summarize(&problems)
                    },
                    ok: problems.is_empty(),
                });
                d.manifest = Some(problems);
            }
            Err(e) => out.push(Check {
                field: "files (manifest)".into(),
                expected: "a readable manifest.json".into(),
                found: format!("{e:#}"),
                ok: false,
            }),
        }
    }
    d
}

/// The `recorded <field>` checks: what was measured now against what
/// `oracle.json` recorded when the oracle was built.
/// `verify --deep`: every staged source the oracle's wheel was built with
/// (its `build.json` `inputs.ext`), held by `store`, its files hashed by
/// git against the tree of the commit the wheel's key names
/// ([`ext::proof::check_staged`]): one `staged source <name>` check each.
/// A source that cannot be checked (a URL source, an entry staged before
/// commit objects were recorded) or that the store does not hold passes,
/// saying so; no rows when the wheel's record cannot be read.
fn staged_source_checks(store: &Store, rec: &OracleRecord) -> Vec<Check> {
    use crate::stages::ext::proof::{Staged, check_staged};
    let dir = store
        .entry(crate::store::Bucket::Wheels, &rec.wheel_key)
        .path;
    let Ok(build) = crate::stages::wheel::BuildRecord::read(&dir) else {
        return Vec::new();
    };
    let items = match ext::keyed_sources(build.inputs.get("ext")) {
        Ok(items) => items,
        Err(e) => {
            return vec![Check {
                field: "staged sources".into(),
                expected: "the wheel's inputs.ext".into(),
                found: first_line(&format!("{e:#}")).to_string(),
                ok: false,
            }];
        }
    };
    let mut out = Vec::new();
    for k in items {
        let expected = match &k.commit {
            Some(c) => format!("the git tree of commit {c}"),
            None => "its staged tree".to_string(),
        };
        let got = tempfile::tempdir()
            .map_err(anyhow::Error::from)
            .and_then(|t| check_staged(store, &k, &t.path().join("git")));
        let (found, ok) = match got {
            Ok(Staged::Checked { commit, tree }) => {
                (format!("git tree {tree} of commit {commit}"), true)
            }
            Ok(Staged::Unchecked(why)) => (format!("not checked: {why}"), true),
            Ok(Staged::Absent) => ("not checked: not in this store".to_string(), true),
            Err(e) => (first_line(&format!("{e:#}")).to_string(), false),
        };
        out.push(Check {
            field: format!("staged source {}", k.name),
            expected,
            found,
            ok,
        });
    }
    out
}

/// The kernel families of the oracle's wheel (`rec.wheel_key` in `store`,
/// else in the store owning `venv`), as [`BuildRecord::kernel_families`]
/// gives them; `None` when its record cannot be read.
fn wheel_families(
    store: Option<&Store>,
    rec: &OracleRecord,
    venv: &Path,
) -> Option<Vec<KernelFamily>> {
    let in_store = |s: &Store| {
        let dir = s.entry(crate::store::Bucket::Wheels, &rec.wheel_key).path;
        BuildRecord::read(&dir)
            .ok()
            .map(|b| b.kernel_families(&dir))
    };
    store.and_then(in_store).or_else(|| {
        let root = crate::store::alias::owning_root(venv)?;
        in_store(&Store::open_existing(&root)?)
    })?
}

/// One `kernel family <name>` check per family of the recipe's
/// `expect.kernel_families`: built, as the wheel's configure reported it.
fn family_checks(expected: &[String], recorded: Option<&[KernelFamily]>) -> Vec<Check> {
    expected
        .iter()
        .map(|e| {
            let unmet = families::unmet(std::slice::from_ref(e), recorded);
            let found = match unmet.first() {
                Some(u) => u.strip_prefix(&format!("{e}: ")).unwrap_or(u).to_string(),
                None => recorded
                    .unwrap_or_default()
                    .iter()
                    .filter(|f| &f.name == e && f.built)
                    .map(|f| f.describe())
                    .collect::<Vec<_>>()
                    .join("; "),
            };
            Check {
                field: format!("kernel family {e}"),
                expected: "built, as the tree's configure reported it (expect.kernel_families)"
                    .into(),
                found,
                ok: unmet.is_empty(),
            }
        })
        .collect()
}

/// One `added <name>` check per package the recipe adds (`install.with`,
/// `install.extras`): installed now at the version `oracle.json` recorded
/// (`added`) and, for `install.with`, at the pinned version. A package
/// recorded but no longer installed, or installed at another version, is a
/// mismatch; one the recipe asks for that the record lacks is checked
/// against the recipe alone. A venv that cannot be listed fails one check.
fn added_checks(venv: &Path, recipe: &Recipe, rec: Option<&OracleRecord>) -> Vec<Check> {
    use crate::stages::added::{self, Added};
    let recorded: &[Added] = rec.map_or(&[], |r| &r.added[..]);
    if recorded.is_empty() && recipe.install.is_empty() {
        return Vec::new();
    }
    let now = match added::measure(venv, recipe) {
        Ok(n) => n,
        Err(e) => {
            return vec![Check {
                field: "added packages".into(),
                expected: "the venv's installed distributions (install.with, install.extras)"
                    .into(),
                found: first_line(&format!("{e:#}")).to_string(),
                ok: false,
            }];
        }
    };
    let mut names: Vec<&str> = recorded.iter().map(|a| a.name.as_str()).collect();
    names.extend(now.iter().map(|a| a.name.as_str()));
    let mut seen = std::collections::BTreeSet::new();
    names.retain(|n| seen.insert(*n));
    names
        .into_iter()
        .map(|name| {
            let was = recorded.iter().find(|a| a.name == name);
            let is = now.iter().find(|a| a.name == name);
            let via = was.or(is).map_or("", |a| a.via.as_str());
            let want = was
                .and_then(|a| a.version.clone())
                .or_else(|| is.and_then(|a| a.pinned.clone()));
            let pinned = was.or(is).and_then(|a| a.pinned.clone());
            let found = is.and_then(|a| a.version.clone());
            let ok = found.is_some()
                && (want.is_none() || want == found)
                && (pinned.is_none() || pinned == found);
            Check {
                field: format!("added {name}"),
                expected: format!(
                    "{} installed ({via})",
                    want.as_deref().unwrap_or("any version")
                ),
                found: found.unwrap_or_else(|| "not installed".into()),
                ok,
            }
        })
        .collect()
}

fn recorded_checks(rec: &OracleRecord, id: &Identity) -> Vec<Check> {
    let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".into());
    let pairs = [
        (
            "recorded runtime_version",
            &rec.identity.runtime_version,
            &id.runtime_version,
        ),
        (
            "recorded distribution_version",
            &rec.identity.distribution_version,
            &id.distribution_version,
        ),
        (
            "recorded flashinfer_version",
            &rec.identity.flashinfer_version,
            &id.flashinfer_version,
        ),
        (
            "recorded torch_version",
            &rec.identity.torch_version,
            &id.torch_version,
        ),
    ];
    let mut out: Vec<Check> = pairs
        .into_iter()
        .map(|(field, want, got)| Check {
            field: field.into(),
            expected: show(want),
            found: show(got),
            ok: want == got,
        })
        .collect();
    out.push(Check {
        field: "recorded python_version".into(),
        expected: rec.identity.python_version.clone(),
        found: id.python_version.clone(),
        ok: rec.identity.python_version == id.python_version,
    });
    out
}

/// Measures the venv at `venv` and checks it against `recipe` (and its own
/// `oracle.json`, the manifest, RECORD and `pin_file` when given).
///
/// The tags pointing at the recipe's commit (evidence for a release-tag
/// version without `+g<sha>`) come from `oracle.json` when it was built from
/// that commit, else from `store`'s mirror of the recipe's repository.
///
/// Errors: the venv's Python cannot be run or reports garbage (exit 1). A
/// failed check is not an error: see [`Verification::ok`].
pub fn verify_venv(
    venv: &Path,
    recipe: &Recipe,
    against: &str,
    depth: Depth,
    pin_file: Option<(&Path, &PinRecord)>,
    store: Option<&Store>,
) -> Result<Verification> {
    let (record, record_error) = match OracleRecord::read(venv) {
        Ok(r) => (Some(r), None),
        Err(_) if !venv.join(ORACLE_JSON).exists() => (None, None),
        Err(e) => (None, Some(e)),
    };
    // Tags at the commit and the history's version were recorded when the
    // oracle was built; the build mode is measured with the wheel's own record.
    let mut id = oracle::measure_oracle(
        venv,
        &recipe.source.package,
        &recipe.source.commit,
        record.as_ref(),
    )?;
    if id.tags_at_commit.is_empty()
        && let Some(store) = store
    {
        let mirror = source::mirror_entry(store, &recipe.source.repo);
        if mirror.path.is_dir() {
            id.tags_at_commit = source::tags_at(&mirror.path, &recipe.source.commit);
        }
    }
    // The kernel coverage a gate recorded (what its engines loaded), else
    // every extension, marked as such.
    let kernel_coverage = record
        .as_ref()
        .and_then(|r| r.smoke.kernel_coverage.clone());
    let mut checks = identity::checks_with(
        &id,
        recipe,
        identity::KernelRule::Recorded(kernel_coverage.as_ref()),
    );
    if let Some(rec) = &record {
        checks.extend(recorded_checks(rec, &id));
    }
    checks.extend(added_checks(venv, recipe, record.as_ref()));
    let kernel_families = record
        .as_ref()
        .and_then(|rec| wheel_families(store, rec, venv));
    checks.extend(family_checks(
        &recipe.expect.kernel_families,
        kernel_families.as_deref(),
    ));
    if let Some(e) = record_error {
        // A record that is there but does not read is damage, not absence:
        // the `recorded` checks it would give cannot be silently dropped.
        checks.push(Check {
            field: "record (oracle.json)".into(),
            expected: "a readable oracle.json (the oracle's record: what the recorded checks compare with)".into(),
            found: format!("unreadable: {}", first_line(&format!("{e:#}"))),
            ok: false,
        });
    }
    let d = file_checks(venv, &recipe.source.package, depth, &mut checks);
    if depth == Depth::Deep
        && let (Some(store), Some(rec)) = (store, &record)
    {
        checks.extend(staged_source_checks(store, rec));
    }
    if let Some((_, pf)) = pin_file {
        let built = record.as_ref().map(|r| r.identity.commit.as_str());
        checks.extend(pf.checks(&id, built));
    }
    let ok = checks.iter().all(|c| c.ok);
    let warnings = record
        .as_ref()
        .map(|r| r.warnings.clone())
        .unwrap_or_default();
    let notes = record.as_ref().map(|r| r.notes.clone()).unwrap_or_default();
    Ok(Verification {
        warnings,
        notes,
        kernel_families,
        kernel_coverage,
        venv: venv.to_path_buf(),
        recipe: recipe.name.clone(),
        checked_against: against.to_string(),
        built_from: record.map(|r| r.recipe),
        identity: id,
        checks,
        deep: (depth == Depth::Deep).then_some(d),
        pin_file: pin_file.map(|(p, _)| p.to_path_buf()),
        ok,
        pin_block: None,
    })
}
