//! The edges of the source stage a new user hit (issue 42): a git remote
//! that stalls, a tag moved upstream, a ref whose history misses an object.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// How a [`stalling_server`] treats a connection.
#[derive(Debug, Clone, Copy)]
enum Stall {
    /// Accepts and never sends a byte.
    Silent,
    /// Sends the first packet of a git protocol v2 answer
    /// (`000eversion 2\n`), then nothing.
    AfterFirstPacket,
}

/// A TCP server on 127.0.0.1 that accepts every connection and stalls it
/// as `how` says, holding it open until the test process ends. Returns
/// its port.
fn stalling_server(how: Stall) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held: Vec<TcpStream> = Vec::new();
        for mut s in l.incoming().flatten() {
            if let Stall::AfterFirstPacket = how {
                let _ = s.write_all(b"000eversion 2\n");
            }
            held.push(s);
        }
    });
    port
}

/// Runs `c` (stdout and stderr captured) and returns its output and how
/// long it ran; panics, after killing it, when it runs past `limit` (the
/// hang this module's timeouts exist for).
fn bounded(c: &mut Command, limit: Duration) -> (Output, Duration) {
    let start = Instant::now();
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("oracle-build starts");
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => (out.unwrap(), start.elapsed()),
        Err(_) => {
            // SAFETY: the child this test started (its git children get
            // SIGTERM from the kernel when it dies).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("still running after {limit:?}: a stalled remote hangs the command");
        }
    }
}

/// A recipe `name` for `commit` of the repository URL `url`.
fn recipe_at(dir: &Path, name: &str, url: &str, commit: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}\nsource:\n  repo: {url}\n  commit: {commit}\n  package: fixturellm\npython: \"3.11\"\nbuild:\n  target_device: cpu\n"
        ),
    )
    .unwrap();
    path
}

/// Issue 42, item 1: every git network operation has a connect and an idle
/// timeout (the store's `[git]` table, 2 s and 3 s here). A first fetch
/// from an `http://` repository that accepts and never answers fails
/// within seconds naming the URL and `connect_timeout 2s`, for `fetch`
/// (git's command line) and for `build` (its pre-build check, libgit2),
/// and writes no mirror. A store that already has the mirror, refreshing
/// it from a `git://` remote that answers one packet and then stalls,
/// says the refresh ran out of `read_timeout 3s`, falls back to the
/// mirror and checks the pin out (exit 0); from one that never answers,
/// the same with `connect_timeout 2s`.
#[test]
fn a_stalled_git_remote_times_out_and_a_refresh_falls_back_to_the_mirror() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let (_repo, head) = fixture_repo(dir);
    let store = dir.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let timeouts = "[git]\nconnect_timeout = \"2s\"\nread_timeout = \"3s\"\n";
    std::fs::write(store.join("config.toml"), timeouts).unwrap();
    let limit = Duration::from_secs(60);

    // A first clone from a silent http:// server.
    let silent = stalling_server(Stall::Silent);
    let url = format!("http://127.0.0.1:{silent}/fx.git");
    let first = recipe_at(dir, "fxhttp", &url, &head);
    for args in [
        vec!["fetch", first.to_str().unwrap()],
        vec!["build", first.to_str().unwrap(), "--no-smoke"],
    ] {
        let (out, took) = bounded(cmd(dir).args(&args).arg("--store").arg(&store), limit);
        let all = text(&out);
        assert_eq!(code(&out), 1, "{args:?}: {all}");
        assert!(
            took < Duration::from_secs(30),
            "{args:?} took {took:?}: {all}"
        );
        assert!(
            all.contains(&url) && all.contains("connect_timeout 2s"),
            "{args:?} must name the URL and the timeout: {all}"
        );
        assert!(
            tree(&store.join("store/git")).is_empty(),
            "no mirror from a clone that timed out: {:?}",
            tree(&store.join("store/git"))
        );
    }

    // A mirror made through a file:// site mirror, refreshed through a
    // git:// one that stalls.
    let declared = "https://git.invalid/repo";
    let second = recipe_at(dir, "fxgit", declared, &head);
    let mirror_to = |target: &str| {
        std::fs::write(
            store.join("config.toml"),
            format!(
                "{timeouts}\n[[mirror]]\nprefix = \"https://git.invalid/\"\nurl = \"{target}\"\n"
            ),
        )
        .unwrap();
    };
    mirror_to(&format!("file://{}/", dir.display()));
    let out = cmd(dir)
        .args(["fetch", second.to_str().unwrap(), "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    for (how, says) in [
        (Stall::AfterFirstPacket, "read_timeout 3s"),
        (Stall::Silent, "connect_timeout 2s"),
    ] {
        let port = stalling_server(how);
        mirror_to(&format!("git://127.0.0.1:{port}/"));
        let (out, took) = bounded(
            cmd(dir)
                .args(["fetch", second.to_str().unwrap(), "--store"])
                .arg(&store),
            limit,
        );
        let all = text(&out);
        assert_eq!(code(&out), 0, "{how:?}: {all}");
        assert!(
            took < Duration::from_secs(30),
            "{how:?} took {took:?}: {all}"
        );
        assert!(
            all.contains("were not refreshed")
                && all.contains(says)
                && all.contains("using the mirror's as they are"),
            "{how:?}: the refresh must say it timed out and fell back: {all}"
        );
    }
}

