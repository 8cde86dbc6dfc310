//! The online leg of the gate (`smoke.serve`): each named offline case run
//! through the oracle's own server, as a harness runs it.
//!
//! For each case, after the offline cases: `<venv>/bin/<command> serve
//! <model> --host 127.0.0.1 --port <free port>` plus `smoke.serve.args`,
//! under the offline cases' environment (the recipe's `smoke.env` and the
//! case's `env`, the confinement of [`super::confine`]: caches, `HOME`,
//! `TMPDIR`, offline, `PATH` with the oracle's `bin/` first; as the
//! driver's `python -I -B`, no `PYTHONPATH`/`PYTHONHOME`, no user site, no
//! bytecode written), from an empty
//! directory, in a process group of its own
//! ([`crate::host::process::Background`], which says what stops it when
//! the gate is killed). The gate polls `GET /health` until it answers 200
//! (at most `timeout_s`), sends the case's prompt to `POST /v1/completions`
//! (`temperature: 0`, the case's `max_tokens`, `logprobs: smoke.logprobs`,
//! vLLM's `return_token_ids: true`), reads at most [`MAX_BODY`] bytes of the
//! answer, stops the server's group, and compares its tokens with the
//! case's golden, or with this run's offline tokens when there is none
//! ([`super::golden::diff`]: identical, near-tie, drift). The server's
//! tokens are `choices[0].token_ids`, else its `logprobs.tokens` when they
//! are vLLM's `token_id:N` strings (`--return-tokens-as-token-ids`).
//!
//! A server that never answers `/health` in time, or cannot be started, is
//! an instrument failure (the gate exits 1); one that exits, answers an
//! error or other tokens fails the gate (exit 4). Goldens are never
//! recorded from the server.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{Value, json};

use super::confine::{self, EngineDirs, KVCACHE_VAR};
use super::golden::{self, Location};
use super::report::{CaseResult, ServeOutcome, ServeResult, TopLogprob, describe_diff};
use crate::host::process::{Background, start_background, tail};
use crate::progress;
use crate::recipe::{Case, LoadedRecipe, Serve, expand_env};

/// The most bytes of one answer of the server that are read.
pub const MAX_BODY: usize = 16 << 20;

/// How long one `GET /health` may take before it counts as no answer.
const HEALTH_TRY: Duration = Duration::from_secs(2);

/// The pause between two `GET /health` tries.
const HEALTH_PAUSE: Duration = Duration::from_millis(200);

/// Lines of the server's log kept in a result that did not pass.
const LOG_TAIL: usize = 20;

