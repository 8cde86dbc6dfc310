//! The gate's online leg (`smoke.serve`, issue 38): the real binary serves
//! a case with the fixture oracle's own server (`fixturellm serve`, an
//! OpenAI-compatible `http.server` over the offline engine) and compares
//! its tokens with the offline golden.

use std::time::{Duration, Instant};

use crate::support::*;
use serde_json::Value;

const PROMPT: &str = "The capital of France is Paris, and the";

/// A recipe smoke section: case `small` on `model` with `case_env` (a YAML
/// flow map), served by `fixturellm` with `--max-model-len 256` and
/// `serve_extra` (flow-map entries, or further arguments after `args`).
fn smoke_yaml(smoke_env: &str, case_env: &str, serve_extra: &str) -> String {
    format!(
        "smoke:\n  runs: 2\n  env: {smoke_env}\n  cases:\n    - name: small\n      model: ${{FX_MODELS}}/model\n      prompt: \"{PROMPT}\"\n      max_tokens: 16\n      engine_args: {{enforce_eager: true, max_model_len: 256}}\n      env: {case_env}\n  serve: {{cases: [small], command: fixturellm, args: [--max-model-len, \"256\"{serve_extra}}}\n"
    )
}

/// A fixture oracle built (`--no-smoke`) from recipe `fx.yaml` with `smoke`.
fn built(smoke: &str) -> (Fx, std::path::PathBuf, String) {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    fx.recipe("fx", &repo, &commit, smoke);
    fx.exits(&["build", "fx.yaml", "--no-smoke"], 4);
    (fx, repo, commit)
}

fn serve0(report: &Value) -> &Value {
    &report["smoke"]["serve"][0]
}

