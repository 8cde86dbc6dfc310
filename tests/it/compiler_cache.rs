//! The team compiler cache (issue 25): two stores at different paths share
//! ccache hits through a real `redis-server` on 127.0.0.1, the next pin
//! recompiles only the file that changed, `plan` says so up front, and a
//! team cache that is unreachable or dies mid-build costs time, never bytes.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::perf::{TUS, heavy_fixture};
use crate::support::*;
use serde_json::Value;

/// The Redis server binary (`apt-get install redis-server`).
const REDIS: &str = "redis-server";

/// What the build says, once, when the team cache fails it.
const FELL_BACK: &str = "did not answer";

/// The test server's password: it must never reach a record or a message.
const PASSWORD: &str = "s3cret-team-pw";

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").port()
}

/// A `redis-server` of this test: 127.0.0.1, a free port, its own config
/// and directory, no persistence, a password ([`PASSWORD`]); stopped by its pid.
struct Redis {
    child: Option<Child>,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Redis {
    fn start() -> Redis {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = free_port();
        let conf = dir.path().join("redis.conf");
        std::fs::write(
            &conf,
            format!(
                "bind 127.0.0.1\nport {port}\nsave \"\"\nappendonly no\ndaemonize no\nrequirepass {PASSWORD}\ndir {}\nlogfile {}\n",
                dir.path().display(),
                dir.path().join("redis.log").display()
            ),
        )
        .unwrap();
        let mut child = Command::new(REDIS)
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{REDIS} starts ({e}): apt-get install redis-server"));
        for _ in 0..400 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Redis {
                    child: Some(child),
                    port,
                    _dir: dir,
                };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("redis-server exited: {status}");
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = child.kill();
        panic!("redis-server did not listen on 127.0.0.1:{port}");
    }

    /// The URL with the password (ccache's password-only form), as
    /// `config.toml` holds it.
    fn url(&self) -> String {
        format!("redis://{PASSWORD}@127.0.0.1:{}", self.port)
    }

    /// The URL as records and messages show it.
    fn shown(&self) -> String {
        format!("redis://***@127.0.0.1:{}", self.port)
    }

    /// Kills it by its pid (the child we started) and reaps it.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `<store>/config.toml` naming the team compiler cache `remote`.
fn team_cache(store: &Path, remote: &str) {
    std::fs::create_dir_all(store).unwrap();
    std::fs::write(
        store.join("config.toml"),
        format!("[compiler_cache]\nremote = \"{remote}\"\n"),
    )
    .unwrap();
}

/// `build <recipe> --no-smoke` in `store` (built, not gated: exit 4);
/// returns the wheel's `build.json` and stderr.
fn build(fx: &Fx, store: &Path, recipe: &Path) -> (Value, String) {
    build_env(fx, store, recipe, &[])
}

/// [`build`] with `env` added to the user's environment.
fn build_env(fx: &Fx, store: &Path, recipe: &Path, env: &[(&str, &str)]) -> (Value, String) {
    let out = fx
        .cmd_at(store, &["build", recipe.to_str().unwrap(), "--no-smoke"])
        .envs(env.iter().copied())
        .output()
        .expect("oracle-build runs");
    assert_eq!(code(&out), 4, "{}", text(&out));
    (
        newest_wheel(store),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `build.json` of the wheel of `store` built last.
fn newest_wheel(store: &Path) -> Value {
    let mut recs: Vec<Value> = std::fs::read_dir(store.join("store/wheels"))
        .unwrap()
        .map(|e| read_json(&e.unwrap().path().join("build.json")))
        .collect();
    recs.sort_by_key(|r| r["started"].as_str().unwrap_or("").to_string());
    recs.pop().expect("a wheel")
}

fn stats(rec: &Value) -> (u64, u64, u64, u64, u64) {
    let s = &rec["compiler_cache_stats"];
    let n = |f: &str| s[f].as_u64().unwrap_or_else(|| panic!("{f} in {s}"));
    (
        n("calls"),
        n("local_hits"),
        n("remote_hits"),
        n("misses"),
        n("remote_errors"),
    )
}

/// The fixture's next pins: `k07.cpp` changed (c2), then a README only (c3).
fn next_pins(repo: &Path) -> (String, String) {
    let tu = repo.join("csrc/gen/k07.cpp");
    let mut text = std::fs::read_to_string(&tu).unwrap();
    text.push_str("extern \"C\" int fx_gen_7b(int x) { return x + 7; }\n");
    std::fs::write(&tu, text).unwrap();
    git(repo, &["commit", "-qam", "k07: one more function"]);
    let c2 = git(repo, &["rev-parse", "HEAD"]);
    std::fs::write(repo.join("NOTES.md"), "docs only\n").unwrap();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "docs only"]);
    (c2, git(repo, &["rev-parse", "HEAD"]))
}

#[test]
fn two_stores_share_compiler_hits_through_a_team_redis_and_a_lost_cache_costs_only_time() {
    assert!(
        which::which("ccache").is_ok(),
        "ccache is not on PATH (.ci/run installs it)"
    );
    let fx = Fx::new();
    let (repo, c1) = heavy_fixture(fx.dir());
    let (c2, c3) = next_pins(&repo);
    let r1 = fx.recipe("fx", &repo, &c1, "");
    let r2 = fx.recipe("fx-next", &repo, &c2, "");
    let r3 = fx.recipe("fx-docs", &repo, &c3, "");
    let mut redis = Redis::start();
    // Two boxes: stores at different paths, so different build directories.
    let a = fx.dir().join("box-a/store");
    let b = fx.dir().join("box-b/home/someone/store");
    team_cache(&a, &redis.url());
    team_cache(&b, &redis.url());

    // Store A, cold: every translation unit compiled, and written to Redis.
    let (cold, err) = build(&fx, &a, &r1);
    assert_eq!(cold["compiler_cache_remote"], redis.shown().as_str());
    // ccache is every compiler's launcher; its keys ignore the store's path.
    let env = &cold["env"];
    for lang in ["C", "CXX", "CUDA"] {
        assert!(
            env["CMAKE_ARGS"]
                .as_str()
                .unwrap()
                .contains(&format!("-DCMAKE_{lang}_COMPILER_LAUNCHER=")),
            "{env}"
        );
    }
    assert_eq!(env["CCACHE_NOHASHDIR"], "1");
    assert!(
        env["CCACHE_BASEDIR"]
            .as_str()
            .unwrap()
            .starts_with(a.to_str().unwrap())
    );
    assert!(env.get("CCACHE_REMOTE_STORAGE").is_none(), "{env}");
    assert!(err.contains(&redis.shown()), "{err}");
    // The password is in no record and no message.
    assert!(!err.contains(PASSWORD), "{err}");
    let records = tree(&a.join("store/wheels"))
        .into_iter()
        .chain(
            tree(&a.join("store/venvs"))
                .into_iter()
                .filter(|p| p.ends_with("oracle.json")),
        )
        .chain(tree(&a.join("logs")));
    for f in records {
        if f.is_file() {
            let bytes = std::fs::read(&f).unwrap();
            assert!(
                !bytes
                    .windows(PASSWORD.len())
                    .any(|w| w == PASSWORD.as_bytes()),
                "{} holds the password",
                f.display()
            );
        }
    }
    let (calls, _, remote, misses, errors) = stats(&cold);
    assert!(misses > TUS as u64, "{cold}");
    assert_eq!((remote, errors), (0, 0), "{cold}");
    assert!(calls >= misses);

    // Store B, the same pin: served by the team cache, the same wheel. Its
    // user's own CMAKE_ARGS and CMAKE_* are scrubbed (issue 22) and named;
    // the launchers the tool sets in CMAKE_ARGS are the build's (the unit
    // test `the_user_s_compiler_variables_are_removed_and_the_tool_s_own_values_win`
    // checks they are not removed).
    let (warm, _) = build_env(
        &fx,
        &b,
        &r1,
        &[
            ("CMAKE_ARGS", "-DOB_USER_FLAG=1"),
            ("CMAKE_C_COMPILER_LAUNCHER", "/bin/false"),
        ],
    );
    let scrubbed = warm["scrubbed_env"].to_string();
    for var in ["CMAKE_ARGS", "CMAKE_C_COMPILER_LAUNCHER"] {
        assert!(scrubbed.contains(var), "{var}: {warm}");
    }
    let args = warm["env"]["CMAKE_ARGS"].as_str().unwrap();
    assert!(args.contains("-DCMAKE_C_COMPILER_LAUNCHER="), "{warm}");
    assert!(!args.contains("OB_USER_FLAG"), "{warm}");
    assert_eq!(warm["key"], cold["key"]);
    assert_eq!(
        warm["sha256"], cold["sha256"],
        "hits change time, never bytes"
    );
    let (calls, local, remote, misses, _) = stats(&warm);
    assert_eq!(local, 0, "{warm}");
    assert!(
        remote * 100 >= calls * 95,
        "at least 95% remote hits: {warm}"
    );
    assert!(remote > TUS as u64, "{warm}");
    assert_eq!(misses, 0, "{warm}");

    // `plan` for the next pin says, before any build, what will recompile.
    let plan = fx.run_at(&b, &["plan", r2.to_str().unwrap(), "--json"]);
    let cost = &json(&plan)["compile_cost"];
    assert_eq!(cost["since"], c1.as_str(), "{cost}");
    assert_eq!(
        cost["translation_units"],
        serde_json::json!(["csrc/gen/k07.cpp"]),
        "{cost}"
    );
    let shown = fx.run_at(&b, &["plan", r2.to_str().unwrap()]);
    assert!(
        text(&shown).contains("1 translation unit changed since"),
        "{}",
        text(&shown)
    );

    // Store B, the next pin: only the changed file misses.
    let (next, _) = build(&fx, &b, &r2);
    let (_, _, _, misses, _) = stats(&next);
    assert_eq!(misses, 1, "{next}");
    let missed = next["compiler_cache_stats"]["missed"].as_array().unwrap();
    assert_eq!(missed.len(), 1, "{next}");
    assert!(
        missed[0].as_str().unwrap().ends_with("csrc/gen/k07.cpp"),
        "{next}"
    );
    // A pin that changes no extension source: hits expected, said up front.
    let docs = fx.run_at(&b, &["plan", r3.to_str().unwrap()]);
    assert!(
        text(&docs).contains("no extension source changed since"),
        "{}",
        text(&docs)
    );

    // The cache configuration is no part of the wheel key.
    let key = |store: &Path| {
        json(&fx.run_at(store, &["plan", r1.to_str().unwrap(), "--json"]))["keys"]["wheel"].clone()
    };
    let with = key(&a);
    std::fs::remove_file(a.join("config.toml")).unwrap();
    assert_eq!(key(&a), with);
    assert_eq!(with, cold["key"]);

    // Unreachable (a closed port): built all the same, said once, same wheel.
    team_cache(&a, &format!("redis://127.0.0.1:{}", free_port()));
    let (lost, err) = build(&fx, &a, &r2);
    assert_eq!(lost["sha256"], next["sha256"]);
    assert_eq!(err.matches(FELL_BACK).count(), 1, "{err}");
    let (_, _, _, misses, errors) = stats(&lost);
    assert_eq!(misses, 1, "{lost}");
    assert!(errors >= 1, "{lost}");

    // Killed mid-build: store C takes its first hits from Redis, then the
    // server is stopped by its pid; ccache compiles the rest.
    let c = fx.dir().join("box-c/store");
    team_cache(&c, &redis.url());
    let mut child = fx
        .cmd_at(&c, &["build", r1.to_str().unwrap(), "--no-smoke"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let log = c.join("tmp").join(format!(
        "build-{}/ccache-stats.log",
        cold["key"].as_str().unwrap()
    ));
    loop {
        let calls = std::fs::read_to_string(&log)
            .map(|t| t.lines().filter(|l| l.starts_with('#')).count())
            .unwrap_or(0);
        if calls >= 1 {
            redis.stop();
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the build ended before its first compiler call"
        );
        assert!(t0.elapsed() < Duration::from_secs(600), "no compiler call");
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    let killed = newest_wheel(&c);
    assert_eq!(killed["sha256"], cold["sha256"]);
    assert_eq!(err.matches(FELL_BACK).count(), 1, "{err}");
    let (_, _, _, misses, errors) = stats(&killed);
    assert!(errors >= 1 && misses >= 1, "{killed}");
}

/// Issue 42, item 9: a team cache that accepts connections and never
/// answers (a TCP listener of the test on 127.0.0.1, `operation_timeout =
/// "1s"`) costs a few compiler calls, not every one: the build skips it
/// after the first timeout (its probe gets no answer), says so once,
/// records `remote_skipped`, and most calls never ask it.
#[test]
fn a_stalled_team_cache_is_skipped_after_its_first_timeout_and_said_once() {
    assert!(
        which::which("ccache").is_ok(),
        "ccache is not on PATH (.ci/run installs it)"
    );
    let fx = Fx::new();
    let (repo, c1) = heavy_fixture(fx.dir());
    let r1 = fx.recipe("fx", &repo, &c1, "");
    let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held: Vec<TcpStream> = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
        }
    });
    let store = fx.store().to_path_buf();
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(
        store.join("config.toml"),
        format!(
            "[compiler_cache]\nremote = \"redis://127.0.0.1:{port}\"\noperation_timeout = \"1s\"\n"
        ),
    )
    .unwrap();
    let t0 = Instant::now();
    let (rec, err) = build(&fx, &store, &r1);
    let took = t0.elapsed();
    let (calls, _, _, _, errors) = stats(&rec);
    const SKIPPED: &str = "skipped for the rest of this build";
    assert_eq!(err.matches(SKIPPED).count(), 1, "{err}");
    assert_eq!(rec["compiler_cache_stats"]["remote_skipped"], true, "{rec}");
    assert!(calls >= TUS as u64, "{rec}");
    assert!(
        errors >= 1 && errors * 3 < calls,
        "only the calls before the skip ask the stalled cache ({errors} of {calls} did): {rec}"
    );
    eprintln!(
        "stalled team cache: {errors} of {calls} compiler calls timed out (1 s each), build {:.1} s",
        took.as_secs_f64()
    );
}

/// Issue 43: a setuptools `build_ext` package (the plain fixture: no CMake)
/// compiles through ccache (`CC` / `CXX` scripts in the build's work
/// directory), so a second store gets its objects from the team cache;
/// the recorded compilers stay the real ones; and a build with the cache
/// configured that compiled nothing says so.
#[test]
fn a_setuptools_build_ext_package_gets_team_cache_hits_in_a_second_store_and_a_build_without_calls_says_so()
 {
    assert!(
        which::which("ccache").is_ok(),
        "ccache is not on PATH (.ci/run installs it)"
    );
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    assert!(
        !repo.join("CMakeLists.txt").exists(),
        "the plain fixture builds with setuptools"
    );
    let recipe = fx.recipe("fx", &repo, &commit, "");
    let redis = Redis::start();
    let a = fx.dir().join("box-a/store");
    let b = fx.dir().join("box-b/home/someone/store");
    team_cache(&a, &redis.url());
    team_cache(&b, &redis.url());

    let (cold, _) = build(&fx, &a, &recipe);
    let (calls, _, remote, misses, _) = stats(&cold);
    assert!(calls >= 1 && misses >= 1, "{cold}");
    assert_eq!(remote, 0, "{cold}");
    assert!(cold.get("compiler_cache_unused").is_none(), "{cold}");
    // setuptools ran the scripts; CMake would get the real compilers; the
    // record's compilers are the real ones.
    let env = &cold["env"];
    let cc = env["CC"].as_str().unwrap();
    assert!(cc.ends_with("/ccache-bin/cc"), "{env}");
    assert!(
        env["CXX"].as_str().unwrap().ends_with("/ccache-bin/c++"),
        "{env}"
    );
    let args = env["CMAKE_ARGS"].as_str().unwrap();
    assert!(args.contains("-DCMAKE_C_COMPILER=/"), "{args}");
    assert!(!args.contains("ccache-bin"), "{args}");
    let tools = cold["tools"]["compilers"].to_string();
    assert!(!tools.contains("ccache"), "{tools}");
    assert!(
        cold["tools"]["compilers"]["cc"]["path"].is_string(),
        "{tools}"
    );

    // Store B: the same objects from the team cache, the same wheel.
    let (warm, _) = build(&fx, &b, &recipe);
    let (_, _, remote, misses, errors) = stats(&warm);
    assert!(remote >= 1, "{warm}");
    assert_eq!((misses, errors), (0, 0), "{warm}");
    assert_eq!(warm["sha256"], cold["sha256"]);

    // No extension to build: the configured cache saw no call, and says so.
    let empty = fx.dir().join("fx-empty.yaml");
    std::fs::write(
        &empty,
        std::fs::read_to_string(&recipe)
            .unwrap()
            .replace("name: fx\n", "name: fx-empty\n")
            .replace("target_device: cpu", "target_device: empty"),
    )
    .unwrap();
    let (none, err) = build(&fx, &a, &empty);
    assert_eq!(none["compiler_cache_stats"]["calls"], 0, "{none}");
    let note = none["compiler_cache_unused"]
        .as_str()
        .unwrap_or_else(|| panic!("{none}"));
    assert!(note.contains("no compiler call went through it"), "{note}");
    assert!(err.contains("warning: the compiler cache"), "{err}");
}

/// The objects of the fixture's extension that ninja logged as built
/// (`.ninja_log` lines under `<store>/tmp`, ninja writes one when a command
/// ends), as their sources: `CMakeFiles/_C.dir/csrc/gen/k07.cpp.o` ->
/// `csrc/gen/k07.cpp`.
fn logged_objects(store: &Path) -> Vec<String> {
    let mut done = Vec::new();
    for log in tree(&store.join("tmp")) {
        if log.file_name().is_some_and(|n| n == ".ninja_log") {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let Some(out) = line.split('\t').nth(3) else {
                    continue;
                };
                if let Some(src) = out
                    .strip_suffix(".o")
                    .and_then(|o| o.split_once(".dir/").map(|(_, s)| s))
                    .filter(|s| s.starts_with("csrc/"))
                {
                    done.push(src.to_string());
                }
            }
        }
    }
    done.sort();
    done.dedup();
    done
}

#[test]
fn a_build_killed_midway_recompiles_only_what_it_had_not_compiled() {
    use std::os::unix::process::CommandExt;
    assert!(
        which::which("ccache").is_ok(),
        "ccache is not on PATH (.ci/run installs it)"
    );
    let fx = Fx::new();
    let (repo, commit) = heavy_fixture(fx.dir());
    let recipe = fx.recipe("fx", &repo, &commit, "");
    let r = recipe.to_str().unwrap();
    // The first build, its own process group, killed as a lease ends (SIGKILL
    // to the whole group) once ninja has logged its first object.
    let mut child = fx
        .cmd(&["build", r, "--no-smoke"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("oracle-build starts");
    while logged_objects(fx.store()).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the build ended before ninja logged an object"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kills the process group the test started (the tool leads it).
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait();
    // Read after the kill: ninja is gone, its log is final.
    let done = logged_objects(fx.store());
    let all = TUS as u64 + 1; // csrc/ops.c and the generated ones
    assert!(
        !done.is_empty() && (done.len() as u64) < all,
        "killed midway: {done:?}"
    );
    assert!(
        !fx.store().join("store/wheels").is_dir()
            || std::fs::read_dir(fx.store().join("store/wheels"))
                .unwrap()
                .next()
                .is_none(),
        "the killed build published no wheel"
    );

    // The rerun: every object compiled before the kill is a compiler-cache
    // hit, the rest are compiled (misses), none of them one already done.
    let (rec, _) = build(&fx, fx.store(), &recipe);
    let s = &rec["compiler_cache_stats"];
    let n = |f: &str| s[f].as_u64().unwrap_or_else(|| panic!("{f} in {s}"));
    let (hits, misses) = (n("hits"), n("misses"));
    eprintln!(
        "killed after {} objects; the rerun: {hits} hits, {misses} misses",
        done.len()
    );
    assert!(hits >= done.len() as u64, "{} done: {s}", done.len());
    assert!(misses >= 1, "the rest was compiled: {s}");
    assert!(hits + misses >= all, "{s}");
    for missed in s["missed"].as_array().unwrap() {
        let missed = missed.as_str().unwrap();
        assert!(
            !done.iter().any(|d| missed.ends_with(d.as_str())),
            "{missed} was compiled before the kill, yet missed: {s}"
        );
    }
}
