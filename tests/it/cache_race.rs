//! The append-only cache under concurrency (issue 23), against a real
//! `docker-registry` on 127.0.0.1 ([`crate::registry`], deletes enabled):
//! two builders (two stores at different paths, two signing keys) push at
//! the same moment, 8 rounds each into a fresh repository, for one
//! reproducible wheel (both signatures kept) and for two different wheels
//! of one key (the failure visible to `pull`, `cache ls` and `cache
//! verify`, no reader trusting either); a re-push changes no manifest;
//! `cache gc` deletes through the registry API; `push = "auto"` pushes
//! after a build and reports a failed push without failing the build.
//!
//! One fixture build serves every assertion: the other builders are copies
//! of its store with another `build.json` (box B: the same wheel) or
//! another wheel (box C).

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::cache::{configure, entries, ob, ok, rebuild_differently, strs};
use crate::registry::Registry;
use crate::support::*;
use serde_json::Value;

const ROUNDS: usize = 8;

/// Gives the wheel entry `dir` another box's evidence: `build.json`'s
/// `started` and `duration_s` changed (the wheel's bytes kept), and its
/// `manifest.json` to match.
fn restamp(dir: &Path) {
    let script = r#"
import hashlib, json, os, sys
d = sys.argv[1]
for root, dirs, files in os.walk(d):
    os.chmod(root, 0o755)
    for f in files:
        os.chmod(os.path.join(root, f), 0o644)
b = json.load(open(os.path.join(d, "build.json")))
b["started"] = "2026-11-30T08:00:00.5Z"; b["duration_s"] = 1234.5
open(os.path.join(d, "build.json"), "w").write(json.dumps(b, indent=2))
m = json.load(open(os.path.join(d, "manifest.json")))
for f in m["files"]:
    p = os.path.join(d, f["path"])
    f["sha256"] = hashlib.sha256(open(p, "rb").read()).hexdigest(); f["size"] = os.path.getsize(p)
open(os.path.join(d, "manifest.json"), "w").write(json.dumps(m, indent=2))
"#;
    succeeds(Command::new("python3").arg("-c").arg(script).arg(dir));
}

/// Gives every bytecode entry under `pool` (a store's `store/pyc/`) the
/// directory times another box's compile would have left in its
/// `manifest.json` (the `.pyc` bytes kept): what a second builder of the
/// same wheel pushes.
fn restamp_bytecode(pool: &Path) {
    let script = r#"
import json, os, sys
pool = sys.argv[1]
for e in os.listdir(pool):
    d = os.path.join(pool, e)
    os.chmod(d, 0o755)
    p = os.path.join(d, "manifest.json")
    os.chmod(p, 0o644)
    m = json.load(open(p))
    assert m["dirs"], p
    for x in m["dirs"]:
        x["mtime_ns"] += 7_000_000_000
    open(p, "w").write(json.dumps(m, indent=2))
"#;
    succeeds(Command::new("python3").arg("-c").arg(script).arg(pool));
}

/// `cp -a from to`.
fn copy_store(from: &Path, to: &Path) {
    succeeds(Command::new("cp").arg("-a").arg(from).arg(to));
}

/// Every builder in `builders` (store, principal, signing key) pushes the
/// pin to `url` at the same moment; their outputs, in order.
fn push_at_once(
    fx: &Fx,
    recipe: &str,
    url: &str,
    builders: &[(&Path, &str, &Path)],
) -> Vec<Output> {
    let kids: Vec<_> = builders
        .iter()
        .map(|(store, principal, key)| {
            configure(store, url, Some(key), None, 1);
            fx.cmd_at(store, &["push", recipe, "--json"])
                .env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
                .env("HOME", fx.dir())
                .env("ORACLE_BUILD_BUILDER", principal)
                .env("DOCKER_CONFIG", fx.dir().join("no-docker-config"))
                .env_remove("REGISTRY_AUTH_FILE")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("oracle-build runs")
        })
        .collect();
    kids.into_iter()
        .map(|k| k.wait_with_output().unwrap())
        .collect()
}

