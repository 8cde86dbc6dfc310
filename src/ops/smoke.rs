//! `oracle-build smoke <PIN> [--case NAME] [--record-golden]`: gate an oracle now.
//!
//! Finds the oracle through its root `<store>/roots/<recipe name>`, runs the
//! smoke stage with the recipe as it is now (probe, `runs` greedy batch-1
//! generations per case, golden comparison), prints the report, and replaces
//! the oracle's `oracle.json` with the new verdict (atomically). Exit 0 when
//! gateable, 4 when not.
//!
//! `--record-golden` writes each clean case's output as its JSON golden (see
//! [`crate::stages::smoke::golden`] for where) and then gates against it, so
//! `smoke --record-golden` followed by `smoke` passes on the same oracle. It
//! refuses (exit 2, writing nothing) to replace a golden the new output
//! disagrees with, unless `--force` is given.
//! `--case NAME` runs one case and leaves `oracle.json` as it was: the gate's
//! record needs every case.
//! The engine's caches are the oracle's warm ones
//! (`<store>/engine-cache/<venv key>-<device>`); `--cold` empties them
//! first, so the run starts cold and leaves them warm for the next.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use serde::Serialize;
use serde_json::{Value, json};

use crate::exit::{bad_input, mismatch, not_gateable};
use crate::ops::{Session, print_json};
use crate::recipe::{LoadedRecipe, Mode};
use crate::stages::oracle::{self, OracleRecord};
use crate::stages::smoke::model::ModelCheck;
use crate::stages::smoke::{self, CaseResult, GoldenState, SmokeReport, Verdict, golden};
use crate::store::{Bucket, Entry, Manifest, Store, TempRoots};

/// Arguments of `smoke`.
#[derive(Debug, Clone)]
pub struct SmokeArgs {
    /// The PIN.
    pub pin: String,
    /// `--case NAME`.
    pub case: Option<String>,
    /// `--record-golden`.
    pub record_golden: bool,
    /// `--force`: with `--record-golden`, replace goldens the output disagrees with.
    pub force: bool,
    /// `--cold`: empty the oracle's kept engine caches before the run.
    pub cold: bool,
}

/// What `smoke` reports (`--json` prints it whole).
#[derive(Debug, Serialize)]
pub struct SmokeOutput {
    /// The oracle venv gated.
    pub oracle: PathBuf,
    /// Recipe name.
    pub recipe: String,
    /// The pinned commit.
    pub commit: String,
    /// `<package>.__version__` as recorded.
    pub runtime_version: Option<String>,
    /// Whether `oracle.json` was updated with this verdict (not with
    /// `--case`, nor when the gate could not run on this box).
    pub recorded: bool,
    /// The verdict `oracle.json` keeps when the gate could not run on this
    /// box (an unset variable, a missing model): it stands.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stands: Option<Verdict>,
    /// Per case, the engine arguments the recipe sets (shown first in text).
    #[serde(skip)]
    pub requested: std::collections::BTreeMap<String, Vec<String>>,
    /// The smoke run.
    pub smoke: SmokeReport,
}

/// The identity stamped into recorded goldens.
pub(crate) fn oracle_identity(rec: &OracleRecord, venv: &Path) -> Value {
    let id = &rec.identity;
    json!({
        "recipe": rec.recipe,
        "commit": id.commit,
        "runtime_version": id.runtime_version,
        "distribution_version": id.distribution_version,
        "flashinfer_version": id.flashinfer_version,
        "torch_version": id.torch_version,
        "torch_cuda": id.torch_cuda,
        "python_version": id.python_version,
        "build_mode": id.build_mode,
        "venv_key": rec.key,
        "wheel_sha256": rec.wheel_sha256,
        "venv": venv,
    })
}

