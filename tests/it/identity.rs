//! The identity gate end to end: `verify` (checks, `--deep`, `--pin-file`,
//! `--emit-pin-block`), `activate` (atomic alias + rollback root) and `doctor`
//! (every known way an oracle goes wrong), with the real binary, git, uv and
//! venvs. Each failure mode is reproduced for real: an editable install whose
//! source is deleted, an alias left on (or moved to) another oracle, a venv
//! with files removed, a build without tags, a foreign install without kernels.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::support::*;

/// The fixture repository with three commits: tagged `v0.1.0`, then `c1`, then `c2`.
fn repo_with_two_commits(dir: &Path) -> (PathBuf, String, String) {
    let (repo, c1) = fixture_repo(dir);
    std::fs::write(repo.join("NOTES.md"), "third commit\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "third"]);
    let c2 = git(&repo, &["rev-parse", "HEAD"]);
    (repo, c1, c2)
}

/// The problems of a `doctor --json` report.
fn problems(out: &Output) -> Vec<serde_json::Value> {
    json(out)["problems"].as_array().unwrap().clone()
}

/// The problems of `kind` about `subject` (a substring).
fn find<'a>(ps: &'a [serde_json::Value], kind: &str, subject: &str) -> Vec<&'a serde_json::Value> {
    ps.iter()
        .filter(|p| p["kind"] == kind && p["subject"].as_str().unwrap().contains(subject))
        .collect()
}

fn kinds(ps: &[serde_json::Value]) -> Vec<String> {
    ps.iter()
        .map(|p| {
            format!(
                "{} {}",
                p["kind"].as_str().unwrap(),
                p["subject"].as_str().unwrap()
            )
        })
        .collect()
}

/// Makes one file of a read-only store entry deletable / writable.
fn unlock(file: &Path) {
    for p in [file.parent().unwrap(), file] {
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode | 0o200)).unwrap();
    }
}

