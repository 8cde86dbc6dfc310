//! Where users wait, proven without timings: the compiler cache (in the
//! store) serves a rebuild after the wheel and venv entries are wiped; the
//! no-op's quick check still finds a replaced or deleted file of an oracle.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use serde_json::Value;

/// Translation units the C/C++-heavy fixture adds to `fixturellm._C`.
pub const TUS: usize = 48;

/// The fixture with the C/C++-heavy CMake overlay (tests/fixture/cmake-heavy)
/// and `TUS` generated C++ translation units in `csrc/gen/`, committed.
pub fn heavy_fixture(dir: &Path) -> (PathBuf, String) {
    let (repo, _) = fixture_repo_with(dir, "cmake-heavy");
    let gen_dir = repo.join("csrc/gen");
    std::fs::create_dir_all(&gen_dir).unwrap();
    for i in 0..TUS {
        std::fs::write(
            gen_dir.join(format!("k{i:02}.cpp")),
            format!(
                "#include <array>\n#include <numeric>\n\
                 template <int N> struct K{i} {{ static int run(int x) {{ std::array<int, N> a{{}}; a.fill(x); return std::accumulate(a.begin(), a.end(), {i}); }} }};\n\
                 extern \"C\" int fx_gen_{i}(int x) {{ return K{i}<{}>::run(x); }}\n",
                i + 1
            ),
        )
        .unwrap();
    }
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "a C/C++-heavy CMake build"]);
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    (repo, commit)
}

/// `build.json` of the store's only wheel entry.
pub fn wheel_record(store: &Path) -> Value {
    read_json(&only_entry(&store.join("store/wheels")).join("build.json"))
}

#[test]
fn a_rebuild_after_wiping_the_wheel_and_venv_is_served_by_the_compiler_cache() {
    assert!(
        which::which("ccache").is_ok(),
        "ccache is not on PATH (.ci/run installs it): this test proves the compiler cache"
    );
    let fx = Fx::new();
    let (repo, commit) = heavy_fixture(fx.dir());
    let recipe = fx.recipe("fx", &repo, &commit, "");
    let r = recipe.to_str().unwrap();
    let first = fx.exits(&["build", r, "--no-smoke", "--json"], 4);
    let first = json(&first);
    let rec = wheel_record(fx.store());
    assert_eq!(
        rec["compiler_cache"]["path"],
        which::which("ccache").unwrap().display().to_string()
    );
    let cold = &rec["compiler_cache_stats"];
    // The first build fills the cache: every translation unit compiled (CMake's
    // own compiler checks may add calls of their own, all misses too).
    assert!(cold["misses"].as_u64().unwrap() > TUS as u64, "{cold}");
    assert_eq!(cold["hits"], 0, "{cold}");
    assert!(fx.store().join("ccache").is_dir());

    // Wipe the wheel and the venv entries; the compiler cache stays.
    for b in ["venvs", "wheels"] {
        for e in std::fs::read_dir(fx.store().join("store").join(b)).unwrap() {
            force_remove(&e.unwrap().path());
        }
    }
    let again = fx.exits(&["build", r, "--no-smoke", "--json"], 4);
    let again = json(&again);
    assert_eq!(again["key"], first["key"]);
    assert!(
        again["built"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b == "wheel"),
        "{again}"
    );
    let warm = wheel_record(fx.store())["compiler_cache_stats"].clone();
    // Every translation unit (ops.c and the generated ones) is a hit: the
    // work directory and the command lines are the same for the same key.
    assert!(warm["hits"].as_u64().unwrap() > TUS as u64, "{warm}");
    assert_eq!(warm["misses"], 0, "{warm}");

    // The rebuilt extension works.
    let oracle = PathBuf::from(again["oracle"].as_str().unwrap());
    let out = Command::new(oracle.join("bin/python"))
        .args(["-c", "import fixturellm._C"])
        .current_dir("/")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

/// Makes the directory `dir` of a read-only entry writable, runs `f`, and
/// makes it read-only again (as the store left it).
fn in_writable(dir: &Path, f: impl FnOnce()) {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).unwrap().permissions().mode();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o200)).unwrap();
    f();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_replaced_or_deleted_file_of_an_oracle_is_found_by_verify_and_by_the_next_build() {
    let fx = Fx::new();
    let (_, _, recipe) = fx.pin();
    let r = recipe.to_str().unwrap();
    let venv = PathBuf::from(fx.json(&["build", r, "--json"])["oracle"].as_str().unwrap());
    let noop = fx.json(&["build", r, "--json"]);
    assert_eq!(noop["built"], serde_json::json!([]), "{noop}");

    // Replaced the way an editor saves (a new file renamed over it): the
    // same size, one byte different, its mtime restored.
    let rel = "lib/python3.11/site-packages/fixturellm/outputs.py";
    let file = venv.join(rel);
    let original = std::fs::read(&file).unwrap();
    let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
    let mut changed = original.clone();
    let at = changed.iter().position(|&b| b == b'a').unwrap();
    changed[at] = b'b';
    let parent = file.parent().unwrap().to_path_buf();
    in_writable(&parent, || {
        let tmp = parent.join(".outputs.py.new");
        std::fs::write(&tmp, &changed).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&tmp)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    });
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        original.len() as u64
    );
    assert_eq!(std::fs::metadata(&file).unwrap().modified().unwrap(), mtime);

    for extra in [&[][..], &["--deep"][..]] {
        let v = fx.run(&[&["verify", r][..], extra].concat());
        assert_eq!(
            code(&v),
            3,
            "verify {extra:?} finds the replaced file: {}",
            text(&v)
        );
        assert!(
            text(&v).contains(&format!("changed content: {rel}")),
            "{}",
            text(&v)
        );
    }
    let again = fx.run(&["build", r, "--json"]);
    assert_eq!(code(&again), 0, "{}", text(&again));
    assert!(
        text(&again).contains(&format!("is damaged (changed content: {rel}")),
        "{}",
        text(&again)
    );
    assert!(
        json(&again)["built"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b == "venv")
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        original,
        "the rebuilt oracle is intact"
    );

    // Deleted.
    let rel = "lib/python3.11/site-packages/fixturellm/sampling_params.py";
    let file = venv.join(rel);
    in_writable(file.parent().unwrap(), || {
        std::fs::remove_file(&file).unwrap()
    });
    let v = fx.run(&["verify", r]);
    assert_eq!(code(&v), 3, "{}", text(&v));
    assert!(
        text(&v).contains(&format!("missing: {rel}")),
        "{}",
        text(&v)
    );
    let again = fx.run(&["build", r, "--json"]);
    assert_eq!(code(&again), 0, "{}", text(&again));
    assert!(
        text(&again).contains(&format!("is damaged (missing: {rel}")),
        "{}",
        text(&again)
    );
    assert!(file.is_file(), "the rebuilt oracle has the file again");
    let noop = fx.json(&["build", r, "--json"]);
    assert_eq!(noop["built"], serde_json::json!([]), "intact again: {noop}");
}
