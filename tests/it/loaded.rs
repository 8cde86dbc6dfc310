//! Kernel coverage of what the engine loads (issue 39): each gate case
//! records the shared objects its engine processes mapped, and the gate
//! records which of the oracle's compiled extensions were loaded (judged)
//! and which were not (listed, not refused). The fixture with the `twoext`
//! overlay has two extensions, `_C` (the engine's ops) and `_unused_C`
//! (imported by nothing).

use crate::support::*;
use serde_json::Value;

/// The paths (relative to the package) of a coverage list, e.g. `loaded`.
fn paths(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_gate_records_the_extension_its_engine_loaded_and_lists_the_other_as_not_loaded() {
    let fx = Fx::new();
    let (repo, _) = fixture_repo_with(fx.dir(), "twoext");
    git(&repo, &["add", "-A"]);
    git(
        &repo,
        &["commit", "-qm", "a second extension nothing imports"],
    );
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let out = fx.build(&recipe);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let venv = fx.oracle("fx");
    let rec = record(&venv);
    let exts = paths(&rec["identity"]["compiled_extensions"]);
    assert_eq!(exts.len(), 2, "{exts:?}");
    let c_ext = exts.iter().find(|p| p.starts_with("_C.")).unwrap();
    let unused = exts.iter().find(|p| p.starts_with("_unused_C.")).unwrap();

    // The case's engine mapped _C (at the oracle's final path, not the
    // staging directory it was gated in), never _unused_C.
    let s = &rec["smoke"];
    assert_eq!(s["verdict"], "gateable", "{s:#}");
    let mapped: Vec<&str> = s["cases"][0]["mapped_objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let pkg = rec["identity"]["package_dir"].as_str().unwrap();
    assert!(pkg.starts_with(venv.to_str().unwrap()), "{pkg}");
    assert!(
        mapped.contains(&format!("{pkg}/{c_ext}").as_str()),
        "{mapped:#?}"
    );
    assert!(
        !mapped.iter().any(|p| p.contains("_unused_C")),
        "{mapped:#?}"
    );
    assert!(
        mapped.iter().all(|p| !p.contains("/store/tmp/")),
        "{mapped:#?}"
    );

    // The coverage: _C loaded by the case (no device code: not judged),
    // _unused_C listed as not loaded; no GPU target on this CPU oracle.
    let cov = &s["kernel_coverage"];
    assert_eq!(cov["judged_by"], "gate", "{cov:#}");
    assert_eq!(paths(&cov["loaded"]), vec![c_ext.as_str()]);
    // The probe (it runs `_C`'s rms_norm) counts as a case.
    assert_eq!(
        cov["loaded"][0]["cases"],
        serde_json::json!(["probe", "small"])
    );
    assert_eq!(cov["loaded"][0]["ok"], true);
    assert_eq!(cov["loaded"][0]["verdict"], "no device code (not judged)");
    assert_eq!(paths(&cov["not_loaded"]), vec![unused.as_str()]);
    assert_eq!(cov["not_loaded"][0]["holds"], "no device code");
    assert!(cov["target"].is_null());

    // verify shows it, as JSON and in words.
    let v = fx.json(&["verify", "fx.yaml", "--json"]);
    assert_eq!(v["kernel_coverage"], *cov);
    let out = fx.exits(&["verify", "fx.yaml"], 0);
    let t = String::from_utf8_lossy(&out.stdout);
    for needle in [
        format!("loaded      {c_ext} (case probe, small): no device code (not judged)"),
        format!("not loaded  {unused} (holds no device code)"),
    ] {
        assert!(t.contains(&needle), "{needle:?} not in:\n{t}");
    }
}
