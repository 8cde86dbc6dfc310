//! External trees from a cache or a bundle are checked against the commit
//! they claim (issue 41, item 2): box E, an untrusted pusher, stages a
//! FetchContent source declared by a tag from another repository (its
//! `[[mirror]]` points there) and edits the tree and manifest of one
//! declared by a 40-hex commit, then pushes and exports. Through a real
//! `docker-registry`, box C's `build` refuses both artifacts, naming each and
//! why, stages its own and compiles the upstream trees; box D's `pull`,
//! which trusts E's signature, takes E's word for the tag (its trusted
//! wheel vouches for it) but refuses the edited tree; box K's `import` of
//! E's bundle takes neither. C's honest trees, pushed and exported, are
//! taken: by F's `build` (the tag confirmed by F's own `git ls-remote`) and
//! by K2's `import` (vouched for by the bundle's trusted wheel), which then
//! builds offline. A staged tree edited in a store afterwards fails
//! `verify --deep` and `sbom`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::cache::{REPO, configure, ob, ok, strs};
use crate::registry::Registry;
use crate::support::*;

/// A git repository at `dir` with `fixture-ext.txt` holding `text`,
/// committed (and tagged `tag`); returns its head commit.
fn ext_repo(dir: &Path, text: &str, tag: Option<&str>) -> String {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("fixture-ext.txt"), text).unwrap();
    std::fs::write(dir.join("include.h"), "// a header\n").unwrap();
    git(dir, &["init", "-q"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "ext"]);
    if let Some(t) = tag {
        git(dir, &["tag", t]);
    }
    git(dir, &["rev-parse", "HEAD"])
}

/// The fixture built with CMake and two FetchContent sources: `tagged`
/// (`GIT_TAG v1.0`) and `pinned` (`GIT_TAG <commit>`). Returns the recipe
/// and the commit `pinned` is declared by.
fn two_source_pin(fx: &Fx) -> (PathBuf, String) {
    let up = fx.dir().join("upstream");
    ext_repo(&up.join("tagged"), "tagged v1.0 upstream\n", Some("v1.0"));
    let pinned = ext_repo(&up.join("pinned"), "pinned upstream\n", None);
    let (repo, _) = fx.repo();
    std::fs::write(
        repo.join("CMakeLists.txt"),
        format!(
            "cmake_minimum_required(VERSION 3.26)\nproject(fixturellm LANGUAGES C)\ninclude(FetchContent)\nfind_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)\nPython3_add_library(_C MODULE WITH_SOABI csrc/ops.c)\nFetchContent_Declare(tagged GIT_REPOSITORY file://{} GIT_TAG v1.0)\nFetchContent_Declare(pinned GIT_REPOSITORY file://{} GIT_TAG {pinned})\nFetchContent_MakeAvailable(tagged pinned)\n",
            up.join("tagged").display(),
            up.join("pinned").display()
        ),
    )
    .unwrap();
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
    (fx.recipe("fx", &repo, &commit, SMOKE), pinned)
}

/// The staged entry of source `name` in `store` (`store/ext/<name>-...`).
fn ext_entry(store: &Path, name: &str) -> Option<PathBuf> {
    std::fs::read_dir(store.join("store/ext"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{name}-"))
        })
}

/// Rewrites `fixture-ext.txt` of the staged entry at `entry` and its
/// manifest, as a box editing its own store would (stamps dropped).
fn edit_entry(entry: &Path, text: &str) {
    succeeds(Command::new("chmod").args(["-R", "u+w"]).arg(entry));
    std::fs::write(entry.join("src/fixture-ext.txt"), text).unwrap();
    let _ = std::fs::remove_file(entry.join("manifest.stamps"));
    oracle_build::store::Manifest::build(entry, &[oracle_build::store::MANIFEST])
        .unwrap()
        .write(entry)
        .unwrap();
}

