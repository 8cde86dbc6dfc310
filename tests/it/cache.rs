//! The OCI cache end to end (issue 13): `push`, `pull`, substitution in
//! `build`, trust, and faults, through a real `docker-registry` on
//! 127.0.0.1 ([`crate::registry`]) and through a `file://` OCI image layout,
//! with the real binary, git, uv, python and ssh-keygen.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::registry::Registry;
use crate::support::*;
use serde_json::Value;

pub const REPO: &str = "team/oracles";

/// Writes `<store>/config.toml` with one `[[cache]]` entry.
pub fn configure(store: &Path, url: &str, key: Option<&Path>, signers: Option<&Path>, min: u32) {
    std::fs::create_dir_all(store).unwrap();
    let mut t = format!("[[cache]]\nname = \"team\"\nurl = \"{url}\"\nmin_signatures = {min}\n");
    if let Some(k) = key {
        t.push_str(&format!("signing_key = \"{}\"\n", k.display()));
    }
    if let Some(s) = signers {
        t.push_str(&format!("trusted_signers = \"{}\"\n", s.display()));
    }
    std::fs::write(store.join("config.toml"), t).unwrap();
}

/// `oracle-build <args> --store <store>` with the registry's credentials
/// (`DOCKER_CONFIG`), no user config, and this box's builder name.
pub fn ob(fx: &Fx, store: &Path, docker: Option<&Path>, builder: &str, args: &[&str]) -> Output {
    let mut c = fx.cmd_at(store, args);
    c.env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .env("HOME", fx.dir())
        .env("ORACLE_BUILD_BUILDER", builder)
        .env_remove("REGISTRY_AUTH_FILE");
    match docker {
        Some(d) => c.env("DOCKER_CONFIG", d),
        None => c.env("DOCKER_CONFIG", fx.dir().join("no-docker-config")),
    };
    c.output().expect("oracle-build runs")
}

pub fn ok(out: &Output) -> Value {
    assert_eq!(code(out), 0, "{}", text(out));
    json(out)
}

pub fn entries(store: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for b in [
        "git",
        "src",
        "ext",
        "lockfiles",
        "wheelhouse",
        "wheels",
        "pyc",
        "venvs",
    ] {
        if let Ok(d) = std::fs::read_dir(store.join("store").join(b)) {
            out.extend(
                d.flatten()
                    .map(|e| format!("{b}/{}", e.file_name().to_string_lossy())),
            );
        }
    }
    out.sort();
    out
}

pub fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Box A: build the fixture pin and push it (signed by `principal`).
/// Returns (fx, recipe, A's build report, the allowed_signers file).
pub fn built_and_pushed(url: &str, docker: Option<&Path>) -> (Fx, PathBuf, Value, PathBuf) {
    let fx = Fx::new();
    let (repo, _, recipe) = fx.pin();
    let a = fx.dir().join("store-a");
    let (key, line) = keypair(fx.dir(), "builder-a@test");
    let allowed = fx.dir().join("allowed_signers");
    std::fs::write(&allowed, line).unwrap();
    configure(&a, url, Some(&key), None, 1);
    let r = recipe.to_str().unwrap();
    let first = ok(&ob(
        &fx,
        &a,
        docker,
        "builder-a@test",
        &["build", r, "--json"],
    ));
    assert!(
        strs(&first["built"]).contains(&"wheel".to_string()),
        "{first}"
    );
    let pushed = ok(&ob(
        &fx,
        &a,
        docker,
        "builder-a@test",
        &["push", r, "--json"],
    ));
    let arts = pushed[0]["artifacts"].as_array().unwrap();
    let tags: Vec<&str> = arts.iter().map(|a| a["tag"].as_str().unwrap()).collect();
    for prefix in ["src-", "lock-", "wheelhouse-", "wheel-", "inputs-"] {
        assert!(
            tags.iter().any(|t| t.starts_with(prefix)),
            "{prefix}: {pushed}"
        );
    }
    assert_eq!(
        tags.last().unwrap().split('-').next(),
        Some("inputs"),
        "{pushed}"
    );
    assert_eq!(pushed[0]["signed"], true, "{pushed}");
    // The upstream repository is gone: sources must come from the cache.
    force_remove(&repo);
    (fx, recipe, first, allowed)
}

/// Runs the command `shown` prints after `lead` (the rest of that line,
/// split on whitespace) as printed, from the test directory with no user
/// config and no registry credentials, with `--json`; asserts exit 0 and
/// returns its document.
fn run_printed(fx: &Fx, shown: &str, lead: &str) -> Value {
    let line = shown
        .split(lead)
        .nth(1)
        .and_then(|h| h.lines().next())
        .unwrap_or_else(|| panic!("no `{lead}` in: {shown}"));
    let args: Vec<&str> = line.split_whitespace().collect();
    let mut c = crate::support::cmd(fx.dir());
    c.args(&args)
        .arg("--json")
        .env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .env("HOME", fx.dir())
        .env("DOCKER_CONFIG", fx.dir().join("no-docker-config"));
    ok(&c.output().expect("oracle-build runs"))
}

