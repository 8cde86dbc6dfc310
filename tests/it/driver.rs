//! The smoke driver (`src/py/smoke_driver.py`, the very file the binary
//! embeds) run by a real fixture oracle's interpreter, for what no recipe
//! can reach on a box without nvcc: a `cuda` recipe's builtin probe.

use std::path::Path;
use std::process::Command;

use crate::support::*;
use serde_json::{Value, json};

/// Runs the driver's builtin probe in the oracle `venv` with `cfg`, as the
/// smoke stage does (`python -I smoke_driver.py probe CONFIG OUT`, from a
/// directory outside any source tree), and returns what it wrote.
fn probe(venv: &Path, dir: &Path, cfg: &Value) -> Value {
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/py/smoke_driver.py");
    let cfg_path = dir.join("probe.json");
    let out_path = dir.join("probe.out.json");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let out = Command::new(venv.join("bin/python"))
        .arg("-I")
        .arg(&driver)
        .arg("probe")
        .arg(&cfg_path)
        .arg(&out_path)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    read_json(&out_path)
}

#[test]
fn the_builtin_probe_fails_for_a_cuda_recipe_when_torch_is_missing() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    fx.exits(&["build", recipe.to_str().unwrap(), "--no-smoke"], 4);
    let venv = fx.oracle("fx");
    let no_torch = Command::new(venv.join("bin/python"))
        .args(["-c", "import torch"])
        .output()
        .unwrap();
    assert!(
        !no_torch.status.success(),
        "the fixture oracle has no torch"
    );

    // On the CPU the array path runs the kernel against Python's reference.
    let cpu = probe(
        &venv,
        fx.dir(),
        &json!({"package": "fixturellm", "device": "cpu"}),
    );
    assert_eq!(cpu["ok"], true, "{cpu:#}");
    assert_eq!(cpu["backend"], "array");

    // For cuda the same kernel on the CPU proves nothing: not gateable, saying why.
    let cuda = probe(
        &venv,
        fx.dir(),
        &json!({"package": "fixturellm", "device": "cuda"}),
    );
    assert_eq!(cuda["ok"], false, "{cuda:#}");
    assert!(cuda.get("max_abs_error").is_none(), "{cuda:#}");
    let why = cuda["error"]["exception"].as_str().unwrap();
    assert!(
        why.starts_with("RuntimeError:")
            && why.contains("target_device is cuda")
            && why.contains("torch cannot be imported")
            && why.contains("No module named 'torch'"),
        "{why}"
    );
}
