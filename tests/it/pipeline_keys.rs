//! `plan` and `build` share one implementation of the stage order: for the
//! same recipe and store, the `keys` that `plan --json` reports are the keys
//! `build --json` used.

use crate::support::*;
use serde_json::Value;

fn plan_keys(dir: &std::path::Path, recipe: &str, store: &str) -> Value {
    let out = run(dir, &["plan", recipe, "--store", store, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    json(&out)["keys"].clone()
}

fn build_json(dir: &std::path::Path, recipe: &str, store: &str) -> Value {
    let out = run(dir, &["build", recipe, "--store", store, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    json(&out)
}

#[test]
fn plan_after_a_build_reports_the_keys_the_build_used() {
    let fx = Fx::new();
    let tmp = fx.dir();
    let (_, commit, recipe) = fx.pin();
    let store = fx.store().to_path_buf();
    let (r, s) = (recipe.to_str().unwrap(), store.to_str().unwrap());

    // No lockfile and nothing built: only the commit is known.
    let before = plan_keys(tmp, r, s);
    assert_eq!(before["source"], commit.as_str(), "{before}");
    assert!(before["wheel"].is_null(), "{before}");
    assert!(before["venv"].is_null(), "{before}");

    let built = build_json(tmp, r, s);
    let keys = built["keys"].clone();
    assert_eq!(keys["source"], commit.as_str(), "{keys}");
    assert_eq!(keys["venv"], built["key"], "{built}");
    let wheel = keys["wheel"].as_str().expect("build reports its wheel key");
    assert!(store.join("store/wheels").join(wheel).is_dir(), "{keys}");

    let after = plan_keys(tmp, r, s);
    assert_eq!(after, keys, "plan after the build");
    // And a second build, from the store only, agrees too.
    assert_eq!(build_json(tmp, r, s)["keys"], keys);
}

#[test]
fn with_a_committed_lock_plan_knows_the_wheel_key_before_the_build() {
    let fx = Fx::new();
    let tmp = fx.dir();
    let (_, commit, recipe) = fx.pin();
    let store = fx.store().to_path_buf();
    let (r, s) = (recipe.to_str().unwrap(), store.to_str().unwrap());
    let locked = run(tmp, &["lock", r, "--store", s, "--json"]);
    assert_eq!(code(&locked), 0, "{}", text(&locked));
    let fetched = run(tmp, &["fetch", r, "--store", s]);
    assert_eq!(code(&fetched), 0, "{}", text(&fetched));

    let before = plan_keys(tmp, r, s);
    assert_eq!(before["source"], commit.as_str(), "{before}");
    assert!(
        before["wheel"].is_string(),
        "the lock and checkout are there: {before}"
    );
    // The venv key hashes the built wheel's bytes: unknown until it exists.
    assert!(before["venv"].is_null(), "{before}");

    let keys = build_json(tmp, r, s)["keys"].clone();
    assert_eq!(keys["source"], before["source"]);
    assert_eq!(keys["wheel"], before["wheel"], "plan before the build");
    assert!(keys["venv"].is_string(), "{keys}");
    assert_eq!(plan_keys(tmp, r, s), keys, "plan after the build");
}
