//! The edges a real user hits (issue 16, items 7-17; issue 26, items 1-13):
//! each gets a clear answer, with the contract's exit code, and leaves the
//! store valid.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::*;

/// A fixture repository in `dir`, a recipe `fx` at its head commit with the
/// default smoke section, and the store path `dir/store`.
/// Returns (repo, commit, recipe, store).
fn fixture_pin(dir: &Path) -> (PathBuf, String, PathBuf, PathBuf) {
    let (repo, commit) = fixture_repo(dir);
    let recipe = write_recipe(dir, "fx", &repo, &commit, SMOKE);
    (repo, commit, recipe, dir.join("store"))
}

/// Runs `build <recipe> --store <store> <extra...>` in `cwd`.
fn build_out(cwd: &Path, recipe: &Path, store: &Path, extra: &[&str]) -> Output {
    cmd(cwd)
        .args(["build", &recipe.display().to_string(), "--store"])
        .arg(store)
        .args(extra)
        .output()
        .expect("oracle-build runs")
}

/// `git rev-parse HEAD~1` of `repo`: the tagged first commit of the fixture.
fn first_commit(repo: &Path) -> String {
    git(repo, &["rev-parse", "HEAD~1"])
}

// Item 7: an unsmoked oracle is not gateable (exit 4, verdict `unsmoked`),
// and a later build without --no-smoke runs the gate on it, so
// `build --activate` then creates the alias.
#[test]
fn no_smoke_exits_4_and_a_later_build_gates_and_activates_it() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, store) = fixture_pin(d);
    let out = build_out(d, &recipe, &store, &["--no-smoke", "--json"]);
    assert_eq!(code(&out), 4, "{}", text(&out));
    assert_eq!(json(&out)["verdict"], "unsmoked", "{}", text(&out));
    assert!(text(&out).contains("not smoked"), "{}", text(&out));

    let alias = d.join("venvs/oracle");
    let out = build_out(
        d,
        &recipe,
        &store,
        &["--activate", alias.to_str().unwrap(), "--json"],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    let j = json(&out);
    assert_eq!(j["verdict"], "gateable", "{j}");
    assert!(j["built"].to_string().contains("smoke"), "{j}");
    assert!(!j["built"].to_string().contains("wheel"), "{j}");
    assert!(
        std::fs::symlink_metadata(&alias)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        alias.canonicalize().unwrap(),
        Path::new(j["oracle"].as_str().unwrap())
    );
}

// Item 8: --emit-pin-block prints only the block, and only when every check
// passes; the same block appended twice stays a valid record;
// --write-pin-block replaces the block in place.
#[test]
fn pin_block_goes_to_stdout_only_when_verified_and_can_be_replaced_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, commit, recipe, store) = fixture_pin(d);
    let s = store.to_str().unwrap();
    let r = recipe.to_str().unwrap();
    let out = build_out(d, &recipe, &store, &[]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    let out = run(d, &["verify", r, "--store", s, "--emit-pin-block"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let block = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(block.starts_with("```parity-pin\n"), "{block}");
    assert!(block.ends_with("```\n"), "{block}");
    assert_eq!(
        block.lines().count(),
        6,
        "only the block on stdout: {block}"
    );
    assert!(block.contains(&commit));

    // `>> SYNC.md` twice: still one record.
    let sync = d.join("SYNC.md");
    std::fs::write(&sync, format!("# sync notes\n\n{block}{block}")).unwrap();
    let sf = sync.to_str().unwrap();
    let out = run(d, &["verify", r, "--store", s, "--pin-file", sf]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    // Checked against another commit, checks fail: stdout stays empty.
    let old = write_recipe(d, "fx-old", &repo, &first_commit(&repo), SMOKE);
    let venv = store.join("roots/fx").canonicalize().unwrap();
    let v = venv.to_str().unwrap();
    let o = old.to_str().unwrap();
    let out = run(
        d,
        &["verify", v, "--pin", o, "--store", s, "--emit-pin-block"],
    );
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert!(out.stdout.is_empty(), "nothing on stdout: {}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[FAIL]"));

    // --write-pin-block: two differing blocks become the measured one; the rest stays.
    let stale = block.replace(&commit, &first_commit(&repo));
    let before = format!("# sync notes\n\n{stale}\nkeep me\n\n{block}");
    std::fs::write(&sync, &before).unwrap();
    let out = run(d, &["verify", r, "--store", s, "--pin-file", sf]);
    assert_eq!(
        code(&out),
        2,
        "differing blocks are refused: {}",
        text(&out)
    );
    let out = run(
        d,
        &[
            "verify",
            v,
            "--pin",
            o,
            "--store",
            s,
            "--write-pin-block",
            sf,
        ],
    );
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&sync).unwrap(), before, "untouched");
    let out = run(d, &["verify", r, "--store", s, "--write-pin-block", sf]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&sync).unwrap(),
        format!("# sync notes\n\n{block}\nkeep me\n\n")
    );
    let out = run(d, &["verify", r, "--store", s, "--pin-file", sf]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    // A file that cannot be made is bad input, named before any work: a
    // directory, or a file in a directory that does not exist.
    let missing = d.join("no-such-dir/SYNC.md");
    for (flag, path, what) in [
        ("--write-pin-block", d.to_path_buf(), "is a directory"),
        ("--write-pin-block", missing.clone(), "does not exist"),
    ] {
        let out = run(
            d,
            &["verify", r, "--store", s, flag, path.to_str().unwrap()],
        );
        let t = text(&out);
        assert_eq!(code(&out), 2, "{t}");
        assert!(t.contains(flag) && t.contains(what), "{t}");
    }
    for (path, what) in [
        (d.to_path_buf(), "is a directory"),
        (missing.clone(), "does not exist"),
    ] {
        let out = run(
            d,
            &["sbom", r, "--store", s, "--out", path.to_str().unwrap()],
        );
        let t = text(&out);
        assert_eq!(code(&out), 2, "{t}");
        assert!(t.contains("--out") && t.contains(what), "{t}");
    }
    assert!(!missing.parent().unwrap().exists());
}

// Item 9: --record-golden never overwrites a file at the `golden:` path
// that is not a golden (here: a model's config.json), even with --force.
#[test]
fn record_golden_refuses_to_overwrite_a_file_that_is_not_a_golden() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, commit) = fixture_repo(d);
    let model = d.join("mymodel");
    std::fs::create_dir_all(&model).unwrap();
    for f in ["config.json", "vocab.json", "weights.json"] {
        std::fs::copy(fixture_models().join("model").join(f), model.join(f)).unwrap();
    }
    let smoke = SMOKE.replace("${FX_MODELS}/model", model.to_str().unwrap())
        + "      golden: mymodel/config.json\n";
    let recipe = write_recipe(d, "fx", &repo, &commit, &smoke);
    let store = d.join("store");
    let out = build_out(d, &recipe, &store, &["--no-smoke"]);
    assert_eq!(code(&out), 4, "{}", text(&out));
    let config = std::fs::read(model.join("config.json")).unwrap();
    for extra in [
        &["--record-golden"][..],
        &["--record-golden", "--force"][..],
    ] {
        let out = cmd(d)
            .args(["smoke", recipe.to_str().unwrap(), "--store"])
            .arg(&store)
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(code(&out), 2, "{}", text(&out));
        assert!(text(&out).contains("not a golden"), "{}", text(&out));
        assert_eq!(std::fs::read(model.join("config.json")).unwrap(), config);
    }
}

