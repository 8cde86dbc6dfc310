//! Hermetic, offline-capable rebuilds: `lock`, the wheelhouse, staged
//! FetchContent sources, `--offline`, and export/import bundles, with the
//! real binary, git, uv and python.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use crate::support::*;
use serde_json::Value;

/// A port on this machine nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Closes every network path of `c`: every proxy variable points at a
/// closed local port, and the default indexes too.
pub(crate) fn offline(c: &mut Command) -> &mut Command {
    let dead = format!("http://127.0.0.1:{}", closed_port());
    for v in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        c.env(v, &dead);
    }
    c.env("NO_PROXY", "")
        .env("no_proxy", "")
        .env("UV_INDEX_URL", format!("{dead}/simple"))
        .env("UV_DEFAULT_INDEX", format!("{dead}/simple"))
        .env("PIP_INDEX_URL", format!("{dead}/simple"))
}

pub(crate) fn ok(out: &Output) {
    assert_eq!(code(out), 0, "{}", text(out));
}

/// `oracle.json` of the oracle a `build --json` report names.
fn oracle_json(report: &Value) -> Value {
    record(Path::new(report["oracle"].as_str().unwrap()))
}

/// The identity fields that must survive a rebuild, plus the wheel's sha256.
fn identity(report: &Value) -> Value {
    let rec = oracle_json(report);
    let id = &rec["identity"];
    serde_json::json!({
        "key": report["key"], "runtime_version": id["runtime_version"],
        "distribution_version": id["distribution_version"], "commit": id["commit"],
        "compiled_extensions": id["compiled_extensions"], "build_mode": id["build_mode"],
        "wheel_sha256": rec["wheel_sha256"],
    })
}

/// Runs `c` (a `build ... --json`), asserts exit 0 and returns the report.
pub(crate) fn report(c: &mut Command) -> Value {
    let out = c.output().unwrap();
    ok(&out);
    json(&out)
}

/// `build <recipe> --json --offline` into `store`, with every network path closed.
fn build_offline(fx: &Fx, store: &Path, recipe: &Path) -> Value {
    let args = ["build", recipe.to_str().unwrap(), "--json", "--offline"];
    report(offline(&mut fx.cmd_at(store, &args)))
}

fn delete_venvs_and_wheels(store: &Path) {
    for b in ["venvs", "wheels"] {
        for e in std::fs::read_dir(store.join("store").join(b)).unwrap() {
            force_remove(&e.unwrap().path());
        }
    }
}

/// `lock <recipe> --json` into `store`, asserting exit 0.
fn lock(fx: &Fx, store: &Path, recipe: &Path) -> Value {
    let out = fx.run_at(store, &["lock", recipe.to_str().unwrap(), "--json"]);
    ok(&out);
    json(&out)
}

