//! Kernel families as the tree's configure reports them (issue 39, items 1
//! and 2): the CMake fixture (`tests/fixture/cmake`) with a
//! `cmake/kernels.cmake` that prints vLLM's lines (as its `CMakeLists.txt`
//! at 5559679229 writes them): one family built for some archs, one skipped
//! for archs, one skipped for the compiler version, and a CPU ISA warning.

use std::path::Path;

use crate::ext_conditions::run_store;
use crate::real::cmake_fixture;
use crate::support::*;
use serde_json::Value;

/// The fixture's kernel messages, each under the `if()` vLLM puts it in.
const KERNELS: &str = r#"# Kernel families, reported as vLLM's CMakeLists.txt reports them.
set(FX_NVCC_VERSION 12.6)
set(MARLIN_ARCHS "8.0;9.0a")
if(MARLIN_ARCHS)
  message(STATUS "Building Marlin kernels for archs: ${MARLIN_ARCHS}")
else()
  message(STATUS "Not building Marlin kernels as no compatible archs found"
                 " in CUDA target architectures")
endif()
set(FP4_SM120_ARCHS "")
if(FP4_SM120_ARCHS)
  message(STATUS "Building SM12x NVFP4 for archs: ${FP4_SM120_ARCHS}")
else()
  message(STATUS "Not building SM12x NVFP4 as no compatible archs were found.")
endif()
set(SCALED_MM_ARCHS "12.0a")
if(FX_NVCC_VERSION VERSION_GREATER_EQUAL 12.8 AND SCALED_MM_ARCHS)
  message(STATUS "Building scaled_mm_c3x_sm120 for archs: ${SCALED_MM_ARCHS}")
else()
  message(STATUS "Not building scaled_mm_c3x_sm120 as CUDA Compiler version is "
                 "not >= 12.8, we recommend upgrading to CUDA 12.8 or "
                 "later if you intend on running FP8 quantized models on "
                 "Blackwell.")
endif()
message(WARNING "Disable AVX512-BF16 ISA support, requires gcc/g++ >= 12.3")
"#;

/// `cmake/kernels.cmake:<line>` of the first line of KERNELS holding `needle`.
fn at(needle: &str) -> String {
    let n = KERNELS.lines().position(|l| l.contains(needle)).unwrap() + 1;
    format!("cmake/kernels.cmake:{n}")
}

/// Writes the recipe `kf.yaml` for `commit` of `repo` with `expect` YAML.
fn recipe(d: &Path, repo: &Path, commit: &str, expect: &str) -> String {
    let path = d.join("kf.yaml");
    std::fs::write(&path, recipe_text("kf", repo, commit, expect)).unwrap();
    path.display().to_string()
}

/// The venv entries of the store.
fn venvs(store: &Path) -> usize {
    std::fs::read_dir(store.join("store/venvs")).map_or(0, |d| d.count())
}