#[test]
fn a_served_case_gates_against_its_offline_golden_and_drifts_when_the_server_differs() {
    let (fx, repo, commit) = built(&smoke_yaml("{}", "{}", "]"));
    // Recording: the server is compared with this run's offline tokens, and
    // the golden is the offline run's.
    let out = fx.run(&["smoke", "fx.yaml", "--json", "--record-golden"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let r = json(&out);
    let s = serve0(&r);
    assert_eq!(s["outcome"], "identical", "{s:#}");
    assert_eq!(s["compared_with"], "this run's offline tokens");
    let golden = read_json(&fx.dir().join("goldens/fx/small.json"));
    assert_eq!(
        golden["output_token_ids"],
        r["smoke"]["cases"][0]["output_token_ids"]
    );

    // Gated: the server's tokens equal the golden; its start time and the
    // request's latency are reported, its address is the gate's.
    let out = fx.run(&["smoke", "fx.yaml", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let r = json(&out);
    let s = serve0(&r);
    assert_eq!(s["outcome"], "identical", "{s:#}");
    assert_eq!(s["ok"], true);
    assert_eq!(s["output_token_ids"], golden["output_token_ids"]);
    assert_eq!(s["prompt_token_ids"], golden["prompt_token_ids"]);
    assert!(
        s["compared_with"].as_str().unwrap().starts_with("golden ")
            && s["compared_with"].as_str().unwrap().ends_with("small.json"),
        "{s:#}"
    );
    assert!(s["start_s"].as_f64().unwrap() > 0.0, "{s:#}");
    assert!(s["latency_s"].as_f64().unwrap() > 0.0, "{s:#}");
    let cmd: Vec<&str> = s["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(cmd[0].ends_with("/bin/fixturellm"), "{cmd:?}");
    assert_eq!(cmd[1], "serve");
    assert_eq!(&cmd[3..5], ["--host", "127.0.0.1"]);
    assert_eq!(cmd[5], "--port");
    assert_eq!(s["port"].to_string(), cmd[6]);
    assert_eq!(cmd[7..], ["--max-model-len", "256"]);
    // The server wrote nothing into the oracle.
    fx.exits(&["verify", "fx.yaml", "--deep"], 0);
    // The record keeps it; the printed summary names the start time and latency.
    let rec = record(&fx.oracle("fx"));
    assert_eq!(rec["smoke"]["serve"][0]["outcome"], "identical");
    let printed = text(&fx.run(&["smoke", "fx.yaml"]));
    assert!(
        printed.contains("serve    small: identical (server up in ")
            && printed.contains(", request "),
        "{printed}"
    );

    // The server takes the second-ranked token at step 5: a drift from the
    // golden (exit 4), named with the position and the gap, read from the
    // server's `token_id:N` log-probabilities; the server's log's last lines
    // are reported; the golden is not touched.
    fx.recipe(
        "fx",
        &repo,
        &commit,
        &smoke_yaml(
            "{}",
            "{FIXTURELLM_SERVE_FLIP_STEP: \"5\"}",
            ", --return-tokens-as-token-ids]",
        ),
    );
    let before = std::fs::read(fx.dir().join("goldens/fx/small.json")).unwrap();
    let out = fx.run(&["smoke", "fx.yaml", "--json"]);
    assert_eq!(code(&out), 4, "{}", text(&out));
    let r = json(&out);
    assert_eq!(r["smoke"]["cases"][0]["golden"], "matched", "{r:#}");
    let s = serve0(&r);
    assert_eq!(s["outcome"], "drift", "{s:#}");
    assert_eq!(s["diff"]["position"], 5, "{s:#}");
    assert_eq!(s["diff"]["golden_token"], golden["output_token_ids"][5]);
    assert!(s["diff"]["gap_nats"].as_f64().is_some(), "{s:#}");
    assert!(
        s["log_tail"]
            .to_string()
            .contains("listening on http://127.0.0.1:"),
        "{s:#}"
    );
    let reasons = r["smoke"]["reasons"].to_string();
    assert!(
        reasons.contains("serve small: the server's tokens differ from golden")
            && reasons.contains("position 5"),
        "{reasons}"
    );
    assert_eq!(
        std::fs::read(fx.dir().join("goldens/fx/small.json")).unwrap(),
        before
    );
    assert_eq!(record(&fx.oracle("fx"))["smoke"]["verdict"], "not-gateable");
}

/// Whether process `pid` still exists (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn wait_gone(pid: u32) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn a_server_that_never_answers_is_an_instrument_failure_and_is_stopped() {
    let pids = tempfile::tempdir().unwrap();
    let pidfile = pids.path().join("pids");
    let env = format!(
        "{{FIXTURELLM_SERVE_NEVER_UP: \"1\", FIXTURELLM_SERVE_PIDFILE: \"{}\"}}",
        pidfile.display()
    );
    let (fx, repo, commit) = built(&smoke_yaml(&env, "{}", "], timeout_s: 3"));
    let t0 = Instant::now();
    let out = fx.run(&["smoke", "fx.yaml", "--json"]);
    let took = t0.elapsed();
    // An instrument failure: exit 1 (not 4), the gate says why.
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(took < Duration::from_secs(60), "took {took:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("could not measure")
            && err.contains("did not answer GET /health")
            && err.contains("within 3 s"),
        "{err}"
    );
    let r = json(&out);
    let s = serve0(&r);
    assert_eq!(s["outcome"], "instrument-failure", "{s:#}");
    assert!(s["start_s"].is_null(), "{s:#}");
    assert!(s["log_tail"].to_string().contains("never binding"), "{s:#}");
    // The offline case passed; the record keeps the failed measurement.
    assert_eq!(r["smoke"]["cases"][0]["ok"], true);
    let rec = record(&fx.oracle("fx"));
    assert_eq!(rec["smoke"]["serve"][0]["outcome"], "instrument-failure");
    assert_eq!(rec["smoke"]["verdict"], "not-gateable");
    // `build` of the same oracle keeps that gate and exits 1 as well.
    let out = fx.exits(&["build", "fx.yaml"], 1);
    assert!(
        text(&out).contains("its gate could not measure: serve small:"),
        "{}",
        text(&out)
    );
    // The server and the child it started are gone.
    let text_pids = std::fs::read_to_string(&pidfile).unwrap();
    let pids: Vec<u32> = text_pids
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{text_pids}");
    assert_eq!(s["pid"], pids[0], "{s:#}");
    for pid in pids {
        assert!(
            wait_gone(pid),
            "process {pid} of the server is still running"
        );
    }

    // The gate itself SIGKILLed while it waits for /health: its watchdog
    // stops the server's group (the server and the child it started).
    std::fs::remove_file(&pidfile).unwrap();
    fx.recipe(
        "fx",
        &repo,
        &commit,
        &smoke_yaml(&env, "{}", "], timeout_s: 300"),
    );
    let mut gate = fx
        .cmd(&["smoke", "fx.yaml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let pids: Vec<u32> = loop {
        let found: Vec<u32> = std::fs::read_to_string(&pidfile)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if found.len() == 2 {
            break found;
        }
        assert!(gate.try_wait().unwrap().is_none(), "the gate ended first");
        assert!(t0.elapsed() < Duration::from_secs(120), "no server started");
        std::thread::sleep(Duration::from_millis(100));
    };
    gate.kill().unwrap();
    let _ = gate.wait();
    for pid in pids {
        assert!(
            wait_gone(pid),
            "process {pid} of the killed gate's server is still running"
        );
    }
}
