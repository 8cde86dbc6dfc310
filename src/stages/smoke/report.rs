//! The smoke stage's records: the verdict, each case's result, the whole
//! run as stored in `oracle.json` `"smoke"`, and one-line descriptions of
//! run disagreements and golden divergences.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::golden::{ConfigDiff, GoldenDiff, GoldenState};
use super::model::{ModelCheck, ModelDiff, ModelManifest};
use crate::host::toolchain::Gpu;
use crate::recipe::Mode;
use crate::stages::identity::loaded::KernelCoverage;

/// The gate's decision.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Probe ok, every case ran and agreed with itself and its golden.
    Gateable,
    /// Anything else; the reasons say what.
    NotGateable,
    /// Smoke was skipped (`--no-smoke`).
    Unsmoked,
}

impl Verdict {
    /// `gateable`, `not-gateable` or `unsmoked`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Gateable => "gateable",
            Verdict::NotGateable => "not-gateable",
            Verdict::Unsmoked => "unsmoked",
        }
    }
}

/// One candidate token at one generated step (vLLM's `Logprob`, flattened).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TopLogprob {
    /// Token id.
    pub id: i64,
    /// Natural-log probability (null when not finite).
    pub logprob: Option<f64>,
    /// 1-based rank among the candidates.
    #[serde(default)]
    pub rank: Option<i64>,
    /// The decoded token text.
    #[serde(default)]
    pub token: Option<String>,
}

/// Runs of one case that disagree: where, and what each run chose there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Disagreement {
    /// First output position (0-based) where any run differs from run 1.
    pub position: usize,
    /// The tokens the runs chose there, one entry per distinct token.
    pub candidates: Vec<Candidate>,
}

/// One token chosen at a disagreement, and by which runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Candidate {
    /// The token id (null: those runs had already ended).
    pub token: Option<i64>,
    /// Its text, when the run recorded log-probabilities.
    pub text: Option<String>,
    /// Its log-probability in the runs that chose it.
    pub logprob: Option<f64>,
    /// 1-based numbers of the runs that chose it.
    pub runs: Vec<usize>,
}

/// The result of one case.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CaseResult {
    /// Case name.
    pub name: String,
    /// Model path after `${VAR}` expansion (or the unexpanded text if that failed).
    pub model: String,
    /// How the engine ran: `eager` or `compiled` (the case's `mode`;
    /// records made before it read as `eager`).
    #[serde(default)]
    pub mode: Mode,
    /// Whether the case passes the gate.
    pub ok: bool,
    /// Why not, one line each.
    pub problems: Vec<String>,
    /// Observations that do not fail the gate (e.g. a golden without engine configuration).
    #[serde(default)]
    pub notes: Vec<String>,
    /// The prompt text, when the case gives text.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Prompt token ids of the first run.
    pub prompt_token_ids: Vec<i64>,
    /// Output token ids of the first run.
    pub output_token_ids: Vec<i64>,
    /// Output text of the first run.
    pub text: String,
    /// Per-step top-k log-probabilities of the first run (`smoke.logprobs`).
    #[serde(default)]
    pub logprobs: Vec<Vec<TopLogprob>>,
    /// Number of runs made.
    pub runs: usize,
    /// Whether every run produced the same output tokens.
    pub deterministic: bool,
    /// Where the runs first disagree, when they do.
    #[serde(default)]
    pub disagreement: Option<Disagreement>,
    /// Seconds to construct `LLM(...)`.
    pub load_s: Option<f64>,
    /// Median tokens per second over the runs.
    pub tokens_per_s: Option<f64>,
    /// The engine configuration read back from the engine.
    pub engine_config: Value,
    /// Engine arguments the case set that the driver could not read back
    /// from the engine (absent from `engine_config`), each with the reason.
    #[serde(default)]
    pub unread_engine_args: Vec<UnreadKnob>,
    /// The environment the case ran with (`smoke.env` + the case's `env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// How the output stands against the golden (see [`GoldenState`]).
    pub golden: GoldenState,
    /// The golden file compared with (or written).
    #[serde(default)]
    pub golden_path: Option<PathBuf>,
    /// The first divergence from the golden, when mismatched.
    #[serde(default)]
    pub golden_diff: Option<GoldenDiff>,
    /// Engine settings that differ from the golden's, when refused.
    #[serde(default)]
    pub config_diffs: Vec<ConfigDiff>,
    /// What the driver reported when it failed: stage, exception, last log lines.
    #[serde(default)]
    pub error: Option<Value>,
    /// The driver's log file.
    pub log: PathBuf,
    /// The case could not run on this box: its model path names a variable
    /// that is not set, or a path that does not exist. Its problems say
    /// which; nothing about the oracle was learned from it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_run: bool,
    /// The manifest of the case's model directory, taken before the engine
    /// ran ([`super::model`]); absent in records made before it, and for a
    /// case whose model was not there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_manifest: Option<ModelManifest>,
    /// How the model stands against the golden's manifest, when a golden was
    /// compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_check: Option<ModelCheck>,
    /// The files that differ from the golden's manifest, when they do (the
    /// golden is then refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_diff: Option<ModelDiff>,
    /// The absolute paths of the shared objects the case's engine
    /// processes (the driver and its descendants) had mapped after the
    /// runs, sorted, at most [`crate::stages::identity::loaded::MAX_MAPPED`]:
    /// what [`SmokeReport::kernel_coverage`] is judged from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mapped_objects: Vec<String>,
    /// Which prompt of a case with several prompts (`prompts:` or
    /// `prompts_file:`) this result is, 0-based; absent for a single-prompt case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_index: Option<usize>,
}

