//! `oracle-build advance <FROM> <TO> [--report FILE] [--accept --alias PATH] [--pin NAME=VERSION]`
//! and `oracle-build rollback <PATH>`: a pin advance under review.
//!
//! TO is built in its own store entries (FROM is never touched: its oracle is
//! only read, and re-run under the shared smoke configuration into a scratch
//! directory), both are compared, and a Markdown report is written. Only
//! `--accept` changes anything outside the store: the alias moves to TO and
//! FROM stays rooted as `<alias root>-rollback`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use serde_json::Value;

use crate::exit::{bad_input, not_gateable};
use crate::ops::build::{BuildOptions, BuildReport, execute};
use crate::ops::{Session, print_json};
use crate::pipeline::advance::requirements::{self, Decision, PinRow};
use crate::pipeline::advance::{self, AdvanceReport, Commits, Side};
use crate::progress;
use crate::recipe::pin;
use crate::recipe::{self, LoadedRecipe};
use crate::stages::oracle::OracleRecord;
use crate::stages::smoke::{self, SmokeReport, Verdict};
use crate::stages::source;
use crate::stages::tree_requires::{self, TreeRequirements};
use crate::stages::wheel::BuildRecord;
use crate::store::alias;
use crate::store::{Bucket, Store, TempRoots, write_atomic};

/// Options of `advance`.
#[derive(Debug, Clone, Default)]
pub struct AdvanceOptions {
    /// FROM: a PIN.
    pub from: String,
    /// TO: a commit (full or a prefix in FROM's mirror) or a PIN.
    pub to: String,
    /// `--report FILE` (default `<root>/reports/advance-<from>-<to>.md`).
    pub report: Option<PathBuf>,
    /// `--accept`: move the alias to TO when TO is gateable and verified.
    pub accept: bool,
    /// `--alias PATH` (required with `--accept`, and only valid with it).
    pub alias: Option<PathBuf>,
    /// `--pin NAME=VERSION` overrides for a candidate recipe.
    pub pins: Vec<String>,
    /// `--offline`.
    pub offline: bool,
    /// `--accept-drift CASE` (repeatable): a drifted case whose TO golden is
    /// recorded anyway, with the `--reason` of the same position.
    pub accept_drift: Vec<String>,
    /// `--reason TEXT`, one per `--accept-drift`, in the same order.
    pub reasons: Vec<String>,
    /// `--plan`: write only the tree-level sections (commits, recipe
    /// delta, pin table, requirement delta); build nothing.
    pub plan: bool,
}

/// The reviewer's `--accept-drift CASE --reason TEXT` pairs, checked before
/// anything is built.
///
/// Errors (exit 2): `--accept-drift` or `--reason` without `--accept`; a
/// different count of the two; an empty reason.
fn accepted_drift(opts: &AdvanceOptions) -> Result<Vec<advance::goldens::AcceptedDrift>> {
    if !opts.accept && (!opts.accept_drift.is_empty() || !opts.reasons.is_empty()) {
        return Err(bad_input(
            "--accept-drift and --reason go with --accept (they say which drift the recorded goldens accept)",
        ));
    }
    if opts.accept_drift.len() != opts.reasons.len() {
        return Err(bad_input(format!(
            "each --accept-drift CASE needs its --reason TEXT: got {} --accept-drift ({}) and {} --reason",
            opts.accept_drift.len(),
            opts.accept_drift.join(", "),
            opts.reasons.len()
        )));
    }
    opts.accept_drift
        .iter()
        .zip(&opts.reasons)
        .map(|(case, reason)| {
            if reason.trim().is_empty() {
                return Err(bad_input(format!(
                    "--accept-drift {case}: --reason is empty"
                )));
            }
            Ok(advance::goldens::AcceptedDrift {
                case: case.clone(),
                reason: reason.clone(),
            })
        })
        .collect()
}

