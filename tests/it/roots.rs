//! `keep`, `unkeep` and `gc` as commands: `--json` output, and a store that
//! does not exist (an empty store, as for `status`).

use std::path::Path;

use crate::support::*;

#[test]
fn keep_and_unkeep_print_one_json_document() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let store = fx.store();
    let b = fx.run(&["build", r, "--no-smoke", "--json"]);
    assert_eq!(code(&b), 4, "{}", text(&b));
    let oracle = json(&b)["oracle"].as_str().unwrap().to_string();
    let root = store.join("roots/fx");

    let un = fx.run(&["unkeep", r, "--json"]);
    assert_eq!(code(&un), 0, "{}", text(&un));
    let un = json(&un);
    assert_eq!(un["action"], "removed", "{un}");
    assert_eq!(un["recipe"], "fx");
    assert_eq!(un["root"], root.to_str().unwrap());
    assert_eq!(un["oracle"], oracle.as_str());
    assert!(std::fs::symlink_metadata(&root).is_err());

    let again = fx.run(&["unkeep", r, "--json"]);
    assert_eq!(code(&again), 0, "{}", text(&again));
    let again = json(&again);
    assert_eq!(again["action"], "absent", "{again}");
    assert!(again["oracle"].is_null());

    let k = fx.run(&["keep", r, "--json"]);
    assert_eq!(code(&k), 0, "{}", text(&k));
    let k = json(&k);
    assert_eq!(k["action"], "kept", "{k}");
    assert_eq!(k["oracle"], oracle.as_str());
    assert_eq!(k["root"], root.to_str().unwrap());
    assert_eq!(
        root.canonicalize().unwrap(),
        Path::new(&oracle).canonicalize().unwrap()
    );
}

#[test]
fn a_store_that_does_not_exist_is_empty_for_gc_and_unkeep_and_keep_names_it() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let store = fx.dir().join("nowhere");
    let shown = store.display().to_string();

    let st = fx.run_at(&store, &["status", "--json"]);
    assert_eq!(code(&st), 0, "{}", text(&st));

    let gc = fx.run_at(&store, &["gc"]);
    assert_eq!(code(&gc), 0, "{}", text(&gc));
    assert!(
        text(&gc).contains(&format!("no store at {shown}")),
        "{}",
        text(&gc)
    );
    let gc = fx.run_at(&store, &["gc", "--dry-run", "--json"]);
    assert_eq!(code(&gc), 0, "{}", text(&gc));
    assert_eq!(json(&gc)["deleted"].as_array().unwrap().len(), 0);

    let un = fx.run_at(&store, &["unkeep", r]);
    assert_eq!(code(&un), 0, "{}", text(&un));
    assert!(text(&un).contains(&shown), "{}", text(&un));
    let un = fx.run_at(&store, &["unkeep", r, "--json"]);
    assert_eq!(code(&un), 0, "{}", text(&un));
    assert_eq!(json(&un)["action"], "absent");

    let k = fx.run_at(&store, &["keep", r, "--json"]);
    assert_eq!(code(&k), 1, "{}", text(&k));
    let err = String::from_utf8_lossy(&k.stderr);
    assert!(
        err.contains(&format!("no store at {shown}")) && err.contains("build it first"),
        "{err}"
    );
    // --json on failure: one error document on stdout.
    let doc = json(&k);
    assert_eq!(doc["exit"], 1, "{doc}");
    assert!(
        doc["error"].as_str().unwrap().contains("no store at"),
        "{doc}"
    );
    assert!(!store.exists(), "nothing was created");
}
