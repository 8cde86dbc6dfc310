//! The main job end to end, with the real binary, git, uv, python and a real
//! wheel build of the fixture package.

use std::path::Path;
use std::process::Command;

use crate::support::*;

#[test]
fn builds_a_gateable_oracle_then_a_second_run_is_a_no_op() {
    let fx = Fx::new();
    let (_, commit, recipe) = fx.pin();
    let store = fx.store();
    let r = recipe.to_str().unwrap();

    // First run: everything is built. The tools dir is the store's own, so
    // this run also provisions the pinned uv (no uv on PATH here).
    let out = fx
        .cmd(&["build", r])
        .env_remove("ORACLE_BUILD_TOOLS")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("verdict  gateable"), "{stdout}");
    let venv_line = stdout
        .lines()
        .find(|l| l.starts_with("oracle "))
        .expect("prints the oracle path");
    let venv = Path::new(venv_line.trim_start_matches("oracle").trim());
    assert!(
        venv.starts_with(store.join("store/venvs")),
        "{}",
        venv.display()
    );

    // oracle.json holds every identity field of the contract.
    let rec = record(venv);
    let id = &rec["identity"];
    for field in [
        "commit",
        "runtime_version",
        "distribution_version",
        "flashinfer_version",
        "torch_version",
        "torch_cuda",
        "python_version",
        "platform",
        "editable",
        "package_path",
        "compiled_extensions",
        "build_mode",
    ] {
        assert!(id.get(field).is_some(), "identity lacks {field}: {id}");
    }
    assert_eq!(id["commit"], commit.as_str());
    let version = id["runtime_version"].as_str().unwrap();
    let sha = version.split("+g").nth(1).expect("version carries +g<sha>");
    assert!(
        commit.starts_with(sha) && sha.len() >= 7,
        "{version} vs {commit}"
    );
    assert!(
        version.starts_with("0.1.1.dev1"),
        "full history gives the tag distance: {version}"
    );
    assert_eq!(id["editable"], false);
    assert_eq!(id["build_mode"], "source");
    let ext = id["compiled_extensions"].as_array().unwrap();
    assert!(
        ext.iter()
            .any(|e| e["path"].as_str().unwrap().starts_with("_C.")
                && e["size"].as_u64().unwrap() > 0),
        "{ext:?}"
    );
    let site = venv.join("lib/python3.11/site-packages/fixturellm");
    assert!(
        id["package_path"]
            .as_str()
            .unwrap()
            .starts_with(site.to_str().unwrap()),
        "{}",
        id["package_path"]
    );
    assert_eq!(rec["smoke"]["verdict"], "gateable");
    let case = &rec["smoke"]["cases"][0];
    assert_eq!(case["output_token_ids"].as_array().unwrap().len(), 16);
    assert_eq!(case["deterministic"], true);
    assert_eq!(rec["smoke"]["probe"]["ok"], true);
    assert!(
        store.join("tools/uv-0.13.9/bin/uv").exists(),
        "uv was provisioned into the store's tools"
    );
    assert!(
        !venv.join("CACHEDIR.TAG").exists(),
        "the store is not a cache"
    );

    // The built wheel and its record.
    let wheel_key = rec["wheel_key"].as_str().unwrap();
    let build = read_json(
        &store
            .join("store/wheels")
            .join(wheel_key)
            .join("build.json"),
    );
    assert_eq!(build["env"]["VLLM_TARGET_DEVICE"], "cpu");
    assert_eq!(build["env"]["VLLM_USE_PRECOMPILED"], "0");
    assert!(
        build["tools"]["python"]["version"]
            .as_str()
            .unwrap()
            .starts_with("3.11")
    );
    assert!(
        build["tools"]["uv"]["version"]
            .as_str()
            .unwrap()
            .contains("uv")
    );
    assert!(
        store
            .join("store/wheels")
            .join(wheel_key)
            .join("build.log")
            .exists()
    );

    // Second run: nothing changes, nothing is built, same oracle.
    let out2 = fx.run(&["build", r, "--json"]);
    assert_eq!(code(&out2), 0, "{}", text(&out2));
    let report = json(&out2);
    assert_eq!(report["built"].as_array().unwrap().len(), 0, "{report}");
    assert_eq!(report["oracle"], venv.to_str().unwrap());
    assert_eq!(report["verdict"], "gateable");

    // status lists the oracle under its root.
    let st = fx.run(&["status", "--json"]);
    assert_eq!(code(&st), 0, "{}", text(&st));
    let st = json(&st);
    let venvs: Vec<&serde_json::Value> = st["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["entry"].as_str().unwrap().starts_with("venvs/"))
        .collect();
    assert_eq!(venvs.len(), 1);
    assert_eq!(venvs[0]["health"], "ok");
    assert!(
        venvs[0]["roots"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "fx"),
        "{st}"
    );

    // Deleting the source checkout (what disk-pressure pruning does) cannot
    // break the oracle: it was installed non-editably.
    force_remove(&store.join("store/src").join(&commit));
    let py = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import fixturellm, fixturellm._C; print(fixturellm.__file__)",
        ])
        .current_dir("/")
        .output()
        .unwrap();
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    assert!(String::from_utf8_lossy(&py.stdout).contains("site-packages/fixturellm"));
    let v = fx.run(&["verify", r]);
    assert_eq!(code(&v), 0, "{}", text(&v));
}