/// Runs a real tool (uv, git) and asserts success.
fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().expect("runs");
    assert!(out.status.success(), "{cmd:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The uv and Python that built `venv` (from its `oracle.json`), to make
/// foreign venvs with the very same tools.
fn tools_of(venv: &Path) -> (PathBuf, PathBuf) {
    let rec = record(venv);
    (
        PathBuf::from(rec["tools"]["uv"]["path"].as_str().unwrap()),
        PathBuf::from(rec["tools"]["python"]["path"].as_str().unwrap()),
    )
}

#[test]
fn verify_checks_each_field_and_the_emitted_pin_block_round_trips() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, c1, c2) = repo_with_two_commits(d);
    let a = write_recipe(d, "fx-a", &repo, &c1, SMOKE);
    let b = write_recipe(d, "fx-b", &repo, &c2, SMOKE);
    fx.exits(&["build", a.to_str().unwrap()], 0);
    fx.exits(&["build", b.to_str().unwrap()], 0);

    // Every check is listed with its expected and measured values.
    let out = fx.exits(&["verify", "fx-a.yaml"], 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for field in [
        "import",
        "commit",
        "clean_tree",
        "editable",
        "package_path",
        "compiled_extensions",
        "build_mode",
        "python_version",
        "recorded runtime_version",
        "recorded distribution_version",
        "recorded flashinfer_version",
        "recorded torch_version",
        "files (RECORD)",
        "files (manifest)",
    ] {
        assert!(
            stdout.contains(&format!("[ok]   {field} ")),
            "no passing {field}:\n{stdout}"
        );
    }
    assert!(stdout.contains("verified: all"), "{stdout}");
    let v = fx.json(&["verify", "fx-a.yaml", "--json"]);
    assert_eq!(v["ok"], true);
    for c in v["checks"].as_array().unwrap() {
        assert_eq!(c["ok"], true, "{c}");
        assert!(c["expected"].is_string() && c["found"].is_string(), "{c}");
    }
    assert_eq!(v["identity"]["commit"], c1.as_str());

    // The emitted block is exactly the fenced block, measured from the oracle.
    let out = fx.exits(&["verify", "fx-a.yaml", "--emit-pin-block"], 0);
    let block = String::from_utf8_lossy(&out.stdout).into_owned();
    let runtime = record(&fx.oracle("fx-a"))["identity"]["runtime_version"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        block,
        format!(
            "```parity-pin\nvllm_commit = {c1}\nvllm_runtime_version = {runtime}\nvllm_distribution_version = {runtime}\nflashinfer_version = none\n```\n"
        )
    );
    // Pasted into the users' notes, it reads back and passes on the same oracle...
    let notes = d.join("SYNC.md");
    std::fs::write(
        &notes,
        format!("# sync notes\n\nThe parity pin:\n\n{block}\nOther text.\n"),
    )
    .unwrap();
    let n = notes.to_str().unwrap();
    let v = fx.json(&["verify", "fx-a.yaml", "--pin-file", n, "--json"]);
    for field in [
        "vllm_commit",
        "vllm_runtime_version",
        "vllm_distribution_version",
        "flashinfer_version",
    ] {
        assert!(
            v["checks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["field"] == field && c["ok"] == true),
            "{field}: {v}"
        );
    }

    // ...and fails on a different oracle, naming each field that differs.
    let out = fx.exits(&["verify", "fx-b.yaml", "--pin-file", n], 3);
    let t = text(&out);
    assert!(
        t.contains("[FAIL] vllm_commit") && t.contains(&format!("expected {c1}")),
        "{t}"
    );
    assert!(t.contains("[FAIL] vllm_runtime_version"), "{t}");
    assert!(t.contains("[FAIL] vllm_distribution_version"), "{t}");
    assert!(
        t.contains("[ok]   flashinfer_version"),
        "none matches none: {t}"
    );
    assert!(t.contains(&format!("found {c2}")), "{t}");

    // No block is emitted from an oracle that fails.
    let out = fx.exits(
        &["verify", "fx-b.yaml", "--pin-file", n, "--emit-pin-block"],
        3,
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("```parity-pin"),
        "{}",
        text(&out)
    );

    // A venv checked against another recipe is refused, naming the commit.
    let venv_b = fx.oracle("fx-b");
    let out = fx.exits(
        &["verify", venv_b.to_str().unwrap(), "--pin", "fx-a.yaml"],
        3,
    );
    assert!(text(&out).contains("[FAIL] commit"), "{}", text(&out));
    // Against its own oracle.json it passes.
    fx.exits(&["verify", venv_b.to_str().unwrap()], 0);
}

#[test]
fn pin_file_mistakes_are_bad_input_before_anything_is_measured() {
    let fx = Fx::new();
    let d = fx.dir();
    let commit = "5559679229bc961848b121ccdeaa8fa5d79bec98";
    write_recipe(d, "fx", Path::new("/nonexistent"), commit, "");
    let good = format!(
        "vllm_commit = {commit}\nvllm_runtime_version = 0.23.1rc1.dev1511+g555967922\nvllm_distribution_version = 0.23.1rc1.dev1511+g555967922\nflashinfer_version = 0.6.15.post1\n"
    );
    let fenced = |body: &str| format!("notes\n```parity-pin\n{body}```\n");
    let cases: Vec<(&str, String, &str)> = vec![
        ("zero", "no block at all\n".into(), "no ```parity-pin block"),
        (
            // Two blocks that differ (identical repeated blocks read as one).
            "two",
            format!(
                "{}{}",
                fenced(&good),
                fenced(&good.replace("0.6.15.post1", "0.6.16"))
            ),
            "2 ```parity-pin blocks (at line 2, line 9) that differ",
        ),
        (
            "unknown",
            fenced(&format!("{good}torch_version = 2.13.0\n")),
            "unknown key \"torch_version\"",
        ),
        (
            "missing",
            fenced(&good.replace(
                "vllm_distribution_version = 0.23.1rc1.dev1511+g555967922\n",
                "",
            )),
            "lacks vllm_distribution_version",
        ),
        (
            "short",
            fenced(&good.replace(commit, "555967922")),
            "full 40-hex commit",
        ),
    ];
    for (name, body, needle) in cases {
        let f = d.join(format!("{name}.md"));
        std::fs::write(&f, body).unwrap();
        let out = fx.exits(&["verify", "fx.yaml", "--pin-file", f.to_str().unwrap()], 2);
        let t = text(&out);
        assert!(
            t.contains(needle) && t.contains(&format!("{name}.md")),
            "{name}: {t}"
        );
    }
    let out = run(d, &["verify", "fx.yaml", "--pin-file", "absent.md"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("absent.md"), "{}", text(&out));
}

#[test]
fn doctor_names_a_damaged_wheelhouse_file_and_checkout() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, commit) = fixture_repo(d);
    let recipe = write_recipe(d, "fx", &repo, &commit, SMOKE);
    fx.exits(&["build", recipe.to_str().unwrap()], 0);
    fx.exits(&["doctor"], 0);
    // One byte of a wheelhouse file (same size) and of a checkout file.
    let store = fx.store();
    let artifact = std::fs::read_dir(store.join("store/wheelhouse"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find_map(|dir| {
            std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.extension().is_some_and(|x| x == "whl"))
        })
        .unwrap();
    let checkout = store.join("store/src").join(&commit).join("setup.py");
    for f in [&artifact, &checkout] {
        unlock(f);
        let mut bytes = std::fs::read(f).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(f, &bytes).unwrap();
    }
    let ps = problems(&fx.exits(&["doctor", "--json"], 1));
    let wheelhouse = format!(
        "wheelhouse/{}",
        artifact
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
    );
    for subject in [wheelhouse.as_str(), &format!("src/{commit}")] {
        let found = find(&ps, "damaged-entry", subject);
        assert_eq!(found.len(), 1, "{subject}: {ps:?}");
        assert!(
            found[0]["fix"].as_str().unwrap().contains("delete it"),
            "{ps:?}"
        );
    }
}

#[test]
fn deep_verify_names_missing_and_changed_files_and_doctor_gives_the_fix() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, commit) = fixture_repo(d);
    let recipe = write_recipe(d, "fx", &repo, &commit, SMOKE);
    fx.exits(&["build", recipe.to_str().unwrap()], 0);
    let v = fx.json(&["verify", "fx.yaml", "--deep", "--json"]);
    assert!(v["deep"]["record"]["files"].as_u64().unwrap() >= 10, "{v}");
    assert_eq!(v["deep"]["record"]["hashed"], true);
    assert_eq!(v["deep"]["manifest"].as_array().unwrap().len(), 0);

    // Remove one installed file; change another without changing its size.
    let venv = fx.oracle("fx");
    let pkg = venv.join("lib/python3.11/site-packages/fixturellm");
    let removed = pkg.join("_custom_ops.py");
    unlock(&removed);
    std::fs::remove_file(&removed).unwrap();
    let changed = pkg.join("sampling_params.py");
    unlock(&changed);
    let mut bytes = std::fs::read(&changed).unwrap();
    // One letter of the module docstring: same size, still importable.
    assert_eq!(&bytes[..4], b"\"\"\"S", "the docstring starts the file");
    bytes[3] = b's';
    std::fs::write(&changed, &bytes).unwrap();

    // Without --deep: the missing file (sizes only).
    let t = text(&fx.exits(&["verify", "fx.yaml"], 3));
    assert!(
        t.contains("[FAIL] files (RECORD)") && t.contains("missing: fixturellm/_custom_ops.py"),
        "{t}"
    );
    assert!(t.contains("[FAIL] files (manifest)"), "{t}");
    // Same size, but its directory changed (a file was removed from it), so
    // the manifest check hashes the files of that directory (docs/store.md).
    assert!(
        t.contains("changed content: lib/python3.11/site-packages/fixturellm/sampling_params.py"),
        "a same-size edit in a changed directory is hashed without --deep: {t}"
    );
    // With --deep: both, against RECORD and against the manifest.
    let out = fx.exits(&["verify", "fx.yaml", "--deep", "--json"], 3);
    let v = json(&out);
    let rec: Vec<&str> = v["deep"]["record"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        rec.contains(&"missing: fixturellm/_custom_ops.py"),
        "{rec:?}"
    );
    assert!(
        rec.iter()
            .any(|p| p.starts_with("changed: fixturellm/sampling_params.py (sha256=")),
        "{rec:?}"
    );
    let man: Vec<&str> = v["deep"]["manifest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(man.iter().any(|p| p.contains("_custom_ops.py")), "{man:?}");
    assert!(
        man.iter()
            .any(|p| p.contains("changed content") && p.contains("sampling_params.py")),
        "{man:?}"
    );

    // doctor names the entry, the file, and the fix.
    let out = fx.exits(&["doctor", "--json"], 1);
    let ps = problems(&out);
    let key = venv.file_name().unwrap().to_str().unwrap();
    let fm = find(&ps, "files-missing", key);
    assert_eq!(fm.len(), 1, "{:?}", kinds(&ps));
    assert!(
        fm[0]["message"]
            .as_str()
            .unwrap()
            .contains("_custom_ops.py"),
        "{}",
        fm[0]
    );
    let fix = fm[0]["fix"].as_str().unwrap();
    assert!(
        fix.contains(&format!(
            "`oracle-build build {} --deep --store {}`",
            recipe.canonicalize().unwrap().display(),
            fx.store().display()
        )),
        "the recipe file, not its name: {fix}"
    );
    let t = text(&fx.exits(&["doctor"], 1));
    assert!(t.contains("[files-missing]") && t.contains("fix: "), "{t}");

    // A damaged oracle is not activated.
    let alias = d.join("venvs/oracle");
    let t = text(&fx.exits(&["activate", "fx.yaml", alias.to_str().unwrap()], 3));
    assert!(t.contains("files (RECORD)"), "{t}");
    assert!(std::fs::symlink_metadata(&alias).is_err(), "PATH untouched");
}

