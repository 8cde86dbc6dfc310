//! How many compile jobs a build runs (`build.max_jobs: auto` by memory,
//! `build.mem_per_job_gib`), and nvcc's CUDA against the locked torch's
//! before the wheel stage of a `cuda` build (issue 43).

use std::path::Path;
use std::process::Command;

use crate::real::Server;
use crate::support::*;

/// A recipe that cannot be fetched (`plan` lists that as a problem, which
/// is beside the point here) with `build` fields `extra`.
fn recipe(dir: &Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("jobs.yaml");
    std::fs::write(
        &path,
        format!(
            "name: jobs\nsource:\n  repo: file:///nonexistent\n  commit: 5559679229bc961848b121ccdeaa8fa5d79bec98\n  package: fixturellm\npython: \"3.11\"\nbuild:\n  target_device: cpu\n{extra}"
        ),
    )
    .unwrap();
    path
}

#[test]
fn plan_says_one_job_when_a_job_needs_more_memory_than_there_is() {
    let fx = Fx::new();
    let r = recipe(fx.dir(), "  mem_per_job_gib: 100000\n");
    let path = r.to_str().unwrap();
    let out = fx.run(&["plan", path, "--json"]);
    assert_eq!(code(&out), plan_exit(&out), "{}", text(&out));
    let p = json(&out);
    assert_eq!(p["jobs"]["jobs"], 1, "{p}");
    let why = p["jobs"]["why"].as_str().unwrap();
    assert!(why.starts_with("auto = min("), "{why}");
    assert!(
        why.contains("/ 100000 GiB a job (build.mem_per_job_gib)"),
        "{why}"
    );
    assert!(why.ends_with("= 0), at least 1"), "{why}");
    // The text says the same; `--jobs N` overrides, said as such.
    let out = fx.run(&["plan", path]);
    assert!(
        text(&out).contains("jobs     1: auto = min("),
        "{}",
        text(&out)
    );
    let p = json(&fx.run(&["plan", path, "--jobs", "3", "--json"]));
    assert_eq!(p["jobs"]["jobs"], 3, "{p}");
    assert_eq!(p["jobs"]["why"], "--jobs 3 (overrides build.max_jobs auto)");
    assert!(!fx.store().exists(), "plan wrote nothing");
}

#[test]
fn a_mem_per_job_that_is_not_a_positive_size_is_refused_naming_it() {
    let fx = Fx::new();
    for bad in ["0", "-2", "lots"] {
        let r = recipe(fx.dir(), &format!("  mem_per_job_gib: {bad}\n"));
        let out = fx.run(&["plan", r.to_str().unwrap()]);
        let t = text(&out);
        assert_eq!(code(&out), 2, "{bad}: {t}");
        assert!(t.contains("jobs.yaml"), "{t}");
        assert!(t.contains("mem_per_job_gib"), "{t}");
        if bad != "lots" {
            assert!(t.contains("line 9"), "{t}");
            assert!(t.contains(bad), "{t}");
        }
        assert!(!fx.store().exists());
    }
}

/// Writes a PEP 503 index under `root/simple` with one wheel
/// `torch-<version>-py3-none-any.whl` whose `torch/version.py` says
/// `cuda: Optional[str] = '<cuda>'`, as torch's own does.
const TORCH_INDEX_PY: &str = r#"
import base64, hashlib, os, sys, zipfile
root, version, cuda = sys.argv[1:4]
d = os.path.join(root, "simple", "torch")
os.makedirs(d, exist_ok=True)
fn = "torch-%s-py3-none-any.whl" % version
di = "torch-%s.dist-info" % version
files = {"torch/__init__.py": "__version__ = %r\n" % version,
         "torch/version.py": "from typing import Optional\n__version__ = %r\ncuda: Optional[str] = %r\n" % (version, cuda),
         di + "/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: %s\n" % version,
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
with open(os.path.join(d, "index.html"), "w") as f:
    f.write('<html><body><a href="%s#sha256=%s">%s</a></body></html>\n' % (fn, sha, fn))
with open(os.path.join(root, "simple", "index.html"), "w") as f:
    f.write('<html><body><a href="torch/">torch</a></body></html>\n')
"#;

#[test]
fn an_nvcc_of_another_cuda_than_the_locked_torchs_is_refused_before_the_wheel_stage() {
    let fx = Fx::new();
    let d = fx.dir();
    // PyPI's torch has no local label: its CUDA is in torch/version.py.
    let out = Command::new("python3")
        .args(["-c", TORCH_INDEX_PY])
        .arg(d.join("index"))
        .args(["2.13.0", "13.0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let index = Server::start(&d.join("index"));
    // A CUDA 13.3 toolkit, as a lease gave the team: nvcc's --version only.
    let bin = d.join("cuda-13.3/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let nvcc = bin.join("nvcc");
    std::fs::write(
        &nvcc,
        "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho 'Cuda compilation tools, release 13.3, V13.3.20'\necho 'Build cuda_13.3.r13.3'\n",
    )
    .unwrap();
    std::fs::set_permissions(&nvcc, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // The tree builds against torch, as vLLM's requirements/build/cuda.txt asks.
    let (repo, _) = fx.repo();
    let build_reqs = repo.join("requirements/build/cuda.txt");
    let mut reqs = std::fs::read_to_string(&build_reqs).unwrap();
    reqs.push_str("torch\n");
    std::fs::write(&build_reqs, reqs).unwrap();
    git(&repo, &["commit", "-qam", "builds against torch"]);
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let extra = format!(
        "  cuda_arch_list: \"8.0\"\n  env:\n    CUDACXX: {}\npins:\n  torch: 2.13.0\nindexes:\n  - {}\nlock:\n  exclude_newer: none\n",
        nvcc.display(),
        index.url
    );
    let recipe = d.join("cu.yaml");
    std::fs::write(
        &recipe,
        recipe_text("cu", &repo, &commit, &extra)
            .replace("target_device: cpu", "target_device: cuda"),
    )
    .unwrap();
    let out = fx.run(&["build", recipe.to_str().unwrap(), "--no-smoke"]);
    let t = text(&out);
    assert_eq!(code(&out), 1, "{t}");
    assert!(t.contains("nvcc is CUDA 13.3 (13.3.20, "), "{t}");
    assert!(t.contains(&nvcc.display().to_string()), "{t}");
    assert!(
        t.contains("the locked torch was built for CUDA 13.0 (torch/version.py of torch-2.13.0-py3-none-any.whl in the wheelhouse (build lock))"),
        "{t}"
    );
    assert!(t.contains("refusing before the wheel stage"), "{t}");
    // Nothing compiled: no wheel entry, no build log.
    let wheels = fx.store().join("store/wheels");
    assert!(
        !wheels.exists() || tree(&wheels).is_empty(),
        "{:?}",
        tree(&wheels)
    );
    // `plan` says it too, from the lock the build left in the store.
    let plan = fx.run(&["plan", recipe.to_str().unwrap()]);
    let t = text(&plan);
    assert_eq!(code(&plan), 1, "{t}");
    assert!(t.contains("nvcc is CUDA 13.3 (13.3.20, "), "{t}");
}