/// A refused build recorded no oracle in `store` and left no staging.
fn assert_refused_left_nothing(store: &Path) {
    let count = |d: &str| std::fs::read_dir(store.join(d)).unwrap().count();
    assert_eq!(count("store/venvs"), 0, "a refused oracle is not recorded");
    assert_eq!(count("tmp"), 0, "no staging left behind");
}

#[test]
fn expect_mismatch_is_refused_with_exit_3_and_nothing_is_recorded() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let extra = format!(
        "expect:\n  runtime_version: 9.9.9+g{}\n{SMOKE}",
        &commit[..9]
    );
    let recipe = fx.recipe("fx", &repo, &commit, &extra);
    let store = fx.store();
    let out = fx.build(&recipe);
    assert_eq!(code(&out), 3, "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("runtime_version") && t.contains("9.9.9"), "{t}");
    assert_refused_left_nothing(store);
}

#[test]
fn an_oracle_that_is_not_the_pin_is_refused_before_the_gate_loads_a_model() {
    // The identity is measured while the gate's probe runs; the gate's cases
    // wait for its verdict. A package that cannot be imported fails the
    // identity: exit 3, no case run, nothing recorded, no staging left.
    let fx = Fx::new();
    let (repo, _) = fx.repo();
    std::fs::write(
        repo.join("fixturellm/__init__.py"),
        "raise ImportError('broken on purpose')\n",
    )
    .unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "broken import"]);
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let store = fx.store();
    let out = fx.build(&recipe);
    let t = text(&out);
    assert_eq!(code(&out), 3, "{t}");
    assert!(
        t.contains("is not the pin") && t.contains("broken on purpose"),
        "{t}"
    );
    assert!(
        !t.contains("smoke: case"),
        "a case ran for a refused oracle: {t}"
    );
    assert_refused_left_nothing(store);
}

#[test]
fn a_pretend_version_in_the_environment_cannot_relabel_the_build() {
    let fx = Fx::new();
    let (_, commit, recipe) = fx.pin();
    let out = fx
        .cmd(&["build", recipe.to_str().unwrap(), "--no-smoke", "--json"])
        .env("SETUPTOOLS_SCM_PRETEND_VERSION", "0.23.1")
        .output()
        .unwrap();
    // Built, not smoked: not gateable (exit 4).
    assert_eq!(code(&out), 4, "{}", text(&out));
    let version = json(&out)["runtime_version"].as_str().unwrap().to_string();
    assert!(
        version.contains(&format!("+g{}", &commit[..7])),
        "{version}"
    );
}

/// A gate that could not run after the build stops the first build before
/// any work (issue 43): the model directory missing, or its `${VAR}` unset,
/// is named by `plan` (exit 1) and `build` (exit 1, nothing written);
/// `--no-smoke` builds anyway (exit 4, not smoked).
#[test]
fn a_missing_model_stops_the_first_build_before_any_work() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let missing = fx.dir().join("no-models");
    let with = |args: &[&str], models: Option<&Path>| {
        let mut c = fx.cmd(args);
        match models {
            Some(m) => c.env("FX_MODELS", m),
            None => c.env_remove("FX_MODELS"),
        };
        c.output().unwrap()
    };
    let plan = with(&["plan", r], Some(&missing));
    assert_eq!(code(&plan), 1, "{}", text(&plan));
    assert!(
        text(&plan).contains("no-models/model does not exist"),
        "{}",
        text(&plan)
    );
    for models in [Some(missing.as_path()), None] {
        let out = with(&["build", r], models);
        assert_eq!(code(&out), 1, "{}", text(&out));
        let t = text(&out);
        let named = match models {
            Some(_) => {
                t.contains("smoke case small: model directory")
                    && t.contains("no-models/model does not exist")
            }
            None => t.contains("smoke case small") && t.contains("${FX_MODELS}, which is not set"),
        };
        assert!(named && t.contains("--no-smoke"), "{t}");
        assert!(
            !fx.store().join("store/wheels").exists()
                || std::fs::read_dir(fx.store().join("store/wheels"))
                    .unwrap()
                    .count()
                    == 0,
            "nothing built: {t}"
        );
        assert!(!fx.store().join("store/src").exists(), "no checkout: {t}");
    }
    let out = with(&["build", r, "--no-smoke"], Some(&missing));
    assert_eq!(code(&out), 4, "{}", text(&out));
}

