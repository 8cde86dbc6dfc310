//! Goldens: the recorded output a gate case must reproduce.
//!
//! Two formats are read:
//!
//! - **JSON goldens**, written by `smoke --record-golden` ([`Golden`]): prompt
//!   ids, output ids, text, per-step top-k log-probabilities, the engine
//!   configuration read back from the engine, the oracle's identity and the
//!   capture time. A hand-written `{"output_token_ids": [...]}` is accepted too.
//! - **numpy goldens**, as users already keep them: `greedy_ids.npy` (int32
//!   `[N, T]`, one row per prompt; trailing negative values are padding) with
//!   `manifest.json` beside it. The manifest says which row is which prompt
//!   (`prompts`: texts, or `prompt_token_ids`: id lists) and under which
//!   engine arguments it was captured (`engine_args` or `engine_config`).
//!
//! Where a case's golden lives ([`locate`]): the case's `golden:` path,
//! relative to the recipe file's directory (for recipes compiled into the
//! binary: relative to `<store>/goldens/<recipe>/`); without one,
//! `goldens/<recipe>/<case>.json` beside the recipe ([`recipe_dir`]: next to
//! its `recipes/` and `lockfiles/`, to be committed and reviewed), else the
//! store's copy `<store>/goldens/<recipe>/<case>.json` (kept by every
//! recording, and carried by bundles). Goldens are never written inside
//! `<store>/store/`, whose entries are read-only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::golden;
use super::model::{self, ModelCheck, ModelManifest};
use super::npy;
use super::{CaseResult, TopLogprob, describe_diff};
use crate::recipe::{Case, LoadedRecipe, MAX_GOLDEN_JSON, MAX_GOLDEN_NPY, Mode};
use crate::regular_file::{self, ReadError};

/// The `format` value of JSON goldens written by this version.
pub const FORMAT: &str = "oracle-build-golden/1";

/// Engine-configuration keys that name *where* things are on this host, not
/// how the engine runs; they may differ between hosts and are not compared.
pub const HOST_LOCAL_KEYS: &[&str] = &["model", "tokenizer", "download_dir"];

/// A JSON golden as written by `smoke --record-golden`. Every field but
/// `output_token_ids` may be absent in hand-written goldens.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Golden {
    /// [`FORMAT`].
    #[serde(default)]
    pub format: String,
    /// The case it was recorded for.
    #[serde(default)]
    pub case: String,
    /// The model path at capture time (informational; host-local).
    #[serde(default)]
    pub model: Option<String>,
    /// The model's hub revision.
    #[serde(default)]
    pub revision: Option<String>,
    /// The prompt text, when the case gives text.
    #[serde(default)]
    pub prompt: Option<String>,
    /// `RequestOutput.prompt_token_ids`.
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<i64>>,
    /// `outputs[0].token_ids`: what must be reproduced.
    pub output_token_ids: Vec<i64>,
    /// `outputs[0].text`.
    #[serde(default)]
    pub text: Option<String>,
    /// `SamplingParams.max_tokens`.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// `SamplingParams.logprobs` (top-k per step).
    #[serde(default)]
    pub logprobs_k: Option<u32>,
    /// Per generated step, the top-k candidates (the chosen token included), most likely first.
    #[serde(default)]
    pub logprobs: Vec<Vec<TopLogprob>>,
    /// The engine configuration read back from the engine at capture.
    #[serde(default)]
    pub engine_config: Option<Value>,
    /// The case's `mode` at capture (`eager` or `compiled`). Absent in
    /// goldens recorded before it: then read from `engine_config`'s
    /// `enforce_eager` ([`mode_of_config`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The environment the case ran with (`smoke.env` + the case's `env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The oracle's identity: recipe, commit, versions, venv key, wheel sha256.
    #[serde(default)]
    pub oracle: Value,
    /// Capture time (RFC 3339).
    #[serde(default)]
    pub captured: Option<String>,
    /// Host facts at capture: boot id, GPUs.
    #[serde(default)]
    pub host: Value,
    /// The manifest of the model directory at capture (every file's path,
    /// size, sha256; the hub revision of a snapshot). Absent in goldens
    /// recorded before it: then the model is not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_manifest: Option<ModelManifest>,
    /// Set when `advance --accept` recorded it: FROM and TO, how this case
    /// compared, and the reviewer's reason for an accepted drift.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advance: Option<Value>,
}

/// The `format` value of a golden file holding one entry per prompt (a
/// case with `prompts:` or `prompts_file:`).
pub const SET_FORMAT: &str = "oracle-build-golden-set/1";

/// The golden of a case with several prompts: one [`Golden`] per prompt, in
/// the case's order. A file without `entries` is a single [`Golden`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GoldenSet {
    /// [`SET_FORMAT`].
    pub format: String,
    /// The case it was recorded for.
    pub case: String,
    /// One golden per prompt.
    pub entries: Vec<Golden>,
    /// Set when `advance --accept` recorded it (as [`Golden::advance`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advance: Option<Value>,
}