/// Issue 42, item 10(a): a branch of the repository whose history misses
/// an object (a fork's branch with one blob deleted from the object store,
/// unrelated to the pin) makes git's fetch of every branch and tag fail
/// (`remote: fatal: unable to read <id>`). `fetch` still makes the mirror:
/// it fetches the refs in parts, warns naming the branch and git's reason,
/// and checks the pin out with its tag (the version's history); the next
/// `fetch` refreshes the mirror the same way (the refresh is not reported
/// as failed), and a tag deleted upstream meanwhile is pruned.
#[test]
fn a_branch_missing_an_object_costs_only_that_branch() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let (repo, head) = fixture_repo(dir);
    let main = git(&repo, &["rev-parse", "--abbrev-ref", "HEAD"]);
    git(&repo, &["checkout", "-qb", "fork", "HEAD~1"]);
    std::fs::write(repo.join("FORK.md"), "a fork's file, lost\n").unwrap();
    git(&repo, &["add", "FORK.md"]);
    git(&repo, &["commit", "-qm", "fork"]);
    let blob = git(&repo, &["rev-parse", "HEAD:FORK.md"]);
    git(&repo, &["checkout", "-q", &main]);
    std::fs::remove_file(repo.join(".git/objects").join(&blob[..2]).join(&blob[2..])).unwrap();
    git(&repo, &["tag", "gone-0.0.1", "HEAD~1"]);
    let store = dir.join("store");
    let recipe = write_recipe(dir, "fxfork", &repo, &head, "");
    let fetch = || {
        let out = cmd(dir)
            .args(["fetch", recipe.to_str().unwrap(), "--store"])
            .arg(&store)
            .output()
            .unwrap();
        let all = text(&out);
        assert_eq!(code(&out), 0, "{all}");
        let warning = all
            .lines()
            .find(|l| l.contains("warning: refs/heads/fork of file://"))
            .unwrap_or_else(|| panic!("the left-out branch must be named: {all}"));
        assert!(
            warning.contains(&format!("remote: fatal: unable to read {blob}")),
            "git's reason must be named: {all}"
        );
        assert!(!all.contains("were not refreshed"), "{all}");
        all
    };
    fetch();
    let mirror = only_entry(&store.join("store/git"));
    let refs = git(&mirror, &["for-each-ref", "--format=%(refname)"]);
    assert!(
        refs.contains(&format!("refs/heads/{main}"))
            && refs.contains("refs/tags/v0.1.0")
            && refs.contains("refs/tags/gone-0.0.1")
            && !refs.contains("refs/heads/fork"),
        "{refs}"
    );
    let checkout = store.join("store/src").join(&head);
    assert_eq!(
        std::fs::read_to_string(checkout.join(".git/HEAD"))
            .unwrap()
            .trim(),
        head
    );
    git(&repo, &["tag", "-d", "gone-0.0.1"]);
    fetch();
    let refs = git(&mirror, &["for-each-ref", "--format=%(refname)"]);
    assert!(
        refs.contains("refs/tags/v0.1.0") && !refs.contains("gone-0.0.1"),
        "a tag deleted upstream is pruned: {refs}"
    );
}