#[test]
fn activate_switches_the_alias_atomically_and_roots_the_rollback() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, c1, c2) = repo_with_two_commits(d);
    let a = write_recipe(d, "fx-a", &repo, &c1, SMOKE);
    let b = write_recipe(d, "fx-b", &repo, &c2, SMOKE);
    let store = fx.store();
    fx.exits(&["build", a.to_str().unwrap()], 0);
    fx.exits(&["build", b.to_str().unwrap()], 0);
    let (va, vb) = (fx.oracle("fx-a"), fx.oracle("fx-b"));
    let alias = d.join("venvs/vllm-oracle");
    let l = alias.to_str().unwrap();

    // An alias inside the store is refused (gc and unkeep own what is there).
    for inside in [store.join("store/venvs/x"), store.join("roots/fx-a")] {
        let before = tree(store);
        let t = text(&fx.exits(&["activate", "fx-a.yaml", inside.to_str().unwrap()], 2));
        assert!(t.contains("is inside the store"), "{t}");
        assert_eq!(tree(store), before);
    }
    let act = fx.json(&["activate", "fx-a.yaml", l, "--json"]);
    assert_eq!(std::fs::read_link(&alias).unwrap(), va);
    let root = act["root"].as_str().unwrap().to_string();
    assert!(root.starts_with("alias-vllm-oracle-"), "{root}");
    assert_eq!(store.join("roots").join(&root).canonicalize().unwrap(), va);
    let reg = read_json(&store.join("aliases.json"));
    assert_eq!(reg["aliases"][l]["recipe"], "fx-a", "{reg}");

    let act = fx.json(&["activate", "fx-b.yaml", l, "--json"]);
    assert_eq!(std::fs::read_link(&alias).unwrap(), vb);
    assert_eq!(act["previous"], va.to_str().unwrap());
    let rollback = format!("{root}-rollback");
    assert_eq!(act["rollback_root"], rollback.as_str());
    assert_eq!(
        store.join("roots").join(&rollback).canonicalize().unwrap(),
        va
    );
    assert_eq!(store.join("roots").join(&root).canonicalize().unwrap(), vb);

    // Switching back and forth under a reader: the alias is never missing.
    let stop = Arc::new(AtomicBool::new(false));
    let (reads, missing) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let reader = {
        let (stop, reads, missing) = (stop.clone(), reads.clone(), missing.clone());
        let (alias, va, vb) = (alias.clone(), va.clone(), vb.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match std::fs::read_link(&alias) {
                    Ok(t) if t == va || t == vb => {}
                    _ => {
                        missing.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if !alias.join("bin/python").exists() {
                    missing.fetch_add(1, Ordering::Relaxed);
                }
                reads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    for i in 0..8 {
        let pin = if i % 2 == 0 { "fx-a.yaml" } else { "fx-b.yaml" };
        fx.exits(&["activate", pin, l], 0);
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    assert!(reads.load(Ordering::Relaxed) > 100, "the reader ran");
    assert_eq!(
        missing.load(Ordering::Relaxed),
        0,
        "the alias was seen missing or elsewhere"
    );
    assert_eq!(std::fs::read_link(&alias).unwrap(), vb, "last switch: fx-b");
    let leftovers: Vec<_> = std::fs::read_dir(alias.parent().unwrap())
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(leftovers.len(), 1, "no temporary links left: {leftovers:?}");

    // Everything is rooted: the doctor is happy.
    let t = text(&fx.exits(&["doctor"], 0));
    assert!(t.contains("healthy"), "{t}");

    // Someone moves the alias by hand (`ln -sfn`) to the other oracle: the
    // doctor names it with the fix, and verify PATH refuses it (it is checked
    // against the recipe the alias is registered for, not the oracle's own).
    let hand = d.join("venvs/.hand");
    std::os::unix::fs::symlink(&va, &hand).unwrap();
    std::fs::rename(&hand, &alias).unwrap();
    let out = fx.exits(&["doctor", "--json"], 1);
    let ps = problems(&out);
    let np = find(&ps, "alias-not-pin", l);
    assert_eq!(np.len(), 1, "{:?}", kinds(&ps));
    let msg = np[0]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("oracle of fx-a @ {}", &c1[..12])),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("recipe fx-b pins {}", &c2[..12])),
        "{msg}"
    );
    assert!(msg.contains("moved outside oracle-build"), "{msg}");
    let fix = np[0]["fix"].as_str().unwrap().to_string();
    assert!(
        fix.starts_with("`oracle-build activate ") && fix.contains("fx-b.yaml") && fix.contains(l),
        "{fix}"
    );
    let t = text(&fx.exits(&["verify", l], 3));
    assert!(
        t.contains("[FAIL] commit") && t.contains("alias registry"),
        "{t}"
    );
    // Without --store (and with an empty default store), the alias's own
    // store is found from where it points (<store>/store/venvs/<key>), and
    // its registry is consulted: still refused, by verify and by doctor --venv.
    let xdg = d.join("xdg");
    let bare = |args: &[&str]| {
        cmd(d)
            .args(args)
            .env("XDG_DATA_HOME", &xdg)
            .output()
            .unwrap()
    };
    let out = bare(&["verify", l]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert!(text(&out).contains("alias registry"), "{}", text(&out));
    let out = bare(&["doctor", "--venv", l, "--json"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let ps = problems(&out);
    assert_eq!(find(&ps, "alias-not-pin", l).len(), 1, "{:?}", kinds(&ps));
    // A link to the alias is checked as the alias.
    let link = d.join("link-to-alias");
    std::os::unix::fs::symlink(&alias, &link).unwrap();
    let t = text(&fx.exits(&["verify", link.to_str().unwrap()], 3));
    assert!(t.contains("alias registry"), "{t}");
    // The fix, as printed (it names the store), heals it.
    let args: Vec<&str> = fix.trim_matches('`').split(' ').skip(1).collect();
    assert_eq!(
        args[args.len() - 2..],
        ["--store", fx.store().to_str().unwrap()]
    );
    let out = cmd(d).args(&args).output().unwrap();
    assert_eq!(code(&out), 0, "{fix}: {}", text(&out));
    fx.exits(&["doctor"], 0);
    fx.exits(&["verify", l], 0);

    // build --activate: same code, after a gateable build.
    let second = d.join("venvs/second");
    let rep = fx.json(&[
        "build",
        "fx-a.yaml",
        "--activate",
        second.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(rep["activated"]["oracle"], va.to_str().unwrap());
    assert_eq!(std::fs::read_link(&second).unwrap(), va);

    // A real directory is never replaced; an unknown PIN is bad input.
    let dir = d.join("venvs/real");
    std::fs::create_dir_all(&dir).unwrap();
    let t = text(&fx.exits(&["activate", "fx-a.yaml", dir.to_str().unwrap()], 2));
    assert!(t.contains("not a symlink"), "{t}");
    assert!(dir.is_dir());
    fx.exits(&["activate", "nope", l], 2);

    // Someone else's symlink (neither a registered alias nor into the
    // store) is not replaced without --force.
    let foreign = d.join("venvs/foreign");
    std::os::unix::fs::symlink(d.join("xdg-nowhere"), &foreign).unwrap();
    let fl = foreign.to_str().unwrap();
    let t = text(&fx.exits(&["activate", "fx-a.yaml", fl], 2));
    assert!(t.contains("--force") && t.contains("neither"), "{t}");
    assert_eq!(std::fs::read_link(&foreign).unwrap(), d.join("xdg-nowhere"));
    fx.exits(&["activate", "fx-a.yaml", fl, "--force"], 0);
    assert_eq!(std::fs::read_link(&foreign).unwrap(), va);

    // A corrupt registry: activate changes nothing (no link, no directory,
    // no root), and doctor reports it as one problem with its fix.
    let roots_before = std::fs::read_dir(store.join("roots")).unwrap().count();
    std::fs::write(store.join("aliases.json"), "{ not json").unwrap();
    let fresh = d.join("venvs-new/oracle");
    let out = fx.exits(&["activate", "fx-a.yaml", fresh.to_str().unwrap()], 1);
    assert!(text(&out).contains("aliases.json"), "{}", text(&out));
    assert!(std::fs::symlink_metadata(&fresh).is_err(), "no link made");
    assert!(!d.join("venvs-new").exists(), "no directory made");
    assert_eq!(
        std::fs::read_dir(store.join("roots")).unwrap().count(),
        roots_before,
        "no root made"
    );
    // A root pointing outside the store is reported too.
    std::os::unix::fs::symlink("/etc", store.join("roots/evil")).unwrap();
    let ps = problems(&fx.exits(&["doctor", "--json"], 1));
    let bad = find(&ps, "alias-registry-unreadable", "aliases.json");
    assert_eq!(bad.len(), 1, "{:?}", kinds(&ps));
    let evil = find(&ps, "root-outside-store", "roots/evil");
    assert_eq!(evil.len(), 1, "{:?}", kinds(&ps));
    assert_eq!(ps.len(), 2, "{:?}", kinds(&ps));
    // Both fixes, run as printed, heal the store.
    for p in [bad[0], evil[0]] {
        let fix = p["fix"].as_str().unwrap();
        run_fix(d, fix.split('`').nth(1).unwrap(), None);
    }
    fx.exits(&["doctor"], 0);
    fx.exits(&["activate", "fx-a.yaml", l], 0);
}

/// Runs `command` (a fix as printed by doctor) with `sh -c` in `cwd`,
/// `oracle-build` being the binary under test, with `--store STORE`
/// appended when given; asserts success.
fn run_fix(cwd: &Path, command: &str, store: Option<&Path>) -> Output {
    let path = format!(
        "{}:{}",
        bin().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let line = match store {
        Some(s) => format!("{command} --store '{}'", s.display()),
        None => command.to_string(),
    };
    let out = test_env(
        Command::new("sh")
            .arg("-c")
            .arg(&line)
            .current_dir(cwd)
            .env("PATH", path),
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{line}:\n{}", text(&out));
    out
}

#[test]
fn an_advanced_pin_leaves_the_alias_on_the_rollback_and_doctor_names_it() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, c1, c2) = repo_with_two_commits(d);
    let recipe = write_recipe(d, "fx", &repo, &c1, SMOKE);
    let store = fx.store();
    let alias = d.join("venvs/vllm-oracle");
    let l = alias.to_str().unwrap();
    let r = recipe.to_str().unwrap();
    fx.exits(&["build", r, "--activate", l], 0);
    let v1 = fx.oracle("fx");
    assert_eq!(std::fs::read_link(&alias).unwrap(), v1);

    // The pin advances (the recipe now names c2) and is built, but the alias
    // is not moved: it still points at c1, the rollback stage.
    write_recipe(d, "fx", &repo, &c2, SMOKE);
    fx.exits(&["build", recipe.to_str().unwrap()], 0);
    let v2 = fx.oracle("fx");
    assert_ne!(v1, v2);
    let t = text(&fx.exits(&["verify", l], 3));
    assert!(t.contains("[FAIL] commit") && t.contains(&c2), "{t}");

    let out = fx.exits(&["doctor", "--json"], 1);
    let ps = problems(&out);
    let np = find(&ps, "alias-not-pin", l);
    assert_eq!(np.len(), 1, "{:?}", kinds(&ps));
    let msg = np[0]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("oracle of fx @ {}", &c1[..12]))
            && msg.contains(&format!("recipe fx pins {}", &c2[..12])),
        "{msg}"
    );
    assert_eq!(
        np[0]["fix"].as_str().unwrap(),
        format!(
            "`oracle-build activate {} {l} --store {}`",
            recipe.canonicalize().unwrap().display(),
            store.display()
        )
    );
    // The alias roots c1's oracle, and through its `requires` the wheel and
    // checkout it was built from: none of them is reported unreachable.
    let wheel1 = record(&v1)["wheel_key"].as_str().unwrap().to_string();
    for label in [
        format!("src/{c1}"),
        format!("wheels/{wheel1}"),
        "venvs/".to_string(),
    ] {
        assert!(
            find(&ps, "unreachable", &label).is_empty(),
            "{label}: {:?}",
            kinds(&ps)
        );
    }

    // The fix moves the alias; c1 stays reachable as the rollback.
    let act = fx.json(&["activate", r, l, "--json"]);
    assert_eq!(std::fs::read_link(&alias).unwrap(), v2);
    let rollback = act["rollback_root"].as_str().unwrap().to_string();
    assert_eq!(
        store.join("roots").join(&rollback).canonicalize().unwrap(),
        v1
    );
    // Healthy again: the alias is the pin, everything is reachable.
    let ps = problems(&fx.exits(&["doctor", "--json"], 0));
    assert!(ps.is_empty(), "{:?}", kinds(&ps));

    // The rollback oracle is deleted: its root dangles, and the doctor says so.
    force_remove(&v1);
    let ps = problems(&fx.exits(&["doctor", "--json"], 1));
    let dr = find(&ps, "root-dangling", &rollback);
    assert_eq!(dr.len(), 1, "{:?}", kinds(&ps));
    assert!(dr[0]["fix"].as_str().unwrap().contains("rm "), "{}", dr[0]);
}

#[test]
fn doctor_finds_an_editable_install_and_its_deleted_source() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, commit) = fixture_repo(d);
    let recipe = write_recipe(d, "fx", &repo, &commit, SMOKE);
    let r = recipe.to_str().unwrap();
    let alias = d.join("venvs/oracle");
    let l = alias.to_str().unwrap();
    // Built without the gate: --activate is refused up front, activate later too.
    let t = text(&fx.exits(&["build", r, "--no-smoke", "--activate", l], 2));
    assert!(t.contains("--no-smoke"), "{t}");
    fx.exits(&["build", r, "--no-smoke"], 4);
    let t = text(&fx.exits(&["activate", r, l], 3));
    assert!(t.contains("unsmoked"), "{t}");
    assert!(std::fs::symlink_metadata(&alias).is_err(), "PATH untouched");

    // An editable install of a (modified) checkout, made with real uv.
    let (uv, python) = tools_of(&fx.oracle("fx"));
    let checkout = d.join("vllm-src");
    sh(Command::new("git").args([
        "clone",
        "-q",
        repo.to_str().unwrap(),
        checkout.to_str().unwrap(),
    ]));
    let model = checkout.join("fixturellm/model.py");
    let mut text_ = std::fs::read_to_string(&model).unwrap();
    text_.push_str("# local experiment\n");
    std::fs::write(&model, text_).unwrap();
    let ev = d.join("editable-venv");
    sh(Command::new(&uv)
        .args(["venv", "-q", "--python"])
        .arg(&python)
        .arg(&ev));
    sh(pip_install(&uv, &ev)
        .arg("-e")
        .arg(&checkout)
        .env_remove("VIRTUAL_ENV"));
    let e = ev.to_str().unwrap();

    // verify needs a recipe for a venv oracle-build did not make; with one, it refuses.
    let t = text(&fx.exits(&["verify", e], 2));
    assert!(t.contains("--pin"), "{t}");
    let t = text(&fx.exits(&["verify", e, "--pin", r], 3));
    assert!(
        t.contains("[FAIL] editable") && t.contains("[FAIL] package_path"),
        "{t}"
    );
    assert!(t.contains("[FAIL] clean_tree"), "{t}");

    let ps = problems(&fx.exits(&["doctor", "--venv", e, "--pin", r, "--json"], 1));
    let ed = find(&ps, "editable", e);
    assert_eq!(ed.len(), 1, "{:?}", kinds(&ps));
    let msg = ed[0]["message"].as_str().unwrap();
    assert!(
        msg.contains("direct_url.json")
            && msg.contains(&format!("{} still exists", checkout.display())),
        "{msg}"
    );
    assert!(
        ed[0]["fix"].as_str().unwrap().contains(&format!(
            "oracle-build build {} --activate",
            recipe.canonicalize().unwrap().display()
        )),
        "{}",
        ed[0]
    );
    let dirty = find(&ps, "dirty-tree", e);
    assert_eq!(dirty.len(), 1, "{:?}", kinds(&ps));
    assert!(
        dirty[0]["message"].as_str().unwrap().contains(".d2"),
        "{}",
        dirty[0]
    );
    assert!(
        ps.iter().all(|p| p["subject"] == e),
        "only the editable venv is unhealthy: {:?}",
        kinds(&ps)
    );

    // Routine pruning deletes the source tree: the venv still exists, import fails.
    std::fs::remove_dir_all(&checkout).unwrap();
    let ps = problems(&fx.exits(&["doctor", "--venv", e, "--pin", r, "--json"], 1));
    let ed = find(&ps, "editable", e);
    assert_eq!(ed.len(), 1, "{:?}", kinds(&ps));
    let msg = ed[0]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("{} no longer exists", checkout.display()))
            && msg.contains("`import fixturellm` fails"),
        "{msg}"
    );
    for p in &ps {
        assert!(!p["fix"].as_str().unwrap().is_empty(), "{p}");
    }
    let t = text(&fx.exits(&["doctor", "--venv", e, "--pin", r], 1));
    assert!(
        t.contains("[editable]") && t.contains("no longer exists") && t.contains("fix: "),
        "{t}"
    );
    fx.exits(&["verify", e, "--pin", r], 3);

    // Against a recipe of another commit, the distribution version still
    // names the commit the broken install was made from.
    let parent = git(&repo, &["rev-parse", "HEAD~1"]);
    let other = write_recipe(d, "fx-parent", &repo, &parent, SMOKE);
    let ps = problems(&fx.exits(
        &[
            "doctor",
            "--venv",
            e,
            "--pin",
            other.to_str().unwrap(),
            "--json",
        ],
        1,
    ));
    let im = find(&ps, "identity-mismatch", e);
    assert_eq!(im.len(), 1, "{:?}", kinds(&ps));
    let msg = im[0]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("a prefix of {parent}"))
            && msg.contains("the distribution version: the import fails"),
        "{msg}"
    );
}