/// The `--pin NAME=VERSION` arguments as (name, version).
///
/// Errors (exit 2), before anything is fetched: one is not `NAME=VERSION`,
/// its name is not a distribution name or its version not one exact PEP 440
/// version (the rules of a recipe's `pins`).
fn reviewer_pins(pins: &[String]) -> Result<Vec<(String, String)>> {
    pins.iter()
        .map(|p| {
            let (n, v) = p
                .split_once('=')
                .map(|(n, v)| (n.trim(), v.trim().trim_start_matches('=')))
                .filter(|(n, v)| !n.is_empty() && !v.is_empty())
                .ok_or_else(|| bad_input(format!("--pin {p:?}: expected NAME=VERSION")))?;
            if !recipe::is_distribution_name(n) {
                return Err(bad_input(format!(
                    "--pin {p:?}: {n:?} is not a distribution name (letters, digits, `.`, `_`, `-`)"
                )));
            }
            if !recipe::is_exact_version(v) {
                return Err(bad_input(format!(
                    "--pin {p:?}: {v:?} is not an exact version; a pin is one PEP 440 version such as 2.13.0 or 0.6.15.post1 (no operators, commas, spaces or markers)"
                )));
            }
            Ok((n.to_string(), v.to_string()))
        })
        .collect()
}

/// Every golden file of `lr`'s cases: where each is found and the files
/// recording would write (`<case>.json` in each of `dirs`).
fn golden_files(lr: &LoadedRecipe, dirs: &[PathBuf]) -> Vec<PathBuf> {
    lr.recipe
        .smoke
        .cases
        .iter()
        .flat_map(|c| {
            std::iter::once(smoke::golden::locate(lr, dirs, c).path)
                .chain(dirs.iter().map(|d| d.join(format!("{}.json", c.name))))
        })
        .collect()
}

/// The requirements of `lr`'s tree at its commit, for its target device,
/// read from the store's mirror of its repository (fetched first when the
/// mirror lacks the commit).
///
/// Errors: the commit cannot be fetched or read.
fn tree_of(store: &Store, lr: &LoadedRecipe, offline: bool) -> Result<TreeRequirements> {
    let r = &lr.recipe;
    let device = &r.build.target_device;
    let mirror = source::mirror_entry(store, &r.source.repo);
    match tree_requires::read_at(&mirror.path, &r.source.commit, device) {
        Ok(t) => Ok(t),
        Err(_) => {
            let m = source::ensure_mirror(store, &r.source.repo, &r.source.commit, offline)?;
            tree_requires::read_at(&m.path, &r.source.commit, device)
        }
    }
}

/// Resolves TO: a hex commit found in FROM's mirror gives a candidate recipe
/// (written next to FROM's recipe file, or in `./recipes/` for a built-in
/// FROM); anything else is a PIN. A full commit id the branches and tags do
/// not bring, and no PIN names (a recipe found by its commit), is fetched
/// as a build fetches its pin (an unmerged pull request's): the
/// pull-request refs, then the commit by id; the report flags it.
///
/// Errors (exit 2): a full commit id neither a PIN nor the repository has.
fn resolve_to(
    store: &Store,
    from: &LoadedRecipe,
    opts: &AdvanceOptions,
) -> Result<(LoadedRecipe, Option<PathBuf>, Option<Vec<PinRow>>)> {
    let to = opts.to.as_str();
    let is_hex = (7..=40).contains(&to.len()) && to.chars().all(|c| c.is_ascii_hexdigit());
    if is_hex {
        let repo = &from.recipe.source.repo;
        let mirror = source::update_mirror(store, repo, opts.offline)?;
        let mut found = source::resolve_commit(&mirror.path, to);
        // A full id not in the mirror: a PIN first (a recipe found by its
        // commit; not with --pin, which asks for a candidate), then the
        // commit fetched by id.
        if found.is_err() && to.len() == 40 && !opts.offline {
            if opts.pins.is_empty()
                && let Ok(lr) = pin::resolve(to)
            {
                return Ok((lr, None, None));
            }
            let full = to.to_ascii_lowercase();
            source::ensure_mirror_fetched(store, repo, &full, false)?;
            found = source::resolve_commit(&mirror.path, &full);
        }
        if let Ok(commit) = found {
            // TO's stack from TO's tree: each of FROM's pins decided against it.
            let tree =
                tree_requires::read_at(&mirror.path, &commit, &from.recipe.build.target_device)?;
            let reviewer = reviewer_pins(&opts.pins)?;
            let (rows, pins) = requirements::decide(&from.recipe.pins, &reviewer, &tree, None);
            for r in rows.iter().filter(|r| r.decision == Decision::NotCarried) {
                progress::stage(
                    "advance",
                    format!("pin {}: not carried: {}", r.package, r.why),
                );
            }
            let (lr, path) = candidate_recipe(from, &commit, pins, &rows)?;
            return Ok((lr, Some(path), Some(rows)));
        }
    }
    if !opts.pins.is_empty() {
        return Err(bad_input(
            "--pin applies only when TO is a commit (it derives a candidate recipe)",
        ));
    }
    Ok((pin::resolve(to)?, None, None))
}

