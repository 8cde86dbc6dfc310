//! Bad input exits 2 with a message naming the problem, and writes nothing.

use std::path::Path;

use crate::support::*;

const COMMIT: &str = "5559679229bc961848b121ccdeaa8fa5d79bec98";

fn good(name: &str, commit: &str) -> String {
    format!(
        "name: {name}\nsource:\n  repo: file:///nonexistent\n  commit: {commit}\n  package: fixturellm\npython: \"3.11\"\nbuild:\n  target_device: cpu\n"
    )
}

/// Runs `build <pin>` in `fx`'s directory with recipes from its `recipes/`
/// and asserts exit 2, a message containing every `needle`, and no store created.
fn refused(fx: &Fx, pin: &str, needles: &[&str]) {
    let store = fx.store();
    let out = fx.run(&["build", pin]);
    let t = text(&out);
    assert_eq!(code(&out), 2, "{pin}: {t}");
    for n in needles {
        assert!(t.contains(n), "{pin}: expected {n:?} in:\n{t}");
    }
    assert!(!store.exists(), "{pin}: the store was created");
}

/// A test directory whose `recipes/` holds `recipes` (file name, text).
fn dir_with(recipes: &[(&str, String)]) -> Fx {
    let fx = Fx::new();
    std::fs::create_dir(fx.dir().join("recipes")).unwrap();
    for (file, text) in recipes {
        std::fs::write(fx.dir().join("recipes").join(file), text).unwrap();
    }
    fx
}

#[test]
fn missing_recipe_file() {
    let fx = dir_with(&[]);
    refused(
        &fx,
        "recipes/nope.yaml",
        &["recipes/nope.yaml", "not found"],
    );
}

#[test]
fn malformed_yaml_names_the_file_and_line() {
    let fx = dir_with(&[("bad.yaml", "name: bad\nsource: [unclosed\n".into())]);
    refused(&fx, "recipes/bad.yaml", &["recipes/bad.yaml", "line 2"]);
}

#[test]
fn a_tab_in_the_indentation_names_its_own_line() {
    let text = good("x", COMMIT);
    let line = text
        .lines()
        .position(|l| l.trim_start().starts_with("commit:"))
        .unwrap();
    let tabbed: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == line {
                format!("\t{}", l.trim_start())
            } else {
                l.to_string()
            }
        })
        .collect();
    let fx = dir_with(&[("x.yaml", tabbed.join("\n") + "\n")]);
    let at = format!("line {}: a tab character", line + 1);
    refused(&fx, "recipes/x.yaml", &["recipes/x.yaml", &at]);
}

#[test]
fn unknown_key_names_the_key() {
    let fx = dir_with(&[("x.yaml", good("x", COMMIT) + "colour: blue\n")]);
    refused(&fx, "recipes/x.yaml", &["recipes/x.yaml", "colour"]);
}

#[test]
fn short_commit_names_the_field_line_and_value() {
    let fx = dir_with(&[("x.yaml", good("x", "5559679"))]);
    refused(
        &fx,
        "recipes/x.yaml",
        &["recipes/x.yaml", "line 4", "source.commit", "5559679"],
    );
}

#[test]
fn a_repository_value_that_git_would_read_as_an_option() {
    let text = good("x", COMMIT).replace("file:///nonexistent", "\"--upload-pack=touch PWNED;\"");
    let fx = dir_with(&[("x.yaml", text)]);
    refused(
        &fx,
        "recipes/x.yaml",
        &[
            "recipes/x.yaml",
            "source.repo",
            "--upload-pack=touch PWNED;",
            "starts with '-'",
        ],
    );
    assert!(!fx.dir().join("PWNED").exists());
}

#[test]
fn recipe_name_with_slash_or_dotdot() {
    let fx = dir_with(&[
        ("a.yaml", good("../evil", COMMIT)),
        ("b.yaml", good("a/b", COMMIT)),
    ]);
    refused(&fx, "recipes/a.yaml", &["field `name`", "../evil"]);
    refused(&fx, "recipes/b.yaml", &["field `name`", "a/b"]);
    refused(&fx, "..", &["not a recipe name"]);
}

#[test]
fn ambiguous_commit_prefix_lists_the_candidates() {
    let c1 = "abcdef1000000000000000000000000000000001";
    let c2 = "abcdef1000000000000000000000000000000002";
    let fx = dir_with(&[("one.yaml", good("one", c1)), ("two.yaml", good("two", c2))]);
    refused(&fx, "abcdef1", &["ambiguous", "one", "two", c1, c2]);
}

