//! The source stage's two ways of working on repositories: the git command
//! line when it is on PATH, libgit2 when it is not. Both must give the same
//! mirror refs and the same checkout, byte for byte, whatever the user's own
//! git configuration says.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::*;

/// Which programs the binary finds on PATH.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path_ {
    /// The test's own PATH (git on it).
    WithGit,
    /// An empty directory only: no git, so libgit2 does everything.
    NoGit,
}

/// A user's global git configuration that converts line endings on checkout,
/// which a checkout of a pin must ignore.
const AUTOCRLF: &str = "[core]\n\tautocrlf = true\n\teol = crlf\n";

/// Runs `oracle-build fetch <recipe> --store <store> --json` with a HOME
/// (`d/home`) whose global git configuration is `gitconfig`.
fn fetch_as_user(d: &Path, gitconfig: &str, recipe: &Path, store: &Path, path: Path_) -> Output {
    let home = d.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let global = home.join(".gitconfig");
    std::fs::write(&global, gitconfig).unwrap();
    let mut c = cmd(d);
    c.args(["fetch", recipe.to_str().unwrap(), "--json", "--store"])
        .arg(store)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("GIT_CONFIG_GLOBAL", &global);
    if path == Path_::NoGit {
        let empty = d.join("empty-path");
        std::fs::create_dir_all(&empty).unwrap();
        c.env("PATH", &empty);
    }
    c.output().unwrap()
}

/// The checkout directory a `fetch --json` reports.
fn checkout_of(out: &Output) -> PathBuf {
    assert_eq!(code(out), 0, "{}", text(out));
    PathBuf::from(json(out)["checkout"].as_str().unwrap())
}

/// The single mirror of a store.
fn mirror_of(store: &Path) -> PathBuf {
    only_entry(&store.join("store/git"))
}

/// Checks that `checkout` holds exactly `commit` of `repo`: a detached HEAD
/// at it, every tracked file with the blob's own bytes, read-only, the tag
/// history for setuptools-scm, and the pin ref.
fn assert_is_the_pin(checkout: &Path, repo: &Path, commit: &str, describe: &str) {
    let head = std::fs::read_to_string(checkout.join(".git/HEAD")).unwrap();
    assert_eq!(head.trim_end(), commit, "{}", checkout.display());
    let files = git(repo, &["ls-tree", "-r", "--name-only", commit]);
    assert!(files.lines().count() > 5, "{files}");
    for f in files.lines() {
        let want = std::process::Command::new("git")
            .args(["cat-file", "blob", &format!("{commit}:{f}")])
            .current_dir(repo)
            .output()
            .unwrap()
            .stdout;
        let got = std::fs::read(checkout.join(f)).unwrap();
        assert!(
            got == want,
            "{}: {f} differs from its blob in {commit}",
            checkout.display()
        );
        let mode = std::fs::metadata(checkout.join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o222, 0, "{f} is writable: {mode:o}");
    }
    assert_eq!(git(checkout, &["describe", "--tags"]), describe);
    let pins = git(
        checkout,
        &["for-each-ref", "--format=%(refname)", "refs/oracle-build/"],
    );
    assert!(
        pins.contains(&format!("refs/oracle-build/pins/{commit}")),
        "{pins}"
    );
}

#[test]
fn the_git_command_line_and_libgit2_give_the_same_mirror_and_checkout_of_each_pin() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, first) = fixture_repo(d);
    let short = |c: &str| c[..7].to_string();
    let first_recipe = write_recipe(d, "first", &repo, &first, "");

    let mut refs = Vec::new();
    for path in [Path_::WithGit, Path_::NoGit] {
        let store = d.join(format!("store-{path:?}"));
        let out = fetch_as_user(d, AUTOCRLF, &first_recipe, &store, path);
        let checkout = checkout_of(&out);
        assert_is_the_pin(
            &checkout,
            &repo,
            &first,
            &format!("v0.1.0-1-g{}", short(&first)),
        );
        refs.push(git(
            &mirror_of(&store),
            &["for-each-ref", "--format=%(objectname) %(refname)"],
        ));
    }
    assert_eq!(
        refs[0], refs[1],
        "the mirrors' refs differ between git and libgit2"
    );

    // A second pin, 2 commits on: both stores fetch only what is new into
    // their mirror and check it out; the first pin stays pinned.
    for n in 0..2 {
        std::fs::write(repo.join("NOTES.md"), format!("commit {n}\r\nand more\n")).unwrap();
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-qm", &format!("later {n}")]);
    }
    let second = git(&repo, &["rev-parse", "HEAD"]);
    let second_recipe = write_recipe(d, "second", &repo, &second, "");
    let mut refs = Vec::new();
    for path in [Path_::WithGit, Path_::NoGit] {
        let store = d.join(format!("store-{path:?}"));
        let out = fetch_as_user(d, AUTOCRLF, &second_recipe, &store, path);
        assert!(json(&out)["created"].as_bool().unwrap(), "{}", text(&out));
        let checkout = checkout_of(&out);
        assert_is_the_pin(
            &checkout,
            &repo,
            &second,
            &format!("v0.1.0-3-g{}", short(&second)),
        );
        let mirror = mirror_of(&store);
        let pins = git(
            &mirror,
            &[
                "for-each-ref",
                "--format=%(refname)",
                "refs/oracle-build/pins/",
            ],
        );
        assert!(pins.contains(&first) && pins.contains(&second), "{pins}");
        refs.push(git(
            &mirror,
            &["for-each-ref", "--format=%(objectname) %(refname)"],
        ));
        // Fetching again changes nothing and says the checkout was there.
        let again = fetch_as_user(d, AUTOCRLF, &second_recipe, &store, path);
        assert!(
            !json(&again)["created"].as_bool().unwrap(),
            "{}",
            text(&again)
        );
    }
    assert_eq!(
        refs[0], refs[1],
        "the mirrors' refs differ between git and libgit2"
    );

    // A tag made upstream once the mirror holds the commit: an online
    // fetch refreshes the mirror's tags anyway, with either backend.
    git(&repo, &["tag", "v0.3.0", &second]);
    for path in [Path_::WithGit, Path_::NoGit] {
        let store = d.join(format!("store-{path:?}"));
        let out = fetch_as_user(d, AUTOCRLF, &second_recipe, &store, path);
        assert!(!json(&out)["created"].as_bool().unwrap(), "{}", text(&out));
        assert_eq!(
            git(&mirror_of(&store), &["rev-parse", "v0.3.0^{commit}"]),
            second,
            "{path:?}"
        );
    }
}

