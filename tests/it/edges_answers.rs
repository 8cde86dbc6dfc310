//! Issue 42 (items 3, 5, 6, 7, 8, 10, 11): the edges a new user hit with
//! several stores, a registry and hostile servers, each answered where it
//! happens: a bad configuration before any work, a gate that could not run
//! without changing the verdict, printed fixes that act on the store they
//! name, a cache that timed out named as such.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::*;

/// A fixture repository in `dir`, a recipe `fx` at its head commit with the
/// default smoke section, and the store path `dir/store`.
/// Returns (repo, commit, recipe, store).
fn fixture_pin(dir: &Path) -> (PathBuf, String, PathBuf, PathBuf) {
    let (repo, commit) = fixture_repo(dir);
    let recipe = write_recipe(dir, "fx", &repo, &commit, SMOKE);
    (repo, commit, recipe, dir.join("store"))
}

/// `oracle-build args...` in `cwd` with a private `XDG_CONFIG_HOME`
/// (`<cwd>/xdg`), so only the test's configuration files are read.
fn run_own(cwd: &Path, args: &[&str]) -> Output {
    cmd(cwd)
        .env("XDG_CONFIG_HOME", cwd.join("xdg"))
        .args(args)
        .output()
        .unwrap()
}

// Item 6: every `config.toml` (the store root's and the user's) is
// validated whole before any work, by every command: a bad
// `[compiler_cache]` or `[[mirror]]` table, or a mirror that drops the
// recipe's git repository, exits 2 naming file, line and field, with
// nothing fetched, locked or written; `plan` refuses alike, and `doctor`
// names it (`bad-config`, unhealthy) even on a root that holds only the
// bad file.
#[test]
fn a_bad_site_config_is_refused_before_any_work_with_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, store) = fixture_pin(d);
    let (r, s) = (recipe.to_str().unwrap(), store.to_str().unwrap());
    let user = d.join("xdg/oracle-build/config.toml");
    for (in_user, body, at) in [
        (
            false,
            "[compiler_cache]\nremote = \"redis://127.0.0.1:99999\"\n",
            "line 2: field `compiler_cache.remote`: value `redis://127.0.0.1:99999`",
        ),
        (
            false,
            "[compiler_cache]\nremote = \"redis://127.0.0.1:6379\"\nread_only = \"yes\"\n",
            "line 3: field `compiler_cache.read_only`",
        ),
        (
            false,
            "[[mirror]]\nprefix = \"https://example.invalid/\"\nurl = \"file:///srv/m/\"\nsuffix = \"x\"\n",
            "line 4: field `mirror[0].suffix`",
        ),
        (
            true,
            "[[mirror]]\nprefix = \"github.com\"\nurl = \"file:///srv/m/\"\n",
            "line 2: field `mirror[0].prefix`: value `github.com`",
        ),
        (
            // Found breaking it: a key given twice named no key.
            false,
            "[[cache]]\nname = \"team\"\nurl = \"file:///srv/a\"\nurl = \"file:///srv/b\"\n",
            "line 4: key `url`: duplicate key",
        ),
        (
            false,
            "[[mirror]]\nprefix = \"file:///\"\nurl = \"none\"\n",
            "line 2: mirror[0] (prefix \"file:///\")",
        ),
    ] {
        let _ = std::fs::remove_dir_all(&store);
        let _ = std::fs::remove_dir_all(d.join("xdg"));
        let file = if in_user {
            user.clone()
        } else {
            store.join("config.toml")
        };
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, body).unwrap();
        let want = format!("{}: {at}", file.display());
        for args in [
            vec!["build", r, "--store", s],
            vec!["plan", r, "--store", s],
            vec!["fetch", r, "--store", s],
            vec!["lock", r, "--store", s],
        ] {
            let out = run_own(d, &args);
            let t = text(&out);
            assert_eq!(code(&out), 2, "{body}\n{args:?}: {t}");
            assert!(t.contains(&want), "{body}\n{args:?}: {want} not in {t}");
            // Nothing was fetched, locked or written: the root holds only
            // the configuration file (when it is the store's).
            let left: Vec<_> = std::fs::read_dir(&store)
                .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            let expected: Vec<std::ffi::OsString> = if in_user {
                vec![]
            } else {
                vec!["config.toml".into()]
            };
            assert_eq!(left, expected, "{body}\n{args:?}: {t}");
            assert!(!d.join("lockfiles").exists(), "{args:?}");
        }
        if !body.contains("\"none\"") {
            // A command without a PIN refuses too.
            let out = run_own(d, &["status", "--store", s]);
            assert_eq!(code(&out), 2, "{body}: {}", text(&out));
            assert!(text(&out).contains(&want), "{}", text(&out));
        }
        // `doctor` names it on a root with nothing else (it was healthy).
        let out = run_own(d, &["doctor", "--store", s, "--pin", r, "--json"]);
        assert_eq!(code(&out), 1, "{body}: {}", text(&out));
        let doc = json(&out);
        let bad = problems_of(&doc, "bad-config");
        assert_eq!(bad.len(), 1, "{body}: {doc}");
        assert!(
            bad[0]["message"].as_str().unwrap().contains(&want),
            "{want} not in {doc}"
        );
        assert_eq!(doc["healthy"], false, "{doc}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), body);
    }
}