/// Whether `bytes` are a JSON golden as [`load`] reads one: a [`GoldenSet`]
/// (a file with `entries`) or a single [`Golden`], each `engine_config` an
/// object or null. What `import` checks of a bundle's goldens before
/// writing anything.
///
/// Errors: what is wrong, to follow the file's name (`is not a golden JSON
/// (...)`, `is not a golden set JSON (...)`, `has an engine_config that is
/// not an object: ...`).
pub fn check_json(bytes: &[u8]) -> Result<(), String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("is not a golden JSON ({e})"))?;
    let goldens = if value.get("entries").is_some() {
        serde_json::from_value::<GoldenSet>(value)
            .map_err(|e| format!("is not a golden set JSON ({e})"))?
            .entries
    } else {
        vec![
            serde_json::from_value::<Golden>(value)
                .map_err(|e| format!("is not a golden JSON ({e})"))?,
        ]
    };
    for g in &goldens {
        if let Some(c) = &g.engine_config
            && !(c.is_object() || c.is_null())
        {
            return Err(format!("has an engine_config that is not an object: {c}"));
        }
    }
    Ok(())
}

/// The entry of a golden set for a prompt: by its text, else by its ids.
fn pick_entry(
    set: GoldenSet,
    prompt: Option<&str>,
    prompt_ids: &[i64],
) -> Result<(usize, Golden), String> {
    let n = set.entries.len();
    let at = set
        .entries
        .iter()
        .position(|g| prompt.is_some() && g.prompt.as_deref() == prompt)
        .or_else(|| {
            set.entries
                .iter()
                .position(|g| g.prompt_token_ids.as_deref() == Some(prompt_ids))
        })
        .ok_or_else(|| {
            format!(
                "it holds {n} prompt(s) and none is this one ({})",
                prompt.map_or_else(|| format!("{prompt_ids:?}"), |p| format!("{p:?}"))
            )
        })?;
    let g = set
        .entries
        .into_iter()
        .nth(at)
        .ok_or_else(|| format!("entry {at} is missing"))?;
    Ok((at, g))
}

/// The format of a golden file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A JSON golden ([`Golden`]).
    Json,
    /// `greedy_ids.npy` with `manifest.json`.
    Npy,
}

/// Where a case's golden is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The golden file (for numpy goldens, the `.npy` file).
    pub path: PathBuf,
    /// Whether the recipe names it (`golden:`); a named golden must exist.
    pub explicit: bool,
    /// Its format.
    pub kind: Kind,
}

impl Location {
    /// The most bytes of it read: [`MAX_GOLDEN_NPY`] for a numpy golden,
    /// else [`MAX_GOLDEN_JSON`].
    pub fn limit(&self) -> u64 {
        match self.kind {
            Kind::Json => MAX_GOLDEN_JSON,
            Kind::Npy => MAX_GOLDEN_NPY,
        }
    }

    /// For numpy goldens, `manifest.json` beside the `.npy` file.
    pub fn manifest(&self) -> Option<PathBuf> {
        (self.kind == Kind::Npy).then(|| {
            self.path
                .parent()
                .unwrap_or(Path::new("."))
                .join("manifest.json")
        })
    }
}

/// `<root>/goldens/<recipe>`: where goldens of `recipe` live when its cases name none.
pub fn default_dir(root: &Path, recipe: &str) -> PathBuf {
    root.join("goldens").join(recipe)
}

/// `goldens/<recipe name>` beside the recipe file, by the rule of lock
/// directories ([`crate::stages::lock::lock_dir`]): a recipe in
/// `<repo>/recipes/x.yaml` keeps its goldens in `<repo>/goldens/<name>/`,
/// one elsewhere in `goldens/<name>/` of its own directory. `None` for the
/// recipes compiled into the binary (their goldens live in the store).
pub fn recipe_dir(lr: &LoadedRecipe) -> Option<PathBuf> {
    let d = lr.dir.as_ref()?;
    let base = if d.file_name().is_some_and(|n| n == "recipes") {
        d.parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    } else {
        d.clone()
    };
    Some(base.join("goldens").join(&lr.recipe.name))
}

/// The directories the golden of a case without `golden:` is looked up in,
/// in order: beside the recipe ([`recipe_dir`]) when it has a file, then the
/// store's copy ([`default_dir`]). Recording writes the first and copies
/// into the others.
pub fn dirs(root: &Path, lr: &LoadedRecipe) -> Vec<PathBuf> {
    recipe_dir(lr)
        .into_iter()
        .chain([default_dir(root, &lr.recipe.name)])
        .collect()
}