/// A minimal setuptools project `name` `version` providing module `module`
/// (with `__version__`), for fake FlashInfer distributions.
fn tiny_project(dir: &Path, name: &str, version: &str, module: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(p.join(module)).unwrap();
    std::fs::write(
        p.join("pyproject.toml"),
        format!(
            "[build-system]\nrequires = [\"setuptools>=69\"]\nbuild-backend = \"setuptools.build_meta\"\n\n[project]\nname = \"{name}\"\nversion = \"{version}\"\n\n[tool.setuptools]\npackages = [\"{module}\"]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        p.join(module).join("__init__.py"),
        format!("__version__ = \"{version}\"\n"),
    )
    .unwrap();
    p
}

#[test]
fn doctor_names_a_build_without_history_and_installs_without_kernels_or_sha() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, commit) = fixture_repo(d);
    let recipe = write_recipe(d, "fx", &repo, &commit, SMOKE);
    fx.exits(&["build", recipe.to_str().unwrap()], 0);
    let block = fx.exits(&["verify", "fx.yaml", "--emit-pin-block"], 0);
    let notes = d.join("SYNC.md");
    std::fs::write(&notes, &block.stdout).unwrap();

    // The same commit from a repository without tags: setuptools-scm falls
    // back to 0.1.devN. The build is the commit (the +g<sha> is right), so it
    // is not refused, but the doctor names it, and the users' record refuses it.
    let notag = d.join("repo-notag");
    sh(Command::new("git").args([
        "clone",
        "-q",
        repo.to_str().unwrap(),
        notag.to_str().unwrap(),
    ]));
    git(&notag, &["tag", "-d", "v0.1.0"]);
    let nt = write_recipe(d, "fx-nt", &notag, &commit, SMOKE);
    let store2 = d.join("store2");
    let b2 = fx.run_at(&store2, &["build", nt.to_str().unwrap()]);
    assert_eq!(code(&b2), 0, "{}", text(&b2));
    let version =
        record(&store2.join("roots/fx-nt").canonicalize().unwrap())["identity"]["runtime_version"]
            .as_str()
            .unwrap()
            .to_string();
    assert!(version.starts_with("0.1.dev2+g"), "{version}");
    let doc2 = fx.run_at(&store2, &["doctor", "--json"]);
    assert_eq!(code(&doc2), 1, "{}", text(&doc2));
    let ps = problems(&doc2);
    let nh = find(&ps, "no-history", "venvs/");
    assert_eq!(nh.len(), 1, "{:?}", kinds(&ps));
    assert!(nh[0]["message"].as_str().unwrap().contains(&version));
    assert!(nh[0]["fix"].as_str().unwrap().contains("tags"), "{}", nh[0]);
    let v2 = fx.run_at(
        &store2,
        &[
            "verify",
            "fx-nt.yaml",
            "--pin-file",
            notes.to_str().unwrap(),
        ],
    );
    assert_eq!(code(&v2), 3, "{}", text(&v2));
    let t = text(&v2);
    assert!(
        t.contains("[FAIL] vllm_runtime_version") && t.contains(&format!("found {version}")),
        "{t}"
    );
    assert!(t.contains("[ok]   vllm_commit"), "same commit: {t}");

    // A venv made by hand from a tarball (no .git) with a pretend version and
    // no compiled extensions, plus FlashInfer packages at different versions.
    let (uv, python) = tools_of(&fx.oracle("fx"));
    let tarball = d.join("tarball");
    sh(Command::new("git").args([
        "clone",
        "-q",
        repo.to_str().unwrap(),
        tarball.to_str().unwrap(),
    ]));
    std::fs::remove_dir_all(tarball.join(".git")).unwrap();
    std::fs::write(
        tarball.join("setup.py"),
        "from setuptools import setup\nsetup()\n",
    )
    .unwrap();
    let fi = tiny_project(d, "flashinfer-python", "0.6.15.post1", "flashinfer");
    let cubin = tiny_project(d, "flashinfer-cubin", "0.6.14", "flashinfer_cubin");
    let fv = d.join("foreign-venv");
    sh(Command::new(&uv)
        .args(["venv", "-q", "--python"])
        .arg(&python)
        .arg(&fv));
    sh(pip_install(&uv, &fv)
        .args([&tarball, &fi, &cubin])
        .env("SETUPTOOLS_SCM_PRETEND_VERSION", "0.23.1+precompiled")
        .env_remove("VIRTUAL_ENV"));
    let f = fv.to_str().unwrap();
    let r = recipe.to_str().unwrap();
    let ps = problems(&fx.exits(&["doctor", "--venv", f, "--pin", r, "--json"], 1));
    for kind in [
        "no-scm-sha",
        "precompiled",
        "no-compiled-extensions",
        "flashinfer-mismatch",
    ] {
        let p = find(&ps, kind, f);
        assert_eq!(p.len(), 1, "{kind}: {:?}", kinds(&ps));
        assert!(
            p[0]["fix"].as_str().unwrap().contains(&format!(
                "oracle-build build {}",
                recipe.canonicalize().unwrap().display()
            )),
            "{}",
            p[0]
        );
    }
    let fm = find(&ps, "flashinfer-mismatch", f)[0]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        fm.contains("flashinfer-cubin 0.6.14") && fm.contains("flashinfer-python 0.6.15.post1"),
        "{fm}"
    );
    let t = text(&fx.exits(&["verify", f, "--pin", r], 3));
    for field in ["commit", "compiled_extensions", "build_mode"] {
        assert!(t.contains(&format!("[FAIL] {field} ")), "{field}: {t}");
    }
}

