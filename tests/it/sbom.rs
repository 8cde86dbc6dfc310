//! What an oracle is made of and where it came from: `contains` on a
//! fixture history with a merge, `sbom` validated against the CycloneDX 1.6
//! schema (from PyPI's `cyclonedx-python-lib`, installed at test time), and
//! the signed SLSA provenance pushed with the wheel and checked on another
//! store through a registry.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use serde_json::Value;

/// Commits `file` with `text` on the current branch of `repo`; returns the commit.
fn commit_file(repo: &Path, file: &str, text: &str, msg: &str) -> String {
    std::fs::write(repo.join(file), text).unwrap();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", msg]);
    git(repo, &["rev-parse", "HEAD"])
}

#[test]
fn contains_answers_from_the_mirror_with_first_parent_distances_across_a_merge() {
    let fx = Fx::new();
    let (repo, b) = fx.repo();
    // main: b - m (merge of feature f1 - f2, branched at b) - c; other: x from b.
    git(&repo, &["checkout", "-qb", "feature"]);
    let f1 = commit_file(&repo, "F1.md", "f1\n", "f1");
    let f2 = commit_file(&repo, "F2.md", "f2\n", "f2");
    git(&repo, &["checkout", "-q", "main"]);
    git(&repo, &["checkout", "-qb", "other"]);
    let x = commit_file(&repo, "X.md", "x\n", "x, never merged");
    git(&repo, &["checkout", "-q", "main"]);
    git(
        &repo,
        &["merge", "-q", "--no-ff", "-m", "merge feature", "feature"],
    );
    let m = git(&repo, &["rev-parse", "HEAD"]);
    let c = commit_file(&repo, "C.md", "c\n", "c");
    let a = git(&repo, &["rev-parse", &format!("{b}~1")]);
    let recipe = fx.recipe("fx", &repo, &c, SMOKE);
    let pin = recipe.to_str().unwrap();
    fx.exits(&["fetch", pin], 0);

    let ask = |commit: &str, want: i32| -> Value {
        let out = fx.run(&["contains", pin, commit, "--json"]);
        assert_eq!(code(&out), want, "contains {commit}:\n{}", text(&out));
        json(&out)
    };
    // On the first-parent chain: c 0, m 1, b 2, a 3 (a by a 7-digit prefix).
    for (commit, d) in [(&c, 0), (&m, 1), (&b, 2)] {
        let v = ask(commit, 0);
        assert_eq!(v["answer"], "yes", "{v}");
        assert_eq!(v["commit"], commit.as_str(), "{v}");
        assert_eq!(v["first_parent_distance"], d, "{v}");
        assert_eq!(v["on_first_parent"], true, "{v}");
        assert_eq!(v["oracle_commit"], c.as_str(), "{v}");
    }
    let v = ask(&a[..7], 0);
    assert_eq!(
        (&v["commit"], &v["first_parent_distance"]),
        (&Value::from(a.as_str()), &Value::from(3)),
        "{v}"
    );
    // Reached only through the merge's second parent: the merge's distance.
    for f in [&f1, &f2] {
        let v = ask(f, 0);
        assert_eq!(v["answer"], "yes", "{v}");
        assert_eq!(v["on_first_parent"], false, "{v}");
        assert_eq!(v["merged_by"], m.as_str(), "{v}");
        assert_eq!(v["first_parent_distance"], 1, "{v}");
    }
    // On another branch, never merged: no, exit 1.
    let v = ask(&x, 1);
    assert_eq!(v["answer"], "no", "{v}");
    assert_eq!(v["in_mirror"], true, "{v}");
    // Not in the mirror at all, which holds the pin's whole history (it is
    // not shallow): provably no, exit 1 (issue 42, item 10d).
    let absent = "0123456789abcdef0123456789abcdef01234567";
    let v = ask(absent, 1);
    assert_eq!(v["answer"], "no", "{v}");
    assert_eq!(v["in_mirror"], false, "{v}");
    let out = fx.exits(&["contains", pin, absent], 1);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("the mirror holds that whole history"),
        "{}",
        text(&out)
    );
    // A shallow mirror (its history cut at b) cannot tell: unknown, exit 2.
    let mirror = std::path::PathBuf::from(v["mirror"].as_str().unwrap());
    std::fs::write(mirror.join("shallow"), format!("{b}\n")).unwrap();
    let v = ask(absent, 2);
    assert_eq!(v["answer"], "unknown", "{v}");
    std::fs::remove_file(mirror.join("shallow")).unwrap();
    // Text: one line naming the answer.
    let out = fx.exits(&["contains", pin, &f2], 0);
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        line.starts_with("yes: ") && line.contains(&format!("merged by {m}")),
        "{line}"
    );
    // A commit that is not hex is bad input, not an answer.
    let out = fx.exits(&["contains", pin, "not-a-commit"], 2);
    assert!(text(&out).contains("not a commit id"), "{}", text(&out));
}