/// A package index the recipe names that does not answer stops a build
/// that still has to lock before any work, named by `plan` and `build`
/// (issue 43).
#[test]
fn an_unreachable_recipe_index_stops_the_build_before_any_work() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}/simple", l.local_addr().unwrap().port())
    };
    let recipe = fx.recipe(
        "fx",
        &repo,
        &commit,
        &format!("{SMOKE}indexes:\n  - {dead}\n"),
    );
    let r = recipe.to_str().unwrap();
    let plan = fx.run(&["plan", r]);
    assert_eq!(code(&plan), 1, "{}", text(&plan));
    assert!(
        text(&plan).contains(&format!("package index {dead} does not answer")),
        "{}",
        text(&plan)
    );
    let out = fx.run(&["build", r]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains(&format!("package index {dead} does not answer")),
        "{}",
        text(&out)
    );
    assert!(
        !fx.store().join("store/src").exists(),
        "no checkout: {}",
        text(&out)
    );
}

/// A pinned package only an index the site drops has cannot be locked:
/// `plan` and `build` say so before any work, naming the pin and the
/// dropped index (issue 43: the parity pin's `flashinfer-cubin` is
/// published on FlashInfer's index only). A pin another index still has
/// is not named.
#[test]
fn a_pin_only_a_dropped_index_has_is_named_before_any_work() {
    let fx = Fx::new();
    let d = fx.dir();
    crate::real::make_index(&d.join("extra"), &["oracle-build-fx-only==1.0"]);
    let extra = crate::real::Server::start(&d.join("extra"));
    let (repo, commit) = fx.repo();
    let recipe = fx.recipe(
        "fx",
        &repo,
        &commit,
        &format!(
            "{SMOKE}indexes:\n  - {}\npins:\n  oracle-build-fx-only: \"1.0\"\n  idna: \"3.10\"\n",
            extra.url
        ),
    );
    let r = recipe.to_str().unwrap();
    std::fs::create_dir_all(fx.store()).unwrap();
    std::fs::write(
        fx.store().join("config.toml"),
        format!("[[mirror]]\nprefix = \"{}\"\nurl = \"none\"\n", extra.url),
    )
    .unwrap();
    let want = format!(
        "pins.oracle-build-fx-only = 1.0: no index left once the site drops {} has it",
        extra.url
    );
    let plan = fx.run(&["plan", r]);
    assert_eq!(code(&plan), 1, "{}", text(&plan));
    assert!(text(&plan).contains(&want), "{}", text(&plan));
    assert!(!text(&plan).contains("pins.idna"), "{}", text(&plan));
    let out = fx.run(&["build", r]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(text(&out).contains(&want), "{}", text(&out));
    assert!(
        !fx.store().join("store/src").exists(),
        "no checkout: {}",
        text(&out)
    );
}

#[test]
fn a_commit_the_repository_lacks_is_named() {
    let fx = Fx::new();
    let (repo, _) = fx.repo();
    let missing = "0123456789abcdef0123456789abcdef01234567";
    let recipe = fx.recipe("fx", &repo, missing, SMOKE);
    let out = fx.run(&["build", recipe.to_str().unwrap()]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains(missing) && t.contains(repo.to_str().unwrap()),
        "{t}"
    );
}

#[test]
fn the_parity_pin_stops_early_on_this_machine_naming_what_is_missing() {
    // No GPU, no nvcc and no GitHub here: the built-in parity pin must stop
    // before any work, name each missing thing, exit 1, and write nothing.
    if Command::new("nvidia-smi").output().is_ok() {
        eprintln!(
            "skipped: this machine has nvidia-smi, the test is about a machine without a GPU"
        );
        return;
    }
    let fx = Fx::new();
    let store = fx.store();
    let out = fx.run(&["555967922"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("no nvcc"), "{t}");
    assert!(
        t.contains("https://github.com/vllm-project/vllm cannot be reached"),
        "{t}"
    );
    assert!(
        tree(store).iter().all(|p| p.is_dir()),
        "no file written: {:?}",
        tree(store)
    );

    let plan = fx.run(&["plan", "555967922", "--json"]);
    assert_eq!(code(&plan), plan_exit(&plan), "{}", text(&plan));
    let plan = json(&plan);
    let stages: Vec<&str> = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(
        stages,
        ["toolchain", "source", "checkout", "wheel", "venv", "smoke"]
    );
    assert!(plan["needed_bytes"].as_u64().unwrap() >= 18 << 30);
    assert_eq!(plan["recipe"], "vllm-555967922");
}

#[test]
fn a_file_added_to_an_oracle_is_detected_and_the_entry_rebuilt() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let out = fx.run(&["build", r, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let venv = std::path::PathBuf::from(json(&out)["oracle"].as_str().unwrap());

    // A .pth file changes what the oracle runs without touching a recorded file.
    use std::os::unix::fs::PermissionsExt;
    let site = venv.join("lib/python3.11/site-packages");
    std::fs::set_permissions(&site, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        site.join("zz_evil.pth"),
        "import os; os.environ['FIXTURELLM_MODE'] = 'broken-op'\n",
    )
    .unwrap();

    let st = json(&fx.run(&["status", "--json"]));
    let row = st["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == venv.to_str().unwrap())
        .unwrap()
        .clone();
    assert!(
        row["health"]
            .as_str()
            .unwrap()
            .contains("added: lib/python3.11/site-packages/zz_evil.pth"),
        "{row}"
    );
    let v = fx.run(&["verify", r, "--deep"]);
    assert_eq!(
        code(&v),
        3,
        "verify --deep refuses an oracle with an added file: {}",
        text(&v)
    );

    let again = fx.run(&["build", r, "--json"]);
    assert_eq!(code(&again), 0, "{}", text(&again));
    assert!(
        text(&again).contains("is damaged (added: lib/python3.11/site-packages/zz_evil.pth"),
        "{}",
        text(&again)
    );
    assert!(
        json(&again)["built"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b == "venv")
    );
    assert!(
        !site.join("zz_evil.pth").exists(),
        "the rebuilt oracle is clean"
    );
}

#[test]
fn a_failed_build_keeps_the_log_it_names() {
    let fx = Fx::new();
    let (repo, _) = fx.repo();
    std::fs::write(repo.join("csrc/ops.c"), "this is not C;\n").unwrap();
    git(&repo, &["commit", "-qam", "break the extension"]);
    let broken = git(&repo, &["rev-parse", "HEAD"]);
    let recipe = fx.recipe("fx", &repo, &broken, SMOKE);
    let store = fx.store();
    let out = fx.build(&recipe);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let t = text(&out);
    let log = t
        .split("full log: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no log path in: {t}"));
    let kept = std::fs::read_to_string(log).unwrap_or_else(|e| panic!("{log}: {e}"));
    assert!(
        kept.contains("ops.c"),
        "the kept log has the compiler's complaint:\n{kept}"
    );
    assert!(std::path::Path::new(log).starts_with(store.join("logs")));
    assert_eq!(
        std::fs::read_dir(store.join("store/wheels"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn a_damaged_wheel_is_reported_and_rebuilt_when_it_is_needed() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let store = fx.store();
    let r = recipe.to_str().unwrap();
    let out = fx.run(&["build", r, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let first = json(&out);
    let venv = std::path::PathBuf::from(first["oracle"].as_str().unwrap());
    let rec = record(&venv);
    let wheel_dir = store
        .join("store/wheels")
        .join(rec["wheel_key"].as_str().unwrap());
    let wheel = std::fs::read_dir(&wheel_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .unwrap();

    // One byte changed, same size.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wheel, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&wheel).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&wheel, &bytes).unwrap();
    let st = json(&fx.run(&["status", "--json"]));
    let row = st["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == wheel_dir.to_str().unwrap())
        .unwrap()
        .clone();
    assert!(
        row["health"].as_str().unwrap().contains("changed content"),
        "{row}"
    );

    // The venv is lost (a reboot with a pruned store): the rebuild replaces the wheel.
    force_remove(&venv);
    let again = fx.run(&["build", r, "--json"]);
    assert_eq!(code(&again), 0, "{}", text(&again));
    assert!(text(&again).contains("is damaged"), "{}", text(&again));
    let built = json(&again)["built"].clone();
    assert!(
        built.as_array().unwrap().iter().any(|b| b == "wheel"),
        "{built}"
    );
    assert_eq!(
        json(&again)["key"],
        first["key"],
        "the rebuilt wheel is byte-identical, so the oracle key is too"
    );
}

#[test]
fn a_repository_without_tags_builds_with_a_recorded_warning() {
    let fx = Fx::new();
    let (repo, _) = fx.repo();
    git(&repo, &["tag", "-d", "v0.1.0"]);
    let head = git(&repo, &["rev-parse", "HEAD"]);
    let recipe = fx.recipe("fx", &repo, &head, SMOKE);
    let out = fx.build(&recipe);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("warning  no tag is reachable from") && stdout.contains("0.1.dev2+g"),
        "{stdout}"
    );
    // With the tag, no warning.
    git(&repo, &["tag", "v0.1.0", "HEAD~1"]);
    let tagged = fx.recipe("fx-tagged", &repo, &head, SMOKE);
    let out = fx.run_at(
        &fx.dir().join("s2"),
        &["build", tagged.to_str().unwrap(), "--json"],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["warnings"].as_array().unwrap().len(), 0);
}
