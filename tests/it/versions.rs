//! One pin, one version, one runtime set on every box (issue 22): several
//! stores standing for several boxes, one upstream repository, one
//! `file://` cache (and a registry), the real binary, git, uv and ssh-keygen.
//!
//! One test walks the whole story so the fixture is built as few times as
//! possible: box A builds before upstream tags the pinned commit and pushes;
//! upstream tags it; box B (which has the tag) refuses A's wheel, fails a
//! recipe whose `expect.runtime_version` its history contradicts before the
//! wheel stage, and builds; A rebuilds with `CPPFLAGS=-O0` in its
//! environment (the wheel key differs from its stale one; the bytes are
//! B's); box C's moved tag refuses the bundle with nothing written; box D
//! pulls (no fork-only warning, the check said not made), takes the signed
//! store lock, and a hand-edited unsigned lock is refused; a same-URL user
//! entry cannot lower the store's `min_signatures`; box I imports A's
//! bundle and builds offline with no fork-only warning; through a real
//! `docker-registry`, box J takes A's signed store lock and wheel.

use std::path::Path;
use std::process::Output;

use crate::registry::Registry;
use crate::support::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// `<store>/config.toml` with the one cache `team` at `url`.
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

/// `oracle-build <args> --store <store>`, the user's config in `<dir>/xdg`,
/// builder `builder`, with `env` added.
fn ob(fx: &Fx, store: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = fx.cmd_at(store, args);
    c.env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .env("HOME", fx.dir())
        .env("ORACLE_BUILD_BUILDER", "builder-a@test");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("oracle-build runs")
}

fn ok(out: &Output) -> Value {
    assert_eq!(code(out), 0, "{}", text(out));
    json(out)
}

