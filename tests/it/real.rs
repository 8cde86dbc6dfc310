//! vLLM-shaped trees end to end: the runtime set is what the built wheel
//! declares (for `empty` and `cpu`), a lock that misses a declared
//! requirement is refused before install, with the real binary, git, uv and
//! python.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::*;
use serde_json::Value;

/// The build or command succeeded: exit 0, or, for a `build --no-smoke`,
/// exit 4 (built but, not smoked, not gateable) saying so.
fn ok(out: &Output) {
    let t = text(out);
    let unsmoked = code(out) == 4 && t.contains("not smoked");
    assert!(code(out) == 0 || unsmoked, "exit {}: {t}", code(out));
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The binary where any network use fails (proxies and indexes point at a
/// closed local port).
fn offline_cmd(cwd: &Path) -> Command {
    let dead = format!("http://127.0.0.1:{}", closed_port());
    let mut c = cmd(cwd);
    for v in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        c.env(v, &dead);
    }
    c.env("NO_PROXY", "")
        .env("no_proxy", "")
        .env("UV_INDEX_URL", format!("{dead}/simple"))
        .env("UV_DEFAULT_INDEX", format!("{dead}/simple"))
        .env("PIP_INDEX_URL", format!("{dead}/simple"));
    c
}

/// A fixture recipe `name` for `device`, without smoke cases.
fn device_recipe(dir: &Path, name: &str, repo: &Path, commit: &str, device: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let text = recipe_text(name, repo, commit, "")
        .replace("target_device: cpu", &format!("target_device: {device}"));
    std::fs::write(&path, text).unwrap();
    path
}

fn with_store(c: &mut Command, args: &[&str], store: &Path) -> Output {
    c.args(args)
        .args(["--store", store.to_str().unwrap(), "--json"])
        .output()
        .unwrap()
}

/// In the oracle venv: every installed distribution, and the closure of
/// `fixturellm`'s Requires-Dist (markers evaluated there, extras followed),
/// both computed by the venv's own importlib.metadata and packaging.
const CLOSURE_PY: &str = r#"
import json, importlib.metadata as md
import packaging, idna, fixturellm
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as c
installed = {c(d.metadata["Name"]): d.version for d in md.distributions()}
seen, todo = set(), [("fixturellm", ())]
while todo:
    name, extras = todo.pop()
    key = (c(name), tuple(sorted(extras)))
    if key in seen:
        continue
    seen.add(key)
    for line in md.requires(name) or []:
        r = Requirement(line)
        envs = [{"extra": x} for x in extras] or [{"extra": ""}]
        if r.marker is None or any(r.marker.evaluate(e) for e in envs):
            assert c(r.name) in installed, (line, "not installed")
            assert r.specifier.contains(installed[c(r.name)], prereleases=True), (line, installed[c(r.name)])
            todo.append((r.name, tuple(r.extras)))
print(json.dumps({"installed": sorted(installed), "closure": sorted({n for n, _ in seen}),
                  "version": md.version("fixturellm"), "imports": [packaging.__name__, idna.__name__]}))
"#;

fn venv_closure(oracle: &Path) -> Value {
    let out = Command::new(oracle.join("bin/python"))
        .args(["-c", CLOSURE_PY])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn locked_names(lock_file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(lock_file).unwrap();
    let mut names: Vec<String> = text
        .split("[[packages]]")
        .skip(1)
        .filter_map(|p| {
            let l = p.lines().find(|l| l.starts_with("name = "))?;
            Some(
                l.trim_start_matches("name = ")
                    .trim_matches('"')
                    .to_lowercase(),
            )
        })
        .collect();
    names.sort();
    names
}

fn empty_or_cpu_oracle_is_the_wheels_requires_dist_closure(device: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, commit) = fixture_repo(d);
    let recipe = device_recipe(d, "fx", &repo, &commit, device);
    let store = d.join("store-a");

    // `lock` asks the tree (PEP 517 hook in the locked build venv) and says so.
    let out = with_store(&mut cmd(d), &["lock", recipe.to_str().unwrap()], &store);
    ok(&out);
    let lock_dir = d.join("lockfiles/fx");
    let info = read_json(&lock_dir.join("lock.json"));
    assert_eq!(info["runtime_source"]["kind"], "metadata", "{info}");
    assert_eq!(
        info["runtime_source"]["requires_dist"],
        serde_json::json!(["packaging", "idna"]),
        "{info}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("prepare_metadata_for_build_wheel"),
        "{}",
        text(&out)
    );

    let out = with_store(
        &mut cmd(d),
        &["build", recipe.to_str().unwrap(), "--no-smoke"],
        &store,
    );
    ok(&out);
    let first = json(&out);
    let oracle = PathBuf::from(first["oracle"].as_str().unwrap());
    let got = venv_closure(&oracle);
    // Exactly the closure is installed, and exactly the lock plus the wheel.
    assert_eq!(got["installed"], got["closure"], "{got}");
    let mut want = locked_names(&lock_dir.join("pylock.runtime.toml"));
    want.push("fixturellm".into());
    want.sort();
    assert_eq!(got["installed"], serde_json::json!(want), "{got}");
    let version = got["version"].as_str().unwrap();
    assert_eq!(
        version.ends_with(".empty"),
        device == "empty",
        "vLLM's empty suffix: {version}"
    );
    // Every runtime distribution came from the wheelhouse.
    let rec = read_json(&oracle.join("oracle.json"));
    let wheelhouse = rec["requires"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.as_str().unwrap().starts_with("wheelhouse/"))
        .count();
    assert_eq!(wheelhouse, want.len() - 1, "{rec}");

    // Export, then an --offline build in a fresh store gives the same venv key.
    let bundle = d.join("fx.tar.gz");
    let out = with_store(
        &mut cmd(d),
        &[
            "export",
            recipe.to_str().unwrap(),
            "-o",
            bundle.to_str().unwrap(),
        ],
        &store,
    );
    ok(&out);
    let store_b = d.join("store-b");
    let out = with_store(&mut cmd(d), &["import", bundle.to_str().unwrap()], &store_b);
    ok(&out);
    let recipe_b = PathBuf::from(json(&out)["recipe_file"].as_str().unwrap().to_string());
    let out = with_store(
        &mut offline_cmd(d),
        &[
            "build",
            recipe_b.to_str().unwrap(),
            "--offline",
            "--no-smoke",
        ],
        &store_b,
    );
    ok(&out);
    assert_eq!(json(&out)["key"], first["key"]);
}

#[test]
fn an_empty_oracle_installs_exactly_its_wheels_requires_dist_closure() {
    empty_or_cpu_oracle_is_the_wheels_requires_dist_closure("empty");
}

#[test]
fn a_cpu_oracle_installs_exactly_its_wheels_requires_dist_closure() {
    empty_or_cpu_oracle_is_the_wheels_requires_dist_closure("cpu");
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_committed_lock_missing_a_declared_requirement_is_refused_before_install() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, commit) = fixture_repo(d);
    let recipe = device_recipe(d, "fx", &repo, &commit, "empty");
    let store = d.join("store");
    ok(&with_store(
        &mut cmd(d),
        &["lock", recipe.to_str().unwrap()],
        &store,
    ));
    // A hand-edited lock: idna dropped, lock.json updated to match.
    let lock_dir = d.join("lockfiles/fx");
    let file = lock_dir.join("pylock.runtime.toml");
    let text_before = std::fs::read_to_string(&file).unwrap();
    let mut parts: Vec<&str> = text_before.split("[[packages]]").collect();
    let before = parts.len();
    parts.retain(|p| !p.contains("name = \"idna\""));
    assert_eq!(parts.len() + 1, before, "{text_before}");
    std::fs::write(&file, parts.join("[[packages]]")).unwrap();
    let json_path = lock_dir.join("lock.json");
    let mut info = read_json(&json_path);
    info["files"]["pylock.runtime.toml"] = Value::String(sha256(&file));
    std::fs::write(&json_path, serde_json::to_string_pretty(&info).unwrap()).unwrap();

    let out = with_store(
        &mut cmd(d),
        &["build", recipe.to_str().unwrap(), "--no-smoke"],
        &store,
    );
    assert_eq!(code(&out), 2, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("  - idna (lock: no such package in the lock)"),
        "{err}"
    );
    assert!(err.contains(&file.display().to_string()), "{err}");
    // The fix runs as printed, from any directory (the recipe is outside ./recipes).
    let start = err.find("`oracle-build lock ").expect("a lock hint") + 1;
    let fix = &err[start..start + err[start..].find('`').unwrap()];
    assert!(fix.contains(recipe.to_str().unwrap()), "{fix}");
    let elsewhere = d.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let path = format!(
        "{}:{}",
        bin().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = test_env(Command::new("sh").args(["-c", fix]).current_dir(&elsewhere))
        .env("PATH", path)
        .env("ORACLE_BUILD_HOME", &store)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "`{fix}` runs as printed: {}", text(&out));
    // Nothing was installed.
    let venvs = store.join("store/venvs");
    let n = std::fs::read_dir(&venvs).map_or(0, |r| r.count());
    assert_eq!(n, 0, "a venv was made in {}", venvs.display());
}

