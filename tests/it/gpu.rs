//! The CUDA fixture (tests/fixture/cuda, an overlay on tests/fixture/pkg),
//! end to end with the real binary: on a box with `nvcc` and a GPU it is
//! built for `target_device: cuda` (the kernel compiled for the archs that
//! `cuda_arch_list: auto` resolves), verified, and smoked with its probe,
//! which runs the kernel on the GPU against a CPU reference. Elsewhere that
//! test returns early and prints why. The tests of the fixture's own build
//! logic (arch flags, the cpu build) run everywhere.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use serde_json::Value;

/// The CUDA overlay, committed under tests/fixture/cuda.
fn fixture_cuda() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixture/cuda")
}

/// A git repository of the CUDA fixture at `dir/repo`: pkg/ with cuda/ over
/// it, committed, tagged `v0.1.0`, one more commit. Returns (repo, head commit).
fn cuda_fixture_repo(dir: &Path) -> (PathBuf, String) {
    let repo = dir.join("repo");
    write_fixture_pkg(&repo);
    overlay(&fixture_cuda(), &repo);
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "cuda fixture"]);
    git(&repo, &["tag", "v0.1.0"]);
    std::fs::write(repo.join("NOTES.md"), "second commit\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "second"]);
    let head = git(&repo, &["rev-parse", "HEAD"]);
    (repo, head)
}

/// A recipe `name` for the CUDA fixture at `commit`: Python `python`,
/// `target_device` and the rest of the `build:` block as given, the
/// fixture's probe, and the usual smoke case. Returns its path.
fn cuda_recipe(
    dir: &Path,
    name: &str,
    repo: &Path,
    commit: &str,
    python: &str,
    build: &str,
) -> PathBuf {
    let text = format!(
        "name: {name}\nsource:\n  repo: file://{}\n  commit: {commit}\n  package: fixturellm\npython: \"{python}\"\nbuild:\n{build}smoke:\n  runs: 3\n  probe: {{module: fixturellm.probes, function: rms_norm}}\n  cases:\n    - name: small\n      model: ${{FX_MODELS}}/model\n      prompt: \"The capital of France is Paris, and the\"\n      max_tokens: 16\n      engine_args: {{enforce_eager: true, max_model_len: 256, gpu_memory_utilization: 0.5, max_num_seqs: 1, dtype: bfloat16}}\n",
        repo.display()
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `nvcc` where oracle-build looks for it: `$CUDA_HOME/bin`, PATH, `/usr/local/cuda/bin`.
fn find_nvcc() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("bin/nvcc"));
    }
    candidates.extend(which::which_all("nvcc").into_iter().flatten());
    candidates.push(PathBuf::from("/usr/local/cuda/bin/nvcc"));
    candidates.into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The compute capabilities `nvidia-smi` reports (e.g. `["9.0"]`); why not, on failure.
fn gpu_caps() -> Result<Vec<String>, String> {
    let listed = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .map_err(|e| format!("nvidia-smi -L does not run ({e})"))?;
    if !listed.status.success() || listed.stdout.is_empty() {
        return Err(format!(
            "nvidia-smi -L lists no GPU ({})",
            String::from_utf8_lossy(&listed.stderr).trim()
        ));
    }
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .output()
        .map_err(|e| format!("nvidia-smi --query-gpu does not run ({e})"))?;
    let caps: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    if caps.is_empty() {
        return Err("nvidia-smi reports no compute capability".into());
    }
    Ok(caps)
}

/// `major.minor` of `python3` on PATH (the recipe's Python on the GPU box).
fn python3_minor() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        .output()
        .expect("python3 runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The one file under `dir` whose name starts with `prefix` and ends with `.so`.
fn find_so(dir: &Path, prefix: &str) -> Option<PathBuf> {
    tree(dir).into_iter().find(|p| {
        p.file_name()
            .map(|n| n.to_string_lossy())
            .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".so"))
    })
}

