//! The installer pinned by the binary (issues 40 and 41): the pinned uv's
//! wheel is fetched by its compiled-in sha256 through `[[mirror]]` by the
//! tool's own downloader (no pip, nothing written in `HOME`), and a uv
//! wheel with another hash is refused naming both, whether a mirror serves
//! it, a cache's inputs record names it (`pull`) or a bundle carries it
//! (`import`).

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::cache::{REPO, built_and_pushed, configure, ok, strs};
use crate::download::Index;
use crate::registry::Registry;
use crate::support::*;

/// The pinned wheel of uv 0.13.9 this host fetches (PyPI URL, sha256), as
/// the binary's table has it (`src/host/uv_wheels.rs`).
fn pinned_wheel() -> (&'static str, &'static str) {
    match std::env::consts::ARCH {
        "x86_64" => (
            "https://files.pythonhosted.org/packages/3d/aa/26d64642d808de4a652579ef950d7cd2d37f080a8babf9c67c6b75fc4c3f/uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
            "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
        ),
        "aarch64" => (
            "https://files.pythonhosted.org/packages/fe/2f/51a5de367c602592c018a42a23d57fba5f2689fe6c3bf025dcf043b39c61/uv-0.13.9-py3-none-manylinux_2_28_aarch64.whl",
            "ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375",
        ),
        other => panic!("no pinned uv wheel for {other}"),
    }
}

/// The pinned wheel's file name.
fn pinned_name() -> &'static str {
    pinned_wheel().0.rsplit('/').next().unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A wheel that claims to be uv 0.13.9: its `uv` writes a line to
/// `marker` and runs `real` (a wrapper that runs first). Returns its bytes.
fn wrapper_wheel(real: &Path, marker: &Path) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut buf = std::io::Cursor::new(Vec::new());
    let mut z = zip::ZipWriter::new(&mut buf);
    let exe = SimpleFileOptions::default().unix_permissions(0o755);
    z.start_file("uv-0.13.9.data/scripts/uv", exe).unwrap();
    write!(
        z,
        "#!/bin/sh\necho \"the wrapper ran: $*\" >> '{}'\nexec '{}' \"$@\"\n",
        marker.display(),
        real.display()
    )
    .unwrap();
    z.start_file("uv-0.13.9.dist-info/METADATA", SimpleFileOptions::default())
        .unwrap();
    z.write_all(b"Metadata-Version: 2.1\nName: uv\nVersion: 0.13.9\n")
        .unwrap();
    z.start_file("uv-0.13.9.dist-info/WHEEL", SimpleFileOptions::default())
        .unwrap();
    z.write_all(b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n")
        .unwrap();
    z.finish().unwrap();
    buf.into_inner()
}

/// PATH without any directory holding a `uv`, so only the tools
/// directories can give one.
fn path_without_uv() -> OsString {
    let dirs: Vec<PathBuf> = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .filter(|p| !p.join("uv").exists())
        .collect();
    std::env::join_paths(dirs).unwrap()
}

