//! Shared helpers of the integration tests: a real git repository of the
//! fixture package (made with the real `git`), recipes pointing at it, and
//! the real `oracle-build` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The fixture package source, committed under tests/fixture/pkg.
pub fn fixture_pkg() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture/pkg")
}

/// The fixture models directory (holds `model/` and `model-b/`).
pub fn fixture_models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture")
}

/// A tools directory shared by the tests, so uv is provisioned once.
pub fn shared_tools() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("oracle-build-tools")
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
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
    copy_dir(&fixture_pkg(), &repo);
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

/// The `oracle-build` binary with the test environment: shared tools, the
/// fixture models, no inherited store or recipe settings, cwd `cwd`.
pub fn cmd(cwd: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_oracle-build"));
    c.current_dir(cwd)
        .env("ORACLE_BUILD_TOOLS", shared_tools())
        .env("FX_MODELS", fixture_models())
        .env_remove("ORACLE_BUILD_HOME")
        .env_remove("ORACLE_BUILD_RECIPES")
        .env_remove("ORACLE_BUILD_PYTHON");
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

/// Parses stdout as JSON.
pub fn json(out: &Output) -> serde_json::Value {
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

/// Runs `build <recipe> --store <store> <extra...>` in `cwd`.
pub fn build_out(cwd: &Path, recipe: &Path, store: &Path, extra: &[&str]) -> Output {
    cmd(cwd)
        .args([
            "build",
            &recipe.display().to_string(),
            "--store",
            &store.display().to_string(),
        ])
        .args(extra)
        .output()
        .expect("oracle-build runs")
}

/// The usual setup of a test: a fixture repository in `dir`, a recipe `fx`
/// at its head commit with the default smoke section, and a store path.
/// Returns (repo, commit, recipe, store).
pub fn fixture_pin(dir: &Path) -> (PathBuf, String, PathBuf, PathBuf) {
    let (repo, commit) = fixture_repo(dir);
    let recipe = write_recipe(dir, "fx", &repo, &commit, SMOKE);
    (repo, commit, recipe, dir.join("store"))
}

/// The exit code `plan --json` must give for its output `out`: 0 when a
/// build could run now (no `problems`), 1 when it would stop.
pub fn plan_exit(out: &Output) -> i32 {
    let blocked = json(out)["problems"]
        .as_array()
        .is_some_and(|p| !p.is_empty());
    i32::from(blocked)
}