#[test]
fn commit_prefix_matching_no_recipe() {
    let fx = dir_with(&[("one.yaml", good("one", COMMIT))]);
    refused(
        &fx,
        "fedcba9",
        &["no recipe has a commit starting with fedcba9"],
    );
}

#[test]
fn pins_resolve_by_name_stem_and_unique_prefix_from_any_directory() {
    let other = "1111111222222233333334444444555555566666";
    let fx = dir_with(&[("one.yaml", good("fx-one", other))]);
    // plan changes nothing and exits 0 for a valid PIN (1 when a build would stop).
    for pin in ["one", "fx-one", "1111111", "555967922", "5559679229b"] {
        let out = fx.run(&["plan", pin, "--json"]);
        assert_eq!(code(&out), plan_exit(&out), "{pin}: {}", text(&out));
        let name = json(&out)["recipe"].as_str().unwrap().to_string();
        let want = if pin.starts_with('5') {
            "vllm-555967922"
        } else {
            "fx-one"
        };
        assert_eq!(name, want, "{pin}");
    }
    // $ORACLE_BUILD_RECIPES is searched too, from any directory.
    let elsewhere = tempfile::tempdir().unwrap();
    let out = fx
        .cmd(&["plan", "fx-one", "--json"])
        .current_dir(elsewhere.path())
        .env("ORACLE_BUILD_RECIPES", fx.dir().join("recipes"))
        .output()
        .unwrap();
    assert_eq!(code(&out), plan_exit(&out), "{}", text(&out));
    assert!(!fx.dir().join("store").exists(), "plan wrote nothing");
}

#[test]
fn the_builtin_parity_pin_is_the_recorded_stack() {
    let fx = Fx::new();
    let out = fx.run(&["plan", "555967922", "--json"]);
    assert_eq!(code(&out), plan_exit(&out), "{}", text(&out));
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/555967922.yaml"),
    )
    .unwrap();
    for needle in [
        "commit: 5559679229bc961848b121ccdeaa8fa5d79bec98",
        "python: \"3.12\"",
        "torch: 2.13.0",
        "torchvision: 0.28.0",
        "flashinfer-python: 0.6.15.post1",
        "flashinfer-cubin: 0.6.15.post1",
        "nvidia-cutlass-dsl: 4.6.0",
        "transformers: 5.14.1",
        "runtime_version: 0.23.1rc1.dev1511+g555967922",
        "revision: 890bdef7a42feba6d83b6e17a03315c694112f2a",
        "revision: 491c2f1ea524c639598bf8fa787a93fed5a6fbce",
    ] {
        assert!(
            text.contains(needle),
            "recipes/555967922.yaml lacks {needle}"
        );
    }
}

