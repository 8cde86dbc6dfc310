//! The oracle's added packages (recipe `install.extras`, `install.with`,
//! issue 38) and the gate's PATH: the fixture declares the extra `bench`
//! (`six>=1.16`, tests/fixture/pkg/pyproject.toml); `ninja` is added with
//! `install.with`, so the engine finds it on the gate's PATH in the oracle's
//! `bin/` (the fixture engine reports `shutil.which("ninja")` with
//! `FIXTURELLM_ENV_REPORT`). Packages come from PyPI, as the fixture's own.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::support::*;
use serde_json::Value;

/// The `install:` section of the oracle these tests build.
const INSTALL: &str = "install:\n  extras: [bench]\n  with:\n    - \"ninja==1.11.1.1\"\n";

/// The default smoke section, one run, with the fixture engine's report into `dir`.
fn smoke_reporting(dir: &Path) -> String {
    SMOKE.replacen(
        "  runs: 3\n",
        &format!(
            "  runs: 1\n  env:\n    FIXTURELLM_ENV_REPORT: \"{}\"\n",
            dir.display()
        ),
        1,
    )
}

/// The names locked in the runtime lock of recipe `name` (`<dir>/lockfiles/<name>`),
/// each with whether every artifact carries a sha256.
fn locked(fx: &Fx, name: &str) -> Vec<(String, bool)> {
    let path = fx
        .dir()
        .join("lockfiles")
        .join(name)
        .join("pylock.runtime.toml");
    let doc: toml::Table = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    doc["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let arts: Vec<&toml::Value> = p
                .get("wheels")
                .and_then(|w| w.as_array())
                .into_iter()
                .flatten()
                .chain(p.get("sdist"))
                .collect();
            let hashed = !arts.is_empty()
                && arts.iter().all(|a| {
                    a.get("hashes")
                        .and_then(|h| h.get("sha256"))
                        .is_some_and(|s| s.as_str().is_some_and(|s| s.len() == 64))
                });
            (p["name"].as_str().unwrap().to_string(), hashed)
        })
        .collect()
}

/// The site-packages directory of the venv at `venv`.
fn site(venv: &Path) -> PathBuf {
    venv.join("lib/python3.11/site-packages")
}