/// [`location`] over several directories: a case's `golden:` path (or, when
/// nothing is there, the store's copy of a JSON golden: `dirs`' last), else the
/// first of `dirs` holding `<case>.json`, else the first of `dirs`.
pub fn locate(lr: &LoadedRecipe, dirs: &[PathBuf], case: &Case) -> Location {
    let first = dirs.first().cloned().unwrap_or_default();
    if case.golden.is_some() {
        let named = location(lr, &first, case);
        // A named JSON golden missing at its path (a box that imported the
        // pin from a bundle has only the store's copy, see `import`): the
        // store's copy, the last of `dirs`, when there is one.
        if !named.path.exists()
            && named.kind == Kind::Json
            && let Some(copy) = dirs
                .last()
                .map(|d| d.join(format!("{}.json", case.name)))
                .filter(|p| p.is_file())
        {
            return Location {
                path: copy,
                explicit: true,
                kind: Kind::Json,
            };
        }
        return named;
    }
    dirs.iter()
        .map(|d| location(lr, d, case))
        .find(|l| l.path.is_file())
        .unwrap_or_else(|| location(lr, &first, case))
}

/// Where `case`'s golden is: its `golden:` path (relative to the recipe's
/// directory, or to `goldens_dir` for built-in recipes), else
/// `goldens_dir/<case>.json`. A path ending in `.npy`, or a directory (then
/// its `greedy_ids.npy`), is a numpy golden.
pub fn location(lr: &LoadedRecipe, goldens_dir: &Path, case: &Case) -> Location {
    let Some(g) = case.golden.as_deref() else {
        return Location {
            path: goldens_dir.join(format!("{}.json", case.name)),
            explicit: false,
            kind: Kind::Json,
        };
    };
    let p = Path::new(g);
    let mut path = if p.is_absolute() {
        p.to_path_buf()
    } else {
        lr.dir.as_deref().unwrap_or(goldens_dir).join(p)
    };
    if path.is_dir() {
        path = path.join("greedy_ids.npy");
    }
    let kind = if path.extension().is_some_and(|e| e == "npy") {
        Kind::Npy
    } else {
        Kind::Json
    };
    Location {
        path,
        explicit: true,
        kind,
    }
}

/// The bytes of the file at `path`, read as a golden is: a regular file
/// (links followed) of at most `limit` bytes, opened without blocking
/// ([`regular_file::read`]).
///
/// Errors: text naming `what` and the file (`golden X is a FIFO, not a
/// regular file`, `golden X does not exist`, `golden X is a symbolic link
/// to nothing`, `golden X is larger than N bytes, the limit`).
pub fn read_bounded(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>, String> {
    let show = path.display();
    regular_file::read(path, limit).map_err(|e| match e {
        ReadError::Missing if std::fs::symlink_metadata(path).is_ok() => {
            format!("{what} {show} is a symbolic link to nothing")
        }
        e => format!("{what} {show} {e}"),
    })
}

/// The bytes of the golden at `loc` ([`read_bounded`], at most
/// [`Location::limit`]).
///
/// Errors: as [`read_bounded`].
pub fn read(loc: &Location) -> Result<Vec<u8>, String> {
    read_bounded(&loc.path, loc.limit(), "golden")
}

/// sha256 of the golden's bytes (and of its manifest, for numpy goldens);
/// `None` when absent. Part of the smoke key. Read bounded and never
/// blocking ([`read`]): a golden that cannot be read as one (a FIFO, a
/// device, too large) gives `unreadable: <why>`, so its key differs from
/// an absent golden's, and its gate fails reading it.
pub fn content_digest(loc: &Location) -> Option<String> {
    use sha2::Digest;
    let bytes = match regular_file::read(&loc.path, loc.limit()) {
        Ok(b) => b,
        Err(ReadError::Missing) => return None,
        Err(e) => return Some(format!("unreadable: {e}")),
    };
    let mut h = sha2::Sha256::new();
    h.update(&bytes);
    if let Some(m) = loc.manifest()
        && let Ok(mb) = regular_file::read(&m, MAX_GOLDEN_JSON)
    {
        h.update(b"\0manifest\0");
        h.update(&mb);
    }
    Some(hex::encode(h.finalize()))
}

/// A golden read for comparison, whatever its format.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The prompt ids it was recorded for, when known.
    pub prompt_token_ids: Option<Vec<i64>>,
    /// The prompt text, when known.
    pub prompt: Option<String>,
    /// The tokens to reproduce.
    pub output_token_ids: Vec<i64>,
    /// Per-step top-k at capture (empty when not recorded).
    pub logprobs: Vec<Vec<TopLogprob>>,
    /// The engine configuration at capture, when recorded.
    pub engine_config: Option<Map<String, Value>>,
    /// True when `engine_config` lists only the arguments passed (a numpy
    /// manifest), so only its keys are compared.
    pub config_is_partial: bool,
    /// The mode it was recorded in: its `mode`, else what its engine
    /// configuration's `enforce_eager` says ([`mode_of_config`]); `None`
    /// when neither says (then only the engine configuration is compared).
    pub mode: Option<Mode>,
    /// The environment at capture (JSON goldens).
    pub env: BTreeMap<String, String>,
    /// Which row of a numpy golden (entry of a golden set) was used.
    pub row: Option<usize>,
    /// The model's manifest at capture (JSON goldens recorded with it).
    pub model_manifest: Option<ModelManifest>,
}