/// A fixture recipe `name` for `commit` of `repo` with `source:` lines
/// `source_extra` (each indented two spaces).
fn recipe_with_source(
    dir: &Path,
    name: &str,
    repo: &Path,
    commit: &str,
    source_extra: &str,
) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}\nsource:\n  repo: file://{}\n  commit: {commit}\n  package: fixturellm\n{source_extra}python: \"3.11\"\nbuild:\n  target_device: cpu\n",
            repo.display()
        ),
    )
    .unwrap();
    path
}

/// Issue 42, item 4: a tag moved upstream (`git tag -f v0.1.0 <pin>`) after
/// the store built the pin. With the default `source.moved_tags: follow`,
/// the next online build says the move (tag, both commits), rebuilds, and
/// names the version change: text and `--json` `version_change` (the
/// previous oracle's version, the new one, the tag move). A store whose
/// recipe says `moved_tags: refuse` stops at the source stage (exit 3)
/// naming the tag, both commits, both versions and the field, builds
/// nothing, and keeps the tag where it was in its mirror (the next try
/// refuses again). A value other than `follow` or `refuse` is bad input
/// naming the field.
#[test]
fn a_tag_moved_upstream_names_the_version_change_or_is_refused() {
    let fx = Fx::new();
    let (repo, head) = fx.repo();
    let old = git(&repo, &["rev-parse", "v0.1.0^{commit}"]);
    let follow = fx.recipe("fx", &repo, &head, "");
    let f = follow.to_str().unwrap();
    let first = json(&fx.exits(&["build", f, "--no-smoke", "--json"], 4));
    let before = first["runtime_version"].as_str().unwrap().to_string();
    assert!(before.starts_with("0.1.1.dev1+g"), "{first}");
    assert!(first.get("version_change").is_none(), "{first}");
    let b = fx.dir().join("store-b");
    let refuse = recipe_with_source(fx.dir(), "fxr", &repo, &head, "  moved_tags: refuse\n");
    let r = refuse.to_str().unwrap();
    let out = fx.run_at(&b, &["fetch", r]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    git(&repo, &["tag", "-f", "v0.1.0", &head]);

    let out = fx.exits(&["build", f, "--no-smoke", "--json"], 4);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let moved = format!("tag v0.1.0 moved upstream from commit {old} to {head}");
    assert!(err.contains(&moved), "{err}");
    let doc = json(&out);
    assert_eq!(doc["runtime_version"], "0.1.0", "{doc}");
    let change = &doc["version_change"];
    assert_eq!(change["from"], before.as_str(), "{doc}");
    assert_eq!(change["to"], "0.1.0", "{doc}");
    assert_eq!(change["tag_moves"][0]["tag"], "v0.1.0", "{doc}");
    assert_eq!(change["tag_moves"][0]["from"], old.as_str(), "{doc}");
    assert_eq!(change["tag_moves"][0]["to"], head.as_str(), "{doc}");
    assert!(
        err.contains(&format!("{before} -> 0.1.0 under the same commit")),
        "the build names the version change: {err}"
    );
    assert!(
        doc["built"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "wheel"),
        "{doc}"
    );

    for args in [vec!["fetch", r], vec!["build", r, "--no-smoke"]] {
        let out = fx.run_at(&b, &args);
        let all = text(&out);
        assert_eq!(code(&out), 3, "{args:?}: {all}");
        assert!(
            all.contains(&moved)
                && all.contains(&format!("from 0.1.1.dev1+g{}", &head[..9]))
                && all.contains(&format!(
                    "(tag v0.1.0 at {old}) to 0.1.0 (tag v0.1.0 at {head})"
                )),
            "{args:?}: the tag, both commits and both versions: {all}"
        );
        assert!(
            all.contains("to 0.1.0 (tag v0.1.0 at") && all.contains("source.moved_tags: refuse"),
            "{args:?}: the new version and the field: {all}"
        );
        let mirror = only_entry(&b.join("store/git"));
        assert_eq!(
            git(&mirror, &["rev-parse", "v0.1.0^{commit}"]),
            old,
            "{args:?}"
        );
        assert!(!b.join("store/wheels").exists() || tree(&b.join("store/wheels")).is_empty());
    }

    let bad = recipe_with_source(fx.dir(), "fxbad", &repo, &head, "  moved_tags: sometimes\n");
    let out = fx.run_at(&b, &["fetch", bad.to_str().unwrap()]);
    let all = text(&out);
    assert_eq!(code(&out), 2, "{all}");
    assert!(
        all.contains("line 6") && all.contains("source.moved_tags"),
        "{all}"
    );
}
