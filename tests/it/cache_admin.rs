//! `cache ls|verify|gc` (issue 13) against a real `file://` OCI layout
//! filled by `push` from a real build of the fixture pin, with keys and
//! allowed_signers files made by the real ssh-keygen.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::*;
use serde_json::Value;

/// `<store>/config.toml` with one cache at `url`.
fn configure(store: &Path, url: &str, key: Option<&Path>, signers: &Path, min: u32) {
    std::fs::create_dir_all(store).unwrap();
    let mut t = format!(
        "[[cache]]\nname = \"team\"\nurl = \"{url}\"\nmin_signatures = {min}\ntrusted_signers = \"{}\"\n",
        signers.display()
    );
    if let Some(k) = key {
        t.push_str(&format!("signing_key = \"{}\"\n", k.display()));
    }
    std::fs::write(store.join("config.toml"), t).unwrap();
}

fn ob(fx: &Fx, store: &Path, args: &[&str]) -> Output {
    fx.cmd_at(store, args)
        .env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .env("ORACLE_BUILD_BUILDER", "builder-a@test")
        .env_remove("ORACLE_BUILD_CACHE")
        .output()
        .expect("oracle-build runs")
}

/// The artifacts of the first cache of a `cache ls|verify --json` document.
fn artifacts(doc: &Value) -> Vec<Value> {
    doc["caches"][0]["artifacts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn wheel(doc: &Value) -> Value {
    artifacts(doc)
        .into_iter()
        .find(|a| a["kind"] == "wheel")
        .unwrap_or_else(|| panic!("no wheel in {doc}"))
}

fn blobs(layout: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

#[test]
fn cache_ls_verify_and_gc_on_a_file_layout() {
    let fx = Fx::new();
    let (_repo, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let layout = fx.dir().join("layout");
    let url = format!("file://{}", layout.display());
    let a = fx.dir().join("store-a");
    let (key, line) = keypair(fx.dir(), "builder-a@test");
    let allowed = fx.dir().join("allowed_signers");
    std::fs::write(&allowed, &line).unwrap();
    configure(&a, &url, Some(&key), &allowed, 1);

    // No cache yet: ls says so (exit 2) and names where to configure one.
    let bare = fx.dir().join("store-bare");
    let out = ob(&fx, &bare, &["cache", "ls"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("no cache is configured"),
        "{}",
        text(&out)
    );

    let built = ob(&fx, &a, &["build", r, "--json"]);
    assert_eq!(code(&built), 0, "{}", text(&built));
    let pushed = ob(&fx, &a, &["push", r, "--json"]);
    assert_eq!(code(&pushed), 0, "{}", text(&pushed));

    // ls: every kind, the wheel signed by A and trusted, the rest pinned.
    let out = ob(&fx, &a, &["cache", "ls", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let doc = json(&out);
    let kinds: Vec<String> = artifacts(&doc)
        .iter()
        .map(|a| a["kind"].as_str().unwrap().to_string())
        .collect();
    for k in [
        "source",
        "lock",
        "wheelhouse",
        "wheel",
        "inputs",
        "bytecode",
    ] {
        assert!(kinds.contains(&k.to_string()), "{k}: {doc}");
    }
    let w = wheel(&doc);
    assert_eq!(w["trust"], "signed", "{w}");
    assert_eq!(w["verdict"]["verdict"], "trusted", "{w}");
    assert_eq!(
        w["verdict"]["signers"][0]["builder"], "builder-a@test",
        "{w}"
    );
    assert!(w["size"].as_u64().unwrap() > 0);
    for a in artifacts(&doc).iter().filter(|a| a["kind"] != "wheel") {
        // A store lock is signed like the wheel (issue 22), by its own
        // attestation artifact.
        let want = if a["kind"] == "attestation" {
            "statement"
        } else if a["kind"] == "lock" {
            "lock"
        } else if a["kind"] == "source" {
            // Its commits pinned, its tags signed (issue 41).
            assert_eq!(a["tags"]["tags_trust"], "signed", "{a}");
            assert_eq!(a["tags"]["verdict"]["verdict"], "trusted", "{a}");
            "source"
        } else if a["kind"] == "bytecode" {
            // Code nothing reviewed pins: judged by its signatures, as
            // `pull` judges it, never "pinned (digest)" (found breaking
            // it, issue 42).
            assert_eq!(a["verdict"]["verdict"], "trusted", "{a}");
            "signed"
        } else {
            "pinned"
        };
        assert!(a["rule"].as_str().is_some_and(|r| !r.is_empty()), "{a}");
        assert_eq!(a["trust"], want, "{a}");
        assert_eq!(a["problems"], serde_json::json!([]), "{a}");
    }
    let lock = artifacts(&doc)
        .into_iter()
        .find(|a| a["kind"] == "lock")
        .unwrap_or_else(|| panic!("no lock in {doc}"));
    assert_eq!(lock["lock"]["lock_trust"], "signed", "{lock}");
    assert_eq!(lock["lock"]["verdict"]["verdict"], "trusted", "{lock}");
    let signs = |a: &Value, what: &str| {
        a["kind"] == "attestation"
            && a["signs"]
                .as_str()
                .is_some_and(|s| s.starts_with(&format!("signs {what} ")))
    };
    assert!(
        artifacts(&doc).iter().any(|a| signs(a, "lock")
            && a["signs"].as_str().unwrap().contains("by builder-a@test")),
        "the lock's signature is its own artifact: {doc}"
    );
    // A tags statement lists no files: no empty parentheses.
    let tags_att = artifacts(&doc)
        .into_iter()
        .find(|a| signs(a, "tags"))
        .unwrap_or_else(|| panic!("no attestation of the tags in {doc}"));
    assert!(
        !tags_att["signs"].as_str().unwrap().contains("()"),
        "{tags_att}"
    );
    let att = artifacts(&doc)
        .into_iter()
        .find(|a| signs(a, "wheel"))
        .unwrap_or_else(|| panic!("no attestation of the wheel in {doc}"));
    assert!(
        att["signs"].as_str().unwrap().contains("by builder-a@test"),
        "{att}"
    );
    let wheel_tag = w["tag"].as_str().unwrap().to_string();
    let out = ob(&fx, &a, &["cache", "ls"]);
    eprintln!("$ oracle-build cache ls\n{}", text(&out));
    assert!(text(&out).contains(&wheel_tag), "{}", text(&out));
    assert!(
        text(&out).contains("trusted: signed by builder-a@test"),
        "{}",
        text(&out)
    );

    // What an operator runs (docs/cache.md): the statement and signature,
    // the two layers of the attestation artifact, checked by ssh-keygen itself.
    let index: Value = read_json(&layout.join("index.json"));
    let manifest_of = |tag: &str| -> Value {
        let d = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
            .unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_string();
        read_json(&layout.join("blobs/sha256").join(&d["sha256:".len()..]))
    };
    let m = manifest_of(&wheel_tag);
    let config_digest = m["config"]["digest"].as_str().unwrap();
    let config: Value = read_json(
        &layout
            .join("blobs/sha256")
            .join(&config_digest["sha256:".len()..]),
    );
    let layer_file = |m: &Value, title: &str| -> PathBuf {
        let d = m["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["annotations"]["org.opencontainers.image.title"] == title)
            .unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_string();
        layout.join("blobs/sha256").join(&d["sha256:".len()..])
    };
    let am = manifest_of(att["tag"].as_str().unwrap());
    let statement = layer_file(&am, "statement.json");
    let sig = layer_file(&am, "statement.sig");
    let signed: Value = read_json(&statement);
    let check = Command::new("ssh-keygen")
        .args(["-Y", "verify", "-n", "oracle-build", "-f"])
        .arg(&allowed)
        .args(["-I", signed["builder"].as_str().unwrap(), "-s"])
        .arg(&sig)
        .stdin(std::fs::File::open(&statement).unwrap())
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
    assert_eq!(
        signed["files"][0]["sha256"], config["record"]["sha256"],
        "{signed}"
    );

    // verify: everything downloaded and sound.
    let out = ob(&fx, &a, &["cache", "verify", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["failed"], 0, "{}", text(&out));

    // Another box's policy: two signatures needed, one is not enough;
    // a file that trusts another key does not trust A's wheel.
    let b = fx.dir().join("store-b");
    configure(&b, &url, None, &allowed, 2);
    let out = ob(&fx, &b, &["cache", "verify", "--json"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let v = &wheel(&json(&out))["verdict"];
    assert_eq!(
        (
            v["verdict"].as_str(),
            v["have"].as_u64(),
            v["need"].as_u64()
        ),
        (Some("not-enough"), Some(1), Some(2)),
        "{v}"
    );
    let (_, other) = keypair(fx.dir(), "mallory@test");
    let other_file = fx.dir().join("allowed_other");
    std::fs::write(&other_file, other).unwrap();
    configure(&b, &url, None, &other_file, 1);
    let out = ob(&fx, &b, &["cache", "ls", "--json"]);
    assert_eq!(code(&out), 0, "ls lists, it does not judge: {}", text(&out));
    let v = &wheel(&json(&out))["verdict"];
    assert_eq!(v["verdict"], "untrusted", "{v}");
    assert!(v["why"][0].as_str().unwrap().contains("is not in"), "{v}");
    // Its bytecode too: `pull` would refuse it, and `ls` says so.
    let doc = json(&out);
    let pyc: Vec<Value> = artifacts(&doc)
        .into_iter()
        .filter(|a| a["kind"] == "bytecode")
        .collect();
    assert!(!pyc.is_empty(), "{doc}");
    for a in &pyc {
        assert_eq!(a["verdict"]["verdict"], "untrusted", "{a}");
    }
    let shown = text(&ob(&fx, &b, &["cache", "ls"]));
    let line = shown
        .lines()
        .find(|l| l.trim_start().starts_with("pyc-"))
        .unwrap_or_else(|| panic!("no pyc- in {shown}"));
    assert!(
        line.contains("untrusted") && !line.contains("pinned (digest)"),
        "{line}"
    );

    // A flipped byte in the wheel's blob: verify fails naming the digest.
    let layer = m["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| {
            l["annotations"]["org.opencontainers.image.title"]
                .as_str()
                .unwrap()
                .ends_with(".whl")
        })
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let blob = layout.join("blobs/sha256").join(&layer["sha256:".len()..]);
    let good = std::fs::read(&blob).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0xff;
    make_writable(&blob);
    std::fs::write(&blob, &bad).unwrap();
    let out = ob(&fx, &a, &["cache", "verify"]);
    eprintln!(
        "$ oracle-build cache verify   # one byte of the wheel blob flipped\n{}",
        text(&out)
    );
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains(&layer),
        "the digest is named: {}",
        text(&out)
    );
    assert!(
        text(&out).contains("1 artifact(s) failed verification"),
        "{}",
        text(&out)
    );
    std::fs::write(&blob, &good).unwrap();

    // gc: A roots its oracle, so nothing goes; without the root every tag
    // goes, and the blobs after them.
    let out = ob(&fx, &a, &["cache", "gc", "--dry-run", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let g = &json(&out)["caches"][0];
    assert_eq!(g["deleted"], serde_json::json!([]), "{g}");
    // The wheel's signed provenance goes with the wheel (docs/cache.md).
    let provenance = doc["caches"][0]["provenance"].as_array().unwrap().len();
    assert_eq!(provenance, 1, "{doc}");
    // The text listing counts every row it lists, the provenance too.
    let out = ob(&fx, &a, &["cache", "ls"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "{} artifact(s) and 1 provenance statement(s)",
            kinds.len()
        )),
        "{}",
        text(&out)
    );
    assert_eq!(
        g["kept"].as_array().unwrap().len(),
        kinds.len() + provenance,
        "{g}"
    );
    // gc with --store at a path that is no store: refused naming that
    // path (not asking for the --store it was given), nothing deleted.
    let nowhere = fx.dir().join("no-store-here");
    let out = ob(&fx, &nowhere, &["cache", "gc", "--cache", &url]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains(&format!("{} is not a store", nowhere.display())),
        "{}",
        text(&out)
    );
    assert!(
        !nowhere.exists(),
        "gc made a store at {}",
        nowhere.display()
    );
    let out = ob(&fx, &a, &["unkeep", r]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let before = blobs(&layout);
    let out = ob(&fx, &a, &["cache", "gc", "--dry-run"]);
    eprintln!(
        "$ oracle-build cache gc --dry-run   # after unkeep\n{}",
        text(&out)
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains(&format!("would delete {wheel_tag}")),
        "{}",
        text(&out)
    );
    assert_eq!(blobs(&layout), before, "a dry run deletes nothing");
    assert_eq!(
        json(&ob(&fx, &a, &["cache", "ls", "--json"]))["caches"][0]["artifacts"]
            .as_array()
            .unwrap()
            .len(),
        kinds.len()
    );
    // Blobs pushed within the grace period are left to pushes in flight: age them.
    let st = Command::new("touch")
        .args(["-d", "3 hours ago"])
        .args(&before)
        .status()
        .unwrap();
    assert!(st.success());
    // A has no root left: gc refuses to empty the cache unless told.
    let out = ob(&fx, &a, &["cache", "gc", "--json"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("--allow-empty-roots"), "{}", text(&out));
    let out = ob(&fx, &a, &["cache", "gc", "--allow-empty-roots", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let g = &json(&out)["caches"][0];
    assert_eq!(
        g["deleted"].as_array().unwrap().len(),
        kinds.len() + provenance,
        "{g}"
    );
    assert_eq!(g["blobs"].as_array().unwrap().len(), before.len(), "{g}");
    assert!(blobs(&layout).is_empty(), "{:?}", blobs(&layout));
    let doc = json(&ob(&fx, &a, &["cache", "ls", "--json"]));
    assert!(artifacts(&doc).is_empty(), "{doc}");

    // A push signed as a builder the cache's own trusted_signers does not
    // admit says so (its signature would stay untrusted); A's admitted
    // builder pushed above without the warning.
    assert!(
        !text(&pushed).contains("does not admit"),
        "{}",
        text(&pushed)
    );
    let rebuilt = ob(&fx, &a, &["build", r]);
    assert_eq!(code(&rebuilt), 0, "{}", text(&rebuilt));
    let out = fx
        .cmd_at(&a, &["push", r])
        .env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .env("ORACLE_BUILD_BUILDER", "stranger@elsewhere")
        .env_remove("ORACLE_BUILD_CACHE")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("does not admit this signature")
            && text(&out).contains("stranger@elsewhere")
            && text(&out).contains("ORACLE_BUILD_BUILDER"),
        "{}",
        text(&out)
    );
}

/// Makes `path` writable by its owner (layout blobs may be read-only).
fn make_writable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut p = std::fs::metadata(path).unwrap().permissions();
    p.set_mode(p.mode() | 0o200);
    std::fs::set_permissions(path, p).unwrap();
}