// Item 11: --json prints one JSON document on stdout when a command fails,
// usage errors included.
#[test]
fn json_failures_print_one_error_document_on_stdout() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let store = d.join("store");
    let s = store.to_str().unwrap();
    let out = run(d, &["verify", "no-such-pin", "--store", s, "--json"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let j = json(&out);
    assert_eq!(j["exit"], 2, "{j}");
    assert!(j["error"].as_str().unwrap().contains("no-such-pin"), "{j}");

    let out = run(d, &["build", "x", "--jobs", "0", "--json"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let j = json(&out);
    assert_eq!(j["exit"], 2, "{j}");
    assert!(j["error"].as_str().unwrap().contains("--jobs"), "{j}");

    // A failure after the document was printed: still exactly one document.
    let (_, _, recipe, store) = fixture_pin(d);
    let out = build_out(d, &recipe, &store, &["--no-smoke", "--json"]);
    assert_eq!(code(&out), 4, "{}", text(&out));
    assert_eq!(json(&out)["verdict"], "unsmoked");
}

/// Whether process `pid` still runs (a zombie counts as gone).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits (up to `secs` s) until `pid` is gone; returns whether it is.
fn gone_within(pid: i32, secs: u64) -> bool {
    let start = std::time::Instant::now();
    while alive(pid) {
        if start.elapsed().as_secs() > secs {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    true
}

// Item 12: a venv whose Python hangs makes verify and doctor fail (exit 1,
// naming the probe and the limit), and the hung process dies with them.
#[test]
fn a_hanging_python_makes_verify_and_doctor_fail_instead_of_hanging() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let venv = d.join("hung");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::fs::write(venv.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
    let pidfile = d.join("python.pid");
    let python = venv.join("bin/python");
    std::fs::write(
        &python,
        format!(
            "#!/bin/sh\necho $$ > '{}'\nexec sleep 1000\n",
            pidfile.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let recipe = write_recipe(d, "fx", d, &"a".repeat(40), SMOKE);
    let (v, r) = (venv.to_str().unwrap(), recipe.to_str().unwrap());
    let store = d.join("store");
    let s = store.to_str().unwrap();
    for args in [
        vec!["verify", v, "--pin", r, "--store", s],
        vec!["doctor", "--venv", v, "--pin", r, "--store", s],
    ] {
        let _ = std::fs::remove_file(&pidfile);
        let out = output_or_hang(
            cmd(d).args(&args).env("ORACLE_BUILD_PROBE_TIMEOUT", "2"),
            300,
        );
        let t = text(&out);
        assert!(
            t.contains("did not finish within 2 s") && t.contains("ORACLE_BUILD_PROBE_TIMEOUT"),
            "{args:?}: {t}"
        );
        assert_ne!(code(&out), 0, "{args:?}: {t}");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(gone_within(pid, 30), "the hung probe was killed");
    }
}

/// The first `` `oracle-build ...` `` command printed in `text` that starts with `prefix`.
fn printed_command(text: &str, prefix: &str) -> String {
    let start = text
        .find(&format!("`{prefix}"))
        .unwrap_or_else(|| panic!("no `{prefix}...` in:\n{text}"));
    let rest = &text[start + 1..];
    rest[..rest.find('`').unwrap()].to_string()
}

/// Runs a printed `oracle-build ...` command line with a POSIX shell.
fn run_printed(cwd: &Path, line: &str) -> std::process::Output {
    let bin = bin();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = cmd(cwd);
    c.env("PATH", path);
    let mut sh = std::process::Command::new("sh");
    sh.current_dir(cwd)
        .args(["-c", line])
        .envs(c.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
        .env_remove("ORACLE_BUILD_HOME");
    sh.output().unwrap()
}

// Item 16: hints run as printed (the lock hint for a recipe outside
// ./recipes, from another directory); verify of a dangling alias says what
// happened and how to fix it; plan says "to do" for a uv still to be
// installed and exits 1 when a build would stop.
#[test]
fn hints_run_as_printed_and_plan_tells_blocked_from_cached() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, commit, recipe, store) = fixture_pin(d);
    let elsewhere = d.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let alias = d.join("venvs/oracle");
    let out = build_out(
        &elsewhere,
        &recipe,
        &store,
        &["--activate", alias.to_str().unwrap()],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    let lock = printed_command(&text(&out), "oracle-build lock ");
    let out = run_printed(&elsewhere, &lock);
    assert_eq!(code(&out), 0, "`{lock}` runs as printed: {}", text(&out));
    let lock_json = std::fs::read_to_string(d.join("lockfiles/fx/lock.json")).unwrap();
    assert!(
        !lock_json.contains("\"File\"") && !lock_json.contains("\"Pyproject\""),
        "no Rust variant names in lock.json: {lock_json}"
    );

    // The oracle is deleted under the alias.
    force_remove(&alias.canonicalize().unwrap());
    let s = store.to_str().unwrap();
    let out = run(d, &["verify", alias.to_str().unwrap(), "--store", s]);
    let t = text(&out);
    assert_eq!(code(&out), 1, "{t}");
    assert!(
        t.contains("does not exist") && !t.contains("recipe file"),
        "{t}"
    );
    let fix = printed_command(&t, "oracle-build build ");
    assert!(fix.contains("--activate"), "{fix}");
    let out = run_printed(&elsewhere, &fix);
    assert_eq!(code(&out), 0, "`{fix}` runs as printed: {}", text(&out));
    let out = run(d, &["verify", alias.to_str().unwrap(), "--store", s]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    // plan: uv still to be provisioned is "to do", not "cached".
    let no_tools = d.join("no-tools");
    let out = cmd(d)
        .env("ORACLE_BUILD_TOOLS", &no_tools)
        .args(["plan", recipe.to_str().unwrap(), "--store", s, "--json"])
        .output()
        .unwrap();
    let j = json(&out);
    assert_eq!(code(&out), plan_exit(&out), "{j}");
    assert_eq!(j["steps"][0]["stage"], "toolchain", "{j}");
    assert_eq!(j["steps"][0]["state"], "to do", "{j}");
    assert!(!no_tools.exists(), "plan installed nothing");
    // ...and a Python that is not there blocks: exit 1.
    let bad = write_recipe(d, "fx-py", &repo, &commit, SMOKE);
    let text_py = std::fs::read_to_string(&bad)
        .unwrap()
        .replace("python: \"3.11\"", "python: \"3.99\"");
    std::fs::write(&bad, text_py).unwrap();
    let out = run(d, &["plan", bad.to_str().unwrap(), "--store", s, "--json"]);
    let j = json(&out);
    assert_eq!(j["steps"][0]["state"], "blocked", "{j}");
    assert_eq!(code(&out), 1, "{}", text(&out));
}

// Item 17: values that passed validation and failed later (or leaked
// internals) are refused at parse time: exit 2, file, line, field and value
// in plain words, nothing written.
#[test]
fn recipe_values_are_validated_up_front_in_plain_words() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let store = d.join("store");
    let good = |name: &str, package: &str, extra: &str| {
        format!(
            "name: {name}\nsource:\n  repo: file:///nonexistent\n  commit: {}\n  package: {package}\npython: \"3.11\"\nbuild:\n  target_device: cpu\n{extra}",
            "a".repeat(40)
        )
    };
    let long = "a".repeat(245);
    let many = format!("indexes: [{}]\n", vec!["a"; 300_000].join(","));
    let cases: Vec<(String, &str)> = vec![
        (
            good(&long, "fixturellm", ""),
            "line 1: field `name`: is 245 characters long; a name is at most 128",
        ),
        (
            good("x", "fixturellm", "smoke:\n  runs: 1e9\n"),
            "line 10: field `smoke.runs`: 1000000000 is written as a decimal or exponent number",
        ),
        (
            good("x", "fixturellm", "smoke:\n  runs: 4000000000\n"),
            "line 10: field `smoke.runs`: 4000000000 is more than 1000",
        ),
        (
            good("x", "5", ""),
            "line 5: field `source.package`: \"5\" is not an importable package name",
        ),
        (
            good("x", "fixturellm", "  env:\n    FOO: \"a\\0b\"\n"),
            "line 10: field `build.env.FOO`: \"a\\0b\" holds a NUL character",
        ),
        (
            good("x", "fixturellm", "  disk: {source_gib: -1}\n"),
            "line 9: field `build.disk.source_gib`: -1 is not a size in GiB",
        ),
        (
            good("x", "fixturellm", "lock:\n  exclude_newer: garbage\n"),
            "line 10: field `lock.exclude_newer`: \"garbage\" is not `commit`, `none` or an RFC 3339 timestamp",
        ),
        (
            good("[bad", "fixturellm", ""),
            "line 1: field `name`: expected a text value, found `[bad`, which YAML reads as the start of a list that is never closed",
        ),
        (
            good("x", "fixturellm", &many),
            "the YAML is too large, too deeply nested or expands too many aliases",
        ),
    ];
    for (text, want) in cases {
        let f = d.join("x.yaml");
        std::fs::write(&f, &text).unwrap();
        let out = run(
            d,
            &[
                "plan",
                f.to_str().unwrap(),
                "--store",
                store.to_str().unwrap(),
            ],
        );
        let e = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(code(&out), 2, "{want}: {e}");
        assert!(
            e.contains(&format!("x.yaml: {want}")) || e.contains(want),
            "{want}:\n{e}"
        );
        for leak in ["Some(", "Nodes {", "budget breached", "Option<"] {
            assert!(!e.contains(leak), "{leak} leaked: {e}");
        }
        assert!(!store.exists(), "nothing written");
    }
}

/// Whether this machine lets an unprivileged user namespace mount (to make a
/// directory read-only for root, which ignores permission bits).
fn can_unshare() -> bool {
    std::process::Command::new("unshare")
        .args(["-rm", "true"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `oracle-build args...` in a mount namespace where each of `ro` is a
/// read-only bind mount of itself.
fn run_with_read_only(cwd: &Path, ro: &[&Path], args: &[&str]) -> std::process::Output {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let mut script = String::from("set -e\n");
    for d in ro {
        let d = quote(d.to_str().unwrap());
        script += &format!("mount --bind {d} {d}\nmount -o remount,bind,ro {d}\n");
    }
    script += "exec \"$@\"\n";
    let c = cmd(cwd);
    let mut u = std::process::Command::new("unshare");
    u.current_dir(cwd)
        .args(["-rm", "sh", "-c", &script, "sh", bin().to_str().unwrap()])
        .args(args)
        .envs(c.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
        .env_remove("ORACLE_BUILD_HOME");
    u.output().unwrap()
}

// Item 10: activate into a read-only alias directory fails (exit 1) and
// changes nothing: no new root, no registry entry, no link.
#[test]
fn activate_that_cannot_write_the_alias_changes_nothing() {
    if !can_unshare() {
        eprintln!("SKIPPED: no unprivileged mount namespaces here (unshare -rm)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, store) = fixture_pin(d);
    let out = build_out(d, &recipe, &store, &[]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let venvs = d.join("venvs");
    std::fs::create_dir_all(&venvs).unwrap();
    let alias = venvs.join("oracle");
    let roots = |s: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(s.join("roots"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = roots(&store);
    let args = [
        "activate",
        recipe.to_str().unwrap(),
        alias.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ];
    let out = run_with_read_only(d, &[&venvs], &args);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains("Read-only file system"),
        "{}",
        text(&out)
    );
    assert_eq!(roots(&store), before, "no orphan root");
    assert!(!store.join("aliases.json").exists(), "nothing registered");
    assert!(
        std::fs::read_dir(&venvs).unwrap().next().is_none(),
        "no link"
    );
    // Writable again, the same command works.
    let out = run(d, &args);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(roots(&store).len() > before.len());
}

// Item 14: a home directory (so the default store) whose path holds a space
// and a quote builds, verifies and is gateable.
#[test]
fn a_store_path_with_a_space_and_a_quote_builds() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, _) = fixture_pin(d);
    let home = d.join("my home's");
    std::fs::create_dir_all(&home).unwrap();
    let r = recipe.to_str().unwrap();
    let out = cmd(d)
        .env("HOME", &home)
        .env_remove("XDG_DATA_HOME")
        .args(["build", r, "--json"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    let j = json(&out);
    assert_eq!(j["verdict"], "gateable", "{j}");
    assert!(
        j["oracle"]
            .as_str()
            .unwrap()
            .starts_with(home.join(".local/share/oracle-build").to_str().unwrap()),
        "{j}"
    );
    let out = cmd(d)
        .env("HOME", &home)
        .env_remove("XDG_DATA_HOME")
        .args(["verify", r])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
}

// Item 15: a read-only store serves the read-only commands: gc --dry-run,
// export, verify and a no-op build (exit 0); a command that must write
// fails (exit 1) and the store stays as it was.
#[test]
fn a_read_only_store_serves_read_only_commands() {
    if !can_unshare() {
        eprintln!("SKIPPED: no unprivileged mount namespaces here (unshare -rm)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, store) = fixture_pin(d);
    let out = build_out(d, &recipe, &store, &[]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let (r, s) = (recipe.to_str().unwrap(), store.to_str().unwrap());
    let bundle = d.join("fx.tar.gz");
    // Export prepares what a bundle needs (the pinned uv's wheel, the lock for
    // the platform) in the store once; a read-only export then only reads it.
    let out = run(
        d,
        &["export", r, "-o", bundle.to_str().unwrap(), "--store", s],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    std::fs::remove_file(&bundle).unwrap();
    let before = tree(&store);
    for args in [
        vec!["gc", "--dry-run", "--store", s],
        vec!["export", r, "-o", bundle.to_str().unwrap(), "--store", s],
        vec!["verify", r, "--store", s],
        vec!["build", r, "--store", s],
        vec!["status", "--store", s],
    ] {
        let out = run_with_read_only(d, &[&store], &args);
        assert_eq!(code(&out), 0, "{args:?}: {}", text(&out));
        assert!(
            !text(&out).contains("os error 30"),
            "{args:?}: {}",
            text(&out)
        );
    }
    assert!(bundle.is_file());
    let out = run_with_read_only(d, &[&store], &["unkeep", r, "--store", s]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert_eq!(tree(&store), before, "the store is as it was");
    // The bundle is whole: it imports into a fresh store.
    let out = run(
        d,
        &[
            "import",
            bundle.to_str().unwrap(),
            "--store",
            d.join("s2").to_str().unwrap(),
        ],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
}

// Item 13: `kill -9` of the tool's whole process group also ends the build
// it started (the watchdog lives in its own session), and the next run
// builds the same wheel in the same working directory.
#[test]
fn killing_the_whole_process_group_ends_the_build_it_started() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, commit) = fixture_repo(d);
    let (pidfile, flag, wrapper) = (d.join("cc.pid"), d.join("slow"), d.join("slow-cc"));
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" -c \"*) if [ -e '{}' ]; then echo $$ >> '{}'; sleep 600; fi;; esac\nexec cc \"$@\"\n",
            flag.display(),
            pidfile.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(&flag, "").unwrap();
    let extra = format!("  env:\n    CC: {}\n{SMOKE}", wrapper.display());
    let recipe = write_recipe(d, "fx", &repo, &commit, &extra);
    let store = d.join("store");
    let mut child = cmd(d)
        .args(["build", recipe.to_str().unwrap(), "--store"])
        .arg(&store)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let pid: i32 = loop {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse().ok()))
        {
            break p;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the build ended before compiling"
        );
        assert!(
            start.elapsed().as_secs() < 600,
            "the compiler never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    // SAFETY: kills the process group the test started (the tool leads it).
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait();
    assert!(
        gone_within(pid, 120),
        "the compiler the killed build started still runs"
    );
    std::fs::remove_file(&flag).unwrap();
    let out = build_out(d, &recipe, &store, &[]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

// Issue 26: the edges a new user hits, one answer each. The tests below
// share built fixture oracles where they can.

/// `oracle-build args...` in a mount namespace after the shell lines `setup`
/// (e.g. `mount --bind A B`): as [`run_with_read_only`], for any mounts.
fn run_in_namespace(cwd: &Path, setup: &str, args: &[&str]) -> Output {
    let script = format!("set -e\n{setup}\nexec \"$@\"\n");
    let c = cmd(cwd);
    let mut u = std::process::Command::new("unshare");
    u.current_dir(cwd)
        .args(["-rm", "sh", "-c", &script, "sh", bin().to_str().unwrap()])
        .args(args)
        .envs(c.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
        .env_remove("ORACLE_BUILD_HOME")
        .env("XDG_CONFIG_HOME", cwd.join("xdg"));
    u.output().unwrap()
}

/// `'s'` with `'` escaped, for the shell lines of [`run_in_namespace`].
fn sq(p: &Path) -> String {
    format!("'{}'", p.to_str().unwrap().replace('\'', "'\\''"))
}

/// `<store>/config.toml` with one `[[cache]]` named `team` at `url` and the
/// `extra` lines (line 3 on).
fn configure_cache(store: &Path, url: &str, extra: &str) -> PathBuf {
    std::fs::create_dir_all(store).unwrap();
    let file = store.join("config.toml");
    std::fs::write(
        &file,
        format!("[[cache]]\nname = \"team\"\nurl = \"{url}\"\n{extra}"),
    )
    .unwrap();
    file
}

/// `oracle-build args...` in `cwd` with a private `XDG_CONFIG_HOME`, so no
/// user-level cache configuration is read.
fn run_own_config(cwd: &Path, args: &[&str]) -> Output {
    cmd(cwd)
        .env("XDG_CONFIG_HOME", cwd.join("xdg"))
        .env("ORACLE_BUILD_BUILDER", "builder-a@test")
        .args(args)
        .output()
        .unwrap()
}

// Issue 26, item 1: a store reached through a bind mount is the same store
// for `doctor` (no false `alias-moved`); a read-only store lists a cache
// (`cache ls`), and `smoke` and `gc` refuse in plain words (no errno text),
// naming the store, what they would write and what to run instead; nothing
// changes.
#[test]
fn a_read_only_or_bind_mounted_store_answers_in_plain_words() {
    if !can_unshare() {
        eprintln!("SKIPPED: no unprivileged mount namespaces here (unshare -rm)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, _, recipe, store) = fixture_pin(d);
    let (r, s) = (recipe.to_str().unwrap(), store.to_str().unwrap());
    let alias = d.join("venvs/oracle");
    let out = build_out(d, &recipe, &store, &["--activate", alias.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    // The same store at another path: a bind mount (this test runs as root
    // of its own user namespace), read-only and writable alike.
    let bind = d.join("bind");
    std::fs::create_dir_all(&bind).unwrap();
    let b = bind.to_str().unwrap();
    for ro in ["", &format!("mount -o remount,bind,ro {}", sq(&bind))] {
        let setup = format!("mount --bind {} {}\n{ro}", sq(&store), sq(&bind));
        let out = run_in_namespace(d, &setup, &["doctor", "--store", b]);
        assert_eq!(code(&out), 0, "{ro}: {}", text(&out));
        assert!(!text(&out).contains("alias-moved"), "{ro}: {}", text(&out));
    }

    // Something for gc to delete: an oracle whose root is removed.
    let old = write_recipe(d, "fx-old", &repo, &first_commit(&repo), SMOKE);
    let out = build_out(d, &old, &store, &["--no-smoke"]);
    assert_eq!(code(&out), 4, "{}", text(&out));
    let out = run(d, &["unkeep", old.to_str().unwrap(), "--store", s]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let layout = d.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    configure_cache(&store, &format!("file://{}", layout.display()), "");

    let before = tree(&store);
    let ro = format!(
        "mount --bind {0} {0}\nmount -o remount,bind,ro {0}",
        sq(&store)
    );
    let out = run_in_namespace(d, &ro, &["cache", "ls", "--store", s]);
    assert_eq!(code(&out), 0, "cache ls: {}", text(&out));
    for (args, says) in [
        (vec!["smoke", r, "--store", s], "oracle-build verify"),
        (vec!["gc", "--store", s], "gc --dry-run"),
    ] {
        let out = run_in_namespace(d, &ro, &args);
        let t = text(&out);
        assert_eq!(code(&out), 1, "{args:?}: {t}");
        assert!(
            t.contains(&format!("the store {s} is read-only")) && t.contains(says),
            "{args:?}: {t}"
        );
        assert!(!t.contains("os error"), "{args:?}: {t}");
    }
    assert_eq!(tree(&store), before, "the store is as it was");
}

/// Sets the modification time of the directory `dir` to `t`.
fn set_dir_mtime(dir: &Path, t: std::time::SystemTime) {
    std::fs::File::open(dir).unwrap().set_modified(t).unwrap();
}

// Issue 26, item 2: a module of an oracle replaced by a symlink to an
// identical file outside the store (its directory's time restored) is
// found by verify, verify --deep and doctor, and the next build rebuilds the
// oracle instead of taking it as it is.
#[test]
fn a_symlink_planted_in_an_oracle_is_found_by_every_check() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, store) = fixture_pin(d);
    let (r, s) = (recipe.to_str().unwrap(), store.to_str().unwrap());
    let out = build_out(d, &recipe, &store, &["--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let venv = store.join("roots/fx").canonicalize().unwrap();
    let module = venv.join("lib/python3.11/site-packages/fixturellm/model.py");
    let dir = module.parent().unwrap();
    let (mode, mtime) = {
        let m = std::fs::metadata(dir).unwrap();
        (m.permissions().mode(), m.modified().unwrap())
    };
    let outside = d.join("model.py");
    std::fs::copy(&module, &outside).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o200)).unwrap();
    std::fs::remove_file(&module).unwrap();
    std::os::unix::fs::symlink(&outside, &module).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    set_dir_mtime(dir, mtime);
    assert_eq!(std::fs::metadata(dir).unwrap().modified().unwrap(), mtime);

    let says = "replaced by a symlink: lib/python3.11/site-packages/fixturellm/model.py";
    for args in [
        vec!["verify", r, "--store", s],
        vec!["verify", r, "--deep", "--store", s],
        vec!["doctor", "--store", s],
    ] {
        let out = run(d, &args);
        let t = text(&out);
        assert_ne!(code(&out), 0, "{args:?}: {t}");
        assert!(
            t.contains(says) && t.contains("(outside the entry)"),
            "{args:?}: {t}"
        );
    }
    let out = build_out(d, &recipe, &store, &["--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        json(&out)["built"].to_string().contains("venv"),
        "{}",
        text(&out)
    );
    let out = run(d, &["verify", r, "--deep", "--store", s]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

// Issue 26, items 5, 8, 11 and 12 on one built oracle: `plan` after a
// gateable build shows the gate as cached; `doctor` counts the entries
// `status` lists, and `status` lists the recipes the store holds wherever
// it runs; no wheel entry holds uv's `.gitignore`; `--write-pin-block`
// writes through a symlink (the link stays); a bundle repacked with
// `tar czf x.tar.gz -C dir .` imports.
#[test]
fn one_built_oracle_plans_counts_lists_writes_through_links_and_imports_repacked() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, store) = fixture_pin(d);
    let (r, s) = (recipe.to_str().unwrap(), store.to_str().unwrap());
    let out = build_out(d, &recipe, &store, &[]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    // Item 5.
    let out = run(d, &["plan", r, "--store", s, "--json"]);
    let j = json(&out);
    let smoke = j["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|st| st["stage"] == "smoke")
        .cloned()
        .unwrap();
    assert_eq!(smoke["state"], "cached", "{j}");
    assert!(smoke["detail"].to_string().contains("gateable"), "{smoke}");
    // A FIFO, then a 2 GiB sparse file, where the gate looks for the case's
    // golden (none named or recorded): `plan` hashes it for the smoke key
    // without blocking or reading it whole, and changes nothing.
    let golden = d.join("goldens/fx/small.json");
    std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
    // `export` refuses to carry it (exit 2, naming it), writing no bundle.
    let bundle = d.join("edge-bundle.tar.gz");
    type Maker = (fn(&Path), &'static str);
    let makers: [Maker; 2] = [
        (mkfifo, "is a FIFO, not a regular file"),
        (|p: &Path| sparse_file(p, 2 << 30), "is larger than"),
    ];
    for (make, says) in makers {
        make(&golden);
        let out = output_or_hang(cmd(d).args(["plan", r, "--store", s, "--json"]), 120);
        assert_eq!(code(&out), plan_exit(&out), "{}", text(&out));
        let b = bundle.to_str().unwrap();
        let out = output_or_hang(cmd(d).args(["export", r, "-o", b, "--store", s]), 120);
        let t = text(&out);
        assert_eq!(code(&out), 2, "{t}");
        assert!(t.contains("small.json") && t.contains(says), "{t}");
        assert!(!bundle.exists(), "{t}");
        std::fs::remove_file(&golden).unwrap();
    }
    std::fs::remove_dir_all(d.join("goldens")).unwrap();

    // Item 12: counts, recipes, no .gitignore.
    let elsewhere = d.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let status = json(&run(&elsewhere, &["status", "--store", s, "--json"]));
    let doctor = json(&run(&elsewhere, &["doctor", "--store", s, "--json"]));
    let listed = status["entries"].as_array().unwrap().len();
    assert!(listed > 5, "{status}");
    assert_eq!(doctor["entries"], listed, "{doctor}");
    let fx = status["recipes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == "fx")
        .cloned()
        .unwrap_or_else(|| panic!("the store's recipe is listed: {status}"));
    assert_eq!(fx["verdict"], "gateable", "{fx}");
    assert_eq!(
        Path::new(fx["oracle"].as_str().unwrap()),
        store.join("roots/fx").canonicalize().unwrap()
    );
    for w in std::fs::read_dir(store.join("store/wheels")).unwrap() {
        let w = w.unwrap().path();
        assert!(!w.join(".gitignore").exists(), "{}", w.display());
    }

    // Item 8: the link stays a link, its target gets the block.
    let notes = d.join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    std::fs::write(notes.join("SYNC.md"), "# sync notes\n").unwrap();
    let link = d.join("SYNC.md");
    std::os::unix::fs::symlink("notes/SYNC.md", &link).unwrap();
    let l = link.to_str().unwrap();
    let out = run(d, &["verify", r, "--store", s, "--write-pin-block", l]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let written = std::fs::read_to_string(notes.join("SYNC.md")).unwrap();
    assert!(
        written.starts_with("# sync notes\n") && written.contains("```parity-pin\n"),
        "{written}"
    );
    let out = run(d, &["verify", r, "--store", s, "--pin-file", l]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    // Item 11: a bundle unpacked and packed again the usual way.
    // (Into a directory that does not exist: refused up front, exit 2,
    // the store unchanged.)
    let before = tree(&store);
    let nowhere = d.join("no-such-dir").join("fx.tar.gz");
    let out = run(
        d,
        &["export", r, "-o", nowhere.to_str().unwrap(), "--store", s],
    );
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("no-such-dir does not exist"),
        "{}",
        text(&out)
    );
    assert_eq!(tree(&store), before);
    // A damaged wheelhouse entry is refused by export (the offline box
    // could not repair it), naming it, and moved aside; a build here
    // fetches it again.
    let house = store.join("store/wheelhouse");
    let mut shas: Vec<_> = std::fs::read_dir(&house)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    shas.sort();
    let victim = std::fs::read_dir(&shas[0])
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..100]).unwrap();
    let damaged = d.join("damaged.tar.gz");
    let out = run(
        d,
        &["export", r, "-o", damaged.to_str().unwrap(), "--store", s],
    );
    let t = text(&out);
    assert_eq!(code(&out), 1, "{t}");
    let label = format!(
        "wheelhouse/{}",
        shas[0].file_name().unwrap().to_string_lossy()
    );
    assert!(
        t.contains("damaged store entries") && t.contains(&label),
        "{t}"
    );
    assert!(!damaged.exists());
    assert!(!victim.exists(), "moved aside");
    let out = build_out(d, &recipe, &store, &[]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(std::fs::read(&victim).unwrap(), bytes, "repaired");
    // Into a directory itself: refused the same way, nothing left beside it.
    let before = tree(&store);
    let out = run(d, &["export", r, "-o", d.to_str().unwrap(), "--store", s]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("is a directory"), "{}", text(&out));
    assert_eq!(tree(&store), before);
    let bundle = d.join("fx.tar.gz");
    // An export SIGKILLed while it writes the bundle leaves its unfinished
    // bundle beside the output and its staging; the next export removes both.
    let mut export = cmd(d)
        .args(["export", r, "-o", bundle.to_str().unwrap(), "--store", s])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let beside = d.join(format!(".fx.tar.gz.{}.tmp", export.id()));
    let t0 = std::time::Instant::now();
    while !beside.exists() && t0.elapsed() < std::time::Duration::from_secs(120) {
        assert!(
            export.try_wait().unwrap().is_none(),
            "the export ended before it wrote"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    export.kill().unwrap();
    export.wait().unwrap();
    assert!(
        beside.exists() && !bundle.exists(),
        "killed while writing the bundle"
    );
    let staged: Vec<_> = std::fs::read_dir(store.join("tmp"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("export.")
        })
        .collect();
    assert!(!staged.is_empty(), "its staging is left");
    let out = run(
        d,
        &["export", r, "-o", bundle.to_str().unwrap(), "--store", s],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        !beside.exists() && staged.iter().all(|p| !p.exists()),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("unfinished bundle(s) of killed exports"),
        "{}",
        text(&out)
    );
    let unpacked = d.join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    succeeds(
        std::process::Command::new("tar")
            .arg("xzf")
            .arg(&bundle)
            .arg("-C")
            .arg(&unpacked),
    );
    let repacked = d.join("repacked.tar.gz");
    succeeds(
        std::process::Command::new("tar")
            .arg("czf")
            .arg(&repacked)
            .arg("-C")
            .arg(&unpacked)
            .arg("."),
    );
    let s2 = d.join("s2");
    let out = run(
        d,
        &[
            "import",
            repacked.to_str().unwrap(),
            "--store",
            s2.to_str().unwrap(),
        ],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = run(
        d,
        &["build", r, "--offline", "--store", s2.to_str().unwrap()],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
}

/// `s` with every run of digits (and of `.` between them) written `N`.
fn digits_as_n(s: &str) -> String {
    let mut out = String::new();
    let mut in_number = false;
    for c in s.chars() {
        if c.is_ascii_digit() || (in_number && c == '.') {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

/// The report part (after `<url>: `) of the first `pushed ...` line of `text`.
fn push_report(text: &str) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("pushed "))
        .unwrap_or_else(|| panic!("no `pushed` line in:\n{text}"));
    digits_as_n(line.split_once(": ").unwrap().1)
}

// Issue 26, items 7 and 13: key files that are not what they should be are
// refused before anything is pushed (exit 2), naming the config file, line
// and field, the path and the fix: a directory, FIFO or device as
// `trusted_signers`, a public key, `/dev/zero` (without hanging), a
// world-readable key and a missing file as `signing_key`. Then a good key
// pushes, and README.md and docs/cache.md show the line `push` prints.
/// `cache ls --store <s>` run from `d` with its own XDG config directory.
fn cache_ls(d: &Path, s: &str) -> Output {
    output_or_hang(
        cmd(d)
            .env("XDG_CONFIG_HOME", d.join("xdg"))
            .args(["cache", "ls", "--store", s]),
        120,
    )
}

#[test]
fn config_shapes_toml_cannot_type_name_the_line_and_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, _, store) = fixture_pin(d);
    let s = store.to_str().unwrap();
    std::fs::create_dir_all(&store).unwrap();
    let config = store.join("config.toml");
    let url = format!("file://{}", d.join("layout").display());
    for (body, at) in [
        // `[cache]` where `[[cache]]` (an array of tables) is meant.
        (
            format!("[cache]\nname = \"team\"\nurl = \"{url}\"\n"),
            "line 1: field `cache`",
        ),
        // An integer past what the field holds.
        (
            format!(
                "[[cache]]\nname = \"team\"\nurl = \"{url}\"\nmin_signatures = 99999999999999999999\n"
            ),
            "line 4: field `cache[0].min_signatures`",
        ),
        // A second table without its name.
        (
            format!("[[cache]]\nname = \"team\"\nurl = \"{url}\"\n\n[[cache]]\nurl = \"{url}\"\n"),
            "line 5: field `cache[1]`",
        ),
    ] {
        std::fs::write(&config, &body).unwrap();
        let out = cache_ls(d, s);
        let t = text(&out);
        assert_eq!(code(&out), 2, "{body}: {t}");
        assert!(
            t.contains(&format!("{}: {at}", config.display())),
            "{body}: {t}"
        );
        assert_eq!(std::fs::read_to_string(&config).unwrap(), body);
        // `doctor` on a store with such a file names it (it was healthy).
        for dir in ["store", "roots"] {
            std::fs::create_dir_all(store.join(dir)).unwrap();
        }
        let doc = json(&run(d, &["doctor", "--store", s, "--json"]));
        let bad = problems_of(&doc, "bad-config");
        assert_eq!(bad.len(), 1, "{body}: {doc}");
        assert!(bad[0]["message"].as_str().unwrap().contains(at), "{doc}");
        assert_eq!(doc["healthy"], false, "{doc}");
    }
}

#[test]
fn hostile_key_files_are_refused_naming_file_line_and_field() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, store) = fixture_pin(d);
    let (r, s) = (recipe.to_str().unwrap(), store.to_str().unwrap());
    let layout = d.join("layout");
    let url = format!("file://{}", layout.display());

    std::fs::create_dir_all(&layout).unwrap();
    let fifo = d.join("fifo");
    succeeds(std::process::Command::new("mkfifo").arg(&fifo));
    for (path, what) in [
        (d.to_path_buf(), "is a directory"),
        (fifo.clone(), "is a FIFO, not a regular file"),
        (
            PathBuf::from("/dev/zero"),
            "is a device, not a regular file",
        ),
    ] {
        let extra = format!("trusted_signers = \"{}\"\n", path.display());
        let config = configure_cache(&store, &url, &extra);
        let out = cache_ls(d, s);
        let t = text(&out);
        assert_eq!(code(&out), 2, "{t}");
        let at = format!(
            "{}: line 4: field `cache[0].trusted_signers`",
            config.display()
        );
        assert!(t.contains(&at) && t.contains(what), "{what}: {t}");
    }
    std::fs::remove_dir(&layout).unwrap();
    // A build reads the same key files: refused the same way.
    let out = build_out(d, &recipe, &store, &[]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("field `cache[0].trusted_signers`"),
        "{}",
        text(&out)
    );
    std::fs::remove_file(store.join("config.toml")).unwrap();

    let out = build_out(d, &recipe, &store, &[]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    // `push` with the store's config only (no user config), ended if it hangs.
    let push_own_config = || {
        output_or_hang(
            cmd(d)
                .env("XDG_CONFIG_HOME", d.join("xdg"))
                .args(["push", r, "--store", s]),
            120,
        )
    };
    // `push` reads them before anything is pushed, with no signing key too.
    for (path, what) in [
        (fifo.clone(), "is a FIFO, not a regular file"),
        (
            PathBuf::from("/dev/zero"),
            "is a device, not a regular file",
        ),
    ] {
        let extra = format!("trusted_signers = \"{}\"\n", path.display());
        configure_cache(&store, &url, &extra);
        let out = push_own_config();
        let t = text(&out);
        assert_eq!(code(&out), 2, "{what}: {t}");
        assert!(
            t.contains("field `cache[0].trusted_signers`") && t.contains(what),
            "{what}: {t}"
        );
        assert!(
            !layout.join("index.json").exists(),
            "{what}: nothing was pushed"
        );
    }
    let (key, line) = keypair(d, "builder-a@test");
    let public = key.with_extension("pub");
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o600)).unwrap();
    let open = d.join("open-key");
    std::fs::copy(&key, &open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let allowed = d.join("allowed_signers");
    std::fs::write(&allowed, &line).unwrap();
    let missing = d.join("no-such-key");
    for (path, what) in [
        (
            public.clone(),
            "holds a public key, not a private key".to_string(),
        ),
        (PathBuf::from("/dev/zero"), "is a device".to_string()),
        (
            open.clone(),
            format!(
                "(mode 0644); like ssh, oracle-build refuses it: `chmod 600 {}`",
                open.display()
            ),
        ),
        (
            missing.clone(),
            format!(
                "does not exist; make a key (`ssh-keygen -t ed25519 -N '' -f {}`)",
                missing.display()
            ),
        ),
    ] {
        let extra = format!(
            "trusted_signers = \"{}\"\nsigning_key = \"{}\"\n",
            allowed.display(),
            path.display()
        );
        let config = configure_cache(&store, &url, &extra);
        let out = push_own_config();
        let t = text(&out);
        assert_eq!(code(&out), 2, "{what}: {t}");
        let at = format!("{}: line 5: field `cache[0].signing_key`", config.display());
        assert!(t.contains(&at) && t.contains(&what), "{what}: {t}");
        assert!(
            !layout.join("index.json").exists(),
            "{what}: nothing was pushed"
        );
    }

    // A good key: the line README.md and docs/cache.md show is the one printed.
    let extra = format!(
        "trusted_signers = \"{}\"\nsigning_key = \"{}\"\n",
        allowed.display(),
        key.display()
    );
    configure_cache(&store, &url, &extra);
    let out = run_own_config(d, &["push", r, "--store", s]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let printed = push_report(&text(&out));
    for doc in ["README.md", "docs/cache.md"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(doc);
        let shown = push_report(&std::fs::read_to_string(&path).unwrap());
        assert_eq!(shown, printed, "{doc} shows what push prints");
    }
}

// Issue 26, items 3, 4, 6 and 9, before any build: a store root that is a
// file is refused (exit 2) by status, doctor and gc, and stays as it was;
// global options may come before the command; a build option there is
// refused; a store path holding `$` is refused up front and nothing is
// made; a `file://` cache that does not exist is an error naming it.
#[test]
fn bad_store_roots_option_order_and_missing_caches_are_answered_up_front() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let file = d.join("not-a-store");
    std::fs::write(&file, "keep me\n").unwrap();
    let f = file.to_str().unwrap();
    for args in [
        vec!["status", "--store", f],
        vec!["doctor", "--store", f],
        vec!["gc", "--store", f],
        vec!["gc", "--dry-run", "--store", f],
    ] {
        let out = run(d, &args);
        let t = text(&out);
        assert_eq!(code(&out), 2, "{args:?}: {t}");
        assert!(
            t.contains(&format!("store root {f} exists and is not a directory")),
            "{args:?}: {t}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me\n");
    }

    let store = d.join("store");
    let s = store.to_str().unwrap();
    let out = run(d, &["--store", s, "status"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).starts_with(&format!("store {s}\n")),
        "{}",
        text(&out)
    );
    let out = run(d, &["--json", "--store", s, "gc", "--dry-run"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["dry_run"], true);
    let out = run(d, &["--offline", "status", "--store", s]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("--offline is given before the command `status`"),
        "{}",
        text(&out)
    );

    let (_, _, recipe, _) = fixture_pin(d);
    let dollar = d.join("a$x");
    let out = run(
        d,
        &[
            "build",
            recipe.to_str().unwrap(),
            "--store",
            dollar.to_str().unwrap(),
        ],
    );
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("holds a `$`"), "{}", text(&out));
    assert!(!dollar.exists(), "nothing was made");

    let nowhere = d.join("nowhere");
    let url = format!("file://{}", nowhere.display());
    let out = run_own_config(d, &["cache", "ls", "--cache", &url, "--store", s]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains(&format!("{} does not exist", nowhere.display()))
            && text(&out).contains("push"),
        "{}",
        text(&out)
    );
    assert!(!nowhere.exists());
}

// Issue 26, the house: the README stays at most 12 KiB (details live in docs/).
#[test]
fn the_readme_stays_at_most_12_kib() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let n = std::fs::metadata(&readme).unwrap().len();
    assert!(
        n <= 12_288,
        "README.md is {n} bytes; move detail into docs/"
    );
}

// Issue 26, item 12: a second store uses the pinned uv that the user's
// default store already holds instead of provisioning its own copy
// (without `ORACLE_BUILD_TOOLS`, which names one shared tools directory).
#[test]
fn a_second_store_uses_the_default_stores_uv() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, store) = fixture_pin(d);
    // The shared tools directory of the tests gets the pinned uv (a build).
    let out = build_out(d, &recipe, &store, &["--no-smoke"]);
    assert_eq!(code(&out), 4, "{}", text(&out));
    let uv_dir = shared_tools().join("uv-0.13.9");
    assert!(uv_dir.join("bin/uv").is_file());
    // PATH without any uv, so only the tools directories can give one.
    let path: Vec<PathBuf> = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .filter(|p| !p.join("uv").exists())
        .collect();
    let path = std::env::join_paths(path).unwrap();
    let home = d.join("home");
    let plan = |home: &Path| {
        let out = cmd(d)
            .env("HOME", home)
            .env("PATH", &path)
            .env_remove("XDG_DATA_HOME")
            .env_remove("ORACLE_BUILD_TOOLS")
            .args(["plan", recipe.to_str().unwrap(), "--json", "--store"])
            .arg(d.join("second"))
            .output()
            .unwrap();
        json(&out)["steps"][0].clone()
    };
    let alone = plan(&home);
    assert_eq!(alone["state"], "to do", "no uv anywhere yet: {alone}");
    let tools = home.join(".local/share/oracle-build/tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::os::unix::fs::symlink(&uv_dir, tools.join("uv-0.13.9")).unwrap();
    let shared = plan(&home);
    assert_eq!(
        shared["state"], "cached",
        "the default store's uv: {shared}"
    );
    assert!(
        shared["detail"].to_string().contains("uv 0.13.9"),
        "{shared}"
    );
    assert!(!d.join("second/tools").exists(), "nothing provisioned");
}

// Output that cannot be written: progress on stderr is best effort (a build
// whose stderr is full or closed finishes), and a report that cannot be
// written to stdout is an error (exit 1, said on stderr), not a panic (101).
#[test]
fn a_full_stderr_does_not_abandon_a_build_and_a_full_stdout_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, store) = fixture_pin(d);
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    let out = cmd(d)
        .args(["build", recipe.to_str().unwrap(), "--store"])
        .arg(&store)
        .stderr(full())
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = build_out(d, &recipe, &store, &["--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["built"], serde_json::json!([]), "built before");
    let out = cmd(d)
        .args(["status", "--json", "--store"])
        .arg(&store)
        .stdout(full())
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(code(&out), 1, "{t}");
    assert!(
        t.contains("cannot write the output to stdout") && !t.contains("panicked"),
        "{t}"
    );
}

/// `oracle-build args...` in `d` with its own XDG config directory, killed
/// (and the test failed) if it runs 60 s.
fn own_config_or_hang(d: &Path, args: &[&str]) -> Output {
    output_or_hang(cmd(d).env("XDG_CONFIG_HOME", d.join("xdg")).args(args), 60)
}

// A `config.toml` that is no configuration file (the store's or the
// user's) — a FIFO, which a plain open waits on for ever; a link to
// `/dev/zero`, which reads without end; a sparse file over 1 MiB; bytes that
// are not UTF-8 — makes `status` exit 2 at once naming the file and what is
// wrong, and `doctor --json` report it as `bad-config` (unhealthy), each
// under a hang guard and writing nothing.
#[test]
fn a_config_toml_that_is_a_fifo_a_device_or_not_text_is_named_without_hanging() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let store = d.join("store");
    let user = d.join("xdg").join("oracle-build").join("config.toml");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::create_dir_all(user.parent().unwrap()).unwrap();
    let s = store.to_str().unwrap();
    type Make = fn(&Path);
    let cases: [(Make, &str, bool); 5] = [
        (mkfifo, "is a FIFO, not a regular file", false),
        (
            |p| std::os::unix::fs::symlink("/dev/zero", p).unwrap(),
            "is a character device, not a regular file",
            false,
        ),
        (
            |p| sparse_file(p, 2 << 20),
            "is larger than 1048576 bytes, the limit",
            false,
        ),
        (
            |p| std::fs::write(p, b"[git]\nconnect_timeout = \"\xff\"\n").unwrap(),
            "is not UTF-8 text",
            false,
        ),
        // The user's file alike.
        (mkfifo, "is a FIFO, not a regular file", true),
    ];
    for (make, what, users) in cases {
        let config = if users {
            user.clone()
        } else {
            store.join("config.toml")
        };
        make(&config);
        let out = own_config_or_hang(d, &["status", "--store", s]);
        let t = text(&out);
        assert_eq!(code(&out), 2, "{what}: {t}");
        assert!(t.contains(&format!("{} {what}", config.display())), "{t}");
        let doc = json(&own_config_or_hang(d, &["doctor", "--store", s, "--json"]));
        let bad = problems_of(&doc, "bad-config");
        assert_eq!(bad.len(), 1, "{what}: {doc}");
        let msg = bad[0]["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("{} {what}", config.display())),
            "{doc}"
        );
        assert_eq!(doc["healthy"], false, "{doc}");
        let left: Vec<PathBuf> = if users { vec![] } else { vec![config.clone()] };
        assert_eq!(tree(&store), left, "{what}: nothing written");
        std::fs::remove_file(&config).unwrap();
    }
}

// A new box: a store root holding only `config.toml` with a `[[cache]]`
// (a `file://` cache). `plan` reads the cache (no `cache_problems`, every
// row answered, none `not_known`) and writes nothing in the store.
#[test]
fn plan_on_a_fresh_store_reads_its_cache_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, store) = fixture_pin(d);
    let layout = d.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    let url = format!("file://{}", layout.display());
    let config = configure_cache(&store, &url, "");
    let (r, s) = (recipe.to_str().unwrap(), store.to_str().unwrap());
    let out = own_config_or_hang(d, &["plan", r, "--store", s, "--json"]);
    let j = json(&out);
    assert_eq!(code(&out), plan_exit(&out), "{j}");
    assert_eq!(j["cache_problems"], serde_json::json!([]), "{j}");
    let rows = j["caches"].as_array().unwrap();
    assert!(rows.iter().any(|c| c["stage"] == "source"), "{j}");
    for row in rows {
        assert!(row["not_known"].is_null(), "{j}");
        assert!(row["cache"].is_null(), "an empty cache holds nothing: {j}");
    }
    assert_eq!(
        tree(&store),
        vec![config],
        "plan wrote nothing in the store"
    );
}
