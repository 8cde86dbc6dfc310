//! Pin advance under review: the report, accept, rollback, and forks.

use std::path::{Path, PathBuf};

use crate::support::*;
use serde_json::Value;

/// Two cases: `a` on `model`, `b` on `model-b`.
const TWO_CASES: &str = "smoke:\n  runs: 2\n  cases:\n    - name: a\n      model: ${FX_MODELS}/model\n      prompt: \"The capital of France is Paris, and the\"\n      max_tokens: 16\n      engine_args: {max_model_len: 256, max_num_seqs: 1}\n    - name: b\n      model: ${FX_MODELS}/model-b\n      prompt: \"The capital of France is Paris, and the\"\n      max_tokens: 16\n      engine_args: {max_model_len: 256, max_num_seqs: 1}\n";

/// The fixture at v0.1.0 and, tagged v0.2.0, a commit that biases the token
/// after "river" towards " that": case `a` (model) flips at output position 7
/// (a near-tie), case `b` (model-b already says " that") is unchanged.
fn two_tagged_commits(dir: &Path) -> (PathBuf, String, String) {
    tagged_commits(dir, "2.0")
}

/// [`two_tagged_commits`] with the logit of " that" after "river" raised by
/// `bias` (2.0: a near-tie flip; 5.0: a drift, 3.5 nats apart).
fn tagged_commits(dir: &Path, bias: &str) -> (PathBuf, String, String) {
    let (repo, _) = fixture_repo(dir);
    let c1 = git(&repo, &["rev-parse", "v0.1.0"]);
    git(&repo, &["checkout", "-q", "-b", "release", "v0.1.0"]);
    let model = repo.join("fixturellm/model.py");
    let text = std::fs::read_to_string(&model).unwrap();
    let old =
        "        return _C.log_softmax(_C.next_logits(self.table, self.vocab_size, prev_token))";
    assert!(
        text.contains(old),
        "fixture model.py changed; update this test"
    );
    let new = "        logits = _C.next_logits(self.table, self.vocab_size, prev_token)\n        if prev_token == 15:  # \"river\": prefer \" that\"\n            logits[25] += BIAS\n        return _C.log_softmax(logits)";
    let new = new.replace("BIAS", bias);
    std::fs::write(&model, text.replace(old, &new)).unwrap();
    git(&repo, &["commit", "-qam", "bias after river"]);
    git(&repo, &["tag", "v0.2.0"]);
    let c2 = git(&repo, &["rev-parse", "HEAD"]);
    (repo, c1, c2)
}

/// [`two_tagged_commits`] in `fx`'s directory, and FROM: the recipe
/// `recipes/fx.yaml` at v0.1.0. Returns (repo, c1, c2, from).
fn setup(fx: &Fx) -> (PathBuf, String, String, PathBuf) {
    let dir = fx.dir();
    let (repo, c1, c2) = two_tagged_commits(dir);
    std::fs::create_dir(dir.join("recipes")).unwrap();
    let from = write_recipe(&dir.join("recipes"), "fx", &repo, &c1, TWO_CASES);
    (repo, c1, c2, from)
}

fn case<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
}