/// Writes `<name>.yaml` next to FROM's recipe file (any directory; for a
/// built-in FROM, into `./recipes/`): FROM's recipe at `commit` with the
/// decided `pins` ([`requirements::decide`]; `rows` say why, in the
/// file's header), without FROM's `expect` block and golden paths (they
/// describe FROM's oracle). Returns it loaded and its path.
///
/// Errors (exit 2): a different recipe already at that path.
fn candidate_recipe(
    from: &LoadedRecipe,
    commit: &str,
    pins: std::collections::BTreeMap<String, String>,
    rows: &[PinRow],
) -> Result<(LoadedRecipe, PathBuf)> {
    let mut r = from.recipe.clone();
    let base = match r.name.rsplit_once('-') {
        Some((head, tail)) if tail.len() >= 7 && tail.chars().all(|c| c.is_ascii_hexdigit()) => {
            head.to_string()
        }
        _ => r.name.clone(),
    };
    r.name = format!("{base}-{}", &commit[..9]);
    r.source.commit = commit.to_string();
    r.expect = Default::default();
    for case in &mut r.smoke.cases {
        case.golden = None;
    }
    r.pins = pins;
    let dir = match &from.dir {
        Some(d) if d.as_os_str().is_empty() => PathBuf::from("."),
        Some(d) => d.clone(),
        None => PathBuf::from("recipes"),
    };
    fs_err::create_dir_all(&dir)?;
    let path = dir.join(format!("{}.yaml", r.name));
    let why: String = rows
        .iter()
        .map(|p| {
            format!(
                "#   {}: {} ({})\n",
                p.package,
                p.decision.as_str(),
                p.why.replace('\n', " ")
            )
        })
        .collect();
    let text = format!(
        "# Candidate recipe written by `oracle-build advance {} {}`:\n# {} with the commit advanced; its pins, per package:\n{}{}",
        from.recipe.name,
        commit,
        from.recipe.name,
        if why.is_empty() {
            "#   (none)\n".to_string()
        } else {
            why
        },
        serde_saphyr::to_string(&r).context("writing the candidate recipe")?
    );
    let parsed = recipe::parse(&text, &path.display().to_string())?;
    if parsed != r {
        return Err(anyhow!(
            "the candidate recipe does not read back as written ({})",
            path.display()
        ));
    }
    if path.exists() {
        let existing = recipe::load_file(&path)?;
        if existing.recipe != r {
            return Err(bad_input(format!(
                "{} exists and differs from the candidate for {commit}; move it away or pass it as TO",
                path.display()
            )));
        }
    } else {
        write_atomic(&path, text.as_bytes())?;
        progress::stage(
            "advance",
            format!("wrote candidate recipe {}", path.display()),
        );
    }
    Ok((recipe::load_file(&path)?, path))
}

fn side(store: &Store, lr: &LoadedRecipe, oracle: &Path, smoke: &SmokeReport) -> Result<Side> {
    let rec = OracleRecord::read(oracle)?;
    let wheel_dir = store.entry(Bucket::Wheels, &rec.wheel_key).path;
    let build = BuildRecord::read(&wheel_dir).ok();
    let build_seconds = build.as_ref().map(|b| b.duration_s);
    let kernel_families = build.as_ref().and_then(|b| b.kernel_families(&wheel_dir));
    let compiler_cache_stats = build.and_then(|b| b.compiler_cache_stats);
    Ok(Side {
        recipe: lr.recipe.name.clone(),
        origin: lr.origin.clone(),
        commit: lr.recipe.source.commit.clone(),
        repo: lr.recipe.source.repo.clone(),
        oracle: oracle.to_path_buf(),
        build_mode: rec.identity.build_mode.clone(),
        identity: rec.identity,
        wheel_sha256: rec.wheel_sha256,
        build_seconds,
        compiler_cache_stats,
        kernel_families,
        verdict: smoke.verdict.as_str().to_string(),
        reasons: smoke.reasons.clone(),
    })
}