/// Box B: pull into an empty store, then `build --offline`: no wheel is
/// built, the venv key is A's, the oracle is gateable.
fn pull_then_offline_build(
    fx: &Fx,
    url: &str,
    docker: Option<&Path>,
    recipe: &Path,
    first: &Value,
    allowed: &Path,
) {
    let b = fx.dir().join("store-b");
    configure(&b, url, None, Some(allowed), 1);
    let r = recipe.to_str().unwrap();
    let pulled = ok(&ob(
        fx,
        &b,
        docker,
        "builder-b@test",
        &["pull", r, "--json"],
    ));
    assert!(
        strs(&pulled["added"])
            .iter()
            .any(|a| a.starts_with("wheels/")),
        "{pulled}"
    );
    assert_eq!(pulled["inputs"]["venv_key"], first["key"], "{pulled}");
    // The text form's hint runs as printed, from another directory: it
    // names this store.
    let shown = ob(fx, &b, docker, "builder-b@test", &["pull", r]);
    let shown = text(&shown);
    let again = run_printed(fx, &shown, "build it here with: oracle-build ");
    assert!(
        !strs(&again["built"]).contains(&"wheel".to_string()),
        "{again}"
    );
    assert_eq!(again["key"], first["key"], "{again}");
    assert_eq!(again["verdict"], "gateable", "{again}");
    pulled_bytecode_is_used(fx, &b, docker, r, &pulled, &again);
}