/// Refuses, before anything runs, what cannot work: an unknown `--case`,
/// and `--record-golden` onto a numpy golden or into the read-only store.
fn check_args(args: &SmokeArgs, lr: &LoadedRecipe, root: &Path) -> Result<()> {
    let cases = &lr.recipe.smoke.cases;
    if let Some(name) = &args.case {
        crate::ops::case_named(lr, name)?;
    }
    if args.record_golden {
        // Recorded goldens go to the first directory (beside the recipe).
        let dir = golden::dirs(root, lr)
            .into_iter()
            .next()
            .unwrap_or_else(|| golden::default_dir(root, &lr.recipe.name));
        let store_dir = std::path::absolute(root.join("store")).unwrap_or(root.join("store"));
        for c in cases
            .iter()
            .filter(|c| args.case.as_deref().is_none_or(|n| n == c.name))
        {
            let loc = golden::location(lr, &dir, c);
            if loc.kind == golden::Kind::Npy {
                return Err(bad_input(format!(
                    "case {}: golden {} is a numpy golden; --record-golden writes JSON goldens only (point `golden:` at a .json path, or remove it to use {})",
                    c.name,
                    loc.path.display(),
                    dir.join(format!("{}.json", c.name)).display()
                )));
            }
            let abs = std::path::absolute(&loc.path).unwrap_or(loc.path.clone());
            if abs.starts_with(&store_dir) {
                return Err(bad_input(format!(
                    "case {}: golden {} lies inside the store's read-only entries; choose a path outside {}",
                    c.name,
                    loc.path.display(),
                    store_dir.display()
                )));
            }
        }
    }
    Ok(())
}

/// Registers the oracle `entry` as a temporary GC root of this process
/// ([`Store::temp_roots`]) and checks it is still there, so no `gc` deletes
/// it (nor, through its record's `requires`, its wheel, lock and wheelhouse,
/// nor its engine cache) while it is gated, as a running build's entries
/// are kept. A read-only store registers nothing (no `gc` can run there).
///
/// Errors: the temporary roots cannot be written; a `gc` removed the entry
/// before it was registered (build it again).
pub(crate) fn hold_oracle(store: &Store, entry: &Entry, lr: &LoadedRecipe) -> Result<TempRoots> {
    let temp = store.temp_roots()?;
    temp.add(store, entry)?;
    if !entry.exists() {
        return Err(anyhow!(
            "the oracle {} was removed (by `gc`?) before it could be gated; build it again: `{}`",
            entry.path.display(),
            crate::shell::command_at(
                &format!("build {}", crate::recipe::shell_arg(lr)),
                store.root()
            )
        ));
    }
    Ok(temp)
}