/// What the built extension baked in from each staged source.
fn sources(venv: &Path) -> Value {
    let out = succeeds(
        Command::new(venv.join("bin/python"))
            .args(["-c", "import json, fixturellm._ext_sources as e; print(json.dumps(e.SOURCES, sort_keys=True))"])
            .current_dir("/"),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The commit each staged source of the wheel `key` in `store` was keyed with.
fn keyed_commits(store: &Path, key: &str) -> Vec<(String, String)> {
    let rec = read_json(&store.join("store/wheels").join(key).join("build.json"));
    rec["inputs"]["ext"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["commit"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn external_trees_from_a_cache_or_a_bundle_are_checked_against_their_commit() {
    let reg = Registry::start(None);
    let url = reg.url(REPO);
    let fx = Fx::new();
    let (recipe, pinned) = two_source_pin(&fx);
    let r = recipe.to_str().unwrap();
    let up = fx.dir().join("upstream");
    let honest_tag = git(&up.join("tagged"), &["rev-parse", "v1.0"]);
    // Another repository with a tag of the same name.
    let evil_tag = ext_repo(
        &fx.dir().join("elsewhere/tagged"),
        "tagged v1.0 from another repository\n",
        Some("v1.0"),
    );
    let (a_key, a_line) = keypair(fx.dir(), "builder-a@test");
    let allowed = fx.dir().join("allowed_signers");
    std::fs::write(&allowed, &a_line).unwrap();

    // E: its mirror points the tagged source elsewhere; it builds, edits
    // its pinned entry (tree and manifest), pushes and exports.
    let e = fx.dir().join("store-e");
    let (e_key, e_line) = keypair(fx.dir(), "evil@test");
    configure(&e, &url, Some(&e_key), None, 1);
    let mut cfg = std::fs::read_to_string(e.join("config.toml")).unwrap();
    cfg.push_str(&format!(
        "\n[[mirror]]\nprefix = \"file://{}\"\nurl = \"file://{}\"\n",
        up.join("tagged").display(),
        fx.dir().join("elsewhere/tagged").display()
    ));
    std::fs::write(e.join("config.toml"), cfg).unwrap();
    ok(&ob(&fx, &e, None, "evil@test", &["lock", r, "--json"]));
    ok(&ob(&fx, &e, None, "evil@test", &["build", r, "--json"]));
    let e_tagged = ext_entry(&e, "tagged").unwrap();
    assert_eq!(
        read_json(&e_tagged.join("ext.json"))["commit"],
        evil_tag.as_str()
    );
    let e_pinned = ext_entry(&e, "pinned").unwrap();
    edit_entry(&e_pinned, "pinned, edited by E\n");
    let pushed = ok(&ob(&fx, &e, None, "evil@test", &["push", r, "--json"]));
    let tags: Vec<String> = pushed[0]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["tag"].as_str().unwrap().to_string())
        .collect();
    let tag_of = |name: &str| {
        tags.iter()
            .find(|t| t.starts_with(&format!("ext-{name}-")))
            .unwrap_or_else(|| panic!("no ext-{name} artifact: {tags:?}"))
            .clone()
    };
    let (tagged_tag, pinned_tag) = (tag_of("tagged"), tag_of("pinned"));
    let bundle = fx.dir().join("e.tar.gz");
    ok(&ob(
        &fx,
        &e,
        None,
        "evil@test",
        &["export", r, "-o", bundle.to_str().unwrap(), "--json"],
    ));

    // C builds from the registry: both trees refused, naming the artifact
    // and why; its own staged and compiled.
    let c = fx.dir().join("store-c");
    configure(&c, &url, Some(&a_key), Some(&allowed), 1);
    let out = ob(&fx, &c, None, "c@test", &["build", r, "--json"]);
    let built = ok(&out);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let refusal = |tag: &str| {
        err.lines()
            .find(|l| l.contains(&format!("refusing {tag}: ")))
            .unwrap_or_else(|| panic!("no refusal of {tag}:\n{err}"))
            .to_string()
    };
    let line = refusal(&pinned_tag);
    assert!(
        line.contains("not substituting ext/pinned-")
            && line.contains("its files hash to git tree"),
        "{line}"
    );
    assert!(
        line.contains(&format!("the tree of commit {pinned}")),
        "{line}"
    );
    let line = refusal(&tagged_tag);
    assert!(
        line.contains(&format!("its tree is commit {evil_tag}'s"))
            && line.contains(&format!(
                "has v1.0 at commit {honest_tag}, not the recorded {evil_tag}"
            )),
        "{line}"
    );
    let venv = PathBuf::from(built["oracle"].as_str().unwrap());
    assert_eq!(
        sources(&venv),
        serde_json::json!({
            "FETCHCONTENT_SOURCE_DIR_PINNED": "pinned upstream",
            "FETCHCONTENT_SOURCE_DIR_TAGGED": "tagged v1.0 upstream",
        })
    );
    assert!(
        strs(&built["built"]).contains(&"wheel".to_string()),
        "{built}"
    );
    let key = read_json(&venv.join("oracle.json"))["wheel_key"]
        .as_str()
        .unwrap()
        .to_string();
    let mut commits = keyed_commits(&c, &key);
    commits.sort();
    assert_eq!(
        commits,
        vec![
            ("pinned".to_string(), pinned.clone()),
            ("tagged".to_string(), honest_tag.clone())
        ]
    );
    for name in ["tagged", "pinned"] {
        let rec = read_json(&ext_entry(&c, name).unwrap().join("ext.json"));
        assert!(rec["git"]["commits"].is_object(), "{rec}");
    }
    // verify --deep checks each staged tree against its commit.
    let v = ok(&ob(
        &fx,
        &c,
        None,
        "c@test",
        &["verify", r, "--deep", "--json"],
    ));
    for name in ["tagged", "pinned"] {
        let row = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["field"] == format!("staged source {name}"))
            .unwrap_or_else(|| panic!("no row for {name}: {v}"));
        assert_eq!(row["ok"], true, "{row}");
        assert!(
            row["found"].as_str().unwrap().starts_with("git tree "),
            "{row}"
        );
    }

    // D trusts E's signature: E's wheel is taken, and with it E's word for
    // the commit its tag named (the wheel's signed key inputs vouch for
    // it); the edited tree is refused all the same: a tree is checked, not
    // trusted.
    let d = fx.dir().join("store-d");
    let trusts_e = fx.dir().join("allowed_e");
    std::fs::write(&trusts_e, &e_line).unwrap();
    configure(&d, &url, None, Some(&trusts_e), 1);
    let pulled = ok(&ob(&fx, &d, None, "d@test", &["pull", r, "--json"]));
    let refused = strs(&pulled["refused"]);
    assert!(
        refused
            .iter()
            .any(|x| x.contains(&format!("refusing {pinned_tag}: "))
                && x.contains("its files hash to git tree")
                && x.contains("the ext stage stages it here")),
        "{pulled}"
    );
    assert!(ext_entry(&d, "pinned").is_none());
    let d_tagged = ext_entry(&d, "tagged").unwrap();
    assert_eq!(
        read_json(&d_tagged.join("ext.json"))["commit"],
        evil_tag.as_str()
    );

    // K imports E's bundle: neither tree is taken (import uses no network,
    // so a tag's commit is not confirmed where trusted_signers is set).
    let k = fx.dir().join("store-k");
    configure(&k, &url, None, Some(&allowed), 1);
    let imported = ok(&ob(
        &fx,
        &k,
        None,
        "k@test",
        &["import", bundle.to_str().unwrap(), "--json"],
    ));
    let notes = strs(&imported["notes"]);
    for (name, why) in [
        ("pinned", "its files hash to git tree".to_string()),
        ("tagged", format!("its tree is commit {evil_tag}'s")),
    ] {
        assert!(
            notes
                .iter()
                .any(|n| n.starts_with(&format!("the bundle's ext/{name}-"))
                    && n.contains("is not taken")
                    && n.contains(&why)),
            "{name}: {imported}"
        );
    }
    assert!(ext_entry(&k, "tagged").is_none() && ext_entry(&k, "pinned").is_none());

    // C pushes and exports, signing as A: F builds from the registry and
    // takes C's trees (the tag confirmed by F's own ls-remote), and the
    // wheel; K2 imports C's bundle, whose trusted wheel vouches for the
    // tag, and builds it offline.
    ok(&ob(&fx, &c, None, "builder-a@test", &["push", r, "--json"]));
    let c_bundle = fx.dir().join("c.tar.gz");
    ok(&ob(
        &fx,
        &c,
        None,
        "builder-a@test",
        &["export", r, "-o", c_bundle.to_str().unwrap(), "--json"],
    ));
    let f = fx.dir().join("store-f");
    configure(&f, &url, None, Some(&allowed), 1);
    let out = ob(&fx, &f, None, "f@test", &["build", r, "--json"]);
    let f_built = ok(&out);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    for name in ["tagged", "pinned"] {
        assert!(
            err.contains(&format!("substituted ext/{name}-")),
            "{name}:\n{err}"
        );
    }
    assert!(
        strs(&f_built["substituted"]).contains(&"wheel".to_string()),
        "{f_built}"
    );
    let honest = serde_json::json!({
        "FETCHCONTENT_SOURCE_DIR_PINNED": "pinned upstream",
        "FETCHCONTENT_SOURCE_DIR_TAGGED": "tagged v1.0 upstream",
    });
    assert_eq!(
        sources(Path::new(f_built["oracle"].as_str().unwrap())),
        honest
    );
    let k2 = fx.dir().join("store-k2");
    configure(&k2, &url, None, Some(&allowed), 1);
    let imported = ok(&ob(
        &fx,
        &k2,
        None,
        "k2@test",
        &["import", c_bundle.to_str().unwrap(), "--json"],
    ));
    assert!(
        !strs(&imported["notes"]).iter().any(|n| n.contains("ext/")),
        "{imported}"
    );
    assert_eq!(
        read_json(&ext_entry(&k2, "tagged").unwrap().join("ext.json"))["commit"],
        honest_tag.as_str()
    );
    let out = ob(
        &fx,
        &k2,
        None,
        "k2@test",
        &["build", r, "--offline", "--json"],
    );
    assert_eq!(
        sources(Path::new(ok(&out)["oracle"].as_str().unwrap())),
        honest
    );

    // An entry edited in C's store afterwards: verify --deep and sbom fail.
    edit_entry(&ext_entry(&c, "pinned").unwrap(), "pinned, edited later\n");
    let out = ob(&fx, &c, None, "c@test", &["verify", r, "--deep", "--json"]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    let v = json(&out);
    let row = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["field"] == "staged source pinned")
        .unwrap();
    assert_eq!(row["ok"], false, "{row}");
    assert!(
        row["found"]
            .as_str()
            .unwrap()
            .contains("its files hash to git tree"),
        "{row}"
    );
    let out = ob(&fx, &c, None, "c@test", &["sbom", r]);
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("the staged source pinned is not its commit's tree"),
        "{}",
        text(&out)
    );
}