/// Reads the golden at `loc` ([`read`]: bounded, a regular file only,
/// never blocking) for a case whose prompt is `prompt` (text, when the case
/// gives text) and whose run produced `prompt_ids`.
///
/// Errors (text for the report): unreadable or malformed file; for numpy
/// goldens, no row that is this prompt.
pub fn load(loc: &Location, prompt: Option<&str>, prompt_ids: &[i64]) -> Result<Loaded, String> {
    let bytes = read(loc)?;
    load_from(loc, &bytes, prompt, prompt_ids)
}

/// [`load`] of the golden at `loc` whose bytes `bytes` were read already
/// ([`read`]).
///
/// Errors: as [`load`].
pub fn load_from(
    loc: &Location,
    bytes: &[u8],
    prompt: Option<&str>,
    prompt_ids: &[i64],
) -> Result<Loaded, String> {
    let show = loc.path.display();
    match loc.kind {
        Kind::Json => {
            let value: Value = serde_json::from_slice(bytes)
                .map_err(|e| format!("golden {show} is not a golden JSON ({e})"))?;
            let (entry, g) = if value.get("entries").is_some() {
                let set: GoldenSet = serde_json::from_value(value)
                    .map_err(|e| format!("golden {show} is not a golden set JSON ({e})"))?;
                let (i, g) = pick_entry(set, prompt, prompt_ids)
                    .map_err(|e| format!("golden {show}: {e}"))?;
                (Some(i), g)
            } else {
                let g: Golden = serde_json::from_value(value)
                    .map_err(|e| format!("golden {show} is not a golden JSON ({e})"))?;
                (None, g)
            };
            let engine_config = match g.engine_config {
                Some(Value::Object(m)) => Some(m),
                Some(Value::Null) | None => None,
                Some(other) => {
                    return Err(format!(
                        "golden {show}: engine_config is not an object: {other}"
                    ));
                }
            };
            Ok(Loaded {
                prompt_token_ids: g.prompt_token_ids,
                prompt: g.prompt,
                output_token_ids: g.output_token_ids,
                logprobs: g.logprobs,
                mode: g
                    .mode
                    .or_else(|| engine_config.as_ref().and_then(mode_of_config)),
                engine_config,
                config_is_partial: false,
                env: g.env,
                row: entry,
                model_manifest: g.model_manifest,
            })
        }
        Kind::Npy => {
            let rows = npy::parse(bytes)
                .and_then(|a| a.rows())
                .map_err(|e| format!("numpy golden {show} {e}"))?;
            let manifest_path = loc.manifest().unwrap_or_default();
            let manifest: Option<Value> = match regular_file::read(&manifest_path, MAX_GOLDEN_JSON)
            {
                Ok(t) => Some(
                    serde_json::from_slice(&t)
                        .map_err(|e| format!("{} is not JSON ({e})", manifest_path.display()))?,
                ),
                Err(ReadError::Missing) => None,
                Err(e) => {
                    return Err(format!(
                        "the manifest {} of numpy golden {show} {e}",
                        manifest_path.display()
                    ));
                }
            };
            let row = pick_row(manifest.as_ref(), rows.len(), prompt, prompt_ids).map_err(|e| {
                format!(
                    "numpy golden {show} (manifest {}): {e}",
                    manifest_path.display()
                )
            })?;
            let mut ids = rows.get(row.index).cloned().unwrap_or_default();
            while ids.last().is_some_and(|&t| t < 0) {
                ids.pop(); // padding after an early stop
            }
            let engine_config = manifest.as_ref().and_then(|m| {
                m.get("engine_config")
                    .or_else(|| m.get("engine_args"))
                    .and_then(Value::as_object)
                    .cloned()
            });
            let mode = manifest
                .as_ref()
                .and_then(|m| m.get("mode"))
                .and_then(|m| serde_json::from_value(m.clone()).ok())
                .or_else(|| engine_config.as_ref().and_then(mode_of_config));
            Ok(Loaded {
                mode,
                prompt_token_ids: row.prompt_token_ids,
                prompt: row.prompt,
                output_token_ids: ids,
                logprobs: Vec::new(),
                engine_config,
                config_is_partial: true,
                env: BTreeMap::new(),
                row: Some(row.index),
                model_manifest: None,
            })
        }
    }
}

/// The row of a numpy golden that holds a case, and what the manifest says of it.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    /// 0-based row index.
    index: usize,
    /// The prompt text the manifest gives for it.
    prompt: Option<String>,
    /// The prompt ids the manifest gives for it.
    prompt_token_ids: Option<Vec<i64>>,
}

impl Row {
    fn at(index: usize, prompt: Option<String>, prompt_token_ids: Option<Vec<i64>>) -> Row {
        Row {
            index,
            prompt,
            prompt_token_ids,
        }
    }
}