impl CaseResult {
    /// The case name, with `[N]` for prompt N of a case with several prompts.
    pub fn label(&self) -> String {
        match self.prompt_index {
            Some(i) => format!("{}[{i}]", self.name),
            None => self.name.clone(),
        }
    }
}

/// An engine argument that could not be read back from the engine.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UnreadKnob {
    /// The engine argument, as the case names it.
    pub knob: String,
    /// Why it could not be read back (e.g. no attribute of vLLM's config has it).
    pub reason: String,
}

/// The whole smoke run, as recorded in `oracle.json` `"smoke"`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SmokeReport {
    /// Content key of the smoke inputs; a re-run with the same key is not repeated.
    pub key: String,
    /// The decision.
    pub verdict: Verdict,
    /// Why it is not gateable, one line each.
    pub reasons: Vec<String>,
    /// The probe's result (null when disabled).
    pub probe: Value,
    /// Per-case results.
    pub cases: Vec<CaseResult>,
    /// `/proc/sys/kernel/random/boot_id` before and after.
    pub boot_id_before: Option<String>,
    /// See `boot_id_before`.
    pub boot_id_after: Option<String>,
    /// GPUs seen by `nvidia-smi` before the run: name, compute capability,
    /// driver, free memory (empty when none).
    pub gpus: Vec<Gpu>,
    /// The near-tie threshold used, nats.
    #[serde(default)]
    pub near_tie_nats: f64,
    /// `--case NAME`: only this case ran (such a report is not the gate's record).
    #[serde(default)]
    pub only_case: Option<String>,
    /// When the run started (RFC 3339).
    pub started: String,
    /// Wall time of the whole run, seconds.
    pub duration_s: f64,
    /// The engine's caches and scratch during the run (see
    /// `stages::smoke::confine`); absent in records made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineRecord>,
    /// The reasons (among `reasons`) that are cases the gate could not run
    /// on this box ([`CaseResult::not_run`]): an unset variable, a missing
    /// model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_run: Vec<String>,
    /// The kernel coverage of what the cases' engines loaded (the oracle's
    /// extensions they mapped judged against the GPU, the others listed);
    /// absent for a skipped gate and in records made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_coverage: Option<KernelCoverage>,
    /// The online leg (`smoke.serve`): one result per served case; absent
    /// when the recipe serves none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serve: Vec<ServeResult>,
}

/// How a served case's tokens stand against its reference
/// (`ServeResult::outcome`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ServeOutcome {
    /// The server's tokens equal the reference's.
    Identical,
    /// They differ first where the two tokens were nearly tied.
    NearTie,
    /// They differ, and not at a near-tie.
    Drift,
    /// The server started but did not give an answer that can be compared
    /// (it exited, answered an error, or its answer had no tokens).
    Failed,
    /// The gate could not measure: the server never answered `GET /health`
    /// within `smoke.serve.timeout_s`, or could not be started at all.
    InstrumentFailure,
    /// Not served: its offline case could not run, or there is nothing to
    /// compare with (no golden and no offline tokens).
    Skipped,
}

