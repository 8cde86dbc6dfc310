//! What an oracle is made of and where it came from: `contains` on a
//! fixture history with a merge, `sbom` validated against the CycloneDX 1.6
//! schema (from PyPI's `cyclonedx-python-lib`, installed at test time), and
//! the signed SLSA provenance pushed with the wheel and checked on another
//! store through a registry.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use serde_json::Value;

/// Commits `file` with `text` on the current branch of `repo`; returns the commit.
fn commit_file(repo: &Path, file: &str, text: &str, msg: &str) -> String {
    std::fs::write(repo.join(file), text).unwrap();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", msg]);
    git(repo, &["rev-parse", "HEAD"])
}

#[test]
fn contains_answers_from_the_mirror_with_first_parent_distances_across_a_merge() {
    let fx = Fx::new();
    let (repo, b) = fx.repo();
    // main: b - m (merge of feature f1 - f2, branched at b) - c; other: x from b.
    git(&repo, &["checkout", "-qb", "feature"]);
    let f1 = commit_file(&repo, "F1.md", "f1\n", "f1");
    let f2 = commit_file(&repo, "F2.md", "f2\n", "f2");
    git(&repo, &["checkout", "-q", "main"]);
    git(&repo, &["checkout", "-qb", "other"]);
    let x = commit_file(&repo, "X.md", "x\n", "x, never merged");
    git(&repo, &["checkout", "-q", "main"]);
    git(
        &repo,
        &["merge", "-q", "--no-ff", "-m", "merge feature", "feature"],
    );
    let m = git(&repo, &["rev-parse", "HEAD"]);
    let c = commit_file(&repo, "C.md", "c\n", "c");
    let a = git(&repo, &["rev-parse", &format!("{b}~1")]);
    let recipe = fx.recipe("fx", &repo, &c, SMOKE);
    let pin = recipe.to_str().unwrap();
    fx.exits(&["fetch", pin], 0);

    let ask = |commit: &str, want: i32| -> Value {
        let out = fx.run(&["contains", pin, commit, "--json"]);
        assert_eq!(code(&out), want, "contains {commit}:\n{}", text(&out));
        json(&out)
    };
    // On the first-parent chain: c 0, m 1, b 2, a 3 (a by a 7-digit prefix).
    for (commit, d) in [(&c, 0), (&m, 1), (&b, 2)] {
        let v = ask(commit, 0);
        assert_eq!(v["answer"], "yes", "{v}");
        assert_eq!(v["commit"], commit.as_str(), "{v}");
        assert_eq!(v["first_parent_distance"], d, "{v}");
        assert_eq!(v["on_first_parent"], true, "{v}");
        assert_eq!(v["oracle_commit"], c.as_str(), "{v}");
    }
    let v = ask(&a[..7], 0);
    assert_eq!(
        (&v["commit"], &v["first_parent_distance"]),
        (&Value::from(a.as_str()), &Value::from(3)),
        "{v}"
    );
    // Reached only through the merge's second parent: the merge's distance.
    for f in [&f1, &f2] {
        let v = ask(f, 0);
        assert_eq!(v["answer"], "yes", "{v}");
        assert_eq!(v["on_first_parent"], false, "{v}");
        assert_eq!(v["merged_by"], m.as_str(), "{v}");
        assert_eq!(v["first_parent_distance"], 1, "{v}");
    }
    // On another branch, never merged: no, exit 1.
    let v = ask(&x, 1);
    assert_eq!(v["answer"], "no", "{v}");
    // Not in the mirror at all: unknown, exit 2.
    let v = ask("0123456789abcdef0123456789abcdef01234567", 2);
    assert_eq!(v["answer"], "unknown", "{v}");
    // Text: one line naming the answer.
    let out = fx.exits(&["contains", pin, &f2], 0);
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        line.starts_with("yes: ") && line.contains(&format!("merged by {m}")),
        "{line}"
    );
    // A commit that is not hex is bad input, not an answer.
    let out = fx.exits(&["contains", pin, "not-a-commit"], 2);
    assert!(text(&out).contains("not a commit id"), "{}", text(&out));
}