// Item 3: a gate that cannot run on this box (its model's variable unset,
// its model missing) reports that and leaves the last verdict in force,
// recording the attempt beside it (`oracle.json` `gate_not_run`): `build`
// exits 0 with the gateable verdict, `activate` still works, `smoke`
// exits 4 saying the gate could not run, and the verdict stays. A gate
// that runs and fails (a model that crashes the engine) still replaces it.
#[test]
fn a_gate_that_cannot_run_leaves_the_last_verdict_in_force() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    fx.exits(&["build", r], 0);
    let venv = fx.oracle("fx");
    let gated = record(&venv)["smoke"].clone();
    assert_eq!(gated["verdict"], "gateable");

    // Without the variable: the gate cannot run; the verdict stands.
    let out = fx
        .cmd(&["build", r, "--json"])
        .env_remove("FX_MODELS")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    let doc = json(&out);
    assert_eq!(doc["verdict"], "gateable", "{doc}");
    let reasons = doc["gate_not_run"]["reasons"].to_string();
    assert!(reasons.contains("${FX_MODELS}, which is not set"), "{doc}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the gate could not run on this box"),
        "{}",
        text(&out)
    );
    let rec = record(&venv);
    assert_eq!(
        rec["smoke"], gated,
        "the verdict is the one recorded before"
    );
    assert_eq!(rec["gate_not_run"]["by"], "build", "{rec}");
    let alias = fx.dir().join("alias");
    let out = fx
        .cmd(&["activate", r, alias.to_str().unwrap()])
        .env_remove("FX_MODELS")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));

    // `smoke` with a model directory that lacks the model: exit 4, the
    // verdict kept, the attempt recorded.
    let out = fx
        .cmd(&["smoke", r])
        .env("FX_MODELS", fx.dir().join("no-models"))
        .output()
        .unwrap();
    assert_eq!(code(&out), 4, "{}", text(&out));
    assert!(
        text(&out).contains("the gate of fx could not run on this box")
            && text(&out).contains("keeps its gateable verdict"),
        "{}",
        text(&out)
    );
    let rec = record(&venv);
    assert_eq!(rec["smoke"], gated);
    assert_eq!(rec["gate_not_run"]["by"], "smoke", "{rec}");

    // A gate that runs and fails is a verdict: it replaces the old one.
    let crash = fx.dir().join("crash-models/model");
    overlay(&fixture_models().join("model"), &crash);
    let config = crash.join("config.json");
    let mut cfg: serde_json::Value = read_json(&config);
    cfg["mode"] = "crash".into();
    std::fs::write(&config, cfg.to_string()).unwrap();
    let out = fx
        .cmd(&["build", r])
        .env("FX_MODELS", crash.parent().unwrap())
        .output()
        .unwrap();
    assert_eq!(code(&out), 4, "{}", text(&out));
    let rec = record(&venv);
    assert_eq!(rec["smoke"]["verdict"], "not-gateable", "{rec}");
    assert!(rec.get("gate_not_run").is_none(), "{rec}");
}

/// The first `` `oracle-build <verb> ...` `` command printed in `text`.
fn printed(text: &str, verb: &str) -> String {
    let start = text
        .find(&format!("`oracle-build {verb} "))
        .unwrap_or_else(|| panic!("no `oracle-build {verb} ...` in:\n{text}"));
    let rest = &text[start + 1..];
    rest[..rest.find('`').unwrap()].to_string()
}

