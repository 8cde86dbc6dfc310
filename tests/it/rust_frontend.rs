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
    // The extension was built (rustup did not stop at the tree's channel),
    // required (the tree reads VLLM_REQUIRE_RUST_FRONTEND), and recorded.
    assert_eq!(
        run_fx_rs(&fx.oracle("fx")),
        "fx-rs with fxdep 0.1.0 from git"
    );
    assert_eq!(
        rec["env"]["VLLM_REQUIRE_RUST_FRONTEND"], "1",
        "{}",
        rec["env"]
    );
    let ext = &rec["rust_extensions"][0];
    assert_eq!(ext["target"], "fixturellm.fx-rs", "{ext}");
    assert_eq!(ext["kind"], "executable", "{ext}");
    assert_eq!(ext["present"], true, "{ext}");
    assert!(
        ext["declared"]
            .as_str()
            .unwrap()
            .starts_with("tools/build_rust.py:"),
        "{ext}"
    );
    // `verify` lists the optional extension present.
    let verified = fx.json(&["verify", recipe.to_str().unwrap(), "--json"]);
    let check = verified["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["field"] == "optional_extensions")
        .unwrap_or_else(|| panic!("verify checks the optional extensions: {verified}"));
    assert_eq!(check["ok"], true, "{check}");
    assert_eq!(check["found"], "present: fixturellm.fx-rs", "{check}");
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

    // Cargo's target directory is the store's Rust compile cache: the wheel
    // and venv wiped, the rebuild (same key) compiles no crate again (the
    // compiled fxdep library is the same file, untouched).
    let target = rec["env"]["CARGO_TARGET_DIR"].as_str().unwrap_or_else(|| {
        panic!(
            "a build with a compiler cache keeps cargo's target dir: {}",
            rec["env"]
        )
    });
    assert!(
        Path::new(target).starts_with(fx.store().join("cargo-target")),
        "{target}"
    );
    let rlib = |dir: &Path| -> Vec<(PathBuf, std::time::SystemTime)> {
        tree(dir)
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("libfxdep-"))
            })
            .map(|p| {
                let m = std::fs::metadata(&p).unwrap().modified().unwrap();
                (p, m)
            })
            .collect()
    };
    let compiled = rlib(Path::new(target));
    assert!(!compiled.is_empty(), "{:?}", tree(Path::new(target)));
    for b in ["venvs", "wheels"] {
        for e in std::fs::read_dir(fx.store().join("store").join(b)).unwrap() {
            force_remove(&e.unwrap().path());
        }
    }
    let rebuilt = fx.build_json(fx.store(), &recipe);
    assert_eq!(rebuilt["keys"]["wheel"], built["keys"]["wheel"]);
    assert!(
        strs_of(&rebuilt["built"]).contains(&"wheel".to_string()),
        "{rebuilt}"
    );
    assert_eq!(
        rlib(Path::new(target)),
        compiled,
        "fxdep was not compiled again"
    );
    assert_eq!(
        run_fx_rs(&fx.oracle("fx")),
        "fx-rs with fxdep 0.1.0 from git"
    );
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