/// Builds the recipe file `lr_path` in session `s`'s store (its lock from
/// beside the recipe: `--lockfiles` is not applied to either side).
fn build(s: &Session, lr_path: &str, opts: &AdvanceOptions) -> Result<BuildReport> {
    let beside = Session {
        lockfiles: None,
        ..s.clone()
    };
    execute(
        &beside,
        &BuildOptions {
            pin: lr_path.to_string(),
            offline: opts.offline,
            ..Default::default()
        },
    )
}

fn commits(
    store: &Store,
    from: &LoadedRecipe,
    to: &LoadedRecipe,
    offline: bool,
) -> Result<Commits> {
    let (f, t) = (&from.recipe.source.commit, &to.recipe.source.commit);
    let upstream = source::update_mirror(store, &from.recipe.source.repo, offline)?;
    let same_repo = source::mirror_entry(store, &to.recipe.source.repo) == upstream;
    let counts = source::range(&upstream.path, f, t).ok();
    let upstream_refs = source::refs_containing(&upstream.path, t);
    let flag = match &upstream_refs {
        None => Some(format!(
            "TO {t} is not in the upstream repository {} at all{}: it exists only on a fork",
            from.recipe.source.repo,
            if same_repo {
                String::new()
            } else {
                format!(" (it comes from {})", to.recipe.source.repo)
            }
        )),
        Some(refs) if refs.is_empty() => Some(format!(
            "TO {t} is in {} but on no branch or tag (an unmerged pull request or a fork's push)",
            from.recipe.source.repo
        )),
        Some(_) => None,
    };
    Ok(Commits {
        range: format!("{}..{}", &f[..12], &t[..12]),
        counts,
        upstream: from.recipe.source.repo.clone(),
        upstream_refs,
        flag,
    })
}

