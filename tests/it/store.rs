//! The store: GC roots and `gc`, crash safety under SIGKILL, concurrent
//! builds, and the disk preflight.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;
use serde_json::Value;

fn oracle_identity(venv: &str) -> Value {
    let rec = record(Path::new(venv));
    let id = &rec["identity"];
    serde_json::json!({
        "runtime_version": id["runtime_version"], "distribution_version": id["distribution_version"],
        "compiled_extensions": id["compiled_extensions"], "commit": id["commit"], "wheel_sha256": rec["wheel_sha256"],
    })
}

/// Every entry that exists is complete: wheels and venvs pass their manifest
/// check, checkouts are git work trees, mirrors are bare repositories.
fn assert_no_partial_entries(fx: &Fx, store: &Path, when: &str) {
    let st = fx
        .cmd_at(store, &["status", "--json"])
        .current_dir(store.parent().unwrap())
        .output()
        .unwrap();
    assert_eq!(code(&st), 0, "{when}: {}", text(&st));
    for e in json(&st)["entries"].as_array().unwrap() {
        let label = e["entry"].as_str().unwrap();
        let path = Path::new(e["path"].as_str().unwrap());
        let complete = match label.split('/').next().unwrap() {
            "wheels" => e["health"] == "ok" && path.join("build.json").exists(),
            "venvs" => {
                e["health"] == "ok"
                    && path.join("oracle.json").exists()
                    && path.join("bin/python").exists()
            }
            "src" => path.join(".git/HEAD").exists(),
            "git" => path.join("HEAD").exists() && path.join("objects").is_dir(),
            _ => true,
        };
        assert!(complete, "{when}: partial entry listed: {e}");
    }
}

