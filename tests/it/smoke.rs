//! The gate (`oracle-build smoke`), end to end: the real binary smokes a real
//! oracle venv of the fixture package (built by the real binary with real
//! git and uv), whose `LLM` runs the fixture models in the fixture's modes.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::*;
use serde_json::Value;

/// What `model` generates for the canonical prompt (tests/fixture/README.md).
const MODEL_IDS: [i64; 16] = [
    10, 4, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
];
/// What `model-b` generates: equal to `MODEL_IDS` through step 6.
const MODEL_B_IDS: [i64; 16] = [
    10, 4, 11, 12, 13, 14, 15, 25, 26, 27, 28, 29, 30, 31, 32, 33,
];
const PROMPT: &str = "The capital of France is Paris, and the";
const ENGINE: &str = "{enforce_eager: true, max_model_len: 256, gpu_memory_utilization: 0.5, max_num_seqs: 1, dtype: bfloat16}";

/// One YAML case entry (under `cases:`), with `extra` lines (6-space indented) appended.
fn case(name: &str, model: &str, extra: &str) -> String {
    format!(
        "    - name: {name}\n      model: ${{FX_MODELS}}/{model}\n      prompt: \"{PROMPT}\"\n      max_tokens: 16\n      engine_args: {ENGINE}\n{extra}"
    )
}

/// A `smoke:` section with `settings` (2-space indented lines) and `cases`.
fn smoke(settings: &str, cases: &[String]) -> String {
    format!("smoke:\n  runs: 3\n{settings}  cases:\n{}", cases.concat())
}

/// A built fixture oracle (smoke not yet run) in its test directory
/// ([`Fx`], which it derefs to), and the pin of its recipe `fx.yaml`.
struct Built {
    fx: Fx,
    repo: PathBuf,
    commit: String,
}

impl std::ops::Deref for Built {
    type Target = Fx;
    fn deref(&self) -> &Fx {
        &self.fx
    }
}

impl Built {
    /// Builds the fixture's oracle with `build --no-smoke`, recipe `fx.yaml` holding `smoke_yaml`.
    fn with_smoke(smoke_yaml: &str) -> Built {
        let fx = Fx::new();
        let (repo, commit) = fx.repo();
        let built = Built { fx, repo, commit };
        built.set_smoke(smoke_yaml);
        // Built, not smoked: not gateable (exit 4).
        built.exits(&["build", "fx.yaml", "--no-smoke"], 4);
        built
    }

    /// Rewrites the recipe with another smoke section (same pin, same oracle).
    fn set_smoke(&self, smoke_yaml: &str) {
        self.recipe("fx", &self.repo, &self.commit, smoke_yaml);
    }

    /// `smoke fx.yaml --json` plus `args`: (exit code, report).
    fn smoke(&self, args: &[&str]) -> (i32, Value, Output) {
        let mut all = vec!["smoke", "fx.yaml", "--json"];
        all.extend_from_slice(args);
        let out = self.run(&all);
        let c = code(&out);
        assert!(matches!(c, 0 | 4), "smoke exited {c}:\n{}", text(&out));
        (c, json(&out), out)
    }

