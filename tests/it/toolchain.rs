//! The toolchain a recipe declares in `build.env` (`CC`, `CXX`, ...):
//! measured at preflight, recorded in `build.json`, keyed by the measured
//! id and version; a declared compiler that is not there refused (exit 2);
//! a compiler version the tree's CMake refuses reported before the build.

use std::path::{Path, PathBuf};

use crate::support::*;

/// Writes `dir/<name>`: a wrapper that answers `-dumpfullversion` with the
/// text of `dir/version` and otherwise logs its arguments to `dir/<name>.log`
/// and runs `real` (as a site's compiler wrapper would). Returns its path.
fn wrapper(dir: &Path, name: &str, real: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(name);
    let d = dir.display();
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nif [ \"$1\" = -dumpfullversion ]; then cat '{d}/version'; exit 0; fi\necho \"$@\" >> '{d}/{name}.log'\nexec {real} \"$@\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn plan_wheel_key(fx: &Fx, recipe: &Path) -> String {
    let out = fx.run(&["plan", recipe.to_str().unwrap(), "--json"]);
    let v = json(&out);
    v["keys"]["wheel"]
        .as_str()
        .unwrap_or_else(|| panic!("plan knows the wheel key: {v}"))
        .to_string()
}

#[test]
fn declared_cc_and_cxx_are_measured_recorded_and_keyed() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let tc = fx.dir().join("tc");
    let cc = wrapper(&tc, "cc", "gcc");
    let cxx = wrapper(&tc, "c++", "g++");
    std::fs::write(tc.join("version"), "12.3.0\n").unwrap();
    let env = format!(
        "  env:\n    CC: {}\n    CXX: {}\n",
        cc.display(),
        cxx.display()
    );
    let recipe = fx.recipe("fx", &repo, &commit, &format!("{env}{SMOKE}"));
    let built = fx.build_json(fx.store(), &recipe);
    let key = built["keys"]["wheel"].as_str().unwrap().to_string();
    let rec = read_json(
        &fx.store()
            .join("store/wheels")
            .join(&key)
            .join("build.json"),
    );
    let compilers = &rec["tools"]["compilers"];
    for (name, path) in [("cc", &cc), ("cxx", &cxx)] {
        let c = &compilers[name];
        assert_eq!(
            c["path"],
            path.canonicalize().unwrap().to_str().unwrap(),
            "{compilers}"
        );
        assert_eq!(c["id"], "GNU", "{compilers}");
        assert_eq!(c["version"], "12.3.0", "{compilers}");
        assert_eq!(c["declared_by"], "build.env", "{compilers}");
        assert_eq!(
            rec["inputs"]["toolchain"]["compilers"][name]["version"], "12.3.0",
            "{rec}"
        );
    }
    // What CMake will read (the predefined macros): the real g++'s version,
    // recorded beside the wrapper's answer when they differ.
    let real = which_gxx().1;
    let want = if real == "12.3.0" {
        serde_json::Value::Null
    } else {
        real.clone().into()
    };
    assert_eq!(compilers["cxx"]["cmake_version"], want, "{compilers}");
    // The `gcc` of the record is the declared C compiler, not /usr/bin/gcc.
    assert_eq!(rec["tools"]["gcc"]["version"], "12.3.0", "{rec}");
    // The declared C compiler is the one the build ran.
    let log = std::fs::read_to_string(tc.join("cc.log")).unwrap_or_default();
    assert!(
        log.contains("ops.c"),
        "the wheel build did not run CC: {log:?}"
    );
    // plan and build agree on the key.
    assert_eq!(plan_wheel_key(&fx, &recipe), key);

    // One declaration, another measured version: another key.
    std::fs::write(tc.join("version"), "13.1.0\n").unwrap();
    let other = plan_wheel_key(&fx, &recipe);
    assert_ne!(other, key, "a compiler of another version keyed the same");

    // Without the declaration: the compilers on PATH, another key.
    let plain = fx.recipe("fx", &repo, &commit, SMOKE);
    let undeclared = plan_wheel_key(&fx, &plain);
    assert_ne!(undeclared, key);
    assert_ne!(undeclared, other);
    let plan = fx.json(&["plan", plain.to_str().unwrap(), "--json"]);
    let tools = plan["steps"][0]["detail"].as_str().unwrap().to_string();
    assert!(tools.contains("cc: GNU "), "{tools}");
}

#[test]
fn a_declared_cxx_that_does_not_exist_is_refused_naming_build_env_cxx() {
    let fx = Fx::new();
    let (repo, commit) = fx.repo();
    let missing = fx.dir().join("no-such-dir/g++");
    let recipe = fx.recipe(
        "fx",
        &repo,
        &commit,
        &format!("  env:\n    CXX: {}\n{SMOKE}", missing.display()),
    );
    let out = fx.exits(&["build", recipe.to_str().unwrap()], 2);
    let t = text(&out);
    assert!(t.contains("build.env.CXX"), "{t}");
    assert!(t.contains(&missing.display().to_string()), "{t}");
    assert!(
        !fx.store().join("store").exists(),
        "the store was written: {t}"
    );
    // `plan` names the same problem.
    let plan = fx.run(&["plan", recipe.to_str().unwrap(), "--json"]);
    assert!(text(&plan).contains("build.env.CXX"), "{}", text(&plan));
}

#[test]
fn a_compiler_older_than_the_trees_cmake_requirement_is_refused_before_the_wheel_stage() {
    let fx = Fx::new();
    let (repo, _) = fixture_repo_with(fx.dir(), "toolchain");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "a compiler requirement"]);
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let out = fx.exits(&["build", recipe.to_str().unwrap()], 2);
    let t = text(&out);
    assert!(t.contains("cmake/cpu_extension.cmake:9:"), "{t}");
    assert!(t.contains("FX backend requires gcc/g++ >= 99"), "{t}");
    assert!(t.contains("VERSION_GREATER_EQUAL 99"), "{t}");
    // The measured C++ compiler, by path and version.
    let gxx = which_gxx();
    assert!(t.contains(&format!("CXX GNU {}", gxx.1)), "{t}");
    assert!(t.contains(&gxx.0), "{t}");
    // Refused before the wheel stage: no wheel built, none staged.
    let wheels = fx.store().join("store/wheels");
    assert!(
        !wheels.exists() || std::fs::read_dir(&wheels).unwrap().next().is_none(),
        "{t}"
    );
    // `plan` names it as a problem once the checkout exists.
    let plan = fx.run(&["plan", recipe.to_str().unwrap(), "--json"]);
    let problems = json(&plan)["problems"].to_string();
    assert!(
        problems.contains("cmake/cpu_extension.cmake:9:"),
        "{problems}"
    );
}

/// `g++` on PATH: its resolved path and `-dumpfullversion`.
fn which_gxx() -> (String, String) {
    let out = std::process::Command::new("sh")
        .args([
            "-c",
            "readlink -f \"$(command -v g++)\"; g++ -dumpfullversion",
        ])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut l = s.lines();
    (
        l.next().unwrap_or("").to_string(),
        l.next().unwrap_or("").to_string(),
    )
}