/// Runs `advance`: builds TO (and FROM when it has no oracle yet), gates both
/// under TO's smoke configuration, writes the report, and with `--accept`
/// moves the alias.
///
/// With `--accept`, TO's goldens are recorded (into TO's goldens location,
/// never FROM's) before the alias moves, each with the campaign's record.
///
/// Errors: exit 2 for bad input (`--accept` without `--alias`, `--alias`
/// without `--accept`, a bad `--pin`, `--accept-drift` without its
/// `--reason` or naming no case of TO, TO's goldens located on FROM's),
/// before anything is built or written; exit 3 when TO fails its identity
/// checks; exit 4 when `--accept` and TO is not gateable, or a case drifted
/// that no `--accept-drift` names; exit 2 after the comparison when an
/// `--accept-drift` case did not drift (in each refusal no golden is
/// recorded and the alias is unchanged).
pub fn run(s: &Session, opts: &AdvanceOptions) -> Result<()> {
    if opts.accept && opts.alias.is_none() {
        return Err(bad_input(
            "--accept needs --alias PATH (the alias to move to TO)",
        ));
    }
    if let (false, Some(a)) = (opts.accept, &opts.alias) {
        return Err(bad_input(format!(
            "--alias {} does nothing without --accept: add --accept to move the alias to TO once TO is gateable and verified (or leave --alias out to only review)",
            a.display()
        )));
    }
    let accepted_drift = accepted_drift(opts)?;
    if opts.plan && opts.accept {
        return Err(bad_input(
            "--plan builds nothing, so there is nothing to --accept: leave one out",
        ));
    }
    reviewer_pins(&opts.pins)?;
    let from = s.recipe(&opts.from)?;
    let store = s.store()?;
    store.init()?;
    let (to, candidate, rows) = resolve_to(&store, &from, opts)?;
    // TO's gate files, as FROM's were when it was opened.
    recipe::check_files(&to)?;
    if to.recipe.name == from.recipe.name {
        return Err(bad_input(format!(
            "FROM and TO are the same recipe ({})",
            from.recipe.name
        )));
    }
    if let Some(a) = accepted_drift
        .iter()
        .find(|a| !to.recipe.smoke.cases.iter().any(|c| c.name == a.case))
    {
        return Err(bad_input(format!(
            "--accept-drift {}: TO ({}) has no such case (its cases: {})",
            a.case,
            to.recipe.name,
            to.recipe
                .smoke
                .cases
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    // TO's goldens are recorded in TO's goldens location; FROM's are never
    // written, so `rollback` brings FROM back with its goldens in force.
    let to_goldens = smoke::golden::dirs(store.root(), &to);
    if opts.accept {
        let clash = advance::goldens::overlap(
            &golden_files(&from, &smoke::golden::dirs(store.root(), &from)),
            &golden_files(&to, &to_goldens),
        );
        if !clash.is_empty() {
            return Err(bad_input(format!(
                "--accept would record TO's goldens over FROM's ({}): give TO's cases their own `golden:` paths",
                clash
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    // The trees' own requirements: the pin table (a PIN TO: its own pins
    // against its tree) and the requirement delta, before anything is built.
    let (from_tree, to_tree) = (
        tree_of(&store, &from, opts.offline),
        tree_of(&store, &to, opts.offline),
    );
    let pin_rows = match (rows, &to_tree) {
        (Some(rows), _) => rows,
        (None, Ok(t)) => requirements::decide(&from.recipe.pins, &[], t, Some(&to.recipe.pins)).0,
        (None, Err(_)) => Vec::new(),
    };
    let (requirement_delta, not_read) = match (&from_tree, &to_tree) {
        (Ok(f), Ok(t)) => (Some(requirements::delta(f, t)), None),
        (Err(e), _) => (None, Some(format!("FROM's tree: {e:#}"))),
        (_, Err(e)) => (None, Some(format!("TO's tree: {e:#}"))),
    };
    if opts.plan {
        let plan = advance::plan::AdvancePlan {
            plan_only: true,
            from_recipe: from.recipe.name.clone(),
            from_origin: from.origin.clone(),
            from_commit: from.recipe.source.commit.clone(),
            to_recipe: to.recipe.name.clone(),
            to_origin: to.origin.clone(),
            to_commit: to.recipe.source.commit.clone(),
            candidate_recipe: candidate,
            commits: commits(&store, &from, &to, opts.offline)?,
            recipe_delta: advance::compare::recipe_delta(&from.recipe, &to.recipe),
            pins: pin_rows,
            requirements: requirement_delta,
            requirements_not_read: not_read,
        };
        let text = advance::plan::markdown(&plan);
        let file = opts.report.clone().unwrap_or_else(|| {
            store.reports_dir().join(format!(
                "advance-plan-{}-{}.md",
                from.recipe.name, to.recipe.name
            ))
        });
        return write_report(s, &file, &text, serde_json::to_value(&plan)?);
    }

    // FROM: its oracle as built (never rebuilt or re-gated); built only if absent.
    let from_oracle = match crate::ops::activate::oracle_entry(&store, &from) {
        Ok(e) => e.path,
        Err(_) => build(s, &from.origin, opts)?.oracle,
    };
    // FROM's oracle, and TO's once built, are temporary GC roots until the
    // report is written: a `gc` meanwhile (after `unkeep`) keeps them, what
    // they require and their engine caches, as a running build's entries.
    let held = store.temp_roots()?;
    hold(&store, &held, &from_oracle, &from)?;
    // The compile cost, said before TO is built.
    let compile_cost = advance::compile_cost(&store, &from, &to);
    if let Some(c) = &compile_cost {
        progress::stage("advance", format!("compile cost: {}", c.summary));
    }
    progress::stage(
        "advance",
        format!("building TO ({}) in its own entries", to.recipe.name),
    );
    let to_report = build(s, &to.origin, opts)?;
    let to_oracle = to_report.oracle.clone();
    hold(&store, &held, &to_oracle, &to)?;
    let to_record = OracleRecord::read(&to_oracle)?;

    // FROM under TO's smoke configuration, into scratch: FROM's record is not written.
    progress::stage("advance", "gating FROM under the same smoke configuration");
    let mut shared = from.clone();
    shared.recipe.smoke = to.recipe.smoke.clone();
    for case in &mut shared.recipe.smoke.cases {
        case.golden = None;
    }
    let scratch = store.stage("advance")?;
    let no_goldens = scratch.path().join("no-goldens");
    let from_smoke = smoke::run(
        &from_oracle,
        &shared,
        &scratch.path().join("smoke"),
        &smoke::Options {
            goldens_dirs: vec![no_goldens],
            only: None,
            record: None,
            tmp_root: Some(store.tmp_dir()),
            model_hashes: Some(store.model_hashes_dir()),
            engine_cache: None,
        },
    )?;
    let mut to_smoke = to_record.smoke.clone();

    let from_side = side(&store, &from, &from_oracle, &from_smoke)?;
    let to_side = side(&store, &to, &to_oracle, &to_record.smoke)?;
    let mut report = AdvanceReport {
        commits: commits(&store, &from, &to, opts.offline)?,
        recipe_delta: advance::compare::recipe_delta(&from.recipe, &to.recipe),
        package_delta: advance::compare::package_delta(
            &advance::compare::installed(&from_oracle),
            &advance::compare::installed(&to_oracle),
        ),
        compile_cost,
        pins: pin_rows,
        requirements: requirement_delta,
        identity: advance::compare::identity_delta(&from_side.identity, &to_side.identity),
        kernel_families: advance::compare::family_delta(
            from_side.kernel_families.as_deref(),
            to_side.kernel_families.as_deref(),
        ),
        cases: advance::compare::compare_cases(
            &from_smoke,
            &to_record.smoke,
            to.recipe.smoke.near_tie_nats,
        ),
        does_not_establish: Vec::new(),
        accepted: None,
        deltas: advance::deltas::gather(&store, &from, &to),
        goldens: None,
        candidate_recipe: candidate,
        from: from_side,
        to: to_side,
    };
    report.does_not_establish = advance::report::does_not_establish(&report);

    let mut refused = None;
    if opts.accept {
        let path = opts.alias.as_deref().unwrap_or(Path::new(""));
        if to_record.smoke.verdict != Verdict::Gateable {
            refused = Some(not_gateable(format!(
                "refusing to accept: TO ({}) is {} ({}); the alias {} is unchanged",
                to.recipe.name,
                to_record.smoke.verdict.as_str(),
                to_record.smoke.reasons.join("; "),
                path.display()
            )));
        } else if let Err(r) = advance::goldens::check(&report.cases, &accepted_drift) {
            refused = Some(match r {
                advance::goldens::Refusal::NotDrifted(cases) => bad_input(format!(
                    "--accept-drift names case(s) that did not drift: {}; no golden was recorded and the alias {} is unchanged",
                    cases.join(", "),
                    path.display()
                )),
                advance::goldens::Refusal::Unaccepted(lines) => not_gateable(format!(
                    "refusing to accept: TO drifted from FROM and no --accept-drift names it:\n  {}\nno golden was recorded and the alias {} is unchanged. Once reviewed, rerun with `--accept-drift CASE --reason TEXT` for each case.",
                    lines.join("\n  "),
                    path.display()
                )),
            });
        } else {
            // TO's goldens, from the gate compared above, with the campaign's record.
            let mut record = smoke::Record {
                oracle: crate::ops::smoke::oracle_identity(&to_record, &to_oracle),
                force: true,
                ..Default::default()
            };
            for case in &to.recipe.smoke.cases {
                let reason = accepted_drift
                    .iter()
                    .find(|a| a.case == case.name)
                    .map(|a| a.reason.as_str());
                record.advance.insert(
                    case.name.clone(),
                    advance::goldens::record(
                        &case.name,
                        &report.cases,
                        (&from.recipe.name, &from.recipe.source.commit),
                        (&to.recipe.name, &to.recipe.source.commit),
                        reason,
                    ),
                );
            }
            let written = smoke::record_report(
                &to,
                &mut to_smoke,
                &smoke::Options {
                    goldens_dirs: to_goldens.clone(),
                    only: None,
                    record: Some(record),
                    tmp_root: None,
                    model_hashes: None,
                    engine_cache: None,
                },
            )?;
            report.goldens = Some(advance::goldens::Campaign {
                recorded: written
                    .into_iter()
                    .map(|(case, path)| advance::goldens::RecordedGolden { case, path })
                    .collect(),
                accepted_drift: accepted_drift.clone(),
            });
            let to_entry = alias::entry_at(&store, &to_oracle)
                .ok_or_else(|| anyhow!("TO's oracle is not a store entry"))?;
            let a = crate::ops::activate::activate(&store, &to, &to_entry, path)?;
            // FROM is the rollback, whatever the alias pointed at before.
            if let Some(from_entry) = alias::entry_at(&store, &from_oracle) {
                store.set_root(&alias::rollback_root_name(&a.root), &from_entry)?;
            }
            report.accepted = Some(serde_json::to_value(&a)?);
        }
    }

    let text = advance::report::markdown(&report);
    let file = opts.report.clone().unwrap_or_else(|| {
        store.reports_dir().join(format!(
            "advance-{}-{}.md",
            from.recipe.name, to.recipe.name
        ))
    });
    write_report(s, &file, &text, serde_json::to_value(&report)?)?;
    match refused {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Adds the oracle at `venv` (of recipe `lr`) to the temporary GC roots
/// `held`, and checks it is still there (a `gc` may have taken it after
/// `unkeep`, before it was added).
///
/// Errors: the roots cannot be written; the oracle is gone.
fn hold(store: &Store, held: &TempRoots, venv: &Path, lr: &LoadedRecipe) -> Result<()> {
    let Some(entry) = alias::entry_at(store, venv) else {
        return Err(anyhow!(
            "the oracle {} of {} is not in the store {} (removed by `gc`?); build it again",
            venv.display(),
            lr.recipe.name,
            store.root().display()
        ));
    };
    held.add(store, &entry)?;
    if !entry.exists() {
        return Err(anyhow!(
            "the oracle {} of {} was removed (by `gc`?) while `advance` ran; build it again",
            entry.path.display(),
            lr.recipe.name
        ));
    }
    Ok(())
}

/// Writes the Markdown `text` to `file` (atomically, its directory
/// created) and prints it, or with `--json` prints `json` with
/// `report_file` added.
fn write_report(s: &Session, file: &Path, text: &str, mut json: Value) -> Result<()> {
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs_err::create_dir_all(dir)?;
    }
    write_atomic(file, text.as_bytes())?;
    if s.json {
        json["report_file"] = Value::from(file.display().to_string());
        print_json(&json)?;
    } else {
        print!("{text}");
        println!("\n(report written to {})", file.display());
    }
    Ok(())
}

/// `rollback <PATH>`: points the alias back at its `-rollback` oracle, and
/// keeps the oracle it leaves as the new rollback (so rollback twice is a no-op).
///
/// Errors: PATH is not a registered alias, or it has no rollback root.
pub fn rollback(s: &Session, path: &Path) -> Result<()> {
    let root = s.root()?;
    let store =
        Store::open_existing(&root).ok_or_else(|| anyhow!("no store at {}", root.display()))?;
    let registry = alias::Registry::load(&store)?;
    let a = registry.get(path).cloned().ok_or_else(|| {
        bad_input(format!(
            "{} is not an alias registered in {}",
            path.display(),
            root.display()
        ))
    })?;
    let back_root = alias::rollback_root_name(&a.root);
    let back = alias::entry_at(&store, &store.roots_dir().join(&back_root)).ok_or_else(|| {
        anyhow!(
            "{} has no rollback oracle (roots/{back_root} is missing or dangling)",
            path.display()
        )
    })?;
    let rec = OracleRecord::read(&back.path)?;
    let lr = LoadedRecipe {
        recipe: recipe::parse(&rec.recipe_text, &rec.recipe_origin)?,
        origin: rec.recipe_origin.clone(),
        dir: Path::new(&rec.recipe_origin)
            .parent()
            .map(Path::to_path_buf),
        text: rec.recipe_text.clone(),
    };
    let switched = alias::point(&store, path, &back, &lr, false)?;
    if s.json {
        return print_json(&switched);
    }
    println!(
        "{} -> {} ({} @ {})",
        switched.alias.path.display(),
        back.path.display(),
        lr.recipe.name,
        lr.recipe.source.commit
    );
    if let Some(r) = &switched.rollback_root {
        println!("the oracle it left is kept as roots/{r}");
    }
    Ok(())
}
