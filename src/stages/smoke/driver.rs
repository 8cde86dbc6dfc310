//! The driver process: `py/smoke_driver.py` run once per probe or case in
//! its own process group under a timeout, and what it reports back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use fs_err as fs;
use serde::Deserialize;
use serde_json::Value;

use super::{TopLogprob, UnreadKnob};
use crate::store::{read_json, write_json};

pub(super) const DRIVER_PY: &str = include_str!("../../py/smoke_driver.py");

/// What one driver process left behind.
pub(super) struct DriverOutcome {
    /// Its JSON result, when it wrote one.
    pub(super) result: Option<Value>,
    /// Why it wrote none (timeout, crash), when so.
    pub(super) failure: Option<String>,
    /// The last lines of its log.
    pub(super) log_tail: Vec<String>,
    /// Its log file.
    pub(super) log: PathBuf,
}

/// Runs the driver once in its own process group under `timeout`, from the
/// empty directory `cwd`, with `env` over the recipe's `recipe_env`
/// (`env` wins: the gate's confinement, see `confine`), and `PATH`
/// starting with the directory of `python`, the oracle's `bin/`
/// ([`super::confine::engine_path`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn run_driver(
    python: &Path,
    driver: &Path,
    mode: &str,
    name: &str,
    cfg: &Value,
    out_dir: &Path,
    recipe_env: &BTreeMap<String, String>,
    env: &BTreeMap<String, String>,
    cwd: &Path,
    timeout: Duration,
) -> Result<DriverOutcome> {
    let cfg_path = out_dir.join(format!("{name}.config.json"));
    let out_path = out_dir.join(format!("{name}.result.json"));
    let log = out_dir.join(format!("{name}.log"));
    write_json(&cfg_path, cfg)?;
    let stage_path = out_dir.join(format!("{name}.result.json.stage"));
    let _ = fs::remove_file(&out_path);
    let _ = fs::remove_file(&stage_path);
    let mut cmd = duct::cmd(
        python,
        [
            // -B: the gate never writes bytecode into the oracle (the
            // engine's own processes inherit the flag).
            "-I".as_ref(),
            "-B".as_ref(),
            driver.as_os_str(),
            mode.as_ref(),
            cfg_path.as_os_str(),
            out_path.as_os_str(),
        ],
    )
    .dir(cwd)
    .env_remove("PYTHONPATH")
    .env_remove("PYTHONHOME");
    for (k, v) in recipe_env.iter().chain(env) {
        cmd = cmd.env(k, v);
    }
    // The oracle's `bin/` first on PATH (`python` is `<venv>/bin/python`).
    if let Some(bin) = python.parent() {
        let base = env.get("PATH").or_else(|| recipe_env.get("PATH"));
        cmd = cmd.env(
            "PATH",
            super::confine::engine_path(bin, base.map(String::as_str)),
        );
    }
    let outcome = crate::host::process::run_with_timeout(cmd, &log, timeout);
    let log_tail: Vec<String> =
        crate::host::process::tail(&std::fs::read_to_string(&log).unwrap_or_default(), 8)
            .lines()
            .map(str::to_string)
            .collect();
    let stage = std::fs::read_to_string(&stage_path).ok();
    let (result, failure) = match outcome {
        Err(e) => (
            None,
            Some(match stage {
                Some(st) => format!("{e:#} (it was at stage: {st})"),
                None => format!("{e:#}"),
            }),
        ),
        Ok(_) if !out_path.exists() => (None, Some("the driver exited without a result".into())),
        Ok(_) => match read_json::<Value>(&out_path) {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(format!("unreadable driver result: {e:#}"))),
        },
    };
    Ok(DriverOutcome {
        result,
        failure,
        log_tail,
        log,
    })
}

/// One run as the driver reports it.
#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct DriverRun {
    #[serde(default)]
    pub(super) prompt_token_ids: Vec<i64>,
    #[serde(default)]
    pub(super) output_token_ids: Vec<i64>,
    #[serde(default)]
    pub(super) text: String,
    #[serde(default)]
    pub(super) tokens_per_s: Option<f64>,
    #[serde(default)]
    pub(super) logprobs: Vec<Vec<TopLogprob>>,
    /// Which of a several-prompt case's prompts this run generated.
    #[serde(default)]
    pub(super) prompt_index: Option<usize>,
}

/// A case as the driver reports it.
#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct DriverCase {
    #[serde(default)]
    pub(super) runs: Vec<DriverRun>,
    #[serde(default)]
    pub(super) error: Option<Value>,
    #[serde(default)]
    pub(super) load_s: Option<f64>,
    #[serde(default)]
    pub(super) engine_config: Value,
    #[serde(default)]
    pub(super) unread_engine_args: Vec<UnreadKnob>,
    #[serde(default)]
    pub(super) mapped_objects: Vec<String>,
}