/// One served case of the online leg (`oracle.json` `smoke.serve[]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ServeResult {
    /// The offline case served.
    pub case: String,
    /// True when the server's tokens equal the reference's.
    pub ok: bool,
    /// The outcome.
    pub outcome: ServeOutcome,
    /// The server's command line (`<venv>/bin/<command> serve <model> --host ... --port ...` plus `args`).
    pub command: Vec<String>,
    /// The port it was given.
    pub port: Option<u16>,
    /// Its process id (the leader of its process group).
    pub pid: Option<u32>,
    /// Seconds from its start until `GET /health` answered 200.
    pub start_s: Option<f64>,
    /// Seconds the `POST /v1/completions` request took.
    pub latency_s: Option<f64>,
    /// What its tokens were compared with: `golden <path>`, or `this run's
    /// offline tokens` when the case has no golden (goldens are never
    /// recorded from the server).
    pub compared_with: Option<String>,
    /// The server's prompt token ids, when it returned them.
    #[serde(default)]
    pub prompt_token_ids: Vec<i64>,
    /// The server's generated token ids.
    pub output_token_ids: Vec<i64>,
    /// The server's generated text.
    pub text: Option<String>,
    /// The first divergence from the reference, when they differ.
    pub diff: Option<GoldenDiff>,
    /// What fails the gate, one line each.
    pub problems: Vec<String>,
    /// Why the gate could not measure (see [`ServeOutcome::InstrumentFailure`]).
    pub instrument_failure: Option<String>,
    /// Remarks that do not fail the gate.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The server's log.
    pub log: PathBuf,
    /// The last lines of its log, when the case did not pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_tail: Vec<String>,
}

/// A gate that could not run (`oracle.json` `gate_not_run`): every reason
/// it failed was a case it could not run on this box, so it says nothing
/// about the oracle, and the verdict recorded before it stays in force.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GateAttempt {
    /// When the attempt started (RFC 3339).
    pub started: String,
    /// The smoke key it ran under.
    pub key: String,
    /// Why it could not run, one line per case.
    pub reasons: Vec<String>,
    /// What ran it: `build` or `smoke`.
    pub by: String,
}

/// What the engine wrote into its confined caches and `TMPDIR` during one
/// gate run (`oracle.json`: `smoke.engine`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EngineRecord {
    /// The engine directory, relative to the gate's run directory (the
    /// directory of its logs: `oracle-build/smoke/` in the entry after a
    /// build, `<store>/logs/smoke-<key>/` after `smoke`).
    pub dir: String,
    /// Whether the warm caches were kept in the oracle's engine cache
    /// (false: measured, then deleted with the run's scratch). No cache
    /// ever enters an entry's manifest.
    pub kept: bool,
    /// Whether the run was warm: it used the oracle's kept engine cache as
    /// an earlier gate run left it (false: `cold_reason` says why).
    #[serde(default)]
    pub warm: bool,
    /// Why the run was cold: `--cold`, the first gate run of the oracle on
    /// this device (no engine cache of it existed), the kept engine cache
    /// was empty (the engine left nothing in it), the engine cache in use
    /// by another gate, no engine cache for the run; absent when warm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_reason: Option<String>,
    /// The engine cache entry (`<store>/engine-cache/<venv key>-<device>`)
    /// the warm caches were kept in; absent for scratch caches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_entry: Option<String>,
    /// The device name of the engine cache (`cpu-<arch>`,
    /// `sm<cc>-<gpu name>`); absent in records made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// What the kept engine cache held when the run started (after
    /// `--cold` emptied it); absent for scratch caches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Usage>,
    /// The fixed variables that keep the engine offline.
    pub offline: BTreeMap<String, String>,
    /// `VLLM_CPU_KVCACHE_SPACE` (GiB) the engine got, and where it came
    /// from (`default`, `smoke.env`); `None` off `target_device: cpu` when
    /// `smoke.env` does not set it.
    pub kv_cache_space: Option<KvCacheSpace>,
    /// The engine's `PATH`: the oracle's `bin/` first, then the recipe's
    /// `smoke.env.PATH` or the gate's own (a case's `env.PATH` replaces
    /// what follows the oracle's `bin/` for that case). Absent in records
    /// made before it was set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Each cache variable: its directory (relative to the run directory,
    /// or absolute inside the engine cache when kept) and what was in it
    /// once every engine run was done.
    pub caches: Vec<CacheUse>,
    /// Each engine process: what it left in its `TMPDIR` (counted, then removed).
    pub tmpdir: Vec<TmpLeft>,
}

/// The CPU backend's KV cache bound of a gate run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KvCacheSpace {
    /// The value given, GiB (as text: the variable's value).
    pub gib: String,
    /// `default` or `smoke.env`.
    pub from: String,
}

/// One cache variable's directory and what it held.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CacheUse {
    /// The variable (`VLLM_CACHE_ROOT`, ...).
    pub var: String,
    /// Its directory: relative to the run directory, or (kept) the
    /// absolute path inside the oracle's engine cache.
    pub path: String,
    /// Whether it is kept in the oracle's engine cache between gate runs.
    #[serde(default)]
    pub kept: bool,
    /// What was written there.
    #[serde(flatten)]
    pub usage: Usage,
}

