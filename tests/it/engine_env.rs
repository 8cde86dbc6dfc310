//! The engine's caches and scratch are the oracle's (docs/smoke.md, "The
//! engine's environment"): the real binary builds fixture oracles with
//! `HOME` and `TMPDIR` pointing at empty directories of the test, and the
//! fixture engine (`FIXTURELLM_ENV_REPORT`, tests/fixture/pkg/fixturellm/model.py)
//! writes into every cache directory and leaves a file and a Unix socket in
//! its temporary directory, as a real engine's libraries do, reporting what
//! it saw. The warm caches are the oracle's own, kept between its gate runs
//! (the fixture engine reports whether its compile cache was warm), never
//! another oracle's, and gone with it at `gc`. Also
//! `scripts/make-tiny-models`, run twice from one seed.

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

/// The cache variables that stay per gate run (not kept warm).
const PER_RUN_VARS: [&str; 3] = ["XDG_CONFIG_HOME", "HF_HOME", "HOME"];

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
        // What it wrote is gone but for the warm caches, kept in the
        // oracle's engine cache: the per-run caches (HOME, XDG_CONFIG_HOME,
        // HF_HOME) with the gate's scratch, the socket and file it left in
        // TMPDIR after its run.
        // The per-run ones are at one path inside the engine cache
        // (`<entry>/fresh/`, emptied after the run).
        let entry = store.join("engine-cache");
        for w in rep["written"].as_array().unwrap() {
            let w = Path::new(w.as_str().unwrap());
            let per_run = w
                .strip_prefix(&entry)
                .ok()
                .and_then(|r| r.components().nth(1))
                .is_some_and(|c| c.as_os_str() == "fresh");
            assert_eq!(
                std::fs::symlink_metadata(w).is_ok(),
                w.starts_with(&entry) && !per_run,
                "{}",
                w.display()
            );
        }
    }
    let oracle = fx.oracle(name);
    let rec = record(&oracle);
    let engine = &rec["smoke"]["engine"];
    assert_eq!(engine["kept"], true, "{engine}");
    let entry = engine["cache_entry"]
        .as_str()
        .expect("smoke.engine.cache_entry");
    assert!(
        Path::new(entry).starts_with(store.join("engine-cache")),
        "{engine}"
    );
    let caches = engine["caches"].as_array().expect("smoke.engine.caches");
    for var in CACHE_VARS {
        let c = caches
            .iter()
            .find(|c| c["var"] == var)
            .unwrap_or_else(|| panic!("{var} not listed: {engine}"));
        // The probe's and the case's file each.
        assert!(c["files"].as_u64().unwrap() >= 2, "{c}");
        assert!(c["bytes"].as_u64().unwrap() > 0, "{c}");
        let kept = !PER_RUN_VARS.contains(&var);
        assert_eq!(c["kept"], kept, "{c}");
        let path = c["path"].as_str().unwrap();
        if kept {
            assert!(path.starts_with(entry), "{c}");
        } else {
            // One path every run, emptied after it.
            assert!(path.starts_with(&format!("{entry}/fresh/")), "{c}");
            assert!(!Path::new(path).exists(), "{c}");
        }
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
    // Built first without the gate: the wheel stage (uv's build locks
    // included: uv runs with the store's `tmp` as TMPDIR) leaves nothing in
    // the tool's TMPDIR either.
    let (c, _, t) = build_confined(&fx, "fxa.yaml", &["--no-smoke"], &home, &outer_tmp);
    assert_eq!(c, 4, "{t}");
    let before_gate = tree(&outer_tmp);
    assert!(
        before_gate.is_empty(),
        "the wheel stage left {before_gate:?}"
    );
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

/// Whether each model load since the last call found its compile cache
/// warm (the fixture's `<pid>.engine-cache` reports in `dir`, which are
/// then removed), and the cache directories they used.
fn take_warmth(dir: &Path) -> (Vec<bool>, Vec<PathBuf>) {
    let mut warm = Vec::new();
    let mut caches = Vec::new();
    for p in tree(dir) {
        if p.extension().is_some_and(|e| e == "engine-cache") {
            let r = read_json(&p);
            warm.push(r["warm"].as_bool().expect("warm"));
            caches.push(PathBuf::from(r["cache"].as_str().expect("cache")));
            std::fs::remove_file(&p).unwrap();
        }
    }
    (warm, caches)
}

#[test]
fn a_second_smoke_finds_the_oracles_engine_cache_warm_and_no_other_oracle_ever_sees_it() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let rep = fx.dir().join("reports");
    let env = format!("    FIXTURELLM_ENV_REPORT: \"{}\"\n", rep.display());
    let recipe_a = fx.recipe("fxa", &repo, &commit, &smoke_with_env(&env));
    let engine = |name: &str| record(&fx.oracle(name))["smoke"]["engine"].clone();

    // The build's gate: the oracle's first run, cold; its caches are kept.
    let out = fx.build(&recipe_a);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let (warm, caches_a) = take_warmth(&rep);
    assert_eq!(warm, [false]);
    let e = engine("fxa");
    assert_eq!(
        (e["warm"].as_bool(), e["kept"].as_bool()),
        (Some(false), Some(true)),
        "{e}"
    );
    assert!(e["cold_reason"].as_str().unwrap().contains("first"), "{e}");
    let key_a = record(&fx.oracle("fxa"))["key"]
        .as_str()
        .unwrap()
        .to_string();
    let entry_a = fx
        .store()
        .join("engine-cache")
        .join(format!("{key_a}-cpu-{}", std::env::consts::ARCH));
    assert_eq!(e["cache_entry"].as_str(), entry_a.to_str(), "{e}");
    assert!(caches_a[0].starts_with(&entry_a), "{caches_a:?}");

    // A second gate of the same oracle finds its caches warm, and says so.
    let doc = fx.json(&["smoke", "fxa.yaml", "--json"]);
    assert_eq!(take_warmth(&rep).0, [true]);
    assert_eq!(
        doc["smoke"]["engine"]["warm"], true,
        "{}",
        doc["smoke"]["engine"]
    );
    let e = engine("fxa");
    assert_eq!(e["warm"], true, "{e}");
    assert!(e["before"]["files"].as_u64().unwrap() > 0, "{e}");
    let vllm = e["caches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["var"] == "VLLM_CACHE_ROOT")
        .cloned()
        .unwrap();
    assert!(vllm["bytes"].as_u64().unwrap() > 0, "{vllm}");
    let out = fx.exits(&["smoke", "fxa.yaml"], 0);
    assert!(text(&out).contains("engine caches warm"), "{}", text(&out));
    take_warmth(&rep);

    // `--cold` runs with emptied caches, and leaves them warm for the next.
    fx.exits(&["smoke", "fxa.yaml", "--cold"], 0);
    assert_eq!(take_warmth(&rep).0, [false]);
    let e = engine("fxa");
    assert_eq!(e["warm"], false, "{e}");
    assert!(e["cold_reason"].as_str().unwrap().contains("--cold"), "{e}");
    fx.exits(&["smoke", "fxa.yaml"], 0);
    assert_eq!(take_warmth(&rep).0, [true]);

    // While another gate holds the engine cache's lock, a gate runs with
    // cold scratch caches, says why, and leaves the kept ones alone.
    let lock_file = std::fs::File::create(fx.store().join(format!(
        "locks/engine-cache-{}.lock",
        entry_a.file_name().unwrap().to_str().unwrap()
    )))
    .unwrap();
    lock_file.lock().unwrap();
    let out = fx.exits(&["smoke", "fxa.yaml"], 0);
    assert!(
        text(&out).contains("in use by another gate"),
        "{}",
        text(&out)
    );
    let (warm, caches) = take_warmth(&rep);
    assert_eq!(warm, [false]);
    assert!(!caches[0].starts_with(&entry_a), "{caches:?}");
    let e = engine("fxa");
    assert_eq!(
        (e["warm"].as_bool(), e["kept"].as_bool()),
        (Some(false), Some(false)),
        "{e}"
    );
    assert!(e["cache_entry"].is_null(), "{e}");
    drop(lock_file);
    assert!(
        std::fs::read_dir(entry_a.join("vllm"))
            .unwrap()
            .flatten()
            .any(|e| e
                .file_name()
                .to_string_lossy()
                .starts_with("fixturellm-compiled-")),
        "the kept compile cache"
    );

    // Another oracle of the same store (another recipe: another venv key)
    // never sees the first one's caches, through its build or its smoke.
    let recipe_b = fx.recipe("fxb", &repo, &commit, &smoke_with_env(&env));
    let out = fx.build(&recipe_b);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let (warm, caches_b) = take_warmth(&rep);
    assert_eq!(warm, [false]);
    assert!(!caches_b[0].starts_with(&entry_a), "{caches_b:?}");
    fx.exits(&["smoke", "fxb.yaml"], 0);
    assert_eq!(take_warmth(&rep).0, [true]);

    // `status` and `doctor` list both with their sizes; the store checks whole.
    let st = fx.json(&["status", "--json"]);
    let listed = st["engine_caches"]
        .as_array()
        .expect("status engine_caches");
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(
        listed.iter().all(|c| c["bytes"].as_u64().unwrap() > 0),
        "{listed:?}"
    );
    let doc = fx.json(&["doctor", "--json"]);
    assert_eq!(doc["engine_caches"].as_array().unwrap().len(), 2, "{doc}");
    fx.exits(&["verify", "fxa.yaml"], 0);

    // An engine cache whose oracle is gone is a problem `gc` fixes.
    let stray = fx
        .store()
        .join("engine-cache/0123456789abcdef0123456789abcdef-cpu-x");
    std::fs::create_dir_all(stray.join("vllm")).unwrap();
    std::fs::write(stray.join("vllm/x"), "x").unwrap();
    let out = fx.run(&["doctor", "--json"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let orphans = problems_of(&json(&out), "engine-cache-orphaned")
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(orphans.len(), 1, "{orphans:?}");
    assert!(
        orphans[0]["fix"].as_str().unwrap().contains("gc"),
        "{orphans:?}"
    );

    // `gc` removes an oracle's caches with the oracle, and keeps the other's.
    fx.exits(&["unkeep", "fxa.yaml"], 0);
    let dry = fx.json(&["gc", "--dry-run", "--json"]);
    assert!(
        dry.to_string().contains(&format!("engine-cache/{key_a}")),
        "{dry}"
    );
    assert!(entry_a.is_dir(), "a dry run deletes nothing");
    fx.exits(&["gc"], 0);
    assert!(!entry_a.exists() && !stray.exists());
    assert!(caches_b[0].exists(), "the kept oracle keeps its caches");
    let doc = fx.json(&["doctor", "--json"]);
    assert_eq!(doc["engine_caches"].as_array().unwrap().len(), 1, "{doc}");
}

/// A venv under `dir` holding what `scripts/make-tiny-models` needs, from
/// PyPI at test time: numpy, safetensors and tokenizers.
fn model_python(dir: &Path) -> PathBuf {
    let venv = dir.join("models-venv");
    succeeds(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    succeeds(
        Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "numpy", "safetensors", "tokenizers"])
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    );
    venv.join("bin/python")
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

/// The `scratch` line of a smoke's text report.
fn scratch_line(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("scratch  "))
        .unwrap_or_else(|| panic!("no scratch line:\n{}", text(out)))
        .to_string()
}

/// The regular files under `dir`, recursively, links not followed.
fn files_under(dir: &Path) -> usize {
    tree(dir)
        .iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
        .count()
}

// The gate says what it knows of a cold run: an engine that writes nothing
// into its kept cache (the plain fixture) leaves it empty, and every later
// gate says `the kept engine cache was empty`, not that it is the oracle's
// first run (only the build's gate, when no engine cache of the oracle
// existed, is). And the files the scratch line counts as kept are those
// the engine cache holds: the per-run `HOME`, `XDG_CONFIG_HOME` and
// `HF_HOME` (`fresh/` in it, deleted after the run) are counted apart, also
// after `smoke --cold`.
#[test]
fn an_engine_that_writes_nothing_to_its_cache_is_not_called_a_first_run_again() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    fx.recipe("fx", &repo, &commit, SMOKE);
    fx.exits(&["build", "fx.yaml"], 0);
    let engine = || record(&fx.oracle("fx"))["smoke"]["engine"].clone();
    let e = engine();
    assert!(
        e["cold_reason"]
            .as_str()
            .unwrap()
            .starts_with("the first gate run"),
        "{e}"
    );
    let device = format!("cpu-{}", std::env::consts::ARCH);
    for _ in 0..2 {
        let out = fx.exits(&["smoke", "fx.yaml"], 0);
        let line = scratch_line(&out);
        assert!(
            line.starts_with(&format!(
                "engine caches cold on {device}: the kept engine cache was empty; 0 files"
            )),
            "{line}"
        );
        assert!(!text(&out).contains("first gate run"), "{}", text(&out));
        let e = engine();
        assert_eq!(e["warm"], false, "{e}");
        assert_eq!(e["cold_reason"], "the kept engine cache was empty", "{e}");
    }

    // An engine writing into every directory (`FIXTURELLM_ENV_REPORT`),
    // after `--cold`: the kept count is what the engine cache holds.
    let rep = fx.dir().join("reports");
    let env = format!("    FIXTURELLM_ENV_REPORT: \"{}\"\n", rep.display());
    fx.recipe("fx", &repo, &commit, &smoke_with_env(&env));
    let out = fx.exits(&["smoke", "fx.yaml", "--cold"], 0);
    let line = scratch_line(&out);
    let entry = PathBuf::from(engine()["cache_entry"].as_str().unwrap());
    let held = files_under(&entry);
    assert!(held > 0);
    assert!(
        !entry.join("fresh").exists(),
        "fresh/ is deleted after the run"
    );
    assert!(
        line.contains(&format!(
            "; {held} files, {:.1} KiB (kept in {})",
            {
                let kept: u64 = engine()["caches"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|c| c["kept"] == true)
                    .map(|c| c["bytes"].as_u64().unwrap())
                    .sum();
                kept as f64 / 1024.0
            },
            entry.display()
        )),
        "{held} files held; {line}"
    );
    let per_run: u64 = engine()["caches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| PER_RUN_VARS.contains(&c["var"].as_str().unwrap()))
        .map(|c| c["files"].as_u64().unwrap())
        .sum();
    assert!(per_run > 0);
    assert!(
        line.contains(&format!(
            "; per-run XDG_CONFIG_HOME, HF_HOME, HOME {per_run} files"
        )),
        "{line}"
    );
}

#[test]
fn make_tiny_models_gives_the_same_bytes_from_the_same_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let py = model_python(tmp.path());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/make-tiny-models");
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