/// Runs `plan <file>` on a recipe of `good("x")` plus `extra` and returns
/// the message, after asserting exit 2 and that nothing was written.
fn plan_refuses(extra: &str) -> String {
    let fx = dir_with(&[("x.yaml", good("x", COMMIT) + extra)]);
    let store = fx.store();
    let out = fx.run(&["plan", "recipes/x.yaml"]);
    let t = text(&out);
    assert_eq!(code(&out), 2, "{extra:?}: {t}");
    assert!(!store.exists(), "{extra:?}: the store was created");
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

#[test]
fn parse_errors_name_line_and_field_in_plain_words() {
    // good() has 8 lines: what is appended starts at line 9.
    for (extra, want) in [
        (
            "smoke:\n  runs: -1\n",
            "error: recipes/x.yaml: line 10: field `smoke.runs`: -1 is negative; expected a whole number",
        ),
        (
            "indexes: \"x\"\n",
            "error: recipes/x.yaml: line 9: field `indexes`: expected a list (`[a, b]`, or one `- item` per line), found `\"x\"`",
        ),
        (
            "python: \"3.12\"\n",
            "error: recipes/x.yaml: line 9: field `python`: `python` is given twice in the same mapping (first at line 6); keep one",
        ),
        (
            "colour: blue\n",
            "error: recipes/x.yaml: line 9: field `colour`: unknown key `colour` (allowed keys here: name, source, python, indexes, pins, build, expect, smoke, lock, install)",
        ),
        (
            "smoke:\n  runs: \"3\"\n",
            "error: recipes/x.yaml: line 10: field `smoke.runs`: \"3\" is a quoted string, not a number; write the number without quotes: 3",
        ),
        (
            "pins: {packaging: \">=20\"}\n",
            "error: recipes/x.yaml: line 9: field `pins.packaging`: \">=20\" is not an exact version",
        ),
        (
            "build2: {}\n",
            "error: recipes/x.yaml: line 9: field `build2`: unknown key",
        ),
        (
            "smoke:\n  cases:\n    - name: c\n      model: ${FX_MODELS\n      prompt: x\n",
            "error: recipes/x.yaml: line 12: field `smoke.cases[0].model`: case \"c\": \"${FX_MODELS\" has a `${` without its closing `}`",
        ),
        (
            "smoke:\n  cases:\n    - name: c\n      model: /m\n      prompt: x\n      mode: compiled\n      engine_args: {max_model_len: 256, enforce_eager: true}\n",
            "error: recipes/x.yaml: line 15: field `smoke.cases[0].engine_args.enforce_eager`: case \"c\": true contradicts `mode: compiled`",
        ),
        (
            "smoke:\n  env: {A: \"1\", \"B=C\": \"2\"}\n",
            "error: recipes/x.yaml: line 10: field `smoke.env.B=C`: \"B=C\" is not an environment variable name",
        ),
    ] {
        let e = plan_refuses(extra);
        assert!(e.starts_with(want), "{extra:?}:\n{e}\nwant:\n{want}");
        for internal in ["u32", "Option<", "DuplicateKeyPolicy", "sequence start"] {
            assert!(!e.contains(internal), "{internal:?} in {e}");
        }
    }
    // An empty `package:` (a field with a default).
    let fx = dir_with(&[(
        "x.yaml",
        good("x", COMMIT).replace("  package: fixturellm\n", "  package:\n"),
    )]);
    let out = run(fx.dir(), &["plan", "recipes/x.yaml"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.starts_with("error: recipes/x.yaml: line 5: field `source.package`: has no value"),
        "{e}"
    );
    assert!(!e.contains("Option<"), "{e}");
}

#[test]
fn build_env_errors_name_the_key() {
    let fx = dir_with(&[(
        "x.yaml",
        good("x", COMMIT) + "  env:\n    CC: gcc\n    \"A=B\": x\n",
    )]);
    refused(
        &fx,
        "recipes/x.yaml",
        &["recipes/x.yaml: line 11: field `build.env.A=B`: \"A=B\""],
    );
}

#[test]
fn a_pin_that_is_a_stem_and_another_recipes_name_says_which_it_used() {
    let other = "1111111222222233333334444444555555566666";
    let fx = dir_with(&[
        ("alpha.yaml", good("fx-alpha", COMMIT)),
        ("beta.yaml", good("alpha", other)),
    ]);
    let out = fx.run(&["plan", "alpha", "--json"]);
    assert_eq!(code(&out), plan_exit(&out), "{}", text(&out));
    assert_eq!(json(&out)["recipe"], "fx-alpha", "the file stem wins");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("recipes/alpha.yaml") && err.contains("recipes/beta.yaml"),
        "both origins named: {err}"
    );
    // No note when the name is not shared.
    let out = fx.run(&["plan", "beta", "--json"]);
    assert_eq!(code(&out), plan_exit(&out), "{}", text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("note:"),
        "{}",
        text(&out)
    );
}

// Issue 26, item 10: a name a command line would read as an option.
#[test]
fn a_recipe_name_starting_with_a_dash_is_refused() {
    let fx = dir_with(&[("x.yaml", good("-rf", COMMIT))]);
    refused(
        &fx,
        "recipes/x.yaml",
        &[
            "recipes/x.yaml",
            "line 1",
            "field `name`",
            "\"-rf\"",
            "starts with `-`",
        ],
    );
}

/// `good("x", COMMIT)` with one smoke case `a` whose `extra` line (indented
/// as a case's field) is line 13 of the file.
fn with_case_field(extra: &str) -> String {
    good("x", COMMIT) + "smoke:\n  cases:\n    - name: a\n      model: /m\n" + extra
}

/// `plan` and `build` of `recipes/x.yaml` in `fx`'s directory exit 2,
/// within 60 s, with every needle in the message, and no store made.
fn refused_up_front(fx: &Fx, needles: &[&str]) {
    for command in ["plan", "build"] {
        let out = output_or_hang(&mut fx.cmd(&[command, "recipes/x.yaml"]), 60);
        let t = text(&out);
        assert_eq!(code(&out), 2, "{command}: {t}");
        for n in needles {
            assert!(t.contains(n), "{command}: expected {n:?} in:\n{t}");
        }
        assert!(!fx.store().exists(), "{command}: the store was made");
    }
}

// A prompts file is read when the recipe is opened, not after the build:
// what cannot be read as prompts is bad input before any work, and a FIFO
// or a device never blocks or fills memory.
#[test]
fn a_prompts_file_that_cannot_be_read_as_prompts_is_refused_before_any_work() {
    let fx = dir_with(&[]);
    let r = fx.dir().join("recipes");
    std::fs::create_dir(r.join("adir")).unwrap();
    mkfifo(&r.join("p.fifo"));
    std::fs::write(r.join("bad.json"), r#"{"a": 1}"#).unwrap();
    std::fs::write(r.join("big.txt"), "a".repeat((1 << 20) + 1)).unwrap();
    std::fs::write(fx.dir().join("outside.json"), r#"["x""#).unwrap();
    let at = |v: &str| format!("({})", r.join(v).display());
    for (value, why) in [
        ("nope.txt", format!("{} does not exist", at("nope.txt"))),
        (
            "adir",
            format!("{} is a directory, not a regular file", at("adir")),
        ),
        (
            "/dev/zero",
            "\"/dev/zero\" is a character device, not a regular file".to_string(),
        ),
        (
            "p.fifo",
            format!("{} is a FIFO, not a regular file", at("p.fifo")),
        ),
        (
            "big.txt",
            format!("{} is larger than 1048576 bytes, the limit", at("big.txt")),
        ),
        (
            "bad.json",
            format!("{} is not a JSON list of strings", at("bad.json")),
        ),
        (
            "../outside.json",
            format!("{} is not a JSON list of strings", at("../outside.json")),
        ),
    ] {
        std::fs::write(
            r.join("x.yaml"),
            with_case_field(&format!("      prompts_file: {value}\n")),
        )
        .unwrap();
        refused_up_front(
            &fx,
            &[
                &format!(
                    "recipes/x.yaml: line 13: field `smoke.cases[0].prompts_file`: \"{value}\""
                ),
                &why,
            ],
        );
    }
    // Outside the recipe's directory (`..` or absolute), a file of prompts is taken.
    let outside = fx.dir().join("outside.txt");
    std::fs::write(&outside, "first\nsecond\n").unwrap();
    for value in ["../outside.txt", outside.to_str().unwrap()] {
        std::fs::write(
            r.join("x.yaml"),
            with_case_field(&format!("      prompts_file: {value}\n")),
        )
        .unwrap();
        let out = output_or_hang(&mut fx.cmd(&["plan", "recipes/x.yaml", "--json"]), 60);
        assert_eq!(code(&out), plan_exit(&out), "{value}: {}", text(&out));
    }
}

// What is at a case's `golden:` path is looked at when the recipe is
// opened: one no golden reader takes (a device, a FIFO, over the bound, a
// numpy directory whose greedy_ids.npy is a FIFO) is bad input before any
// work; nothing there is a golden not recorded yet.
#[test]
fn a_golden_path_holding_what_no_golden_reader_takes_is_refused_before_any_work() {
    let fx = dir_with(&[]);
    let r = fx.dir().join("recipes");
    mkfifo(&r.join("g.fifo"));
    sparse_file(&r.join("huge.json"), (64 << 20) + 1);
    std::fs::create_dir(r.join("npdir")).unwrap();
    mkfifo(&r.join("npdir/greedy_ids.npy"));
    let at = |v: &str| format!("({})", r.join(v).display());
    for (value, why) in [
        (
            "/dev/zero",
            "\"/dev/zero\" is a character device, not a regular file".to_string(),
        ),
        (
            "g.fifo",
            format!("{} is a FIFO, not a regular file", at("g.fifo")),
        ),
        (
            "huge.json",
            format!(
                "{} is larger than 67108864 bytes, the limit",
                at("huge.json")
            ),
        ),
        (
            "npdir",
            format!(
                "{} is a FIFO, not a regular file",
                at("npdir/greedy_ids.npy")
            ),
        ),
    ] {
        std::fs::write(
            r.join("x.yaml"),
            with_case_field(&format!("      prompt: x\n      golden: {value}\n")),
        )
        .unwrap();
        let field = format!("recipes/x.yaml: line 14: field `smoke.cases[0].golden`: \"{value}\"");
        refused_up_front(&fx, &[&field, &why]);
        // `golden import` too, before it reads the team's files.
        let out = output_or_hang(
            &mut fx.cmd(&["golden", "import", "recipes/x.yaml", "--case", "a", "team"]),
            60,
        );
        assert_eq!(code(&out), 2, "{}", text(&out));
        assert!(text(&out).contains(&field), "{}", text(&out));
    }
    // Nothing there yet: a golden to record, not an error.
    std::fs::write(
        r.join("x.yaml"),
        with_case_field("      prompt: x\n      golden: later.json\n"),
    )
    .unwrap();
    let out = output_or_hang(&mut fx.cmd(&["plan", "recipes/x.yaml", "--json"]), 60);
    assert_eq!(code(&out), plan_exit(&out), "{}", text(&out));
}