#[test]
fn a_commit_the_repository_does_not_have_is_bad_input_with_either_backend() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, _) = fixture_repo(d);
    let missing = "0123456789abcdef0123456789abcdef01234567";
    let recipe = write_recipe(d, "missing", &repo, missing, "");
    for path in [Path_::WithGit, Path_::NoGit] {
        let store = d.join(format!("store-{path:?}"));
        let out = fetch_as_user(d, AUTOCRLF, &recipe, &store, path);
        assert_eq!(code(&out), 2, "{path:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(missing) && err.contains("does not have commit"),
            "{err}"
        );
        assert!(!store.join("store/src").join(missing).exists());
    }
}

#[test]
fn a_repository_value_runs_no_command_and_no_hook_of_the_user_and_a_relative_path_works() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, head) = fixture_repo(d);
    // A hook the user's global configuration points every repository at.
    let hooks = d.join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    for hook in ["reference-transaction", "post-checkout", "post-merge"] {
        let path = hooks.join(hook);
        std::fs::write(
            &path,
            format!("#!/bin/sh\ntouch {}/HOOK-RAN\n", d.display()),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let hooks_config = format!("[core]\n\thooksPath = {}\n", hooks.display());
    let run = |recipe: &Path, store: &Path, path: Path_| {
        fetch_as_user(d, &hooks_config, recipe, store, path)
    };
    let text_of = |name: &str, repo: &str, commit: &str| {
        let path = d.join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!("name: {name}\nsource:\n  repo: {repo:?}\n  commit: {commit}\npython: \"3.11\"\nbuild:\n  target_device: empty\n"),
        )
        .unwrap();
        path
    };

    // A relative path is read against the current directory by both.
    let relative = text_of("relative", "./repo", &head);
    for path in [Path_::WithGit, Path_::NoGit] {
        let store = d.join(format!("store-rel-{path:?}"));
        let out = run(&relative, &store, path);
        let checkout = checkout_of(&out);
        assert_eq!(
            std::fs::read_to_string(checkout.join(".git/HEAD"))
                .unwrap()
                .trim_end(),
            head
        );
    }
    assert!(!d.join("HOOK-RAN").exists(), "a user hook ran");

    // A remote helper that would run a command is refused.
    let ext = text_of(
        "ext",
        &format!("ext::sh -c touch% {}/EXT-RAN", d.display()),
        &head,
    );
    let out = run(&ext, &d.join("store-ext"), Path_::WithGit);
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(!d.join("EXT-RAN").exists(), "ext:: ran its command");

    // An annotated tag's id is not a commit, for either backend.
    let repo = d.join("repo");
    git(&repo, &["tag", "-a", "v0.2.0", "-m", "annotated"]);
    let tag = git(&repo, &["rev-parse", "v0.2.0"]);
    assert_ne!(tag, head);
    let tagged = text_of("tag", "./repo", &tag);
    for path in [Path_::WithGit, Path_::NoGit] {
        let store = d.join(format!("store-tag-{path:?}"));
        let out = run(&tagged, &store, path);
        assert_eq!(code(&out), 2, "{path:?}: {}", text(&out));
        assert!(
            text(&out).contains("does not have commit"),
            "{}",
            text(&out)
        );
        assert!(!store.join("store/src").join(&tag).exists());
    }
}

#[test]
fn a_closed_stdout_ends_the_tool_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, head) = fixture_repo(d);
    let recipe = write_recipe(d, "fx", &repo, &head, "");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = cmd(d)
        .args(["fetch", recipe.to_str().unwrap(), "--store"])
        .arg(d.join("store"))
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 141, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
