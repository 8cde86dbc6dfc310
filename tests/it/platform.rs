//! Locks per platform: `lock --platform P` resolves for another box from
//! this one into `lockfiles/<name>/<P>/`, beside the host's; `lock --check`
//! says whether the lock a build on P would use is there and current; a
//! build (and `plan`) picks the lock for its host. Real uv, real PyPI.

use std::path::Path;
use std::process::Command;

use crate::support::*;

/// A small real package with compiled wheels for both Linux machines.
const NATIVE: &str = "markupsafe";
const NATIVE_VERSION: &str = "3.0.2";

/// (this host's machine, the other one uv can lock for).
fn machines() -> (&'static str, &'static str) {
    match std::env::consts::ARCH {
        "aarch64" => ("aarch64", "x86_64"),
        _ => ("x86_64", "aarch64"),
    }
}

/// The `(filename, url, sha256)` of every wheel of `name` in the pylock file at `path`.
fn wheels_of(path: &Path, name: &str) -> Vec<(String, String, String)> {
    let doc: toml::Table = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let pkgs = doc["packages"].as_array().unwrap();
    let pkg = pkgs
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("{name} not locked in {}", path.display()));
    pkg.get("wheels")
        .and_then(|w| w.as_array())
        .into_iter()
        .flatten()
        .map(|w| {
            let url = w["url"].as_str().unwrap().to_string();
            let file = url.rsplit('/').next().unwrap().to_string();
            let sha = w["hashes"]["sha256"].as_str().unwrap().to_string();
            (file, url, sha)
        })
        .collect()
}

/// The sha256 of what the index serves at `url`, downloaded by Python.
fn served_sha256(url: &str) -> String {
    let out = succeeds(
        Command::new("python3")
        .args([
            "-c",
            "import hashlib, sys, urllib.request\nprint(hashlib.sha256(urllib.request.urlopen(sys.argv[1], timeout=120).read()).hexdigest())",
            url,
        ])
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn locks_for_two_platforms_sit_side_by_side_and_each_build_picks_its_own() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let recipe = fx.recipe(
        "fx",
        &repo,
        &commit,
        &format!("pins: {{{NATIVE}: \"{NATIVE_VERSION}\"}}\n{SMOKE}"),
    );
    let r = recipe.to_str().unwrap();
    let (host, other) = machines();
    let mine = format!("{host}-manylinux_2_28");
    let theirs = format!("{other}-manylinux_2_28");
    let base = fx.dir().join("lockfiles/fx");

    // A lock for this machine, made with --platform, into lockfiles/fx/<P>/.
    let report = fx.json(&["lock", r, "--platform", &mine, "--json"]);
    assert_eq!(report["platform"], mine.as_str(), "{report}");
    assert_eq!(Path::new(report["dir"].as_str().unwrap()), base.join(&mine));
    assert!(
        !base.join("lock.json").exists(),
        "the host's slot is left alone"
    );

    // It is stale for the other machine: `lock --check` says so (exit 2),
    // naming the platform it was made for and the command that re-locks.
    let out = fx.exits(&["lock", r, "--check", "--platform", &theirs], 2);
    let t = text(&out);
    assert!(
        t.contains(&format!("is for platform {theirs}"))
            && t.contains(&format!("for {mine}"))
            && t.contains(&format!(
                "oracle-build lock {} --platform {theirs}",
                recipe.canonicalize().unwrap().display()
            )),
        "{t}"
    );
    // For this machine it is current; `plan` shows it is the one a build uses.
    let check = fx.json(&["lock", r, "--check", "--platform", &mine, "--json"]);
    assert_eq!(check["checked"], true);
    assert_eq!(Path::new(check["dir"].as_str().unwrap()), base.join(&mine));
    let plan = json(&fx.run(&["plan", r, "--json"]));
    assert_eq!(plan["lock"]["platform"], mine.as_str(), "{plan:#}");
    assert_eq!(plan["lock"]["state"], "locked", "{plan:#}");
    assert_eq!(
        Path::new(plan["lock"]["dir"].as_str().unwrap()),
        base.join(&mine)
    );
    let text_plan = text(&fx.run(&["plan", r]));
    assert!(
        text_plan.contains(&format!("platform {mine}: the lock a build on this host")),
        "{text_plan}"
    );

    // The other machine's lock, resolved from this box, beside it.
    let report = fx.json(&["lock", r, "--platform", &theirs, "--json"]);
    assert_eq!(
        Path::new(report["dir"].as_str().unwrap()),
        base.join(&theirs)
    );
    let info = read_json(&base.join(&theirs).join("lock.json"));
    assert_eq!(info["platform"], theirs.as_str(), "{info}");
    // Its runtime set holds the other machine's wheels, and their sha256 is
    // what the index serves.
    let their_wheels = wheels_of(&base.join(&theirs).join("pylock.runtime.toml"), NATIVE);
    assert!(!their_wheels.is_empty(), "no {NATIVE} wheel for {theirs}");
    for (file, url, sha) in &their_wheels {
        assert!(
            file.contains(&format!("_{other}")) && !file.contains(&format!("_{host}")),
            "{file} is not a {other} wheel"
        );
        assert_eq!(&served_sha256(url), sha, "{file}");
    }
    // This machine's lock holds this machine's wheels of the same release.
    let my_wheels = wheels_of(&base.join(&mine).join("pylock.runtime.toml"), NATIVE);
    assert!(!my_wheels.is_empty());
    for (file, _, _) in &my_wheels {
        assert!(
            file.contains(&format!("_{host}")) && !file.contains(&format!("_{other}")),
            "{file}"
        );
    }
    let check = fx.json(&["lock", r, "--check", "--platform", &theirs, "--json"]);
    assert_eq!(
        Path::new(check["dir"].as_str().unwrap()),
        base.join(&theirs)
    );

    // A build on this host picks this host's lock, not the other one.
    let out = fx.run(&["build", r, "--no-smoke", "--json"]);
    assert_eq!(code(&out), 4, "{}", text(&out));
    let rec = record(&fx.oracle("fx"));
    let mine_info = read_json(&base.join(&mine).join("lock.json"));
    assert_eq!(
        rec["inputs"]["runtime_lock"], mine_info["files"]["pylock.runtime.toml"],
        "{:#}",
        rec["inputs"]
    );
    let venv = fx.oracle("fx");
    let imported = Command::new(venv.join("bin/python"))
        .args(["-c", "import markupsafe; print(markupsafe.__file__)"])
        .output()
        .unwrap();
    assert!(imported.status.success(), "{imported:?}");

    // A recipe changed since: the platform lock is stale, and the re-lock
    // command names its platform.
    let changed = fx.recipe(
        "fx",
        &repo,
        &commit,
        &format!("pins: {{{NATIVE}: \"3.0.1\"}}\n{SMOKE}"),
    );
    let out = fx.exits(
        &[
            "lock",
            changed.to_str().unwrap(),
            "--check",
            "--platform",
            &theirs,
        ],
        2,
    );
    let t = text(&out);
    assert!(
        t.contains("stale") && t.contains("pins") && t.contains(&format!("--platform {theirs}")),
        "{t}"
    );
    // A bad platform is refused, naming it.
    let out = fx.exits(&["lock", r, "--platform", "arm64-linux"], 2);
    assert!(text(&out).contains("arm64-linux"), "{}", text(&out));
}
