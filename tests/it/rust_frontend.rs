//! A tree with a Rust frontend (issue 40), shaped like the parity pin's:
//! setuptools-rust in its build requirements, `tools/build_rust.py`
//! declaring an optional extension (the binary `fixturellm/fx-rs`) built
//! from `rust/Cargo.toml`, whose `Cargo.lock` pins one git dependency
//! (`fxdep`, a repository made here: no crates.io), and a
//! `rust-toolchain.toml` channel (the `rust` overlay, tests/fixture/rust).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;

/// This machine's default Rust release (`rustc -vV` outside any tree),
/// e.g. `1.95.0`.
fn rustc_release() -> String {
    let out = succeeds(Command::new("rustc").arg("-vV").current_dir("/"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("release:"))
        .expect("rustc -vV names its release")
        .trim()
        .to_string()
}

/// The `major.minor` of [`rustc_release`]: a channel the default
/// toolchain satisfies under another name (`1.95` against `stable`).
fn channel_of_default() -> String {
    let r = rustc_release();
    let mut parts = r.split('.');
    format!("{}.{}", parts.next().unwrap(), parts.next().unwrap())
}

/// A repository of the fixture with the `rust` overlay, `rust-toolchain.toml`
/// declaring `channel`, and `fxdep` served from a git repository made at
/// `dir/fxdep` (its `file://` URL in `rust/Cargo.toml`, pinned by the
/// `Cargo.lock` cargo generates here). `edit` changes the tree before the
/// commit. Returns (repository, head commit, fxdep's repository).
fn rust_repo(dir: &Path, channel: &str, edit: impl FnOnce(&Path)) -> (PathBuf, String, PathBuf) {
    let dep = dir.join("fxdep");
    overlay(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture/rust-dep"),
        &dep,
    );
    git(&dep, &["init", "-q"]);
    git(&dep, &["add", "-A"]);
    git(&dep, &["commit", "-qm", "fxdep 0.1.0"]);
    let (repo, _) = fixture_repo_with(dir, "rust");
    let manifest = repo.join("rust/Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replace("FXDEP_GIT_URL", &format!("file://{}", dep.display())),
    )
    .unwrap();
    std::fs::write(
        repo.join("rust-toolchain.toml"),
        format!("[toolchain]\nchannel = \"{channel}\"\n"),
    )
    .unwrap();
    // The lock, made with a CARGO_HOME of the test's own, outside the
    // tree (so its toolchain file does not apply).
    succeeds(
        Command::new("cargo")
            .args(["generate-lockfile", "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_HOME", dir.join("cargo-home-lock"))
            .current_dir(dir),
    );
    edit(&repo);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "rust frontend"]);
    let head = git(&repo, &["rev-parse", "HEAD"]);
    (repo, head, dep)
}

/// The wheel entry's `build.json` of the key a `build --json` report names.
fn build_record(store: &Path, report: &serde_json::Value) -> serde_json::Value {
    let key = report["keys"]["wheel"].as_str().expect("a wheel key");
    read_json(&store.join("store/wheels").join(key).join("build.json"))
}

/// Runs `fixturellm/fx-rs` of the oracle `venv`: what it prints.
fn run_fx_rs(venv: &Path) -> String {
    let bin = only_entry(&venv.join("lib")).join("site-packages/fixturellm/fx-rs");
    let out = succeeds(&mut Command::new(&bin));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_channel_the_default_toolchain_satisfies_under_another_name_builds_with_it() {
    let fx = Fx::new();
    let channel = channel_of_default();
    let (repo, commit, _) = rust_repo(fx.dir(), &channel, |_| {});
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let plan = fx.run(&["plan", recipe.to_str().unwrap(), "--json"]);
    let built = fx.build_json(fx.store(), &recipe);
    assert_eq!(built["verdict"], "gateable", "{built}");
    let rec = build_record(fx.store(), &built);
    let rust = &rec["tools"]["rust"];
    assert_eq!(rust["release"], rustc_release(), "{rust}");
    let toolchain = rust["toolchain"]
        .as_str()
        .expect("rustup names the toolchain");
    assert!(
        !toolchain.starts_with(&format!("{channel}-")),
        "the default toolchain ({toolchain}) builds channel {channel}"
    );
    assert_eq!(rec["env"]["RUSTUP_TOOLCHAIN"], toolchain, "{}", rec["env"]);
    assert_eq!(
        rec["inputs"]["rust"]["toolchain"]["rustc"],
        rustc_release(),
        "the release is keyed: {}",
        rec["inputs"]
    );
    assert_eq!(
        rec["inputs"]["rust"]["toolchain"]["declared"][0]["channel"], channel,
        "{}",
        rec["inputs"]
    );
    // The extension was built (rustup did not stop at the tree's channel).
    assert_eq!(
        run_fx_rs(&fx.oracle("fx")),
        "fx-rs with fxdep 0.1.0 from git"
    );
    // `plan` measured the same toolchain and knew nothing to refuse.
    let plan = json(&plan);
    let step = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "rust");
    assert!(plan["problems"].as_array().unwrap().is_empty(), "{plan}");
    // Before the checkout `plan` cannot read the tree; afterwards it can.
    let again = fx.json(&["plan", recipe.to_str().unwrap(), "--json"]);
    let step = step.or_else(|| {
        again["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == "rust")
    });
    let step = step.unwrap_or_else(|| panic!("plan lists the Rust toolchain: {again}"));
    assert!(
        step["detail"].as_str().unwrap().contains(toolchain),
        "{step}"
    );
    assert_eq!(again["keys"]["wheel"], built["keys"]["wheel"], "{again}");
}

#[test]
fn a_channel_no_installed_toolchain_satisfies_is_refused_before_any_work() {
    let fx = Fx::new();
    let (repo, commit, _) = rust_repo(fx.dir(), "1.2", |_| {});
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let out = fx.build(&recipe);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in ["rust-toolchain.toml", "channel 1.2", &rustc_release()] {
        assert!(err.contains(want), "names {want}: {err}");
    }
    // Nothing past the checkout: no lock resolved, no wheel, no build log.
    for bucket in ["lockfiles", "wheels", "wheelhouse", "venvs"] {
        let dir = fx.store().join("store").join(bucket);
        assert!(tree(&dir).is_empty(), "{bucket}: {:?}", tree(&dir));
    }
    let logs: Vec<PathBuf> = tree(&fx.store().join("logs"));
    assert!(logs.is_empty(), "{logs:?}");
    // `plan` names the same refusal.
    let plan = fx.run(&["plan", recipe.to_str().unwrap(), "--json"]);
    assert_eq!(code(&plan), 1, "{}", text(&plan));
    let problems = json(&plan)["problems"].to_string();
    assert!(problems.contains("channel 1.2"), "{problems}");
}
