//! A CMake source declared twice under an if/else (vLLM's oneDNN in
//! `cmake/cpu_extension.cmake`): resolved for the target when the condition
//! is on the processor, left to the tree's CMake (through the dependency
//! provider) when the tree computes it, refused when a candidate cannot be
//! staged. The CMake fixture (`tests/fixture/cmake`) with `fxplain`'s
//! declaration replaced, and a second revision `v2.0` of its repository.

use std::path::Path;
use std::process::Output;

use crate::real::cmake_fixture;
use crate::support::*;
use serde_json::Value;

/// Exit 0, or a `build --no-smoke` that built (exit 4, "not smoked").
fn ok(out: &Output) {
    let t = text(out);
    let unsmoked = code(out) == 4 && t.contains("not smoked");
    assert!(code(out) == 0 || unsmoked, "exit {}: {t}", code(out));
}

/// `oracle-build <args> --store <store> --json` in `d`.
pub(crate) fn run_store(d: &Path, args: &[&str], store: &Path) -> Output {
    cmd(d)
        .args(args)
        .args(["--store", store.to_str().unwrap(), "--json"])
        .output()
        .unwrap()
}

/// `fxplain.cmake` replaced by `text`, committed; the recipe of that commit.
fn commit_plain(d: &Path, repo: &Path, name: &str, text: &str) -> std::path::PathBuf {
    std::fs::write(repo.join("cmake/external_projects/fxplain.cmake"), text).unwrap();
    git(repo, &["commit", "-qam", name]);
    let commit = git(repo, &["rev-parse", "HEAD"]);
    let path = d.join(format!("{name}.yaml"));
    std::fs::write(&path, recipe_text(name, repo, &commit, "")).unwrap();
    path
}

/// Builds `recipe` (lock, then build without smoke); returns the wheel's build.json.
fn build(d: &Path, recipe: &Path, store: &Path) -> (Value, Value) {
    ok(&run_store(d, &["lock", recipe.to_str().unwrap()], store));
    let out = run_store(d, &["build", recipe.to_str().unwrap(), "--no-smoke"], store);
    ok(&out);
    let res = json(&out);
    let key = res["keys"]["wheel"].as_str().unwrap().to_string();
    let rec = read_json(&store.join("store/wheels").join(&key).join("build.json"));
    (res, rec)
}