/// Runs `smoke`: gates the oracle of `args.pin` in the store at `store_arg`.
///
/// Errors: exit 2 for an unknown PIN or case, `--record-golden` onto a
/// numpy golden, or `--record-golden` without `--force` onto a golden the
/// new output disagrees with (after the run; nothing is written); exit 1 when the store has no oracle of the recipe (build it
/// first) or the oracle is damaged; exit 3 when the oracle under the root was
/// built from another commit or package than the recipe pins; exit 4 when the
/// run is not gateable (after printing the report).
pub fn run(s: &Session, args: &SmokeArgs) -> Result<()> {
    let lr = s.recipe(&args.pin)?;
    let r = &lr.recipe;
    let root = s.root()?;
    check_args(args, &lr, &root)?;
    let store = Store::at(&root)?;
    let link = store.roots_dir().join(&r.name);
    if !link.exists() {
        return Err(anyhow!(
            "no oracle of {} in {} (build it first: `{}`)",
            r.name,
            store.root().display(),
            crate::shell::command_at(&format!("build {}", crate::recipe::shell_arg(&lr)), &root)
        ));
    }
    let venv = link
        .canonicalize()
        .with_context(|| format!("resolving {}", link.display()))?;
    // The oracle is a temporary GC root while it is gated, as a running
    // build's entries are: a `gc` now (after `unkeep`) keeps its venv
    // entry, what that requires and its engine cache.
    let name = venv.file_name().map(|n| n.to_string_lossy().into_owned());
    let entry = store.entry(Bucket::Venvs, name.as_deref().unwrap_or_default());
    let _temp = hold_oracle(&store, &entry, &lr)?;
    oracle::check_owner(&lr, &venv)?;
    let mut rec = OracleRecord::read(&venv)?;
    let package_differs = rec
        .inputs
        .get("package")
        .is_some_and(|p| *p != json!(r.source.package));
    if rec.identity.commit != r.source.commit || package_differs {
        return Err(mismatch(format!(
            "the oracle at {} ({}) was built from {} {}, but recipe {} pins {} {}; build it first (`{}`)",
            link.display(),
            venv.display(),
            rec.inputs["package"].as_str().unwrap_or("?"),
            rec.identity.commit,
            r.name,
            r.source.package,
            r.source.commit,
            crate::shell::command_at(&format!("build {}", crate::recipe::shell_arg(&lr)), &root)
        )));
    }
    let problems = Manifest::read(&venv)
        .with_context(|| format!("{} has no readable manifest", venv.display()))?
        .check(&venv, false);
    if !problems.is_empty() {
        return Err(anyhow!(
            "oracle venv {} is damaged ({}); rebuild it: `{}` hashes every file, moves the entry aside and rebuilds it",
            venv.display(),
            problems
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join("; "),
            crate::shell::command_at(
                &format!("build {} --deep", crate::recipe::shell_arg(&lr)),
                &root
            )
        ));
    }
    store.refuse_read_only(
        "record the gate in the oracle's oracle.json (run `oracle-build smoke` where the store is writable; `oracle-build verify` checks the oracle read-only)",
    )?;
    let _lock = store.entry(Bucket::Venvs, &rec.key).lock()?;
    let mut opts = smoke::Options::new(&store, &lr).with_engine_cache(&store, &rec.key, args.cold);
    opts.only = args.case.clone();
    if args.record_golden {
        opts.record = Some(smoke::Record {
            oracle: oracle_identity(&rec, &venv),
            force: args.force,
            ..Default::default()
        });
    }
    let report = oracle::gate_with(&store, &venv, &lr, &opts)?;
    // A gate that could not run here leaves the recorded verdict in force.
    let recorded = args.case.is_none() && oracle::settle_gate(&mut rec, report.clone(), "smoke");
    if args.case.is_none() {
        oracle::write_record(&venv, &rec)?;
    }
    let out = SmokeOutput {
        oracle: venv,
        recipe: r.name.clone(),
        commit: r.source.commit.clone(),
        runtime_version: rec.identity.runtime_version.clone(),
        recorded,
        stands: (args.case.is_none() && !recorded).then_some(rec.smoke.verdict),
        requested: r
            .smoke
            .cases
            .iter()
            .map(|c| {
                // What the driver passed (`mode: eager` adds enforce_eager),
                // and enforce_eager always: the line shows the mode's effect.
                let mut keys: Vec<String> = c.driver_engine_args().keys().cloned().collect();
                keys.extend(["revision".into(), "enforce_eager".into()]);
                (c.name.clone(), keys)
            })
            .collect(),
        smoke: report,
    };
    if s.json {
        print_json(&out)?;
    } else {
        print!("{}", render(&out));
    }
    let instrument = out.smoke.instrument_failures();
    if out.smoke.verdict == Verdict::Gateable {
        Ok(())
    } else if !instrument.is_empty() {
        // The gate could not measure: exit 1, not 4.
        Err(anyhow!(
            "the gate of {} could not measure the served case{}: {}",
            out.recipe,
            if instrument.len() == 1 { "" } else { "s" },
            instrument.join("; ")
        ))
    } else if let Some(stands) = out.stands {
        Err(not_gateable(format!(
            "the gate of {} could not run on this box ({}); oracle.json keeps its {} verdict",
            out.recipe,
            out.smoke.not_run.join("; "),
            stands.as_str()
        )))
    } else {
        Err(not_gateable(format!(
            "{} is not gateable ({} reason{})",
            out.recipe,
            out.smoke.reasons.len(),
            if out.smoke.reasons.len() == 1 {
                ""
            } else {
                "s"
            }
        )))
    }
}

/// The human-readable smoke report.
pub fn render(out: &SmokeOutput) -> String {
    let s = &out.smoke;
    let mut t = String::new();
    let mut line = |l: String| {
        t.push_str(&l);
        t.push('\n');
    };
    line(format!("oracle   {}", out.oracle.display()));
    line(format!("recipe   {} @ {}", out.recipe, out.commit));
    line(format!(
        "version  {}",
        out.runtime_version.as_deref().unwrap_or("(none)")
    ));
    let boot = match (&s.boot_id_before, &s.boot_id_after) {
        (Some(a), Some(b)) if a == b => format!("boot id {a} (unchanged)"),
        (a, b) => format!(
            "boot id CHANGED {} -> {}",
            a.as_deref().unwrap_or("?"),
            b.as_deref().unwrap_or("?")
        ),
    };
    line(format!("host     {boot}"));
    if s.gpus.is_empty() {
        line("gpu      none visible to nvidia-smi".into());
    }
    for g in &s.gpus {
        line(format!(
            "gpu      {} (compute {}), driver {}, {} free",
            g.name, g.compute_cap, g.driver, g.memory_free
        ));
    }
    line(format!("probe    {}", render_probe(&s.probe)));
    if let Some(e) = &s.engine {
        line(format!("scratch  {}", render_engine(e)));
    }
    for c in &s.cases {
        let requested: Vec<&str> = out
            .requested
            .get(&c.name)
            .map(|keys| keys.iter().map(String::as_str).collect())
            .unwrap_or_default();
        render_case(c, &requested, &mut line);
    }
    for sv in &s.serve {
        line(format!("serve    {}", smoke::serve::describe(sv)));
        if sv.outcome != smoke::ServeOutcome::Skipped && !sv.ok {
            line(format!("  command  {}", sv.command.join(" ")));
            line(format!("  log      {}", sv.log.display()));
            for l in &sv.log_tail {
                line(format!("  | {l}"));
            }
        }
        for n in &sv.notes {
            line(format!("  note     {n}"));
        }
    }
    if let Some(only) = &s.only_case {
        line(format!(
            "note     --case {only}: partial run; oracle.json keeps the full gate's verdict"
        ));
    }
    line(format!(
        "verdict  {} ({:.2} s)",
        s.verdict.as_str(),
        s.duration_s
    ));
    for reason in &s.reasons {
        line(format!("  - {reason}"));
    }
    if let Some(stands) = out.stands {
        line(format!(
            "note     the gate could not run on this box; oracle.json keeps its {} verdict (the attempt is recorded beside it as gate_not_run)",
            stands.as_str()
        ));
    }
    t
}