    /// The oracle's `oracle.json`.
    fn record(&self) -> Value {
        record(&self.oracle("fx"))
    }
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn reasons(report: &Value) -> String {
    report["smoke"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A minimal NPY v1.0 writer: int32 little-endian, C order, shape [rows, cols].
fn write_npy(path: &Path, rows: &[Vec<i32>]) {
    let cols = rows.first().map_or(0, Vec::len);
    let mut header = format!(
        "{{'descr': '<i4', 'fortran_order': False, 'shape': ({}, {cols}), }}",
        rows.len()
    );
    // magic (6) + version (2) + header length (2) + header, a multiple of 64, ending in \n.
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&u16::try_from(header.len()).unwrap().to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for row in rows {
        assert_eq!(row.len(), cols);
        for v in row {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn i32s(v: &[i64]) -> Vec<i32> {
    v.iter().map(|&x| i32::try_from(x).unwrap()).collect()
}

#[test]
fn gateable_oracle_reports_probe_runs_engine_config_and_host_and_records_the_verdict() {
    let ids_case = format!(
        "    - name: ids\n      model: ${{FX_MODELS}}/model\n      prompt_token_ids: [2, 3, 4, 5, 6, 7, 8, 9, 2]\n      max_tokens: 16\n      engine_args: {ENGINE}\n"
    );
    let fx = Built::with_smoke(&smoke("", &[case("small", "model", ""), ids_case]));
    let before = fx.record();
    assert_eq!(before["smoke"]["verdict"], "unsmoked");

    let (c, report, _) = fx.smoke(&[]);
    assert_eq!(c, 0, "{report:#}");
    let s = &report["smoke"];
    assert_eq!(s["verdict"], "gateable");
    assert_eq!(s["probe"]["ok"], true);
    assert_eq!(s["probe"]["op"], "fixturellm._custom_ops.rms_norm");
    assert!(s["probe"]["max_abs_error"].as_f64().unwrap() < 1e-3);
    let small = &s["cases"][0];
    assert_eq!(small["runs"], 3);
    assert_eq!(small["deterministic"], true);
    assert_eq!(ids(&small["prompt_token_ids"]), [2, 3, 4, 5, 6, 7, 8, 9, 2]);
    assert_eq!(ids(&small["output_token_ids"]), MODEL_IDS);
    assert!(
        small["text"]
            .as_str()
            .unwrap()
            .starts_with(" city of lights")
    );
    assert!(small["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(small["load_s"].as_f64().unwrap() >= 0.0);
    // The engine configuration as the engine reports it, defaults filled in.
    assert_eq!(small["engine_config"]["max_num_seqs"], 1);
    assert_eq!(small["engine_config"]["dtype"], "bfloat16");
    assert_eq!(small["engine_config"]["tensor_parallel_size"], 1);
    assert_eq!(small["logprobs"].as_array().unwrap().len(), 16);
    assert_eq!(small["golden"], "none");
    // A prompt given as token ids generates the same.
    let by_ids = &s["cases"][1];
    assert_eq!(by_ids["ok"], true);
    assert_eq!(ids(&by_ids["output_token_ids"]), MODEL_IDS);
    // Host facts.
    assert!(s["boot_id_before"].is_string());
    assert_eq!(s["boot_id_before"], s["boot_id_after"]);
    assert!(s["gpus"].is_array());

    // The verdict is recorded in oracle.json, and `build` does not re-gate.
    assert_eq!(report["recorded"], true);
    let rec = fx.record();
    assert_eq!(rec["smoke"]["verdict"], "gateable");
    assert_eq!(rec["smoke"]["key"], s["key"]);
    let b = fx.run(&["build", "fx.yaml", "--json"]);
    assert_eq!(code(&b), 0, "{}", text(&b));
    assert_eq!(json(&b)["built"].as_array().unwrap().len(), 0);

    // The human report.
    let out = fx.run(&["smoke", "fx.yaml"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "probe    ok   fixturellm._custom_ops.rms_norm on cpu",
        "case     small ok  3 runs identical",
        "max_num_seqs=1",
        "(unchanged)",
        "verdict  gateable",
    ] {
        assert!(t.contains(needle), "{needle:?} not in:\n{t}");
    }

    // --case runs one case and leaves the recorded verdict alone.
    let (c, one, _) = fx.smoke(&["--case", "ids"]);
    assert_eq!(c, 0);
    assert_eq!(one["smoke"]["cases"].as_array().unwrap().len(), 1);
    assert_eq!(one["recorded"], false);
    assert_eq!(fx.record()["smoke"]["cases"].as_array().unwrap().len(), 2);
}

#[test]
fn record_golden_then_smoke_passes_and_a_changed_golden_makes_build_regate() {
    let fx = Built::with_smoke(&smoke("", &[case("small", "model", "")]));
    let (c, rec, _) = fx.smoke(&["--record-golden"]);
    assert_eq!(c, 0, "{rec:#}");
    assert_eq!(rec["smoke"]["cases"][0]["golden"], "recorded");

    // Default location: goldens/<recipe>/<case>.json beside the recipe (to
    // be committed), and a copy in <store>/goldens/, outside the read-only entries.
    let path = fx.dir().join("goldens/fx/small.json");
    assert_eq!(
        rec["smoke"]["cases"][0]["golden_path"],
        path.to_str().unwrap()
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(fx.store().join("goldens/fx/small.json")).unwrap()
    );
    let g = read_json(&path);
    assert_eq!(ids(&g["prompt_token_ids"]), [2, 3, 4, 5, 6, 7, 8, 9, 2]);
    assert_eq!(ids(&g["output_token_ids"]), MODEL_IDS);
    assert!(g["text"].as_str().unwrap().contains("river where"));
    let steps = g["logprobs"].as_array().unwrap();
    assert_eq!(steps.len(), 16);
    assert!(steps.iter().all(|s| s.as_array().unwrap().len() >= 5));
    assert_eq!(steps[7][0]["id"], 16);
    assert_eq!(steps[7][0]["token"], " where");
    assert_eq!(g["engine_config"]["max_num_seqs"], 1);
    assert_eq!(g["engine_config"]["max_model_len"], 256);
    assert_eq!(g["oracle"]["commit"], fx.commit.as_str());
    assert!(
        g["oracle"]["runtime_version"]
            .as_str()
            .unwrap()
            .contains(&fx.commit[..7])
    );
    assert!(g["captured"].as_str().unwrap().starts_with("20"));

    // The same oracle now matches its golden.
    let (c, again, _) = fx.smoke(&[]);
    assert_eq!(c, 0, "{again:#}");
    assert_eq!(again["smoke"]["cases"][0]["golden"], "matched");
    let b = fx.run(&["build", "fx.yaml", "--json"]);
    assert_eq!(code(&b), 0, "{}", text(&b));
    assert_eq!(json(&b)["built"].as_array().unwrap().len(), 0);

    // The golden's content is part of the smoke key: a changed golden re-gates.
    let mut tampered = g.clone();
    tampered["output_token_ids"][9] = 3.into();
    std::fs::write(&path, serde_json::to_string(&tampered).unwrap()).unwrap();
    let b = fx.run(&["build", "fx.yaml", "--json"]);
    assert_eq!(code(&b), 4, "{}", text(&b));
    let b = json(&b);
    assert!(
        b["built"].as_array().unwrap().iter().any(|s| s == "smoke"),
        "{b}"
    );
    let why = b["reasons"].to_string();
    assert!(why.contains("position 9"), "{why}");
}

#[test]
fn probe_failure_fails_the_gate_with_the_reason_and_records_no_golden() {
    let fx = Built::with_smoke(&smoke(
        "  env: {FIXTURELLM_MODE: broken-op}\n",
        &[case("small", "model", "")],
    ));
    let (c, report, _) = fx.smoke(&["--record-golden"]);
    assert_eq!(c, 4, "{report:#}");
    let s = &report["smoke"];
    assert_eq!(s["verdict"], "not-gateable");
    assert_eq!(s["probe"]["ok"], false);
    let why = reasons(&report);
    assert!(
        why.contains("probe: fixturellm._custom_ops.rms_norm failed")
            && why.contains("max abs error"),
        "{why}"
    );
    // Generation is unaffected in this mode; the probe alone fails the gate,
    // and a broken oracle's output is not taken as a golden.
    assert_eq!(s["cases"][0]["deterministic"], true);
    assert_ne!(s["cases"][0]["golden"], "recorded");
    assert!(!fx.store().join("goldens/fx/small.json").exists());
    assert!(!fx.dir().join("goldens/fx/small.json").exists());
    assert_eq!(fx.record()["smoke"]["verdict"], "not-gateable");
}

#[test]
fn a_recipe_can_name_another_probe() {
    let fx = Built::with_smoke(&smoke(
        "  probe: {module: builtins, function: bool}\n",
        &[case("small", "model", "")],
    ));
    // bool("cpu") is true: the named probe passes.
    let (c, ok, _) = fx.smoke(&[]);
    assert_eq!(c, 0, "{ok:#}");
    assert_eq!(ok["smoke"]["probe"]["op"], "builtins.bool");
    assert_eq!(ok["smoke"]["probe"]["ok"], true);
    // callable("cpu") is false: it fails, with what it returned.
    fx.set_smoke(&smoke(
        "  probe: {module: builtins, function: callable}\n",
        &[case("small", "model", "")],
    ));
    let (c, bad, _) = fx.smoke(&[]);
    assert_eq!(c, 4);
    let why = reasons(&bad);
    assert!(
        why.contains("probe: builtins.callable failed: returned False"),
        "{why}"
    );
}

#[test]
fn nondeterministic_runs_are_reported_with_the_position_and_the_candidates() {
    let fx = Built::with_smoke(&smoke(
        "",
        &[case(
            "small",
            "model",
            "      env: {FIXTURELLM_MODE: nondeterministic}\n",
        )],
    ));
    let (c, report, out) = fx.smoke(&[]);
    assert_eq!(c, 4, "{report:#}");
    let small = &report["smoke"]["cases"][0];
    assert_eq!(small["deterministic"], false);
    let d = &small["disagreement"];
    assert_eq!(d["position"], 3, "{d}");
    let cands = d["candidates"].as_array().unwrap();
    assert_eq!(cands.len(), 2, "{d}");
    assert_eq!(cands[0]["token"], 12);
    assert_eq!(cands[0]["text"], " sits");
    assert_eq!(ids(&cands[0]["runs"]), [1, 3]);
    assert_eq!(cands[1]["token"], 34);
    assert_eq!(cands[1]["text"], " shine");
    assert_eq!(ids(&cands[1]["runs"]), [2]);
    assert!(reasons(&report).contains("first at output position 3"));
    let _ = out;
    let t = text(&fx.run(&["smoke", "fx.yaml"]));
    assert!(
        t.contains("3 runs DISAGREE") && t.contains("12 \" sits\""),
        "{t}"
    );
}

#[test]
fn golden_mismatch_names_position_tokens_and_gap_and_flags_near_ties_by_the_threshold() {
    let golden = "      golden: goldens/small.json\n";
    let fx = Built::with_smoke(&smoke("", &[case("small", "model", golden)]));
    // A golden the recipe names must exist.
    let (c, missing, _) = fx.smoke(&[]);
    assert_eq!(c, 4);
    assert_eq!(missing["smoke"]["cases"][0]["golden"], "missing");
    assert!(reasons(&missing).contains("goldens/small.json named by the recipe does not exist"));

    // Recorded next to the recipe (relative to its directory) from `model`.
    let (c, _, _) = fx.smoke(&["--record-golden"]);
    assert_eq!(c, 0);
    assert!(fx.dir().join("goldens/small.json").is_file());

    // Now the case runs model-b, which flips step 7 (" where" -> " that").
    // Its weights are other files: the golden's model manifest refuses the
    // comparison, naming them (tests/it/model_identity.rs).
    fx.set_smoke(&smoke("", &[case("small", "model-b", golden)]));
    let (c, report, _) = fx.smoke(&[]);
    assert_eq!(c, 4, "{report:#}");
    let small = &report["smoke"]["cases"][0];
    assert_eq!(small["golden"], "refused", "{small}");
    assert_eq!(
        small["model_diff"]["changed"],
        serde_json::json!(["weights.json"])
    );
    // A golden without a manifest (recorded before it) compares the outputs.
    let path = fx.dir().join("goldens/small.json");
    let mut g = read_json(&path);
    g.as_object_mut().unwrap().remove("model_manifest");
    std::fs::write(&path, g.to_string()).unwrap();
    let (c, report, _) = fx.smoke(&[]);
    assert_eq!(c, 4, "{report:#}");
    let small = &report["smoke"]["cases"][0];
    assert_eq!(small["model_check"], "not checked", "{small}");
    assert_eq!(small["golden"], "mismatched");
    let d = &small["golden_diff"];
    assert_eq!(d["position"], 7, "{d}");
    assert_eq!(d["golden_token"], 16);
    assert_eq!(d["golden_text"], " where");
    assert_eq!(d["token"], 25);
    assert_eq!(d["text"], " that");
    // model-b: " that" -0.69 vs " where" -0.99; model (the golden): 1.5 nats apart.
    assert!((d["gap_nats"].as_f64().unwrap() - 0.3).abs() < 1e-3, "{d}");
    assert!(
        (d["golden_gap_nats"].as_f64().unwrap() - 1.5).abs() < 1e-3,
        "{d}"
    );
    assert_eq!(d["near_tie"], true);
    let why = reasons(&report);
    assert!(
        why.contains("position 7") && why.contains("NEAR-TIE"),
        "{why}"
    );

    // Under a 0.2-nat threshold the same flip is not a near-tie.
    fx.set_smoke(&smoke(
        "  near_tie_nats: 0.2\n",
        &[case("small", "model-b", golden)],
    ));
    let (c, strict, _) = fx.smoke(&[]);
    assert_eq!(c, 4);
    let d = &strict["smoke"]["cases"][0]["golden_diff"];
    assert_eq!(d["near_tie"], false, "{d}");
    assert_eq!(d["near_tie_nats"], 0.2);
    assert!(reasons(&strict).contains("not a near-tie"));
}

#[test]
fn a_golden_from_another_engine_configuration_is_refused_naming_the_differences() {
    let fx = Built::with_smoke(&smoke("", &[case("small", "model", "")]));
    let (c, _, _) = fx.smoke(&["--record-golden"]);
    assert_eq!(c, 0);
    // Same model, same prompt, different engine: a near-tie could flip, so no comparison.
    let other = case("small", "model", "").replace(
        "max_model_len: 256, gpu_memory_utilization: 0.5, max_num_seqs: 1",
        "max_model_len: 128, gpu_memory_utilization: 0.5, max_num_seqs: 4",
    );
    fx.set_smoke(&smoke("", &[other]));
    let (c, report, _) = fx.smoke(&[]);
    assert_eq!(c, 4, "{report:#}");
    let small = &report["smoke"]["cases"][0];
    assert_eq!(small["golden"], "refused");
    assert!(small["golden_diff"].is_null());
    let diffs = small["config_diffs"].as_array().unwrap();
    let keys: Vec<&str> = diffs.iter().map(|d| d["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["max_model_len", "max_num_seqs"], "{diffs:?}");
    assert_eq!(diffs[1]["golden"], 1);
    assert_eq!(diffs[1]["now"], 4);
    let why = reasons(&report);
    assert!(
        why.contains("different engine configuration")
            && why.contains("max_num_seqs: golden 1 vs now 4")
            && why.contains("max_model_len: golden 256 vs now 128"),
        "{why}"
    );
}

/// A case of `model` in `mode` (`None`: no `mode:`, the default) with
/// engine arguments that do not say `enforce_eager`, read back in vLLM's
/// shape (`compilation_config.mode` too).
fn case_in_mode(name: &str, mode: Option<&str>) -> String {
    let mode = mode.map_or(String::new(), |m| format!("      mode: {m}\n"));
    format!(
        "    - name: {name}\n{mode}      model: ${{FX_MODELS}}/model\n      prompt: \"{PROMPT}\"\n      max_tokens: 16\n      engine_args: {{max_model_len: 256, max_num_seqs: 1, dtype: bfloat16}}\n      env: {{FIXTURELLM_ENGINE: vllm}}\n"
    )
}

#[test]
fn a_compiled_case_runs_without_enforce_eager_and_only_a_compiled_golden_gates_it() {
    let fx = Built::with_smoke(&smoke(
        "",
        &[
            case_in_mode("small", None),
            case_in_mode("small-compiled", Some("compiled")),
        ],
    ));
    let (c, report, _) = fx.smoke(&["--record-golden"]);
    assert_eq!(c, 0, "{report:#}");
    // One golden per case name, each recording its mode.
    for (name, mode) in [("small", "eager"), ("small-compiled", "compiled")] {
        let g = read_json(&fx.dir().join(format!("goldens/fx/{name}.json")));
        assert_eq!(g["mode"], mode, "{name}: {g:#}");
    }
    let (c, report, _) = fx.smoke(&[]);
    assert_eq!(c, 0, "{report:#}");
    let [eager, compiled] = [0, 1].map(|i| report["smoke"]["cases"][i].clone());
    assert_eq!(
        (&eager["mode"], &eager["golden"]),
        (&Value::from("eager"), &Value::from("matched"))
    );
    assert_eq!(
        (&compiled["mode"], &compiled["golden"]),
        (&Value::from("compiled"), &Value::from("matched")),
        "{compiled:#}"
    );
    // The engine saw enforce_eager only in eager mode (the case's
    // engine_args say nothing of it): compiled runs the engine's default.
    assert_eq!(eager["engine_config"]["enforce_eager"], true);
    assert_eq!(eager["engine_config"]["compilation_config.mode"], "NONE");
    assert_eq!(compiled["engine_config"]["enforce_eager"], false);
    assert_eq!(
        compiled["engine_config"]["compilation_config.mode"],
        "VLLM_COMPILE"
    );
    let rec = fx.record();
    assert_eq!(rec["smoke"]["cases"][1]["mode"], "compiled");
    let out = fx.run(&["smoke", "fx.yaml"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("  mode     eager (enforce_eager") && t.contains("  mode     compiled ("),
        "{t}"
    );
    assert!(t.contains("enforce_eager=false"), "{t}");

    // The case `small` now compiled: its eager golden is refused, the mode
    // named first; the other case still matches its compiled golden.
    fx.set_smoke(&smoke(
        "",
        &[
            case_in_mode("small", Some("compiled")),
            case_in_mode("small-compiled", Some("compiled")),
        ],
    ));
    let (c, report, _) = fx.smoke(&[]);
    assert_eq!(c, 4, "{report:#}");
    let small = &report["smoke"]["cases"][0];
    assert_eq!(small["golden"], "refused", "{small:#}");
    assert!(small["golden_diff"].is_null());
    let diffs = small["config_diffs"].as_array().unwrap();
    assert_eq!(diffs[0]["key"], "mode", "{diffs:?}");
    assert_eq!(
        (&diffs[0]["golden"], &diffs[0]["now"]),
        (&Value::from("eager"), &Value::from("compiled"))
    );
    assert_eq!(report["smoke"]["cases"][1]["golden"], "matched");
    let why = reasons(&report);
    assert!(
        why.contains("different engine configuration")
            && why.contains("mode: golden \"eager\" vs now \"compiled\"")
            && why.contains("enforce_eager: golden true vs now false"),
        "{why}"
    );
}

#[test]
fn a_numpy_golden_is_compared_by_its_manifest_row() {
    let golden = "      golden: users/run1\n";
    let fx = Built::with_smoke(&smoke("", &[case("small", "model", golden)]));
    let dir = fx.dir().join("users/run1");
    let manifest = |max_num_seqs: i64| {
        serde_json::json!({
            "prompts": ["The tower is", PROMPT],
            "engine_args": {"max_model_len": 256, "max_num_seqs": max_num_seqs, "dtype": "bfloat16"},
            "model": "Qwen/whatever",
        })
        .to_string()
    };
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("manifest.json"), manifest(1)).unwrap();
    // Row 0 is another prompt (stopped early: -1 padding); row 1 is this case.
    let mut other = vec![5, 6, 1];
    other.resize(16, -1);
    write_npy(
        &dir.join("greedy_ids.npy"),
        &[other.clone(), i32s(&MODEL_IDS)],
    );
    let (c, ok, _) = fx.smoke(&[]);
    assert_eq!(c, 0, "{ok:#}");
    let small = &ok["smoke"]["cases"][0];
    assert_eq!(small["golden"], "matched");
    assert!(
        small["golden_path"]
            .as_str()
            .unwrap()
            .ends_with("users/run1/greedy_ids.npy")
    );

    // A golden from model-b: mismatch at 7, gap 1.5 nats in this run: not a near-tie.
    write_npy(
        &dir.join("greedy_ids.npy"),
        &[other.clone(), i32s(&MODEL_B_IDS)],
    );
    let (c, bad, _) = fx.smoke(&[]);
    assert_eq!(c, 4);
    let d = &bad["smoke"]["cases"][0]["golden_diff"];
    assert_eq!(d["position"], 7, "{d}");
    assert_eq!(d["golden_token"], 25);
    assert_eq!(d["golden_text"], " that");
    assert_eq!(d["token"], 16);
    assert!((d["gap_nats"].as_f64().unwrap() - 1.5).abs() < 1e-3, "{d}");
    assert!(
        d["golden_gap_nats"].is_null(),
        "numpy goldens carry no logprobs"
    );
    assert_eq!(d["near_tie"], false);
    assert!(reasons(&bad).contains("row 1"));

    // The manifest's engine arguments are checked too.
    std::fs::write(dir.join("manifest.json"), manifest(8)).unwrap();
    let (c, refused, _) = fx.smoke(&[]);
    assert_eq!(c, 4);
    assert_eq!(refused["smoke"]["cases"][0]["golden"], "refused");
    assert!(reasons(&refused).contains("max_num_seqs: golden 8 vs now 1"));

    // --record-golden does not overwrite users' numpy goldens.
    let out = fx.run(&["smoke", "fx.yaml", "--record-golden"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("numpy golden"));
}

#[test]
fn failing_cases_are_reported_as_data_and_the_others_still_run() {
    let missing =
        "    - name: gone\n      model: /nonexistent/models/Qwen-X\n      prompt: hi\n".to_string();
    let fx = Built::with_smoke(&smoke(
        "",
        &[
            missing,
            case("crashy", "model", "      env: {FIXTURELLM_MODE: crash}\n"),
            case("small", "model", ""),
        ],
    ));
    let (c, report, _) = fx.smoke(&[]);
    assert_eq!(c, 4, "{report:#}");
    let cases = report["smoke"]["cases"].as_array().unwrap();
    // A missing model path is refused, naming the path; nothing runs.
    assert_eq!(cases[0]["runs"], 0);
    assert!(
        cases[0]["problems"][0]
            .as_str()
            .unwrap()
            .contains("model path /nonexistent/models/Qwen-X does not exist"),
        "{}",
        cases[0]
    );
    // A crash is data: the stage and the exception.
    let err = &cases[1]["error"];
    assert_eq!(err["stage"], "generate", "{err}");
    assert_eq!(err["exception"], "RuntimeError: fixture crash");
    assert!(err["log_tail"].is_array());
    assert!(
        reasons(&report).contains("case crashy: failed at generate: RuntimeError: fixture crash")
    );
    // The good case still ran.
    assert_eq!(cases[2]["ok"], true);
    assert_eq!(cases[2]["runs"], 3);
}

#[test]
fn a_hanging_case_is_killed_by_its_timeout() {
    let fx = Built::with_smoke(&smoke(
        "  timeout_s: 3\n",
        &[case(
            "stuck",
            "model",
            "      env: {FIXTURELLM_MODE: hang}\n",
        )],
    ));
    let t0 = std::time::Instant::now();
    let (c, report, _) = fx.smoke(&[]);
    let took = t0.elapsed();
    assert_eq!(c, 4, "{report:#}");
    assert!(took.as_secs() < 60, "took {took:?}");
    assert!(
        reasons(&report)
            .contains("case stuck: timed out after 3 s and was killed (it was at stage: load)"),
        "{}",
        reasons(&report)
    );
    // Nothing is left running from this store.
    let store = fx.store().canonicalize().unwrap();
    let needle = store.to_str().unwrap();
    let leftover: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .filter(|c| c.contains("smoke_driver.py") && c.contains(needle))
        .collect();
    assert!(leftover.is_empty(), "{leftover:?}");
}

#[test]
fn smoke_needs_a_built_oracle_and_a_known_case() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    fx.recipe(
        "fx",
        &repo,
        &commit,
        &smoke("", &[case("small", "model", "")]),
    );
    let out = fx.run(&["smoke", "fx.yaml"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains("no oracle of fx")
            && text(&out).contains(&format!(
                "oracle-build build {} --store {}",
                fx.dir().join("fx.yaml").canonicalize().unwrap().display(),
                fx.store().display()
            )),
        "{}",
        text(&out)
    );
    let out = fx.run(&["smoke", "fx.yaml", "--case", "nope"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("no case named \"nope\" (its cases: small)"),
        "{}",
        text(&out)
    );
}

#[test]
fn record_golden_refuses_to_replace_a_disagreeing_golden_without_force() {
    let fx = Built::with_smoke(&smoke("", &[case("small", "model", "")]));
    let (c, rec, _) = fx.smoke(&["--record-golden"]);
    assert_eq!(c, 0, "{rec:#}");
    let path = fx.dir().join("goldens/fx/small.json");
    let before = std::fs::read(&path).unwrap();

    // Recording again from output that matches replaces it quietly.
    let (c, again, _) = fx.smoke(&["--record-golden"]);
    assert_eq!(c, 0, "{again:#}");
    assert_eq!(again["smoke"]["cases"][0]["golden"], "recorded");
    let golden_now = std::fs::read(&path).unwrap();
    let record_before = fx.record();

    // model-b flips step 7: its output disagrees with the golden.
    fx.set_smoke(&smoke("", &[case("small", "model-b", "")]));
    let out = fx.run(&["smoke", "fx.yaml", "--record-golden"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        path.to_str().unwrap(),
        "case small",
        "output position 7",
        "--record-golden --force",
    ] {
        assert!(err.contains(needle), "{needle:?} missing in:\n{err}");
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        golden_now,
        "the golden is untouched"
    );
    assert_eq!(
        fx.record()["smoke"],
        record_before["smoke"],
        "oracle.json is untouched"
    );

    // --force replaces it, and says so.
    let (c, forced, _) = fx.smoke(&["--record-golden", "--force"]);
    assert_eq!(c, 0, "{forced:#}");
    let case0 = &forced["smoke"]["cases"][0];
    assert_eq!(case0["golden"], "recorded");
    assert!(
        case0["notes"].to_string().contains("replaced (--force)"),
        "{case0}"
    );
    let g = read_json(&path);
    assert_eq!(ids(&g["output_token_ids"]), MODEL_B_IDS);
    assert_ne!(std::fs::read(&path).unwrap(), before);

    // --force means nothing without --record-golden.
    let out = fx.run(&["smoke", "fx.yaml", "--force"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
}

/// A case of `model` with its own `engine_args` and `env` (YAML flow maps).
fn case_with(name: &str, engine_args: &str, env: &str) -> String {
    format!(
        "    - name: {name}\n      model: ${{FX_MODELS}}/model\n      prompt: \"{PROMPT}\"\n      max_tokens: 16\n      engine_args: {engine_args}\n      env: {env}\n"
    )
}

#[test]
fn flat_logprobs_and_positions_without_logprobs_read_like_vllms_list_layout() {
    // fixturellm.logprobs: "flat" is vLLM's FlatLogprobs layout; the "-none"
    // layouts leave position NONE_STEP (2) empty (None / a zero-length span).
    let layouts = ["list", "flat", "list-none", "flat-none"];
    let cases: Vec<String> = layouts
        .iter()
        .map(|l| {
            case_with(
                &l.replace('-', "_"),
                ENGINE,
                &format!("{{FIXTURELLM_LOGPROBS: {l}}}"),
            )
        })
        .collect();
    let fx = Built::with_smoke(&smoke("", &cases));
    let (c, report, _) = fx.smoke(&[]);
    assert_eq!(c, 0, "{report:#}");
    let cases = report["smoke"]["cases"].as_array().unwrap();
    for (case, layout) in cases.iter().zip(layouts) {
        assert_eq!(case["ok"], true, "{layout}: {case:#}");
        assert_eq!(ids(&case["output_token_ids"]), MODEL_IDS, "{layout}");
        assert_eq!(case["logprobs"].as_array().unwrap().len(), 16, "{layout}");
    }
    let list = cases[0]["logprobs"].as_array().unwrap();
    // The step's own token comes first, with its id, logprob and rank.
    assert_eq!(list[0][0]["id"], MODEL_IDS[0]);
    assert_eq!(list[0][0]["rank"], 1);
    assert!(list[0][0]["logprob"].as_f64().unwrap() < 0.0);
    assert_eq!(
        cases[1]["logprobs"], cases[0]["logprobs"],
        "flat differs from list"
    );
    for none in &cases[2..] {
        let steps = none["logprobs"].as_array().unwrap();
        for (i, (got, want)) in steps.iter().zip(list).enumerate() {
            if i == 2 {
                assert_eq!(got, &Value::Array(vec![]), "{}: position 2", none["name"]);
            } else {
                assert_eq!(got, want, "{}: position {i}", none["name"]);
            }
        }
    }
}

#[test]
fn engine_knobs_are_read_back_under_vllms_names_and_one_that_cannot_be_is_reported() {
    let args = "{enforce_eager: true, max_model_len: 256, max_num_seqs: 1, enable_chunked_prefill: false, kv_cache_dtype: auto, swap_space: 2, disable_log_stats: true}";
    let fx = Built::with_smoke(&smoke(
        "",
        &[
            // vLLM's VllmConfig sections (2026-08): no chunked_prefill_enabled,
            // no cache_config.swap_space (2026-02 has it), mode an IntEnum.
            case_with("vllm", args, "{FIXTURELLM_ENGINE: vllm}"),
            // A dict of every engine argument: everything reads back.
            case_with("dict", args, "{FIXTURELLM_ENGINE: dict}"),
        ],
    ));
    let (c, report, out) = fx.smoke(&[]);
    assert_eq!(c, 0, "{report:#}");
    let vllm = &report["smoke"]["cases"][0];
    assert_eq!(vllm["ok"], true, "{vllm:#}");
    let ec = &vllm["engine_config"];
    assert_eq!(ec["enable_chunked_prefill"], false, "{ec:#}");
    assert_eq!(ec["kv_cache_dtype"], "auto");
    assert_eq!(ec["max_num_seqs"], 1);
    assert_eq!(ec["enforce_eager"], true);
    assert_eq!(ec["compilation_config.mode"], "NONE");
    assert!(ec.get("swap_space").is_none(), "{ec:#}");
    let unread = vllm["unread_engine_args"].as_array().unwrap();
    assert_eq!(unread.len(), 2, "{unread:?}");
    // A knob vLLM keeps in one era and not in another: where it was looked for.
    assert_eq!(unread[1]["knob"], "swap_space");
    assert!(
        unread[1]["reason"]
            .as_str()
            .unwrap()
            .contains("none of cache_config.swap_space exists on this engine's vllm_config"),
        "{unread:?}"
    );
    // A knob the driver has no place for.
    assert_eq!(unread[0]["knob"], "disable_log_stats");
    assert!(
        unread[0]["reason"]
            .as_str()
            .unwrap()
            .contains("does not know where vLLM keeps it"),
        "{unread:?}"
    );
    let notes: Vec<&str> = vllm["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("engine argument swap_space was set but cannot be read back")),
        "{notes:?}"
    );
    // The same knobs through the dict: all read back, nothing reported.
    let dict = &report["smoke"]["cases"][1];
    assert_eq!(dict["engine_config"]["swap_space"], 2);
    assert_eq!(dict["engine_config"]["enable_chunked_prefill"], false);
    assert_eq!(dict["unread_engine_args"], Value::Array(vec![]));
    // The recorded oracle keeps the report.
    let rec = fx.record();
    assert_eq!(
        rec["smoke"]["cases"][0]["unread_engine_args"][1]["knob"],
        "swap_space"
    );
    let _ = out;
}
