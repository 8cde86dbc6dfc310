//! The fixture and setup helpers every integration test shares: a real git
//! repository of the fixture package (made with the real `git`), recipes
//! pointing at it, a store, and the real `oracle-build` binary run with that
//! store already passed ([`Fx`]), plus readers of its stdout, stderr and JSON.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The fixture's own files, committed under tests/fixture/pkg: an overlay
/// on the demo package (see [`write_fixture_pkg`]).
pub fn fixture_pkg() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture/pkg")
}

/// The demo package `oracle-build demo` builds (`demo/pkg`, package `demollm`).
pub fn demo_pkg() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("demo/pkg")
}

/// The demo package's name and its spellings, and the fixture's.
const DEMO_TO_FIXTURE: &[(&str, &str)] = &[
    ("demollm", "fixturellm"),
    ("DEMOLLM", "FIXTURELLM"),
    ("demo-bigram", "fixture-bigram"),
];

/// Writes the fixture package `fixturellm` into `dst` (created): the demo
/// package (`demo/pkg`) under the fixture's name (its `demollm` paths and
/// names renamed; its README and requirements left out), then the
/// fixture's own files (`tests/fixture/pkg`: setup.py, pyproject.toml,
/// config.py, model.py, requirements/) over it, as the CUDA and CMake
/// variants are overlays on the fixture.
pub fn write_fixture_pkg(dst: &Path) {
    fn renamed(s: &str) -> String {
        DEMO_TO_FIXTURE
            .iter()
            .fold(s.to_string(), |s, (from, to)| s.replace(from, to))
    }
    fn copy(src: &Path, dst: &Path) {
        std::fs::create_dir_all(dst).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let e = e.unwrap();
            let name = renamed(&e.file_name().to_string_lossy());
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &dst.join(name));
            } else {
                let text = std::fs::read_to_string(e.path()).unwrap();
                std::fs::write(dst.join(name), renamed(&text)).unwrap();
            }
        }
    }
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(demo_pkg()).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "README.md" || name == "requirements" {
            continue;
        }
        let to = dst.join(renamed(&name));
        if e.file_type().unwrap().is_dir() {
            copy(&e.path(), &to);
        } else {
            std::fs::write(&to, renamed(&std::fs::read_to_string(e.path()).unwrap())).unwrap();
        }
    }
    overlay(&fixture_pkg(), dst);
}

/// The fixture models directory (holds `model/` and `model-b/`).
pub fn fixture_models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture")
}

/// A tools directory shared by the tests, so uv is provisioned once.
pub fn shared_tools() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("oracle-build-tools")
}

/// Runs git in `dir` with a fixed identity; panics on failure.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.email=test@example.com",
            "-c",
            "user.name=Test",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A git repository of the fixture at `dir/repo`: commit, tag `v0.1.0`,
/// one more commit. Returns (repo path, head commit).
pub fn fixture_repo(dir: &Path) -> (PathBuf, String) {
    let repo = dir.join("repo");
    write_fixture_pkg(&repo);
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "fixture"]);
    git(&repo, &["tag", "v0.1.0"]);
    std::fs::write(repo.join("NOTES.md"), "second commit\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "second"]);
    let head = git(&repo, &["rev-parse", "HEAD"]);
    (repo, head)
}

/// A fixture recipe named `name` for `commit` of `repo`, with `extra` YAML
/// appended (top-level keys). The smoke case uses `${FX_MODELS}/model`.
pub fn recipe_text(name: &str, repo: &Path, commit: &str, extra: &str) -> String {
    format!(
        "name: {name}\nsource:\n  repo: file://{}\n  commit: {commit}\n  package: fixturellm\npython: \"3.11\"\nbuild:\n  target_device: cpu\n{extra}",
        repo.display()
    )
}

/// The default smoke section of fixture recipes.
pub const SMOKE: &str = "smoke:\n  runs: 3\n  cases:\n    - name: small\n      model: ${FX_MODELS}/model\n      prompt: \"The capital of France is Paris, and the\"\n      max_tokens: 16\n      engine_args: {enforce_eager: true, max_model_len: 256, gpu_memory_utilization: 0.5, max_num_seqs: 1, dtype: bfloat16}\n";

/// Writes a fixture recipe to `dir/<name>.yaml` and returns its path.
pub fn write_recipe(dir: &Path, name: &str, repo: &Path, commit: &str, extra: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, recipe_text(name, repo, commit, extra)).unwrap();
    path
}