/// Which row of an `[N, T]` numpy golden belongs to this prompt.
fn pick_row(
    manifest: Option<&Value>,
    n: usize,
    prompt: Option<&str>,
    prompt_ids: &[i64],
) -> Result<Row, String> {
    let as_ids = |v: &Value| -> Option<Vec<i64>> {
        v.as_array()
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
    };
    if let Some(m) = manifest {
        if let Some(list) = m.get("prompt_token_ids").and_then(Value::as_array) {
            let rows: Vec<Vec<i64>> = if list.iter().all(Value::is_number) {
                vec![as_ids(&Value::Array(list.clone())).unwrap_or_default()]
            } else {
                list.iter().map(|v| as_ids(v).unwrap_or_default()).collect()
            };
            check_rows(rows.len(), n, "prompt_token_ids")?;
            return rows
                .iter()
                .position(|r| r == prompt_ids)
                .map(|i| Row::at(i, None, Some(rows[i].clone())))
                .ok_or_else(|| {
                    format!("no row's prompt_token_ids is this case's prompt {prompt_ids:?}")
                });
        }
        let texts: Option<Vec<String>> = m
            .get("prompts")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|v| v.as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .or_else(|| {
                m.get("prompt")
                    .and_then(Value::as_str)
                    .map(|p| vec![p.to_string()])
            });
        if let (Some(texts), Some(want)) = (texts, prompt) {
            check_rows(texts.len(), n, "prompts")?;
            return texts
                .iter()
                .position(|t| t == want)
                .map(|i| Row::at(i, Some(texts[i].clone()), None))
                .ok_or_else(|| format!("no row's prompt is this case's prompt {want:?}"));
        }
    }
    if n == 1 {
        return Ok(Row::at(0, None, None));
    }
    Err(format!(
        "it has {n} rows and nothing says which is this case's prompt (give `prompts` or `prompt_token_ids` in manifest.json)"
    ))
}

fn check_rows(listed: usize, n: usize, key: &str) -> Result<(), String> {
    if listed == n {
        Ok(())
    } else {
        Err(format!(
            "`{key}` lists {listed} prompts but the array has {n} rows"
        ))
    }
}

/// The mode an engine configuration ran in, by its `enforce_eager`: `true`
/// is [`Mode::Eager`], `false` [`Mode::Compiled`]; `None` when it has no
/// boolean `enforce_eager`.
pub fn mode_of_config(cfg: &Map<String, Value>) -> Option<Mode> {
    cfg.get("enforce_eager")
        .and_then(Value::as_bool)
        .map(|eager| if eager { Mode::Eager } else { Mode::Compiled })
}

/// The `mode` difference between a golden recorded in `golden` and a case
/// running in `now`, as a [`ConfigDiff`] keyed `mode`; `None` when they
/// agree or the golden's mode is unknown.
pub fn mode_diff(golden: Option<Mode>, now: Mode) -> Option<ConfigDiff> {
    golden.filter(|g| *g != now).map(|g| ConfigDiff {
        key: "mode".into(),
        golden: Value::String(g.as_str().into()),
        now: Value::String(now.as_str().into()),
    })
}

/// One engine setting that differs between a golden and this run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ConfigDiff {
    /// The engine argument, e.g. `max_num_seqs`.
    pub key: String,
    /// Its value when the golden was captured (null: absent).
    pub golden: Value,
    /// Its value now (null: absent).
    pub now: Value,
}

impl std::fmt::Display for ConfigDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Value| {
            if v.is_null() {
                "(absent)".to_string()
            } else {
                v.to_string()
            }
        };
        write!(
            f,
            "{}: golden {} vs now {}",
            self.key,
            show(&self.golden),
            show(&self.now)
        )
    }
}

/// The engine settings on which `golden` and `now` differ, host-local keys
/// ([`HOST_LOCAL_KEYS`]) aside. With `partial` only the golden's keys are
/// compared (a manifest lists the arguments passed, not every default).
/// Numbers compare by value (`1` equals `1.0`).
pub fn config_diffs(
    golden: &Map<String, Value>,
    now: &Map<String, Value>,
    partial: bool,
) -> Vec<ConfigDiff> {
    let mut keys: Vec<&String> = golden.keys().collect();
    if !partial {
        keys.extend(now.keys().filter(|k| !golden.contains_key(*k)));
    }
    keys.sort();
    keys.into_iter()
        .filter(|k| !HOST_LOCAL_KEYS.contains(&k.as_str()))
        .filter_map(|k| {
            let g = golden.get(k).cloned().unwrap_or(Value::Null);
            let n = now.get(k).cloned().unwrap_or(Value::Null);
            (!same_value(&g, &n)).then(|| ConfigDiff {
                key: k.clone(),
                golden: g,
                now: n,
            })
        })
        .collect()
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// The first divergence between a golden and this run's output.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GoldenDiff {
    /// 0-based index into the generated tokens.
    pub position: usize,
    /// The golden's token there (null: the golden ended).
    pub golden_token: Option<i64>,
    /// Its text, when known.
    pub golden_text: Option<String>,
    /// This run's token there (null: this run ended).
    pub token: Option<i64>,
    /// Its text, when known.
    pub text: Option<String>,
    /// logprob(this run's token) - logprob(golden's token) in this run's
    /// distribution at that step; null when the golden's token is not in this run's top-k.
    pub gap_nats: Option<f64>,
    /// When the golden's token is outside this run's top-k: the gap is at least this.
    pub gap_at_least_nats: Option<f64>,
    /// logprob(golden's token) - logprob(this run's token) in the golden's own
    /// recorded distribution (JSON goldens with log-probabilities).
    pub golden_gap_nats: Option<f64>,
    /// True when a known gap is under `near_tie_nats`: the two tokens were
    /// nearly tied, so the flip says little about drift.
    pub near_tie: bool,
    /// The recipe's threshold (`smoke.near_tie_nats`).
    pub near_tie_nats: f64,
}