/// What one engine process left in its `TMPDIR`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TmpLeft {
    /// The process: `probe` or `case-<name>`.
    pub run: String,
    /// Its `TMPDIR` (removed): `<store>/tmp/e.<pid>.<random>`.
    pub path: String,
    /// What was left there.
    #[serde(flatten)]
    pub usage: Usage,
}

/// Regular files (count and bytes), Unix sockets and other entries
/// (symlinks, FIFOs) under a directory; directories are not counted.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    /// Regular files.
    pub files: u64,
    /// Their total size.
    pub bytes: u64,
    /// Unix sockets (ZeroMQ IPC endpoints).
    pub sockets: u64,
    /// Anything else that is not a directory.
    pub other: u64,
}

impl SmokeReport {
    /// A report for a skipped smoke run.
    pub fn skipped(key: String) -> SmokeReport {
        SmokeReport {
            key,
            verdict: Verdict::Unsmoked,
            reasons: vec!["smoke skipped (--no-smoke)".into()],
            probe: Value::Null,
            cases: Vec::new(),
            boot_id_before: None,
            boot_id_after: None,
            gpus: Vec::new(),
            near_tie_nats: 0.0,
            only_case: None,
            started: jiff::Timestamp::now().to_string(),
            duration_s: 0.0,
            engine: None,
            not_run: Vec::new(),
            kernel_coverage: None,
            serve: Vec::new(),
        }
    }

    /// Why the online leg could not measure, one line per served case
    /// ([`ServeOutcome::InstrumentFailure`]): such a gate exits 1, not 4.
    pub fn instrument_failures(&self) -> Vec<String> {
        self.serve
            .iter()
            .filter_map(|s| {
                s.instrument_failure
                    .as_ref()
                    .map(|f| format!("serve {}: {f}", s.case))
            })
            .collect()
    }

    /// Whether the gate could not run at all: some case could not run on
    /// this box ([`CaseResult::not_run`]) and nothing else failed (the
    /// probe passed, every case that ran passed). Such a run says nothing
    /// about the oracle and must not replace a verdict.
    pub fn could_not_run(&self) -> bool {
        !self.not_run.is_empty() && self.reasons.iter().all(|r| self.not_run.contains(r))
    }

    /// The attempt this run was, for `oracle.json` `gate_not_run`, by
    /// `by` (`build`, `smoke`).
    pub fn attempt(&self, by: &str) -> GateAttempt {
        GateAttempt {
            started: self.started.clone(),
            key: self.key.clone(),
            reasons: self.not_run.clone(),
            by: by.to_string(),
        }
    }
}

/// `12 " sits" (logprob -0.34; runs 1, 3) | 34 " shine" (logprob -1.84; run 2)`.
pub fn describe_candidates(cands: &[Candidate]) -> String {
    cands
        .iter()
        .map(|c| {
            let tok = match (c.token, &c.text) {
                (Some(t), Some(s)) => format!("{t} {s:?}"),
                (Some(t), None) => t.to_string(),
                (None, _) => "(ended)".into(),
            };
            let lp = c
                .logprob
                .map_or(String::new(), |l| format!("logprob {l:.2}; "));
            let runs: Vec<String> = c.runs.iter().map(ToString::to_string).collect();
            format!(
                "{tok} ({lp}run{} {})",
                if c.runs.len() == 1 { "" } else { "s" },
                runs.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// One line for a golden divergence: position, both tokens, gaps, near-tie.
pub fn describe_diff(d: &GoldenDiff) -> String {
    let tok = |id: Option<i64>, text: &Option<String>| match (id, text) {
        (Some(i), Some(t)) => format!("{i} {t:?}"),
        (Some(i), None) => i.to_string(),
        (None, _) => "(ended)".into(),
    };
    let mut s = format!(
        "first differs at output position {}: golden {} vs now {}",
        d.position,
        tok(d.golden_token, &d.golden_text),
        tok(d.token, &d.text)
    );
    match (d.gap_nats, d.gap_at_least_nats) {
        (Some(g), _) => s += &format!(", gap {g:.2} nats"),
        (None, Some(g)) => s += &format!(", gap at least {g:.2} nats (golden token outside top-k)"),
        (None, None) if d.golden_token.is_some() && d.token.is_some() => {
            s += ", gap unknown (no logprobs)"
        }
        _ => {}
    }
    if let Some(g) = d.golden_gap_nats {
        s += &format!(" (golden's own gap {g:.2})");
    }
    if d.near_tie {
        s += &format!(
            ": a NEAR-TIE (under {:?} nats): the two tokens were nearly tied, so this may be a tie flipping rather than drift",
            d.near_tie_nats
        );
    } else if d.gap_nats.is_some() || d.golden_gap_nats.is_some() {
        s += &format!(": not a near-tie (threshold {:?} nats)", d.near_tie_nats);
    }
    s
}