#[test]
fn the_report_shows_identity_and_lock_deltas_a_drifted_case_and_an_identical_one() {
    let fx = Fx::new();
    let d = fx.dir();
    let (_repo, c1, c2, from) = setup(&fx);
    let f = from.to_str().unwrap();
    let built = fx.json(&["build", f, "--json"]);
    let from_oracle = PathBuf::from(built["oracle"].as_str().unwrap());
    let from_record = std::fs::read(from_oracle.join("oracle.json")).unwrap();
    assert_eq!(built["runtime_version"], "0.1.0", "built exactly at v0.1.0");
    // A release-tag build (no +g<sha>) is proven by the tag recorded at
    // build time: verify accepts it, and so does doctor.
    fx.exits(&["verify", f], 0);
    let doc = fx.json(&["doctor", "--json"]);
    assert_eq!(doc["problems"].as_array().unwrap().len(), 0, "{doc}");

    // A copy of that venv without oracle.json (as if installed by hand):
    // verify --pin finds the tags at the commit in the store's mirror.
    let copy = d.join("copied-venv");
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(&from_oracle)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    let chmod = std::process::Command::new("chmod")
        .args(["-R", "u+w"])
        .arg(&copy)
        .status()
        .unwrap();
    assert!(chmod.success());
    std::fs::remove_file(copy.join("oracle.json")).unwrap();
    std::fs::remove_file(copy.join("manifest.json")).unwrap();
    let cv = copy.to_str().unwrap();
    fx.exits(&["verify", cv, "--pin", f], 0);

    let report_file = d.join("review.md");
    let out = fx.exits(
        &[
            "advance",
            f,
            &c2[..10],
            "--pin",
            "packaging=24.1",
            "--report",
            report_file.to_str().unwrap(),
            "--json",
        ],
        0,
    );
    let r = json(&out);

    // The compile cost, said before TO was built: model.py is no extension source.
    assert_eq!(
        r["compile_cost"]["since"],
        c1.as_str(),
        "{}",
        r["compile_cost"]
    );
    assert_eq!(r["compile_cost"]["changed"], 0);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("compile cost: no extension source changed since"),
        "{}",
        text(&out)
    );
    assert!(
        std::fs::read_to_string(&report_file)
            .unwrap()
            .contains("Compile cost expected before TO was built: no extension source changed"),
    );

    // TO was a commit: a candidate recipe derived from FROM was written.
    let candidate = d.join("recipes").join(format!("fx-{}.yaml", &c2[..9]));
    assert_eq!(r["candidate_recipe"], candidate.to_str().unwrap());
    let yaml = std::fs::read_to_string(&candidate).unwrap();
    assert!(
        yaml.contains(&c2) && yaml.contains("packaging: '24.1'")
            || yaml.contains("packaging: \"24.1\"")
            || yaml.contains("packaging: 24.1"),
        "{yaml}"
    );

    // Commits: one ahead, on upstream branches/tags.
    assert_eq!(r["commits"]["counts"]["ahead"], 1);
    assert_eq!(r["commits"]["counts"]["descends"], true);
    assert!(r["commits"]["flag"].is_null(), "{}", r["commits"]);

    // Identity delta: the version moved from the v0.1.0 tag to v0.2.0.
    let rv = r["identity"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["field"] == "runtime_version")
        .unwrap();
    assert_eq!(
        (
            rv["from"].as_str(),
            rv["to"].as_str(),
            rv["changed"].as_bool()
        ),
        (Some("0.1.0"), Some("0.2.0"), Some(true))
    );

    // Lock delta: the package itself and the overridden pin.
    let changed: Vec<String> = r["package_delta"]["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c[0].as_str().unwrap().to_string())
        .collect();
    assert!(
        changed.contains(&"fixturellm".to_string()) && changed.contains(&"packaging".to_string()),
        "{changed:?}"
    );
    assert!(
        r["recipe_delta"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["field"] == "pins.packaging"),
        "{}",
        r["recipe_delta"]
    );

    // The resolved locks: the overridden pin moved in the runtime lock, and
    // the pin blocks say so side by side.
    let runtime = r["resolved_lock"]["runtime"]["changes"].as_array().unwrap();
    let packaging = runtime
        .iter()
        .find(|c| c["name"] == "packaging")
        .unwrap_or_else(|| panic!("{}", r["resolved_lock"]));
    assert_eq!(
        (packaging["to"].as_str(), packaging["status"].as_str()),
        (Some("24.1"), Some("changed")),
        "{packaging}"
    );
    assert_eq!(
        r["pin_blocks"],
        serde_json::json!([{"package": "packaging", "from": null, "to": "24.1", "changed": true}])
    );
    // Neither tree has a CMake build: no source, no toolchain statement.
    assert_eq!(r["ext_sources"]["sources"], serde_json::json!([]));
    assert_eq!(r["toolchain"]["rows"], serde_json::json!([]));

    // Case a drifted at position 7 (a near-tie), case b identical.
    let a = case(&r, "a");
    assert_eq!(a["status"], "near-tie flip", "{a}");
    assert_eq!(a["divergence"]["position"], 7);
    assert_eq!(a["divergence"]["golden_token"], 16);
    assert_eq!(a["divergence"]["token"], 25);
    assert_eq!(a["divergence"]["near_tie"], true);
    assert_eq!(case(&r, "b")["status"], "identical");
    assert_eq!(r["from"]["verdict"], "gateable");
    assert_eq!(r["to"]["verdict"], "gateable");

    // The Markdown report says the same, and what it does not establish.
    let md = std::fs::read_to_string(&report_file).unwrap();
    let packaging_row = format!(
        "| runtime | packaging | {} | 24.1 | changed |",
        packaging["from"].as_str().unwrap()
    );
    for needle in [
        "## Identity",
        "**changed**",
        "| fixturellm | 0.1.0 | 0.2.0 |",
        "**near-tie flip**",
        "first divergent position 7",
        "near-tie",
        "**identical**",
        "does not establish",
        // The fixture's setup.py build runs no CMake: no family on either side.
        "## Kernel families (as each tree's configure reported them)",
        "0 gained, 0 lost, 0 built by both.",
        "## Resolved lock delta (build and runtime locks)",
        packaging_row.as_str(),
        "| packaging | — | 24.1 | **changed** |",
        "No FetchContent source is declared at either commit.",
        "Neither tree states a CMake minimum, a compiler condition, a CUDA list or a Rust build.",
    ] {
        assert!(md.contains(needle), "report lacks {needle:?}:\n{md}");
    }
    assert_eq!(
        r["kernel_families"],
        serde_json::json!({"gained": [], "lost": [], "kept": 0, "not_known": null}),
        "{}",
        r["kernel_families"]
    );
    // FROM was not touched.
    assert_eq!(
        std::fs::read(from_oracle.join("oracle.json")).unwrap(),
        from_record
    );
    // Checked against TO's commit (tagged v0.2.0), the copy's 0.1.0 is
    // refused, naming the tag that is at the commit and that it does not match.
    let t = text(&fx.exits(&["verify", cv, "--pin", candidate.to_str().unwrap()], 3));
    assert!(
        t.contains("[FAIL] commit")
            && t.contains("tags at the commit: v0.2.0")
            && t.contains("none matches the version")
            && !t.contains("no tag"),
        "{t}"
    );
    assert!(c1 != c2);
}