fn logprob_of(step: Option<&Vec<TopLogprob>>, id: i64) -> Option<&TopLogprob> {
    step?.iter().find(|e| e.id == id)
}

/// Compares `ours` with `golden` (token ids, and each side's per-step top-k)
/// and describes the first divergence; `None` when they are equal.
pub fn diff(
    golden: &[i64],
    golden_logprobs: &[Vec<TopLogprob>],
    ours: &[i64],
    our_logprobs: &[Vec<TopLogprob>],
    near_tie_nats: f64,
) -> Option<GoldenDiff> {
    if golden == ours {
        return None;
    }
    let position = super::first_divergence(golden, ours);
    let g = golden.get(position).copied();
    let o = ours.get(position).copied();
    let our_step = our_logprobs.get(position);
    let golden_step = golden_logprobs.get(position);
    let text_of = |id: Option<i64>| {
        let id = id?;
        logprob_of(our_step, id)
            .or_else(|| logprob_of(golden_step, id))
            .and_then(|e| e.token.clone())
    };
    let mut gap_nats = None;
    let mut gap_at_least_nats = None;
    let mut golden_gap_nats = None;
    if let (Some(g), Some(o)) = (g, o) {
        let ours_lp = logprob_of(our_step, o).and_then(|e| e.logprob);
        match (ours_lp, logprob_of(our_step, g).and_then(|e| e.logprob)) {
            (Some(a), Some(b)) => gap_nats = Some(a - b),
            (Some(a), None) => {
                gap_at_least_nats = our_step
                    .and_then(|s| s.iter().filter_map(|e| e.logprob).reduce(f64::min))
                    .map(|lowest| a - lowest);
            }
            _ => {}
        }
        if let (Some(a), Some(b)) = (
            logprob_of(golden_step, g).and_then(|e| e.logprob),
            logprob_of(golden_step, o).and_then(|e| e.logprob),
        ) {
            golden_gap_nats = Some(a - b);
        }
    }
    let near_tie = [gap_nats, golden_gap_nats]
        .into_iter()
        .flatten()
        .any(|gap| gap.abs() < near_tie_nats);
    Some(GoldenDiff {
        position,
        golden_token: g,
        golden_text: text_of(g),
        token: o,
        text: text_of(o),
        gap_nats,
        gap_at_least_nats,
        golden_gap_nats,
        near_tie,
        near_tie_nats,
    })
}

/// How a case's output stands against its golden (`CaseResult::golden`),
/// serialized as `matched`, `mismatched`, `refused`, `missing`,
/// `unreadable`, `recorded`, `not compared` or `none`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum GoldenState {
    /// No golden exists for the case (and the recipe names none).
    None,
    /// A golden exists, but the case failed before it could be compared.
    #[serde(rename = "not compared")]
    NotCompared,
    /// The output matched the golden.
    Matched,
    /// The output differs from the golden (see `golden_diff`).
    Mismatched,
    /// The golden was recorded under another engine configuration or prompt.
    Refused,
    /// The recipe names a golden that does not exist.
    Missing,
    /// The golden cannot be read.
    Unreadable,
    /// `--record-golden` wrote the case's output as its golden.
    Recorded,
}

impl GoldenState {
    /// Every state, in declaration order.
    pub const ALL: [GoldenState; 8] = [
        GoldenState::None,
        GoldenState::NotCompared,
        GoldenState::Matched,
        GoldenState::Mismatched,
        GoldenState::Refused,
        GoldenState::Missing,
        GoldenState::Unreadable,
        GoldenState::Recorded,
    ];

    /// The name as recorded in `oracle.json` and `--json`.
    pub fn as_str(self) -> &'static str {
        match self {
            GoldenState::None => "none",
            GoldenState::NotCompared => "not compared",
            GoldenState::Matched => "matched",
            GoldenState::Mismatched => "mismatched",
            GoldenState::Refused => "refused",
            GoldenState::Missing => "missing",
            GoldenState::Unreadable => "unreadable",
            GoldenState::Recorded => "recorded",
        }
    }
}