/// Checks, on the pulling box `b`, that the bytecode came with the pull:
/// `pyc/` entries added, no `.pyc` compiled here (`oracle.json`'s
/// `bytecode`), every linked `.pyc` the same as this box compiles from the
/// same source (header and code), and `verify --deep` passes.
pub fn pulled_bytecode_is_used(
    fx: &Fx,
    b: &Path,
    docker: Option<&Path>,
    r: &str,
    pulled: &Value,
    built: &Value,
) {
    assert!(
        strs(&pulled["added"]).iter().any(|a| a.starts_with("pyc/")),
        "{pulled}"
    );
    let venv = PathBuf::from(built["oracle"].as_str().unwrap());
    let rec = read_json(&venv.join("oracle.json"));
    assert_eq!(rec["bytecode"]["compiled"], 0, "{}", rec["bytecode"]);
    assert!(
        rec["bytecode"]["linked"].as_u64().unwrap_or(0) > 20,
        "{}",
        rec["bytecode"]
    );
    assert!(
        strs(&rec["requires"]).iter().any(|x| x.starts_with("pyc/")),
        "{}",
        rec["requires"]
    );
    // Each linked .pyc against this box's own compile of its source.
    let script = r#"
import importlib.util as u, marshal, os, py_compile, sys, sysconfig, tempfile
site = sysconfig.get_paths()["purelib"]
tag = sys.implementation.cache_tag
n = bad = 0
tmp = tempfile.mkdtemp()
for d, dirs, files in os.walk(site):
    if os.path.basename(d) != "__pycache__":
        continue
    for f in files:
        pyc = os.path.join(d, f)
        if os.stat(pyc).st_nlink < 2:
            continue
        src = os.path.join(os.path.dirname(d), f.split(".")[0] + ".py")
        rel = os.path.relpath(src, site)
        out = os.path.join(tmp, "x.pyc")
        py_compile.compile(src, cfile=out, dfile=rel, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        a, b = open(pyc, "rb").read(), open(out, "rb").read()
        n += 1
        if a[:16] != b[:16] or marshal.loads(a[16:]) != marshal.loads(b[16:]) \
                or marshal.loads(a[16:]).co_filename != rel:
            bad += 1
            print("differs:", rel)
print("checked", n, "bad", bad)
"#;
    let run = Command::new(venv.join("bin/python"))
        .args(["-c", script])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(run.status.success(), "{}", text(&run));
    let n: usize = out
        .split("checked ")
        .nth(1)
        .and_then(|x| x.split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    assert!(n > 20 && out.contains(" bad 0"), "{out}");
    let v = ob(fx, b, docker, "builder-b@test", &["verify", r, "--deep"]);
    assert_eq!(code(&v), 0, "{}", text(&v));
}

#[test]
fn push_pull_offline_build_and_substitution_through_a_registry_with_auth() {
    let reg = Registry::start(Some(("team", "s3cret-pw")));
    let url = reg.url(REPO);
    let docker = reg.docker_config.clone();
    let (fx, recipe, first, allowed) = built_and_pushed(&url, Some(&docker));
    let r = recipe.to_str().unwrap();
    // The append-only layout: wheel-<key>-<wheel sha256>-<manifest>, and
    // the signature its own att-wheel-<key>-... artifact.
    let wheel_tag = format!("wheel-{}-", first["keys"]["wheel"].as_str().unwrap());
    let att_tag = format!("att-wheel-{}-", first["keys"]["wheel"].as_str().unwrap());
    for prefix in [&wheel_tag, &att_tag] {
        assert!(
            reg.tags(REPO)
                .iter()
                .any(|t| t.starts_with(prefix.as_str())),
            "{prefix}: {:?}",
            reg.tags(REPO)
        );
    }

    // Without credentials the registry refuses, and nothing is written.
    let c0 = fx.dir().join("store-c0");
    configure(&c0, &url, None, Some(&allowed), 1);
    let out = ob(&fx, &c0, None, "x@test", &["pull", r]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(entries(&c0).is_empty(), "{:?}", entries(&c0));

    pull_then_offline_build(&fx, &url, Some(&docker), &recipe, &first, &allowed);

    // Substitution: an empty store with the cache configured builds no wheel.
    let c = fx.dir().join("store-c");
    configure(&c, &url, None, Some(&allowed), 1);
    let sub = ok(&ob(
        &fx,
        &c,
        Some(&docker),
        "builder-c@test",
        &["build", r, "--json"],
    ));
    assert!(!strs(&sub["built"]).contains(&"wheel".to_string()), "{sub}");
    let taken = strs(&sub["substituted"]);
    for stage in ["source", "lock", "wheelhouse", "wheel"] {
        assert!(taken.contains(&stage.to_string()), "{stage}: {sub}");
    }
    assert_eq!(sub["key"], first["key"], "{sub}");
    assert_eq!(sub["verdict"], "gateable", "{sub}");

    // --no-substitute does the work here (the source is gone upstream: it fails).
    let d = fx.dir().join("store-d");
    configure(&d, &url, None, Some(&allowed), 1);
    let out = ob(
        &fx,
        &d,
        Some(&docker),
        "x@test",
        &["build", r, "--no-substitute"],
    );
    assert_ne!(code(&out), 0, "{}", text(&out));
}

#[test]
fn the_same_round_trip_through_a_file_oci_layout() {
    let layout = tempfile::tempdir().unwrap();
    let dir = layout.path().join("cache");
    let url = format!("file://{}", dir.display());
    let (fx, recipe, first, allowed) = built_and_pushed(&url, None);
    // An OCI image layout: oci-layout, index.json with tags, blobs by digest.
    assert!(dir.join("oci-layout").is_file());
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let wheel_tag = format!("wheel-{}-", first["keys"]["wheel"].as_str().unwrap());
    assert!(
        index["manifests"].as_array().unwrap().iter().any(|m| {
            m["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .is_some_and(|t| t.starts_with(&wheel_tag))
        }),
        "{index}"
    );
    pull_then_offline_build(&fx, &url, None, &recipe, &first, &allowed);
    // `plan` shows, per stage, whether a cache has it and who signed it.
    let b = fx.dir().join("store-b");
    for bucket in ["venvs", "wheels"] {
        for e in std::fs::read_dir(b.join("store").join(bucket)).unwrap() {
            force_remove(&e.unwrap().path());
        }
    }
    let out = ob(
        &fx,
        &b,
        None,
        "b@test",
        &["plan", recipe.to_str().unwrap(), "--json", "--offline"],
    );
    let plan = json(&out);
    let rows = plan["caches"].as_array().unwrap();
    let wheel = rows
        .iter()
        .find(|c| c["stage"] == "wheel")
        .unwrap_or_else(|| panic!("{plan}"));
    assert_eq!(wheel["cache"].as_str(), Some(url.as_str()), "{plan}");
    assert_eq!(strs(&wheel["signed_by"]), ["builder-a@test"], "{plan}");
    // --offline substitutes from file:// caches.
    let c = fx.dir().join("store-c");
    configure(&c, &url, None, Some(&allowed), 1);
    let r = recipe.to_str().unwrap();
    let sub = ok(&ob(
        &fx,
        &c,
        None,
        "c@test",
        &["build", r, "--offline", "--json"],
    ));
    assert!(
        strs(&sub["substituted"]).contains(&"wheel".to_string()),
        "{sub}"
    );
    assert_eq!(sub["key"], first["key"], "{sub}");

    // A damaged store wheel is never pushed (nor signed): the append-only
    // cache would keep it for good.
    let a = fx.dir().join("store-a");
    let wheels = a.join("store").join("wheels");
    let entry = std::fs::read_dir(&wheels)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let whl = std::fs::read_dir(&entry)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .unwrap();
    in_writable_entry(&entry, || {
        let mut bytes = std::fs::read(&whl).unwrap();
        bytes[100] ^= 1;
        std::fs::write(&whl, bytes).unwrap();
    });
    let fresh = layout.path().join("fresh");
    let fresh_url = format!("file://{}", fresh.display());
    let out = ob(
        &fx,
        &a,
        None,
        "builder-a@test",
        &["push", r, "--cache", &fresh_url],
    );
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("is damaged") && text(&out).contains("nothing was pushed"),
        "{}",
        text(&out)
    );
    assert!(!fresh.join("index.json").exists(), "nothing was pushed");
}

/// Runs `f` with the read-only store entry `dir` (and its files) writable,
/// then makes them read-only again.
fn in_writable_entry(dir: &Path, f: impl FnOnce()) {
    use std::os::unix::fs::PermissionsExt;
    let set = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    set(dir, 0o755);
    for e in std::fs::read_dir(dir).unwrap() {
        set(&e.unwrap().path(), 0o644);
    }
    f();
    for e in std::fs::read_dir(dir).unwrap() {
        set(&e.unwrap().path(), 0o444);
    }
    set(dir, 0o555);
}

/// Makes the wheel of the store entry `dir` different bytes (one byte
/// appended) and updates its `build.json` and `manifest.json` to match: a
/// box whose build of the same key gave another wheel.
pub fn rebuild_differently(dir: &Path) {
    let script = r#"
import hashlib, json, os, stat, sys
d = sys.argv[1]
for root, dirs, files in os.walk(d):
    os.chmod(root, 0o755)
    for f in files:
        os.chmod(os.path.join(root, f), 0o644)
b = json.load(open(os.path.join(d, "build.json")))
w = os.path.join(d, b["wheel"])
open(w, "ab").write(b"\0")
data = open(w, "rb").read()
b["sha256"] = hashlib.sha256(data).hexdigest(); b["size"] = len(data)
open(os.path.join(d, "build.json"), "w").write(json.dumps(b, indent=2))
m = json.load(open(os.path.join(d, "manifest.json")))
for f in m["files"]:
    p = os.path.join(d, f["path"])
    f["sha256"] = hashlib.sha256(open(p, "rb").read()).hexdigest(); f["size"] = os.path.getsize(p)
open(os.path.join(d, "manifest.json"), "w").write(json.dumps(m, indent=2))
"#;
    succeeds(Command::new("python3").arg("-c").arg(script).arg(dir));
}

#[test]
fn faults_trust_and_concurrency_through_a_registry() {
    let reg = Registry::start(None);
    let url = reg.url(REPO);
    let (fx, recipe, first, allowed) = built_and_pushed(&url, None);
    let r = recipe.to_str().unwrap();
    let a = fx.dir().join("store-a");
    let wheel_key = first["keys"]["wheel"].as_str().unwrap().to_string();
    let wheel_prefix = format!("wheel-{wheel_key}-");
    let wheel_tags = |repo: &str| -> Vec<String> {
        reg.tags(repo)
            .into_iter()
            .filter(|t| t.starts_with(&wheel_prefix))
            .collect()
    };
    let wheel_tag = wheel_tags(REPO).pop().expect("the wheel's tag");

    // A wheel signed by a key this box does not trust is refused; nothing is written.
    let (_, stranger) = keypair(fx.dir(), "stranger@test");
    let other = fx.dir().join("other_signers");
    std::fs::write(&other, stranger).unwrap();
    let u = fx.dir().join("store-untrusted");
    configure(&u, &url, None, Some(&other), 1);
    let out = ob(&fx, &u, None, "u@test", &["pull", r]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(text(&out).contains("not trusted"), "{}", text(&out));
    assert!(entries(&u).is_empty(), "{:?}", entries(&u));

    // min_signatures 2: one signature is not enough ...
    let (key_b, line_b) = keypair(fx.dir(), "builder-b@test");
    let both = fx.dir().join("both_signers");
    std::fs::write(
        &both,
        format!("{}{line_b}", std::fs::read_to_string(&allowed).unwrap()),
    )
    .unwrap();
    let m = fx.dir().join("store-two");
    configure(&m, &url, None, Some(&both), 2);
    let out = ob(&fx, &m, None, "m@test", &["pull", r]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(entries(&m).is_empty(), "{:?}", entries(&m));
    // ... until a second box that built the same key signs the same wheel.
    let a2 = fx.dir().join("store-a2");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&a)
        .arg(&a2)
        .status()
        .unwrap();
    assert!(cp.success());
    configure(&a2, &url, Some(&key_b), None, 1);
    let pushed = ok(&ob(
        &fx,
        &a2,
        None,
        "builder-b@test",
        &["push", r, "--json"],
    ));
    // The wheel is there already (the same bytes); B's signature is its
    // own artifact, and A's stays.
    let states: Vec<(&str, &str)> = pushed[0]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| {
            x["tag"] == wheel_tag.as_str() || x["tag"].as_str().unwrap().starts_with("att-wheel-")
        })
        .map(|x| {
            (
                &x["tag"].as_str().unwrap()[..4],
                x["state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [("whee", "present"), ("att-", "signed")],
        "{pushed}"
    );
    ok(&ob(&fx, &m, None, "m@test", &["pull", r, "--json"]));

    // SIGKILL after the wheel's blobs, before its manifest: no tag.
    let killed = reg.url("team/killed");
    let out = fx
        .cmd_at(&a, &["push", r, "--cache", &killed])
        .env("ORACLE_BUILD_FAULT", "push-kill-wheel")
        .env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{}", text(&out));
    let tags = reg.tags("team/killed");
    assert!(tags.iter().any(|t| t.starts_with("src-")), "{tags:?}");
    assert!(
        !tags.iter().any(|t| t.starts_with(&wheel_prefix)),
        "{tags:?}"
    );
    assert!(!tags.iter().any(|t| t.starts_with("inputs-")), "{tags:?}");
    ok(&ob(
        &fx,
        &a,
        None,
        "x@test",
        &["push", r, "--cache", &killed, "--json"],
    ));
    assert_eq!(wheel_tags("team/killed"), std::slice::from_ref(&wheel_tag));

    // Two concurrent pushes of one key leave one manifest.
    let twice = reg.url("team/twice");
    let mut kids: Vec<_> = (0..2)
        .map(|_| {
            fx.cmd_at(&a, &["push", r, "--cache", &twice])
                .env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for k in kids.drain(..) {
        let out = k.wait_with_output().unwrap();
        assert_eq!(code(&out), 0, "{}", text(&out));
    }
    assert_eq!(wheel_tags("team/twice"), std::slice::from_ref(&wheel_tag));
    for t in reg.tags("team/twice") {
        assert_eq!(reg.tag_revisions("team/twice", &t), 1, "{t}");
    }

    // A byte flipped in a bytecode blob: that entry is refused, naming its
    // digest, and the box compiles its own; everything else is pulled.
    let pyc_tag = reg
        .tags(REPO)
        .into_iter()
        .find(|t| t.starts_with("pyc-"))
        .expect("a bytecode artifact");
    let link = reg
        .storage
        .join("docker/registry/v2/repositories")
        .join(REPO)
        .join("_manifests/tags")
        .join(&pyc_tag)
        .join("current/link");
    let m_hex = std::fs::read_to_string(&link).unwrap();
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(reg.blob_file(m_hex.trim().trim_start_matches("sha256:"))).unwrap(),
    )
    .unwrap();
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let blob = reg.blob_file(layer.trim_start_matches("sha256:"));
    let good = std::fs::read(&blob).unwrap();
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(&blob, &bad).unwrap();
    let t = fx.dir().join("store-pyc-tampered");
    configure(&t, &url, None, Some(&allowed), 1);
    let out = ob(&fx, &t, None, "t@test", &["pull", r]);
    std::fs::write(&blob, &good).unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    let name = manifest["annotations"]["dev.oracle-build.name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text(&out).contains(&format!("pyc/{name}: ")) && text(&out).contains(&layer),
        "{}",
        text(&out)
    );
    let got = entries(&t);
    assert!(!got.contains(&format!("pyc/{name}")), "{got:?}");
    assert!(got.iter().any(|e| e.starts_with("pyc/")), "{got:?}");
    assert!(got.iter().any(|e| e.starts_with("wheels/")), "{got:?}");

    // A byte flipped in a blob of the registry's storage: the pull fails
    // naming the digest, and nothing is written.
    let sha = read_json(&a.join("store/wheels").join(&wheel_key).join("build.json"))["sha256"]
        .as_str()
        .unwrap()
        .to_string();
    let blob = reg.blob_file(&sha);
    let mut bytes = std::fs::read(&blob).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let f = fx.dir().join("store-flipped");
    configure(&f, &url, None, Some(&allowed), 1);
    let out = ob(&fx, &f, None, "f@test", &["pull", r]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains(&format!("sha256:{sha}")),
        "{}",
        text(&out)
    );
    assert!(entries(&f).is_empty(), "{:?}", entries(&f));

    // A different wheel for the same key: a reproducibility failure; the
    // cached wheel's tag is never rewritten, and both wheels are visible.
    let revisions = reg.tag_revisions(REPO, &wheel_tag);
    let a3 = fx.dir().join("store-a3");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&a)
        .arg(&a3)
        .status()
        .unwrap();
    assert!(cp.success());
    rebuild_differently(&a3.join("store/wheels").join(&wheel_key));
    let out = ob(&fx, &a3, None, "builder-a@test", &["push", r]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains("reproducibility failure"),
        "{}",
        text(&out)
    );
    assert_eq!(reg.tag_revisions(REPO, &wheel_tag), revisions);
    assert_eq!(wheel_tags(REPO).len(), 2, "{:?}", reg.tags(REPO));

    // An untrusted pusher's different wheel for the key is no second build:
    // in a fresh repository E (a key nobody trusts) pushes a3's wheel
    // first; A, whose policy trusts only A, then pushes its own: exit 0,
    // E's wheel named as untrusted, not a reproducibility failure.
    const REPO2: &str = "team/untrusted-first";
    let url2 = reg.url(REPO2);
    let (key_e, _) = keypair(fx.dir(), "eve@test");
    configure(&a3, &url2, Some(&key_e), None, 1);
    ok(&ob(&fx, &a3, None, "eve@test", &["push", r, "--json"]));
    let a4 = fx.dir().join("store-a4");
    succeeds(Command::new("cp").arg("-a").arg(&a).arg(&a4));
    let key_a = fx.dir().join("key-builder-a@test");
    configure(&a4, &url2, Some(&key_a), Some(&allowed), 1);
    let out = ob(&fx, &a4, None, "builder-a@test", &["push", r]);
    let t = text(&out);
    assert_eq!(code(&out), 0, "{t}");
    assert!(
        !t.contains("reproducibility failure")
            && t.contains("which this store's trusted_signers does not trust (untrusted:"),
        "{t}"
    );
    assert_eq!(wheel_tags(REPO2).len(), 2, "{:?}", reg.tags(REPO2));
}

/// A wheel is keyed by the commit, not by the URL it was fetched from: box
/// A builds the pin from one URL, then a second recipe of the same commit
/// from a clone at another (the same wheel), and pushes that one. Box B
/// pulls the second recipe: its wheel's version is checked against the
/// mirror the pull brought (the wheel's own record names A's first mirror),
/// so it is taken, and `build --offline` builds no wheel.
#[test]
fn a_wheel_built_under_another_url_of_the_commit_is_checked_against_the_pulled_mirror() {
    let layout = tempfile::tempdir().unwrap();
    let url = format!("file://{}", layout.path().join("cache").display());
    let fx = Fx::new();
    let (repo, commit, recipe) = fx.pin();
    let clone = fx.dir().join("clone");
    git(
        fx.dir(),
        &[
            "clone",
            "-q",
            repo.to_str().unwrap(),
            clone.to_str().unwrap(),
        ],
    );
    let other = write_recipe(fx.dir(), "fx-clone", &clone, &commit, SMOKE);
    let a = fx.dir().join("store-a");
    let (key, line) = keypair(fx.dir(), "builder-a@test");
    let allowed = fx.dir().join("allowed_signers");
    std::fs::write(&allowed, line).unwrap();
    configure(&a, &url, Some(&key), None, 1);
    let first = ok(&ob(
        &fx,
        &a,
        None,
        "builder-a@test",
        &["build", recipe.to_str().unwrap(), "--json"],
    ));
    let o = other.to_str().unwrap();
    let second = ok(&ob(
        &fx,
        &a,
        None,
        "builder-a@test",
        &["build", o, "--json"],
    ));
    assert_eq!(second["keys"]["wheel"], first["keys"]["wheel"], "{second}");
    assert!(
        !strs(&second["built"]).contains(&"wheel".to_string()),
        "{second}"
    );
    // The second oracle keeps the mirror it was built from (the wheel's
    // record names the first recipe's): gc takes nothing, and it rebuilds
    // offline.
    let gc = ok(&ob(&fx, &a, None, "builder-a@test", &["gc", "--json"]));
    assert_eq!(gc["deleted"], serde_json::json!([]), "{gc}");
    force_remove(Path::new(second["oracle"].as_str().unwrap()));
    ok(&ob(
        &fx,
        &a,
        None,
        "builder-a@test",
        &["build", o, "--offline", "--json"],
    ));
    ok(&ob(&fx, &a, None, "builder-a@test", &["push", o, "--json"]));

    let b = fx.dir().join("store-b");
    configure(&b, &url, None, Some(&allowed), 1);
    let pulled = ok(&ob(&fx, &b, None, "builder-b@test", &["pull", o, "--json"]));
    assert!(
        strs(&pulled["added"])
            .iter()
            .any(|a| a.starts_with("wheels/")),
        "{pulled}"
    );
    assert!(strs(&pulled["refused"]).is_empty(), "{pulled}");
    let built = ok(&ob(
        &fx,
        &b,
        None,
        "builder-b@test",
        &["build", o, "--offline", "--json"],
    ));
    assert!(
        !strs(&built["built"]).contains(&"wheel".to_string()),
        "{built}"
    );
}

/// An untrusted pusher's second lock for a key does not stop substitution:
/// box A (trusted) and box E (a key nobody trusts) lock the same inputs
/// under two recipe names (two different locks for one key) and push; box
/// C, trusting A only, substitutes A's lock (`lock` among `substituted`),
/// not "2 different locks ... taking none" as when two trusted boxes
/// disagree (the test below).
#[test]
fn an_untrusted_second_lock_for_a_key_leaves_the_trusted_one_substituted() {
    let layout = tempfile::tempdir().unwrap();
    let url = format!("file://{}", layout.path().join("cache").display());
    let fx = Fx::new();
    let (repo, commit, recipe) = fx.pin();
    let renamed = write_recipe(fx.dir(), "fx-renamed", &repo, &commit, SMOKE);
    let (key_a, line_a) = keypair(fx.dir(), "builder-a@test");
    let (key_e, _) = keypair(fx.dir(), "eve@test");
    let allowed = fx.dir().join("allowed_signers");
    std::fs::write(&allowed, line_a).unwrap();
    for (store, key, builder, r) in [
        ("store-a", &key_a, "builder-a@test", &recipe),
        ("store-e", &key_e, "eve@test", &renamed),
    ] {
        let s = fx.dir().join(store);
        configure(&s, &url, Some(key), None, 1);
        let r = r.to_str().unwrap();
        ok(&ob(&fx, &s, None, builder, &["build", r, "--json"]));
        ok(&ob(&fx, &s, None, builder, &["push", r, "--json"]));
    }
    let c = fx.dir().join("store-c");
    configure(&c, &url, None, Some(&allowed), 1);
    let out = ob(
        &fx,
        &c,
        None,
        "c@test",
        &["build", recipe.to_str().unwrap(), "--json"],
    );
    let built = ok(&out);
    assert!(
        strs(&built["substituted"]).contains(&"lock".to_string()),
        "{built}\n{}",
        text(&out)
    );
    assert!(!text(&out).contains("different locks"), "{}", text(&out));
}

/// Two boxes lock the same inputs under two recipe names, then both push:
/// a lock's `lock.json` names its recipe, so the cache holds two locks for
/// one key. Every reader sees the reproducibility failure (`cache verify`
/// fails), none trusts either lock, and a third box's `pull` says what
/// `build --offline` would miss and hints a build that may resolve one.
#[test]
fn two_boxes_locking_one_pin_under_two_recipe_names_leave_a_visible_lock_failure() {
    let layout = tempfile::tempdir().unwrap();
    let url = format!("file://{}", layout.path().join("cache").display());
    let fx = Fx::new();
    let (repo, commit, recipe) = fx.pin();
    let renamed = write_recipe(fx.dir(), "fx-renamed", &repo, &commit, SMOKE);
    let (key_a, line_a) = keypair(fx.dir(), "builder-a@test");
    let (key_b, line_b) = keypair(fx.dir(), "builder-b@test");
    let allowed = fx.dir().join("allowed_signers");
    std::fs::write(&allowed, format!("{line_a}{line_b}")).unwrap();
    let boxes = [
        ("store-a", &key_a, "builder-a@test", &recipe),
        ("store-b", &key_b, "builder-b@test", &renamed),
    ];
    // Both lock and build before either pushes (as two boxes at once).
    for (store, key, builder, r) in boxes {
        let s = fx.dir().join(store);
        configure(&s, &url, Some(key), Some(&allowed), 1);
        ok(&ob(
            &fx,
            &s,
            None,
            builder,
            &["build", r.to_str().unwrap(), "--json"],
        ));
    }
    for (store, _, builder, r) in boxes {
        let s = fx.dir().join(store);
        // A push killed earlier left its staging: this push removes it.
        let mut gone = Command::new("true").spawn().unwrap();
        let pid = gone.id();
        gone.wait().unwrap();
        let left = s.join("tmp").join(format!("push.{pid}.killed"));
        std::fs::create_dir_all(&left).unwrap();
        std::fs::write(left.join("source.bundle"), b"partial").unwrap();
        let out = ob(
            &fx,
            &s,
            None,
            builder,
            &["push", r.to_str().unwrap(), "--json"],
        );
        ok(&out);
        assert!(
            text(&out).contains("removed 1 stale staging directory") && !left.exists(),
            "{}",
            text(&out)
        );
    }
    let c = fx.dir().join("store-c");
    configure(&c, &url, None, Some(&allowed), 1);
    let out = ob(&fx, &c, None, "c@test", &["cache", "verify"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains("reproducibility failure for lock"),
        "{}",
        text(&out)
    );
    let r = renamed.to_str().unwrap();
    let out = ob(&fx, &c, None, "c@test", &["pull", r]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let shown = text(&out);
    assert!(
        shown.contains("refused") && shown.contains("lock-"),
        "{shown}"
    );
    assert!(
        shown.contains("`build --offline` would miss: --offline: lock stage"),
        "{shown}"
    );
    let hint = shown
        .lines()
        .find(|l| l.contains("build it here with: oracle-build build"))
        .unwrap_or_else(|| panic!("no hint: {shown}"));
    assert!(!hint.contains("--offline"), "{shown}");
    assert!(
        !c.join("store/lockfiles").is_dir()
            || std::fs::read_dir(c.join("store/lockfiles"))
                .unwrap()
                .next()
                .is_none(),
        "no lock was taken"
    );
}

/// Issue 41, item 6: one pusher cannot stop a team's `pull`. Box A
/// (trusted) builds and pushes; box E, a team member's box with write access
/// and a key nobody trusts, has another `gcc` (a wrapper answering another
/// version: another wheel key for the same recipe text), builds the pin and
/// pushes: a second `inputs-` artifact of the recipe naming another wheel.
/// Box C, trusting only A, pulls A's inputs and says that E's were skipped
/// and why; box U, trusting nobody, is told that no reader picks one, and
/// the fix it prints (a build here) runs as printed.
#[test]
fn one_untrusted_pusher_naming_another_wheel_cannot_stop_a_teams_pull() {
    let reg = Registry::start(None);
    let url = reg.url(REPO);
    let (fx, recipe, first, allowed) = built_and_pushed(&url, None);
    let r = recipe.to_str().unwrap();
    let a = fx.dir().join("store-a");
    let wheel_a = first["keys"]["wheel"].as_str().unwrap().to_string();

    // E: A's store copied (the mirror, the lock), another gcc on PATH.
    let e = fx.dir().join("store-e");
    succeeds(Command::new("cp").arg("-a").arg(&a).arg(&e));
    let (key_e, _) = keypair(fx.dir(), "eve@test");
    configure(&e, &url, Some(&key_e), None, 1);
    let bin = fx.dir().join("eve-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let gcc = bin.join("gcc");
    std::fs::write(
        &gcc,
        "#!/bin/sh\nif [ \"$1\" = -dumpfullversion ]; then echo 99.1.0; exit 0; fi\nexec /usr/bin/gcc \"$@\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&gcc, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let as_eve = |args: &[&str]| {
        fx.cmd_at(&e, args)
            .env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
            .env("HOME", fx.dir())
            .env("ORACLE_BUILD_BUILDER", "eve@test")
            .env("DOCKER_CONFIG", fx.dir().join("no-docker-config"))
            .env("PATH", &path)
            .output()
            .unwrap()
    };
    let built_e = ok(&as_eve(&["build", r, "--json"]));
    let wheel_e = built_e["keys"]["wheel"].as_str().unwrap().to_string();
    assert_ne!(wheel_e, wheel_a, "{built_e}");
    let pushed = ok(&as_eve(&["push", r, "--json"]));
    let inputs_e = pushed[0]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["tag"].as_str())
        .find(|t| t.starts_with("inputs-"))
        .expect("E pushed an inputs artifact")
        .to_string();
    let inputs: Vec<String> = reg
        .tags(REPO)
        .into_iter()
        .filter(|t| t.starts_with("inputs-"))
        .collect();
    assert_eq!(inputs.len(), 2, "{inputs:?}");

    // C trusts A: A's inputs are taken, E's skipped, saying why.
    let c = fx.dir().join("store-c");
    configure(&c, &url, None, Some(&allowed), 1);
    let out = ob(&fx, &c, None, "c@test", &["pull", r, "--json"]);
    let pulled = ok(&out);
    assert_eq!(pulled["inputs"]["wheel_key"], wheel_a.as_str(), "{pulled}");
    let skipped = strs(&pulled["skipped"]);
    assert_eq!(skipped.len(), 1, "{pulled}");
    assert!(
        skipped[0].starts_with(&format!("{inputs_e}: it names wheel {wheel_e}"))
            && skipped[0].contains("not trusted")
            && skipped[0].contains(&format!(
                "names wheel {wheel_a}, its wheel wheel-{wheel_a}-"
            )),
        "{pulled}"
    );
    assert!(
        strs(&pulled["added"])
            .iter()
            .any(|x| *x == format!("wheels/{wheel_a}")),
        "{pulled}"
    );
    let shown = text(&ob(&fx, &c, None, "c@test", &["pull", r]));
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with(&format!("skipped  {inputs_e}: "))),
        "{shown}"
    );

    // U trusts nobody: no reader picks one; nothing is written, and the
    // fix it prints runs as printed (the box builds its own).
    let u = fx.dir().join("store-u");
    configure(&u, &url, None, None, 1);
    let out = ob(&fx, &u, None, "u@test", &["pull", r]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let shown = text(&out);
    assert!(
        shown.contains("naming different wheels, none of them trusted here")
            && shown.contains(&inputs_e),
        "{shown}"
    );
    assert!(entries(&u).is_empty(), "{:?}", entries(&u));
    let built_u = run_printed(
        &fx,
        &shown,
        "build it here instead (it takes from the caches what is pinned): oracle-build ",
    );
    // U trusts no signer, so the tags of the cache's source are kept aside
    // (issue 41, item 1): with the repository gone its history has none,
    // and it builds its own wheel of that version, not A's.
    assert_ne!(built_u["keys"]["wheel"], wheel_a.as_str(), "{built_u}");
    assert!(
        built_u["runtime_version"]
            .as_str()
            .is_some_and(|v| v.starts_with("0.1.dev")),
        "{built_u}"
    );
    assert!(
        strs(&built_u["substituted"]).contains(&"source".to_string()),
        "{built_u}"
    );
}