/// Runs a printed command line with a POSIX shell in `cwd`, the binary on
/// `PATH` and the default store at `home` (`ORACLE_BUILD_HOME`): a command
/// that does not name its store acts on `home`.
fn run_printed_with_home(cwd: &Path, line: &str, home: &Path) -> Output {
    let path = format!(
        "{}:{}",
        bin().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let c = cmd(cwd);
    std::process::Command::new("sh")
        .current_dir(cwd)
        .args(["-c", line])
        .envs(c.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
        .env("PATH", path)
        .env("ORACLE_BUILD_HOME", home)
        .output()
        .unwrap()
}

/// Makes `file` and its directory writable (store entries are read-only).
fn unlock(file: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for p in [file.parent().unwrap(), file] {
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode | 0o200)).unwrap();
    }
}

// Item 7: every printed command carries the options that make it act where
// the problem is. With the default store elsewhere (`ORACLE_BUILD_HOME`),
// `activate --store B`'s refusal of a not-gateable oracle prints a fix that,
// run as printed from another directory, gates B's oracle; `doctor --store
// B`'s fix for a damaged oracle rebuilds B's; `smoke`'s advice for a damaged
// oracle names `--deep` and B. The default store is never touched.
#[test]
fn printed_fixes_act_on_the_store_they_were_printed_for() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (_, _, recipe, _) = fixture_pin(d);
    let r = recipe.to_str().unwrap();
    let b = d.join("b");
    let s = b.to_str().unwrap();
    let home = d.join("default-store");
    let elsewhere = d.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    // Built without its gate (the preflight refuses a first build whose
    // gate could not run): not gateable.
    let out = cmd(d)
        .args(["build", r, "--store", s, "--no-smoke"])
        .env_remove("FX_MODELS")
        .output()
        .unwrap();
    assert_eq!(code(&out), 4, "{}", text(&out));
    let alias = d.join("alias");
    let out = run(d, &["activate", r, alias.to_str().unwrap(), "--store", s]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    let fix = printed(&text(&out), "smoke");
    assert!(fix.ends_with(&format!("--store {s}")), "{fix}");
    let out = run_printed_with_home(&elsewhere, &fix, &home);
    assert_eq!(code(&out), 0, "`{fix}`: {}", text(&out));
    let out = run(d, &["activate", r, alias.to_str().unwrap(), "--store", s]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    // A file of B's oracle removed: doctor's fix rebuilds B's oracle.
    let venv = std::fs::canonicalize(b.join("roots/fx")).unwrap();
    let removed = venv.join("lib/python3.11/site-packages/fixturellm/_custom_ops.py");
    unlock(&removed);
    std::fs::remove_file(&removed).unwrap();
    let out = run(d, &["smoke", r, "--store", s]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let advice = printed(&text(&out), "build");
    assert!(
        advice.contains(" --deep") && advice.ends_with(&format!("--store {s}")),
        "{advice}"
    );
    let out = run(d, &["doctor", "--store", s, "--json"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let doc = json(&out);
    let fix = printed(
        problems_of(&doc, "files-missing")[0]["fix"]
            .as_str()
            .unwrap(),
        "build",
    );
    assert!(fix.ends_with(&format!("--store {s}")), "{fix}");
    let out = run_printed_with_home(&elsewhere, &fix, &home);
    assert_eq!(code(&out), 0, "`{fix}`: {}", text(&out));
    assert!(removed.is_file(), "the fix rebuilt B's oracle");
    let out = run(d, &["doctor", "--store", s]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(!home.exists(), "nothing acted on the default store");
}

/// Plants `name` (a `.pth`, which Python runs at every start) in the
/// oracle `venv`'s site-packages and puts the directory's time back, as
/// `touch -r` would; returns the planted file.
fn plant_with_time_restored(venv: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let sp = venv.join("lib/python3.11/site-packages");
    let mtime = std::fs::metadata(&sp).unwrap().modified().unwrap();
    let mode = std::fs::metadata(&sp).unwrap().permissions().mode();
    std::fs::set_permissions(&sp, std::fs::Permissions::from_mode(mode | 0o200)).unwrap();
    let file = sp.join(name);
    std::fs::write(&file, "import os; os.environ['PLANTED'] = '1'\n").unwrap();
    std::fs::set_permissions(&sp, std::fs::Permissions::from_mode(mode)).unwrap();
    std::fs::File::open(&sp)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(std::fs::metadata(&sp).unwrap().modified().unwrap(), mtime);
    file
}

// Item 5: a `.pth` added to an oracle's site-packages with the directory's
// time restored is found by the no-op check (the directory's names are
// listed, not only stat'ed): `build` rebuilds the oracle instead of saying
// "built nothing"; `smoke` refuses the damaged oracle and its advice, run
// as printed, repairs it.
#[test]
fn a_planted_pth_with_the_time_restored_is_found_by_the_no_op() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    fx.exits(&["build", r], 0);
    let venv = fx.oracle("fx");

    let planted = plant_with_time_restored(&venv, "zz-planted.pth");
    let out = fx.exits(&["smoke", r], 1);
    assert!(
        text(&out).contains("added: lib/python3.11/site-packages/zz-planted.pth"),
        "{}",
        text(&out)
    );
    let advice = printed(&text(&out), "build");
    let home = fx.dir().join("default-store");
    let out = run_printed_with_home(fx.dir(), &advice, &home);
    assert_eq!(code(&out), 0, "`{advice}`: {}", text(&out));
    assert!(!planted.exists(), "`{advice}` repaired the oracle");
    assert!(!home.exists());

    let planted = plant_with_time_restored(&fx.oracle("fx"), "zz-planted.pth");
    let doc = json(&fx.exits(&["build", r, "--json"], 0));
    assert!(
        doc["built"].as_array().unwrap().iter().any(|b| b == "venv"),
        "the no-op must not accept it: {doc}"
    );
    assert!(!planted.exists(), "the rebuilt oracle has no planted file");
    fx.exits(&["verify", r, "--deep"], 0);
}

/// A server on 127.0.0.1 that accepts every connection and never answers
/// (the connections are held until the test ends). Returns its port.
fn stalling_server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming() {
            match c {
                Ok(c) => held.push(c),
                Err(_) => break,
            }
        }
    });
    port
}

// Item 8: a cache that does not answer is named, not taken for an empty
// one. `plan` says before asking which cache it waits for and how long,
// then lists the timeout as a cache problem (`cache_problems`, each row
// `not_known`), not "no cache has it"; `verify --provenance` says which
// cache it reads and with what timeouts before it waits, and fails naming
// the cache and the timeout.
#[test]
fn a_cache_that_times_out_is_named_not_taken_for_empty() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    fx.exits(&["build", r], 0);
    let port = stalling_server();
    let url = format!("oci+http://127.0.0.1:{port}/team/oracles");
    std::fs::write(
        fx.store().join("config.toml"),
        format!(
            "[[cache]]\nname = \"team\"\nurl = \"{url}\"\nconnect_timeout = \"1s\"\nread_timeout = \"1s\"\n"
        ),
    )
    .unwrap();

    let t0 = std::time::Instant::now();
    let out = fx
        .cmd(&["plan", r, "--json"])
        .env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .output()
        .unwrap();
    assert!(t0.elapsed().as_secs() < 20, "{:?}", t0.elapsed());
    assert_eq!(code(&out), 0, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "asking cache team ({url}) what it holds (connect timeout 1s, read timeout 1s)"
        )),
        "{err}"
    );
    let doc = json(&out);
    let problems = doc["cache_problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{doc}");
    let p = problems[0].as_str().unwrap();
    assert!(p.contains(&url) && p.contains("timed out"), "{p}");
    let rows = doc["caches"].as_array().unwrap();
    assert!(!rows.is_empty(), "{doc}");
    for row in rows {
        assert!(row["cache"].is_null(), "{row}");
        assert!(row["not_known"].is_string(), "{row}");
    }
    let out = fx
        .cmd(&["plan", r])
        .env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .output()
        .unwrap();
    let t = text(&out);
    assert!(!t.contains("no cache has it"), "{t}");
    assert!(
        t.contains("problem  what cache") && t.contains("timed out"),
        "{t}"
    );

    let out = fx
        .cmd(&["verify", r, "--provenance"])
        .env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let said = err
        .find("reading the provenance of wheel")
        .unwrap_or_else(|| panic!("{err}"));
    let failed = err.find("error: ").unwrap_or_else(|| panic!("{err}"));
    assert!(said < failed, "said before waiting: {err}");
    assert!(
        err[failed..].contains("cache team") && err[failed..].contains("timed out"),
        "{err}"
    );
}

