//! What a bundle carries stays usable on the importing box: a golden at an
//! explicit `golden:` path gates there through the store's copy, and `gc`
//! keeps the store's lock and the uv wheel the oracle was built with, so
//! `build --offline` still works after it. Real binary, git, uv, python.

use std::path::Path;

use crate::hermetic::{bare_offline_cmd, build, ok};
use crate::support::*;
use serde_json::Value;

/// The fixture's smoke section with the case's golden at `gold/small.json`.
const SMOKE_NAMED: &str = "smoke:\n  runs: 3\n  cases:\n    - name: small\n      model: ${FX_MODELS}/model\n      prompt: \"The capital of France is Paris, and the\"\n      max_tokens: 16\n      golden: gold/small.json\n      engine_args: {enforce_eager: true, max_model_len: 256, gpu_memory_utilization: 0.5, max_num_seqs: 1, dtype: bfloat16}\n";

/// `oracle-build <args> --store <store> --json` on the bare offline box in `cwd`.
fn bare_json(cwd: &Path, store: &Path, args: &[&str]) -> Value {
    let out = bare_offline_cmd(cwd)
        .args(args)
        .arg("--store")
        .arg(store)
        .arg("--json")
        .output()
        .unwrap();
    ok(&out);
    json(&out)
}

#[test]
fn an_imported_pin_gates_on_its_named_golden_and_survives_gc_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, commit) = fixture_repo(d);
    let recipe = write_recipe(d, "fx", &repo, &commit, SMOKE_NAMED);
    let r = recipe.to_str().unwrap();
    let store_a = d.join("store-a");
    let sa = store_a.to_str().unwrap();

    // The online box: a committed lockfile, a build, the golden recorded at
    // its named path, an export (which carries the built wheel).
    ok(&run(d, &["lock", r, "--store", sa]));
    let out = run(d, &["build", r, "--store", sa, "--no-smoke"]);
    assert_eq!(code(&out), 4, "{}", text(&out));
    ok(&run(d, &["smoke", r, "--store", sa, "--record-golden"]));
    let named = d.join("gold/small.json");
    assert!(named.is_file());
    let bundle = d.join("fx.tar.gz");
    ok(&run(
        d,
        &["export", r, "-o", bundle.to_str().unwrap(), "--store", sa],
    ));

    // The offline box: the recipe file alone (no lockfiles/, no gold/).
    let b = d.join("box-b");
    std::fs::create_dir_all(b.join("elsewhere")).unwrap();
    let same = b.join("elsewhere/fx.yaml");
    std::fs::copy(&recipe, &same).unwrap();
    let store_b = b.join("store");
    let imported = bare_json(&b, &store_b, &["import", bundle.to_str().unwrap()]);
    let store_copy = store_b.join("goldens/fx/small.json");
    assert_eq!(
        std::fs::read(&store_copy).unwrap(),
        std::fs::read(&named).unwrap(),
        "{imported}"
    );
    assert!(!b.join("elsewhere/gold/small.json").exists());

    // The named golden is missing at its path there: the store's copy gates.
    let built = build(&mut bare_offline_cmd(&b), &same, &store_b, &["--offline"]);
    assert_eq!(built["verdict"], "gateable", "{built}");
    assert!(
        !built["built"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "wheel"),
        "the wheel came in the bundle: {built}"
    );
    let venv = Path::new(built["oracle"].as_str().unwrap()).to_path_buf();
    let rec = record(&venv);
    let case = &rec["smoke"]["cases"][0];
    assert_eq!(case["golden"], "matched", "{case:#}");
    assert_eq!(
        case["golden_path"],
        store_copy.to_str().unwrap(),
        "{case:#}"
    );

    // The oracle's record requires the store's lock (the bundle's) and the
    // wheel its uv was installed from.
    let requires: Vec<String> = rec["requires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let lock = requires
        .iter()
        .find(|l| l.starts_with("lockfiles/"))
        .unwrap_or_else(|| panic!("no lock in {requires:?}"))
        .clone();
    let uv_sha = read_json(&store_b.join("tools/uv-0.13.9/wheel.json"))["sha256"]
        .as_str()
        .unwrap()
        .to_string();
    let uv_wheel = format!("wheelhouse/{uv_sha}");
    assert!(requires.contains(&uv_wheel), "{requires:?}");
    // The wheel, built on the other box from its lockfile, does not name it.
    let wheel_rec = read_json(
        &store_b
            .join("store/wheels")
            .join(rec["wheel_key"].as_str().unwrap())
            .join("build.json"),
    );
    assert!(
        !wheel_rec["requires"].to_string().contains(&lock),
        "{wheel_rec}"
    );

    // gc keeps them, and an offline rebuild of the venv still works.
    let gc = bare_json(&b, &store_b, &["gc"]);
    let kept: Vec<&str> = gc["kept"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        kept.contains(&lock.as_str()) && kept.contains(&uv_wheel.as_str()),
        "{gc:#}"
    );
    assert!(
        store_b
            .join("store")
            .join(&lock)
            .join("lock.json")
            .is_file()
    );
    force_remove(&venv);
    let again = build(&mut bare_offline_cmd(&b), &same, &store_b, &["--offline"]);
    assert_eq!(again["verdict"], "gateable", "{again}");
    assert_eq!(again["key"], built["key"]);
}
