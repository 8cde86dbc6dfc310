//! Issue 41, item 1: tags are evidence, not payload. Three stores share a
//! real registry: A (trusted) pushes a signed source, E (an untrusted
//! pusher with write access) pushes a source whose mirror holds a tag
//! `v0.5.0` on the pinned commit, and fresh boxes take them through `build`'s
//! substitution, `pull` and `import`. E's tag never becomes a tag of the
//! receiving mirror, so it never gives the pin a version; A's signed tags do.

use std::path::Path;

use crate::cache::{configure, ob, ok, strs};
use crate::registry::Registry;
use crate::support::*;

/// The refs of the store's mirror (the only repository under `store/git/`).
fn mirror_refs(store: &Path) -> Vec<String> {
    let mirror = only_entry(&store.join("store").join("git"));
    git(&mirror, &["for-each-ref", "--format=%(refname)"])
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_tag_from_an_untrusted_source_never_gives_the_pin_a_version() {
    let reg = Registry::start(None);
    let fx = Fx::new();
    let (repo, commit, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let (key_a, line_a) = keypair(fx.dir(), "builder-a@test");
    let (key_e, line_e) = keypair(fx.dir(), "builder-e@test");
    let allowed = fx.dir().join("allowed_signers");
    std::fs::write(&allowed, &line_a).unwrap();
    // E trusts itself: its own pushes raise no warning.
    let allowed_e = fx.dir().join("allowed_signers_e");
    std::fs::write(&allowed_e, &line_e).unwrap();
    let team = reg.url("team/oracles");
    let evil = reg.url("team/evil");

    // A builds and pushes: its source's tags are signed.
    let a = fx.dir().join("store-a");
    configure(&a, &team, Some(&key_a), Some(&allowed), 1);
    let built_a = ok(&ob(
        &fx,
        &a,
        None,
        "builder-a@test",
        &["build", r, "--json"],
    ));
    let honest = built_a["runtime_version"].as_str().unwrap().to_string();
    assert!(honest.starts_with("0.1.1.dev1+g"), "{built_a}");
    let pushed = ok(&ob(&fx, &a, None, "builder-a@test", &["push", r, "--json"]));
    let tags: Vec<String> = pushed[0]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["tag"].as_str().unwrap().to_string())
        .collect();
    assert!(
        tags.iter().any(|t| t.starts_with("att-tags-")),
        "the source's tags are signed: {pushed}"
    );

    // E builds, then adds a tag on the pinned commit in its own mirror,
    // and pushes (its source bundle carries the tag) and exports.
    let e = fx.dir().join("store-e");
    configure(&e, &evil, Some(&key_e), Some(&allowed_e), 1);
    ok(&ob(
        &fx,
        &e,
        None,
        "builder-e@test",
        &["build", r, "--json"],
    ));
    let e_mirror = only_entry(&e.join("store").join("git"));
    git(&e_mirror, &["tag", "v0.5.0", &commit]);
    ok(&ob(&fx, &e, None, "builder-e@test", &["push", r, "--json"]));
    let e_bundle = fx.dir().join("e.tar.gz");
    ok(&ob(
        &fx,
        &e,
        None,
        "builder-e@test",
        &["export", r, "-o", e_bundle.to_str().unwrap(), "--json"],
    ));
    let a_bundle = fx.dir().join("a.tar.gz");
    ok(&ob(
        &fx,
        &a,
        None,
        "builder-a@test",
        &["export", r, "-o", a_bundle.to_str().unwrap(), "--json"],
    ));

    // `cache ls` labels each source by how its tags are trusted here.
    let ls = |cache: &str| {
        let c = fx.dir().join("store-ls");
        configure(&c, cache, None, Some(&allowed), 1);
        let out = ob(&fx, &c, None, "builder-c@test", &["cache", "ls"]);
        let shown = text(&out);
        assert_eq!(code(&out), 0, "{shown}");
        shown
            .lines()
            .find(|l| l.trim_start().starts_with("src-"))
            .unwrap_or_else(|| panic!("no source listed: {shown}"))
            .to_string()
    };
    let line = ls(&team);
    assert!(
        line.contains("tag(s) trusted: signed by builder-a@test"),
        "{line}"
    );
    let line = ls(&evil);
    assert!(
        line.contains("unconfirmed, not used for versions"),
        "{line}"
    );

    // The repository is gone: sources come from the cache or a bundle.
    force_remove(&repo);

    // C, trusting A only, builds from E's cache: E's source is the only
    // one there. Its tags are kept aside, the version is not 0.5.0, and
    // the build says why.
    let c = fx.dir().join("store-c");
    configure(&c, &evil, None, Some(&allowed), 1);
    let out = ob(&fx, &c, None, "builder-c@test", &["build", r, "--json"]);
    let shown = text(&out);
    assert_eq!(code(&out), 0, "{shown}");
    let built_c = json(&out);
    let version = built_c["runtime_version"].as_str().unwrap();
    assert!(!version.starts_with("0.5.0"), "{version}: {shown}");
    assert!(
        shown.contains("not used for the version"),
        "the build says so: {shown}"
    );
    let refs = mirror_refs(&c);
    assert!(!refs.contains(&"refs/tags/v0.5.0".to_string()), "{refs:?}");
    assert!(
        refs.contains(&"refs/oracle-build/unconfirmed/tags/v0.5.0".to_string()),
        "kept aside as evidence: {refs:?}"
    );
    // `verify` of C's oracle passes (it is what C's history gives), and
    // its version is not E's.
    assert_eq!(
        code(&ob(&fx, &c, None, "builder-c@test", &["verify", r])),
        0
    );

    // D, trusting A, pulls from A's cache: the signed tags are tags, the
    // version is A's, and no wheel is built offline.
    let d = fx.dir().join("store-d");
    configure(&d, &team, None, Some(&allowed), 1);
    let pulled = ok(&ob(&fx, &d, None, "builder-d@test", &["pull", r, "--json"]));
    assert!(
        mirror_refs(&d).contains(&"refs/tags/v0.1.0".to_string()),
        "{pulled}"
    );
    let built_d = ok(&ob(
        &fx,
        &d,
        None,
        "builder-d@test",
        &["build", r, "--offline", "--json"],
    ));
    assert_eq!(built_d["runtime_version"], honest.as_str(), "{built_d}");
    assert!(
        !strs(&built_d["built"]).contains(&"wheel".to_string()),
        "{built_d}"
    );

    // Import: E's bundle into a box trusting A keeps E's tags aside and
    // says so; A's bundle brings its tags as tags.
    let f = fx.dir().join("store-f");
    configure(&f, &team, None, Some(&allowed), 1);
    let imported = ob(
        &fx,
        &f,
        None,
        "builder-f@test",
        &["import", e_bundle.to_str().unwrap()],
    );
    let shown = text(&imported);
    assert_eq!(code(&imported), 0, "{shown}");
    assert!(shown.contains("are not used for versions"), "{shown}");
    let refs = mirror_refs(&f);
    assert!(
        !refs.iter().any(|r| r.starts_with("refs/tags/")),
        "{refs:?}"
    );
    let g = fx.dir().join("store-g");
    configure(&g, &team, None, Some(&allowed), 1);
    ok(&ob(
        &fx,
        &g,
        None,
        "builder-g@test",
        &["import", a_bundle.to_str().unwrap(), "--json"],
    ));
    assert!(mirror_refs(&g).contains(&"refs/tags/v0.1.0".to_string()));
}

/// The mirror's tags follow the repository (issue 41): a tag deleted
/// upstream is dropped from the mirror by the next online build, which
/// says so, and the version no longer comes from it.
#[test]
fn a_tag_deleted_upstream_no_longer_gives_the_version() {
    let fx = Fx::new();
    let (repo, commit, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    git(&repo, &["tag", "v0.2.0", &commit]);
    let first = fx.build_json(fx.store(), &recipe);
    assert_eq!(first["runtime_version"], "0.2.0", "{first}");
    git(&repo, &["tag", "-d", "v0.2.0"]);
    let out = fx.run(&["build", r, "--json"]);
    let shown = text(&out);
    assert_eq!(code(&out), 0, "{shown}");
    assert!(
        shown.contains("tag v0.2.0") && shown.contains("was deleted upstream"),
        "{shown}"
    );
    let again = json(&out);
    let version = again["runtime_version"].as_str().unwrap();
    assert!(version.starts_with("0.1.1.dev1+g"), "{again}");
    assert!(!mirror_refs(fx.store()).contains(&"refs/tags/v0.2.0".to_string()));
}

/// Found breaking it as a new user (issue 42): a box that first imported
/// an untrusted pusher's bundle holds the commit with its tags kept aside.
/// A later `pull` from a cache whose source a trusted builder signed, and a
/// `build` substituting from it, still take that source: its signed tags
/// confirm the ones kept aside, so the trusted wheel is not refused as
/// "another version" and no wheel of the wrong version is built.
#[test]
fn a_trusted_source_confirms_tags_an_untrusted_bundle_left_aside() {
    let reg = Registry::start(None);
    let fx = Fx::new();
    let (repo, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let (key_a, line_a) = keypair(fx.dir(), "builder-a@test");
    let (key_e, _) = keypair(fx.dir(), "builder-e@test");
    let allowed = fx.dir().join("allowed_signers");
    std::fs::write(&allowed, &line_a).unwrap();
    let team = reg.url("team/oracles");

    // A builds and pushes (its source's tags signed); E, untrusted, builds
    // the same pin and exports it (its bundle's tags signed by E only).
    let a = fx.dir().join("store-a");
    configure(&a, &team, Some(&key_a), Some(&allowed), 1);
    let built_a = ok(&ob(
        &fx,
        &a,
        None,
        "builder-a@test",
        &["build", r, "--json"],
    ));
    let honest = built_a["runtime_version"].as_str().unwrap().to_string();
    ok(&ob(&fx, &a, None, "builder-a@test", &["push", r, "--json"]));
    let e = fx.dir().join("store-e");
    configure(&e, &team, Some(&key_e), None, 1);
    ok(&ob(
        &fx,
        &e,
        None,
        "builder-e@test",
        &["build", r, "--json"],
    ));
    let e_bundle = fx.dir().join("e.tar.gz");
    ok(&ob(
        &fx,
        &e,
        None,
        "builder-e@test",
        &["export", r, "-o", e_bundle.to_str().unwrap(), "--json"],
    ));
    force_remove(&repo);

    for how in ["pull", "build"] {
        // B trusts A only, imports E's bundle first: v0.1.0 is kept aside.
        let b = fx.dir().join(format!("store-b-{how}"));
        configure(&b, &team, None, Some(&allowed), 1);
        ok(&ob(
            &fx,
            &b,
            None,
            "builder-b@test",
            &["import", e_bundle.to_str().unwrap(), "--json"],
        ));
        assert!(
            mirror_refs(&b).contains(&"refs/oracle-build/unconfirmed/tags/v0.1.0".to_string()),
            "{:?}",
            mirror_refs(&b)
        );
        if how == "pull" {
            let pulled = ok(&ob(&fx, &b, None, "builder-b@test", &["pull", r, "--json"]));
            assert!(
                strs(&pulled["refused"]).is_empty(),
                "A's trusted wheel is taken: {pulled}"
            );
            assert!(
                mirror_refs(&b).contains(&"refs/tags/v0.1.0".to_string()),
                "A's signed tags confirm the one kept aside: {:?}",
                mirror_refs(&b)
            );
        }
        let out = ob(
            &fx,
            &b,
            None,
            "builder-b@test",
            &["build", r, "--offline", "--json"]
                .into_iter()
                .filter(|a| how == "pull" || *a != "--offline")
                .collect::<Vec<_>>(),
        );
        let built_b = ok(&out);
        assert_eq!(
            built_b["runtime_version"],
            honest.as_str(),
            "{how}: {}",
            text(&out)
        );
        assert!(
            !strs(&built_b["built"]).contains(&"wheel".to_string()),
            "{how}: the trusted wheel is taken, none built: {built_b}"
        );
        assert!(
            mirror_refs(&b).contains(&"refs/tags/v0.1.0".to_string()),
            "{how}: {:?}",
            mirror_refs(&b)
        );
    }
}