/// The `oracle-build` binary under test.
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_oracle-build"))
}

/// Gives `c` the test environment: shared tools, the fixture models, no
/// inherited store, recipe or Python settings. Everything a test runs that
/// runs the binary gets it from here (each child its own environment: the
/// tests share one process, so nothing is set with `std::env::set_var`).
pub fn test_env(c: &mut Command) -> &mut Command {
    c.env("ORACLE_BUILD_TOOLS", shared_tools())
        .env("FX_MODELS", fixture_models())
        .env_remove("ORACLE_BUILD_HOME")
        .env_remove("ORACLE_BUILD_RECIPES")
        .env_remove("ORACLE_BUILD_PYTHON")
        .env_remove("ORACLE_BUILD_CACHE")
}

/// The `oracle-build` binary with the test environment ([`test_env`]), cwd `cwd`.
pub fn cmd(cwd: &Path) -> Command {
    let mut c = Command::new(bin());
    test_env(c.current_dir(cwd));
    c
}

/// Runs the binary with `args` in `cwd`.
pub fn run(cwd: &Path, args: &[&str]) -> Output {
    cmd(cwd).args(args).output().expect("oracle-build runs")
}

/// stdout + stderr as text, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The exit code (panics on a signal).
pub fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

/// The problems of `kind` in a `doctor --json` document `doc`.
pub fn problems_of<'a>(doc: &'a Value, kind: &str) -> Vec<&'a Value> {
    doc["problems"]
        .as_array()
        .map(|ps| ps.iter().filter(|p| p["kind"] == kind).collect())
        .unwrap_or_default()
}

/// Parses stdout as JSON.
pub fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", text(out)))
}

/// Files and directories under `dir`, recursively (empty when absent).
pub fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            out.push(e.path());
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.extend(tree(&e.path()));
            }
        }
    }
    out
}