/// The sha256 of the file at `path`, lowercase hex (as `sha256sum`).
fn sha256_of(path: &Path) -> String {
    let out = succeeds(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn crates_are_staged_exported_and_build_offline_after_import_with_an_empty_cargo_home() {
    let fx = Fx::new();
    let (repo, commit, dep) = rust_repo(fx.dir(), &channel_of_default(), |_| {});
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let r = recipe.to_str().unwrap();
    let lock_sha = sha256_of(&repo.join("rust/Cargo.lock"));
    // Export stages the crates of rust/Cargo.lock (no build), with a
    // CARGO_HOME of its own staging: an empty HOME stays empty (rustup's
    // proxy falls back to ~/.cargo when the tool's CARGO_HOME is lost).
    let bundle = fx.dir().join("fx.tar.gz");
    let empty_home = fx.dir().join("empty-home");
    std::fs::create_dir_all(&empty_home).unwrap();
    let rustup_home = std::env::var_os("RUSTUP_HOME").map_or_else(
        || Path::new(&std::env::var_os("HOME").unwrap()).join(".rustup"),
        PathBuf::from,
    );
    let out = fx
        .cmd(&["export", r, "-o", bundle.to_str().unwrap()])
        .env("HOME", &empty_home)
        .env("RUSTUP_HOME", &rustup_home)
        .env_remove("CARGO_HOME")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        tree(&empty_home).is_empty(),
        "HOME untouched by staging crates: {:?}",
        tree(&empty_home)
    );
    let crates = fx.store().join("store/crates").join(&lock_sha);
    let sums = crates.join("vendor/fxdep-0.1.0/.cargo-checksum.json");
    assert!(
        sums.is_file(),
        "{:?}",
        tree(&fx.store().join("store/crates"))
    );
    let listing = succeeds(Command::new("tar").arg("-tzf").arg(&bundle));
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(
        listing.contains(&format!(
            "store/crates/{lock_sha}/vendor/fxdep-0.1.0/src/lib.rs"
        )),
        "{listing}"
    );

    // Box B: fxdep's repository gone, an empty CARGO_HOME, import, offline.
    let gone = fx.dir().join("fxdep-gone");
    std::fs::rename(&dep, &gone).unwrap();
    let b = fx.dir().join("store-b");
    let home = fx.dir().join("empty-cargo-home");
    std::fs::create_dir_all(&home).unwrap();
    let on_b = |args: &[&str]| {
        let mut c = fx.cmd_at(&b, args);
        c.env("CARGO_HOME", &home);
        c.output().expect("oracle-build runs")
    };
    let out = on_b(&["import", bundle.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let plan = on_b(&["plan", r, "--offline", "--json"]);
    let plan = json(&plan);
    assert!(
        plan["offline_missing"].as_array().unwrap().is_empty(),
        "{plan}"
    );
    let out = on_b(&["build", r, "--offline", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let built_b = json(&out);
    assert!(
        strs_of(&built_b["built"]).contains(&"wheel".to_string()),
        "B built the wheel itself: {built_b}"
    );
    let rec = build_record(&b, &built_b);
    assert_eq!(rec["env"]["CARGO_NET_OFFLINE"], "true", "{}", rec["env"]);
    let cargo_home = rec["env"]["CARGO_HOME"].as_str().unwrap();
    assert!(
        cargo_home.starts_with(b.to_str().unwrap()),
        "the build's CARGO_HOME is in its store: {cargo_home}"
    );
    assert_eq!(
        rec["inputs"]["rust"]["crates"][0]["sha256"], lock_sha,
        "{}",
        rec["inputs"]
    );
    assert!(
        strs_of(&rec["requires"]).contains(&format!("crates/{lock_sha}")),
        "{}",
        rec["requires"]
    );
    assert_eq!(
        run_fx_rs(&oracle_of(&b, "fx")),
        "fx-rs with fxdep 0.1.0 from git"
    );
    assert!(
        tree(&home).is_empty(),
        "CARGO_HOME untouched: {:?}",
        tree(&home)
    );

    // A builds online from its staged crates too, under the same key; its
    // push carries the crates (signed), and C's pull brings them.
    std::fs::rename(&gone, &dep).unwrap();
    let url = format!("file://{}", fx.dir().join("cache").display());
    let (key, line) = keypair(fx.dir(), "builder-a@test");
    let allowed = fx.dir().join("allowed_signers");
    std::fs::write(&allowed, line).unwrap();
    crate::cache::configure(fx.store(), &url, Some(&key), None, 1);
    crate::cache::configure(&c_store(&fx), &url, None, Some(&allowed), 1);
    let as_builder = |store: &Path, args: &[&str]| {
        let mut c = fx.cmd_at(store, args);
        c.env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
            .env("ORACLE_BUILD_BUILDER", "builder-a@test");
        c.output().expect("oracle-build runs")
    };
    let out = as_builder(fx.store(), &["build", r, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["keys"]["wheel"], built_b["keys"]["wheel"]);
    let out = as_builder(fx.store(), &["push", r]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = as_builder(&c_store(&fx), &["pull", r]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        c_store(&fx)
            .join("store/crates")
            .join(&lock_sha)
            .join("vendor/fxdep-0.1.0")
            .is_dir(),
        "{}",
        text(&out)
    );
}

/// Box C's store in the test directory of `fx`.
fn c_store(fx: &Fx) -> PathBuf {
    fx.dir().join("store-c")
}

/// The strings of a JSON array.
fn strs_of(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The oracle venv of recipe `name` in the store at `store`.
fn oracle_of(store: &Path, name: &str) -> PathBuf {
    store.join("roots").join(name).canonicalize().unwrap()
}

#[test]
fn an_optional_extension_missing_is_a_mismatch_unless_the_recipe_accepts_it() {
    let fx = Fx::new();
    // A tree whose extension cannot build, optional whatever the
    // environment says (it does not read VLLM_REQUIRE_RUST_FRONTEND):
    // setuptools-rust leaves it out of the wheel with a warning.
    let (repo, commit, _) = rust_repo(fx.dir(), &channel_of_default(), |repo| {
        let tools = repo.join("tools/build_rust.py");
        let text = std::fs::read_to_string(&tools).unwrap();
        let optional = "optional = os.environ.get(\"VLLM_REQUIRE_RUST_FRONTEND\", \"0\") != \"1\"";
        assert!(text.contains(optional));
        let text = text
            .replace(optional, "optional = True")
            .replace("unless ``VLLM_REQUIRE_RUST_FRONTEND=1``", "always");
        std::fs::write(&tools, text).unwrap();
        std::fs::write(
            repo.join("rust/src/main.rs"),
            "compile_error!(\"fx-rs does not build here\");\nfn main() {}\n",
        )
        .unwrap();
    });
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let out = fx.build(&recipe);
    assert_eq!(code(&out), 3, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "optional_extensions",
        "absent: fixturellm.fx-rs (tools/build_rust.py:",
    ] {
        assert!(err.contains(want), "names {want}: {err}");
    }
    assert!(
        tree(&fx.store().join("store/venvs")).is_empty(),
        "no oracle is kept"
    );
    // A recipe that accepts its absence says so, and gets its own wheel key.
    let ok = fx.recipe(
        "fx-ok",
        &repo,
        &commit,
        &format!("  optional_missing_ok: [fixturellm.fx-rs]\n{SMOKE}"),
    );
    let built = fx.build_json(fx.store(), &ok);
    assert_eq!(built["verdict"], "gateable", "{built}");
    let rec = build_record(fx.store(), &built);
    assert_eq!(
        rec["inputs"]["rust"]["optional_missing_ok"][0], "fixturellm.fx-rs",
        "{}",
        rec["inputs"]
    );
    assert_eq!(rec["rust_extensions"][0]["present"], false, "{rec}");
    let verified = fx.json(&["verify", ok.to_str().unwrap(), "--json"]);
    let check = verified["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["field"] == "optional_extensions")
        .unwrap_or_else(|| panic!("{verified}"));
    assert_eq!(check["ok"], true, "{check}");
    assert_eq!(
        check["found"],
        "present: none; absent, accepted by build.optional_missing_ok: fixturellm.fx-rs",
        "{check}"
    );
    // A value that names no target is bad input, with its line (exit 2).
    let bad = fx.recipe(
        "fx-bad",
        &repo,
        &commit,
        &format!("  optional_missing_ok: [\"fixturellm fx-rs\"]\n{SMOKE}"),
    );
    let out = fx.build(&bad);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 9: field `build.optional_missing_ok[0]`: \"fixturellm fx-rs\""),
        "{err}"
    );
}
