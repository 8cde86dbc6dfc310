//! `oracle-build demo`, `completions` and `man`, with the real binary: the
//! demo builds the embedded package with the real git history it writes, uv,
//! python and a real wheel build; the completion script is loaded by the real
//! bash.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use crate::support::*;

/// The demo's pinned commit: the same on every machine, because the demo
/// writes its history with a fixed author, committer, time and message.
/// Changing a file under `demo/` changes it (update it here and in docs/demo.md).
const DEMO_COMMIT: &str = "138a3ea5145f96f8068931a319b0ed3c1a008e7d";

#[test]
fn demo_builds_verifies_and_gates_then_a_second_run_builds_nothing() {
    let fx = Fx::new();
    let out = fx.run(&["demo", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let doc = json(&out);

    // The commit is the expected constant, and the real git reads the
    // history the demo wrote: the tag, one commit after it.
    assert_eq!(doc["demo"]["commit"], DEMO_COMMIT, "{doc:#}");
    let repo = fx.store().join("demo/repo");
    assert_eq!(Path::new(doc["demo"]["repo"].as_str().unwrap()), repo);
    assert_eq!(
        git(&repo, &["describe", "--tags", "--long"]),
        format!("v0.1.0-1-g{}", &DEMO_COMMIT[..7])
    );
    assert_eq!(git(&repo, &["rev-parse", "main"]), DEMO_COMMIT);

    // Built, gateable, verified, from that commit.
    let build = &doc["build"];
    assert_eq!(build["verdict"], "gateable", "{build:#}");
    assert_eq!(build["commit"], DEMO_COMMIT);
    assert_eq!(build["recipe"], "demo");
    let built: Vec<&str> = build["built"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        built.contains(&"wheel") && built.contains(&"venv"),
        "{built:?}"
    );
    let version = build["runtime_version"].as_str().unwrap();
    assert!(
        version.starts_with("0.1.1.dev1+g") && DEMO_COMMIT.starts_with(&version[12..]),
        "{version}"
    );
    let verify = &doc["verify"];
    assert_eq!(verify["ok"], true, "{verify:#}");
    let checks = verify["checks"].as_array().unwrap();
    assert!(checks.len() >= 10, "{checks:?}");
    assert!(checks.iter().all(|c| c["ok"] == true), "{checks:?}");

    // The oracle is the pin's GC root and its record says gateable.
    let venv = fx.oracle("demo");
    assert_eq!(Path::new(build["oracle"].as_str().unwrap()), venv);
    let rec = record(&venv);
    assert_eq!(rec["smoke"]["verdict"], "gateable", "{rec:#}");
    assert_eq!(rec["identity"]["commit"], DEMO_COMMIT);

    // The recipe the demo wrote is an ordinary recipe: `verify` takes it.
    let recipe = doc["demo"]["recipe"].as_str().unwrap();
    fx.exits(&["verify", recipe], 0);

    // Second run: the same key, nothing built; the text report and summary.
    let again = fx.run(&["demo"]);
    assert_eq!(code(&again), 0, "{}", text(&again));
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert!(
        stdout.contains(&format!("recipe   demo @ {DEMO_COMMIT}")),
        "{stdout}"
    );
    assert!(
        stdout.contains("built    nothing (all stages found in the store)"),
        "{stdout}"
    );
    assert!(stdout.contains("verified: all"), "{stdout}");
    assert!(
        stdout.contains(&format!("oracle   {}", venv.display())),
        "{stdout}"
    );
    let second = fx.json(&["demo", "--json"]);
    assert_eq!(second["build"]["key"], build["key"]);
    assert_eq!(second["build"]["built"], serde_json::json!([]));
}

#[test]
fn demo_refuses_a_bad_python_and_writes_nothing() {
    let fx = Fx::new();
    for bad in ["3.9", "2.7", "three", "3.12.1"] {
        let out = fx.run(&["demo", "--python", bad]);
        assert_eq!(code(&out), 2, "{bad}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--python") && err.contains(bad), "{err}");
    }
    assert!(!fx.store().exists(), "a refused demo wrote the store");
}

/// The visible commands, read from `oracle-build --help` (clap's own list),
/// checked to hold the commands the README documents.
/// The subcommands `args --help` lists (without `help`).
fn subcommands_of(args: &[&str]) -> BTreeSet<String> {
    let mut a = args.to_vec();
    a.push("--help");
    let out = run(Path::new("."), &a);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let help = String::from_utf8_lossy(&out.stdout).to_string();
    help.split("Commands:")
        .nth(1)
        .and_then(|s| s.split("\n\n").next())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect()
}

fn commands() -> BTreeSet<String> {
    let names = subcommands_of(&[]);
    for want in [
        "build",
        "plan",
        "status",
        "fetch",
        "verify",
        "activate",
        "doctor",
        "gc",
        "keep",
        "unkeep",
        "smoke",
        "advance",
        "rollback",
        "lock",
        "export",
        "import",
        "demo",
        "completions",
        "man",
    ] {
        assert!(names.contains(want), "{want} not in --help: {names:?}");
    }
    names
}

#[test]
fn bash_completions_name_every_command_and_load_in_bash() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run(tmp.path(), &["completions", "bash"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let script = String::from_utf8_lossy(&out.stdout).to_string();
    // The words offered after `oracle-build `, and a case arm per command.
    let top: BTreeSet<&str> = script
        .lines()
        .find(|l| l.trim_start().starts_with("opts=\"") && l.contains(" build plan "))
        .expect("the top-level opts line")
        .split(['"', ' '])
        .collect();
    for c in commands() {
        assert!(top.contains(c.as_str()), "{c} is not offered: {top:?}");
        assert!(
            script.contains(&format!("oracle__build,{c})")),
            "bash completions have no case for {c}"
        );
    }
    // The real bash loads it and registers the completion function.
    let file = tmp.path().join("oracle-build.bash");
    std::fs::write(&file, &script).unwrap();
    let loaded = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p oracle-build",
            file.display()
        ))
        .output()
        .unwrap();
    assert!(loaded.status.success(), "{}", text(&loaded));
    assert!(
        String::from_utf8_lossy(&loaded.stdout).contains("oracle-build"),
        "{}",
        text(&loaded)
    );
    // The other shells get a script too; none offers the internal command.
    assert!(!script.contains("__watchdog"), "bash offers __watchdog");
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = run(tmp.path(), &["completions", shell]);
        assert_eq!(code(&out), 0, "{shell}: {}", text(&out));
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(
            s.contains("verify") && s.contains("emit-pin-block"),
            "{shell}"
        );
        assert!(!s.contains("__watchdog"), "{shell} offers __watchdog");
    }
    assert_eq!(code(&run(tmp.path(), &["completions", "tcsh"])), 2);
    assert_eq!(
        code(&run(tmp.path(), &["completions", "bash", "--json"])),
        2
    );
}