/// The artifacts of kind `kind` in a `cache ls|verify --json` document.
fn of_kind(doc: &Value, kind: &str) -> Vec<Value> {
    doc["caches"][0]["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["kind"] == kind)
        .cloned()
        .collect()
}

/// The wheel sha256 prefix a wheel tag quotes (`wheel-<key>-<sha>-<manifest>`).
fn quoted_sha(tag: &str) -> String {
    tag.split('-').nth(2).unwrap_or_default().to_string()
}

fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn concurrent_pushes_keep_every_signature_and_every_wheel_is_seen() {
    let reg = Registry::start(None);
    let fx = Fx::new();
    let (_repo, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let (key_a, line_a) = keypair(fx.dir(), "builder-a@test");
    let (key_b, line_b) = keypair(fx.dir(), "builder-b@test");
    let allowed = fx.dir().join("allowed_signers");
    std::fs::write(&allowed, format!("{line_a}{line_b}")).unwrap();

    // push = "auto": the build pushes to the registry; a cache that is down
    // is reported, and the build stands.
    let a = fx.dir().join("store-a");
    std::fs::create_dir_all(&a).unwrap();
    let down = format!("oci+http://127.0.0.1:{}/team/down", closed_port());
    std::fs::write(
        a.join("config.toml"),
        format!(
            "[[cache]]\nname = \"team\"\nurl = \"{}\"\npush = \"auto\"\nsubstitute = false\nsigning_key = \"{}\"\n\n[[cache]]\nname = \"down\"\nurl = \"{down}\"\npush = \"auto\"\nsubstitute = false\n",
            reg.url("auto/a"),
            key_a.display()
        ),
    )
    .unwrap();
    let built = ok(&ob(
        &fx,
        &a,
        None,
        "builder-a@test",
        &["build", r, "--json"],
    ));
    assert!(
        strs(&built["built"]).contains(&"wheel".to_string()),
        "{built}"
    );
    let wheel_key = built["keys"]["wheel"].as_str().unwrap().to_string();
    let pushed = built["pushed"]
        .as_array()
        .unwrap_or_else(|| panic!("{built}"));
    assert_eq!(pushed.len(), 2, "{built}");
    assert_eq!(pushed[0]["error"], Value::Null, "{built}");
    assert!(pushed[0]["uploaded"].as_u64().unwrap() > 0, "{built}");
    assert!(
        pushed[1]["error"].as_str().unwrap().contains("127.0.0.1"),
        "{built}"
    );
    let auto_tags = reg.tags("auto/a");
    for prefix in ["src-", "lock-", "wheelhouse-", "inputs-"]
        .map(String::from)
        .into_iter()
        .chain([
            format!("wheel-{wheel_key}-"),
            format!("att-wheel-{wheel_key}-"),
            "att-lock-".to_string(),
        ])
    {
        assert!(
            auto_tags.iter().any(|t| t.starts_with(&prefix)),
            "{prefix}: {auto_tags:?}"
        );
    }
    // A build that builds no wheel pushes nothing.
    let again = ok(&ob(
        &fx,
        &a,
        None,
        "builder-a@test",
        &["build", r, "--json"],
    ));
    assert!(again.get("pushed").is_none(), "{again}");

    // Box B: the same wheel, its own build.json and key; box C: another
    // wheel for the same key.
    let b = fx.dir().join("store-b");
    copy_store(&a, &b);
    restamp(&b.join("store/wheels").join(&wheel_key));
    restamp_bytecode(&b.join("store/pyc"));
    let c = fx.dir().join("store-c");
    copy_store(&a, &c);
    rebuild_differently(&c.join("store/wheels").join(&wheel_key));

    // One reproducible wheel, pushed by A and B at once: both signatures
    // stay every round, and under min_signatures = 2 it reads trusted.
    let reader = fx.dir().join("store-reader");
    let mut same_exit_zero = 0;
    for round in 0..ROUNDS {
        let repo = format!("race/same-{round}");
        let url = reg.url(&repo);
        let outs = push_at_once(
            &fx,
            r,
            &url,
            &[
                (&a, "builder-a@test", &key_a),
                (&b, "builder-b@test", &key_b),
            ],
        );
        for o in &outs {
            assert_eq!(code(o), 0, "round {round}: {}", text(o));
        }
        same_exit_zero += 1;
        configure(&reader, &url, None, Some(&allowed), 2);
        let doc = ok(&ob(
            &fx,
            &reader,
            None,
            "r@test",
            &["cache", "ls", "--json"],
        ));
        // Each box signs the wheel, the store lock and the source's tags,
        // each signature its own artifact: all six stay.
        let atts = of_kind(&doc, "attestation");
        for what in ["wheel", "lock", "tags"] {
            let n = atts
                .iter()
                .filter(|a| {
                    a["signs"]
                        .as_str()
                        .unwrap()
                        .starts_with(&format!("signs {what} "))
                })
                .count();
            assert_eq!(n, 2, "round {round}: {what}: {doc}");
        }
        // And each box signs each wheel's bytecode (one entry per wheel
        // and Python; each box's artifact carries its own manifest): two
        // signatures on every entry.
        let mut pyc: Vec<String> = of_kind(&doc, "bytecode")
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect();
        pyc.sort();
        pyc.dedup();
        assert!(!pyc.is_empty(), "round {round}: {doc}");
        let pyc_atts = atts
            .iter()
            .filter(|a| a["signs"].as_str().unwrap().starts_with("signs bytecode "))
            .count();
        assert_eq!(pyc_atts, 2 * pyc.len(), "round {round}: {doc}");
        // The wheel, the store lock and the source's tags, by each box.
        assert_eq!(atts.len(), 6 + pyc_atts, "round {round}: {doc}");
        let locks = of_kind(&doc, "lock");
        assert_eq!(locks.len(), 1, "round {round}: {doc}");
        assert_eq!(
            locks[0]["lock"]["verdict"]["signers"]
                .as_array()
                .map(Vec::len),
            Some(2),
            "round {round}: {doc}"
        );
        let wheels = of_kind(&doc, "wheel");
        assert_eq!(
            wheels.len(),
            2,
            "round {round}: two evidence variants: {doc}"
        );
        for w in &wheels {
            assert_eq!(w["verdict"]["verdict"], "trusted", "round {round}: {w}");
            assert_eq!(
                w["verdict"]["signers"].as_array().unwrap().len(),
                2,
                "round {round}: {w}"
            );
        }
    }
    // The reader pulls it, trusted by two signatures.
    let url0 = reg.url("race/same-0");
    configure(&reader, &url0, None, Some(&allowed), 2);
    let pulled = ok(&ob(&fx, &reader, None, "r@test", &["pull", r, "--json"]));
    assert!(
        strs(&pulled["added"]).contains(&format!("wheels/{wheel_key}")),
        "{pulled}"
    );
    // Its bytecode too: the two boxes' manifests differ in directory times
    // only, and both signatures vouch for the same content.
    assert_eq!(strs(&pulled["refused"]), Vec::<String>::new(), "{pulled}");
    assert!(
        strs(&pulled["added"]).iter().any(|a| a.starts_with("pyc/")),
        "{pulled}"
    );

    // Re-pushing from the same box changes nothing, a second later too
    // (the statement carries the build's time): same tags, each naming the
    // one manifest it always named.
    let before = reg.tags("race/same-0");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    configure(&a, &url0, Some(&key_a), None, 1);
    let re = ok(&ob(&fx, &a, None, "builder-a@test", &["push", r, "--json"]));
    for x in re[0]["artifacts"].as_array().unwrap() {
        assert_eq!(x["state"], "present", "{re}");
    }
    assert_eq!(reg.tags("race/same-0"), before);
    for t in &before {
        assert_eq!(reg.tag_revisions("race/same-0", t), 1, "{t}");
    }

    // Two different wheels for one key, pushed by A and C at once: every
    // round, both are in the cache, every reader sees the failure and none
    // trusts either.
    let mut diff_exit_zero = 0;
    let mut diff_push_failed = 0;
    for round in 0..ROUNDS {
        let repo = format!("race/diff-{round}");
        let url = reg.url(&repo);
        let outs = push_at_once(
            &fx,
            r,
            &url,
            &[
                (&a, "builder-a@test", &key_a),
                (&c, "builder-b@test", &key_b),
            ],
        );
        let failed = outs.iter().filter(|o| code(o) != 0).count();
        for o in outs.iter().filter(|o| code(o) != 0) {
            assert!(
                text(o).contains("reproducibility failure"),
                "round {round}: {}",
                text(o)
            );
        }
        assert!(failed >= 1, "round {round}: no push saw the other wheel");
        diff_push_failed += failed;
        diff_exit_zero += 2 - failed;
        let rr = fx.dir().join(format!("store-diff-{round}"));
        configure(&rr, &url, None, Some(&allowed), 1);
        let doc = ok(&ob(&fx, &rr, None, "r@test", &["cache", "ls", "--json"]));
        let wheels = of_kind(&doc, "wheel");
        let mut shas: Vec<String> = wheels
            .iter()
            .map(|w| quoted_sha(w["tag"].as_str().unwrap()))
            .collect();
        shas.dedup();
        assert_eq!(shas.len(), 2, "round {round}: {doc}");
        for w in &wheels {
            assert_eq!(
                w["verdict"]["verdict"], "reproducibility",
                "round {round}: {w}"
            );
        }
        let out = ob(&fx, &rr, None, "r@test", &["cache", "verify"]);
        assert_eq!(code(&out), 1, "round {round}: {}", text(&out));
        assert!(
            text(&out).contains("reproducibility failure"),
            "round {round}: {}",
            text(&out)
        );
        let out = ob(&fx, &rr, None, "r@test", &["pull", r]);
        assert_eq!(code(&out), 1, "round {round}: {}", text(&out));
        assert!(
            text(&out).contains("reproducibility failure"),
            "round {round}: {}",
            text(&out)
        );
        assert!(entries(&rr).is_empty(), "round {round}: {:?}", entries(&rr));
    }
    // `build` takes the pinned inputs from such a cache but not the wheel:
    // it says why and builds its own.
    let sub = fx.dir().join("store-sub");
    configure(&sub, &reg.url("race/diff-0"), None, Some(&allowed), 1);
    let out = ob(&fx, &sub, None, "s@test", &["build", r, "--json"]);
    let doc = ok(&out);
    assert!(
        strs(&doc["substituted"]).contains(&"source".to_string()),
        "{doc}"
    );
    assert!(
        !strs(&doc["substituted"]).contains(&"wheel".to_string()),
        "{doc}"
    );
    assert!(strs(&doc["built"]).contains(&"wheel".to_string()), "{doc}");
    assert!(
        text(&out).contains("reproducibility failure"),
        "{}",
        text(&out)
    );
    eprintln!(
        "races: {ROUNDS} rounds of one wheel by 2 builders: both signatures kept in {ROUNDS}, both pushes exited 0 in {same_exit_zero}; {ROUNDS} rounds of 2 wheels: failure seen by ls, verify and pull in {ROUNDS}, pushes that failed {diff_push_failed}, exited 0 {diff_exit_zero}"
    );

    // cache gc from the reader, a box that only pulled the pin (its
    // `imported-` root, no oracle): the pin's inputs stay with the entries
    // it keeps, so other boxes can still pull it.
    let g = ok(&ob(
        &fx,
        &reader,
        None,
        "r@test",
        &["cache", "gc", "--cache", &url0, "--dry-run", "--json"],
    ));
    let gone = strs(&g["caches"][0]["deleted"]);
    assert!(
        !gone
            .iter()
            .any(|t| t.starts_with("inputs-") || t.starts_with("wheel-")),
        "{g}"
    );

    // cache gc through the registry API: A's root keeps every tag; without
    // it every tag goes (DELETE /v2/<name>/manifests/<digest>).
    let tags = reg.tags("race/same-0");
    let g = ok(&ob(
        &fx,
        &a,
        None,
        "a@test",
        &["cache", "gc", "--cache", &url0, "--json"],
    ));
    assert_eq!(g["caches"][0]["deleted"], serde_json::json!([]), "{g}");
    assert_eq!(
        g["caches"][0]["kept"].as_array().unwrap().len(),
        tags.len(),
        "{g}"
    );
    let out = ob(&fx, &a, None, "a@test", &["unkeep", r]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let g = ok(&ob(
        &fx,
        &a,
        None,
        "a@test",
        &["cache", "gc", "--cache", &url0, "--dry-run", "--json"],
    ));
    assert_eq!(
        g["caches"][0]["deleted"].as_array().unwrap().len(),
        tags.len(),
        "{g}"
    );
    assert_eq!(reg.tags("race/same-0"), tags, "a dry run deletes nothing");
    // A roots nothing any more: emptying the cache takes the flag.
    let g = ok(&ob(
        &fx,
        &a,
        None,
        "a@test",
        &[
            "cache",
            "gc",
            "--cache",
            &url0,
            "--allow-empty-roots",
            "--json",
        ],
    ));
    assert_eq!(
        g["caches"][0]["deleted"].as_array().unwrap().len(),
        tags.len(),
        "{g}"
    );
    assert!(
        reg.tags("race/same-0").is_empty(),
        "{:?}",
        reg.tags("race/same-0")
    );
    let doc = ok(&ob(
        &fx,
        &a,
        None,
        "a@test",
        &["cache", "ls", "--cache", &url0, "--json"],
    ));
    assert_eq!(
        doc["caches"][0]["artifacts"],
        serde_json::json!([]),
        "{doc}"
    );
}