/// On a GPU box: build (arch list from `auto`), verify --deep, smoke with
/// the kernel probe, and a no-op rebuild.
#[test]
fn cuda_fixture_builds_verifies_and_smokes_on_the_gpu() {
    let Some(nvcc) = find_nvcc() else {
        eprintln!(
            "skipped cuda_fixture_builds_verifies_and_smokes_on_the_gpu: no nvcc (CUDA_HOME, PATH, /usr/local/cuda/bin)"
        );
        return;
    };
    let caps = match gpu_caps() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("skipped cuda_fixture_builds_verifies_and_smokes_on_the_gpu: {why}");
            return;
        }
    };
    // What `cuda_arch_list: auto` must resolve to (README: 9.0 and later with `a`).
    let mut archs: Vec<String> = caps
        .iter()
        .map(|c| {
            let major: u32 = c
                .split('.')
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            if major >= 9 {
                format!("{c}a")
            } else {
                c.clone()
            }
        })
        .collect();
    archs.sort();
    archs.dedup();

    let tmp = tempfile::tempdir().unwrap();
    let (repo, commit) = cuda_fixture_repo(tmp.path());
    let recipe = cuda_recipe(
        tmp.path(),
        "fxcuda",
        &repo,
        &commit,
        &python3_minor(),
        "  target_device: cuda\n  cuda_arch_list: auto\n",
    );
    let store = tmp.path().join("store");
    let out = build_out(tmp.path(), &recipe, &store, &["--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report = json(&out);
    assert_eq!(report["verdict"], "gateable", "{report}");
    let venv = PathBuf::from(report["oracle"].as_str().unwrap());
    let rec = read_json(&venv.join("oracle.json"));

    // The build got the arch list, CUDA_HOME and the device.
    let build = read_json(
        &store
            .join("store/wheels")
            .join(rec["wheel_key"].as_str().unwrap())
            .join("build.json"),
    );
    assert_eq!(build["env"]["VLLM_TARGET_DEVICE"], "cuda", "{build}");
    assert_eq!(
        build["env"]["TORCH_CUDA_ARCH_LIST"],
        archs.join(";"),
        "{build}"
    );
    assert!(build["env"]["CUDA_HOME"].is_string(), "{build}");
    assert!(build["tools"]["nvcc"]["version"].is_string(), "{build}");

    // Both extensions are there, and the CUDA one holds a cubin per arch
    // and links no CUDA library (static runtime).
    let ext: Vec<String> = rec["identity"]["compiled_extensions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    assert!(ext.iter().any(|p| p.starts_with("_C.")), "{ext:?}");
    assert!(ext.iter().any(|p| p.starts_with("_cuda_C.")), "{ext:?}");
    let so = find_so(&venv, "_cuda_C.").expect("_cuda_C is installed");
    let cuobjdump = nvcc.with_file_name("cuobjdump");
    if cuobjdump.exists() {
        let elf = Command::new(&cuobjdump)
            .arg("--list-elf")
            .arg(&so)
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&elf.stdout);
        for a in &archs {
            let sm = format!("sm_{}.cubin", a.replace('.', ""));
            assert!(
                listing.contains(&sm),
                "no {sm} in {}:\n{listing}",
                so.display()
            );
        }
    } else {
        eprintln!("no cuobjdump beside {}: cubins not listed", nvcc.display());
    }
    // The tool read the same from the binary itself: a cubin per arch, and
    // the kernels check against this GPU passed (docs/identity.md).
    let cuda_ext = rec["identity"]["compiled_extensions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"].as_str().unwrap().starts_with("_cuda_C."))
        .unwrap();
    let cubins: Vec<&str> = cuda_ext["kernels"]["cubins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for a in &archs {
        let sm = format!("sm_{}", a.replace('.', ""));
        assert!(cubins.contains(&sm.as_str()), "{sm} not read: {cuda_ext}");
    }
    let field = format!("kernels {}", cuda_ext["path"].as_str().unwrap());
    let kcheck = rec["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["field"] == field.as_str())
        .unwrap_or_else(|| panic!("no {field} check: {}", rec["checks"]));
    assert_eq!(kcheck["ok"], true, "{kcheck}");
    assert_eq!(rec["identity"]["kernel_target"]["source"], "gpu", "{rec}");
    let ldd = Command::new("ldd").arg(&so).output().unwrap();
    let ldd = String::from_utf8_lossy(&ldd.stdout);
    assert!(!ldd.contains("libcudart"), "dynamic CUDA runtime:\n{ldd}");

    // The probe ran the kernel on the GPU and matched the CPU reference.
    let probe = &rec["smoke"]["probe"];
    assert_eq!(probe["ok"], true, "{probe}");
    assert_eq!(probe["op"], "fixturellm.probes.rms_norm", "{probe}");
    assert_eq!(probe["device"], "cuda", "{probe}");
    let err = probe["max_abs_error"].as_f64().unwrap();
    assert!(err <= probe["tolerance"].as_f64().unwrap(), "{probe}");
    assert!(caps.contains(&probe["compute_capability"].as_str().unwrap().to_string()));
    assert_eq!(probe["built_arch_list"], archs.join(";"), "{probe}");
    let kernel = probe["kernel_arch"].as_str().unwrap();
    assert!(
        archs
            .iter()
            .any(|a| format!("sm_{}", a.replace('.', "")) == kernel),
        "the kernel ran code for {kernel}, built for {archs:?}"
    );
    assert_eq!(rec["smoke"]["cases"][0]["deterministic"], true);

    let out = run(
        tmp.path(),
        &[
            "verify",
            "fxcuda.yaml",
            "--deep",
            "--store",
            store.to_str().unwrap(),
        ],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));

    // A no-op rebuild: everything from the store.
    let out = build_out(tmp.path(), &recipe, &store, &["--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let again = json(&out);
    assert_eq!(again["built"].as_array().unwrap().len(), 0, "{again}");
    assert_eq!(again["oracle"], report["oracle"]);

    // The same oracle with a broken op fails its gate.
    let out = cmd(tmp.path())
        .env("FIXTURELLM_MODE", "broken-op")
        .args([
            "smoke",
            "fxcuda.yaml",
            "--json",
            "--store",
            store.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 4, "{}", text(&out));
    let smoke = json(&out);
    assert_eq!(smoke["probe"]["ok"], false, "{smoke}");
}

/// Runs `code` with the fixture's setup.py loaded as module `fx` (nothing is
/// built: setup() only runs as `__main__`); returns stdout, panics on failure.
fn with_setup_py(code: &str) -> String {
    let setup = fixture_cuda().join("setup.py");
    let prelude = format!(
        "import importlib.util\nspec = importlib.util.spec_from_file_location('fx', {:?})\nfx = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(fx)\n",
        setup.display().to_string()
    );
    let out = succeeds(Command::new("python3").args(["-c", &format!("{prelude}{code}")]));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// TORCH_CUDA_ARCH_LIST entries become the -gencode flags torch's
/// cpp_extension makes; malformed entries are refused, naming the entry.
#[test]
fn cuda_fixture_translates_arch_lists_like_torch() {
    let cases: &[(&str, &[&str])] = &[
        ("9.0a", &["-gencode=arch=compute_90a,code=sm_90a"]),
        ("12.1a", &["-gencode=arch=compute_121a,code=sm_121a"]),
        ("8.0", &["-gencode=arch=compute_80,code=sm_80"]),
        (
            "8.0+PTX",
            &[
                "-gencode=arch=compute_80,code=compute_80",
                "-gencode=arch=compute_80,code=sm_80",
            ],
        ),
        (
            "9.0a;8.0 12.1a+PTX",
            &[
                "-gencode=arch=compute_121a,code=compute_121a",
                "-gencode=arch=compute_121a,code=sm_121a",
                "-gencode=arch=compute_80,code=sm_80",
                "-gencode=arch=compute_90a,code=sm_90a",
            ],
        ),
        (
            "Hopper",
            &[
                "-gencode=arch=compute_90,code=compute_90",
                "-gencode=arch=compute_90,code=sm_90",
            ],
        ),
        ("10.0f;10.0f", &["-gencode=arch=compute_100f,code=sm_100f"]),
    ];
    for (list, want) in cases {
        let got = with_setup_py(&format!("print('\\n'.join(fx.gencode_flags({list:?})))"));
        let got: Vec<&str> = got.lines().collect();
        assert_eq!(&got, want, "TORCH_CUDA_ARCH_LIST={list}");
    }
    for bad in ["", "9", "sm_90", "9.0b", "9.0a+ptx", "9.0;x"] {
        let got = with_setup_py(&format!(
            "try:\n    fx.gencode_flags({bad:?})\n    print('accepted')\nexcept ValueError as e:\n    print(e)"
        ));
        assert!(!got.contains("accepted"), "{bad:?} was accepted");
        assert!(got.contains("TORCH_CUDA_ARCH_LIST"), "{bad:?}: {got}");
    }
    // The extensions it declares follow VLLM_TARGET_DEVICE, as vLLM's setup.py does.
    let mods = with_setup_py(
        "print([m.name for m in fx.ext_modules('cuda')]); print([m.name for m in fx.ext_modules('cpu')])\ntry:\n    fx.ext_modules('rocm')\nexcept RuntimeError as e:\n    print(e)",
    );
    assert_eq!(
        mods.lines().collect::<Vec<_>>(),
        [
            "['fixturellm._C', 'fixturellm._cuda_C']",
            "['fixturellm._C']",
            "VLLM_TARGET_DEVICE='rocm': the CUDA fixture builds for cuda or cpu",
        ]
    );
}

/// Without nvcc or a GPU, the same fixture builds for `target_device: cpu`
/// through the tool (only `_C`), and its ops fall back to the host op.
#[test]
fn cuda_fixture_builds_for_cpu_anywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, commit) = cuda_fixture_repo(tmp.path());
    let recipe = cuda_recipe(
        tmp.path(),
        "fxcpu",
        &repo,
        &commit,
        &python3_minor(),
        "  target_device: cpu\n",
    );
    let store = tmp.path().join("store");
    let out = build_out(tmp.path(), &recipe, &store, &["--no-smoke", "--json"]);
    // Built, not smoked: not gateable (exit 4).
    assert_eq!(code(&out), 4, "{}", text(&out));
    let venv = PathBuf::from(json(&out)["oracle"].as_str().unwrap());
    assert!(
        find_so(&venv, "_C.").is_some(),
        "no _C in {}",
        venv.display()
    );
    assert!(
        find_so(&venv, "_cuda_C.").is_none(),
        "a cpu build holds _cuda_C"
    );
    // The record names each compiled extension by sha256 and reads its
    // device code: the host-only _C has none (docs/identity.md, kernels).
    let rec = read_json(&venv.join("oracle.json"));
    let exts = rec["identity"]["compiled_extensions"].as_array().unwrap();
    assert_eq!(exts.len(), 1, "{rec}");
    let c = find_so(&venv, "_C.").unwrap();
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read(&c).unwrap()))
    };
    assert_eq!(exts[0]["sha256"], sha.as_str(), "{}", exts[0]);
    assert_eq!(
        exts[0]["kernels"]["sections"],
        serde_json::json!([]),
        "{}",
        exts[0]
    );
    assert_eq!(exts[0]["kernels"]["error"], Value::Null, "{}", exts[0]);
    // `plan` of the same tree for cuda names the device code the arch list asks for.
    let cuda = cuda_recipe(
        tmp.path(),
        "fxarch",
        &repo,
        &commit,
        &python3_minor(),
        "  target_device: cuda\n  cuda_arch_list: \"8.0;9.0a+PTX\"\n",
    );
    let out = cmd(tmp.path())
        .arg("plan")
        .arg(&cuda)
        .arg("--store")
        .arg(&store)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(
            "kernels  cubins sm_80, sm_90a; PTX compute_90a (TORCH_CUDA_ARCH_LIST 8.0;9.0a+PTX"
        ),
        "{}",
        text(&out)
    );
    let out = cmd(tmp.path())
        .arg("plan")
        .arg(&cuda)
        .arg("--json")
        .arg("--store")
        .arg(&store)
        .output()
        .unwrap();
    let plan = json(&out);
    assert_eq!(
        plan["kernels"],
        serde_json::json!({"arch_list": "8.0;9.0a+PTX", "cubins": ["sm_80", "sm_90a"], "ptx": ["compute_90a"]}),
        "{plan}"
    );
    let check = Command::new(venv.join("bin/python"))
        .current_dir(tmp.path())
        .args([
            "-I",
            "-c",
            "import array\nfrom fixturellm import _custom_ops as o\nx = array.array('f', [3.0, 4.0]); w = array.array('f', [1.0, 2.0]); y = array.array('f', [0.0, 0.0])\no.rms_norm(y, x, w, 0.0)\nprint(o._cuda_C is None, round(y[0], 4), round(y[1], 4))",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&check.stdout).trim(),
        // rms of (3, 4) is sqrt(12.5) = 3.5355
        "True 0.8485 2.2627",
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

/// `oracle-build build <recipe> --store <store> <extra>` run in `cwd`.
fn build_out(cwd: &Path, recipe: &Path, store: &Path, extra: &[&str]) -> std::process::Output {
    cmd(cwd)
        .arg("build")
        .arg(recipe)
        .arg("--store")
        .arg(store)
        .args(extra)
        .output()
        .expect("oracle-build runs")
}