#[test]
fn accept_moves_the_alias_only_to_a_gateable_to_and_rollback_restores_it() {
    let fx = Fx::new();
    let d = fx.dir();
    let store = fx.store();
    let (repo, _c1, c2, in_recipes) = setup(&fx);
    // FROM's recipe lives in a directory not called recipes/.
    std::fs::create_dir(d.join("pins")).unwrap();
    let from = d.join("pins/fx.yaml");
    std::fs::rename(&in_recipes, &from).unwrap();
    let f = from.to_str().unwrap();
    let alias = d.join("venvs/vllm-oracle");
    let l = alias.to_str().unwrap();
    let built = fx.json(&["build", f, "--activate", l, "--json"]);
    let from_oracle = PathBuf::from(built["oracle"].as_str().unwrap());
    assert_eq!(std::fs::read_link(&alias).unwrap(), from_oracle);

    // A TO that crashes is built but not gateable: --accept exits 4, the alias stays.
    let bad = TWO_CASES.replace(
        "  runs: 2\n",
        "  runs: 2\n  env: {FIXTURELLM_MODE: crash}\n",
    );
    let to_bad = write_recipe(d, "fx-bad", &repo, &c2, &bad);
    let out = fx.exits(
        &[
            "advance",
            f,
            to_bad.to_str().unwrap(),
            "--accept",
            "--alias",
            l,
        ],
        4,
    );
    assert!(text(&out).contains("refusing to accept"), "{}", text(&out));
    assert_eq!(
        std::fs::read_link(&alias).unwrap(),
        from_oracle,
        "alias unchanged"
    );

    // --accept without --alias is a usage error; so is --alias without --accept.
    fx.exits(&["advance", f, &c2[..12], "--accept"], 2);
    let t = text(&fx.exits(&["advance", f, &c2[..12], "--alias", l], 2));
    assert!(t.contains("add --accept"), "{t}");

    // A gateable TO: the alias moves, FROM is kept as the rollback root.
    let r = fx.json(&["advance", f, &c2[..12], "--accept", "--alias", l, "--json"]);
    let to_oracle = PathBuf::from(r["to"]["oracle"].as_str().unwrap());
    assert_ne!(to_oracle, from_oracle);
    // The candidate recipe is written next to FROM's recipe file.
    let name = format!("fx-{}.yaml", &c2[..9]);
    assert_eq!(
        r["candidate_recipe"],
        d.join("pins").join(&name).to_str().unwrap()
    );
    assert!(d.join("pins").join(&name).is_file());
    assert!(!d.join("recipes").join(&name).exists());
    assert_eq!(std::fs::read_link(&alias).unwrap(), to_oracle);
    let rollback_root = r["accepted"]["root"].as_str().unwrap().to_string() + "-rollback";
    assert_eq!(
        store
            .join("roots")
            .join(&rollback_root)
            .canonicalize()
            .unwrap(),
        from_oracle
    );

    // rollback swaps back atomically; the oracle it leaves stays rooted.
    fx.exits(&["rollback", l], 0);
    assert_eq!(std::fs::read_link(&alias).unwrap(), from_oracle);
    assert_eq!(
        store
            .join("roots")
            .join(&rollback_root)
            .canonicalize()
            .unwrap(),
        to_oracle
    );
    let dry = fx.json(&["gc", "--dry-run", "--json"]);
    let doomed: Vec<&str> = dry["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["entry"].as_str().unwrap())
        .collect();
    assert!(
        !doomed.iter().any(|e| e.starts_with("venvs/")
            && (to_oracle.ends_with(&e[6..]) || from_oracle.ends_with(&e[6..]))),
        "{doomed:?}"
    );
}

#[test]
fn a_to_that_exists_only_on_a_fork_is_flagged() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, _c1, _c2, from) = setup(&fx);
    let fork = d.join("fork");
    git(
        d,
        &[
            "clone",
            "-q",
            repo.to_str().unwrap(),
            fork.to_str().unwrap(),
        ],
    );
    git(&fork, &["checkout", "-q", "v0.1.0"]);
    std::fs::write(fork.join("FORK.md"), "a fork-only change\n").unwrap();
    git(&fork, &["add", "-A"]);
    git(&fork, &["commit", "-qm", "fork only"]);
    let c3 = git(&fork, &["rev-parse", "HEAD"]);
    let to = write_recipe(d, "fx-fork", &fork, &c3, TWO_CASES);
    let r = fx.json(&[
        "advance",
        from.to_str().unwrap(),
        to.to_str().unwrap(),
        "--json",
    ]);
    let flag = r["commits"]["flag"].as_str().unwrap_or("");
    assert!(
        flag.contains("not in the upstream repository") && flag.contains("fork"),
        "{}",
        r["commits"]
    );
    let md = std::fs::read_to_string(r["report_file"].as_str().unwrap()).unwrap();
    assert!(md.contains("**FLAG:**"), "{md}");
    assert_eq!(case(&r, "a")["status"], "identical");
}