/// Serves `case` with the oracle at `venv` as `serve` says and compares the
/// server's tokens with the golden at `loc` (unless `recording`), else with
/// `offline`'s tokens. The server's log is `<out_dir>/serve-<case>.log`.
///
/// Errors: only the tool's own failures (a directory cannot be made);
/// everything the server does is in the result.
#[allow(clippy::too_many_arguments)]
pub(super) fn serve_case(
    venv: &Path,
    lr: &LoadedRecipe,
    serve: &Serve,
    case: &Case,
    offline: Option<&CaseResult>,
    loc: &Location,
    recording: bool,
    out_dir: &Path,
    engine: &mut EngineDirs,
) -> Result<ServeResult> {
    let recipe = &lr.recipe;
    let name = format!("serve-{}", case.name);
    let mut r = ServeResult {
        case: case.name.clone(),
        ok: false,
        outcome: ServeOutcome::Skipped,
        command: Vec::new(),
        port: None,
        pid: None,
        start_s: None,
        latency_s: None,
        compared_with: None,
        prompt_token_ids: Vec::new(),
        output_token_ids: Vec::new(),
        text: None,
        diff: None,
        problems: Vec::new(),
        instrument_failure: None,
        notes: Vec::new(),
        log: out_dir.join(format!("{name}.log")),
        log_tail: Vec::new(),
    };
    // What the server is compared with: the golden, else this run's tokens.
    let reference = match reference(case, offline, loc, recording) {
        Ok(Some(rf)) => rf,
        Ok(None) => {
            r.notes.push(
                "not served: the case has no golden and its offline run produced no tokens to compare with".into(),
            );
            return Ok(r);
        }
        Err(e) => {
            r.outcome = ServeOutcome::Failed;
            r.problems.push(e);
            return Ok(r);
        }
    };
    r.compared_with = Some(reference.what.clone());
    let Ok(model) = expand_env(&case.model) else {
        r.notes
            .push("not served: the model path cannot be expanded".into());
        return Ok(r);
    };
    let program = venv.join("bin").join(&serve.command);
    if !program.is_file() {
        r.outcome = ServeOutcome::Failed;
        r.problems.push(format!(
            "the oracle has no {} (smoke.serve.command: {:?})",
            program.display(),
            serve.command
        ));
        return Ok(r);
    }
    let port = match free_port() {
        Ok(p) => p,
        Err(e) => {
            r.outcome = ServeOutcome::InstrumentFailure;
            r.instrument_failure = Some(format!("no free port on 127.0.0.1: {e}"));
            return Ok(r);
        }
    };
    r.port = Some(port);
    let mut args: Vec<String> = vec![
        "serve".into(),
        model.clone(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
    ];
    args.extend(serve.args.iter().cloned());
    r.command = std::iter::once(program.to_string_lossy().into_owned())
        .chain(args.iter().cloned())
        .collect();

    let mut env = recipe.smoke.env.clone();
    if let Some(kv) = confine::kv_cache_space(lr) {
        env.insert(KVCACHE_VAR.into(), kv.gib);
    }
    env.extend(case.env.clone());
    let run = engine.run_env(&name)?;
    let mut cmd = duct::cmd(&program, &args)
        .dir(&run.tmp)
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME");
    for (k, v) in env.iter().chain(&run.env) {
        cmd = cmd.env(k, v);
    }
    // As the driver's `-I -B`: no bytecode written into the oracle, no user site.
    cmd = cmd
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONNOUSERSITE", "1");
    cmd = cmd.env(
        "PATH",
        confine::engine_path(&venv.join("bin"), env.get("PATH").map(String::as_str)),
    );
    progress::stage(
        "smoke",
        format!(
            "serve {}: {} serve on 127.0.0.1:{port}",
            case.name, serve.command
        ),
    );
    let t0 = Instant::now();
    let outcome = match start_background(cmd, &r.log) {
        Err(e) => {
            r.outcome = ServeOutcome::InstrumentFailure;
            r.instrument_failure = Some(format!("{} cannot be started: {e:#}", program.display()));
            None
        }
        Ok(server) => {
            r.pid = server.pid();
            let body = request_body(lr, case, &model, offline);
            let res = talk(&server, port, serve.timeout_s, &body, t0);
            server.stop();
            Some(res)
        }
    };
    engine.finish_run(run);
    match outcome {
        None => {}
        Some(Talk::NeverUp(why)) => {
            r.outcome = ServeOutcome::InstrumentFailure;
            r.instrument_failure = Some(why);
        }
        Some(Talk::Failed { start_s, why }) => {
            r.start_s = start_s;
            r.outcome = ServeOutcome::Failed;
            r.problems.push(why);
        }
        Some(Talk::Answered {
            start_s,
            latency_s,
            body,
        }) => {
            r.start_s = Some(start_s);
            r.latency_s = Some(latency_s);
            match parse_completion(&body, &reference.logprobs) {
                Err(e) => {
                    r.outcome = ServeOutcome::Failed;
                    r.problems
                        .push(format!("the server's answer cannot be read: {e}"));
                }
                Ok(served) => {
                    r.prompt_token_ids = served.prompt_token_ids;
                    r.output_token_ids = served.output_token_ids;
                    r.text = served.text;
                    match golden::diff(
                        &reference.output_token_ids,
                        &reference.logprobs,
                        &r.output_token_ids,
                        &served.logprobs,
                        recipe.smoke.near_tie_nats,
                    ) {
                        None => {
                            r.outcome = ServeOutcome::Identical;
                            r.ok = true;
                        }
                        Some(d) => {
                            r.outcome = if d.near_tie {
                                ServeOutcome::NearTie
                            } else {
                                ServeOutcome::Drift
                            };
                            r.problems.push(format!(
                                "the server's tokens differ from {}: {}",
                                reference.what,
                                describe_diff(&d)
                            ));
                            r.diff = Some(d);
                        }
                    }
                }
            }
        }
    }
    if !r.ok {
        r.log_tail = tail(
            &std::fs::read_to_string(&r.log).unwrap_or_default(),
            LOG_TAIL,
        )
        .lines()
        .map(str::to_string)
        .collect();
    }
    Ok(r)
}

/// What a served case is compared with.
struct Reference {
    /// `golden <path>` or `this run's offline tokens`.
    what: String,
    output_token_ids: Vec<i64>,
    logprobs: Vec<Vec<TopLogprob>>,
}

/// The case's golden (when one exists and the run does not record), else
/// the offline run's tokens; `None` when there is neither.
///
/// Errors: the golden cannot be read (its message).
fn reference(
    case: &Case,
    offline: Option<&CaseResult>,
    loc: &Location,
    recording: bool,
) -> Result<Option<Reference>, String> {
    let prompt_ids = offline.map_or(&[][..], |o| o.prompt_token_ids.as_slice());
    if !recording && loc.path.exists() {
        let g = golden::load(loc, case.prompt.as_deref(), prompt_ids)?;
        return Ok(Some(Reference {
            what: format!("golden {}", loc.path.display()),
            output_token_ids: g.output_token_ids,
            logprobs: g.logprobs,
        }));
    }
    Ok(offline
        .filter(|o| o.runs > 0 && !o.output_token_ids.is_empty())
        .map(|o| Reference {
            what: "this run's offline tokens".into(),
            output_token_ids: o.output_token_ids.clone(),
            logprobs: o.logprobs.clone(),
        }))
}

/// A port on 127.0.0.1 free a moment ago (the kernel's choice; another
/// process may take it before the server binds: the server then fails to
/// start and the case says so).
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// The `POST /v1/completions` body for `case`: its prompt (text, or token
/// ids), greedy, its `max_tokens`, the recipe's `logprobs`, vLLM's
/// `return_token_ids`.
fn request_body(
    lr: &LoadedRecipe,
    case: &Case,
    model: &str,
    offline: Option<&CaseResult>,
) -> Value {
    let prompt = match (&case.prompt, &case.prompt_token_ids) {
        (Some(p), _) => json!(p),
        (None, Some(ids)) => json!(ids),
        (None, None) => json!(
            offline
                .map(|o| o.prompt_token_ids.clone())
                .unwrap_or_default()
        ),
    };
    let mut body = json!({
        "model": model,
        "prompt": prompt,
        "temperature": 0,
        "max_tokens": case.max_tokens,
        "return_token_ids": true,
    });
    if lr.recipe.smoke.logprobs > 0 {
        body["logprobs"] = json!(lr.recipe.smoke.logprobs);
    }
    body
}

/// How the exchange with a server went.
enum Talk {
    /// `/health` never answered 200 within the timeout.
    NeverUp(String),
    /// The server exited, or the completion request failed.
    Failed { start_s: Option<f64>, why: String },
    /// The completion's JSON answer.
    Answered {
        start_s: f64,
        latency_s: f64,
        body: Value,
    },
}

/// Waits for `server` to answer `GET /health` (at most `timeout_s` from
/// `t0`), then sends `body` to `/v1/completions` (at most `timeout_s`).
fn talk(server: &Background, port: u16, timeout_s: u64, body: &Value, t0: Instant) -> Talk {
    let timeout = Duration::from_secs(timeout_s);
    let base = format!("http://127.0.0.1:{port}");
    let fut = async {
        let client = match crate::host::http::client_builder()
            .no_proxy()
            .connect_timeout(HEALTH_TRY)
            .build()
        {
            Ok(c) => c,
            Err(e) => return Talk::NeverUp(format!("no HTTP client: {e}")),
        };
        loop {
            if let Some(status) = server.exited() {
                return Talk::Failed {
                    start_s: None,
                    why: format!("the server exited ({status}) before answering GET /health"),
                };
            }
            let up = client
                .get(format!("{base}/health"))
                .timeout(HEALTH_TRY)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if up {
                break;
            }
            if t0.elapsed() >= timeout {
                return Talk::NeverUp(format!(
                    "the server did not answer GET /health on 127.0.0.1:{port} within {timeout_s} s (smoke.serve.timeout_s)"
                ));
            }
            tokio::time::sleep(HEALTH_PAUSE).await;
        }
        let start_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let failed = |why: String| Talk::Failed {
            start_s: Some(start_s),
            why,
        };
        let resp = match client
            .post(format!("{base}/v1/completions"))
            .timeout(timeout)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => return failed(format!("POST /v1/completions failed: {e}")),
        };
        let status = resp.status();
        let bytes = match read_bounded(resp).await {
            Ok(b) => b,
            Err(e) => return failed(format!("POST /v1/completions: {e}")),
        };
        let latency_s = t1.elapsed().as_secs_f64();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(2000)]).into_owned();
            return failed(format!("POST /v1/completions answered {status}: {text}"));
        }
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(body) => Talk::Answered {
                start_s,
                latency_s,
                body,
            },
            Err(e) => failed(format!("POST /v1/completions answered no JSON: {e}")),
        }
    };
    match crate::host::http::block_on(1, fut) {
        Ok(t) => t,
        Err(e) => Talk::NeverUp(format!("{e:#}")),
    }
}