#[test]
fn extras_and_with_are_locked_installed_verified_and_in_the_sbom_and_the_gate_path_is_the_oracles()
{
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let reports = fx.dir().join("reports");
    let r = fx.recipe(
        "fx",
        &repo,
        &commit,
        &format!("{INSTALL}{}", smoke_reporting(&reports)),
    );
    let r = r.to_str().unwrap();
    fx.exits(&["lock", r], 0);
    let lock = locked(&fx, "fx");
    for want in ["six", "ninja", "packaging", "idna"] {
        assert!(
            lock.iter().any(|(n, hashed)| n == want && *hashed),
            "{want} not locked with a sha256: {lock:?}"
        );
    }
    let info = read_json(&fx.dir().join("lockfiles/fx/lock.json"));
    assert_eq!(info["inputs"]["extras"], serde_json::json!(["bench"]));
    assert_eq!(
        info["inputs"]["with"],
        serde_json::json!(["ninja==1.11.1.1"])
    );

    let out = fx.build(Path::new(r));
    assert_eq!(code(&out), 0, "{}", text(&out));
    let venv = fx.oracle("fx");
    let py = venv.join("bin/python");
    let imp = std::process::Command::new(&py)
        .args(["-c", "import six, ninja; print(six.__version__)"])
        .output()
        .unwrap();
    assert!(imp.status.success(), "{}", text(&imp));

    // The record: the added packages, the venv key's inputs, the engine's PATH.
    let rec = record(&venv);
    let added: Vec<&str> = rec["added"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(added, ["ninja", "six"], "{}", rec["added"]);
    assert_eq!(rec["added"][0]["version"], "1.11.1.1");
    assert_eq!(
        rec["inputs"]["install"]["extras"],
        serde_json::json!(["bench"])
    );
    let bin = venv.join("bin");
    let path = rec["smoke"]["engine"]["path"].as_str().unwrap();
    assert_eq!(
        std::env::split_paths(path).next().unwrap(),
        bin,
        "smoke.engine.path: {path}"
    );
    // What the engine processes saw: the oracle's bin/ first, ninja from it.
    let reps: Vec<Value> = tree(&reports)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| read_json(&p))
        .collect();
    assert_eq!(reps.len(), 2, "the probe and the case report: {reps:?}");
    for rep in &reps {
        let exe = PathBuf::from(rep["executable"].as_str().unwrap());
        let own_bin = exe.parent().unwrap().to_path_buf();
        let first = std::env::split_paths(rep["path"].as_str().unwrap())
            .next()
            .unwrap();
        assert_eq!(first, own_bin, "{rep}");
        assert_eq!(
            rep["ninja"].as_str().map(PathBuf::from),
            Some(own_bin.join("ninja")),
            "{rep}"
        );
    }

    // verify lists each added package, installed as recorded.
    let v = fx.json(&["verify", r, "--json"]);
    let check = |v: &Value, f: &str| -> Value {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["field"] == f)
            .cloned()
            .unwrap_or_else(|| panic!("no check {f}: {v}"))
    };
    for f in ["added six", "added ninja"] {
        assert_eq!(check(&v, f)["ok"], true, "{v}");
    }
    assert!(
        check(&v, "added ninja")["expected"]
            .as_str()
            .unwrap()
            .contains("1.11.1.1")
    );

    // The SBOM names them, the added ones as added.
    let sbom = fx.dir().join("sbom.json");
    fx.exits(&["sbom", r, "--out", sbom.to_str().unwrap()], 0);
    let bom = read_json(&sbom);
    for name in ["six", "ninja"] {
        let c = bom["components"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| {
                c["name"]
                    .as_str()
                    .is_some_and(|n| n.eq_ignore_ascii_case(name))
            })
            .unwrap_or_else(|| panic!("{name} not in the SBOM"));
        let by = c["properties"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "oracle-build:added_by")
            .unwrap_or_else(|| panic!("{name}: no added_by: {c}"));
        assert!(
            by["value"].as_str().unwrap().starts_with("install."),
            "{by}"
        );
    }

    // An added package removed from the venv: verify exits 3 naming it.
    let sp = site(&venv);
    std::fs::set_permissions(&sp, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_file(sp.join("six.py")).unwrap();
    let info = std::fs::read_dir(&sp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("six-"))
        .unwrap();
    force_remove(&info);
    let out = fx.run(&["verify", r, "--json"]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    let v = json(&out);
    let c = check(&v, "added six");
    assert_eq!(c["ok"], false, "{c}");
    assert_eq!(c["found"], "not installed", "{c}");
}

#[test]
fn a_bad_with_entry_a_conflicting_one_and_an_unknown_extra_are_refused() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    // Not an exact pin: exit 2 naming file, line, field and value, before any work.
    for bad in [
        "pandas>=2",
        "pandas",
        "pandas[x]==2.2.3",
        "not a requirement ==",
    ] {
        let r = fx.recipe(
            "bad",
            &repo,
            &commit,
            &format!("install:\n  with:\n    - \"{bad}\"\n"),
        );
        let out = fx.run(&["lock", r.to_str().unwrap()]);
        let t = text(&out);
        assert_eq!(code(&out), 2, "{bad}: {t}");
        assert!(
            t.contains("bad.yaml") && t.contains("line 11") && t.contains("`install.with[0]`"),
            "{bad}: {t}"
        );
        assert!(t.contains(&format!("{bad:?}")), "{bad}: {t}");
        assert!(!fx.dir().join("lockfiles/bad").exists());
    }

    // A `with` pin that contradicts the package's own requirement (its
    // extra's `six>=1.16`): refused at lock time naming both, no lock written.
    let r = fx.recipe(
        "clash",
        &repo,
        &commit,
        "install:\n  extras: [bench]\n  with: [\"six==1.15.0\"]\n",
    );
    let out = fx.run(&["lock", r.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(code(&out), 2, "{t}");
    assert!(
        t.contains("clash.yaml") && t.contains("field `install.with[0]`"),
        "{t}"
    );
    assert!(
        t.contains("\"six==1.15.0\"") && t.contains("fixturellm requires six>=1.16"),
        "{t}"
    );
    assert!(!fx.dir().join("lockfiles/clash").exists());

    // An extra the package does not declare: refused naming those it declares.
    let r = fx.recipe("nox", &repo, &commit, "install:\n  extras: [nope]\n");
    let out = fx.run(&["lock", r.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(code(&out), 2, "{t}");
    assert!(
        t.contains("`install.extras[0]`") && t.contains("\"nope\"") && t.contains("bench"),
        "{t}"
    );
    assert!(!fx.dir().join("lockfiles/nox").exists());
}