/// What the built extension says `fxplain` was built from (its fixture-ext.txt).
fn built_plain(res: &Value) -> String {
    let oracle = Path::new(res["oracle"].as_str().unwrap());
    let out = std::process::Command::new(oracle.join("bin/python"))
        .args([
            "-c",
            "import fixturellm._C, fixturellm._cmake_sources as s; print(s.SOURCES['fxplain'])",
        ])
        .current_dir("/")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The fxplain entries staged in the store (their names).
fn staged_plain(store: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(store.join("store/ext"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fxplain-"))
        .collect();
    v.sort();
    v
}

#[test]
fn conditional_double_declaration_resolved_for_the_processor_or_by_cmake_or_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, _) = cmake_fixture(d);
    let ext = d.join("ext");
    let plain = ext.join("fxplain");
    std::fs::write(plain.join("fixture-ext.txt"), "fxplain v2.0\n").unwrap();
    git(&plain, &["commit", "-qam", "v2"]);
    git(&plain, &["tag", "v2.0"]);
    let url = format!("file://{}", plain.display());
    let store = d.join("store");

    // (a) An if/else on the processor, the other platform's branch first
    // (as vLLM's aarch64 oneDNN): only this machine's is staged and built.
    let other = if std::env::consts::ARCH == "aarch64" {
        "x86_64"
    } else {
        "aarch64"
    };
    let recipe = commit_plain(
        d,
        &repo,
        "fxproc",
        &format!(
            "if(CMAKE_SYSTEM_PROCESSOR MATCHES \"{other}\")\n  FetchContent_Declare(fxplain GIT_REPOSITORY {url} GIT_TAG v1.0)\nelse()\n  FetchContent_Declare(fxplain GIT_REPOSITORY {url} GIT_TAG v2.0)\nendif()\nFetchContent_MakeAvailable(fxplain)\n"
        ),
    );
    let (res, rec) = build(d, &recipe, &store);
    assert_eq!(built_plain(&res), "fxplain v2.0");
    let staged = staged_plain(&store);
    assert!(
        staged.len() == 1 && staged[0].starts_with("fxplain-v2.0-"),
        "{staged:?}"
    );
    let taken: Vec<&Value> = rec["ext_taken"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == "fxplain")
        .collect();
    assert_eq!(taken.len(), 1, "{rec}");
    assert_eq!(
        taken[0]["declared"],
        "cmake/external_projects/fxplain.cmake:4"
    );
    assert_eq!(taken[0]["decided"], "target");
    assert_eq!(taken[0]["origin"]["git"]["tag"], "v2.0");
    assert_eq!(
        taken[0]["commit"].as_str().unwrap(),
        git(&plain, &["rev-parse", "v2.0"])
    );

    // (b) An if/else on a variable the tree computes (a function, like
    // vLLM's find_isa for ASIMD_FOUND): both staged, none passed through
    // FETCHCONTENT_SOURCE_DIR_FXPLAIN, and CMake's own choice (the else
    // branch) is the one built and recorded as decided at configure.
    let recipe = commit_plain(
        d,
        &repo,
        "fxisa",
        &format!(
            "function(fx_find_isa out)\n  set(${{out}} OFF PARENT_SCOPE)\nendfunction()\nfx_find_isa(FX_ISA_FOUND)\nif(FX_ISA_FOUND)\n  FetchContent_Declare(fxplain GIT_REPOSITORY {url} GIT_TAG v1.0)\nelse()\n  FetchContent_Declare(fxplain GIT_REPOSITORY {url} GIT_TAG v2.0)\nendif()\nFetchContent_MakeAvailable(fxplain)\n"
        ),
    );
    let (res, rec) = build(d, &recipe, &store);
    assert_eq!(built_plain(&res), "fxplain v2.0");
    let staged = staged_plain(&store);
    assert_eq!(staged.len(), 2, "{staged:?}");
    let args = rec["env"]["CMAKE_ARGS"].as_str().unwrap();
    assert!(!args.contains("FETCHCONTENT_SOURCE_DIR_FXPLAIN"), "{args}");
    assert!(
        args.contains("-DCMAKE_PROJECT_TOP_LEVEL_INCLUDES="),
        "{args}"
    );
    let taken: Vec<&Value> = rec["ext_taken"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == "fxplain")
        .collect();
    assert_eq!(taken.len(), 1, "{rec}");
    assert_eq!(
        taken[0]["declared"],
        "cmake/external_projects/fxplain.cmake:8"
    );
    assert_eq!(taken[0]["decided"], "configure");
    assert_eq!(taken[0]["origin"]["git"]["tag"], "v2.0");
    // The key holds both candidates.
    let keyed: Vec<&Value> = rec["inputs"]["ext"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == "fxplain")
        .collect();
    assert_eq!(keyed.len(), 2, "{}", rec["inputs"]["ext"]);

    // (c) A candidate whose revision the CMake files cannot give: refused
    // before any build, naming both declarations.
    let wheels = std::fs::read_dir(store.join("store/wheels"))
        .unwrap()
        .count();
    let recipe = commit_plain(
        d,
        &repo,
        "fxrefused",
        &format!(
            "function(fx_find_isa out)\n  set(${{out}} OFF PARENT_SCOPE)\nendfunction()\nfx_find_isa(FX_ISA_FOUND)\nif(FX_ISA_FOUND)\n  FetchContent_Declare(fxplain GIT_REPOSITORY {url} GIT_TAG ${{FX_COMPUTED_TAG}})\nelse()\n  FetchContent_Declare(fxplain GIT_REPOSITORY {url} GIT_TAG v2.0)\nendif()\nFetchContent_MakeAvailable(fxplain)\n"
        ),
    );
    ok(&run_store(d, &["lock", recipe.to_str().unwrap()], &store));
    let out = run_store(
        d,
        &["build", recipe.to_str().unwrap(), "--no-smoke"],
        &store,
    );
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert_ne!(code(&out), 4, "{}", text(&out));
    let err = text(&out);
    assert!(
        err.contains("cmake/external_projects/fxplain.cmake:6")
            && err.contains("${FX_COMPUTED_TAG}")
            && err.contains("cmake/external_projects/fxplain.cmake:8")
            && err.contains(&format!("{url} @ v2.0")),
        "{err}"
    );
    assert!(!err.contains("-- Configuring"), "CMake ran: {err}");
    assert_eq!(
        std::fs::read_dir(store.join("store/wheels"))
            .unwrap()
            .count(),
        wheels
    );
}

/// Downloads no redirect can reach, as vLLM's `cmake/cpu_extension.cmake`
/// makes the Arm Compute Library's: `FetchContent_Populate(arm_compute
/// GIT_REPOSITORY ...)` under `if(ASIMD_FOUND)`, a `find_isa` of
/// `/proc/cpuinfo` that only an aarch64 configure sets. Here the tree's
/// function sets its variable off (the x86 outcome), and a second download
/// sits under another processor's branch. Neither blocks an offline
/// rebuild: `plan --offline` is ready and names the first with its
/// condition, and after the wheel and venv are wiped `build --offline`
/// rebuilds with every network path closed (issue 40). An unconditional
/// download still blocks it.
#[test]
fn a_download_the_configure_decides_never_blocks_an_offline_rebuild() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, _) = cmake_fixture(d);
    let url = format!("file://{}", d.join("ext/fxplain").display());
    let store = d.join("store");
    let other = if std::env::consts::ARCH == "aarch64" {
        "x86_64|amd64"
    } else {
        "aarch64|arm64"
    };
    let acl = format!(
        "function(fx_find_isa out)\n  set(${{out}} OFF PARENT_SCOPE)\nendfunction()\nfx_find_isa(FX_ASIMD_FOUND)\nif(FX_ASIMD_FOUND)\n  if(DEFINED ENV{{FX_ACL_ROOT_DIR}} AND IS_DIRECTORY \"$ENV{{FX_ACL_ROOT_DIR}}\")\n    message(STATUS \"Using ACL from $ENV{{FX_ACL_ROOT_DIR}}\")\n  else()\n    FetchContent_Populate(fxacl\n      SUBBUILD_DIR \"${{FETCHCONTENT_BASE_DIR}}/fxacl-subbuild\"\n      GIT_REPOSITORY https://example.invalid/ComputeLibrary.git\n      GIT_TAG v52.6.0)\n  endif()\nendif()\nif(CMAKE_SYSTEM_PROCESSOR MATCHES \"{other}\")\n  FetchContent_Populate(fxother GIT_REPOSITORY https://example.invalid/other.git GIT_TAG v1)\nendif()\nFetchContent_Declare(fxplain GIT_REPOSITORY {url} GIT_TAG v1.0)\nFetchContent_MakeAvailable(fxplain)\n"
    );
    let recipe = commit_plain(d, &repo, "fxacl", &acl);
    let (first, rec) = build(d, &recipe, &store);
    assert_eq!(built_plain(&first), "fxplain v1.0");

    let r = recipe.to_str().unwrap();
    let plan = crate::hermetic::offline_cmd(d)
        .args(["plan", r, "--offline", "--json", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert_eq!(code(&plan), 0, "{}", text(&plan));
    let p = json(&plan);
    assert_eq!(p["offline_missing"], serde_json::json!([]), "{p}");
    let named: Vec<&str> = p["ext_not_blocking"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        named.len() == 1
            && named[0].starts_with(
                "cmake/external_projects/fxplain.cmake:9: FetchContent_Populate(fxacl)"
            )
            && named[0].contains("https://example.invalid/ComputeLibrary.git GIT_TAG v52.6.0")
            && named[0].contains("if(FX_ASIMD_FOUND)"),
        "{named:?}"
    );
    assert!(!plan_text(&p).contains("fxother"), "{p}");

    // The rebuild: wheel and venv gone, every network path closed.
    for b in ["venvs", "wheels"] {
        for e in std::fs::read_dir(store.join("store").join(b)).unwrap() {
            force_remove(&e.unwrap().path());
        }
    }
    let again = crate::hermetic::offline_cmd(d)
        .args(["build", r, "--no-smoke", "--offline", "--json", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    ok(&again);
    let again = json(&again);
    assert_eq!(again["keys"]["wheel"], first["keys"]["wheel"], "{again}");
    assert_eq!(built_plain(&again), "fxplain v1.0");
    // Neither download is staged nor keyed.
    assert!(
        !plan_text(&rec["inputs"]["ext"]).contains("fxacl")
            && !plan_text(&rec["inputs"]["ext"]).contains("fxother"),
        "{rec}"
    );

    // The same download with no condition blocks the offline build, named.
    let bare = commit_plain(
        d,
        &repo,
        "fxaclbare",
        &format!(
            "FetchContent_Populate(fxacl GIT_REPOSITORY https://example.invalid/ComputeLibrary.git GIT_TAG v52.6.0)\nFetchContent_Declare(fxplain GIT_REPOSITORY {url} GIT_TAG v1.0)\nFetchContent_MakeAvailable(fxplain)\n"
        ),
    );
    ok(&run_store(d, &["lock", bare.to_str().unwrap()], &store));
    let plan = crate::hermetic::offline_cmd(d)
        .args([
            "plan",
            bare.to_str().unwrap(),
            "--offline",
            "--json",
            "--store",
        ])
        .arg(&store)
        .output()
        .unwrap();
    let p = json(&plan);
    assert!(
        plan_text(&p["offline_missing"]).contains("FetchContent_Populate(fxacl"),
        "{p}"
    );
}

/// A JSON value as text, for "does not name X" checks.
fn plan_text(v: &Value) -> String {
    v.to_string()
}