/// The body of `resp`, at most [`MAX_BODY`] bytes.
///
/// Errors: a broken body, or one longer than [`MAX_BODY`].
async fn read_bounded(mut resp: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if out.len() + chunk.len() > MAX_BODY {
            return Err(format!("the answer is longer than {MAX_BODY} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The tokens of a completion answer.
#[derive(Debug, Default, PartialEq)]
struct Served {
    prompt_token_ids: Vec<i64>,
    output_token_ids: Vec<i64>,
    text: Option<String>,
    logprobs: Vec<Vec<TopLogprob>>,
}

/// Reads `choices[0]` of an OpenAI completion answer: `token_ids` (vLLM's
/// `return_token_ids`), else `logprobs.tokens` as `token_id:N` strings; the
/// per-step `top_logprobs` keyed by `token_id:N`, or by text, whose ids are
/// the step's own token's or found by text among `reference`'s same step
/// (others are left out).
///
/// Errors: no `choices[0]`, or no token ids in either form.
fn parse_completion(body: &Value, reference: &[Vec<TopLogprob>]) -> Result<Served, String> {
    let choice = body
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or("it has no choices[0]")?;
    let ids = |v: Option<&Value>| -> Option<Vec<i64>> {
        v?.as_array()?.iter().map(Value::as_i64).collect()
    };
    let lp = choice.get("logprobs").filter(|l| !l.is_null());
    let tokens: Vec<Option<&str>> = lp
        .and_then(|l| l.get("tokens"))
        .and_then(Value::as_array)
        .map(|t| t.iter().map(Value::as_str).collect())
        .unwrap_or_default();
    let output_token_ids = match ids(choice.get("token_ids")) {
        Some(v) => v,
        None => tokens
            .iter()
            .map(|t| t.and_then(token_id))
            .collect::<Option<Vec<i64>>>()
            .filter(|v| !v.is_empty())
            .ok_or(
                "choices[0] has no token_ids (vLLM's `return_token_ids`) and its logprobs.tokens are not `token_id:N` (`--return-tokens-as-token-ids`)",
            )?,
    };
    let token_logprobs: Vec<Option<f64>> = lp
        .and_then(|l| l.get("token_logprobs"))
        .and_then(Value::as_array)
        .map(|v| v.iter().map(Value::as_f64).collect())
        .unwrap_or_default();
    let top: Vec<Option<&serde_json::Map<String, Value>>> = lp
        .and_then(|l| l.get("top_logprobs"))
        .and_then(Value::as_array)
        .map(|v| v.iter().map(Value::as_object).collect())
        .unwrap_or_default();
    let mut logprobs = Vec::new();
    for (i, id) in output_token_ids.iter().enumerate() {
        let own_text = tokens.get(i).copied().flatten();
        let mut step: Vec<TopLogprob> = Vec::new();
        let entries = top.get(i).copied().flatten();
        for (key, value) in entries.into_iter().flatten() {
            let found = token_id(key)
                .or_else(|| (Some(key.as_str()) == own_text).then_some(*id))
                .or_else(|| {
                    reference
                        .get(i)?
                        .iter()
                        .find(|e| e.token.as_deref() == Some(key))
                        .map(|e| e.id)
                });
            if let Some(found) = found
                && !step.iter().any(|e| e.id == found)
            {
                step.push(TopLogprob {
                    id: found,
                    logprob: value.as_f64(),
                    rank: None,
                    token: token_id(key).is_none().then(|| key.clone()),
                });
            }
        }
        if !step.iter().any(|e| e.id == *id)
            && let Some(l) = token_logprobs.get(i).copied().flatten()
        {
            step.push(TopLogprob {
                id: *id,
                logprob: Some(l),
                rank: None,
                token: own_text
                    .filter(|t| token_id(t).is_none())
                    .map(str::to_string),
            });
        }
        logprobs.push(step);
    }
    if logprobs.iter().all(Vec::is_empty) {
        logprobs.clear();
    }
    Ok(Served {
        prompt_token_ids: ids(choice.get("prompt_token_ids")).unwrap_or_default(),
        output_token_ids,
        text: choice
            .get("text")
            .and_then(Value::as_str)
            .map(str::to_string),
        logprobs,
    })
}

/// `N` of vLLM's `token_id:N` token strings.
fn token_id(s: &str) -> Option<i64> {
    s.strip_prefix("token_id:")?.parse().ok()
}

/// One line for the printed report: outcome, start time, latency.
pub fn describe(s: &ServeResult) -> String {
    let secs = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2} s"));
    format!(
        "{}: {} (server up in {}, request {}; {} tokens vs {})",
        s.case,
        match s.outcome {
            ServeOutcome::Identical => "identical",
            ServeOutcome::NearTie => "near-tie flip",
            ServeOutcome::Drift => "DRIFT",
            ServeOutcome::Failed => "FAILED",
            ServeOutcome::InstrumentFailure => "INSTRUMENT FAILURE",
            ServeOutcome::Skipped => "skipped",
        },
        secs(s.start_s),
        secs(s.latency_s),
        s.output_token_ids.len(),
        s.compared_with.as_deref().unwrap_or("nothing"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(id: i64, token: &str, logprob: f64) -> TopLogprob {
        TopLogprob {
            id,
            logprob: Some(logprob),
            rank: None,
            token: Some(token.into()),
        }
    }

    #[test]
    fn token_ids_come_from_return_token_ids_or_token_id_strings() {
        // vLLM with `return_token_ids: true`: ids beside text-keyed logprobs,
        // the other candidate's id found by its text in the reference.
        let body = json!({"choices": [{"text": " a b", "token_ids": [7, 9],
            "prompt_token_ids": [1, 2],
            "logprobs": {"tokens": [" a", " b"], "token_logprobs": [-0.1, -0.5],
                "top_logprobs": [{" a": -0.1, " z": -2.0}, {" b": -0.5, " q": -3.0}]}}]});
        let reference = vec![vec![lp(7, " a", -0.1), lp(3, " z", -2.0)]];
        let s = parse_completion(&body, &reference).unwrap();
        assert_eq!(s.output_token_ids, vec![7, 9]);
        assert_eq!(s.prompt_token_ids, vec![1, 2]);
        assert_eq!(s.text.as_deref(), Some(" a b"));
        let ids: Vec<Vec<i64>> = s
            .logprobs
            .iter()
            .map(|st| st.iter().map(|e| e.id).collect())
            .collect();
        assert_eq!(ids, vec![vec![7, 3], vec![9]]);
        // `--return-tokens-as-token-ids`, no `token_ids`.
        let body = json!({"choices": [{"text": "",
            "logprobs": {"tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-0.1, -0.5],
                "top_logprobs": [{"token_id:7": -0.1, "token_id:3": -2.0}, null]}}]});
        let s = parse_completion(&body, &[]).unwrap();
        assert_eq!(s.output_token_ids, vec![7, 9]);
        assert_eq!(
            s.logprobs[0].iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![7, 3]
        );
        assert_eq!(s.logprobs[1][0].logprob, Some(-0.5));
        // Neither: named.
        let e = parse_completion(&json!({"choices": [{"text": "x"}]}), &[]).unwrap_err();
        assert!(e.contains("return_token_ids"), "{e}");
        assert!(parse_completion(&json!({"error": "x"}), &[]).is_err());
        assert!(parse_completion(&json!({"choices": [{"token_ids": ["x"]}]}), &[]).is_err());
    }
}
