//! A store's cache policy holds against what a user or a bare box can do
//! (issue 41, items 4 and 7), with the real binary and a real
//! `docker-registry` on 127.0.0.1:
//!
//! - a user's `config.toml` that spells the store's registry another way
//!   (`localhost`, `127.1`, `[::ffff:127.0.0.1]`, another scheme on the same
//!   port) with `min_signatures = 1` is bound to the store's entry and its
//!   `min_signatures = 2`: a once-signed wheel is still refused;
//! - `cache gc` from a store with no roots (a fresh box whose pull failed)
//!   refuses (exit 2) and deletes nothing; `--dry-run` says what each root
//!   keeps; `--allow-empty-roots` deletes.

use crate::cache::{REPO, built_and_pushed, configure, entries, ob, ok};
use crate::registry::Registry;
use crate::support::*;

#[test]
fn a_user_entry_spelling_the_store_registry_another_way_keeps_the_store_policy() {
    let reg = Registry::start(None);
    let url = reg.url(REPO);
    // A built and pushed; its wheel has one signature (A's).
    let (fx, recipe, _, allowed) = built_and_pushed(&url, None);
    let r = recipe.to_str().unwrap();
    let s = fx.dir().join("store-strict");
    configure(&s, &url, None, Some(&allowed), 2);
    let user = fx.dir().join("xdg/oracle-build");
    std::fs::create_dir_all(&user).unwrap();
    let port = reg.port;
    for spelling in [
        format!("oci+http://localhost:{port}/{REPO}"),
        format!("OCI+HTTP://LocalHost.:{port}/{REPO}/"),
        format!("oci+http://127.1:{port}/{REPO}"),
        format!("oci+http://[::ffff:127.0.0.1]:{port}/{REPO}"),
    ] {
        std::fs::write(
            user.join("config.toml"),
            format!(
                "[[cache]]\nname = \"quick\"\nurl = \"{spelling}\"\nmin_signatures = 1\ntrusted_signers = \"{}\"\n",
                allowed.display()
            ),
        )
        .unwrap();
        // One cache, the store's, printed by its normalised identity.
        let ls = ok(&ob(&fx, &s, None, "s@test", &["cache", "ls", "--json"]));
        let caches = ls["caches"].as_array().unwrap();
        assert_eq!(caches.len(), 1, "{spelling}: {ls}");
        assert_eq!(caches[0]["name"], "team", "{spelling}: {ls}");
        assert_eq!(
            caches[0]["identity"],
            format!("registry localhost:{port}/{REPO}").as_str(),
            "{spelling}: {ls}"
        );
        let out = ob(&fx, &s, None, "s@test", &["cache", "ls"]);
        assert!(
            text(&out).contains(&format!("cache team (registry localhost:{port}/{REPO}): ")),
            "{spelling}: {}",
            text(&out)
        );
        // Every way of reaching it reads it with min_signatures = 2.
        for args in [
            vec!["pull", r],
            vec!["pull", r, "--cache", "quick"],
            vec!["pull", r, "--cache", spelling.as_str()],
        ] {
            let out = ob(&fx, &s, None, "s@test", &args);
            assert_ne!(code(&out), 0, "{spelling} {args:?}: {}", text(&out));
            assert!(
                text(&out).contains("min_signatures is 2"),
                "{spelling} {args:?}: {}",
                text(&out)
            );
            assert!(
                !entries(&s).iter().any(|e| e.starts_with("wheels/")),
                "{spelling} {args:?}: {:?}",
                entries(&s)
            );
        }
    }
    // Another port is another registry: the user's own cache, its own
    // policy (nothing listens there, so `cache ls` fails naming it).
    std::fs::write(
        user.join("config.toml"),
        "[[cache]]\nname = \"quick\"\nurl = \"oci+http://localhost:1/team/oracles\"\nmin_signatures = 1\nconnect_timeout = \"1s\"\n",
    )
    .unwrap();
    let out = ob(
        &fx,
        &s,
        None,
        "s@test",
        &["cache", "ls", "--cache", "quick"],
    );
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("oci+http://localhost:1/team/oracles"),
        "{}",
        text(&out)
    );
}