impl std::fmt::Display for GoldenState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares `result` with the golden at `loc` (if any), recording the
/// outcome in `result.golden` and, when it is not a match, the problem.
pub(super) fn compare_golden(result: &mut CaseResult, loc: &golden::Location, near_tie: f64) {
    if !loc.path.exists() {
        if loc.explicit {
            result.golden = GoldenState::Missing;
            result.problems.push(format!(
                "golden {} named by the recipe does not exist (record it with `oracle-build smoke <PIN> --record-golden`)",
                loc.path.display()
            ));
        }
        return;
    }
    let g = match golden::load(loc, result.prompt.as_deref(), &result.prompt_token_ids) {
        Ok(g) => g,
        Err(e) => {
            result.golden = GoldenState::Unreadable;
            result.problems.push(e);
            return;
        }
    };
    let mut refused = Vec::new();
    if let Some(ids) = g
        .prompt_token_ids
        .as_ref()
        .filter(|ids| **ids != result.prompt_token_ids)
    {
        refused.push(format!(
            "it was recorded for prompt ids {ids:?}, this case's prompt is {:?}",
            result.prompt_token_ids
        ));
    }
    // The mode first: an eager golden never gates a compiled run (nor the
    // reverse), whatever else the engine reads back.
    result.config_diffs = golden::mode_diff(g.mode, result.mode).into_iter().collect();
    match (&g.engine_config, result.engine_config.as_object()) {
        (Some(gc), Some(now)) => {
            let diffs = golden::config_diffs(gc, now, g.config_is_partial);
            result.config_diffs.extend(diffs);
        }
        (None, _) => result.notes.push(format!(
            "golden {} records no engine configuration; compared without checking it",
            loc.path.display()
        )),
        (Some(_), None) => refused.push("the engine configuration was not read back".into()),
    }
    if !result.config_diffs.is_empty() {
        refused.push(format!(
            "it was recorded under a different engine configuration: {}",
            result
                .config_diffs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    // The model's files: a golden recorded on other files says nothing of
    // this oracle.
    match (&g.model_manifest, &result.model_manifest) {
        (Some(gm), Some(now)) => {
            let d = model::diff(gm, now);
            if d.is_empty() {
                result.model_check = Some(ModelCheck::Matched);
                if let Some((was, is)) = &d.revision {
                    result.notes.push(format!(
                        "the model is hub revision {is}, the golden's was {was}; every file is the same"
                    ));
                }
            } else {
                result.model_check = Some(ModelCheck::Differs);
                refused.push(format!("it was recorded on other model files: {d}"));
                result.model_diff = Some(d);
            }
        }
        (Some(_), None) => {
            // The model's files could not be hashed: that failed the case.
            result.model_check = Some(ModelCheck::NotChecked);
            result.notes.push(format!(
                "the model's files could not be hashed, so they were not checked against golden {}",
                loc.path.display()
            ));
        }
        (None, _) => {
            result.model_check = Some(ModelCheck::NotChecked);
            result.notes.push(format!(
                "golden {} records no model manifest (recorded before the model's files were; or a numpy golden): the model was not checked",
                loc.path.display()
            ));
        }
    }
    if !refused.is_empty() {
        result.golden = GoldenState::Refused;
        result.problems.push(format!(
            "golden {} refused for comparison: {}",
            loc.path.display(),
            refused.join("; ")
        ));
        return;
    }
    if !g.env.is_empty() && g.env != result.env {
        result.notes.push(format!(
            "the golden was captured with environment {:?}, this run used {:?}",
            g.env, result.env
        ));
    }
    match golden::diff(
        &g.output_token_ids,
        &g.logprobs,
        &result.output_token_ids,
        &result.logprobs,
        near_tie,
    ) {
        None => result.golden = GoldenState::Matched,
        Some(d) => {
            result.golden = GoldenState::Mismatched;
            result.problems.push(format!(
                "output differs from golden {}{}: {}",
                loc.path.display(),
                g.row.map_or(String::new(), |r| format!(" row {r}")),
                describe_diff(&d)
            ));
            result.golden_diff = Some(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_states_serialize_to_their_recorded_names() {
        for g in GoldenState::ALL {
            let json = serde_json::to_value(g).unwrap();
            assert_eq!(json, serde_json::Value::String(g.as_str().into()), "{g:?}");
            let back: GoldenState = serde_json::from_value(json).unwrap();
            assert_eq!(back, g);
        }
        assert_eq!(GoldenState::NotCompared.as_str(), "not compared");
        assert!(serde_json::from_str::<GoldenState>("\"not-compared\"").is_err());
    }

    #[test]
    fn check_json_takes_a_golden_or_a_set_and_names_what_else_is() {
        assert_eq!(check_json(br#"{"output_token_ids": [1, 2]}"#), Ok(()));
        assert_eq!(
            check_json(br#"{"format": "x", "case": "c", "entries": [{"output_token_ids": []}]}"#),
            Ok(())
        );
        let e = check_json(b"not json").unwrap_err();
        assert!(e.starts_with("is not a golden JSON ("), "{e}");
        let e = check_json(br#""a string""#).unwrap_err();
        assert!(e.starts_with("is not a golden JSON ("), "{e}");
        let e = check_json(br#"{"entries": 3}"#).unwrap_err();
        assert!(e.starts_with("is not a golden set JSON ("), "{e}");
        let e = check_json(br#"{"output_token_ids": [], "engine_config": 3}"#).unwrap_err();
        assert_eq!(e, "has an engine_config that is not an object: 3");
    }
    use serde_json::json;

    fn lp(id: i64, logprob: f64) -> TopLogprob {
        TopLogprob {
            id,
            logprob: Some(logprob),
            rank: None,
            token: Some(format!("t{id}")),
        }
    }

    #[test]
    fn gap_and_near_tie_at_the_first_divergence() {
        let ours = vec![vec![lp(5, -0.1)], vec![lp(25, -0.69), lp(16, -0.99)]];
        let d = diff(&[5, 16], &[], &[5, 25], &ours, 1.0).unwrap();
        assert_eq!(d.position, 1);
        assert_eq!((d.golden_token, d.token), (Some(16), Some(25)));
        assert!((d.gap_nats.unwrap() - 0.3).abs() < 1e-9);
        assert!(d.near_tie);
        let d = diff(&[5, 16], &[], &[5, 25], &ours, 0.2).unwrap();
        assert!(!d.near_tie);
        assert!(diff(&[5, 25], &[], &[5, 25], &ours, 1.0).is_none());
    }

    #[test]
    fn a_token_outside_the_top_k_gives_a_lower_bound() {
        let ours = vec![vec![lp(25, -0.5), lp(3, -4.5)]];
        let d = diff(&[16], &[], &[25], &ours, 1.0).unwrap();
        assert_eq!(d.gap_nats, None);
        assert_eq!(d.gap_at_least_nats, Some(4.0));
        assert!(!d.near_tie);
    }

    #[test]
    fn a_golden_without_a_mode_has_the_mode_its_enforce_eager_says() {
        let dir = tempfile::tempdir().unwrap();
        let loc = Location {
            path: dir.path().join("c.json"),
            explicit: false,
            kind: Kind::Json,
        };
        for (golden, mode) in [
            (
                json!({"output_token_ids": [1], "mode": "compiled"}),
                Some(Mode::Compiled),
            ),
            (
                json!({"output_token_ids": [1], "engine_config": {"enforce_eager": true}}),
                Some(Mode::Eager),
            ),
            (
                json!({"output_token_ids": [1], "engine_config": {"enforce_eager": false}}),
                Some(Mode::Compiled),
            ),
            (
                json!({"output_token_ids": [1], "engine_config": {"dtype": "auto"}}),
                None,
            ),
        ] {
            std::fs::write(&loc.path, golden.to_string()).unwrap();
            assert_eq!(load(&loc, None, &[]).unwrap().mode, mode, "{golden}");
        }
        assert_eq!(mode_diff(None, Mode::Compiled), None);
        assert_eq!(mode_diff(Some(Mode::Eager), Mode::Eager), None);
        let d = mode_diff(Some(Mode::Eager), Mode::Compiled).unwrap();
        assert_eq!(d.to_string(), "mode: golden \"eager\" vs now \"compiled\"");
    }

    #[test]
    fn config_diffs_name_keys_and_skip_host_paths() {
        let g = json!({"max_num_seqs": 1, "dtype": "bfloat16", "model": "/a", "gpu_memory_utilization": 0.5});
        let n = json!({"max_num_seqs": 4, "dtype": "bfloat16", "model": "/b", "gpu_memory_utilization": 0.5, "seed": 0});
        let (g, n) = (g.as_object().unwrap(), n.as_object().unwrap());
        let full: Vec<String> = config_diffs(g, n, false)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            full,
            [
                "max_num_seqs: golden 1 vs now 4",
                "seed: golden (absent) vs now 0"
            ]
        );
        assert_eq!(config_diffs(g, n, true).len(), 1);
        let one = json!({"x": 1});
        let one_f = json!({"x": 1.0});
        assert!(
            config_diffs(one.as_object().unwrap(), one_f.as_object().unwrap(), false).is_empty()
        );
    }

    #[test]
    fn numpy_rows_are_picked_by_prompt() {
        let m = json!({"prompts": ["a b", "The capital"]});
        assert_eq!(
            pick_row(Some(&m), 2, Some("The capital"), &[])
                .unwrap()
                .index,
            1
        );
        assert!(
            pick_row(Some(&m), 2, Some("nope"), &[])
                .unwrap_err()
                .contains("nope")
        );
        assert!(pick_row(Some(&m), 3, Some("a b"), &[]).is_err());
        let ids = json!({"prompt_token_ids": [[1, 2], [3, 4]]});
        assert_eq!(pick_row(Some(&ids), 2, None, &[3, 4]).unwrap().index, 1);
        assert_eq!(pick_row(None, 1, None, &[]).unwrap().index, 0);
        assert!(pick_row(None, 2, None, &[]).is_err());
    }
}