#[test]
fn man_page_names_every_command_and_out_dir_writes_one_page_each() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run(tmp.path(), &["man"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let page = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(page.contains(".TH oracle-build 1"), "{page}");
    let subcommands = page
        .split(".SH SUBCOMMANDS")
        .nth(1)
        .expect("a SUBCOMMANDS section");
    let commands = commands();
    for c in &commands {
        // roff escapes `-` as `\-`; clap_mangen names each as oracle-build-<cmd>(1).
        let name = format!("oracle\\-build\\-{}(1)", c.replace('-', "\\-"));
        assert!(subcommands.contains(&name), "{name} not in:\n{subcommands}");
    }
    assert!(
        !page.contains("__watchdog"),
        "the internal command is listed"
    );

    let dir = tmp.path().join("man1");
    let out = run(tmp.path(), &["man", "--out-dir", dir.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let mut files: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(files.remove("oracle-build.1"), "{files:?}");
    // One page per command, and one per nested command (`cache ls` ->
    // oracle-build-cache-ls.1).
    let mut want: BTreeSet<String> = BTreeSet::new();
    for c in &commands {
        want.insert(format!("oracle-build-{c}.1"));
        for sub in subcommands_of(&[c.as_str()]) {
            want.insert(format!("oracle-build-{c}-{sub}.1"));
        }
    }
    assert!(want.contains("oracle-build-cache-ls.1"), "{want:?}");
    assert_eq!(files, want);
    let demo = std::fs::read_to_string(dir.join("oracle-build-demo.1")).unwrap();
    assert!(demo.contains("\\-\\-python"), "{demo}");
    assert_eq!(code(&run(tmp.path(), &["man", "--json"])), 2);
}
