//! `gc` never takes what a build or an import needs (issue 23): a `gc`
//! looping during two builds of one store loses nothing (the build sets a
//! lock resolution downloads are temporary roots from the start), and a
//! `gc` right after `pull` or `import` keeps everything they brought
//! (`roots/imported-<recipe>`), which `status`, `doctor` and `gc --dry-run`
//! show, a build of the pin replaces and `unkeep` drops.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::cache::{built_and_pushed, entries, ok, strs};
use crate::hermetic::bare_offline_cmd;
use crate::support::*;
use serde_json::Value;

/// `oracle-build <args> --store <store> --json` on a box without uv on PATH
/// and no index, asserting exit 0.
fn bare(cwd: &Path, store: &Path, args: &[&str]) -> Value {
    let out = bare_offline_cmd(cwd)
        .args(args)
        .arg("--store")
        .arg(store)
        .arg("--json")
        .output()
        .unwrap();
    ok(&out)
}

fn lock_reasons(store: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(d) = std::fs::read_dir(store.join("store/lockfiles")) {
        for e in d.flatten() {
            let t = std::fs::read_to_string(e.path().join("lock.json")).unwrap_or_default();
            if t.contains("\"reason\"") {
                out.push(t);
            }
        }
    }
    out
}

/// Flips the last byte of the wheel file in the wheel entry `dir`.
fn damage_wheel(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let whl = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("a wheel");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&whl, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&whl).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff;
    std::fs::write(&whl, bytes).unwrap();
}