/// Everything under `dir`, relative (empty for an empty directory).
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            out.push(e.path().strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// The binary as on a fresh machine: `HOME` the empty `home`, no XDG
/// directories, no uv on PATH, no shared tools directory (the store's own
/// `tools/`), and the store `store`.
fn fresh(fx: &Fx, home: &Path, store: &Path, args: &[&str]) -> Output {
    let mut c = fx.cmd_at(store, args);
    c.env("HOME", home)
        .env("PATH", path_without_uv())
        .env_remove("ORACLE_BUILD_TOOLS")
        .env_remove("ORACLE_BUILD_UV")
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("XDG_CACHE_HOME")
        .env_remove("XDG_DATA_HOME")
        .env_remove("XDG_STATE_HOME");
    c.output().expect("oracle-build runs")
}

/// `<store>/config.toml` mapping PyPI's file host to `base`.
fn mirror_pypi_files(store: &Path, base: &str) {
    std::fs::create_dir_all(store).unwrap();
    std::fs::write(
        store.join("config.toml"),
        format!("[[mirror]]\nprefix = \"https://files.pythonhosted.org/\"\nurl = \"{base}\"\n"),
    )
    .unwrap();
}

// Issue 40: uv by hash, not by version.
#[test]
fn a_fresh_box_fetches_the_pinned_uv_by_hash_through_its_mirror_and_leaves_home_untouched() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let home = fx.dir().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let (url, pinned) = pinned_wheel();
    let rel = url.strip_prefix("https://files.pythonhosted.org/").unwrap();
    let served = fx.dir().join("served");
    let at = served.join(rel);
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    let marker = fx.dir().join("wrapper-ran");
    let tampered = wrapper_wheel(Path::new("/bin/false"), &marker);
    std::fs::write(&at, &tampered).unwrap();
    let index = Index::start(&served, "uv-");

    // A tampered wheel served through the mirror: refused naming both
    // hashes, before anything is unpacked; no uv in tools/, HOME untouched.
    let store = fx.dir().join("store-1");
    mirror_pypi_files(&store, &index.base());
    let out = fresh(&fx, &home, &store, &["build", r]);
    let t = text(&out);
    assert_eq!(code(&out), 1, "{t}");
    assert!(
        t.contains(&sha256_hex(&tampered)) && t.contains(pinned),
        "{t}"
    );
    assert!(
        t.contains("refusing it") && t.contains(&index.base()),
        "{t}"
    );
    assert!(
        index
            .wheel_hits()
            .iter()
            .any(|h| h.path == format!("/{rel}")),
        "the wheel was not asked of the mirror: {:?}",
        index.wheel_hits()
    );
    assert!(!store.join("tools/uv-0.13.9").exists(), "{t}");
    assert!(!store.join("store/wheelhouse").join(pinned).exists(), "{t}");
    assert!(!marker.exists(), "the tampered uv ran");
    assert_eq!(tree(&home), Vec::<String>::new(), "HOME was written: {t}");

    // Without the mirror, the first run of a fresh machine fetches the
    // pinned wheel from PyPI by its hash into the wheelhouse, unpacks it
    // into tools/, builds a gateable oracle, and writes nothing in HOME
    // (pip wrote its cache there, and `~/.rustup/settings.toml`).
    std::fs::remove_file(store.join("config.toml")).unwrap();
    let out = fresh(&fx, &home, &store, &["build", r, "--json"]);
    let built = ok(&out);
    assert_eq!(built["verdict"], "gateable", "{built}");
    let wheel_json = read_json(&store.join("tools/uv-0.13.9/wheel.json"));
    assert_eq!(wheel_json["sha256"], pinned, "{wheel_json}");
    let entry = store.join("store/wheelhouse").join(pinned);
    let wheel = std::fs::read(entry.join(pinned_name())).unwrap();
    assert_eq!(sha256_hex(&wheel), pinned);
    let rec = read_json(&PathBuf::from(built["oracle"].as_str().unwrap()).join("oracle.json"));
    assert!(
        strs(&rec["requires"]).contains(&format!("wheelhouse/{pinned}")),
        "{}",
        rec["requires"]
    );
    assert!(
        rec["tools"]["uv"]["path"]
            .as_str()
            .unwrap()
            .starts_with(store.join("tools").to_str().unwrap()),
        "{}",
        rec["tools"]
    );
    assert_eq!(
        tree(&home),
        Vec::<String>::new(),
        "HOME was written: {}",
        text(&out)
    );

    // The genuine wheel through the mirror: another fresh store takes it
    // from there (and nothing from PyPI's file host).
    std::fs::write(&at, &wheel).unwrap();
    let second = fx.dir().join("store-2");
    mirror_pypi_files(&second, &index.base());
    let hits = index.wheel_hits().len();
    let out = fresh(&fx, &home, &second, &["lock", r]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(index.wheel_hits().len(), hits + 1, "{}", text(&out));
    let wheel_json = read_json(&second.join("tools/uv-0.13.9/wheel.json"));
    assert_eq!(wheel_json["sha256"], pinned, "{wheel_json}");
    let artifact = read_json(
        &second
            .join("store/wheelhouse")
            .join(pinned)
            .join("artifact.json"),
    );
    assert_eq!(
        artifact["url"],
        format!("{}{rel}", index.base()),
        "{artifact}"
    );
    assert_eq!(tree(&home), Vec::<String>::new(), "HOME was written");
    assert!(!marker.exists());
}

/// `oracle-build <args> --store <store>` as box C: the registry's
/// credentials, this box's builder name, no uv on PATH, the store's own
/// tools directory.
fn box_c(fx: &Fx, store: &Path, docker: &Path, args: &[&str]) -> Output {
    let mut c = fx.cmd_at(store, args);
    c.env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .env("HOME", fx.dir())
        .env("ORACLE_BUILD_BUILDER", "builder-c@test")
        .env("PATH", path_without_uv())
        .env("DOCKER_CONFIG", docker)
        .env_remove("ORACLE_BUILD_TOOLS")
        .env_remove("ORACLE_BUILD_UV")
        .env_remove("REGISTRY_AUTH_FILE");
    c.output().expect("oracle-build runs")
}

/// What box E, an untrusted pusher with write access to the registry,
/// pushes by hand: a copy of the pin's `inputs` artifact whose `uv` names
/// `wheel` (a wheelhouse artifact it pushes too, laid out as the tool lays
/// one out), its manifest padded until its tag sorts before every other
/// `inputs` tag of the key, so readers take it first. Returns (the
/// wheel's sha256, the new inputs tag).
fn push_inputs_naming_another_uv(port: u16, wheel: &Path) -> (String, String) {
    let script = r#"
import hashlib, json, sys, urllib.request
base, repo, wheel_path = sys.argv[1], sys.argv[2], sys.argv[3]
MT = "application/vnd.oci.image.manifest.v1+json"
def req(method, url, data=None, headers={}):
    if not url.startswith("http"):
        url = base + url
    r = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(r) as resp:
        return resp.read(), resp.headers
def manifest(tag):
    return json.loads(req("GET", f"/v2/{repo}/manifests/{tag}", headers={"Accept": MT})[0])
def blob(d):
    return req("GET", f"/v2/{repo}/blobs/{d}")[0]
def put_blob(data):
    d = "sha256:" + hashlib.sha256(data).hexdigest()
    _, h = req("POST", f"/v2/{repo}/blobs/uploads/", data=b"")
    loc = h["Location"]
    req("PUT", loc + ("&" if "?" in loc else "?") + "digest=" + d, data=data,
        headers={"Content-Type": "application/octet-stream"})
    return d
def put_manifest(m, tag):
    body = json.dumps(m, indent=2).encode()
    req("PUT", f"/v2/{repo}/manifests/{tag}", data=body, headers={"Content-Type": MT})
def mdigest(m):
    return hashlib.sha256(json.dumps(m, indent=2).encode()).hexdigest()
tags = json.loads(req("GET", f"/v2/{repo}/tags/list")[0])["tags"]
inputs_tags = sorted(t for t in tags if t.startswith("inputs-"))
it = inputs_tags[0]
im = manifest(it)
icfg = json.loads(blob(im["config"]["digest"]))
rec = icfg["record"]
old_label = rec["uv"]
old_tag = rec["tags"][old_label]
W = open(wheel_path, "rb").read()
new_sha = hashlib.sha256(W).hexdigest()
# The wheelhouse artifact: the same files, the wheel replaced.
wm = manifest(old_tag)
data = {}
for l in wm["layers"]:
    data[l["annotations"]["org.opencontainers.image.title"]] = blob(l["digest"])
whl = [t for t in data if t.endswith(".whl")][0]
data[whl] = W
art = json.loads(data["artifact.json"])
art["sha256"], art["size"] = new_sha, len(W)
data["artifact.json"] = json.dumps(art, indent=2).encode()
man = json.loads(data["manifest.json"])
for f in man["files"]:
    f["size"], f["sha256"] = len(data[f["path"]]), hashlib.sha256(data[f["path"]]).hexdigest()
data["manifest.json"] = json.dumps(man, indent=2).encode()
wcfg = json.loads(blob(wm["config"]["digest"]))
wcfg["name"], wcfg["record"] = new_sha, art
for f in wcfg["files"]:
    f["size"], f["sha256"] = len(data[f["path"]]), hashlib.sha256(data[f["path"]]).hexdigest()
for l in wm["layers"]:
    b = data[l["annotations"]["org.opencontainers.image.title"]]
    l["digest"], l["size"] = put_blob(b), len(b)
cb = json.dumps(wcfg, indent=2).encode()
wm["config"]["digest"], wm["config"]["size"] = put_blob(cb), len(cb)
wm["annotations"]["dev.oracle-build.name"] = new_sha
new_tag = f"wheelhouse-{new_sha}-{mdigest(wm)[:16]}"
put_manifest(wm, new_tag)
# The inputs record naming it.
new_label = "wheelhouse/" + new_sha
rec["uv"] = new_label
rec["entries"] = [new_label if e == old_label else e for e in rec["entries"]]
del rec["tags"][old_label]
rec["tags"][new_label] = new_tag
cb = json.dumps(icfg, indent=2).encode()
im["config"]["digest"], im["config"]["size"] = put_blob(cb), len(cb)
prefix = it[: len(it) - 16]
for i in range(100000):
    im["annotations"]["dev.oracle-build.pad"] = str(i)
    tag = prefix + mdigest(im)[:16]
    if tag < inputs_tags[0]:
        break
put_manifest(im, tag)
print(new_sha)
print(tag)
"#;
    let out = Command::new("python3")
        .args(["-c", script, &format!("http://127.0.0.1:{port}"), REPO])
        .arg(wheel)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    (
        lines.next().unwrap().to_string(),
        lines.next().unwrap().to_string(),
    )
}

/// Rewrites the bundle `src` into `dst` with its uv wheel replaced by
/// `wheel` (its wheelhouse entry renamed to the new sha256, `artifact.json`,
/// the entry's manifest and the bundle's manifest made to agree), as a box
/// that exports its own bundle could write it. Returns the new sha256.
fn bundle_with_another_uv(src: &Path, dst: &Path, wheel: &Path) -> String {
    let script = r#"
import hashlib, io, json, sys, tarfile
src, dst, wheel_path = sys.argv[1], sys.argv[2], sys.argv[3]
W = open(wheel_path, "rb").read()
new_sha = hashlib.sha256(W).hexdigest()
members = []
with tarfile.open(src, "r:gz") as t:
    for m in t.getmembers():
        members.append((m, t.extractfile(m).read() if m.isfile() else None))
data = {m.name: d for m, d in members}
man = json.loads(data["oracle-bundle.json"])
old = f"store/wheelhouse/{man['uv']['sha256']}/"
new = f"store/wheelhouse/{new_sha}/"
files = {n[len(old):]: d for n, d in data.items() if n.startswith(old)}
whl = [n for n in files if n.endswith(".whl")][0]
files[whl] = W
art = json.loads(files["artifact.json"])
art["sha256"], art["size"] = new_sha, len(W)
files["artifact.json"] = json.dumps(art, indent=2).encode()
em = json.loads(files["manifest.json"])
for f in em["files"]:
    f["size"], f["sha256"] = len(files[f["path"]]), hashlib.sha256(files[f["path"]]).hexdigest()
files["manifest.json"] = json.dumps(em, indent=2).encode()
man["uv"]["sha256"] = new_sha
for f in man["files"]:
    if f["path"].startswith(old):
        rel = f["path"][len(old):]
        f["path"] = new + rel
        f["size"], f["sha256"] = len(files[rel]), hashlib.sha256(files[rel]).hexdigest()
man["files"].sort(key=lambda f: f["path"])
with tarfile.open(dst, "w:gz") as t:
    for m, d in members:
        if m.name == "oracle-bundle.json":
            d = json.dumps(man, indent=2).encode()
        elif m.name.startswith(old):
            d = files[m.name[len(old):]]
            m.name = new + m.name[len(old):]
        elif m.name == old.rstrip("/"):
            m.name = new.rstrip("/")
        if d is not None:
            m.size = len(d)
        t.addfile(m, io.BytesIO(d) if d is not None else None)
print(new_sha)
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .args([src, dst, wheel])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Box E's uv for the test directory of `fx`: a wheel named as the pinned
/// one whose `uv` is a wrapper that writes the returned marker, then runs
/// the real uv. Returns (the wheel, the marker).
fn e_wheel(fx: &Fx) -> (PathBuf, PathBuf) {
    let real = shared_tools().join("uv-0.13.9/bin/uv");
    assert!(real.is_file(), "A's build provisioned the shared uv");
    let marker = fx.dir().join("wrapper-ran");
    let wheel = fx.dir().join(pinned_name());
    std::fs::write(&wheel, wrapper_wheel(&real, &marker)).unwrap();
    (wheel, marker)
}

// Issue 41, item 3: an inputs record from elsewhere never names another uv.
#[test]
fn a_pushed_uv_wheel_the_binary_does_not_pin_is_refused_by_pull_and_never_runs() {
    let reg = Registry::start(None);
    let url = reg.url(REPO);
    let docker = reg.docker_config.clone();
    // Box A (trusted) builds and pushes the pin, signed.
    let (fx, recipe, first, allowed) = built_and_pushed(&url, Some(&docker));
    let r = recipe.to_str().unwrap();
    let (_, pinned) = pinned_wheel();
    let (wheel, marker) = e_wheel(&fx);
    let (evil, evil_tag) = push_inputs_naming_another_uv(reg.port, &wheel);
    assert!(reg.tags(REPO).contains(&evil_tag));

    // Box C trusts only A: `pull` takes E's inputs record (A's signed lock
    // and wheel) but refuses its uv, naming both hashes, and never fetches it.
    let c = fx.dir().join("store-c");
    configure(&c, &url, None, Some(&allowed), 1);
    let out = box_c(&fx, &c, &docker, &["pull", r, "--json"]);
    let pulled = ok(&out);
    assert_eq!(
        pulled["inputs"]["uv"],
        format!("wheelhouse/{evil}"),
        "E's inputs were taken: {pulled}"
    );
    let refused = pulled["refused"].to_string();
    assert!(
        refused.contains(&evil) && refused.contains(pinned) && refused.contains("refusing"),
        "{pulled}"
    );
    assert_eq!(pulled["uv"], Value::Null, "{pulled}");
    assert!(
        !strs(&pulled["added"]).contains(&format!("wheelhouse/{evil}")),
        "{pulled}"
    );
    assert!(!c.join("store/wheelhouse").join(&evil).exists());
    assert!(!c.join("tools/uv-0.13.9").exists(), "{pulled}");
    assert!(!marker.exists(), "E's uv ran on pull");
    // `build --offline` has no uv to run: said, and E's never runs.
    let out = box_c(&fx, &c, &docker, &["build", r, "--offline"]);
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(text(&out).contains("uv not found"), "{}", text(&out));
    assert!(!marker.exists(), "E's uv ran on build --offline");
    // With the pinned uv (the shared tools directory), the rest of what
    // was pulled builds offline.
    let mut cmd = fx.cmd_at(&c, &["build", r, "--offline", "--json"]);
    cmd.env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .env("HOME", fx.dir())
        .env("DOCKER_CONFIG", &docker);
    let built = ok(&cmd.output().unwrap());
    assert_eq!(built["verdict"], "gateable", "{built}");
    assert_eq!(built["key"], first["key"], "{built}");
    assert!(!marker.exists(), "E's uv ran");
}

// Issue 41, item 3, through a bundle: `import` never installs another uv.
#[test]
fn a_bundled_uv_wheel_the_binary_does_not_pin_is_refused_by_import_and_never_runs() {
    let reg = Registry::start(None);
    let url = reg.url(REPO);
    let docker = reg.docker_config.clone();
    let (fx, recipe, _, allowed) = built_and_pushed(&url, Some(&docker));
    let r = recipe.to_str().unwrap();
    let (_, pinned) = pinned_wheel();
    let (wheel, marker) = e_wheel(&fx);
    // A bundle E exports (E's key signs its lock and wheel, which box K
    // does not trust), its uv replaced by E's: `import` refuses the lock,
    // the wheel and the uv, naming both hashes, and installs nothing.
    let a = fx.dir().join("store-a");
    let (e_key, _) = keypair(fx.dir(), "builder-e@test");
    configure(&a, &url, Some(&e_key), None, 1);
    let exported = fx.dir().join("e.tar.gz");
    let out = fx.run_at(&a, &["export", r, "-o", exported.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let bundle = fx.dir().join("e-uv.tar.gz");
    let evil = bundle_with_another_uv(&exported, &bundle, &wheel);
    let k = fx.dir().join("store-k");
    configure(&k, &url, None, Some(&allowed), 1);
    let out = box_c(
        &fx,
        &k,
        &docker,
        &["import", bundle.to_str().unwrap(), "--json"],
    );
    let imported = ok(&out);
    assert!(
        imported["lock_trust"]
            .as_str()
            .unwrap_or_default()
            .starts_with("untrusted"),
        "{imported}"
    );
    // Its wheel is not taken: unsigned by a trusted key, and (its tags
    // unsigned too, kept aside) of another version than this box's history.
    assert!(
        imported["wheel_trust"]
            .as_str()
            .unwrap_or_default()
            .starts_with("untrusted")
            || imported["notes"].to_string().contains("is not taken"),
        "{imported}"
    );
    let notes = imported["notes"].to_string();
    assert!(
        notes.contains(&evil) && notes.contains(pinned) && notes.contains("not installed"),
        "{imported}"
    );
    assert_eq!(imported["uv"], Value::Null, "{imported}");
    assert!(!k.join("store/wheelhouse").join(&evil).exists());
    assert!(!k.join("tools/uv-0.13.9").exists(), "{imported}");
    assert!(!marker.exists(), "E's uv ran on import");
    let out = box_c(&fx, &k, &docker, &["build", r, "--offline"]);
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(text(&out).contains("uv not found"), "{}", text(&out));
    assert!(!marker.exists(), "E's uv ran on build --offline");
    // The bundle as exported (the pinned uv): its uv is installed.
    let honest = fx.dir().join("store-h");
    configure(&honest, &url, None, Some(&allowed), 1);
    let out = box_c(
        &fx,
        &honest,
        &docker,
        &["import", exported.to_str().unwrap(), "--json"],
    );
    let imported = ok(&out);
    assert!(
        imported["uv"]
            .as_str()
            .is_some_and(|p| p.starts_with(honest.join("tools").to_str().unwrap())),
        "{imported}"
    );
    assert_eq!(
        read_json(&honest.join("tools/uv-0.13.9/wheel.json"))["sha256"],
        pinned
    );
}