// Item 10e: docs/recipes.md says where a golden of a recipe file is
// written, which is where `smoke --record-golden` writes it: beside the
// recipe (`goldens/<name>/<case>.json`), with a copy in the store.
#[test]
fn goldens_of_a_recipe_file_are_where_the_docs_say() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    fx.exits(&["build", r], 0);
    let out = fx.exits(&["smoke", r, "--record-golden"], 0);
    let beside = fx.dir().join("goldens/fx/small.json");
    assert!(beside.is_file(), "{}", text(&out));
    assert!(fx.store().join("goldens/fx/small.json").is_file());
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/recipes.md"))
            .unwrap();
    let row = docs
        .lines()
        .find(|l| l.starts_with("| `smoke.cases[i].golden` |"))
        .expect("the golden row");
    assert!(
        row.contains("[beside the recipe file: `goldens/<name>/<case>.json`"),
        "{row}"
    );
}

/// Serves `dir` over dumb HTTP (`python3 -m http.server` on 127.0.0.1, a
/// free port): returns the child (killed by the caller) and the port.
fn dumb_http(dir: &Path) -> (std::process::Child, u16) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = std::process::Command::new("python3")
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t.elapsed().as_secs() < 20, "http.server did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (child, port)
}

// Item 11: the small edges, each answered plainly. A store path holding a
// line break is refused up front (exit 2, nothing made), as one with `$`;
// a dumb-HTTP git remote that `git ls-remote` reads passes the pre-build
// check and is fetched; `<PIN> verify` says the PIN came before the
// command; `activate` of another recipe onto an alias says whose alias it
// was; the disk estimate of a CUDA recipe of another package says where
// it comes from.
#[test]
fn small_edges_get_plain_answers() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, commit, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();

    let nl = d.join("store\nx");
    let out = run(d, &["build", r, "--store", nl.to_str().unwrap()]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("holds a line break"), "{}", text(&out));
    assert!(!nl.exists());

    // Dumb HTTP: a bare copy with `git update-server-info`, served as files.
    let served = d.join("served");
    std::fs::create_dir_all(&served).unwrap();
    git(
        d,
        &[
            "clone",
            "-q",
            "--bare",
            repo.to_str().unwrap(),
            "served/repo.git",
        ],
    );
    git(&served.join("repo.git"), &["update-server-info"]);
    let (mut server, port) = dumb_http(&served);
    let url = format!("http://127.0.0.1:{port}/repo.git");
    let text_of = std::fs::read_to_string(&recipe)
        .unwrap()
        .replace(&format!("file://{}", repo.display()), &url)
        .replace("name: fx", "name: fxd");
    let dumb = d.join("fxd.yaml");
    std::fs::write(&dumb, text_of).unwrap();
    let dr = dumb.to_str().unwrap();
    let plan = fx.run(&["plan", dr, "--json"]);
    let doc = json(&plan);
    assert!(
        !doc["problems"].to_string().contains("cannot be reached"),
        "{doc}"
    );
    let out = fx.run(&["fetch", dr]);
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(code(&out), 0, "{}", text(&out));

    // The PIN before a command that takes its own argument.
    let out = fx.run(&[r, "verify"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("is given before the command `verify`")
            && text(&out).contains("oracle-build verify"),
        "{}",
        text(&out)
    );

    // An alias of fx re-pointed to fx2 says whose it was.
    let fx2 = fx.recipe("fx2", &repo, &commit, SMOKE);
    fx.exits(&["build", r], 0);
    fx.exits(&["build", fx2.to_str().unwrap()], 0);
    let alias = d.join("alias");
    let a = alias.to_str().unwrap();
    fx.exits(&["activate", r, a], 0);
    let out = fx.exits(&["activate", fx2.to_str().unwrap(), a], 0);
    assert!(
        text(&out).contains(&format!("{a} was the alias of recipe fx (")),
        "{}",
        text(&out)
    );
    let doc = fx.json(&["activate", r, a, "--json"]);
    assert!(
        doc["was_alias_of"].as_str().unwrap().starts_with("fx2"),
        "{doc}"
    );

    // The disk estimate of a CUDA build of another package than vLLM.
    let cuda = fx.recipe("fxc", &repo, &commit, "  cuda_arch_list: \"9.0\"\n");
    let t = std::fs::read_to_string(&cuda)
        .unwrap()
        .replace("target_device: cpu", "target_device: cuda");
    std::fs::write(&cuda, t).unwrap();
    let out = fx.run(&["plan", cuda.to_str().unwrap(), "--json"]);
    let basis = json(&out)["disk_basis"].as_str().unwrap().to_string();
    assert!(
        basis.contains("measured on vLLM's CUDA builds")
            && basis.contains("builds fixturellm, not vllm"),
        "{basis}"
    );
}