/// Makes everything under `dir` writable and deletes it (store entries are read-only).
pub fn force_remove(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for p in tree(dir).into_iter().chain([dir.to_path_buf()]) {
        if let Ok(m) = std::fs::symlink_metadata(&p)
            && !m.file_type().is_symlink()
        {
            let _ = std::fs::set_permissions(
                &p,
                std::fs::Permissions::from_mode(m.permissions().mode() | 0o200),
            );
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// Parses the JSON file at `path` (panics naming the path).
pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `oracle.json` of the venv at `venv`.
pub fn record(venv: &Path) -> Value {
    read_json(&venv.join("oracle.json"))
}

/// A test's own temporary directory (deleted when dropped), the store in it
/// (`<dir>/store`, made by the binary when it needs one), and the real binary
/// run there with `--store <dir>/store` already passed.
pub struct Fx {
    tmp: tempfile::TempDir,
    store: PathBuf,
}

impl Fx {
    /// A fresh, empty test directory.
    pub fn new() -> Fx {
        let tmp = tempfile::tempdir().expect("a temporary directory");
        let store = tmp.path().join("store");
        Fx { tmp, store }
    }

    /// The test directory: the binary's working directory.
    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// The store passed as `--store`.
    pub fn store(&self) -> &Path {
        &self.store
    }

    /// A fixture repository at `<dir>/repo` (see [`fixture_repo`]): (path, head commit).
    pub fn repo(&self) -> (PathBuf, String) {
        fixture_repo(self.dir())
    }

    /// Writes the recipe `<dir>/<name>.yaml` (see [`write_recipe`]) and returns its path.
    pub fn recipe(&self, name: &str, repo: &Path, commit: &str, extra: &str) -> PathBuf {
        write_recipe(self.dir(), name, repo, commit, extra)
    }

    /// The usual setup: a fixture repository and the recipe `fx.yaml` at its
    /// head commit with the default smoke section. Returns (repo, commit, recipe).
    pub fn pin(&self) -> (PathBuf, String, PathBuf) {
        let (repo, commit) = self.repo();
        let recipe = self.recipe("fx", &repo, &commit, SMOKE);
        (repo, commit, recipe)
    }

    /// `oracle-build <args> --store <store>` in the test directory, not yet run
    /// (to add environment, stdio or another working directory).
    pub fn cmd(&self, args: &[&str]) -> Command {
        self.cmd_at(&self.store, args)
    }

    /// `oracle-build <args> --store <store>` for another store than the test's own.
    pub fn cmd_at(&self, store: &Path, args: &[&str]) -> Command {
        let mut c = cmd(self.dir());
        c.args(args).arg("--store").arg(store);
        c
    }

    /// Runs `oracle-build <args> --store <store>` in the test directory.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("oracle-build runs")
    }

    /// Runs `oracle-build <args> --store <store>` for another store than the test's own.
    pub fn run_at(&self, store: &Path, args: &[&str]) -> Output {
        self.cmd_at(store, args)
            .output()
            .expect("oracle-build runs")
    }

    /// Runs `oracle-build <args> --store <store>` and asserts it exits `want`.
    pub fn exits(&self, args: &[&str], want: i32) -> Output {
        let out = self.run(args);
        assert_eq!(code(&out), want, "oracle-build {args:?}:\n{}", text(&out));
        out
    }

    /// Runs `oracle-build <args> --store <store>`, asserts exit 0 and returns stdout as JSON.
    pub fn json(&self, args: &[&str]) -> Value {
        json(&self.exits(args, 0))
    }

    /// Runs `build <recipe> --store <store>` (the text report, the smoke gate included).
    pub fn build(&self, recipe: &Path) -> Output {
        self.run(&["build", recipe.to_str().expect("a UTF-8 recipe path")])
    }

    /// Runs `build <recipe> --json` for `store`, asserts exit 0 and returns the report.
    pub fn build_json(&self, store: &Path, recipe: &Path) -> Value {
        let out = self.run_at(
            store,
            &[
                "build",
                recipe.to_str().expect("a UTF-8 recipe path"),
                "--json",
            ],
        );
        assert_eq!(code(&out), 0, "{}", text(&out));
        json(&out)
    }

    /// The oracle venv of recipe `name`: the target of `<store>/roots/<name>`.
    pub fn oracle(&self, name: &str) -> PathBuf {
        let root = self.store.join("roots").join(name);
        root.canonicalize()
            .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
    }
}

/// The exit code `plan --json` must give for its output `out`: 0 when a
/// build could run now (no `problems`), 1 when it would stop.
pub fn plan_exit(out: &Output) -> i32 {
    let blocked = json(out)["problems"]
        .as_array()
        .is_some_and(|p| !p.is_empty());
    i32::from(blocked)
}

/// An ed25519 key pair made by `ssh-keygen` in `dir` for `principal`: the
/// private key's path and the key's `allowed_signers` line.
pub fn keypair(dir: &Path, principal: &str) -> (PathBuf, String) {
    let key = dir.join(format!("key-{principal}"));
    succeeds(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", principal, "-f"])
            .arg(&key),
    );
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let mut parts = public.split_whitespace();
    let (t, k) = (parts.next().unwrap(), parts.next().unwrap());
    (key, format!("{principal} {t} {k}\n"))
}

/// [`fixture_repo`] with the files of `tests/fixture/<overlay>/` copied
/// over the package (not yet committed): the CMake variants of the fixture.
pub fn fixture_repo_with(dir: &Path, name: &str) -> (PathBuf, String) {
    let (repo, commit) = fixture_repo(dir);
    overlay(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixture")
            .join(name),
        &repo,
    );
    (repo, commit)
}

/// Runs `c` to its end and returns its output, failing the test with its
/// stderr when it exits non-zero.
pub fn succeeds(c: &mut Command) -> Output {
    let out = c.output().expect("the command starts");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Copies the files of `src` into `dst` (created), replacing files already there.
pub fn overlay(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            overlay(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

/// The one entry of the directory `dir` (a store bucket holding a single
/// mirror, wheel...); panics naming what is there when it is not exactly one.
pub fn only_entry(dir: &Path) -> PathBuf {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{}: {entries:?}", dir.display());
    entries[0].clone()
}

/// Runs `c` (stdout and stderr captured) and returns its output; when it
/// runs past `secs` seconds it is killed and the test fails with what it
/// printed (a command that must not hang: one handed a FIFO, a stalled
/// peer), so a regression fails instead of hanging the suite.
pub fn output_or_hang(c: &mut Command, secs: u64) -> Output {
    use std::process::Stdio;
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(out) => out.expect("the command ran"),
        Err(_) => {
            // SAFETY: the child this test started, not yet waited for.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let out = rx.recv().expect("the waiter answers").expect("it ran");
            panic!("hung for {secs} s:\n{}", text(&out));
        }
    }
}

/// Makes a FIFO at `path` (`mkfifo(3)`): what a plain open blocks on until a
/// writer comes.
pub fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

/// Makes a sparse file of `len` bytes at `path` (no data written).
pub fn sparse_file(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}