#[test]
fn lock_writes_hash_pinned_lockfiles_and_a_second_lock_gives_the_same_bytes() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let first = lock(&fx, &fx.dir().join("store-a"), &recipe);
    let dir = fx.dir().join("lockfiles/fx");
    assert!(
        first["dir"].as_str().unwrap().ends_with("lockfiles/fx"),
        "{first}"
    );
    let names = ["lock.json", "pylock.build.toml", "pylock.runtime.toml"];
    let bytes: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(dir.join(n)).unwrap())
        .collect();

    // Every artifact of both sets carries a sha256.
    for n in ["pylock.build.toml", "pylock.runtime.toml"] {
        let t = std::fs::read_to_string(dir.join(n)).unwrap();
        let urls = t.matches("url = ").count();
        assert!(urls > 0, "{n}: {t}");
        assert_eq!(t.matches("hashes = { sha256 = ").count(), urls, "{n}: {t}");
        assert!(
            !t.contains(fx.dir().to_str().unwrap()),
            "no local paths: {t}"
        );
    }
    let build_lock = std::fs::read_to_string(dir.join("pylock.build.toml")).unwrap();
    for p in ["setuptools", "setuptools-scm", "wheel"] {
        assert!(
            build_lock.contains(&format!("name = \"{p}\"")),
            "{build_lock}"
        );
    }
    assert!(
        std::fs::read_to_string(dir.join("pylock.runtime.toml"))
            .unwrap()
            .contains("name = \"packaging\"")
    );

    // Cut off at the commit's committer time.
    let ct: i64 = git(&repo, &["show", "-s", "--format=%ct", &commit])
        .parse()
        .unwrap();
    let iso = String::from_utf8(
        Command::new("date")
            .args(["-u", "-d", &format!("@{ct}"), "+%Y-%m-%dT%H:%M:%SZ"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let info = read_json(&dir.join("lock.json"));
    assert_eq!(info["exclude_newer"], iso.trim(), "{info}");
    assert_eq!(first["exclude_newer"], iso.trim());

    // A second lock, from another store (other checkout path, other uv cache): same bytes.
    lock(&fx, &fx.dir().join("store-b"), &recipe);
    for (n, b) in names.iter().zip(&bytes) {
        assert_eq!(
            &std::fs::read(dir.join(n)).unwrap(),
            b,
            "{n} changed between two locks"
        );
    }

    // The fix a refused lock names is `lock` of the recipe as the user gave
    // it: the recipe file (absolute, so it runs from anywhere), not its name.
    let fix = format!(
        "`oracle-build lock {}`",
        recipe.canonicalize().unwrap().display()
    );

    // A lock file changed after locking is refused, naming the file and the fix.
    let runtime = dir.join("pylock.runtime.toml");
    let original = std::fs::read(&runtime).unwrap();
    let mut tampered = original.clone();
    tampered.extend_from_slice(b"# edited by hand\n");
    std::fs::write(&runtime, &tampered).unwrap();
    let out = fx.run_at(
        &fx.dir().join("store-a"),
        &["build", recipe.to_str().unwrap()],
    );
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("changed since it was locked") && text(&out).contains(&fix),
        "{}",
        text(&out)
    );
    std::fs::write(&runtime, &original).unwrap();

    // A recipe that no longer matches its lock is refused, naming the field.
    let changed = fx.recipe(
        "fx",
        &repo,
        &commit,
        &format!("pins: {{packaging: \"24.0\"}}\n{SMOKE}"),
    );
    let out = fx.run_at(
        &fx.dir().join("store-a"),
        &["build", changed.to_str().unwrap()],
    );
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("stale") && text(&out).contains("pins"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains(&fix) && !text(&out).contains("`oracle-build lock fx`"),
        "{}",
        text(&out)
    );
}

#[test]
fn offline_rebuild_from_the_store_gives_the_same_oracle() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let store = fx.store();
    lock(&fx, store, &recipe);
    let t0 = Instant::now();
    let first = fx.build_json(store, &recipe);
    let first_s = t0.elapsed().as_secs_f64();
    let rec = oracle_json(&first);
    let requires: Vec<&str> = rec["requires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        requires.iter().any(|r| r.starts_with("wheelhouse/")),
        "{requires:?}"
    );
    let build_rec = read_json(
        &store
            .join("store/wheels")
            .join(rec["wheel_key"].as_str().unwrap())
            .join("build.json"),
    );
    assert!(
        build_rec["requires"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().starts_with("wheelhouse/")),
        "{build_rec}"
    );
    assert!(build_rec["inputs"]["build_lock"].is_string(), "{build_rec}");
    assert!(rec["inputs"]["runtime_lock"].is_string(), "{rec}");

    // gc keeps the wheelhouse: the oracle's root reaches it.
    let gc = fx.run(&["gc", "--dry-run", "--json"]);
    ok(&gc);
    assert_eq!(
        json(&gc)["deleted"].as_array().unwrap().len(),
        0,
        "{}",
        text(&gc)
    );

    // Reboot-like loss: the venv and the wheel are gone; mirror, checkout,
    // wheelhouse stay. Something missing is named before any work.
    delete_venvs_and_wheels(store);
    let wh = store.join("store/wheelhouse");
    let victim = std::fs::read_dir(&wh)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let aside = fx.dir().join("aside");
    std::fs::rename(&victim, &aside).unwrap();
    let out = offline(&mut fx.cmd(&["build", recipe.to_str().unwrap(), "--offline"]))
        .output()
        .unwrap();
    assert_eq!(code(&out), 1, "{}", text(&out));
    let artifact = read_json(&aside.join("artifact.json"));
    let t = text(&out);
    assert!(
        t.contains("wheelhouse") && t.contains(artifact["package"].as_str().unwrap()),
        "{t}"
    );
    assert_eq!(
        std::fs::read_dir(store.join("store/wheels"))
            .unwrap()
            .count(),
        0,
        "no work done: {t}"
    );
    std::fs::rename(&aside, &victim).unwrap();

    // The offline rebuild, with every network path closed.
    let t1 = Instant::now();
    let again = build_offline(&fx, store, &recipe);
    let rebuild_s = t1.elapsed().as_secs_f64();
    assert_eq!(identity(&again), identity(&first));
    assert_eq!(again["verdict"], "gateable");
    let built: Vec<&str> = again["built"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        built.contains(&"wheel") && built.contains(&"venv"),
        "{built:?}"
    );

    // And a rebuild of only the venv (wheel kept), as after pruning venvs.
    let venv = PathBuf::from(again["oracle"].as_str().unwrap());
    force_remove(&venv);
    let t2 = Instant::now();
    let third = build_offline(&fx, store, &recipe);
    let venv_only_s = t2.elapsed().as_secs_f64();
    assert_eq!(identity(&third), identity(&first));
    eprintln!(
        "FIGURES first build (source, lock present, downloads) {first_s:.2} s; offline rebuild of wheel+venv {rebuild_s:.2} s; offline rebuild of the venv only {venv_only_s:.2} s"
    );
}

/// A git repository at `dir` whose tree has `files`; returns its head commit.
fn make_repo(dir: &Path, files: &[(&str, &str)], tag: Option<&str>) -> String {
    std::fs::create_dir_all(dir).unwrap();
    for (p, t) in files {
        let f = dir.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, t).unwrap();
    }
    git(dir, &["init", "-q"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "ext"]);
    if let Some(t) = tag {
        git(dir, &["tag", t]);
    }
    git(dir, &["rev-parse", "HEAD"])
}