#[test]
fn a_fork_only_commit_builds_with_a_warning_and_pinned_commits_survive_gc() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, head) = fixture_repo(d);
    // A commit only a pull-request ref reaches (its branch is gone).
    git(&repo, &["checkout", "-qb", "pr"]);
    std::fs::write(repo.join("PR.md"), "from a fork\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "fork-only"]);
    let fork = git(&repo, &["rev-parse", "HEAD"]);
    git(&repo, &["update-ref", "refs/pull/7/head", &fork]);
    git(&repo, &["checkout", "-q", "--detach", &head]);
    git(&repo, &["branch", "-qD", "pr"]);
    let store = d.join("store");

    let recipe = device_recipe(d, "fork", &repo, &fork, "empty");
    let out = with_store(
        &mut cmd(d),
        &["build", recipe.to_str().unwrap(), "--no-smoke"],
        &store,
    );
    ok(&out);
    let report = json(&out);
    let warned = |v: &Value| {
        v.as_array().unwrap().iter().any(|w| {
            let w = w.as_str().unwrap();
            w.contains(&fork) && w.contains("refs/pull/7/head") && w.contains("fork-only")
        })
    };
    assert!(warned(&report["warnings"]), "{report}");
    let oracle = PathBuf::from(report["oracle"].as_str().unwrap());
    let rec = read_json(&oracle.join("oracle.json"));
    assert!(warned(&rec["warnings"]), "{rec}");
    // Plain text on stdout too, and `verify` shows it.
    let out = cmd(d)
        .args(["build", recipe.to_str().unwrap(), "--no-smoke", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("warning") && stdout.contains("refs/pull/7/head"),
        "{stdout}"
    );
    let out = cmd(d)
        .args(["verify", recipe.to_str().unwrap(), "--store"])
        .arg(&store)
        .output()
        .unwrap();
    ok(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("refs/pull/7/head"),
        "{}",
        text(&out)
    );

    // A second pin, on a branch, in the same mirror.
    let main = device_recipe(d, "main", &repo, &head, "empty");
    let out = with_store(&mut cmd(d), &["fetch", main.to_str().unwrap()], &store);
    ok(&out);

    // The pull-request ref goes away; gc prunes everything unreferenced.
    let m = &only_entry(&store.join("store/git"));
    let pins = git(
        m,
        &[
            "for-each-ref",
            "--format=%(refname)",
            "refs/oracle-build/pins/",
        ],
    );
    assert!(
        pins.contains(&format!("refs/oracle-build/pins/{fork}")),
        "{pins}"
    );
    assert!(
        pins.contains(&format!("refs/oracle-build/pins/{head}")),
        "{pins}"
    );
    make_writable_tree(m);
    git(m, &["update-ref", "-d", "refs/pull/7/head"]);
    git(m, &["reflog", "expire", "--expire=now", "--all"]);
    git(m, &["gc", "--prune=now", "--quiet"]);
    for c in [&fork, &head] {
        git(m, &["cat-file", "-e", &format!("{c}^{{commit}}")]);
    }
}

/// Mirrors are updated in place, but make sure git may write everywhere.
fn make_writable_tree(dir: &Path) {
    let _ = Command::new("chmod").args(["-R", "u+w"]).arg(dir).status();
}

/// Writes a PEP 503 simple index under `root/simple` holding one pure wheel
/// per (name, version), made at test time with the stdlib.
const MAKE_INDEX_PY: &str = r#"
import base64, hashlib, os, sys, zipfile
root = sys.argv[1]
pkgs = {}
for spec in sys.argv[2:]:
    name, version = spec.split("==")
    d = os.path.join(root, "simple", name)
    os.makedirs(d, exist_ok=True)
    fn = "%s-%s-py3-none-any.whl" % (name, version)
    di = "%s-%s.dist-info" % (name, version)
    files = {name + "/__init__.py": "__version__ = %r\n" % version,
             di + "/METADATA": "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version),
             di + "/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rec = []
    for p, t in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=").decode()
        rec.append("%s,sha256=%s,%d" % (p, h, len(t)))
    files[di + "/RECORD"] = "\n".join(rec + [di + "/RECORD,,"]) + "\n"
    with zipfile.ZipFile(os.path.join(d, fn), "w") as z:
        for p, t in files.items():
            z.writestr(zipfile.ZipInfo(p, (2020, 1, 1, 0, 0, 0)), t)
    sha = hashlib.sha256(open(os.path.join(d, fn), "rb").read()).hexdigest()
    pkgs.setdefault(name, []).append('<a href="%s#sha256=%s">%s</a>' % (fn, sha, fn))
for name, links in pkgs.items():
    with open(os.path.join(root, "simple", name, "index.html"), "w") as f:
        f.write("<html><body>%s</body></html>\n" % "".join(links))
with open(os.path.join(root, "simple", "index.html"), "w") as f:
    f.write("<html><body>%s</body></html>\n" % "".join('<a href="%s/">%s</a>' % (n, n) for n in pkgs))
"#;

/// `python3 -m http.server --bind 127.0.0.1` serving a directory, stopped
/// (by its pid) when dropped.
pub(crate) struct Server {
    child: std::process::Child,
    /// `http://127.0.0.1:<port>/simple`: the index [`make_index`] wrote.
    pub(crate) url: String,
}

impl Server {
    /// Serves `dir` on a free port of 127.0.0.1; returns once it accepts
    /// connections.
    pub(crate) fn start(dir: &Path) -> Server {
        let port = closed_port();
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Ready once it accepts a connection.
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Server {
            child,
            url: format!("http://127.0.0.1:{port}/simple"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

pub(crate) fn make_index(root: &Path, specs: &[&str]) {
    let out = Command::new("python3")
        .args(["-c", MAKE_INDEX_PY])
        .arg(root)
        .args(specs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

/// The `[[packages]]` block of `name` in a pylock file: (version, urls).
fn locked(lock: &str, name: &str) -> (String, Vec<String>) {
    let block = lock
        .split("[[packages]]")
        .find(|b| b.lines().any(|l| l == format!("name = \"{name}\"")))
        .unwrap_or_else(|| panic!("{name} not locked:\n{lock}"));
    let version = block
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let urls = block
        .split("url = \"")
        .skip(1)
        .map(|u| u.split('"').next().unwrap().to_string())
        .collect();
    (version, urls)
}

#[test]
fn each_package_comes_from_the_index_meant_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // The first index: a torch-like `a`, and an old `fxcommon`.
    make_index(&d.join("one"), &["a==1.0", "fxcommon==1.0"]);
    // The second: the `fxcommon` the tree should get, and a decoy `a`.
    make_index(&d.join("two"), &["fxcommon==2.0", "a==9.0"]);
    let one = Server::start(&d.join("one"));
    let two = Server::start(&d.join("two"));

    let (repo, _) = fixture_repo(d);
    let common = repo.join("requirements/common.txt");
    let mut reqs = std::fs::read_to_string(&common).unwrap();
    reqs.push_str("a\nfxcommon\n");
    std::fs::write(&common, reqs).unwrap();
    git(&repo, &["commit", "-qam", "needs a and fxcommon"]);
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    // Local files carry no upload time, so no --exclude-newer cut-off here.
    let extra = format!(
        "indexes:\n  - name: torchlike\n    url: {}\n    packages: [a]\n  - {}\nlock:\n  exclude_newer: none\n",
        one.url, two.url
    );
    let path = d.join("idx.yaml");
    std::fs::write(
        &path,
        recipe_text("idx", &repo, &commit, &extra)
            .replace("target_device: cpu", "target_device: empty"),
    )
    .unwrap();
    let store = d.join("store");
    let out = with_store(&mut cmd(d), &["lock", path.to_str().unwrap()], &store);
    ok(&out);
    let lock = std::fs::read_to_string(d.join("lockfiles/idx/pylock.runtime.toml")).unwrap();
    let (va, ua) = locked(&lock, "a");
    assert_eq!(va, "1.0", "{lock}");
    assert!(ua.iter().all(|u| u.starts_with(&one.url)), "{ua:?}");
    let (vb, ub) = locked(&lock, "fxcommon");
    assert_eq!(vb, "2.0", "{lock}");
    assert!(ub.iter().all(|u| u.starts_with(&two.url)), "{ub:?}");
    let (_, ui) = locked(&lock, "idna");
    assert!(
        ui.iter().all(|u| !u.starts_with("http://127.0.0.1")),
        "{ui:?}"
    );
    // The lock records each artifact's index.
    let info = read_json(&d.join("lockfiles/idx/lock.json"));
    let idx = &info["artifact_index"];
    assert_eq!(idx["a-1.0-py3-none-any.whl"], "torchlike", "{info}");
    assert_eq!(
        idx["fxcommon-2.0-py3-none-any.whl"],
        two.url.as_str(),
        "{info}"
    );
    assert!(
        idx.as_object()
            .unwrap()
            .iter()
            .any(|(f, i)| f.starts_with("idna-") && i == "default"),
        "{info}"
    );
}

/// A git repository at `dir` with `files`, committed and tagged `v1.0`.
fn ext_repo(dir: &Path, files: &[(&str, &str)]) {
    for (rel, text) in files {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    if !dir.join(".git").exists() {
        git(dir, &["init", "-q"]);
    }
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "ext"]);
    git(dir, &["tag", "v1.0"]);
}

/// The fixture with the CMake overlay (tests/fixture/cmake), its four
/// FetchContent sources made as git repositories under `dir/ext`.
pub(crate) fn cmake_fixture(dir: &Path) -> (PathBuf, String) {
    let ext = dir.join("ext");
    ext_repo(&ext.join("fxenv"), &[("fixture-ext.txt", "fxenv v1.0\n")]);
    ext_repo(
        &ext.join("fxplain"),
        &[("fixture-ext.txt", "fxplain v1.0\n")],
    );
    ext_repo(
        &ext.join("fxsub"),
        &[("python/kernels/fixture-ext.txt", "fxsub v1.0 (subdir)\n")],
    );
    ext_repo(
        &ext.join("inner"),
        &[("fixture-ext.txt", "inner, a submodule\n")],
    );
    let sm = ext.join("fxsm");
    std::fs::create_dir_all(&sm).unwrap();
    git(&sm, &["init", "-q"]);
    let url = format!("file://{}", ext.join("inner").display());
    git(
        &sm,
        &[
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            &url,
            "third-party/inner",
        ],
    );
    ext_repo(&sm, &[("README", "with a submodule\n")]);

    let (repo, _) = fixture_repo_with(dir, "cmake");
    for f in [
        "CMakeLists.txt",
        "cmake/external_projects/fxenv.cmake",
        "cmake/external_projects/fxplain.cmake",
        "cmake/external_projects/fxsub.cmake",
        "cmake/external_projects/fxsm.cmake",
    ] {
        let p = repo.join(f);
        let t = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, t.replace("@EXT@", &ext.display().to_string())).unwrap();
    }
    git(&repo, &["add", "-A"]);
    git(
        &repo,
        &["commit", "-qm", "build with CMake and FetchContent"],
    );
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    (repo, commit)
}

fn cmake_sources(oracle: &Path) -> Value {
    let out = Command::new(oracle.join("bin/python"))
        .args(["-c", "import json, fixturellm._C, fixturellm._cmake_sources as s; print(json.dumps(s.SOURCES, sort_keys=True))"])
        .current_dir("/")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn cmake_fetchcontent_builds_offline_fully_disconnected_and_an_unstaged_source_is_named_first() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (repo, commit) = cmake_fixture(d);
    let recipe = device_recipe(d, "fx", &repo, &commit, "cpu");
    let store = d.join("store");
    let out = with_store(&mut cmd(d), &["lock", recipe.to_str().unwrap()], &store);
    ok(&out);
    let out = with_store(
        &mut cmd(d),
        &["build", recipe.to_str().unwrap(), "--no-smoke"],
        &store,
    );
    ok(&out);
    let first = json(&out);
    let want = serde_json::json!({
        "fxenv": "fxenv v1.0", "fxplain": "fxplain v1.0",
        "fxsm": "inner, a submodule", "fxsub": "fxsub v1.0 (subdir)",
    });
    assert_eq!(
        cmake_sources(Path::new(first["oracle"].as_str().unwrap())),
        want
    );

    // Real ninja output: the [n/m] lines parse and count up to m.
    let wheels: Vec<PathBuf> = std::fs::read_dir(store.join("store/wheels"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let log = std::fs::read_to_string(wheels[0].join("build.log")).unwrap();
    let steps: Vec<(u64, u64)> = log
        .lines()
        .filter_map(oracle_build::progress::parse_ninja)
        .collect();
    assert!(!steps.is_empty(), "no ninja status line in:\n{log}");
    let (n, m) = *steps.last().unwrap();
    assert_eq!(n, m, "{steps:?}");
    assert!(
        steps.iter().all(|&(a, b)| a >= 1 && a <= b && b == m),
        "{steps:?}"
    );

    // Offline from the store: CMake runs fully disconnected and passes.
    for b in ["venvs", "wheels"] {
        for e in std::fs::read_dir(store.join("store").join(b)).unwrap() {
            force_remove(&e.unwrap().path());
        }
    }
    let out = with_store(
        &mut offline_cmd(d),
        &["build", recipe.to_str().unwrap(), "--offline", "--no-smoke"],
        &store,
    );
    ok(&out);
    let again = json(&out);
    assert_eq!(again["key"], first["key"]);
    assert_eq!(
        cmake_sources(Path::new(again["oracle"].as_str().unwrap())),
        want
    );
    let wheel = std::fs::read_dir(store.join("store/wheels"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let rec = read_json(&wheel.join("build.json"));
    let args = rec["env"]["CMAKE_ARGS"].as_str().unwrap();
    assert!(
        args.contains("-DFETCHCONTENT_FULLY_DISCONNECTED=ON"),
        "{args}"
    );
    assert!(
        args.contains("-DFETCHCONTENT_SOURCE_DIR_FXPLAIN="),
        "{args}"
    );

    // A new declaration the tool never staged: refused offline, naming it,
    // before CMake runs.
    ext_repo(&d.join("ext/fxextra"), &[("fixture-ext.txt", "extra\n")]);
    let plain = repo.join("cmake/external_projects/fxplain.cmake");
    let mut t = std::fs::read_to_string(&plain).unwrap();
    t.push_str(&format!(
        "FetchContent_Declare(fxextra GIT_REPOSITORY file://{}/ext/fxextra GIT_TAG v1.0)\nFetchContent_MakeAvailable(fxextra)\n",
        d.display()
    ));
    std::fs::write(&plain, t).unwrap();
    git(&repo, &["commit", "-qam", "one more source"]);
    let c2 = git(&repo, &["rev-parse", "HEAD"]);
    let recipe2 = device_recipe(d, "fx2", &repo, &c2, "cpu");
    ok(&with_store(
        &mut cmd(d),
        &["fetch", recipe2.to_str().unwrap()],
        &store,
    ));
    let out = with_store(
        &mut offline_cmd(d),
        &[
            "build",
            recipe2.to_str().unwrap(),
            "--offline",
            "--no-smoke",
        ],
        &store,
    );
    assert_ne!(code(&out), 0, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ext stage: fxextra") && err.contains("is not staged"),
        "{err}"
    );
    assert!(!err.contains("-- Configuring"), "CMake ran: {err}");
    assert_eq!(
        std::fs::read_dir(store.join("store/wheels"))
            .unwrap()
            .count(),
        1
    );
}