/// `engine caches warm on cpu-x86_64; 18 files, 1.1 KiB (kept in <entry>); per-run HOME, XDG_CONFIG_HOME, HF_HOME 1 files (deleted); TMPDIR left 2 files, 2 sockets, 0 other (removed); VLLM_CPU_KVCACHE_SPACE=1 GiB (default)`,
/// or `engine caches cold on <device>: <why>; ...`. With a kept engine
/// cache only its caches count as kept: the per-run directories (`fresh/`
/// in it, emptied after the run) are counted apart.
fn render_engine(e: &smoke::EngineRecord) -> String {
    let sum = |kept: bool| {
        e.caches
            .iter()
            .filter(|c| c.kept == kept)
            .fold((0, 0), |(f, b), c| (f + c.usage.files, b + c.usage.bytes))
    };
    let left = e.tmpdir.iter().fold(smoke::Usage::default(), |mut u, t| {
        u.files += t.usage.files;
        u.sockets += t.usage.sockets;
        u.other += t.usage.other;
        u
    });
    let device = e
        .device
        .as_deref()
        .map_or(String::new(), |d| format!(" on {d}"));
    let warmth = match (&e.cold_reason, e.warm) {
        (_, true) => format!("warm{device}"),
        (Some(why), false) => format!("cold{device}: {why}"),
        (None, false) => format!("cold{device}"),
    };
    let kept = e.caches.iter().any(|c| c.kept);
    let (place, (files, bytes)) = match &e.cache_entry {
        Some(entry) => (format!("kept in {entry}"), sum(true)),
        None if kept => ("kept".to_string(), sum(true)),
        None => ("deleted".to_string(), sum(false)),
    };
    let mut t = format!(
        "engine caches {warmth}; {files} files, {:.1} KiB ({place})",
        bytes as f64 / 1024.0
    );
    if kept {
        let per_run: Vec<&str> = e
            .caches
            .iter()
            .filter(|c| !c.kept)
            .map(|c| c.var.as_str())
            .collect();
        let (f, b) = sum(false);
        t.push_str(&format!(
            "; per-run {} {f} files, {:.1} KiB (deleted)",
            per_run.join(", "),
            b as f64 / 1024.0
        ));
    }
    t.push_str(&format!(
        "; TMPDIR left {} files, {} sockets, {} other (removed)",
        left.files, left.sockets, left.other
    ));
    if let Some(kv) = &e.kv_cache_space {
        t.push_str(&format!(
            "; {}={} GiB ({})",
            smoke::KVCACHE_VAR,
            kv.gib,
            kv.from
        ));
    }
    t
}

fn render_probe(p: &Value) -> String {
    if p.is_null() {
        return "off".into();
    }
    let op = p["op"].as_str().unwrap_or("?");
    let device = p["device"].as_str().unwrap_or("?");
    let ok = p["ok"].as_bool().unwrap_or(false);
    let detail = if let Some(err) = p.get("error").filter(|e| !e.is_null()) {
        format!(
            "{} at {}",
            err["exception"].as_str().unwrap_or("?"),
            err["stage"].as_str().unwrap_or("?")
        )
    } else if let Some(e) = p["max_abs_error"].as_f64() {
        format!(
            "max abs error {e:.2e} (tolerance {:.0e})",
            p["tolerance"].as_f64().unwrap_or(f64::NAN)
        )
    } else if let Some(r) = p["returned"].as_str() {
        format!("returned {r}")
    } else {
        String::new()
    };
    format!(
        "{} {op} on {device}: {detail}",
        if ok { "ok  " } else { "FAIL" }
    )
}

