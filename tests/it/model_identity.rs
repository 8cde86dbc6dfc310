//! The gate's models have an identity (issue 39, "Model identity"): each
//! case's model directory is hashed into a manifest recorded in
//! `oracle.json` and with every golden; a golden recorded on other model
//! files is refused naming them; the hashes are kept between gates; a hub
//! snapshot records its revision and blobs; `sbom` lists the models.

use std::path::{Path, PathBuf};

use crate::support::*;
use serde_json::Value;

/// Copies the files of `src` (flat) into `dst`.
fn copy_flat(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The one case of a smoke report (`--json`'s `smoke`, or `oracle.json`'s).
fn only_case(smoke: &Value) -> &Value {
    let cases = smoke["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 1, "{smoke}");
    &cases[0]
}

#[test]
fn a_model_file_changed_after_the_golden_refuses_it_and_unchanged_files_are_not_hashed_again() {
    let fx = Fx::new();
    let d = fx.dir();
    // A copy of the fixture model, with a weights shard the engine does not read.
    let model = d.join("models/model");
    copy_flat(&fixture_models().join("model"), &model);
    let shard = model.join("model-00001.safetensors");
    std::fs::write(&shard, vec![1u8; 4096]).unwrap();
    let (repo, commit) = fx.repo();
    let smoke_yaml = SMOKE.replace("${FX_MODELS}/model", model.to_str().unwrap());
    fx.recipe("fx", &repo, &commit, &smoke_yaml);

    // The build's gate hashes every file of the model.
    fx.exits(&["build", "fx.yaml"], 0);
    let rec = record(&fx.oracle("fx"));
    let m = &only_case(&rec["smoke"])["model_manifest"];
    assert!(m["hashing"]["hashed_bytes"].as_u64().unwrap() > 4096, "{m}");
    assert_eq!(m["hashing"]["from_cache"], false, "{m}");
    let listed: Vec<&str> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        [
            "config.json",
            "model-00001.safetensors",
            "vocab.json",
            "weights.json"
        ],
        "{m}"
    );

    // The golden keeps the manifest (without this run's hashing).
    let out = fx.exits(&["smoke", "fx.yaml", "--record-golden", "--json"], 0);
    assert_eq!(only_case(&json(&out)["smoke"])["golden"], "recorded");
    let golden_file = d.join("goldens/fx/small.json");
    let golden = read_json(&golden_file);
    let gm = &golden["model_manifest"];
    let shard_row = gm["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "model-00001.safetensors")
        .unwrap_or_else(|| panic!("{gm}"));
    assert_eq!(shard_row["sha256"], sha256_hex(&[1u8; 4096]).as_str());
    assert_eq!(shard_row["size"], 4096);
    assert!(gm.get("hashing").is_none(), "{gm}");

    // Unchanged files: matched, and no byte read again (the kept hashes).
    let out = fx.exits(&["smoke", "fx.yaml", "--json"], 0);
    let c = only_case(&json(&out)["smoke"]).clone();
    assert_eq!(c["golden"], "matched", "{c}");
    assert_eq!(c["model_check"], "matched", "{c}");
    assert_eq!(c["model_manifest"]["hashing"]["hashed_bytes"], 0, "{c}");
    assert_eq!(c["model_manifest"]["hashing"]["from_cache"], true, "{c}");
    assert_eq!(c["model_manifest"]["digest"], gm["digest"], "{c}");

    // The same size, other bytes, a later mtime: the comparison is refused,
    // naming the file; only that file is hashed again.
    std::fs::write(&shard, vec![2u8; 4096]).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let out = fx.exits(&["smoke", "fx.yaml", "--json"], 4);
    let report = json(&out);
    let c = only_case(&report["smoke"]).clone();
    assert_eq!(c["golden"], "refused", "{c}");
    assert_eq!(c["model_check"], "differs", "{c}");
    assert_eq!(
        c["model_diff"]["changed"],
        serde_json::json!(["model-00001.safetensors"]),
        "{c}"
    );
    assert_eq!(c["model_diff"]["added"], serde_json::json!([]), "{c}");
    assert_eq!(c["model_manifest"]["hashing"]["files_hashed"], 1, "{c}");
    assert_eq!(c["model_manifest"]["hashing"]["hashed_bytes"], 4096, "{c}");
    assert!(
        report["smoke"]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().contains(
                "refused for comparison: it was recorded on other model files: changed: model-00001.safetensors"
            )),
        "{report}"
    );
    // The record says so too, and the text names the file.
    let rec = record(&fx.oracle("fx"));
    assert_eq!(rec["smoke"]["verdict"], "not-gateable");
    assert_eq!(
        only_case(&rec["smoke"])["model_diff"]["changed"][0],
        "model-00001.safetensors"
    );
    let out = fx.exits(&["smoke", "fx.yaml"], 4);
    let t = text(&out);
    assert!(
        t.contains("REFUSED") && t.contains("recorded on other model files"),
        "{t}"
    );
    assert!(
        t.contains("model files changed: model-00001.safetensors"),
        "{t}"
    );

    // A golden recorded before the manifest existed still compares, and
    // the output says the model was not checked.
    std::fs::write(&shard, vec![1u8; 4096]).unwrap();
    for g in [&golden_file, &fx.store().join("goldens/fx/small.json")] {
        let mut old = read_json(g);
        old.as_object_mut().unwrap().remove("model_manifest");
        std::fs::write(g, serde_json::to_string_pretty(&old).unwrap()).unwrap();
    }
    let out = fx.exits(&["smoke", "fx.yaml", "--json"], 0);
    let c = only_case(&json(&out)["smoke"]).clone();
    assert_eq!(c["golden"], "matched", "{c}");
    assert_eq!(c["model_check"], "not checked", "{c}");
    assert!(
        c["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("the model was not checked")),
        "{c}"
    );
    let t = text(&fx.exits(&["smoke", "fx.yaml"], 0));
    assert!(t.contains("NOT CHECKED"), "{t}");

    // A hub snapshot (files linked into ../../blobs/<sha256>): its
    // repository, revision, refs and blob names are recorded, and `sbom`
    // lists the model.
    let hub = d.join("hub/models--fx--tiny");
    let rev = "0123456789abcdef0123456789abcdef01234567";
    let snap = hub.join("snapshots").join(rev);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(hub.join("blobs")).unwrap();
    std::fs::create_dir_all(hub.join("refs")).unwrap();
    std::fs::write(hub.join("refs/main"), rev).unwrap();
    for e in std::fs::read_dir(fixture_models().join("model")).unwrap() {
        let e = e.unwrap();
        let bytes = std::fs::read(e.path()).unwrap();
        let sha = sha256_hex(&bytes);
        std::fs::write(hub.join("blobs").join(&sha), &bytes).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{sha}"), snap.join(e.file_name())).unwrap();
    }
    let hub_yaml = SMOKE
        .replace("${FX_MODELS}/model", snap.to_str().unwrap())
        .replace("name: small", "name: hub");
    fx.recipe("fx", &repo, &commit, &hub_yaml);
    let out = fx.exits(&["smoke", "fx.yaml", "--json"], 0);
    let c = only_case(&json(&out)["smoke"]).clone();
    let m = &c["model_manifest"];
    assert_eq!(m["hub"]["repo"], "fx/tiny", "{m}");
    assert_eq!(m["hub"]["revision"], rev, "{m}");
    assert_eq!(m["hub"]["refs"], serde_json::json!(["main"]), "{m}");
    for f in m["files"].as_array().unwrap() {
        assert_eq!(f["blob"], f["sha256"], "{f}");
    }
    let rec = record(&fx.oracle("fx"));
    assert_eq!(
        only_case(&rec["smoke"])["model_manifest"]["hub"]["revision"],
        rev
    );
    let out = fx.exits(&["sbom", "fx.yaml"], 0);
    let bom: Value = serde_json::from_slice(&out.stdout).unwrap();
    let models: Vec<&Value> = bom["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "machine-learning-model")
        .collect();
    assert_eq!(models.len(), 1, "{bom}");
    let mc = models[0];
    assert_eq!(mc["name"], "fx/tiny", "{mc}");
    assert_eq!(mc["version"], rev, "{mc}");
    assert_eq!(mc["hashes"][0]["content"], m["digest"], "{mc}");
    let files = mc["components"].as_array().unwrap();
    assert_eq!(files.len(), m["files"].as_array().unwrap().len(), "{mc}");
    assert!(
        files
            .iter()
            .all(|f| f["hashes"][0]["alg"] == "SHA-256" && f["type"] == "file"),
        "{mc}"
    );
}

/// Runs `c` with its output in files of `dir`, failing the test when it
/// runs past two minutes (a FIFO opened for hashing would block for ever).
fn within_two_minutes(c: &mut std::process::Command, dir: &Path) -> std::process::Output {
    let (o, e) = (dir.join("out.txt"), dir.join("err.txt"));
    let mut child = c
        .stdout(std::fs::File::create(&o).unwrap())
        .stderr(std::fs::File::create(&e).unwrap())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > std::time::Duration::from_secs(120) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "still running after two minutes: {}",
                std::fs::read_to_string(&e).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: std::fs::read(&o).unwrap(),
        stderr: std::fs::read(&e).unwrap(),
    }
}

/// A fixture `fx` whose case reads a copy of the fixture model at
/// `<dir>/models/model` (returned), built (gateable).
fn built_with_own_model() -> (Fx, PathBuf) {
    let fx = Fx::new();
    let model = fx.dir().join("models/model");
    copy_flat(&fixture_models().join("model"), &model);
    let (repo, commit) = fx.repo();
    let smoke_yaml = SMOKE.replace("${FX_MODELS}/model", model.to_str().unwrap());
    fx.recipe("fx", &repo, &commit, &smoke_yaml);
    fx.exits(&["build", "fx.yaml"], 0);
    (fx, model)
}

// A model directory holding what is not a regular file (a FIFO, a link to
// /dev/zero) fails the case, naming each entry and its kind, instead of
// leaving it out of the manifest and reporting every file the same; the
// FIFO is never opened (the gate ends). A file whose size is not its
// content (a link to /proc/self/status: size 0) is refused, not hashed as
// empty. With them gone the golden matches again.
#[test]
fn a_fifo_or_a_device_in_the_model_directory_fails_the_case_naming_each() {
    let (fx, model) = built_with_own_model();
    let d = fx.dir();
    fx.exits(&["smoke", "fx.yaml", "--record-golden"], 0);

    let fifo = std::ffi::CString::new(model.join("pipe").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink("/dev/zero", model.join("zero.bin")).unwrap();
    let out = within_two_minutes(&mut fx.cmd(&["smoke", "fx.yaml", "--json"]), d);
    assert_eq!(code(&out), 4, "{}", text(&out));
    let report = json(&out);
    let reasons = report["smoke"]["reasons"].to_string();
    for want in [
        "holds 2 entries that are not regular files",
        "pipe: a FIFO",
        "zero.bin: a character device (a link to /dev/zero)",
    ] {
        assert!(reasons.contains(want), "{want:?} in {reasons}");
    }
    let c = only_case(&report["smoke"]);
    assert_ne!(c["model_check"], "matched", "{c}");
    assert_eq!(record(&fx.oracle("fx"))["smoke"]["verdict"], "not-gateable");
    let out = within_two_minutes(&mut fx.cmd(&["smoke", "fx.yaml"]), d);
    assert_eq!(code(&out), 4, "{}", text(&out));
    let t = text(&out);
    assert!(!t.contains("every file the same"), "{t}");
    assert!(t.contains("pipe: a FIFO"), "{t}");

    // Size 0 by stat, a page of text when read.
    std::fs::remove_file(model.join("pipe")).unwrap();
    std::fs::remove_file(model.join("zero.bin")).unwrap();
    std::os::unix::fs::symlink("/proc/self/status", model.join("status")).unwrap();
    let out = within_two_minutes(&mut fx.cmd(&["smoke", "fx.yaml", "--json"]), d);
    assert_eq!(code(&out), 4, "{}", text(&out));
    let reasons = json(&out)["smoke"]["reasons"].to_string();
    assert!(
        reasons.contains("status changed while hashed or its size is not its content"),
        "{reasons}"
    );

    std::fs::remove_file(model.join("status")).unwrap();
    let out = fx.exits(&["smoke", "fx.yaml", "--json"], 0);
    assert_eq!(only_case(&json(&out)["smoke"])["model_check"], "matched");
}

// A model path where nothing is keeps the "not on this box" rule (the
// verdict recorded before stands); one that is a link that does not
// resolve (dangling, or a loop `ln -s model model`) is a fault of this
// box's model: the case fails naming the path and the OS error, the gate
// is a not-gateable verdict, and `activate` refuses the oracle.
#[test]
fn a_model_path_that_is_a_broken_link_fails_the_case_not_skips_it() {
    let (fx, model) = built_with_own_model();
    let d = fx.dir();
    let alias = d.join("alias");
    let alias = alias.to_str().unwrap();

    // Nothing there: the gate could not run here; the verdict stands.
    std::fs::rename(&model, d.join("models/kept")).unwrap();
    let out = fx.exits(&["smoke", "fx.yaml"], 4);
    assert!(
        text(&out).contains("does not exist") && text(&out).contains("keeps its gateable verdict"),
        "{}",
        text(&out)
    );
    assert_eq!(record(&fx.oracle("fx"))["smoke"]["verdict"], "gateable");

    // A dangling link: the case fails, naming the path and the OS error.
    std::os::unix::fs::symlink("gone", &model).unwrap();
    let out = fx.exits(&["smoke", "fx.yaml", "--json"], 4);
    let report = json(&out);
    let reasons = report["smoke"]["reasons"].to_string();
    let want = format!(
        "model path {} is a symbolic link to gone that cannot be resolved: No such file or directory",
        model.display()
    );
    assert!(reasons.contains(&want), "{reasons}");
    assert!(report["stands"].is_null(), "{report}");
    assert_eq!(report["recorded"], true, "{report}");
    let rec = record(&fx.oracle("fx"));
    assert_eq!(rec["smoke"]["verdict"], "not-gateable", "{rec}");
    assert!(rec.get("gate_not_run").is_none(), "{rec}");
    let out = fx.run(&["activate", "fx.yaml", alias]);
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(!Path::new(alias).exists());

    // A loop: the same, with the loop's error.
    std::fs::remove_file(&model).unwrap();
    std::os::unix::fs::symlink("model", &model).unwrap();
    let out = fx.exits(&["smoke", "fx.yaml"], 4);
    let t = text(&out);
    assert!(
        t.contains(&format!("model path {}", model.display()))
            && t.contains("Too many levels of symbolic links")
            && !t.contains("could not run on this box"),
        "{t}"
    );

    // The model back: gateable, and `activate` takes it.
    std::fs::remove_file(&model).unwrap();
    std::fs::rename(d.join("models/kept"), &model).unwrap();
    fx.exits(&["smoke", "fx.yaml"], 0);
    fx.exits(&["activate", "fx.yaml", alias], 0);
}