/// A venv (under the test's directory) holding PyPI's `cyclonedx-python-lib`
/// with its JSON validation extra: the CycloneDX 1.6 schema and its checker.
fn cyclonedx_validator(dir: &Path) -> PathBuf {
    let venv = dir.join("cdx-venv");
    succeeds(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    succeeds(
        Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "cyclonedx-python-lib[json-validation]>=8"])
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    );
    venv.join("bin/python")
}

/// The schema errors of the document at `file` (empty: valid), from
/// `JsonStrictValidator(SchemaVersion.V1_6)`.
fn schema_errors(python: &Path, file: &Path) -> String {
    let out = succeeds(
        Command::new(python)
            .arg("-c")
            .arg(
                "import sys\n\
from cyclonedx.schema import SchemaVersion\n\
from cyclonedx.validation.json import JsonStrictValidator\n\
e = JsonStrictValidator(SchemaVersion.V1_6).validate_str(open(sys.argv[1]).read())\n\
print('' if e is None else str(e)[:3000])\n",
            )
            .arg(file),
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The sha256 of a staged tree as docs/sbom.md defines it, from the entry's manifest.
fn tree_digest(entry: &Path) -> String {
    let m = read_json(&entry.join("manifest.json"));
    let strip = |p: &str| p.strip_prefix("src/").map(str::to_string);
    let files: Vec<Value> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| {
            Some(serde_json::json!([
                strip(f["path"].as_str()?)?,
                f["size"],
                f["sha256"]
            ]))
        })
        .collect();
    let links: Vec<Value> = m["symlinks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| Some(serde_json::json!([strip(l[0].as_str()?)?, l[1]])))
        .collect();
    let text = oracle_build::store::key::canonical_json(
        &serde_json::json!({"files": files, "symlinks": links}),
    );
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// The component of `bom` whose `bom-ref` is `r`.
fn component<'a>(bom: &'a Value, r: &str) -> &'a Value {
    bom["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["bom-ref"] == r)
        .unwrap_or_else(|| panic!("no component {r} in {bom}"))
}

fn prop<'a>(c: &'a Value, name: &str) -> Option<&'a str> {
    c["properties"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == format!("oracle-build:{name}"))?["value"]
        .as_str()
}

/// `oracle-build <args> --store <store>` with no user config and `builder`'s name.
fn ob(fx: &Fx, store: &Path, builder: &str, args: &[&str]) -> std::process::Output {
    fx.cmd_at(store, args)
        .env("XDG_CONFIG_HOME", fx.dir().join("xdg"))
        .env("ORACLE_BUILD_BUILDER", builder)
        .env_remove("ORACLE_BUILD_CACHE")
        .output()
        .expect("oracle-build runs")
}

fn configure(store: &Path, url: &str, key: Option<&Path>, signers: &Path) {
    std::fs::create_dir_all(store).unwrap();
    let mut t = format!(
        "[[cache]]\nname = \"team\"\nurl = \"{url}\"\ntrusted_signers = \"{}\"\n",
        signers.display()
    );
    if let Some(k) = key {
        t.push_str(&format!("signing_key = \"{}\"\n", k.display()));
    }
    std::fs::write(store.join("config.toml"), t).unwrap();
}