#[test]
fn doctor_fixes_name_the_recipe_file_and_run_as_printed_from_anywhere() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, commit) = fixture_repo(d);
    // A recipe and an alias in directories whose names a shell would split.
    let pins = d.join("my pins ü");
    std::fs::create_dir_all(&pins).unwrap();
    let recipe = write_recipe(&pins, "fx", &repo, &commit, SMOKE);
    let alias = d.join("my venvs ü/oracle");
    let store = fx.store();
    let (r, l) = (recipe.to_str().unwrap(), alias.to_str().unwrap());
    fx.exits(&["build", r, "--activate", l], 0);
    let elsewhere = d.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    // The binary run from another directory than the recipe's, asserting the exit code.
    let there = |args: &[&str], want: i32| {
        let out = fx.cmd(args).current_dir(&elsewhere).output().unwrap();
        assert_eq!(code(&out), want, "oracle-build {args:?}:\n{}", text(&out));
        out
    };

    // Damage the oracle: the fix rebuilds it from the recipe's file, every file checked.
    let venv = fx.oracle("fx");
    let removed = venv.join("lib/python3.11/site-packages/fixturellm/_custom_ops.py");
    unlock(&removed);
    std::fs::remove_file(&removed).unwrap();
    let ps = problems(&there(&["doctor", "--json"], 1));
    let fm = find(&ps, "files-missing", "venvs/");
    assert_eq!(fm.len(), 1, "{:?}", kinds(&ps));
    let fix = fm[0]["fix"].as_str().unwrap();
    let quoted = format!("'{}'", recipe.canonicalize().unwrap().display());
    let cmds: Vec<&str> = fix.split('`').skip(1).step_by(2).collect();
    assert_eq!(
        cmds,
        [format!(
            "oracle-build build {quoted} --deep --store {}",
            store.display()
        )
        .as_str()],
        "{fix}"
    );
    // Run as printed: the fix names the store it acts on.
    run_fix(&elsewhere, cmds[0], None);
    assert!(removed.is_file(), "the fix rebuilt the damaged entry");
    let ps = problems(&there(&["doctor", "--json"], 0));
    assert!(
        find(&ps, "files-missing", "venvs/").is_empty(),
        "{:?}",
        kinds(&ps)
    );

    // The oracle deleted by hand: its alias dangles, and the fix rebuilds and
    // re-activates it, named by the recipe's file and the alias's quoted path.
    force_remove(&venv);
    let ps = problems(&there(&["doctor", "--json"], 1));
    let dangling = find(&ps, "alias-dangling", l);
    assert_eq!(dangling.len(), 1, "{:?}", kinds(&ps));
    let fix = dangling[0]["fix"].as_str().unwrap();
    assert_eq!(
        fix,
        format!(
            "`oracle-build build {quoted} --activate '{l}' --store {}`",
            store.display()
        ),
        "{fix}"
    );
    for p in find(&ps, "root-dangling", "roots/") {
        let f = p["fix"].as_str().unwrap();
        for path in [l, r] {
            assert!(
                f.matches(path).count() == f.matches(&format!("'{path}'")).count(),
                "unquoted {path}: {f}"
            );
        }
    }
    run_fix(&elsewhere, fix.trim_matches('`'), None);
    there(&["doctor"], 0);
    there(&["verify", l], 0);
}