fn render_case(c: &CaseResult, requested: &[&str], line: &mut impl FnMut(String)) {
    let speed = match (c.load_s, c.tokens_per_s) {
        (Some(l), Some(t)) => format!("  load {l:.2} s, {t:.1} tok/s"),
        (Some(l), None) => format!("  load {l:.2} s"),
        _ => String::new(),
    };
    let runs = if c.runs == 0 {
        "did not run".to_string()
    } else if c.deterministic {
        format!("{} runs identical", c.runs)
    } else {
        format!("{} runs DISAGREE", c.runs)
    };
    line(format!(
        "case     {} {}  {runs}{speed}",
        c.label(),
        if c.ok { "ok" } else { "FAIL" }
    ));
    line(format!("  model    {}", c.model));
    if let Some(m) = &c.model_manifest {
        line(format!("           {}", m.summary()));
    }
    line(format!(
        "  mode     {}",
        match c.mode {
            Mode::Eager => "eager (enforce_eager: no torch.compile, no CUDA graphs)",
            Mode::Compiled => "compiled (the engine's default compilation and CUDA graphs)",
        }
    ));
    if let Some(cfg) = c.engine_config.as_object() {
        let known: Vec<(&String, &Value)> = cfg
            .iter()
            .filter(|(k, v)| !v.is_null() && !golden::HOST_LOCAL_KEYS.contains(&k.as_str()))
            .collect();
        let shown: Vec<String> = known
            .iter()
            .filter(|(k, _)| requested.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        line(if shown.is_empty() {
            format!(
                "  engine   defaults ({} settings read back, in oracle.json)",
                known.len()
            )
        } else {
            format!(
                "  engine   {} (+{} more read back, in oracle.json)",
                shown.join(" "),
                known.len() - shown.len()
            )
        });
    }
    if c.runs > 0 {
        let prompt = c
            .prompt
            .as_ref()
            .map_or(String::new(), |p| format!(" {p:?}"));
        line(format!(
            "  prompt   {} tokens{prompt}",
            c.prompt_token_ids.len()
        ));
        line(format!(
            "  output   {} tokens {:?}",
            c.output_token_ids.len(),
            c.text
        ));
        line(format!("  ids      {:?}", c.output_token_ids));
    }
    if let Some(d) = &c.disagreement {
        line(format!(
            "  runs     disagree first at output position {}: {}",
            d.position,
            smoke::describe_candidates(&d.candidates)
        ));
    }
    let path = c
        .golden_path
        .as_ref()
        .map_or(String::new(), |p| format!(" {}", p.display()));
    match c.golden {
        GoldenState::Mismatched => {
            line(format!("  golden   MISMATCH{path}"));
            if let Some(d) = &c.golden_diff {
                line(format!("           {}", smoke::describe_diff(d)));
            }
        }
        GoldenState::Refused => {
            let mut why = Vec::new();
            if c.model_diff.is_some() {
                why.push("recorded on other model files");
            }
            if !c.config_diffs.is_empty() {
                why.push("recorded under another engine configuration");
            }
            if why.is_empty() {
                why.push("recorded for another prompt");
            }
            line(format!("  golden   REFUSED{path}: {}", why.join(", ")));
            if let Some(d) = &c.model_diff {
                line(format!("           model files {d}"));
            }
            for d in &c.config_diffs {
                line(format!("           {d}"));
            }
        }
        GoldenState::None => {
            line("  golden   none recorded (smoke --record-golden writes one)".into())
        }
        other => line(format!("  golden   {other}{path}")),
    }
    match c.model_check {
        Some(ModelCheck::Matched) => line(
            "  model    the golden's model files: every file the same (path, size, sha256)".into(),
        ),
        Some(ModelCheck::NotChecked) if c.model_manifest.is_none() => line(
            "  model    NOT CHECKED: the model's files could not be hashed (the reason is below)".into(),
        ),
        Some(ModelCheck::NotChecked) => line(
            "  model    NOT CHECKED: the golden records no model manifest (record it again to check the model)".into(),
        ),
        Some(ModelCheck::Differs) | None => {}
    }
    for n in &c.notes {
        line(format!("  note     {n}"));
    }
    if let Some(err) = &c.error {
        for l in err["log_tail"].as_array().into_iter().flatten() {
            line(format!("  log      {}", l.as_str().unwrap_or("")));
        }
    }
    if c.runs > 0 || c.error.is_some() {
        line(format!("  log      {}", c.log.display()));
    }
}
