//! The engine's caches and scratch are the oracle's (docs/smoke.md, "The
//! engine's environment"): the real binary builds fixture oracles with
//! `HOME` and `TMPDIR` pointing at empty directories of the test, and the
//! fixture engine (`FIXTURELLM_ENV_REPORT`, tests/fixture/pkg/fixturellm/model.py)
//! writes into every cache directory and leaves a file and a Unix socket in
//! its temporary directory, as a real engine's libraries do, reporting what
//! it saw. Also `scripts/make-tiny-models`, run twice from one seed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use serde_json::Value;

/// The cache variables the gate points into the store, as the fixture reports them.
const CACHE_VARS: [&str; 9] = [
    "VLLM_CACHE_ROOT",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "HF_HOME",
    "CUDA_CACHE_PATH",
    "FLASHINFER_WORKSPACE_BASE",
    "HOME",
];

/// The default smoke section with one run and `env` lines (4-space indented YAML) added.
fn smoke_with_env(env: &str) -> String {
    SMOKE.replacen("  runs: 3\n", &format!("  runs: 1\n  env:\n{env}"), 1)
}

/// `build <recipe> --json <extra>` with `HOME` and `TMPDIR` at the test's `home` and
/// `outer_tmp`, and no inherited cache variables: (exit code, stdout JSON or Null, text).
fn build_confined(
    fx: &Fx,
    recipe: &str,
    extra: &[&str],
    home: &Path,
    outer_tmp: &Path,
) -> (i32, Value, String) {
    let mut c = fx.cmd(&[&["build", recipe, "--json"], extra].concat());
    c.env("HOME", home).env("TMPDIR", outer_tmp);
    for v in CACHE_VARS.iter().filter(|v| **v != "HOME") {
        c.env_remove(v);
    }
    for v in ["TMP", "TEMP", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"] {
        c.env_remove(v);
    }
    let out = c.output().expect("oracle-build runs");
    let doc = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (code(&out), doc, text(&out))
}

/// Every report the fixture engine wrote into `dir` (one per process).
fn reports(dir: &Path) -> Vec<Value> {
    let mut out: Vec<Value> = tree(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| read_json(&p))
        .collect();
    out.sort_by_key(|r| r["cwd"].as_str().unwrap_or_default().to_string());
    out
}

/// The cache directories a report saw, by variable.
fn cache_dirs(report: &Value) -> BTreeMap<String, PathBuf> {
    CACHE_VARS
        .iter()
        .map(|v| {
            let p = report["env"][v]
                .as_str()
                .unwrap_or_else(|| panic!("{v} unset: {report}"));
            ((*v).to_string(), PathBuf::from(p))
        })
        .collect()
}