// ---- The gate cannot be fooled: records, modes, names and versions ----

/// The first 9 hex digits of `commit`, as setuptools-scm's `+g<sha>`.
fn sha9(commit: &str) -> &str {
    &commit[..9]
}

/// Edits the read-only store file `file` so that its size and modification
/// time stay the same (so Python keeps trusting a cached `.pyc` of it): the
/// first `from` is replaced by `to` (same length).
fn same_size_edit(file: &Path, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(from), "{} lacks {from:?}", file.display());
    let mtime = std::fs::metadata(file).unwrap().modified().unwrap();
    unlock(file);
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
    std::fs::File::options()
        .write(true)
        .open(file)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(std::fs::metadata(file).unwrap().len() as usize, text.len());
}

#[test]
fn build_env_may_not_set_the_version_or_what_the_tool_controls() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let pretend = format!("9.9.9+g{}", sha9(&commit));
    for (key, value, names) in [
        (
            "SETUPTOOLS_SCM_PRETEND_VERSION",
            pretend.as_str(),
            "source.commit",
        ),
        (
            "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_FIXTURELLM",
            pretend.as_str(),
            "source.commit",
        ),
        ("VLLM_USE_PRECOMPILED", "1", "build.mode"),
        ("VLLM_TARGET_DEVICE", "cuda", "build.target_device"),
        ("MAX_JOBS", "64", "build.max_jobs"),
    ] {
        let extra = format!("  env: {{{key}: \"{value}\"}}\n{SMOKE}");
        let recipe = fx.recipe("fx-env", &repo, &commit, &extra);
        let out = fx.build(&recipe);
        let t = text(&out);
        assert_eq!(code(&out), 2, "{key}: {t}");
        assert!(
            t.contains(&format!("field `build.env.{key}`")) && t.contains(names),
            "{key}: names the key and {names}: {t}"
        );
        assert!(!fx.store().exists(), "{key}: nothing was written");
    }
}