#[test]
fn a_to_only_on_an_unmerged_pull_request_is_fetched_by_id_and_flagged() {
    let fx = Fx::new();
    let (repo, _c1, _c2, from) = setup(&fx);
    // A commit reachable only from a pull request's ref, as GitHub keeps
    // one under review: on no branch or tag.
    git(&repo, &["checkout", "-q", "-b", "review", "v0.1.0"]);
    std::fs::write(repo.join("REVIEW.md"), "under review\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "under review"]);
    let pr = git(&repo, &["rev-parse", "HEAD"]);
    git(&repo, &["update-ref", "refs/pull/7/head", &pr]);
    git(&repo, &["checkout", "-q", "release"]);
    git(&repo, &["branch", "-q", "-D", "review"]);
    let r = fx.json(&["advance", from.to_str().unwrap(), &pr, "--json"]);
    let flag = r["commits"]["flag"].as_str().unwrap_or("");
    assert!(
        flag.contains("on no branch or tag") && flag.contains(&pr),
        "{}",
        r["commits"]
    );
    assert_eq!(case(&r, "a")["status"], "identical", "{r}");

    // A full id the repository does not have: refused naming it (exit 2).
    let missing = "0123456789abcdef0123456789abcdef01234567";
    let out = fx.run(&["advance", from.to_str().unwrap(), missing]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains(&format!("does not have commit {missing}")),
        "{}",
        text(&out)
    );
}

/// The fixture built with CMake (one FetchContent source `dep` from the
/// git repository `ext`, at `tag`), `minimum` as its CMake minimum and
/// `extra` appended to its CMakeLists.txt, committed; returns the commit.
fn cmake_commit(repo: &Path, ext: &Path, minimum: &str, tag: &str, extra: &str) -> String {
    std::fs::write(
        repo.join("CMakeLists.txt"),
        format!(
            "cmake_minimum_required(VERSION {minimum})\nproject(fixturellm LANGUAGES C)\ninclude(FetchContent)\nfind_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)\nPython3_add_library(_C MODULE WITH_SOABI csrc/ops.c)\nFetchContent_Declare(dep GIT_REPOSITORY file://{} GIT_TAG {tag})\nFetchContent_MakeAvailable(dep)\n{extra}",
            ext.display()
        ),
    )
    .unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixture/cmake/requirements/build/cpu.txt"),
        repo.join("requirements/build/cpu.txt"),
    )
    .unwrap();
    git(repo, &["add", "-A"]);
    git(
        repo,
        &["commit", "-qm", &format!("cmake {minimum}, dep {tag}")],
    );
    git(repo, &["rev-parse", "HEAD"])
}