/// The directories the engine processes that reported into `reports_dir`
/// wrote their cache files into (not their temporary files).
fn written_dirs(reports_dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = reports(reports_dir)
        .iter()
        .flat_map(|r| r["written"].as_array().cloned().unwrap_or_default())
        .filter_map(|w| w.as_str().map(PathBuf::from))
        .filter(|w| w.extension().is_some_and(|e| e == "txt"))
        .map(|w| w.parent().unwrap().to_path_buf())
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Checks what one oracle's engine processes saw and what its record says.
fn check_oracle(fx: &Fx, name: &str, reports_dir: &Path, kv: (&str, &str)) {
    let store = fx.store();
    let reps = reports(reports_dir);
    // The probe and the case: each engine process reported.
    assert_eq!(reps.len(), 2, "{reps:?}");
    for rep in &reps {
        for (var, path) in cache_dirs(rep) {
            assert!(
                path.starts_with(store),
                "{var}={} is not inside the store {}",
                path.display(),
                store.display()
            );
        }
        let tmp = rep["env"]["TMPDIR"].as_str().expect("TMPDIR set");
        assert!(Path::new(tmp).starts_with(store), "TMPDIR={tmp}");
        assert_eq!(rep["env"]["TMP"], rep["env"]["TMPDIR"]);
        assert_eq!(rep["env"]["TEMP"], rep["env"]["TMPDIR"]);
        assert_eq!(rep["tempdir"].as_str(), Some(tmp), "{rep}");
        assert_eq!(
            rep["cwd"].as_str(),
            Some(tmp),
            "the run's cwd is its TMPDIR"
        );
        assert_eq!(rep["env"]["HF_HUB_OFFLINE"], "1");
        assert_eq!(rep["env"]["TRANSFORMERS_OFFLINE"], "1");
        assert_eq!(rep["env"]["VLLM_CPU_KVCACHE_SPACE"], kv.0, "{rep}");
        // Everything it wrote is gone: caches with the gate's scratch, the
        // socket and file it left in TMPDIR after its run.
        for w in rep["written"].as_array().unwrap() {
            let w = Path::new(w.as_str().unwrap());
            assert!(
                std::fs::symlink_metadata(w).is_err(),
                "{} is left",
                w.display()
            );
        }
    }
    let oracle = fx.oracle(name);
    let rec = record(&oracle);
    let engine = &rec["smoke"]["engine"];
    assert_eq!(engine["kept"], false, "{engine}");
    let caches = engine["caches"].as_array().expect("smoke.engine.caches");
    for var in CACHE_VARS {
        let c = caches
            .iter()
            .find(|c| c["var"] == var)
            .unwrap_or_else(|| panic!("{var} not listed: {engine}"));
        // The probe's and the case's file each.
        assert!(c["files"].as_u64().unwrap() >= 2, "{c}");
        assert!(c["bytes"].as_u64().unwrap() > 0, "{c}");
        assert!(c["path"].as_str().unwrap().starts_with("engine/"), "{c}");
    }
    let left = engine["tmpdir"].as_array().expect("smoke.engine.tmpdir");
    let runs: Vec<&str> = left.iter().map(|l| l["run"].as_str().unwrap()).collect();
    assert_eq!(runs, ["probe", "case-small"]);
    for l in left {
        assert_eq!(
            (l["sockets"].as_u64(), l["files"].as_u64()),
            (Some(1), Some(1)),
            "{l}"
        );
    }
    assert_eq!(engine["kv_cache_space"]["gib"], kv.0, "{engine}");
    assert_eq!(engine["kv_cache_space"]["from"], kv.1, "{engine}");
    assert_eq!(
        rec["smoke"]["cases"][0]["env"]["VLLM_CPU_KVCACHE_SPACE"],
        kv.0
    );
    // Scratch never enters the entry: its manifest checks (`verify`).
    assert!(!oracle.join("oracle-build/smoke/engine").exists());
}

#[test]
fn the_engine_writes_only_into_the_oracles_own_run_directory() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let home = fx.dir().join("home");
    let outer_tmp = fx.dir().join("outer-tmp");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&outer_tmp).unwrap();

    // A recipe may not move what the gate confines (exit 2, the field named).
    fx.recipe(
        "bad",
        &repo,
        &commit,
        &smoke_with_env("    TORCHINDUCTOR_CACHE_DIR: /tmp/mine\n"),
    );
    let (c, _, t) = build_confined(&fx, "bad.yaml", &[], &home, &outer_tmp);
    assert_eq!(c, 2, "{t}");
    assert!(
        t.contains("field `smoke.env.TORCHINDUCTOR_CACHE_DIR`"),
        "{t}"
    );

    // Oracle A: the CPU default for the KV cache.
    let rep_a = fx.dir().join("reports-a");
    fx.recipe(
        "fxa",
        &repo,
        &commit,
        &smoke_with_env(&format!(
            "    FIXTURELLM_ENV_REPORT: \"{}\"\n",
            rep_a.display()
        )),
    );
    // Built first without the gate: the wheel stage's uv leaves its build
    // lock (`uv-setuptools-<h>.lock`) in TMPDIR, which is not the gate's.
    let (c, _, t) = build_confined(&fx, "fxa.yaml", &["--no-smoke"], &home, &outer_tmp);
    assert_eq!(c, 4, "{t}");
    let before_gate = tree(&outer_tmp);
    // The next build gates the unsmoked oracle (`smoke`'s path: a run directory of its own).
    let (c, doc, t) = build_confined(&fx, "fxa.yaml", &[], &home, &outer_tmp);
    assert_eq!(c, 0, "{t}");
    assert_eq!(doc["verdict"], "gateable", "{t}");
    check_oracle(&fx, "fxa", &rep_a, ("1", "default"));

    // Oracle B (another recipe name: another venv key, the same wheel):
    // smoke.env's KV cache bound is used and recorded.
    let rep_b = fx.dir().join("reports-b");
    fx.recipe(
        "fxb",
        &repo,
        &commit,
        &smoke_with_env(&format!(
            "    FIXTURELLM_ENV_REPORT: \"{}\"\n    VLLM_CPU_KVCACHE_SPACE: \"3\"\n",
            rep_b.display()
        )),
    );
    // Built and gated in one go (the gate inside the oracle's staging).
    let (c, _, t) = build_confined(&fx, "fxb.yaml", &[], &home, &outer_tmp);
    assert_eq!(c, 0, "{t}");
    assert_ne!(fx.oracle("fxa"), fx.oracle("fxb"));
    check_oracle(&fx, "fxb", &rep_b, ("3", "smoke.env"));

    // No cache directory of one oracle is, holds or sits in one of the other's.
    let (dirs_a, dirs_b) = (written_dirs(&rep_a), written_dirs(&rep_b));
    assert_eq!(
        (dirs_a.len(), dirs_b.len()),
        (9, 9),
        "{dirs_a:?} {dirs_b:?}"
    );
    for a in &dirs_a {
        for b in &dirs_b {
            assert!(
                !a.starts_with(b) && !b.starts_with(a),
                "{} and {} are shared",
                a.display(),
                b.display()
            );
        }
    }
    // Nothing under HOME, nothing in the tool's TMPDIR from either gate.
    assert_eq!(tree(&home), Vec::<PathBuf>::new(), "HOME was written");
    assert_eq!(
        tree(&outer_tmp),
        before_gate,
        "TMPDIR was written by a gate"
    );
    // The entries check whole.
    let out = fx.run(&["verify", "fxa.yaml"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

/// A Python that imports numpy, safetensors and tokenizers, or why there is none.
fn model_python() -> Result<PathBuf, String> {
    let py = PathBuf::from("python3");
    let probe = Command::new(&py)
        .args(["-c", "import numpy, safetensors, tokenizers"])
        .output()
        .map_err(|e| format!("python3 does not run: {e}"))?;
    if probe.status.success() {
        Ok(py)
    } else {
        Err(format!(
            "python3 cannot import numpy, safetensors and tokenizers: {}",
            String::from_utf8_lossy(&probe.stderr)
                .trim()
                .lines()
                .last()
                .unwrap_or_default()
        ))
    }
}

/// Every file under `dir` by relative path, with its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    tree(dir)
        .into_iter()
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.strip_prefix(dir).unwrap().to_path_buf(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

#[test]
fn make_tiny_models_gives_the_same_bytes_from_the_same_seed() {
    let py = match model_python() {
        Ok(py) => py,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/make-tiny-models");
    let tmp = tempfile::tempdir().unwrap();
    let make = |seed: &str, out: &str| -> Vec<String> {
        let o = succeeds(
            Command::new(&py)
                .arg(&script)
                .args(["--seed", seed, "--out"])
                .arg(tmp.path().join(out)),
        );
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let printed = make("7", "a");
    assert_eq!(printed.len(), 2, "{printed:?}");
    make("7", "b");
    make("8", "c");
    let (a, b, c) = (
        files(&tmp.path().join("a")),
        files(&tmp.path().join("b")),
        files(&tmp.path().join("c")),
    );
    assert!(a.len() >= 10, "{:?}", a.keys());
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (path, bytes) in &a {
        assert!(
            b[path] == *bytes,
            "{} differs between two runs",
            path.display()
        );
    }
    assert!(a != c, "another seed gives the same models");
    for (dir, arch, dtype) in [
        (&printed[0], "Qwen3ForCausalLM", "float32"),
        (&printed[1], "Qwen3MoeForCausalLM", "bfloat16"),
    ] {
        let cfg = read_json(&Path::new(dir).join("config.json"));
        assert_eq!(cfg["architectures"][0], arch, "{cfg}");
        assert_eq!(cfg["torch_dtype"], dtype, "{cfg}");
        assert_eq!(cfg["head_dim"], 32, "{cfg}");
        for f in [
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        ] {
            assert!(Path::new(dir).join(f).is_file(), "{dir}/{f}");
        }
    }
}