#[test]
fn the_configure_s_kernel_families_are_recorded_shown_and_required() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, _) = cmake_fixture(d);
    std::fs::write(repo.join("cmake/kernels.cmake"), KERNELS).unwrap();
    let lists = repo.join("CMakeLists.txt");
    let cmake = std::fs::read_to_string(&lists).unwrap().replace(
        "Python3_add_library(",
        "include(cmake/kernels.cmake)\n\nPython3_add_library(",
    );
    std::fs::write(&lists, cmake).unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "kernel families"]);
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let store = d.join("store");

    // (a) A required family the configure skipped: the wheel is built,
    // the build stops before the venv (exit 3) naming the family, the
    // tree's reason and where it says so; no venv, no root.
    let r = recipe(
        d,
        &repo,
        &commit,
        "expect:\n  kernel_families: [\"Marlin kernels\", scaled_mm_c3x_sm120]\n",
    );
    let out = run_store(d, &["lock", &r], &store);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = run_store(d, &["build", &r, "--no-smoke"], &store);
    assert_eq!(code(&out), 3, "{}", text(&out));
    let err = json(&out)["error"].as_str().unwrap().to_string();
    assert!(
        err.contains("scaled_mm_c3x_sm120: not built: CUDA Compiler version is not >= 12.8, we recommend upgrading to CUDA 12.8")
            && err.contains(&at("Not building scaled_mm_c3x_sm120"))
            && err.contains("built with no TORCH_CUDA_ARCH_LIST: target_device cpu")
            && !err.contains("Marlin"),
        "{err}"
    );
    assert_eq!(venvs(&store), 0, "a venv was made");
    assert!(!store.join("roots/kf").exists());
    let wheels: Vec<_> = std::fs::read_dir(store.join("store/wheels"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(wheels.len(), 1, "the wheel is kept");
    let rec = read_json(&wheels[0].join("build.json"));

    // build.json: every family in the order printed (CMake's warning goes
    // to stderr, so where it falls among the STATUS lines is CMake's
    // buffering), traced to its message.
    let fams = rec["kernel_families"].as_array().unwrap();
    let names: Vec<&str> = fams
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .filter(|n| *n != "AVX512-BF16 ISA")
        .collect();
    assert_eq!(
        names,
        ["Marlin kernels", "SM12x NVFP4", "scaled_mm_c3x_sm120"],
        "{rec}"
    );
    assert_eq!(fams.len(), 4, "{rec}");
    let by = |n: &str| fams.iter().find(|f| f["name"] == n).unwrap();
    let marlin = by("Marlin kernels");
    assert_eq!(marlin["built"], true);
    assert_eq!(marlin["archs"], serde_json::json!(["8.0", "9.0a"]));
    assert_eq!(
        marlin["declared"],
        serde_json::json!([at("Building Marlin")])
    );
    let fp4 = by("SM12x NVFP4");
    assert_eq!(fp4["built"], false);
    assert_eq!(fp4["reason"], "no compatible archs were found");
    assert_eq!(
        fp4["declared"],
        serde_json::json!([at("Not building SM12x")])
    );
    let sm120 = by("scaled_mm_c3x_sm120");
    assert_eq!(sm120["built"], false);
    assert!(
        sm120["reason"]
            .as_str()
            .unwrap()
            .starts_with("CUDA Compiler version is not >= 12.8")
    );
    let isa = by("AVX512-BF16 ISA");
    assert_eq!(isa["reason"], "requires gcc/g++ >= 12.3");
    assert_eq!(isa["declared"], serde_json::json!([at("message(WARNING")]));

    // plan: the families of the configured key, and the unmet one as a problem.
    let out = run_store(d, &["plan", &r], &store);
    let plan = json(&out);
    assert_eq!(plan["kernel_families"], rec["kernel_families"]);
    let problems = plan["problems"].to_string();
    assert!(
        problems.contains("expect.kernel_families") && problems.contains("scaled_mm_c3x_sm120"),
        "{problems}"
    );
    assert_eq!(code(&out), 1, "{}", text(&out));

    // A name the tree cannot report: refused (exit 2) naming the field and
    // its line, with the names the tree can report; an empty one too.
    let r_typo = recipe(
        d,
        &repo,
        &commit,
        "expect:\n  kernel_families:\n    - SM12X NVFP4\n",
    );
    let out = run_store(d, &["build", &r_typo, "--no-smoke"], &store);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let err = json(&out)["error"].as_str().unwrap().to_string();
    assert!(
        err.contains(
            "line 11: field `expect.kernel_families[0]`: \"SM12X NVFP4\" is no kernel family"
        ) && err.contains("Marlin kernels, SM12x NVFP4, scaled_mm_c3x_sm120"),
        "{err}"
    );
    let r_empty = recipe(d, &repo, &commit, "expect:\n  kernel_families: [\"\"]\n");
    let out = run_store(d, &["plan", &r_empty], &store);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("`expect.kernel_families[0]`"),
        "{}",
        text(&out)
    );

    // (b) The same key without the expectation: the kept wheel is installed.
    let r = recipe(d, &repo, &commit, "");
    let out = run_store(d, &["build", &r, "--no-smoke"], &store);
    assert_eq!(code(&out), 4, "{}", text(&out));
    let built = json(&out);
    assert!(
        !built["built"].to_string().contains("wheel"),
        "the wheel was built again: {built}"
    );
    let venv = built["oracle"].as_str().unwrap().to_string();

    // verify: the families, in JSON and in words.
    let out = run_store(d, &["verify", &r], &store);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["kernel_families"], rec["kernel_families"]);
    let out = cmd(d)
        .args(["verify", &r, "--store", store.to_str().unwrap()])
        .output()
        .unwrap();
    let words = text(&out);
    assert!(
        words.contains("kernel families, as the tree's configure reported them")
            && words.contains(&format!(
                "Marlin kernels: built for 8.0;9.0a ({})",
                at("Building Marlin")
            ))
            && words.contains("SM12x NVFP4: not built: no compatible archs were found"),
        "{words}"
    );
    // verify against the recipe that requires the skipped family: refused.
    let out = run_store(
        d,
        &["verify", &venv, "--pin", &r_expecting(d, &repo, &commit)],
        &store,
    );
    assert_eq!(code(&out), 3, "{}", text(&out));
    let v = json(&out);
    let failed: Vec<&Value> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == false)
        .collect();
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["field"], "kernel family SM12x NVFP4");
    assert!(
        failed[0]["found"]
            .as_str()
            .unwrap()
            .contains("no compatible archs were found")
    );

    // sbom: one property of the package per family.
    let out = run_store(d, &["sbom", &r], &store);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let bom = json(&out);
    let pkg = bom["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["bom-ref"] == "pkg:fixturellm")
        .unwrap();
    let props: Vec<(String, String)> = pkg["properties"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().into(),
                p["value"].as_str().unwrap().into(),
            )
        })
        .collect();
    let prop = |n: &str| {
        props
            .iter()
            .find(|(k, _)| k == &format!("oracle-build:kernel_family:{n}"))
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no property for {n}: {props:?}"))
    };
    assert_eq!(
        prop("Marlin kernels"),
        format!("built for 8.0;9.0a ({})", at("Building Marlin"))
    );
    assert_eq!(
        prop("SM12x NVFP4"),
        format!(
            "not built: no compatible archs were found ({})",
            at("Not building SM12x")
        )
    );
    assert!(
        prop("scaled_mm_c3x_sm120").starts_with("not built: CUDA Compiler version is not >= 12.8")
    );

    // plan of the built key, in words.
    let out = cmd(d)
        .args(["plan", &r, "--store", store.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("families as the tree's configure reported them (build.json):")
            && text(&out).contains("scaled_mm_c3x_sm120: not built: CUDA Compiler version"),
        "{}",
        text(&out)
    );

    // doctor: the oracle checked against a recipe that requires the
    // skipped family (from another store root, so that the store's own
    // diagnosis of the venv, against its oracle.json, does not come first).
    let out = run_store(
        d,
        &[
            "doctor",
            "--venv",
            &venv,
            "--pin",
            &r_expecting(d, &repo, &commit),
        ],
        &d.join("elsewhere"),
    );
    let doc = json(&out);
    let missing = problems_of(&doc, "kernel-family-missing");
    assert_eq!(missing.len(), 1, "{doc}");
    assert!(
        missing[0]["message"]
            .as_str()
            .unwrap()
            .contains("SM12x NVFP4: not built: no compatible archs were found"),
        "{doc}"
    );
}

/// `kf-expect.yaml`: the recipe of the same pin requiring `SM12x NVFP4`.
fn r_expecting(d: &Path, repo: &Path, commit: &str) -> String {
    let path = d.join("kf-expect.yaml");
    std::fs::write(
        &path,
        recipe_text(
            "kf",
            repo,
            commit,
            "expect:\n  kernel_families: [\"SM12x NVFP4\"]\n",
        ),
    )
    .unwrap();
    path.display().to_string()
}