/// A staging directory a killed `what` left in `<store>/tmp/` (its pid gone).
fn stale_staging(store: &Path, what: &str) {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let dir = store.join("tmp").join(format!("{what}.{pid}.killed"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("blob"), vec![0u8; 4096]).unwrap();
}

/// What is left under `<store>/tmp/`.
fn residue(store: &Path) -> Vec<std::path::PathBuf> {
    let t = store.join("tmp");
    if t.is_dir() { tree(&t) } else { Vec::new() }
}

#[test]
fn gc_looping_during_two_builds_loses_nothing() {
    let fx = Fx::new();
    let (repo, _, one) = fx.pin();
    let tag = git(&repo, &["rev-parse", "v0.1.0^{commit}"]);
    let two = fx.recipe("fx2", &repo, &tag, SMOKE);
    let store = fx.store().to_path_buf();
    std::fs::create_dir_all(&store).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicUsize::new(0));
    let (st, n, s, dir) = (
        stop.clone(),
        runs.clone(),
        store.clone(),
        fx.dir().to_path_buf(),
    );
    let looping = std::thread::spawn(move || {
        while !st.load(Ordering::SeqCst) {
            let out = cmd(&dir).args(["gc", "--store"]).arg(&s).output().unwrap();
            assert_eq!(code(&out), 0, "gc: {}", text(&out));
            n.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    });
    let spawn = |r: &Path| {
        fx.cmd(&["build", r.to_str().unwrap(), "--json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(&one), spawn(&two));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    stop.store(true, Ordering::SeqCst);
    looping.join().unwrap();
    assert!(runs.load(Ordering::SeqCst) > 1, "gc ran during the builds");
    for out in [&a, &b] {
        let report = ok(out);
        assert_eq!(report["verdict"], "gateable", "{report}");
    }
    // No lock fell back because its build set vanished under it.
    assert!(
        lock_reasons(&store).is_empty(),
        "{:?}",
        lock_reasons(&store)
    );
    // And after one more gc both rebuild offline with nothing to build.
    let out = fx.run(&["gc"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    for r in [&one, &two] {
        let again = ok(&fx.run(&["build", r.to_str().unwrap(), "--offline", "--json"]));
        assert!(
            strs(&again["built"]).iter().all(|s| s == "smoke"),
            "{again}"
        );
    }
}

#[test]
fn gc_after_pull_and_import_keeps_everything_and_damage_is_repaired_from_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let url = format!("file://{}", layout.display());
    let (fx, recipe, first, allowed) = built_and_pushed(&url, None);
    let r = recipe.to_str().unwrap();
    let d = fx.dir();
    let bundle = d.join("fx.tar.gz");
    let out = fx.run_at(
        &d.join("store-a"),
        &["export", r, "-o", bundle.to_str().unwrap()],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));

    // Box B pulls; a gc right after deletes nothing.
    let b = d.join("store-b");
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(
        b.join("config.toml"),
        format!(
            "[[cache]]\nname = \"team\"\nurl = \"{url}\"\ntrusted_signers = \"{}\"\n",
            allowed.display()
        ),
    )
    .unwrap();
    bare(d, &b, &["pull", r]);
    let pulled = entries(&b);
    let gc = bare(d, &b, &["gc"]);
    assert!(gc["deleted"].as_array().unwrap().is_empty(), "{gc}");
    assert_eq!(entries(&b), pulled);
    let dry = bare_offline_cmd(d)
        .args(["gc", "--dry-run", "--store"])
        .arg(&b)
        .output()
        .unwrap();
    assert!(text(&dry).contains("roots/imported-fx"), "{}", text(&dry));
    let status = bare(d, &b, &["status"]);
    let root = status["roots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "imported-fx")
        .cloned()
        .unwrap_or_default();
    assert!(!root["entries"].as_array().unwrap().is_empty(), "{status}");
    let doctor = bare_offline_cmd(d)
        .args(["doctor", "--json", "--store"])
        .arg(&b)
        .output()
        .unwrap();
    let doc = json(&doctor);
    assert!(
        !doc["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["kind"] == "unreachable"),
        "doctor recommends a gc that throws the pull away: {doc}"
    );
    assert!(!doc["imported"].as_array().unwrap().is_empty(), "{doc}");
    let built = bare(d, &b, &["build", r, "--offline"]);
    assert_eq!(built["key"], first["key"], "{built}");
    // The bytecode came with the pull: no .pyc compiled on this box.
    let rec = read_json(&Path::new(built["oracle"].as_str().unwrap()).join("oracle.json"));
    assert_eq!(rec["bytecode"]["compiled"], 0, "{}", rec["bytecode"]);
    assert!(pulled.iter().any(|e| e.starts_with("pyc/")), "{pulled:?}");
    assert!(
        !strs(&built["built"]).contains(&"wheel".to_string()),
        "{built}"
    );
    // The oracle's root now keeps what the pull brought.
    assert!(!b.join("roots/imported-fx").exists());
    bare(d, &b, &["gc"]);
    let again = bare(d, &b, &["build", r, "--offline"]);
    assert_eq!(again["key"], first["key"], "{again}");

    // A damaged wheel: `pull` re-checks it (not "already present") and
    // fetches it again; `build` takes it from the cache instead of
    // rebuilding it.
    let wheel_dir = b
        .join("store/wheels")
        .join(first["keys"]["wheel"].as_str().unwrap());
    damage_wheel(&wheel_dir);
    stale_staging(&b, "pull");
    // What the killed pull left is named by `doctor` and `gc --dry-run`.
    let out = bare_offline_cmd(d)
        .args(["doctor", "--json", "--store"])
        .arg(&b)
        .output()
        .unwrap();
    let doc = json(&out);
    let left = problems_of(&doc, "left-by-killed-run");
    assert_eq!(left.len(), 1, "{doc}");
    assert!(
        left[0]["subject"]
            .as_str()
            .unwrap()
            .starts_with("tmp/pull.")
            && left[0]["fix"].as_str().unwrap().contains("oracle-build gc"),
        "{doc}"
    );
    let dry = bare(d, &b, &["gc", "--dry-run"]);
    let listed = dry["left_by_killed_runs"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{dry}");
    assert_eq!(listed[0]["bytes"], 4096, "{dry}");
    assert_eq!(residue(&b).len(), 2, "gc --dry-run removed nothing");
    let out = bare_offline_cmd(d)
        .args(["pull", r, "--store"])
        .arg(&b)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(text(&out).contains("repaired wheels/"), "{}", text(&out));
    assert!(
        text(&out).contains("removed 1 stale staging directory"),
        "{}",
        text(&out)
    );
    // Only the damaged entry, moved aside (the next run removes it), is left.
    assert!(
        residue(&b).iter().all(|p| p
            .strip_prefix(b.join("tmp"))
            .unwrap()
            .to_string_lossy()
            .starts_with("damaged-")),
        "{:?}",
        residue(&b)
    );
    damage_wheel(&wheel_dir);
    force_remove(Path::new(again["oracle"].as_str().unwrap()));
    let repaired = bare(d, &b, &["build", r, "--offline"]);
    assert_eq!(repaired["key"], first["key"], "{repaired}");
    assert!(
        strs(&repaired["substituted"]).contains(&"wheel".to_string())
            && !strs(&repaired["built"]).contains(&"wheel".to_string()),
        "{repaired}"
    );

    // Box C imports; a gc right after deletes nothing; it builds offline.
    let c = d.join("store-c");
    stale_staging(&c, "import");
    // Before the import is run again, an offline build says it was cut short.
    let out = bare_offline_cmd(d)
        .args(["build", r, "--offline", "--store"])
        .arg(&c)
        .output()
        .unwrap();
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("a run bringing inputs into this store was interrupted")
            && text(&out).contains("run it again"),
        "{}",
        text(&out)
    );
    let out = bare_offline_cmd(d)
        .args(["import", bundle.to_str().unwrap(), "--store"])
        .arg(&c)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("removed 1 stale staging directory"),
        "{}",
        text(&out)
    );
    let imported = entries(&c);
    let gc = bare(d, &c, &["gc"]);
    assert!(gc["deleted"].as_array().unwrap().is_empty(), "{gc}");
    assert_eq!(entries(&c), imported);
    let built = bare(d, &c, &["build", r, "--offline"]);
    assert_eq!(built["key"], first["key"], "{built}");

    // `unkeep` drops an import's root: then gc may take what it brought.
    let e = d.join("store-e");
    bare(d, &e, &["import", bundle.to_str().unwrap()]);
    let mut un = Command::new(bin());
    test_env(&mut un);
    let out = un
        .current_dir(d)
        .args(["unkeep", r, "--store"])
        .arg(&e)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(!e.join("roots/imported-fx").exists(), "{}", text(&out));
    let gc = bare(d, &e, &["gc", "--dry-run"]);
    assert!(!gc["deleted"].as_array().unwrap().is_empty(), "{gc}");
}

/// The pid of the engine process whose model load the fixture reported in
/// `dir` (`<pid>.engine-cache`, `FIXTURELLM_ENV_REPORT`), waiting up to
/// two minutes for it.
fn engine_loaded(dir: &Path) -> i32 {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(pid) = tree(dir).iter().find_map(|p| {
            (p.extension()? == "engine-cache").then_some(())?;
            p.file_stem()?.to_str()?.parse().ok()
        }) {
            return pid;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(120),
            "no engine loaded its model"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The state letter of process `pid` (`/proc/<pid>/stat`: `T` stopped).
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The fixture's smoke block with 300 runs a case (long enough to be
/// stopped mid-case) and its engine reporting each model load into `rep`
/// (`FIXTURELLM_ENV_REPORT`, read by [`engine_loaded`]).
fn slow_reporting_smoke(rep: &Path) -> String {
    SMOKE.replacen(
        "  runs: 3\n",
        &format!(
            "  runs: 300\n  env:\n    FIXTURELLM_ENV_REPORT: \"{}\"\n",
            rep.display()
        ),
        1,
    )
}

/// The fixture engine process that loaded its model first (reported in
/// `rep`), stopped with SIGSTOP; returns once it is stopped (state `T`).
/// Panics when it ends first or is not stopped within 10 s.
fn stop_engine(rep: &Path) -> i32 {
    let engine = engine_loaded(rep);
    // SAFETY: a signal to the fixture's engine process, which the test's command started.
    assert_eq!(unsafe { libc::kill(engine, libc::SIGSTOP) }, 0);
    let t0 = std::time::Instant::now();
    while proc_state(engine) != Some('T') {
        assert!(
            proc_state(engine).is_some(),
            "the case ended before it could be stopped"
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    engine
}

// A running `smoke` keeps the oracle it gates, as a running build does
// (`locks/build-<pid>.roots`): `unkeep` then `gc` while its case runs
// (the case's engine process stopped mid-run with SIGSTOP, so the `gc` is
// certainly during it) deletes neither the venv entry, nor what it
// requires, nor its engine cache; the smoke then succeeds and records its
// verdict. Once it ended, the next `gc` takes the oracle and its cache.
#[test]
fn gc_during_a_smoke_keeps_the_oracle_it_gates() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let rep = fx.dir().join("reports");
    let smoke = slow_reporting_smoke(&rep);
    fx.recipe("fx", &repo, &commit, &smoke);
    fx.exits(&["build", "fx.yaml", "--no-smoke"], 4);
    let venv = fx.oracle("fx");
    let key = venv.file_name().unwrap().to_str().unwrap().to_string();
    let wheel = record(&venv)["requires"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .find(|l| l.starts_with("wheels/"))
        .map(|l| fx.store().join("store").join(l))
        .expect("the oracle requires its wheel");
    let cache = fx
        .store()
        .join("engine-cache")
        .join(format!("{key}-cpu-{}", std::env::consts::ARCH));

    let smoking = fx
        .cmd(&["smoke", "fx.yaml", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let engine = stop_engine(&rep);
    // The smoke's temporary roots are there, listing the oracle.
    let roots: Vec<String> = tree(&fx.store().join("locks"))
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "roots"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert!(
        roots.iter().any(|r| r.contains(&format!("venvs/{key}"))),
        "{roots:?}"
    );
    fx.exits(&["unkeep", "fx.yaml"], 0);
    let gc = fx.json(&["gc", "--json"]);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(engine, libc::SIGCONT) }, 0);
    let deleted: Vec<&str> = gc["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["entry"].as_str().unwrap())
        .collect();
    assert!(
        !deleted
            .iter()
            .any(|d| d.contains(&key) || d.starts_with("wheels/")),
        "{gc}"
    );
    assert!(venv.is_dir() && wheel.is_dir(), "{gc}");
    assert!(cache.is_dir(), "{gc}");

    let out = smoking.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["smoke"]["verdict"], "gateable");
    assert_eq!(record(&venv)["smoke"]["verdict"], "gateable");
    // Its roots went with it; with no root left, the next gc takes the
    // oracle, its wheel and its engine cache.
    let left: Vec<_> = tree(&fx.store().join("locks"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "roots"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let gc = fx.json(&["gc", "--json"]);
    assert!(!venv.exists() && !wheel.exists() && !cache.exists(), "{gc}");
}

// `advance` keeps FROM's oracle, which it gates again under TO's smoke
// configuration, and TO's, as a running build keeps its entries: with
// both recipes' roots dropped (`unkeep`) and a `gc` while FROM's gate runs
// (its engine stopped mid-case), both venv entries stay and `advance`
// writes its report; afterwards `gc` takes them.
#[test]
fn gc_during_advance_keeps_both_oracles() {
    let fx = Fx::new();
    let (repo, head) = fx.repo();
    let tag = git(&repo, &["rev-parse", "v0.1.0^{commit}"]);
    let rep = fx.dir().join("reports");
    let smoke = slow_reporting_smoke(&rep);
    fx.recipe("fxa", &repo, &tag, &smoke);
    fx.recipe("fxb", &repo, &head, &smoke);
    fx.exits(&["build", "fxa.yaml"], 0);
    fx.exits(&["build", "fxb.yaml"], 0);
    let (from, to) = (fx.oracle("fxa"), fx.oracle("fxb"));
    std::fs::remove_dir_all(&rep).unwrap();

    let advancing = fx
        .cmd(&["advance", "fxa.yaml", "fxb.yaml", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // TO is built already: the first model load is FROM's gate.
    let engine = stop_engine(&rep);
    fx.exits(&["unkeep", "fxa.yaml"], 0);
    fx.exits(&["unkeep", "fxb.yaml"], 0);
    let gc = fx.json(&["gc", "--json"]);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(engine, libc::SIGCONT) }, 0);
    assert!(from.is_dir() && to.is_dir(), "{gc}");
    let out = advancing.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(json(&out)["report_file"].is_string(), "{}", text(&out));

    fx.json(&["gc", "--json"]);
    assert!(!from.exists() && !to.exists());
}