#[test]
fn gc_deletes_exactly_the_unrooted_entries() {
    let fx = Fx::new();
    let (repo, head) = fx.repo();
    let tagged = git(&repo, &["rev-parse", "v0.1.0"]);
    let a = fx.recipe("fx-a", &repo, &tagged, SMOKE);
    let b = fx.recipe("fx-b", &repo, &head, SMOKE);
    let store = fx.store();
    let ra = fx.build_json(store, &a);
    let rb = fx.build_json(store, &b);
    assert_ne!(ra["key"], rb["key"]);

    // Nothing is collectable while both pins are rooted.
    let dry = fx.run(&["gc", "--dry-run", "--json"]);
    assert_eq!(code(&dry), 0, "{}", text(&dry));
    assert_eq!(
        json(&dry)["deleted"].as_array().unwrap().len(),
        0,
        "{}",
        text(&dry)
    );

    let un = fx.run(&["unkeep", a.to_str().unwrap()]);
    assert_eq!(code(&un), 0, "{}", text(&un));
    let rec_a = record(Path::new(ra["oracle"].as_str().unwrap()));
    let wheel_a = format!("wheels/{}", rec_a["wheel_key"].as_str().unwrap());
    // Pin A's own lock (resolved by its build, kept in the store) goes too;
    // the wheelhouse artifacts it shares with B stay.
    let build_a = read_json(&store.join("store").join(&wheel_a).join("build.json"));
    let lock_a: Vec<String> = build_a["requires"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| {
            r.as_str()
                .filter(|r| r.starts_with("lockfiles/"))
                .map(str::to_string)
        })
        .collect();
    assert_eq!(lock_a.len(), 1, "{}", build_a["requires"]);
    let mut expected = vec![
        format!("src/{tagged}"),
        wheel_a,
        format!("venvs/{}", ra["key"].as_str().unwrap()),
        lock_a[0].clone(),
        // Its gate's warm engine caches go with it.
        format!(
            "engine-cache/{}-cpu-{}",
            ra["key"].as_str().unwrap(),
            std::env::consts::ARCH
        ),
    ];
    // The bytecode of A's own wheel goes too; that of the shared
    // wheelhouse artifacts stays.
    let rec_b = record(Path::new(rb["oracle"].as_str().unwrap()));
    let pyc_b: Vec<&str> = rec_b["requires"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    let pyc_a: Vec<String> = rec_a["requires"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str())
        .filter(|r| r.starts_with("pyc/") && !pyc_b.contains(r))
        .map(str::to_string)
        .collect();
    assert_eq!(pyc_a.len(), 1, "{}", rec_a["requires"]);
    expected.extend(pyc_a);
    expected.sort();

    let dry = json(&fx.run(&["gc", "--dry-run", "--json"]));
    let mut listed: Vec<String> = dry["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["entry"].as_str().unwrap().to_string())
        .collect();
    listed.sort();
    assert_eq!(listed, expected, "the shared mirror and pin B stay");
    assert!(dry["freed_bytes"].as_u64().unwrap() > 0);
    assert!(
        Path::new(ra["oracle"].as_str().unwrap()).exists(),
        "a dry run deletes nothing"
    );

    let real = fx.run(&["gc"]);
    assert_eq!(code(&real), 0, "{}", text(&real));
    assert!(
        // Five entries and the oracle's engine cache.
        String::from_utf8_lossy(&real.stdout).contains("deleted 6 entries"),
        "{}",
        text(&real)
    );
    assert!(!Path::new(ra["oracle"].as_str().unwrap()).exists());
    assert!(!store.join("store/src").join(&tagged).exists());
    assert!(store.join("store/src").join(&head).exists());
    let v = fx.run(&["verify", b.to_str().unwrap()]);
    assert_eq!(
        code(&v),
        0,
        "the rooted oracle still verifies: {}",
        text(&v)
    );

    // keep re-roots an oracle that is in the store.
    let k = fx.run(&["unkeep", b.to_str().unwrap()]);
    assert_eq!(code(&k), 0);
    let k = fx.run(&["keep", b.to_str().unwrap()]);
    assert_eq!(code(&k), 0, "{}", text(&k));
    let dry = json(&fx.run(&["gc", "--dry-run", "--json"]));
    assert_eq!(dry["deleted"].as_array().unwrap().len(), 0, "{dry}");
}

#[test]
fn sigkill_at_many_moments_never_leaves_a_partial_entry_and_the_rerun_resumes() {
    let fx = Fx::new();
    let (repo, head) = fx.repo();
    let recipe = fx.recipe("fx", &repo, &head, SMOKE);
    let reference = fx.build_json(&fx.dir().join("reference"), &recipe);
    let ref_id = oracle_identity(reference["oracle"].as_str().unwrap());

    // Each moment: the stage message the run must have printed, then a delay
    // after it. 11 markers x 2 delays = 22 distinct moments across toolchain,
    // fetch, checkout, lock, wheelhouse downloads, wheel build, persist,
    // install, identity and smoke.
    const MARKERS: [&str; 11] = [
        "toolchain:",
        "source: fetching",
        "source: checking out",
        "lock:",
        "wheelhouse:",
        "build: building",
        "build: wheel",
        "install:",
        "identity:",
        "smoke: probe",
        "smoke: case",
    ];
    const DELAYS_MS: [u64; 2] = [0, 60];
    let mut n = 0;
    for marker in MARKERS {
        for delay in DELAYS_MS {
            n += 1;
            let store = fx.dir().join(format!("s{n}"));
            let mut child = fx
                .cmd_at(&store, &["build", recipe.to_str().unwrap()])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .process_group(0)
                .spawn()
                .unwrap();
            let (tx, rx) = std::sync::mpsc::channel::<String>();
            let stderr = child.stderr.take().unwrap();
            let reader = std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut seen = false;
            while Instant::now() < deadline {
                match rx.recv_timeout(Duration::from_secs(1)) {
                    Ok(line) if line.starts_with(&format!("==> {marker}")) => {
                        seen = true;
                        break;
                    }
                    Ok(_) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            assert!(seen, "the build never printed {marker:?}");
            std::thread::sleep(Duration::from_millis(delay));
            let moment = format!("{delay} ms after {marker:?}");
            // SAFETY: killing the process group we just created.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            let _ = reader.join();
            assert_no_partial_entries(&fx, &store, &format!("after a kill {moment}"));

            let rerun = fx.build_json(&store, &recipe);
            assert_eq!(
                rerun["key"], reference["key"],
                "kill {moment}: same oracle key"
            );
            assert_eq!(
                oracle_identity(rerun["oracle"].as_str().unwrap()),
                ref_id,
                "kill {moment}"
            );
            let stale: Vec<_> = std::fs::read_dir(store.join("tmp"))
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .collect();
            assert!(
                stale.is_empty(),
                "kill {moment}: staging left behind: {stale:?}"
            );
            assert_no_partial_entries(&fx, &store, "after the rerun");
            // Stages finished before the kill are not redone.
            let built: Vec<&str> = rerun["built"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|v| v.as_str())
                .collect();
            if marker.starts_with("install")
                || marker.starts_with("identity")
                || marker.starts_with("smoke")
            {
                assert!(
                    !built.contains(&"wheel"),
                    "kill {moment}: the persisted wheel was rebuilt: {built:?}"
                );
            }
        }
    }
    assert!(n >= 20);
}

#[test]
fn four_concurrent_builds_build_once_and_gc_during_a_build_deletes_nothing_it_needs() {
    let fx = Fx::new();
    let (repo, _, recipe) = fx.pin();
    let children: Vec<_> = (0..4)
        .map(|_| {
            fx.cmd(&["build", recipe.to_str().unwrap(), "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let reports: Vec<Value> = outs
        .iter()
        .map(|o| {
            assert_eq!(code(o), 0, "{}", text(o));
            json(o)
        })
        .collect();
    for r in &reports {
        assert_eq!(r["oracle"], reports[0]["oracle"]);
    }
    let built_wheel = reports
        .iter()
        .filter(|r| r["built"].as_array().unwrap().iter().any(|s| s == "wheel"))
        .count();
    let built_venv = reports
        .iter()
        .filter(|r| r["built"].as_array().unwrap().iter().any(|s| s == "venv"))
        .count();
    assert_eq!((built_wheel, built_venv), (1, 1), "{reports:?}");
    assert!(
        outs.iter()
            .any(|o| String::from_utf8_lossy(&o.stderr).contains("waiting for")),
        "the others said who holds the lock"
    );

    // A gc started while a second pin builds deletes nothing that build needs.
    let tagged = git(&repo, &["rev-parse", "v0.1.0"]);
    let other = fx.recipe("fx-other", &repo, &tagged, SMOKE);
    let mut child = fx
        .cmd(&["build", other.to_str().unwrap(), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        if line.unwrap().starts_with("==> build:") {
            break;
        }
    }
    let gc = fx.run(&["gc", "--json"]);
    assert_eq!(code(&gc), 0, "{}", text(&gc));
    let deleted = json(&gc)["deleted"].clone();
    assert_eq!(
        deleted.as_array().unwrap().len(),
        0,
        "gc deleted what a build uses: {deleted}"
    );
    std::thread::spawn(move || lines.for_each(drop));
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    let v = fx.run(&["verify", other.to_str().unwrap()]);
    assert_eq!(code(&v), 0, "{}", text(&v));
}

#[test]
fn disk_preflight_refuses_early_naming_needed_free_and_path() {
    let fx = Fx::new();
    let (repo, head) = fx.repo();
    let extra = format!("  disk: {{wheel_gib: 100000}}\n{SMOKE}");
    let recipe = fx.recipe("fx", &repo, &head, &extra);
    let store = fx.store();
    let out = fx.build(&recipe);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("not enough disk for the wheel stage")
            && t.contains("bytes")
            && t.contains(store.to_str().unwrap()),
        "{t}"
    );
    assert_eq!(
        std::fs::read_dir(store.join("store/wheels"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn a_full_disk_mid_stage_is_reported_and_leaves_the_store_valid() {
    let fx = Fx::new();
    let mnt = fx.dir().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=2m",
            "tmpfs",
            mnt.to_str().unwrap(),
        ])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("skipped: cannot mount a size-limited tmpfs here (needs root / CAP_SYS_ADMIN)");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let (repo, head) = fx.repo();
    // Estimates small enough to pass the preflight, so the stage hits ENOSPC.
    let extra = format!("  disk: {{source_gib: 0, wheel_gib: 0, venv_gib: 0}}\n{SMOKE}");
    let recipe = fx.recipe("fx", &repo, &head, &extra);
    let store = mnt.join("store");
    let out = fx.run_at(&store, &["build", recipe.to_str().unwrap()]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains("the disk is full (ENOSPC)"),
        "{}",
        text(&out)
    );
    assert_no_partial_entries(&fx, &store, "after ENOSPC");
    let staged: Vec<_> = std::fs::read_dir(store.join("tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(staged.is_empty(), "partial work discarded: {staged:?}");
}

/// Processes whose command line mentions `needle` (from /proc).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                out.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
            }
        }
    }
    out
}

#[test]
fn sigterm_or_sigkill_of_the_tool_leaves_no_build_running() {
    let fx = Fx::new();
    let (repo, _) = fx.repo();
    let setup = repo.join("setup.py");
    let text = std::fs::read_to_string(&setup).unwrap();
    std::fs::write(&setup, format!("import time\ntime.sleep(60)\n{text}")).unwrap();
    git(&repo, &["commit", "-qam", "a slow build"]);
    let slow = git(&repo, &["rev-parse", "HEAD"]);
    let recipe = fx.recipe("fx", &repo, &slow, SMOKE);
    for (signal, code_want) in [(libc::SIGTERM, 143), (libc::SIGKILL, -1)] {
        let store = fx.dir().join(format!("store-{signal}"));
        let mut child = fx
            .cmd_at(&store, &["build", recipe.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        for line in lines.by_ref() {
            if line.unwrap().starts_with("==> build: building") {
                break;
            }
        }
        std::thread::sleep(Duration::from_secs(2));
        assert!(
            !processes_mentioning(store.to_str().unwrap()).is_empty(),
            "the build is running"
        );
        // SAFETY: signalling the child we spawned (the tool only, not its group).
        unsafe { libc::kill(child.id() as i32, signal) };
        std::thread::spawn(move || lines.for_each(drop));
        let status = child.wait().unwrap();
        if code_want > 0 {
            assert_eq!(status.code(), Some(code_want));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut left = processes_mentioning(store.to_str().unwrap());
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            left = processes_mentioning(store.to_str().unwrap());
        }
        assert!(
            left.is_empty(),
            "after signal {signal}, still running: {left:?}"
        );
    }
}

#[test]
fn a_store_path_that_is_a_file_or_links_into_a_checkout_is_bad_input() {
    let fx = Fx::new();
    let (repo, head) = fx.repo();
    let recipe = fx.recipe("fx", &repo, &head, SMOKE);
    let r = recipe.to_str().unwrap();
    let file = fx.dir().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let out = fx.run_at(&file, &["build", r]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("is not a directory"), "{}", text(&out));

    let link = fx.dir().join("linked-store");
    std::os::unix::fs::symlink(repo.join("x"), &link).unwrap();
    let out = fx.run_at(&link, &["build", r]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("inside the source checkout"),
        "{}",
        text(&out)
    );
    assert!(
        !repo.join("x").exists(),
        "nothing written into the checkout"
    );
}

/// Issue 42, item 2: a full disk during the lock's metadata step (PEP 517
/// `prepare_metadata_for_build_wheel` in a build venv in the store's
/// staging) fails the lock, named as a full disk, and changes nothing: a
/// lock written before keeps its bytes (its `runtime_source` still the
/// tree's metadata), and a build without a lockfile stores no lock. The
/// disk is a 1 MiB tmpfs mounted on `<store>/tmp` after the first lock
/// (the build set's wheels are already in the wheelhouse, so the step's
/// venv is the first thing that does not fit); where no tmpfs can be
/// mounted, the debug binary's `ORACLE_BUILD_TEST_FAULT=metadata-enospc`
/// makes the step fail with ENOSPC instead.
#[test]
fn a_full_disk_in_the_locks_metadata_step_fails_and_changes_no_lock() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    fx.exits(&["lock", r], 0);
    let lockdir = fx.dir().join("lockfiles/fx");
    let lock_json = std::fs::read(lockdir.join("lock.json")).unwrap();
    let runtime = std::fs::read(lockdir.join("pylock.runtime.toml")).unwrap();
    let info: Value = serde_json::from_slice(&lock_json).unwrap();
    assert_eq!(info["runtime_source"]["kind"], "metadata", "{info}");

    let tmp = fx.store().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let mounted = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "tmpfs",
            tmp.to_str().unwrap(),
        ])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    struct Unmount(Option<std::path::PathBuf>);
    impl Drop for Unmount {
        fn drop(&mut self) {
            if let Some(p) = &self.0 {
                let _ = std::process::Command::new("umount").arg(p).status();
            }
        }
    }
    let _guard = Unmount(mounted.then(|| tmp.clone()));
    let fault: &[(&str, &str)] = if mounted {
        &[]
    } else {
        eprintln!("no tmpfs can be mounted here: ORACLE_BUILD_TEST_FAULT=metadata-enospc");
        &[("ORACLE_BUILD_TEST_FAULT", "metadata-enospc")]
    };
    let empty = fx.dir().join("no-lockfiles");
    std::fs::create_dir_all(&empty).unwrap();
    for args in [
        vec!["lock", r],
        vec![
            "build",
            r,
            "--no-smoke",
            "--lockfiles",
            empty.to_str().unwrap(),
        ],
    ] {
        let out = fx.cmd(&args).envs(fault.iter().copied()).output().unwrap();
        let all = text(&out);
        assert_eq!(code(&out), 1, "{args:?}: {all}");
        assert!(
            all.contains("the metadata step of the lock of fx")
                && all.contains("the disk is full (ENOSPC)"),
            "{args:?}: the failure is the metadata step's, named as a full disk: {all}"
        );
        assert!(
            !all.contains("runtime set from the requirement file"),
            "{all}"
        );
        assert_eq!(std::fs::read(lockdir.join("lock.json")).unwrap(), lock_json);
        assert_eq!(
            std::fs::read(lockdir.join("pylock.runtime.toml")).unwrap(),
            runtime
        );
        let stored: Vec<_> = std::fs::read_dir(fx.store().join("store/lockfiles"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(stored.is_empty(), "{args:?}: no lock stored: {stored:?}");
    }
}

/// Runs `oracle-build <args> --store <mnt>/store` (the test's environment)
/// in a private mount namespace (`unshare --mount`) where `mount_cmd`
/// (a shell command, `$M` the mount point) was run first: the mount goes
/// when the process ends. `None` (with the reason printed) when this
/// machine does not allow the mount (not root, no `unshare`, a kernel
/// without the file system: CI containers).
fn in_mount(fx: &Fx, mount_cmd: &str, args: &[&str]) -> Option<(std::process::Output, String)> {
    let m = fx.dir().join("mnt");
    std::fs::create_dir_all(&m).unwrap();
    let store = m.join("store").display().to_string();
    let script = format!(
        "set -e\nM=\"$1\"; shift\n{mount_cmd} || {{ echo 'oracle-test: mount refused' >&2; exit 97; }}\nexec \"$@\""
    );
    let mut c = std::process::Command::new("unshare");
    c.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
        "sh",
    ])
    .arg(&m)
    .arg(bin())
    .args(args)
    .args(["--store", &store])
    .current_dir(fx.dir());
    test_env(&mut c);
    let out = match c.output() {
        Ok(o) => o,
        Err(e) => {
            println!("skipped: unshare does not run ({e})");
            return None;
        }
    };
    if code(&out) == 97 || text(&out).contains("unshare: ") {
        println!(
            "skipped: this machine does not allow `{mount_cmd}` in a private mount namespace: {}",
            text(&out)
        );
        return None;
    }
    Some((out, store))
}

/// Issue 43: a store on a file system that drops what it needs is refused
/// before any work, naming the mount point, its type and what failed: a
/// tmpfs mounted `noexec` (a script made executable does not run: the
/// probe itself), and a vfat loop mount (refused by its type). `doctor`
/// reports such a store as `store-filesystem`. Skipped, saying why, where
/// the machine does not allow mounting (the unit tests of
/// `store::fscheck` cover the mountinfo verdict).
#[test]
fn a_store_on_a_file_system_without_exec_bits_or_on_vfat_is_refused_naming_its_mount_and_type() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let recipe = fx.recipe("fx", &repo, &commit, "");
    let r = recipe.to_str().unwrap();
    let noexec = "mount -t tmpfs -o noexec,size=16m tmpfs \"$M\"";
    if let Some((out, store)) = in_mount(&fx, noexec, &["fetch", r]) {
        assert_eq!(code(&out), 2, "{}", text(&out));
        let t = text(&out);
        assert!(
            t.contains(&format!("the store {store} cannot be used")),
            "{t}"
        );
        assert!(t.contains("exec bits"), "{t}");
        assert!(
            t.contains(&format!(
                "{} mounted as tmpfs",
                fx.dir().join("mnt").display()
            )),
            "{t}"
        );
        assert!(t.contains("nothing was written"), "{t}");
        // doctor names it too (a store made by hand on that mount).
        let made = format!(
            "{noexec} && mkdir -p \"$M/store/store\" \"$M/store/tmp\" \"$M/store/roots\" \"$M/store/locks\""
        );
        let (out, _) = in_mount(&fx, &made, &["doctor", "--json"]).expect("mounted once already");
        assert_eq!(code(&out), 1, "{}", text(&out));
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let p = problems_of(&doc, "store-filesystem");
        assert_eq!(p.len(), 1, "{doc}");
        assert!(
            p[0]["message"].as_str().unwrap().contains("exec bits"),
            "{doc}"
        );
    }
    // No `store/` was left on the test's own file system either.
    assert!(!fx.dir().join("mnt/store").exists());
    let img = fx.dir().join("vfat.img");
    let vfat = format!(
        "truncate -s 16M {img} && mkfs.vfat {img} >/dev/null && mount -o loop {img} \"$M\"",
        img = img.display()
    );
    if which::which("mkfs.vfat").is_err() {
        println!("skipped the vfat mount: no mkfs.vfat (apt-get install dosfstools)");
    } else if let Some((out, store)) = in_mount(&fx, &vfat, &["fetch", r]) {
        assert_eq!(code(&out), 2, "{}", text(&out));
        let t = text(&out);
        assert!(
            t.contains(&format!("the store {store} cannot be used")),
            "{t}"
        );
        assert!(t.contains("mounted as vfat"), "{t}");
    }
}