#[test]
fn fetchcontent_sources_are_staged_passed_to_the_build_and_used_offline() {
    let fx = Fx::new();
    let ext = fx.dir().join("upstream");
    make_repo(
        &ext.join("cutlass"),
        &[
            ("fixture-ext.txt", "cutlass v1.0 from the test\n"),
            ("include/c.h", "// c\n"),
        ],
        Some("v1.0"),
    );
    let kernels = make_repo(
        &ext.join("kernels"),
        &[("fixture-ext.txt", "kernels at a commit\n")],
        None,
    );
    let (repo, _) = fx.repo();
    // CMake files shaped like vLLM's: an env-var override, and a plain
    // declaration that only FETCHCONTENT_SOURCE_DIR_<NAME> can redirect.
    std::fs::write(
        repo.join("CMakeLists.txt"),
        format!(
            r#"cmake_minimum_required(VERSION 3.26)
project(fixturellm LANGUAGES C)
include(FetchContent)
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)
Python3_add_library(_C MODULE WITH_SOABI csrc/ops.c)
set(CUTLASS_REVISION "v1.0" CACHE STRING "CUTLASS revision to use")
if (DEFINED ENV{{VLLM_CUTLASS_SRC_DIR}})
  set(VLLM_CUTLASS_SRC_DIR $ENV{{VLLM_CUTLASS_SRC_DIR}})
endif()
if(VLLM_CUTLASS_SRC_DIR)
  FetchContent_Declare(cutlass SOURCE_DIR ${{VLLM_CUTLASS_SRC_DIR}})
else()
  FetchContent_Declare(
      cutlass
      GIT_REPOSITORY file://{}
      GIT_TAG ${{CUTLASS_REVISION}}
      GIT_SHALLOW TRUE
  )
endif()
include(cmake/external_projects/kernels.cmake)
"#,
            ext.join("cutlass").display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(repo.join("cmake/external_projects")).unwrap();
    std::fs::write(
        repo.join("cmake/external_projects/kernels.cmake"),
        format!(
            "FetchContent_Declare(\n  kernels\n  GIT_REPOSITORY file://{}\n  GIT_TAG {kernels}\n)\nFetchContent_MakeAvailable(kernels)\n",
            ext.join("kernels").display()
        ),
    )
    .unwrap();
    // setup.py now drives this CMakeLists.txt (as vLLM's does): cmake and
    // ninja join the build requirements, as in tests/fixture/cmake.
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixture/cmake/requirements/build/cpu.txt"),
        repo.join("requirements/build/cpu.txt"),
    )
    .unwrap();
    git(&repo, &["add", "-A"]);
    git(
        &repo,
        &["commit", "-qm", "cmake with two FetchContent sources"],
    );
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let store = fx.store();

    // plan (after the mirror exists) lists both, not yet staged.
    lock(&fx, store, &recipe);
    let plan = fx.run(&["plan", recipe.to_str().unwrap(), "--json"]);
    ok(&plan);
    let plan = json(&plan);
    let rows = plan["ext_sources"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{plan}");
    assert_eq!(rows[0]["name"], "cutlass");
    assert_eq!(rows[0]["variable"], "VLLM_CUTLASS_SRC_DIR");
    assert_eq!(rows[1]["name"], "kernels");
    assert_eq!(rows[1]["variable"], "FETCHCONTENT_SOURCE_DIR_KERNELS");
    assert!(rows.iter().all(|r| r["staged"] == false), "{plan}");
    assert!(
        plan["offline_missing"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.as_str().unwrap().contains("cutlass"))
    );

    let first = fx.build_json(store, &recipe);
    let staged: Vec<String> = std::fs::read_dir(store.join("store/ext"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(staged.len(), 2, "{staged:?}");
    assert!(
        staged.iter().any(|n| n.starts_with("cutlass-v1.0-")),
        "{staged:?}"
    );
    assert!(
        staged
            .iter()
            .any(|n| n.starts_with(&format!("kernels-{kernels}-"))),
        "{staged:?}"
    );
    let plan = json(&fx.run(&["plan", recipe.to_str().unwrap(), "--json"]));
    assert!(
        plan["ext_sources"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["staged"] == true),
        "{plan}"
    );

    // The staged sources reached the build, through their variables.
    let venv = PathBuf::from(first["oracle"].as_str().unwrap());
    let sources = |venv: &Path| {
        let out = succeeds(
            Command::new(venv.join("bin/python"))
            .args(["-c", "import json, fixturellm._ext_sources as e; print(json.dumps(e.SOURCES, sort_keys=True))"])
            .current_dir("/")
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    assert_eq!(
        sources(&venv),
        serde_json::json!({"FETCHCONTENT_SOURCE_DIR_KERNELS": "kernels at a commit", "VLLM_CUTLASS_SRC_DIR": "cutlass v1.0 from the test"})
    );
    let rec = oracle_json(&first);
    let build_rec = read_json(
        &store
            .join("store/wheels")
            .join(rec["wheel_key"].as_str().unwrap())
            .join("build.json"),
    );
    assert!(
        build_rec["env"]["VLLM_CUTLASS_SRC_DIR"].is_string(),
        "{build_rec}"
    );
    assert!(
        build_rec["env"]["CMAKE_ARGS"]
            .as_str()
            .unwrap()
            .contains("-DFETCHCONTENT_SOURCE_DIR_KERNELS=")
    );
    assert_eq!(build_rec["inputs"]["ext"].as_array().unwrap().len(), 2);
    assert!(
        build_rec["requires"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r.as_str().unwrap().starts_with("ext/"))
            .count()
            == 2
    );

    // Upstream gone, venv and wheel gone: the offline rebuild uses store/ext.
    force_remove(&ext);
    delete_venvs_and_wheels(store);
    let again = build_offline(&fx, store, &recipe);
    assert_eq!(identity(&again), identity(&first));
    assert_eq!(
        sources(Path::new(again["oracle"].as_str().unwrap())),
        sources(&venv)
    );
}

/// Writes a hostile `.tar.gz` with python's tarfile (which writes any name).
fn hostile(path: &Path, kind: &str, good: Option<&Path>) {
    let script = r#"
import io, sys, tarfile
out, kind = sys.argv[1], sys.argv[2]
def add(t, name, data):
    ti = tarfile.TarInfo(name); ti.size = len(data); t.addfile(ti, io.BytesIO(data))
if kind == "tamper":
    with tarfile.open(sys.argv[3], "r:gz") as src, tarfile.open(out, "w:gz") as t:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if m.name.endswith("pylock.runtime.toml"):
                data = data.replace(b"packaging", b"packagin9", 1)
            t.addfile(m, io.BytesIO(data) if data is not None else None)
    sys.exit(0)
if kind in ("bad-platform", "bad-uv"):
    # The manifest alone changed: its files still match.
    import json
    with tarfile.open(sys.argv[3], "r:gz") as src, tarfile.open(out, "w:gz") as t:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if m.name == "oracle-bundle.json":
                man = json.loads(data)
                if kind == "bad-platform":
                    man["platform"] = "sparc-plan9"
                else:
                    man["uv"]["version"] = "0.0.1"
                data = json.dumps(man).encode(); m.size = len(data)
            t.addfile(m, io.BytesIO(data) if data is not None else None)
    sys.exit(0)
with tarfile.open(out, "w:gz") as t:
    add(t, "oracle-bundle.json", b'{"format": 1}')
    if kind == "traversal":
        add(t, "../evil.txt", b"evil")
    elif kind == "absolute":
        add(t, sys.argv[3] + "/evil.txt", b"evil")
    elif kind == "symlink":
        ti = tarfile.TarInfo("store/ext/x-1/src/link"); ti.type = tarfile.SYMTYPE
        ti.linkname = "../../../../../../../../../.."
        t.addfile(ti)
        add(t, "store/ext/x-1/src/link/tmp/evil.txt", b"evil")
"#;
    let mut c = Command::new("python3");
    c.args(["-c", script, path.to_str().unwrap(), kind]);
    if let Some(g) = good {
        c.arg(g);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `import <archive>` into `store` is refused (exit 2) and writes no file
/// there, nor anywhere in the test directory.
fn assert_refused(fx: &Fx, archive: &Path, store: &Path, what: &str) {
    let cwd = fx.dir();
    let out = fx.run_at(store, &["import", archive.to_str().unwrap()]);
    assert_eq!(code(&out), 2, "{what}: {}", text(&out));
    assert!(text(&out).contains("refusing"), "{what}: {}", text(&out));
    assert!(
        !store.exists() || tree(store).iter().all(|p| p.is_dir()),
        "{what}: wrote {:?}",
        tree(store)
    );
    assert!(
        !tree(cwd)
            .iter()
            .any(|p| p.file_name().is_some_and(|n| n == "evil.txt")),
        "{what}: a file escaped"
    );
}

#[test]
fn import_refuses_hostile_archives_and_writes_nothing() {
    let fx = Fx::new();
    let store = fx.store();
    let abs = fx.dir().join("abs-target");
    for kind in ["traversal", "absolute", "symlink"] {
        let a = fx.dir().join(format!("{kind}.tar.gz"));
        hostile(&a, kind, (kind == "absolute").then_some(abs.as_path()));
        assert_refused(&fx, &a, store, kind);
    }
    assert!(!abs.exists());
}

#[test]
fn export_then_import_into_an_empty_store_rebuilds_the_same_oracle_offline() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let store = fx.dir().join("store-a");
    lock(&fx, &store, &recipe);
    let first = fx.build_json(&store, &recipe);
    let bundle = fx.dir().join("fx.tar.gz");
    let out = fx.run_at(
        &store,
        &[
            "export",
            recipe.to_str().unwrap(),
            "-o",
            bundle.to_str().unwrap(),
            "--json",
        ],
    );
    ok(&out);
    let exported = json(&out);
    assert!(
        exported["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().starts_with("wheels/"))
    );

    // A tampered copy is refused, and nothing is written.
    let tampered = fx.dir().join("tampered.tar.gz");
    hostile(&tampered, "tamper", Some(&bundle));
    let store_b = fx.dir().join("store-b");
    assert_refused(&fx, &tampered, &store_b, "tampered");
    // So is one whose manifest names a platform that is none, or a uv its
    // entry does not hold, before anything is moved in.
    for kind in ["bad-platform", "bad-uv"] {
        let bad = fx.dir().join(format!("{kind}.tar.gz"));
        hostile(&bad, kind, Some(&bundle));
        assert_refused(&fx, &bad, &store_b, kind);
    }

    // The original repository is gone: the source must come from the bundle.
    force_remove(&repo);
    let out = fx.run_at(&store_b, &["import", bundle.to_str().unwrap(), "--json"]);
    ok(&out);
    let imported = json(&out);
    let recipe_b = PathBuf::from(imported["recipe_file"].as_str().unwrap());
    assert!(recipe_b.starts_with(&store_b), "{imported}");
    assert!(
        crate::cache::strs(&imported["added"])
            .iter()
            .any(|l| l.starts_with("git/")),
        "{imported}"
    );
    // Imported again: nothing is added, the mirror included.
    let out = fx.run_at(&store_b, &["import", bundle.to_str().unwrap(), "--json"]);
    ok(&out);
    let twice = json(&out);
    assert_eq!(twice["added"], serde_json::json!([]), "{twice}");
    assert!(
        crate::cache::strs(&twice["present"])
            .iter()
            .any(|l| l.starts_with("git/")),
        "{twice}"
    );
    let again = build_offline(&fx, &store_b, &recipe_b);
    assert_eq!(identity(&again), identity(&first));
    assert_eq!(again["verdict"], "gateable");

    // Without the imported wheel, the offline box rebuilds it from source.
    delete_venvs_and_wheels(&store_b);
    let rebuilt = build_offline(&fx, &store_b, &recipe_b);
    assert_eq!(identity(&rebuilt), identity(&first));
}

#[test]
fn without_a_lockfile_the_build_keeps_its_lock_in_the_store_for_offline_rebuilds() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, head) = fixture_repo(d);
    let recipe = write_recipe(d, "fx", &repo, &head, SMOKE);
    let store = fx.store();
    let first = fx.build_json(store, &recipe);
    assert!(
        !d.join("lockfiles").exists(),
        "no lockfile was written beside the recipe"
    );
    let locks: Vec<_> = std::fs::read_dir(store.join("store/lockfiles"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(locks.len(), 1, "the resolved lock is a store entry");
    let rec = oracle_json(&first);
    let wheel = read_json(
        &store
            .join("store/wheels")
            .join(rec["wheel_key"].as_str().unwrap())
            .join("build.json"),
    );
    let lock_label = format!("lockfiles/{}", locks[0].file_name().to_string_lossy());
    assert!(
        wheel["requires"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == lock_label.as_str()),
        "{}",
        wheel["requires"]
    );

    // A second run resolves nothing; an offline rebuild of wheel and venv
    // needs no network and gives the same oracle.
    let again = fx.run(&["build", recipe.to_str().unwrap()]);
    ok(&again);
    assert!(
        !String::from_utf8_lossy(&again.stderr).contains("resolving"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    delete_venvs_and_wheels(store);
    let offline = build_offline(&fx, store, &recipe);
    assert_eq!(identity(&offline), identity(&first));
    // gc keeps the lock: the oracle's wheel requires it.
    let gc = fx.run(&["gc", "--dry-run", "--json"]);
    ok(&gc);
    assert!(
        !json(&gc)["deleted"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["entry"] == lock_label.as_str()),
        "{}",
        json(&gc)
    );
}

/// [`cmd`] with every network path closed ([`offline`]).
pub(crate) fn offline_cmd(cwd: &Path) -> Command {
    let mut c = cmd(cwd);
    offline(&mut c);
    c
}

/// A fixture repository in `dir`, the recipe `fx` at its head, and a store
/// path: (repo, commit, recipe, store).
pub(crate) fn fixture_pin(dir: &Path) -> (PathBuf, String, PathBuf, PathBuf) {
    let (repo, commit) = fixture_repo(dir);
    let recipe = write_recipe(dir, "fx", &repo, &commit, SMOKE);
    (repo, commit, recipe, dir.join("store"))
}

/// `c` with `build <recipe> --store <store> --json <extra...>`: exit 0, the report.
pub(crate) fn build(c: &mut Command, recipe: &Path, store: &Path, extra: &[&str]) -> Value {
    c.args([
        "build",
        recipe.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ])
    .args(extra);
    report(c)
}

/// `PATH` without any directory that holds a `uv`.
pub(crate) fn path_without_uv() -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|d| !d.join("uv").exists())
        .collect();
    std::env::join_paths(dirs)
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The binary on a box with no network and no uv anywhere: [`offline_cmd`],
/// PATH without uv, no `ORACLE_BUILD_UV`, no `ORACLE_BUILD_TOOLS`, the
/// package index unreachable.
pub(crate) fn bare_offline_cmd(cwd: &Path) -> Command {
    let mut c = offline_cmd(cwd);
    c.env("PATH", path_without_uv())
        .env("UV_INDEX_URL", "http://127.0.0.1:9/")
        .env_remove("ORACLE_BUILD_UV")
        .env_remove("ORACLE_BUILD_TOOLS")
        .env_remove("ORACLE_BUILD_UV_UNPINNED");
    c
}

/// Every member of the `.tar.gz` at `path` with its bytes.
fn members(path: &Path) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let f = std::fs::File::open(path).unwrap();
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let mut out = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        e.read_to_end(&mut bytes).unwrap();
        out.push((name, bytes));
    }
    out
}

/// Writes the bundle's `source.bundle` (from `members`) into `dir` and returns its path.
fn bundle_dir_file(members: &[(String, Vec<u8>)], dir: &Path) -> PathBuf {
    let path = dir.join("source.bundle");
    let bytes = &members
        .iter()
        .find(|(n, _)| n == "source.bundle")
        .unwrap()
        .1;
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn export_of_a_cuda_pin_for_another_platform_prepares_everything_without_building() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let kernels = make_repo(
        &d.join("upstream/kernels"),
        &[("fixture-ext.txt", "kernels at a commit\n")],
        None,
    );
    let (repo, _) = fixture_repo(d);
    std::fs::write(
        repo.join("CMakeLists.txt"),
        format!(
            "cmake_minimum_required(VERSION 3.26)\nFetchContent_Declare(\n  kernels\n  GIT_REPOSITORY file://{}\n  GIT_TAG {kernels}\n)\nFetchContent_MakeAvailable(kernels)\n",
            d.join("upstream/kernels").display()
        ),
    )
    .unwrap();
    // The CUDA fixture: tests/fixture/cuda over the CPU fixture (nvcc kernel).
    overlay(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture/cuda"),
        &repo,
    );
    git(&repo, &["add", "-A"]);
    git(
        &repo,
        &[
            "commit",
            "-qm",
            "the CUDA fixture and a FetchContent source",
        ],
    );
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let yaml = recipe_text("fxcuda", &repo, &commit, SMOKE).replace(
        "target_device: cpu",
        "target_device: cuda\n  cuda_arch_list: auto",
    );
    let recipe = d.join("fxcuda.yaml");
    std::fs::write(&recipe, yaml).unwrap();
    let store = d.join("store");
    let bundle = d.join("fxcuda.tar.gz");

    // A bad platform is refused before anything is written.
    let out = run(
        d,
        &[
            "export",
            recipe.to_str().unwrap(),
            "-o",
            bundle.to_str().unwrap(),
            "--platform",
            "arm64-linux",
            "--store",
            store.to_str().unwrap(),
        ],
    );
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("arm64-linux"), "{}", text(&out));
    assert!(!store.exists() && !bundle.exists());

    // This box has network, no nvcc and no GPU: export prepares, builds nothing.
    let out = run(
        d,
        &[
            "export",
            recipe.to_str().unwrap(),
            "-o",
            bundle.to_str().unwrap(),
            "--platform",
            "aarch64-manylinux_2_28",
            "--store",
            store.to_str().unwrap(),
            "--json",
        ],
    );
    ok(&out);
    let report = json(&out);
    assert_eq!(report["platform"], "aarch64-manylinux_2_28");
    for b in ["wheels", "venvs"] {
        assert_eq!(
            tree(&store.join("store").join(b)).len(),
            0,
            "{b}: nothing was built"
        );
    }

    let m = members(&bundle);
    let names: Vec<&str> = m.iter().map(|(n, _)| n.as_str()).collect();
    let get = |n: &str| {
        &m.iter()
            .find(|(k, _)| k == n)
            .unwrap_or_else(|| panic!("{n} not in {names:?}"))
            .1
    };
    let lock: Value = serde_json::from_slice(get("lockfiles/fxcuda/lock.json")).unwrap();
    assert_eq!(lock["platform"], "aarch64-manylinux_2_28", "{lock}");
    assert_eq!(lock["inputs"]["target_device"], "cuda");
    let build_lock = String::from_utf8(get("lockfiles/fxcuda/pylock.build.toml").clone()).unwrap();
    assert!(build_lock.contains("name = \"setuptools\""), "{build_lock}");
    assert!(
        !names.iter().any(|n| n.starts_with("store/wheels/")),
        "{names:?}"
    );
    // The wheelhouse: every locked artifact, downloaded and named by its sha256.
    for pkg in build_lock
        .lines()
        .filter_map(|l| l.strip_prefix("name = "))
        .map(|n| n.trim_matches('"').replace('-', "_"))
    {
        assert!(
            names.iter().any(|n| n.starts_with("store/wheelhouse/")
                && n.rsplit('/')
                    .next()
                    .unwrap()
                    .starts_with(&format!("{pkg}-"))),
            "{pkg} not in the wheelhouse: {names:?}"
        );
    }
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("store/wheelhouse/") && n.contains("/packaging-"))
    );
    // The pinned uv for the target platform, hash-named like every artifact.
    let manifest: Value = serde_json::from_slice(get("oracle-bundle.json")).unwrap();
    assert_eq!(manifest["platform"], "aarch64-manylinux_2_28");
    let uv_sha = manifest["uv"]["sha256"].as_str().unwrap();
    let uv_wheel = names
        .iter()
        .find(|n| n.starts_with(&format!("store/wheelhouse/{uv_sha}/")) && n.ends_with(".whl"))
        .unwrap_or_else(|| panic!("no uv wheel: {names:?}"));
    assert!(
        uv_wheel.contains("uv-0.13.9-") && uv_wheel.contains("aarch64"),
        "{uv_wheel}"
    );
    use sha2::Digest;
    assert_eq!(hex::encode(sha2::Sha256::digest(get(uv_wheel))), uv_sha);
    // The sources: the commit (the CUDA fixture) with its history, and the
    // staged FetchContent source.
    assert!(names.contains(&"source.bundle"));
    assert!(
        store
            .join("store/src")
            .join(&commit)
            .join("csrc/cuda_ops.cu")
            .is_file()
    );
    let heads = Command::new("git")
        .args(["bundle", "list-heads"])
        .arg(bundle_dir_file(&m, d))
        .output()
        .unwrap();
    let heads = String::from_utf8_lossy(&heads.stdout).into_owned();
    assert!(
        heads.contains(&commit) && heads.contains("refs/tags/v0.1.0"),
        "{heads}"
    );
    assert!(
        names
            .iter()
            .any(|n| n.starts_with(&format!("store/ext/kernels-{kernels}-"))
                && n.ends_with("fixture-ext.txt")),
        "{names:?}"
    );
}

/// Rewrites the bundle `src` into `dst`, renaming the wheelhouse wheel of
/// `package` to `new_name` (and its artifact.json and the manifest with it,
/// so that only the name is wrong).
fn rename_wheel(src: &Path, dst: &Path, package: &str, new_name: &str, new_version: &str) {
    let script = r#"
import hashlib, io, json, sys, tarfile
src, dst, pkg, new, ver = sys.argv[1:6]
with tarfile.open(src, "r:gz") as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]
entry = None
for m, data in members:
    parts = m.name.split("/")
    if len(parts) == 4 and parts[1] == "wheelhouse" and parts[3].startswith(pkg + "-") and parts[3].endswith(".whl"):
        entry, old = parts[2], parts[3]
assert entry, "no wheel of " + pkg
out = []
for m, data in members:
    if m.name == "store/wheelhouse/%s/%s" % (entry, old):
        m.name = "store/wheelhouse/%s/%s" % (entry, new)
    elif m.name == "store/wheelhouse/%s/artifact.json" % entry:
        a = json.loads(data); a["filename"] = new; a["version"] = ver
        data = json.dumps(a).encode(); m.size = len(data)
    out.append((m, data))
man = json.loads(dict((m.name, d) for m, d in out)["oracle-bundle.json"])
man["files"] = sorted(
    [{"path": m.name, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
     for m, d in out if m.isfile() and m.name != "oracle-bundle.json"], key=lambda f: f["path"])
with tarfile.open(dst, "w:gz") as t:
    for m, d in out:
        if m.name == "oracle-bundle.json":
            d = json.dumps(man).encode(); m.size = len(d)
        t.addfile(m, io.BytesIO(d) if d is not None else None)
"#;
    succeeds(Command::new("python3").args([
        "-c",
        script,
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
        package,
        new_name,
        new_version,
    ]));
}

#[test]
fn an_imported_bundle_builds_offline_by_its_usual_pin_with_no_uv_anywhere_and_its_golden_gates() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, _, recipe, store_a) = fixture_pin(d);
    // The online box: build, record the golden (beside the recipe, copied
    // into the store), export for this host.
    build(&mut cmd(d), &recipe, &store_a, &[]);
    let out = run(
        d,
        &[
            "smoke",
            recipe.to_str().unwrap(),
            "--store",
            store_a.to_str().unwrap(),
            "--record-golden",
            "--json",
        ],
    );
    ok(&out);
    let beside = d.join("goldens/fx/small.json");
    assert_eq!(
        json(&out)["smoke"]["cases"][0]["golden_path"],
        beside.to_str().unwrap()
    );
    assert_eq!(
        std::fs::read(&beside).unwrap(),
        std::fs::read(store_a.join("goldens/fx/small.json")).unwrap(),
        "the store keeps a copy"
    );
    let bundle = d.join("fx.tar.gz");
    let out = run(
        d,
        &[
            "export",
            recipe.to_str().unwrap(),
            "-o",
            bundle.to_str().unwrap(),
            "--store",
            store_a.to_str().unwrap(),
            "--json",
        ],
    );
    ok(&out);
    assert_eq!(json(&out)["goldens"], serde_json::json!(["small"]));

    // A bundle golden that is not golden JSON, or over the bound: refused
    // with exit 2 naming the member, nothing written (the over-bound one
    // by its size, before anything is extracted).
    let store_g = d.join("store-g");
    let bad_golden = d.join("bad-golden.tar.gz");
    repack_golden(&bundle, &bad_golden, "not-json");
    import_is_refused(
        d,
        &bad_golden,
        &store_g,
        "its golden goldens/fx/small.json is not a golden JSON (",
    );
    repack_golden(&bundle, &bad_golden, "over-bound");
    import_is_refused(
        d,
        &bad_golden,
        &store_g,
        "its golden goldens/fx/small.json is 67108865 bytes, larger than 67108864 bytes, the limit",
    );
    std::fs::remove_file(&bad_golden).unwrap();

    // A bundle whose golden differs from what the pin gives, its lock
    // unsigned: a store with a trust policy (trusting no one who signed
    // it) refuses its lock, and so its golden, written nowhere; its own
    // build then gates with no golden, not against the bundle's.
    let differs = d.join("differs.tar.gz");
    repack_golden(&bundle, &differs, "differs");
    let k = d.join("box-k");
    let store_k = k.join("store");
    let (_, line_r) = keypair(d, "reviewer@test");
    let allowed = d.join("allowed_signers");
    std::fs::write(&allowed, &line_r).unwrap();
    crate::cache::configure(
        &store_k,
        &format!("file://{}", d.join("k-cache").display()),
        None,
        Some(&allowed),
        1,
    );
    let out = run(
        d,
        &[
            "import",
            differs.to_str().unwrap(),
            "--store",
            store_k.to_str().unwrap(),
            "--json",
        ],
    );
    ok(&out);
    let imported = json(&out);
    assert!(
        imported["lock_trust"]
            .as_str()
            .unwrap()
            .starts_with("untrusted: "),
        "{imported}"
    );
    let notes = imported["notes"].to_string();
    assert!(
        notes.contains("not taking golden goldens/fx/small.json: the bundle's lock is untrusted ("),
        "{imported}"
    );
    assert_eq!(imported["goldens"], serde_json::json!([]), "{imported}");
    assert!(!store_k.join("goldens").exists(), "{:?}", tree(&store_k));
    assert!(
        !store_k.join("imported/fx/goldens").exists(),
        "{:?}",
        tree(&store_k)
    );
    let k_recipe = k.join("recipes/fx.yaml");
    std::fs::create_dir_all(k_recipe.parent().unwrap()).unwrap();
    std::fs::copy(&recipe, &k_recipe).unwrap();
    let built_k = build(&mut cmd(d), &k_recipe, &store_k, &[]);
    assert_eq!(built_k["verdict"], "gateable", "{built_k}");
    assert_eq!(
        oracle_json(&built_k)["smoke"]["cases"][0]["golden"],
        "none",
        "{built_k}"
    );
    force_remove(&repo);

    // A misnamed wheel, and a wheel whose name disagrees with its metadata:
    // refused with exit 2, nothing written.
    let bad = d.join("misnamed.tar.gz");
    rename_wheel(
        &bundle,
        &bad,
        "packaging",
        "tinyoracle-latest.whl",
        "latest",
    );
    let store_x = d.join("store-x");
    import_is_refused(
        d,
        &bad,
        &store_x,
        "\"tinyoracle-latest.whl\" is not a valid wheel file name",
    );
    rename_wheel(
        &bundle,
        &bad,
        "packaging",
        "packaging-99.0-py3-none-any.whl",
        "99.0",
    );
    import_is_refused(d, &bad, &store_x, "METADATA says packaging");

    // The offline box: no network, no uv, an empty store.
    let b = d.join("box-b");
    let elsewhere = b.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let same = elsewhere.join("fx.yaml");
    std::fs::copy(&recipe, &same).unwrap();
    let store_b = b.join("store");
    let out = bare_offline_cmd(&b)
        .args([
            "import",
            bundle.to_str().unwrap(),
            "--store",
            store_b.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    ok(&out);
    let imported = json(&out);
    assert!(
        imported["uv"]
            .as_str()
            .unwrap()
            .starts_with(store_b.join("tools").to_str().unwrap()),
        "{imported}"
    );
    assert!(
        store_b.join("goldens/fx/small.json").is_file(),
        "{imported}"
    );

    // A recipe that differs from the imported one is told so, naming the field
    // (before any build: no root of the name exists yet).
    let other = b.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let changed = other.join("fx.yaml");
    std::fs::write(
        &changed,
        std::fs::read_to_string(&recipe).unwrap() + "pins: {packaging: \"24.0\"}\n",
    )
    .unwrap();
    let out = bare_offline_cmd(&b)
        .args([
            "build",
            changed.to_str().unwrap(),
            "--store",
            store_b.to_str().unwrap(),
            "--offline",
        ])
        .output()
        .unwrap();
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("differs from the one imported")
            && text(&out).contains("in: pins.packaging"),
        "{}",
        text(&out)
    );

    // (a) the original recipe file, copied anywhere.
    let a = build(&mut bare_offline_cmd(&b), &same, &store_b, &["--offline"]);
    assert_eq!(a["verdict"], "gateable", "{a}");
    let rec = oracle_json(&a);
    assert_eq!(
        rec["smoke"]["cases"][0]["golden"], "matched",
        "{}",
        rec["smoke"]
    );
    assert!(
        rec["tools"]["uv"]["path"]
            .as_str()
            .unwrap()
            .starts_with(store_b.to_str().unwrap())
    );

    // (b) the recipe's name, found through ORACLE_BUILD_RECIPES (venv rebuilt).
    force_remove(Path::new(a["oracle"].as_str().unwrap()));
    let out = bare_offline_cmd(&b)
        .env("ORACLE_BUILD_RECIPES", &elsewhere)
        .args([
            "build",
            "fx",
            "--store",
            store_b.to_str().unwrap(),
            "--offline",
            "--json",
        ])
        .output()
        .unwrap();
    ok(&out);
    let by_name = json(&out);
    assert_eq!(by_name["verdict"], "gateable");
    assert_eq!(identity(&by_name), identity(&a));

    // Re-importing a bundle whose golden differs keeps the store's golden,
    // and the imported copy (what the imported recipe gates against) is
    // that kept one, not the bundle's.
    let kept = std::fs::read(store_b.join("goldens/fx/small.json")).unwrap();
    let out = bare_offline_cmd(&b)
        .args([
            "import",
            differs.to_str().unwrap(),
            "--store",
            store_b.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    ok(&out);
    let again = json(&out);
    let copy = store_b.join("imported/fx/goldens/fx/small.json");
    assert!(
        again["notes"].to_string().contains(&format!(
            "kept the golden already at {} (the bundle's differs); {} is that one too",
            store_b.join("goldens/fx/small.json").display(),
            copy.display()
        )),
        "{again}"
    );
    assert_eq!(std::fs::read(&copy).unwrap(), kept);
    assert_eq!(
        std::fs::read(store_b.join("goldens/fx/small.json")).unwrap(),
        kept
    );
}

#[test]
fn a_uv_of_another_version_is_used_only_when_asked_for_and_keys_the_build() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, store) = fixture_pin(d);
    // A uv on PATH that is not the pinned version (it says so and can do nothing else).
    let other = d.join("other-uv");
    std::fs::create_dir_all(&other).unwrap();
    let stub = other.join("uv");
    std::fs::write(
        &stub,
        "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'uv 0.11.15 (x86_64-unknown-linux-gnu)'; exit 0; }\necho 'the unpinned uv was used' >&2; exit 97\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        other.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    // Named explicitly without asking for an unpinned uv: refused before any work.
    let out = cmd(d)
        .env("ORACLE_BUILD_UV", &stub)
        .args([
            "build",
            recipe.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("not the pinned uv 0.13.9")
            && text(&out).contains("ORACLE_BUILD_UV_UNPINNED=1"),
        "{}",
        text(&out)
    );

    // On PATH: skipped; the pinned uv builds, and its version keys wheel and venv.
    let built = build(cmd(d).env("PATH", &path), &recipe, &store, &[]);
    let rec = oracle_json(&built);
    assert!(
        rec["tools"]["uv"]["version"]
            .as_str()
            .unwrap()
            .starts_with("uv 0.13.9"),
        "{}",
        rec["tools"]
    );
    assert_eq!(rec["inputs"]["uv"], "0.13.9", "{}", rec["inputs"]);
    let wheel = read_json(
        &store
            .join("store/wheels")
            .join(rec["wheel_key"].as_str().unwrap())
            .join("build.json"),
    );
    assert_eq!(
        wheel["inputs"]["toolchain"]["uv"], "0.13.9",
        "{}",
        wheel["inputs"]
    );

    // Asked for explicitly, the other uv is used (and fails here, as it can do nothing).
    let out = cmd(d)
        .env("PATH", &path)
        .env("ORACLE_BUILD_UV_UNPINNED", "1")
        .args([
            "build",
            recipe.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
            "--no-smoke",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(text(&out).contains("uv 0.11.15"), "{}", text(&out));
}

/// Rewrites the bundle `src` into `dst` with its `goldens/fx/small.json`
/// replaced (its size and sha256 in `oracle-bundle.json` fixed, so the
/// archive itself is sound): `differs` keeps it golden JSON with other
/// output tokens, `not-json` makes it text, `over-bound` a JSON string one
/// byte over 64 MiB (`recipe::MAX_GOLDEN_JSON`).
fn repack_golden(src: &Path, dst: &Path, kind: &str) {
    let script = r#"
import hashlib, io, json, sys, tarfile
src, dst, kind = sys.argv[1:4]
with tarfile.open(src, "r:gz") as t:
    members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]
out, found = [], False
for m, data in members:
    if m.name == "goldens/fx/small.json":
        found = True
        if kind == "differs":
            g = json.loads(data); g["output_token_ids"] = [7, 7, 7]
            data = json.dumps(g).encode()
        elif kind == "not-json":
            data = b"this is not a golden\n"
        else:
            data = b'"' + b"a" * ((64 << 20) - 1) + b'"'
        m.size = len(data)
    out.append((m, data))
assert found, "no goldens/fx/small.json"
man = json.loads(dict((m.name, d) for m, d in out)["oracle-bundle.json"])
man["files"] = sorted(
    [{"path": m.name, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
     for m, d in out if m.isfile() and m.name != "oracle-bundle.json"], key=lambda f: f["path"])
with tarfile.open(dst, "w:gz", compresslevel=1) as t:
    for m, d in out:
        if m.name == "oracle-bundle.json":
            d = json.dumps(man).encode(); m.size = len(d)
        t.addfile(m, io.BytesIO(d) if d is not None else None)
"#;
    succeeds(Command::new("python3").args([
        "-c",
        script,
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
        kind,
    ]));
}

/// `import BUNDLE --store STORE` on the offline box: refused with exit 2, the
/// message holding `needle`, and nothing but empty directories written (and
/// the store's file-system verdict, `fs-check.json`, which `init` keeps).
fn import_is_refused(d: &Path, bundle: &Path, store: &Path, needle: &str) {
    let out = bare_offline_cmd(d)
        .arg("import")
        .arg(bundle)
        .arg("--store")
        .arg(store)
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains(needle), "{}", text(&out));
    assert!(
        tree(store)
            .iter()
            .all(|p| p.is_dir() || p == &store.join("fs-check.json")),
        "{:?}",
        tree(store)
    );
}