#[test]
fn the_report_shows_the_external_source_revision_and_the_cmake_minimum_to_changed() {
    let fx = Fx::new();
    let d = fx.dir();
    // The external source: v1.0, then v1.1.
    let ext = d.join("ext-dep");
    std::fs::create_dir_all(&ext).unwrap();
    for tag in ["v1.0", "v1.1"] {
        std::fs::write(ext.join("fixture-ext.txt"), format!("dep {tag}\n")).unwrap();
        git(&ext, &["init", "-q"]);
        git(&ext, &["add", "-A"]);
        git(&ext, &["commit", "-qm", tag]);
        git(&ext, &["tag", tag]);
    }
    let (repo, _) = fx.repo();
    let c1 = cmake_commit(&repo, &ext, "3.26", "v1.0", "");
    // TO raises the minimum, moves the source and adds a compiler floor.
    let c2 = cmake_commit(
        &repo,
        &ext,
        "3.27",
        "v1.1",
        "if(CMAKE_C_COMPILER_VERSION VERSION_LESS 4.0)\n  message(FATAL_ERROR \"needs a C compiler >= 4.0\")\nendif()\n",
    );
    let from = fx.recipe("fx", &repo, &c1, SMOKE);
    let report_file = d.join("review.md");
    let r = fx.json(&[
        "advance",
        from.to_str().unwrap(),
        &c2[..12],
        "--report",
        report_file.to_str().unwrap(),
        "--json",
    ]);

    // External sources: dep moved from v1.0 to v1.1, file:line on each side.
    let dep = &r["ext_sources"]["sources"][0];
    assert_eq!(
        (
            dep["name"].as_str(),
            dep["status"].as_str(),
            dep["from"][0]["revision"].as_str(),
            dep["to"][0]["revision"].as_str(),
            dep["to"][0]["at"].as_str(),
        ),
        (
            Some("dep"),
            Some("changed"),
            Some("v1.0"),
            Some("v1.1"),
            Some("CMakeLists.txt:6")
        ),
        "{}",
        r["ext_sources"]
    );
    // Toolchain: the CMake minimum changed, the compiler condition is new.
    let rows = r["toolchain"]["rows"].as_array().unwrap();
    let cmake = rows.iter().find(|x| x["kind"] == "cmake").unwrap();
    assert_eq!(
        (
            cmake["status"].as_str(),
            cmake["from"]["text"].as_str(),
            cmake["to"]["text"].as_str()
        ),
        (
            Some("changed"),
            Some("cmake_minimum_required(VERSION 3.26)"),
            Some("cmake_minimum_required(VERSION 3.27)")
        ),
        "{rows:?}"
    );
    let compiler = rows.iter().find(|x| x["kind"] == "compiler").unwrap();
    assert_eq!(compiler["status"], "added");
    assert_eq!(compiler["to"]["at"], "CMakeLists.txt:8");
    // The resolved locks: same requirements, so every package unchanged,
    // the build lock holding CMake.
    let build = &r["resolved_lock"]["build"];
    assert!(
        r["resolved_lock"]["not_known"].is_null(),
        "{}",
        r["resolved_lock"]
    );
    assert_eq!(build["changes"], serde_json::json!([]), "{build}");
    assert!(build["unchanged"].as_u64().unwrap() >= 3, "{build}");
    assert!(r["pin_blocks"].is_array(), "{r}");
    // The compile cost is in the JSON: the CMake build changed.
    assert_eq!(r["compile_cost"]["since"], c1.as_str());
    assert!(
        r["compile_cost"]["build_files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "CMakeLists.txt"),
        "{}",
        r["compile_cost"]
    );

    let md = std::fs::read_to_string(&report_file).unwrap();
    let dep_row = format!(
        "| dep | file://{} | `v1.0` (CMakeLists.txt:6) | `v1.1` (CMakeLists.txt:6) | **changed** |",
        ext.display()
    );
    for needle in [
        "## Resolved lock delta (build and runtime locks)",
        "## External sources (what CMake fetches at each commit)",
        dep_row.as_str(),
        "## Toolchain requirements (as each tree states them)",
        "| CMake | `cmake_minimum_required(VERSION 3.26)` (CMakeLists.txt:1) | `cmake_minimum_required(VERSION 3.27)` (CMakeLists.txt:1) | **changed** |",
        "| compiler | — | `if(CMAKE_C_COMPILER_VERSION VERSION_LESS 4.0)` (CMakeLists.txt:8) | **added** |",
        "## Pin blocks (recipe `pins` of each side)",
    ] {
        assert!(md.contains(needle), "report lacks {needle:?}:\n{md}");
    }
}

/// One case, `a`, with two prompts: the first passes "river" (where TO's
/// bias makes it drift), the second never does.
const TWO_PROMPTS: &str = "smoke:\n  runs: 2\n  cases:\n    - name: a\n      model: ${FX_MODELS}/model\n      prompts:\n        - \"The capital of France is Paris, and the\"\n        - \"Tourists visit Paris in France\"\n      max_tokens: 16\n      engine_args: {max_model_len: 256, max_num_seqs: 1}\n";

fn prompt_of<'a>(report: &'a Value, name: &str, prompt: u64) -> &'a Value {
    report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name && c["prompt_index"] == prompt)
        .unwrap_or_else(|| panic!("no {name}[{prompt}] in {}", report["cases"]))
}