#[test]
fn sbom_lists_every_source_and_distribution_and_the_signed_provenance_verifies_on_another_store() {
    let fx = Fx::new();
    let d = fx.dir();
    let reg = crate::registry::Registry::start(None);
    let url = reg.url("team/oracles");
    let (repo, commit) = crate::real::cmake_fixture(d);
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let r = recipe.to_str().unwrap();
    let (key, line) = keypair(d, "builder-a@test");
    let allowed = d.join("allowed_signers");
    std::fs::write(&allowed, line).unwrap();
    let a = d.join("store-a");
    configure(&a, &url, Some(&key), &allowed);
    let out = ob(&fx, &a, "builder-a@test", &["lock", r]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = ob(&fx, &a, "builder-a@test", &["build", r, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let venv = PathBuf::from(json(&out)["oracle"].as_str().unwrap());
    let rec = record(&venv);

    // sbom: valid CycloneDX 1.6, to a file or stdout, the same bytes.
    let file = d.join("bom.json");
    let out = ob(&fx, &a, "x", &["sbom", r, "--out", file.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let out = ob(&fx, &a, "x", &["sbom", venv.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(out.stdout, std::fs::read(&file).unwrap());
    let python = cyclonedx_validator(d);
    assert_eq!(schema_errors(&python, &file), "", "{}", text(&out));
    let bom = read_json(&file);
    assert_eq!(bom["specVersion"], "1.6");
    let oracle = &bom["metadata"]["component"];
    assert_eq!(oracle["version"], rec["key"], "{oracle}");
    assert_eq!(prop(oracle, "commit"), Some(commit.as_str()));

    // The package from the pin: the wheel's sha256, the commit and repository.
    let pkg = component(&bom, "pkg:fixturellm");
    assert_eq!(pkg["hashes"][0]["content"], rec["wheel_sha256"], "{pkg}");
    assert_eq!(pkg["pedigree"]["commits"][0]["uid"], commit.as_str());
    assert_eq!(
        pkg["externalReferences"][0]["url"],
        format!("file://{}", repo.display())
    );
    let exts = pkg["components"].as_array().unwrap();
    assert!(
        exts.iter()
            .any(|c| c["name"].as_str().unwrap().starts_with("_C")
                && c["hashes"][0]["content"].as_str().unwrap().len() == 64),
        "{pkg}"
    );

    // Every staged source, checked against the ext stage's records.
    let staged: Vec<PathBuf> = std::fs::read_dir(a.join("store/ext"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(staged.len(), 4, "{staged:?}");
    let ext_components = bom["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["bom-ref"].as_str().unwrap().starts_with("ext:"))
        .count();
    assert_eq!(ext_components, staged.len(), "{bom}");
    for e in &staged {
        let er = read_json(&e.join("ext.json"));
        let name = er["source"]["name"].as_str().unwrap();
        let c = component(&bom, &format!("ext:{name}"));
        assert_eq!(c["version"], er["source"]["origin"]["git"]["tag"], "{c}");
        assert_eq!(c["pedigree"]["commits"][0]["uid"], er["commit"], "{c}");
        assert_eq!(
            c["externalReferences"][0]["url"],
            er["source"]["origin"]["git"]["repo"]
        );
        assert_eq!(c["hashes"][0]["content"], tree_digest(e).as_str(), "{c}");
        for (path, sub) in er["submodules"].as_object().unwrap() {
            assert_eq!(prop(c, &format!("submodule:{path}")), sub.as_str(), "{c}");
        }
    }

    // Every installed distribution, checked against the runtime lock.
    let lock_text = std::fs::read_to_string(d.join("lockfiles/fx/pylock.runtime.toml")).unwrap();
    let lock: toml::Value = toml::from_str(&lock_text).unwrap();
    let packages = lock["packages"].as_array().unwrap();
    assert!(!packages.is_empty());
    let dists = bom["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["bom-ref"].as_str().unwrap().starts_with("dist:"))
        .count();
    assert_eq!(dists, packages.len(), "{bom}");
    for p in packages {
        let name = p["name"].as_str().unwrap();
        let c = component(&bom, &format!("dist:{name}"));
        assert_eq!(c["version"], p["version"].as_str().unwrap(), "{c}");
        let hashes: Vec<&str> = p["wheels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["hashes"]["sha256"].as_str().unwrap())
            .collect();
        assert!(
            hashes.contains(&c["hashes"][0]["content"].as_str().unwrap()),
            "{c}"
        );
        if let Some(index) = p.get("index").and_then(|i| i.as_str()) {
            assert_eq!(prop(c, "index_url"), Some(index), "{c}");
        }
        assert!(prop(c, "index").is_some(), "{c}");
    }
    // The toolchain of the wheel build.
    let tools = bom["formulation"][0]["components"].as_array().unwrap();
    for t in ["uv", "gcc"] {
        assert!(tools.iter().any(|c| c["name"] == t), "{t}: {bom}");
    }

    // push: the wheel and, beside it, its signed provenance (its own tag);
    // pushing again adds nothing (the statement is deterministic).
    let wheel_key = rec["wheel_key"].as_str().unwrap();
    let prov_tags = |out: &std::process::Output| -> Vec<(String, String)> {
        assert_eq!(code(out), 0, "{}", text(out));
        json(out)[0]["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["tag"].as_str().unwrap().starts_with("provenance-"))
            .map(|x| {
                (
                    x["tag"].as_str().unwrap().to_string(),
                    x["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let first = prov_tags(&ob(&fx, &a, "builder-a@test", &["push", r, "--json"]));
    assert_eq!(first.len(), 1, "{first:?}");
    let (tag, state) = &first[0];
    assert!(
        tag.starts_with(&format!("provenance-{wheel_key}-")),
        "{tag}"
    );
    assert_eq!(state, "pushed");
    let again = prov_tags(&ob(&fx, &a, "builder-a@test", &["push", r, "--json"]));
    assert_eq!(again, vec![(tag.clone(), "present".to_string())]);

    // What a third party reads: an in-toto statement with an SLSA predicate,
    // checked by the real ssh-keygen.
    use oracle_build::cache::provenance;
    let cache_url = oracle_build::cache::config::CacheUrl::parse(&url).unwrap();
    let t = oracle_build::cache::open(&oracle_build::cache::config::Cache::ad_hoc(
        cache_url,
        oracle_build::cache::config::Origin::Flag,
    ))
    .unwrap();
    let signed = provenance::fetch(t.as_ref(), tag, &d.join("fetched")).unwrap();
    let stmt: Value = serde_json::from_str(&signed.statement).unwrap();
    assert_eq!(stmt["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(stmt["predicateType"], "https://slsa.dev/provenance/v1");
    assert_eq!(stmt["subject"][0]["digest"]["sha256"], rec["wheel_sha256"]);
    let def = &stmt["predicate"]["buildDefinition"];
    assert_eq!(def["externalParameters"]["commit"], commit.as_str());
    let deps = def["resolvedDependencies"].as_array().unwrap();
    let dep = |name: &str| {
        deps.iter()
            .find(|x| x["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {def}"))
    };
    assert_eq!(dep("source")["digest"]["gitCommit"], commit.as_str());
    let lock_json = read_json(&d.join("lockfiles/fx/lock.json"));
    assert_eq!(
        dep("pylock.build.toml")["digest"]["sha256"],
        lock_json["files"]["pylock.build.toml"]
    );
    for e in &staged {
        let er = read_json(&e.join("ext.json"));
        let x = dep(&format!("ext:{}", er["source"]["name"].as_str().unwrap()));
        assert_eq!(x["digest"]["gitCommit"], er["commit"], "{x}");
        assert_eq!(x["digest"]["sha256"], tree_digest(e).as_str(), "{x}");
    }
    assert_eq!(
        stmt["predicate"]["runDetails"]["builder"]["id"],
        "urn:oracle-build:builder:builder-a@test"
    );
    let (sf, sg) = (d.join("statement.json"), d.join("statement.sig"));
    std::fs::write(&sf, &signed.statement).unwrap();
    std::fs::write(&sg, &signed.signature).unwrap();
    succeeds(
        Command::new("ssh-keygen")
            .args([
                "-Y",
                "verify",
                "-n",
                "oracle-build",
                "-I",
                "builder-a@test",
                "-f",
            ])
            .arg(&allowed)
            .arg("-s")
            .arg(&sg)
            .stdin(std::fs::File::open(&sf).unwrap()),
    );

    // Store B builds from the registry (the wheel substituted, trusted) and
    // verifies the provenance against its own records.
    let b = d.join("store-b");
    configure(&b, &url, None, &allowed);
    let out = ob(&fx, &b, "builder-b@test", &["build", r, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let built_b = json(&out);
    assert!(
        built_b["substituted"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "wheel"),
        "{built_b}"
    );
    let out = ob(&fx, &b, "x", &["verify", r, "--provenance", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let v = json(&out);
    let rows: Vec<&Value> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["field"].as_str().unwrap().starts_with("provenance"))
        .collect();
    assert!(
        rows.iter().any(|c| c["field"] == "provenance signature"
            && c["ok"] == true
            && c["found"].as_str().unwrap().starts_with("builder-a@test")),
        "{v}"
    );
    let out = ob(&fx, &b, "x", &["cache", "verify"]);
    assert_eq!(code(&out), 0, "{}", text(&out));

    // A forged statement (one staged source's tree digest changed, A's
    // signature kept) in the registry: verify --provenance fails naming the
    // field, and the signature no longer verifies; cache verify fails too.
    let mut forged = stmt.clone();
    let x = forged["predicate"]["buildDefinition"]["resolvedDependencies"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|x| x["name"] == "ext:fxenv")
        .unwrap();
    x["digest"]["sha256"] = Value::from("0".repeat(64));
    let bytes = oracle_build::cache::trust::canonical_bytes(&forged).unwrap();
    let forged = provenance::Signed {
        statement: String::from_utf8(bytes).unwrap(),
        signature: signed.signature.clone(),
    };
    provenance::push(t.as_ref(), wheel_key, &forged, &d.join("forge")).unwrap();
    let out = ob(&fx, &b, "x", &["verify", r, "--provenance", "--json"]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    let v = json(&out);
    let failed: Vec<&Value> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == false)
        .collect();
    let field =
        "provenance predicate.buildDefinition.resolvedDependencies[ext:fxenv].digest.sha256";
    let fxenv = staged
        .iter()
        .find(|e| {
            e.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("fxenv-")
        })
        .unwrap();
    let quoted = |s: &str| format!("\"{s}\"");
    assert!(
        failed.iter().any(|c| c["field"] == field
            && c["found"] == quoted(&"0".repeat(64))
            && c["expected"] == quoted(&tree_digest(fxenv))),
        "{v}"
    );
    assert!(
        failed.iter().any(|c| c["field"] == "provenance signature"
            && c["found"]
                .as_str()
                .unwrap()
                .contains("changed after signing")),
        "{v}"
    );
    let out = ob(&fx, &b, "x", &["verify", r, "--provenance"]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert!(text(&out).contains(field), "{}", text(&out));
    let out = ob(&fx, &b, "x", &["cache", "verify"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        text(&out).contains("provenance FAILED") && text(&out).contains("changed after signing"),
        "{}",
        text(&out)
    );
}

/// Every `bom-ref` of `c` and of the components inside it.
fn refs_of(c: &Value, out: &mut Vec<String>) {
    if let Some(r) = c["bom-ref"].as_str() {
        out.push(r.to_string());
    }
    for inner in c["components"].as_array().into_iter().flatten() {
        refs_of(inner, out);
    }
}

/// A name declared twice under a condition the tree computes (vLLM's oneDNN
/// under `ASIMD_FOUND`; issue 39, "Declarations the configure did not take"):
/// the SBOM stays valid CycloneDX 1.6 with unique `bom-ref`s and each ref
/// once in `dependencies`; the declaration the configure took is `ext:<name>`,
/// the other is marked `taken=false` and is no part; neither, nor `plan`,
/// claims `FETCHCONTENT_SOURCE_DIR_<NAME>` (the dependency provider was used).
#[test]
fn sbom_of_a_name_declared_twice_under_a_computed_condition_has_unique_refs_and_marks_the_untaken()
{
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, _) = crate::real::cmake_fixture(d);
    let plain = d.join("ext/fxplain");
    std::fs::write(plain.join("fixture-ext.txt"), "fxplain v2.0\n").unwrap();
    git(&plain, &["commit", "-qam", "v2"]);
    git(&plain, &["tag", "v2.0"]);
    let url = format!("file://{}", plain.display());
    std::fs::write(
        repo.join("cmake/external_projects/fxplain.cmake"),
        format!(
            "function(fx_find_isa out)\n  set(${{out}} OFF PARENT_SCOPE)\nendfunction()\nfx_find_isa(FX_ISA_FOUND)\nif(FX_ISA_FOUND)\n  FetchContent_Declare(fxplain GIT_REPOSITORY {url} GIT_TAG v1.0)\nelse()\n  FetchContent_Declare(fxplain GIT_REPOSITORY {url} GIT_TAG v2.0)\nendif()\nFetchContent_MakeAvailable(fxplain)\n"
        ),
    )
    .unwrap();
    git(
        &repo,
        &["commit", "-qam", "fxplain by a computed condition"],
    );
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let recipe = fx.recipe("fx", &repo, &commit, SMOKE);
    let r = recipe.to_str().unwrap();
    fx.exits(&["lock", r], 0);
    fx.exits(&["build", r], 0);

    let file = d.join("bom.json");
    fx.exits(&["sbom", r, "--out", file.to_str().unwrap()], 0);
    let python = cyclonedx_validator(d);
    assert_eq!(schema_errors(&python, &file), "");
    let bom = read_json(&file);

    // Unique references, the oracle's and every nested one included.
    let mut refs = Vec::new();
    refs_of(&bom["metadata"]["component"], &mut refs);
    for c in bom["components"].as_array().unwrap() {
        refs_of(c, &mut refs);
    }
    let mut unique = refs.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), refs.len(), "duplicate bom-refs: {refs:?}");
    // Each ref depends once, on refs that exist, each named once.
    let deps = bom["dependencies"].as_array().unwrap();
    let mut dep_refs: Vec<&str> = deps.iter().map(|x| x["ref"].as_str().unwrap()).collect();
    let n = dep_refs.len();
    dep_refs.sort();
    dep_refs.dedup();
    assert_eq!(dep_refs.len(), n, "{deps:?}");
    for x in deps {
        let on: Vec<&str> = x["dependsOn"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let mut u = on.clone();
        u.sort();
        u.dedup();
        assert_eq!(u.len(), on.len(), "{x}");
        assert!(on.iter().all(|o| refs.iter().any(|r| r == o)), "{x}");
    }

    // The taken declaration (the else branch, v2.0) is the component.
    let plains: Vec<&Value> = bom["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "fxplain")
        .collect();
    assert_eq!(plains.len(), 2, "{plains:?}");
    let taken = component(&bom, "ext:fxplain");
    assert_eq!(taken["version"], "v2.0", "{taken}");
    assert_eq!(prop(taken, "taken"), Some("true"), "{taken}");
    assert_eq!(
        prop(taken, "declared"),
        Some("cmake/external_projects/fxplain.cmake:8"),
        "{taken}"
    );
    let untaken = plains.iter().find(|c| c["version"] == "v1.0").unwrap();
    assert_ne!(untaken["bom-ref"], "ext:fxplain");
    assert_eq!(prop(untaken, "taken"), Some("false"), "{untaken}");
    let pkg_deps = deps.iter().find(|x| x["ref"] == "pkg:fixturellm").unwrap();
    assert!(
        pkg_deps["dependsOn"]
            .as_array()
            .unwrap()
            .contains(&Value::from("ext:fxplain")),
        "{pkg_deps}"
    );
    assert!(
        !pkg_deps["dependsOn"]
            .as_array()
            .unwrap()
            .contains(&untaken["bom-ref"]),
        "{pkg_deps}"
    );
    let text_of_bom = std::fs::read_to_string(&file).unwrap();
    assert!(
        !text_of_bom.contains("FETCHCONTENT_SOURCE_DIR_FXPLAIN"),
        "{text_of_bom}"
    );

    // plan does not claim the variable either.
    let plan = fx.run(&["plan", r, "--json"]);
    assert_eq!(plan_exit(&plan), 0, "{}", text(&plan));
    let rows: Vec<Value> = json(&plan)["ext_sources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["name"] == "fxplain")
        .cloned()
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        let v = row["variable"].as_str().unwrap();
        assert!(v.starts_with("the dependency provider ("), "{row}");
    }
}