fn wheel_record(store: &Path, key: &str) -> Value {
    read_json(&store.join("store/wheels").join(key).join("build.json"))
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn refs(mirror: &Path) -> String {
    git(
        mirror,
        &["for-each-ref", "--format=%(refname) %(objectname)"],
    )
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Writes `bytes` as a blob of the OCI layout `layout`; returns its digest.
fn put_blob(layout: &Path, bytes: &[u8]) -> String {
    let hex = sha256_hex(bytes);
    let p = layout.join("blobs/sha256").join(&hex);
    if !p.exists() {
        std::fs::write(&p, bytes).unwrap();
    }
    format!("sha256:{hex}")
}

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    std::fs::read(
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:")),
    )
    .unwrap()
}

/// Hand-edits the lock artifact of the OCI layout `layout`: a package line
/// added to its `pylock.runtime.toml` (the config's files updated to match,
/// and its tag the content tag of the new manifest, so only trust can
/// refuse it) and, with `strip`, its signatures (the `att-lock-*`
/// attestation artifacts) removed.
fn edit_lock(layout: &Path, strip: bool) {
    let index_path = layout.join("index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let m = index["manifests"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|m| {
            m["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .is_some_and(|t| t.starts_with("lock-"))
        })
        .expect("a lock tag");
    let mut manifest: Value =
        serde_json::from_slice(&blob(layout, m["digest"].as_str().unwrap())).unwrap();
    let mut config: Value = serde_json::from_slice(&blob(
        layout,
        manifest["config"]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    for l in manifest["layers"].as_array_mut().unwrap() {
        if l["annotations"]["org.opencontainers.image.title"] != "pylock.runtime.toml" {
            continue;
        }
        let mut text = blob(layout, l["digest"].as_str().unwrap());
        text.extend_from_slice(b"\n[[packages]]\nname = \"evil\"\nversion = \"1.0\"\n");
        let d = put_blob(layout, &text);
        l["digest"] = d.clone().into();
        l["size"] = text.len().into();
        for f in config["files"].as_array_mut().unwrap() {
            if f["path"] == "pylock.runtime.toml" {
                f["sha256"] = d.trim_start_matches("sha256:").into();
                f["size"] = text.len().into();
            }
        }
    }
    let cb = serde_json::to_vec_pretty(&config).unwrap();
    manifest["config"]["digest"] = put_blob(layout, &cb).into();
    manifest["config"]["size"] = cb.len().into();
    let mb = serde_json::to_vec_pretty(&manifest).unwrap();
    let digest = put_blob(layout, &mb);
    // `lock-<key>-<manifest[..16]>`: the tag quotes the new manifest.
    let tag = m["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .unwrap()
        .to_string();
    let tag = format!(
        "{}{}",
        &tag[..tag.len() - 16],
        &digest.trim_start_matches("sha256:")[..16]
    );
    m["annotations"]["org.opencontainers.image.ref.name"] = tag.into();
    m["digest"] = digest.into();
    m["size"] = mb.len().into();
    if strip {
        index["manifests"].as_array_mut().unwrap().retain(|m| {
            !m["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .is_some_and(|t| t.starts_with("att-lock-"))
        });
    }
    std::fs::write(&index_path, serde_json::to_vec_pretty(&index).unwrap()).unwrap();
}

fn lock_row(ls: &Value) -> Value {
    ls["caches"][0]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "lock")
        .cloned()
        .expect("a lock artifact")
}

#[test]
fn one_pin_gives_one_version_and_one_runtime_set_on_every_box() {
    let fx = Fx::new();
    let (repo, head) = fx.repo();
    let first = git(&repo, &["rev-parse", "v0.1.0^{commit}"]);
    let recipe = fx.recipe("fx", &repo, &head, SMOKE);
    let r = recipe.to_str().unwrap();
    let layout = fx.dir().join("layout");
    let url = format!("file://{}", layout.display());
    let (key, line) = keypair(fx.dir(), "builder-a@test");
    let allowed = fx.dir().join("allowed_signers");
    std::fs::write(&allowed, line).unwrap();

    // Box A builds before upstream tags the commit, and pushes (signed).
    let a = fx.dir().join("store-a");
    configure(&a, &url, Some(&key), &allowed, 1);
    let built_a = ok(&ob(&fx, &a, &[], &["build", r, "--json"]));
    let stale_key = built_a["keys"]["wheel"].as_str().unwrap().to_string();
    let stale = wheel_record(&a, &stale_key);
    assert_eq!(stale["describe"]["tag"], "v0.1.0", "{stale}");
    assert_eq!(stale["describe"]["commit"], first.as_str(), "{stale}");
    assert_eq!(stale["inputs"]["describe"], stale["describe"], "{stale}");
    let stale_version = stale["history_version"].as_str().unwrap().to_string();
    assert!(stale_version.starts_with("0.1.1.dev1+g"), "{stale_version}");
    ok(&ob(&fx, &a, &[], &["push", r, "--json"]));
    // One commit after v0.1.0: the runtime version A built is what the
    // history fixes; a distribution version without `.dev1+g<sha>` is not,
    // and fails before the wheel stage, naming the tag.
    let dev = fx.recipe(
        "fx-dev",
        &repo,
        &head,
        &format!(
            "{SMOKE}expect:\n  runtime_version: \"{stale_version}\"\n  distribution_version: \"0.1.1\"\n"
        ),
    );
    let out = ob(&fx, &a, &[], &["build", dev.to_str().unwrap()]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    let msg = text(&out);
    for want in [
        "expect.distribution_version is 0.1.1",
        // The whole version the history gives, and the rule that makes it.
        &format!("gives {stale_version} (from tag v0.1.0 at {first}; "),
        "the tag's version 0.1.0 with its last number bumped (0.1.1), appends .dev1",
        "before the wheel stage",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    assert!(!msg.contains("expect.runtime_version"), "{msg}");
    let bundle = fx.dir().join("fx-stale.tar.gz");
    let out = ob(&fx, &a, &[], &["export", r, "-o", bundle.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    // The same bundle from A without its signing key: its lock is unsigned.
    let unsigned = fx.dir().join("fx-unsigned.tar.gz");
    configure(&a, &url, None, &allowed, 1);
    let out = ob(
        &fx,
        &a,
        &[],
        &["export", r, "-o", unsigned.to_str().unwrap()],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    configure(&a, &url, Some(&key), &allowed, 1);
    // A box whose caches name trusted_signers refuses the unsigned lock of
    // a bundle, as it would a cache's: not the store's lock, not beside
    // the imported recipe; its builds resolve their own.
    let k = fx.dir().join("store-k");
    configure(&k, &url, None, &allowed, 1);
    let imported = ok(&ob(
        &fx,
        &k,
        &[],
        &["import", unsigned.to_str().unwrap(), "--json"],
    ));
    let trust = imported["lock_trust"].as_str().unwrap_or_default();
    assert!(trust.starts_with("untrusted"), "{imported}");
    assert!(
        imported["notes"].to_string().contains("not trusted"),
        "{imported}"
    );
    assert_eq!(imported["lock_entry"], Value::Null, "{imported}");
    assert!(names(&k.join("store/lockfiles")).is_empty(), "{imported}");
    // Its tags are unsigned too (issue 41): kept aside, so this box's
    // history gives another version and the built wheel is not taken.
    let notes = imported["notes"].to_string();
    assert!(notes.contains("are not used for versions"), "{imported}");
    assert!(notes.contains("is not taken"), "{imported}");
    assert!(names(&k.join("store/wheels")).is_empty(), "{imported}");
    // The signed bundle's wheel is taken by a box that trusts A's key.
    let k1 = fx.dir().join("store-k1");
    configure(&k1, &url, None, &allowed, 1);
    let imported = ok(&ob(
        &fx,
        &k1,
        &[],
        &["import", bundle.to_str().unwrap(), "--json"],
    ));
    let wheel_trust = imported["wheel_trust"].as_str().unwrap_or_default();
    assert!(wheel_trust.contains("builder-a@test"), "{imported}");
    assert_eq!(names(&k1.join("store/wheels")).len(), 1, "{imported}");
    // What import prints for the refused lock: once "untrusted", and a hint
    // that works (online: no lock was taken for an offline build).
    let k3 = fx.dir().join("store-k3");
    configure(&k3, &url, None, &allowed, 1);
    let out = ob(&fx, &k3, &[], &["import", unsigned.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(code(&out), 0, "{t}");
    assert!(
        t.contains("lock     untrusted: ") && !t.contains("untrusted: untrusted"),
        "{t}"
    );
    assert!(
        t.contains("build it online") && !t.contains("--offline --store"),
        "{t}"
    );
    assert!(
        names(&k.join("imported/fx/lockfiles/fx")).is_empty(),
        "{imported}"
    );

    // cache ls: the store lock is signed; pinned when a reviewed lockfile holds it.
    let ls = ok(&ob(&fx, &a, &[], &["cache", "ls", "--json"]));
    let lock = lock_row(&ls);
    assert_eq!(lock["trust"], "lock", "{lock}");
    assert_eq!(lock["lock"]["lock_trust"], "signed", "{lock}");
    assert_eq!(lock["lock"]["verdict"]["verdict"], "trusted", "{lock}");
    assert!(lock.to_string().contains("builder-a@test"), "{lock}");
    let reviewed = fx.dir().join("reviewed");
    let lock_label = stale["requires"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|l| l.starts_with("lockfiles/"))
        .expect("the wheel requires its lock")
        .to_string();
    let lock_entry = a.join("store").join(&lock_label);
    let reviewed_fx = reviewed.join("fx");
    std::fs::create_dir_all(&reviewed_fx).unwrap();
    for f in ["pylock.build.toml", "pylock.runtime.toml", "lock.json"] {
        std::fs::copy(lock_entry.join(f), reviewed_fx.join(f)).unwrap();
    }
    let ls = ok(&ob(
        &fx,
        &a,
        &[],
        &[
            "cache",
            "ls",
            "--json",
            "--lockfiles",
            reviewed.to_str().unwrap(),
        ],
    ));
    assert_eq!(lock_row(&ls)["lock"]["lock_trust"], "lockfile", "{ls}");
    let out = ob(&fx, &a, &[], &["cache", "ls"]);
    assert!(
        text(&out).contains("signed by builder-a@test"),
        "{}",
        text(&out)
    );
    // A reviewed lockfile on the importing box pins the bundle's unsigned lock.
    let k2 = fx.dir().join("store-k2");
    configure(&k2, &url, None, &allowed, 1);
    let imported = ok(&ob(
        &fx,
        &k2,
        &[],
        &[
            "import",
            unsigned.to_str().unwrap(),
            "--json",
            "--lockfiles",
            reviewed.to_str().unwrap(),
        ],
    ));
    assert_eq!(imported["lock_trust"], "pinned (lockfile)", "{imported}");
    assert!(imported["lock_entry"].is_string(), "{imported}");

    // Upstream tags the pinned commit.
    git(&repo, &["tag", "v0.2.0", &head]);

    // Box H: a user entry with the store's URL under another name cannot
    // lower the store's min_signatures = 2 (A alone signed the wheel).
    let h = fx.dir().join("store-h");
    configure(&h, &url, None, &allowed, 2);
    let user = fx.dir().join("xdg/oracle-build");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::write(
        user.join("config.toml"),
        format!(
            "[[cache]]\nname = \"quick\"\nurl = \"{url}\"\nmin_signatures = 1\ntrusted_signers = \"{}\"\n",
            allowed.display()
        ),
    )
    .unwrap();
    for args in [&["pull", r][..], &["pull", r, "--cache", "quick"][..]] {
        let out = ob(&fx, &h, &[], args);
        assert_ne!(code(&out), 0, "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("min_signatures is 2"),
            "{args:?}: {}",
            text(&out)
        );
        assert!(names(&h.join("store/wheels")).is_empty(), "{args:?}");
    }
    std::fs::remove_file(user.join("config.toml")).unwrap();

    // Box B has the tag: A's stale wheel is refused, naming both tags and A's version.
    let b = fx.dir().join("store-b");
    configure(&b, &url, None, &allowed, 1);
    ok(&ob(&fx, &b, &[], &["fetch", r, "--json"]));
    // `plan` judges the cache's store lock as pull does: signed by A.
    let plan = ok(&ob(&fx, &b, &[], &["plan", r, "--json"]));
    let row = plan["caches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["stage"] == "lock")
        .cloned()
        .unwrap_or_else(|| panic!("no lock row: {plan}"));
    assert_eq!(
        row["signed_by"],
        serde_json::json!(["builder-a@test"]),
        "{row}"
    );
    let pulled = ok(&ob(&fx, &b, &[], &["pull", r, "--json"]));
    let refused = pulled["refused"].to_string();
    for want in [
        stale_key.as_str(),
        stale_version.as_str(),
        "tag v0.1.0",
        "tag v0.2.0",
        "gives version 0.2.0",
        "builds here",
    ] {
        assert!(refused.contains(want), "{want}: {pulled}");
    }
    assert!(names(&b.join("store/wheels")).is_empty(), "{pulled}");
    // The same from a bundle: `import` does not take the stale wheel.
    let imported = ok(&ob(
        &fx,
        &b,
        &[],
        &["import", bundle.to_str().unwrap(), "--json"],
    ));
    // Its lock is A's, signed (B trusts A's key).
    assert!(
        imported["lock_trust"]
            .as_str()
            .is_some_and(|t| t.contains("signed by builder-a@test")),
        "{imported}"
    );
    let notes = imported["notes"].to_string();
    for want in [
        stale_version.as_str(),
        "tag v0.1.0",
        "tag v0.2.0",
        "gives version 0.2.0",
        "not taken",
    ] {
        assert!(notes.contains(want), "{want}: {imported}");
    }
    assert!(names(&b.join("store/wheels")).is_empty(), "{imported}");

    // A recipe expecting another version fails before the wheel is built.
    let wrong = fx.recipe(
        "fx-wrong",
        &repo,
        &head,
        &format!("{SMOKE}expect:\n  runtime_version: \"9.9.9\"\n"),
    );
    let out = ob(
        &fx,
        &b,
        &[],
        &["build", wrong.to_str().unwrap(), "--no-substitute"],
    );
    assert_eq!(code(&out), 3, "{}", text(&out));
    let msg = text(&out);
    for want in [
        "expect.runtime_version is 9.9.9",
        "gives 0.2.0",
        &format!("tag v0.2.0 at {head}"),
        "before the wheel stage",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    // No wheel-stage work: no build log (the wheel stage writes one before
    // it makes the build venv), no wheel, nothing said of a build.
    assert!(names(&b.join("store/wheels")).is_empty(), "{msg}");
    let logs = names(&b.join("logs"));
    assert!(!logs.iter().any(|l| l.starts_with("build-")), "{logs:?}");
    assert!(!msg.contains("building"), "{msg}");

    // B builds 0.2.0: another key than A's stale one.
    let built_b = ok(&ob(
        &fx,
        &b,
        &[],
        &["build", r, "--json", "--no-substitute"],
    ));
    let key_b = built_b["keys"]["wheel"].as_str().unwrap().to_string();
    assert_ne!(key_b, stale_key);
    assert_eq!(built_b["runtime_version"], "0.2.0", "{built_b}");
    let rec_b = wheel_record(&b, &key_b);
    assert_eq!(rec_b["history_version"], "0.2.0");
    assert_eq!(rec_b["describe"]["tag"], "v0.2.0");

    // CFLAGS in the recipe's build.env is allowed, and keyed.
    let flagged = fx.dir().join("fx-flags.yaml");
    std::fs::write(
        &flagged,
        recipe_text("fx", &repo, &head, SMOKE).replace(
            "  target_device: cpu\n",
            "  target_device: cpu\n  env:\n    CFLAGS: \"-O1\"\n",
        ),
    )
    .unwrap();
    let plan = ok(&ob(
        &fx,
        &b,
        &[],
        &["plan", flagged.to_str().unwrap(), "--json"],
    ));
    let flagged_key = plan["keys"]["wheel"].as_str().expect("a wheel key");
    assert_ne!(flagged_key, key_b, "{plan}");

    // A online again: its mirror is refreshed, so it rebuilds with the new
    // tag under B's key; CPPFLAGS/LDFLAGS of its user's environment are
    // removed (named in build.json) and the wheel is B's, byte for byte.
    let built_a2 = ok(&ob(
        &fx,
        &a,
        &[
            ("CPPFLAGS", "-O0 -DFIXTURE_LEAK"),
            ("LDFLAGS", "-Wl,--build-id=none"),
            ("CFLAGS", "-O0"),
        ],
        &["build", r, "--json", "--no-substitute"],
    ));
    assert_eq!(built_a2["keys"]["wheel"], key_b.as_str(), "{built_a2}");
    assert!(
        built_a2["built"].to_string().contains("wheel"),
        "{built_a2}"
    );
    let rec_a2 = wheel_record(&a, &key_b);
    assert_eq!(rec_a2["sha256"], rec_b["sha256"], "{rec_a2}\n{rec_b}");
    let scrubbed = rec_a2["scrubbed_env"].to_string();
    for var in ["CPPFLAGS", "LDFLAGS", "CFLAGS"] {
        assert!(scrubbed.contains(var), "{var}: {scrubbed}");
    }
    assert!(!rec_a2.to_string().contains("FIXTURE_LEAK"), "{rec_a2}");

    // Box C: its own v0.1.0 names another commit; the bundle's would move
    // it: refused, nothing written.
    let c = fx.dir().join("store-c");
    configure(&c, &url, None, &allowed, 1);
    let early = fx.recipe("fx-first", &repo, &first, SMOKE);
    ok(&ob(
        &fx,
        &c,
        &[],
        &["fetch", early.to_str().unwrap(), "--json"],
    ));
    let mirror_c = only_entry(&c.join("store/git"));
    git(&mirror_c, &["update-ref", "-d", "refs/heads/main"]);
    git(&mirror_c, &["tag", "-d", "v0.2.0"]);
    git(&mirror_c, &["reflog", "expire", "--expire=now", "--all"]);
    git(&mirror_c, &["gc", "--quiet", "--prune=now"]);
    let other = git(
        &mirror_c,
        &[
            "commit-tree",
            &format!("{first}^{{tree}}"),
            "-p",
            &first,
            "-m",
            "moved",
        ],
    );
    git(&mirror_c, &["tag", "-f", "v0.1.0", &other]);
    let (refs_before, entries_before) = (refs(&mirror_c), names(&c.join("store/lockfiles")));
    let out = ob(&fx, &c, &[], &["pull", r]);
    assert_ne!(code(&out), 0, "{}", text(&out));
    let msg = text(&out);
    for want in [
        "tag v0.1.0",
        other.as_str(),
        first.as_str(),
        "nothing was written",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    assert_eq!(refs(&mirror_c), refs_before);
    assert_eq!(names(&c.join("store/lockfiles")), entries_before);
    assert!(names(&c.join("store/wheels")).is_empty());

    // Box D pulls (the bundle A pushed before the tag): A's signed lock is
    // taken and the stale wheel is its history's own; the offline build
    // gives no fork-only warning and says the check was not made.
    let d = fx.dir().join("store-d");
    configure(&d, &url, None, &allowed, 1);
    let pulled = ok(&ob(&fx, &d, &[], &["pull", r, "--json"]));
    assert!(
        pulled["added"].to_string().contains("lockfiles/"),
        "{pulled}"
    );
    assert_eq!(pulled["refused"], serde_json::json!([]), "{pulled}");
    let plan = ok(&ob(&fx, &d, &[], &["plan", r, "--json", "--offline"]));
    assert!(
        plan["not_checked"].to_string().contains("fork-only check"),
        "{plan}"
    );
    let out = ob(&fx, &d, &[], &["build", r, "--offline", "--json"]);
    let built_d = ok(&out);
    assert!(!text(&out).contains("fork-only commit"), "{}", text(&out));
    assert_eq!(built_d["warnings"], serde_json::json!([]), "{built_d}");
    assert_eq!(built_d["keys"]["wheel"], stale_key.as_str(), "{built_d}");
    let out = ob(&fx, &d, &[], &["verify", r]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("not checked (recorded at build)"),
        "{}",
        text(&out)
    );

    // Box I imports A's bundle: the stale wheel is its history's own, and
    // the offline build gives no fork-only warning either.
    let i = fx.dir().join("store-i");
    let imported = ok(&ob(
        &fx,
        &i,
        &[],
        &["import", bundle.to_str().unwrap(), "--json"],
    ));
    assert!(
        imported["added"].to_string().contains(&stale_key),
        "{imported}"
    );
    // I's store names no cache, so no trusted_signers: taken, unjudged.
    assert!(
        imported["lock_trust"]
            .as_str()
            .is_some_and(|t| t.starts_with("not checked")),
        "{imported}"
    );
    let out = ob(&fx, &i, &[], &["build", r, "--offline", "--json"]);
    let built_i = ok(&out);
    assert!(!text(&out).contains("fork-only commit"), "{}", text(&out));
    assert_eq!(built_i["warnings"], serde_json::json!([]), "{built_i}");
    assert!(!built_i["built"].to_string().contains("wheel"), "{built_i}");

    // The next online fetch makes the check: the commit is on `main`.
    let fetched = ok(&ob(&fx, &d, &[], &["fetch", r, "--json"]));
    assert_eq!(fetched["warnings"], serde_json::json!([]), "{fetched}");
    assert_eq!(fetched["not_checked"], serde_json::json!([]), "{fetched}");
    let plan = ok(&ob(&fx, &d, &[], &["plan", r, "--json", "--offline"]));
    assert_eq!(plan["not_checked"], serde_json::json!([]), "{plan}");

    // A hand-edited store lock whose signature no longer matches, or
    // that carries none, is refused: the box resolves its own.
    for strip in [false, true] {
        edit_lock(&layout, strip);
        let ls = ok(&ob(&fx, &a, &[], &["cache", "ls", "--json"]));
        let row = lock_row(&ls);
        assert_eq!(row["lock"]["verdict"]["verdict"], "untrusted", "{row}");
        let e = fx.dir().join(format!("store-e{strip}"));
        configure(&e, &url, None, &allowed, 1);
        let pulled = ok(&ob(&fx, &e, &[], &["pull", r, "--json"]));
        assert!(
            pulled["refused"].to_string().contains("not trusted"),
            "{pulled}"
        );
        assert!(names(&e.join("store/lockfiles")).is_empty(), "{pulled}");
        // Without a lock, the box cannot build offline: said, and the hint
        // is a build that may resolve one.
        assert!(
            pulled["notes"]
                .to_string()
                .contains("`build --offline` would miss: --offline: lock stage"),
            "{pulled}"
        );
        let shown = text(&ob(&fx, &e, &[], &["pull", r]));
        let hint = shown
            .lines()
            .find(|l| l.contains("build it here with: oracle-build build"))
            .unwrap_or_else(|| panic!("no hint: {shown}"));
        assert!(!hint.contains("--offline"), "{shown}");
    }
    let out = ob(&fx, &a, &[], &["cache", "ls"]);
    assert!(text(&out).contains("untrusted"), "{}", text(&out));

    // Through a registry: A (now at 0.2.0) pushes its signed store lock
    // and wheel; box J takes both, and its history agrees with the wheel's.
    let reg = Registry::start(None);
    let reg_url = reg.url("team/oracles");
    let docker = reg.docker_config.display().to_string();
    let env = [("DOCKER_CONFIG", docker.as_str())];
    configure(&a, &reg_url, Some(&key), &allowed, 1);
    ok(&ob(&fx, &a, &env, &["push", r, "--json"]));
    let j = fx.dir().join("store-j");
    configure(&j, &reg_url, None, &allowed, 1);
    let ls = ok(&ob(&fx, &j, &env, &["cache", "ls", "--json"]));
    assert_eq!(
        lock_row(&ls)["lock"]["verdict"]["verdict"],
        "trusted",
        "{ls}"
    );
    let pulled = ok(&ob(&fx, &j, &env, &["pull", r, "--json"]));
    assert_eq!(pulled["refused"], serde_json::json!([]), "{pulled}");
    let added = pulled["added"].to_string();
    assert!(added.contains("lockfiles/"), "{pulled}");
    assert!(added.contains(&format!("wheels/{key_b}")), "{pulled}");

    // Box I's oracle (from A's bundle, built offline) says the fork-only
    // check was not made. Upstream now reaches the commit by no branch or
    // tag: I's next online build, a no-op, makes the check against the
    // branches it fetched, and warns.
    let out = ob(&fx, &i, &[], &["verify", r]);
    assert!(text(&out).contains("not checked"), "{}", text(&out));
    let branch = git(&repo, &["symbolic-ref", "HEAD"]);
    git(&repo, &["update-ref", &branch, &first]);
    git(&repo, &["tag", "-d", "v0.2.0"]);
    let noop = ok(&ob(&fx, &i, &[], &["build", r, "--json"]));
    assert_eq!(noop["built"], serde_json::json!([]), "{noop}");
    let warned = noop["warnings"].to_string();
    assert!(warned.contains("fork-only commit"), "{noop}");
    assert!(warned.contains(&head), "{noop}");
    let out = ob(&fx, &i, &[], &["verify", r]);
    assert!(!text(&out).contains("not checked"), "{}", text(&out));
    assert!(text(&out).contains("fork-only commit"), "{}", text(&out));
}