#[test]
fn a_golden_campaign_records_to_s_goldens_only_with_a_reason_and_rollback_restores_from_s() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, _c1, c2) = tagged_commits(d, "5.0");
    std::fs::create_dir(d.join("recipes")).unwrap();
    let c1 = git(&repo, &["rev-parse", "v0.1.0"]);
    let from = write_recipe(&d.join("recipes"), "fx", &repo, &c1, TWO_PROMPTS);
    let f = from.to_str().unwrap();
    let alias = d.join("venvs/vllm-oracle");
    let l = alias.to_str().unwrap();
    let built = fx.json(&["build", f, "--activate", l, "--json"]);
    let from_oracle = PathBuf::from(built["oracle"].as_str().unwrap());

    // FROM's goldens: one file for the case, one entry per prompt.
    fx.exits(&["smoke", f, "--record-golden"], 0);
    let from_golden = d.join("goldens/fx/a.json");
    let from_bytes = std::fs::read(&from_golden).unwrap();
    let g = read_json(&from_golden);
    assert_eq!(g["format"], "oracle-build-golden-set/1", "{g}");
    assert_eq!(g["entries"].as_array().unwrap().len(), 2, "{g}");
    assert_eq!(g["entries"][1]["prompt"], "Tourists visit Paris in France");
    assert_eq!(g["entries"][0]["output_token_ids"][7], 16, "{g}");

    // --accept-drift without its --reason, or naming no case of TO: exit 2
    // before anything is built.
    let t = text(&fx.exits(
        &[
            "advance",
            f,
            &c2[..12],
            "--accept",
            "--alias",
            l,
            "--accept-drift",
            "a",
        ],
        2,
    ));
    assert!(t.contains("needs its --reason"), "{t}");
    let t = text(&fx.exits(
        &[
            "advance",
            f,
            &c2[..12],
            "--accept",
            "--alias",
            l,
            "--accept-drift",
            "zz",
            "--reason",
            "x",
        ],
        2,
    ));
    assert!(t.contains("has no such case"), "{t}");

    // Prompt 0 drifts on TO (not a near-tie), prompt 1 is identical: --accept
    // refuses (exit 4), records no golden and leaves the alias.
    let to_golden = d.join(format!("goldens/fx-{}/a.json", &c2[..9]));
    let out = fx.exits(
        &["advance", f, &c2[..12], "--accept", "--alias", l, "--json"],
        4,
    );
    assert!(
        text(&out).contains("refusing to accept: TO drifted from FROM")
            && text(&out).contains("a[0] drifted"),
        "{}",
        text(&out)
    );
    let r = json(&out);
    let p0 = prompt_of(&r, "a", 0);
    assert_eq!(p0["status"], "drifted", "{p0}");
    assert_eq!(p0["divergence"]["position"], 7);
    assert_eq!(p0["divergence"]["golden_token"], 16);
    assert_eq!(p0["divergence"]["token"], 25);
    assert_eq!(p0["divergence"]["near_tie"], false);
    assert_eq!(p0["to_runs"], "2 runs agree");
    assert_eq!(prompt_of(&r, "a", 1)["status"], "identical");
    assert!(r["goldens"].is_null(), "{}", r["goldens"]);
    assert!(!to_golden.exists());
    assert_eq!(std::fs::read_link(&alias).unwrap(), from_oracle);

    // Named with a reason: TO's goldens are recorded with it, FROM's stay.
    let reason = "the bias after river is the fix under review";
    let r = fx.json(&[
        "advance",
        f,
        &c2[..12],
        "--accept",
        "--alias",
        l,
        "--accept-drift",
        "a",
        "--reason",
        reason,
        "--json",
    ]);
    let to_oracle = PathBuf::from(r["to"]["oracle"].as_str().unwrap());
    assert_eq!(std::fs::read_link(&alias).unwrap(), to_oracle);
    assert_eq!(r["goldens"]["accepted_drift"][0]["case"], "a");
    assert_eq!(r["goldens"]["accepted_drift"][0]["reason"], reason);
    assert_eq!(
        r["goldens"]["recorded"][0]["path"],
        to_golden.to_str().unwrap(),
        "{}",
        r["goldens"]
    );
    let tg = read_json(&to_golden);
    assert_eq!(tg["format"], "oracle-build-golden-set/1");
    assert_eq!(tg["entries"].as_array().unwrap().len(), 2);
    assert_eq!(tg["entries"][0]["output_token_ids"][7], 25, "{tg}");
    assert_eq!(tg["advance"]["accepted_drift"]["reason"], reason, "{tg}");
    assert_eq!(tg["advance"]["from"]["commit"], c1.as_str());
    assert_eq!(tg["advance"]["results"][0]["status"], "drifted");
    assert_eq!(
        std::fs::read(&from_golden).unwrap(),
        from_bytes,
        "FROM's golden untouched"
    );
    let md = std::fs::read_to_string(r["report_file"].as_str().unwrap()).unwrap();
    let accepted = format!("- drift of case a accepted: {reason}");
    for needle in [
        "## Golden campaign",
        "| a | 0: \"The capital of France is Paris, and the\" | **drifted** |",
        "| a | 1: \"Tourists visit Paris in France\" | **identical** |",
        accepted.as_str(),
        "2 runs agree",
    ] {
        assert!(md.contains(needle), "report lacks {needle:?}:\n{md}");
    }

    // TO gates against its own goldens.
    let candidate = d.join(format!("recipes/fx-{}.yaml", &c2[..9]));
    let sm = fx.json(&["smoke", candidate.to_str().unwrap(), "--json"]);
    for c in sm["smoke"]["cases"].as_array().unwrap() {
        assert_eq!(c["golden"], "matched", "{c}");
        assert_eq!(c["golden_path"], to_golden.to_str().unwrap());
    }

    // rollback: FROM's oracle, and FROM's goldens are the ones that gate.
    fx.exits(&["rollback", l], 0);
    assert_eq!(std::fs::read_link(&alias).unwrap(), from_oracle);
    let sm = fx.json(&["smoke", f, "--json"]);
    assert_eq!(sm["smoke"]["verdict"], "gateable", "{sm}");
    let cases = sm["smoke"]["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    for c in cases {
        assert_eq!(c["golden"], "matched", "{c}");
        assert_eq!(c["golden_path"], from_golden.to_str().unwrap());
    }
}