#[test]
fn cache_gc_from_a_store_without_roots_refuses_unless_told() {
    let reg = Registry::start(None);
    let url = reg.url(REPO);
    let (fx, recipe, _, _) = built_and_pushed(&url, None);
    let r = recipe.to_str().unwrap();
    let a = fx.dir().join("store-a");
    let tags = reg.tags(REPO);
    assert!(tags.len() > 5, "{tags:?}");

    // A fresh box whose pull failed (it trusts another key): a store with
    // the team's config and no roots.
    let (_, stranger) = keypair(fx.dir(), "stranger@test");
    let other = fx.dir().join("other_signers");
    std::fs::write(&other, stranger).unwrap();
    let c = fx.dir().join("store-c");
    configure(&c, &url, None, Some(&other), 1);
    let out = ob(&fx, &c, None, "c@test", &["pull", r]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(c.join("store").is_dir() && c.join("roots").is_dir());
    assert_eq!(
        std::fs::read_dir(c.join("roots")).unwrap().count(),
        0,
        "no roots"
    );

    let out = ob(&fx, &c, None, "c@test", &["cache", "gc"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    for want in [
        "refusing to delete every tag of cache `team`",
        &format!("{} tag(s)", tags.len()),
        "has no roots",
        "nothing was deleted",
        "--allow-empty-roots",
    ] {
        assert!(text(&out).contains(want), "{want}: {}", text(&out));
    }
    assert_eq!(reg.tags(REPO), tags, "the refused gc deleted nothing");
    // A root that reaches nothing of the cache keeps nothing either.
    std::os::unix::fs::symlink(fx.dir().join("gone"), c.join("roots/stale")).unwrap();
    let out = ob(&fx, &c, None, "c@test", &["cache", "gc", "--json"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("none of the store") && text(&out).contains("1 root(s) (stale)"),
        "{}",
        text(&out)
    );
    assert_eq!(reg.tags(REPO), tags);
    // A dry run lists what would go and says a real run refuses.
    let out = ob(&fx, &c, None, "c@test", &["cache", "gc", "--dry-run"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("root stale keeps 0 tag(s)")
            && text(&out).contains("refuses to delete every tag")
            && text(&out).contains("--allow-empty-roots"),
        "{}",
        text(&out)
    );
    assert_eq!(reg.tags(REPO), tags);

    // A's dry run lists what its root keeps: every tag.
    let out = ob(&fx, &a, None, "a@test", &["cache", "gc", "--dry-run"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains(&format!("root fx keeps {} tag(s)", tags.len())),
        "{}",
        text(&out)
    );
    for t in &tags {
        assert!(
            text(&out).contains(&format!("  {t}\n")),
            "{t}: {}",
            text(&out)
        );
    }
    let g = ok(&ob(
        &fx,
        &a,
        None,
        "a@test",
        &["cache", "gc", "--dry-run", "--json"],
    ));
    let kept_by = &g["caches"][0]["kept_by"];
    assert_eq!(kept_by[0]["root"], "fx", "{g}");
    assert_eq!(
        kept_by[0]["tags"].as_array().unwrap().len(),
        tags.len(),
        "{g}"
    );
    assert_eq!(g["caches"][0]["empty_roots"], false, "{g}");

    // Told, C's gc deletes every tag.
    let g = ok(&ob(
        &fx,
        &c,
        None,
        "c@test",
        &["cache", "gc", "--allow-empty-roots", "--json"],
    ));
    assert_eq!(
        g["caches"][0]["deleted"].as_array().unwrap().len(),
        tags.len(),
        "{g}"
    );
    assert!(reg.tags(REPO).is_empty(), "{:?}", reg.tags(REPO));
}