#[test]
fn a_hand_coded_version_with_the_right_sha_builds_but_the_history_refuses_it() {
    let fx = Fx::new();
    let (repo, _) = fx.repo();
    // setup.py hard-codes 9.9.9 with the commit's own +g<sha> (read from
    // git, as a hand-rolled version would be), for both the distribution
    // and the package's __version__.
    let setup = std::fs::read_to_string(repo.join("setup.py")).unwrap();
    let hand = setup.replace(
        "setup(\n    version=get_version_string(),",
        "import subprocess\n_version = \"9.9.9+g\" + subprocess.check_output([\"git\", \"rev-parse\", \"--short=9\", \"HEAD\"], text=True).strip()\nwith open(os.path.join(\"fixturellm\", \"_version.py\"), \"w\") as f:\n    f.write(\"__version__ = version = %r\\n\" % _version)\nsetup(\n    version=_version,",
    );
    assert_ne!(hand, setup);
    std::fs::write(repo.join("setup.py"), hand).unwrap();
    git(&repo, &["commit", "-qam", "hand-set version"]);
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let out = fx.exits(&["build", recipe.to_str().unwrap()], 3);
    let t = text(&out);
    let found = format!("9.9.9+g{}", sha9(&commit));
    let history = format!("0.1.1.dev2+g{}", sha9(&commit));
    // The wheel was built (the version carries the right sha) ...
    assert!(t.contains(&format!("fixturellm-{found}")), "{t}");
    // ... and the gate names the field, what the history gives and what was found.
    for field in [
        "runtime_version (history)",
        "distribution_version (history)",
    ] {
        let line = t
            .lines()
            .find(|l| l.trim_start().starts_with(field))
            .unwrap_or_else(|| panic!("no {field} failure: {t}"));
        assert!(
            line.contains(&format!("expected {history}"))
                && line.contains(&format!("found {found}")),
            "{line}"
        );
    }
    assert!(
        !fx.store().join("roots/fx").exists(),
        "nothing was rooted: {t}"
    );
}

#[test]
fn the_build_mode_is_measured_and_a_precompiled_recipe_gets_its_own_oracle() {
    let fx = Fx::new();
    let (repo, commit, src_recipe) = fx.pin();
    let pre = fx.recipe(
        "fx-pre",
        &repo,
        &commit,
        &format!("  mode: precompiled\n{SMOKE}"),
    );
    fx.exits(&["build", src_recipe.to_str().unwrap()], 0);
    fx.exits(&["build", pre.to_str().unwrap()], 0);
    let (v_src, v_pre) = (fx.oracle("fx"), fx.oracle("fx-pre"));
    // The fixture ignores VLLM_USE_PRECOMPILED: the two wheels are the same bytes ...
    assert_eq!(
        record(&v_src)["wheel_sha256"],
        record(&v_pre)["wheel_sha256"]
    );
    // ... but the oracles are not the same venv, and each says what it is.
    assert_ne!(v_src, v_pre);
    assert_eq!(record(&v_src)["identity"]["build_mode"], "source");
    assert_eq!(record(&v_pre)["identity"]["build_mode"], "precompiled");
    let v = fx.json(&["verify", "fx-pre.yaml", "--json"]);
    let mode = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["field"] == "build_mode")
        .unwrap()
        .clone();
    assert!(
        mode["found"]
            .as_str()
            .unwrap()
            .contains("VLLM_USE_PRECOMPILED=1"),
        "measured from the wheel's build record: {mode}"
    );
    fx.exits(&["verify", "fx.yaml"], 0);
    let alias = fx.dir().join("venvs/pre");
    fx.exits(&["activate", "fx-pre.yaml", alias.to_str().unwrap()], 0);
    assert_eq!(std::fs::read_link(&alias).unwrap(), v_pre);
}