/// One case, two runs: the stack tests compare requirements, not outputs.
const ONE_CASE: &str = "smoke:\n  runs: 2\n  cases:\n    - name: a\n      model: ${FX_MODELS}/model\n      prompt: \"The capital of France is Paris, and the\"\n      max_tokens: 8\n      engine_args: {max_model_len: 256, max_num_seqs: 1}\n";

/// FROM: `recipes/fx.yaml` at v0.1.0 pinning `packaging: 24.1` (a tree
/// that leaves packaging open). TO, tagged v0.2.0: its requirement files
/// re-pin packaging (`packaging==24.2`, requirements/common.txt:3), add
/// `six==1.17.0` (requirements/common.txt:5) and raise a build requirement
/// (`setuptools>=70`, requirements/build/cpu.txt:3). Returns (c2, from).
fn stack_setup(fx: &Fx) -> (String, PathBuf) {
    let dir = fx.dir();
    let (repo, _) = fixture_repo(dir);
    let c1 = git(&repo, &["rev-parse", "v0.1.0"]);
    git(&repo, &["checkout", "-q", "-b", "release", "v0.1.0"]);
    let edit = |rel: &str, old: &str, new: &str| {
        let p = repo.join(rel);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.contains(old),
            "fixture {rel} changed; update this test"
        );
        std::fs::write(&p, text.replacen(old, new, 1)).unwrap();
    };
    edit(
        "requirements/common.txt",
        "packaging\nidna\n",
        "packaging==24.2\nidna\nsix==1.17.0\n",
    );
    edit(
        "requirements/build/cpu.txt",
        "setuptools>=69\n",
        "setuptools>=70\n",
    );
    git(
        &repo,
        &[
            "commit",
            "-qam",
            "re-pin packaging, add six, raise setuptools",
        ],
    );
    git(&repo, &["tag", "v0.2.0"]);
    let c2 = git(&repo, &["rev-parse", "HEAD"]);
    std::fs::create_dir(dir.join("recipes")).unwrap();
    let extra = format!("pins:\n  packaging: \"24.1\"\n{ONE_CASE}");
    let from = write_recipe(&dir.join("recipes"), "fx", &repo, &c1, &extra);
    (c2, from)
}

fn pin_row<'a>(r: &'a Value, package: &str) -> &'a Value {
    r["pins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["package"] == package)
        .unwrap_or_else(|| panic!("no pin row for {package}: {}", r["pins"]))
}

fn change<'a>(r: &'a Value, set: &str, package: &str) -> &'a Value {
    r["requirements"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["set"] == set && c["package"] == package)
        .unwrap_or_else(|| panic!("no {set} change of {package}: {}", r["requirements"]))
}

#[test]
fn a_pin_tos_tree_contradicts_is_not_carried_and_the_report_names_the_requirement_delta() {
    let fx = Fx::new();
    let d = fx.dir();
    let (c2, from) = stack_setup(&fx);
    let f = from.to_str().unwrap();
    let report_file = d.join("review.md");
    let r = fx.json(&[
        "advance",
        f,
        &c2[..12],
        "--report",
        report_file.to_str().unwrap(),
        "--json",
    ]);

    // The candidate does not carry FROM's packaging pin: TO's tree decides.
    let candidate = d.join("recipes").join(format!("fx-{}.yaml", &c2[..9]));
    let yaml = std::fs::read_to_string(&candidate).unwrap();
    assert!(
        !yaml
            .lines()
            .any(|l| l.trim_start().starts_with("packaging:")),
        "{yaml}"
    );
    assert!(yaml.contains("packaging: not carried"), "{yaml}");
    let p = pin_row(&r, "packaging");
    assert_eq!(p["decision"], "not_carried", "{p}");
    assert_eq!(p["from_pin"], "24.1");
    assert!(p["candidate"].is_null(), "{p}");
    assert_eq!(p["tree"][0]["requirement"], "packaging==24.2", "{p}");
    assert_eq!(p["tree"][0]["file"], "requirements/common.txt");
    assert_eq!(p["tree"][0]["line"], 3);

    // TO's oracle holds TO's version.
    let changed = r["package_delta"]["changed"].as_array().unwrap();
    assert!(
        changed.contains(&serde_json::json!(["packaging", "24.1", "24.2"])),
        "{}",
        r["package_delta"]
    );
    assert!(
        r["package_delta"]["added"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a[0] == "six" && a[1] == "1.17.0"),
        "{}",
        r["package_delta"]
    );

    // The requirement delta names all three changes, with file:line each side.
    let pk = change(&r, "runtime", "packaging");
    assert_eq!(pk["change"], "changed");
    assert_eq!(
        (&pk["from"][0]["requirement"], &pk["from"][0]["line"]),
        (&Value::from("packaging"), &Value::from(3))
    );
    assert_eq!(pk["to"][0]["requirement"], "packaging==24.2");
    let six = change(&r, "runtime", "six");
    assert_eq!(six["change"], "added");
    assert!(six["from"].as_array().unwrap().is_empty());
    assert_eq!(six["to"][0]["line"], 5);
    let st = change(&r, "build", "setuptools");
    assert_eq!(st["change"], "changed");
    assert_eq!(st["from"][0]["requirement"], "setuptools>=69");
    assert_eq!(st["to"][0]["requirement"], "setuptools>=70");
    assert_eq!(st["to"][0]["file"], "requirements/build/cpu.txt");
    let md = std::fs::read_to_string(&report_file).unwrap();
    for needle in [
        "## TO's pins (from TO's tree)",
        "| packaging | 24.1 | `packaging==24.2` (requirements/common.txt:3) | — (TO's tree decides) | **not carried**",
        "## Requirement delta",
        "| runtime | packaging | **changed** | `packaging` (requirements/common.txt:3) | `packaging==24.2` (requirements/common.txt:3) |",
        "| runtime | six | **added** | — | `six==1.17.0` (requirements/common.txt:5) |",
        "| build | setuptools | **changed** | `setuptools>=69` (requirements/build/cpu.txt:3) | `setuptools>=70` (requirements/build/cpu.txt:3) |",
    ] {
        assert!(md.contains(needle), "report lacks {needle:?}:\n{md}");
    }
}

#[test]
fn advance_plan_builds_nothing_and_a_reviewer_pin_against_the_tree_is_kept_and_warned() {
    let fx = Fx::new();
    let d = fx.dir();
    let store = fx.store();
    let (c2, from) = stack_setup(&fx);
    let f = from.to_str().unwrap();
    let candidate = d.join("recipes").join(format!("fx-{}.yaml", &c2[..9]));
    // A `--pin` that is not one exact version is refused as the argument
    // it is, before a candidate recipe is derived or anything fetched.
    for (bad, says) in [
        ("packaging=>=24", "not an exact version"),
        ("pack aging=24.1", "not a distribution name"),
    ] {
        let t = text(&fx.exits(&["advance", f, &c2[..12], "--plan", "--pin", bad], 2));
        assert!(
            t.contains(&format!("--pin {bad:?}")) && t.contains(says),
            "{t}"
        );
        assert!(!candidate.exists(), "{t}");
    }
    let r = fx.json(&[
        "advance",
        f,
        &c2[..12],
        "--plan",
        "--pin",
        "packaging=24.1",
        "--json",
    ]);
    assert_eq!(r["plan_only"], true);
    // Nothing built: no wheel, no oracle.
    for bucket in ["wheels", "venvs"] {
        let entries: Vec<_> = std::fs::read_dir(store.join(bucket))
            .map(|rd| rd.collect())
            .unwrap_or_default();
        assert!(entries.is_empty(), "{bucket}: {entries:?}");
    }
    // The reviewer's pin is kept, and said to be the reviewer's.
    let p = pin_row(&r, "packaging");
    assert_eq!(p["decision"], "reviewer", "{p}");
    assert_eq!(p["candidate"], "24.1");
    assert_eq!(p["contradicts_tree"], true);
    let yaml = std::fs::read_to_string(&candidate).unwrap();
    assert!(yaml.contains("packaging: reviewer"), "{yaml}");
    let md = std::fs::read_to_string(r["report_file"].as_str().unwrap()).unwrap();
    for needle in [
        "# Pin advance (plan, nothing built)",
        "## Commits",
        "**reviewer**: --pin packaging=24.1",
        "| runtime | six | **added** |",
        "| build | setuptools | **changed** |",
    ] {
        assert!(md.contains(needle), "plan lacks {needle:?}:\n{md}");
    }
    assert_eq!(change(&r, "runtime", "packaging")["change"], "changed");

    // plan and build of that candidate name both the pin and the tree's line.
    let c = candidate.to_str().unwrap();
    let out = fx.run(&["plan", c]);
    let t = text(&out);
    assert!(
        t.contains("pin `packaging: 24.1`")
            && t.contains("`packaging==24.2` (requirements/common.txt:3)"),
        "{t}"
    );
    let built = fx.exits(&["build", c, "--json"], 0);
    let err = String::from_utf8_lossy(&built.stderr);
    assert!(
        err.contains("warning: pin `packaging: 24.1`")
            && err.contains("`packaging==24.2` (requirements/common.txt:3)"),
        "{}",
        text(&built)
    );
    // Once built, the wheel's own Requires-Dist says the same.
    assert!(
        err.contains("warning: pin `packaging: 24.1` contradicts the built wheel's Requires-Dist `packaging==24.2`"),
        "{}",
        text(&built)
    );
    // The build stays possible and holds the reviewer's version.
    let b = json(&built);
    let venv = PathBuf::from(b["oracle"].as_str().unwrap());
    let site: Vec<_> = std::fs::read_dir(venv.join("lib/python3.11/site-packages"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("packaging-"))
        .collect();
    assert_eq!(site, ["packaging-24.1.dist-info"], "{site:?}");
}