#[test]
fn a_recipe_sharing_the_name_cannot_touch_the_other_recipes_oracle() {
    let fx = Fx::new();
    let (repo, commit, prod) = fx.pin();
    fx.exits(&["build", prod.to_str().unwrap()], 0);
    let alias = fx.dir().join("venvs/oracle");
    let l = alias.to_str().unwrap();
    fx.exits(&["activate", "fx.yaml", l], 0);
    let venv = fx.oracle("fx");
    let before = std::fs::read_to_string(venv.join("oracle.json")).unwrap();

    // A scratch copy with the same `name:` and a gate that cannot pass.
    let scratch_dir = fx.dir().join("scratch");
    std::fs::create_dir_all(&scratch_dir).unwrap();
    let scratch = write_recipe(
        &scratch_dir,
        "fx",
        &repo,
        &commit,
        "smoke:\n  runs: 1\n  cases:\n    - name: gone\n      model: /nonexistent/model\n      prompt: x\n      max_tokens: 2\n",
    );
    let sc = scratch.to_str().unwrap();
    for args in [
        vec!["smoke", sc],
        vec!["build", sc],
        vec!["unkeep", sc],
        vec!["keep", sc],
        vec!["activate", sc, l],
    ] {
        let out = fx.exits(&args, 2);
        let t = text(&out);
        assert!(
            t.contains("belongs to the recipe") && t.contains(prod.to_str().unwrap()),
            "{args:?}: names the owner: {t}"
        );
    }
    // The production oracle, its record, root and alias are as they were.
    assert_eq!(
        std::fs::read_to_string(venv.join("oracle.json")).unwrap(),
        before
    );
    assert_eq!(fx.oracle("fx"), venv);
    assert_eq!(std::fs::read_link(&alias).unwrap(), venv);
    assert_eq!(record(&venv)["smoke"]["verdict"], "gateable");
    fx.exits(&["doctor"], 0);
    fx.exits(&["verify", l], 0);
    fx.exits(&["activate", "fx.yaml", l], 0);
}

#[test]
fn no_recipe_name_can_take_an_alias_root() {
    let fx = Fx::new();
    let (repo, commit, prod) = fx.pin();
    fx.exits(&["build", prod.to_str().unwrap()], 0);
    let venv = fx.oracle("fx");
    let o = fx.dir().join("o");
    let act = fx.json(&["activate", "fx.yaml", o.to_str().unwrap(), "--json"]);
    let root = act["root"].as_str().unwrap().to_string();
    assert!(root.starts_with("alias-o-"), "{root}");
    let evil = fx.recipe("evil", &repo, &commit, SMOKE);
    std::fs::write(
        &evil,
        std::fs::read_to_string(&evil)
            .unwrap()
            .replacen("name: evil", &format!("name: {root}"), 1),
    )
    .unwrap();
    for cmd in ["build", "unkeep", "keep"] {
        let out = fx.exits(&[cmd, evil.to_str().unwrap()], 2);
        let t = text(&out);
        assert!(
            t.contains("field `name`") && t.contains("reserved for the GC roots of aliases"),
            "{cmd}: {t}"
        );
    }
    assert_eq!(
        fx.store().join("roots").join(&root).canonicalize().unwrap(),
        venv
    );
    fx.exits(&["gc"], 0);
    assert!(
        venv.join("bin/python").exists(),
        "gc kept the alias's oracle"
    );
}

#[test]
fn a_corrupt_or_edited_record_is_damage_verify_and_status_report() {
    let fx = Fx::new();
    let (_, _, prod) = fx.pin();
    fx.exits(&["build", prod.to_str().unwrap()], 0);
    let venv = fx.oracle("fx");
    let rec = venv.join("oracle.json");
    let status_health = || {
        let st = fx.json(&["status", "--json"]);
        st["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["entry"].as_str().unwrap().starts_with("venvs/"))
            .unwrap()["health"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(status_health(), "ok");

    // An edit that keeps the size: only the record's hash tells.
    let text0 = std::fs::read_to_string(&rec).unwrap();
    let created = text0.find("\"created\": \"").unwrap() + "\"created\": \"".len();
    let digit = &text0[created..created + 1];
    let other = if digit == "1" { "2" } else { "1" };
    same_size_edit(
        &rec,
        &format!("\"created\": \"{digit}"),
        &format!("\"created\": \"{other}"),
    );
    let out = fx.exits(&["verify", "fx.yaml"], 3);
    assert!(
        text(&out).contains("[FAIL] files (manifest)") && text(&out).contains("oracle.json"),
        "{}",
        text(&out)
    );
    let h = status_health();
    assert!(h.starts_with("damaged") && h.contains("oracle.json"), "{h}");

    // A record that does not parse: the recorded checks are not silently dropped.
    std::fs::write(&rec, "{broken").unwrap();
    let out = fx.exits(&["verify", "fx.yaml"], 3);
    let t = text(&out);
    assert!(t.contains("[FAIL] record (oracle.json)"), "{t}");
    assert!(t.contains("[FAIL] files (manifest)"), "{t}");
    let h = status_health();
    assert!(h.contains("unreadable oracle.json"), "{h}");
}

#[test]
fn activate_and_doctor_compare_content_not_only_sizes() {
    let fx = Fx::new();
    let (_, _, prod) = fx.pin();
    fx.exits(&["build", prod.to_str().unwrap()], 0);
    let venv = fx.oracle("fx");
    let file = venv.join("lib/python3.11/site-packages/fixturellm/sampling_params.py");
    same_size_edit(&file, "SamplingParams", "SamplingParamZ");
    let alias = fx.dir().join("venvs/oracle");
    // By size, nothing changed (what `verify` without --deep sees) ...
    fx.exits(&["verify", "fx.yaml"], 0);
    // ... but activate compares content.
    let out = fx.exits(&["activate", "fx.yaml", alias.to_str().unwrap()], 3);
    let t = text(&out);
    assert!(
        t.contains("changed content: lib/python3.11/site-packages/fixturellm/sampling_params.py")
            && !t.contains(".pyc"),
        "{t}"
    );
    assert!(
        std::fs::symlink_metadata(&alias).is_err(),
        "the alias was not made"
    );
    let ps = problems(&fx.exits(&["doctor", "--json"], 1));
    let hits = find(&ps, "files-missing", "venvs/");
    assert!(
        hits.iter().any(|p| p["message"].as_str().unwrap().contains(
            "changed content: lib/python3.11/site-packages/fixturellm/sampling_params.py"
        )),
        "{}",
        kinds(&ps).join("\n")
    );
}

/// `uv pip install -q --python <venv>/bin/python` (more arguments to add).
fn pip_install(uv: &Path, venv: &Path) -> Command {
    let mut c = Command::new(uv);
    c.args(["pip", "install", "-q", "--python"])
        .arg(venv.join("bin/python"));
    c
}
