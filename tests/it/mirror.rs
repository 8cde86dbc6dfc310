//! Site mirrors (`[[mirror]]` in the store's `config.toml`, docs/cache.md
//! "Mirrors"): the recipe's repository and a staged CMake source named by
//! URLs that do not exist (`https://git.invalid/...`), reachable only through
//! a `file://` mirror, the CMake source's mirror a partial clone (its
//! submodule's URL mapped by the same table); a package
//! index a requirement file names on a closed port, refused naming the file,
//! the line and the fix, then dropped with `url = "none"`. The keys are
//! those of the declared URLs, and `build.json` records what was fetched.

use std::path::Path;

use crate::real::{Server, make_index};
use crate::support::*;

/// A port on 127.0.0.1 that nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// An upstream repository `kernels` at `dir`: tag `v1` (with the
/// submodule `third-party/inner`, the repository `inner` declared at
/// `https://git.invalid/org/inner.git`), then a second commit (whose blob a
/// partial clone of it lacks). Returns v1's commit.
fn kernels_upstream(dir: &Path, inner: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    std::fs::write(dir.join("kernel.h"), "int kernel(void);\n").unwrap();
    let url = format!("file://{}", inner.display());
    git(
        dir,
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
    git(
        dir,
        &[
            "config",
            "-f",
            ".gitmodules",
            "submodule.third-party/inner.url",
            "https://git.invalid/org/inner.git",
        ],
    );
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "v1"]);
    git(dir, &["tag", "v1"]);
    let v1 = git(dir, &["rev-parse", "HEAD"]);
    std::fs::write(dir.join("kernel.h"), "int kernel(int);\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "v2"]);
    // A partial clone asks the server for a filter.
    git(dir, &["config", "uploadpack.allowFilter", "true"]);
    v1
}

#[test]
fn git_sources_and_indexes_go_through_site_mirrors_and_the_keys_keep_the_declared_urls() {
    let fx = Fx::new();
    let d = fx.dir();
    let (repo, _) = fx.repo();
    let port = closed_port();
    let dead_index = format!("http://127.0.0.1:{port}/simple");
    // The tree: a CMake source declared from a URL that does not exist, and
    // a build requirement file naming an index nobody answers on.
    std::fs::write(
        repo.join("CMakeLists.txt"),
        "cmake_minimum_required(VERSION 3.26)\nproject(fixturellm LANGUAGES C)\ninclude(FetchContent)\nfind_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)\nPython3_add_library(_C MODULE WITH_SOABI csrc/ops.c)\nFetchContent_Declare(\n  kernels\n  GIT_REPOSITORY https://git.invalid/org/kernels.git\n  GIT_TAG v1\n)\nFetchContent_MakeAvailable(kernels)\n",
    )
    .unwrap();
    // cmake and ninja join the build requirements (tests/fixture/cmake).
    let reqs = repo.join("requirements/build/cpu.txt");
    let old = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixture/cmake/requirements/build/cpu.txt"),
    )
    .unwrap();
    std::fs::write(&reqs, format!("--extra-index-url {dead_index}\n{old}")).unwrap();
    git(&repo, &["add", "-A"]);
    git(
        &repo,
        &["commit", "-qm", "a CMake source and an extra index"],
    );
    let commit = git(&repo, &["rev-parse", "HEAD"]);

    // The site's mirrors: the fixture as a bare clone, kernels as a partial
    // clone (no blobs but v1's), its upstream gone.
    let mirrors = d.join("mirrors");
    std::fs::create_dir_all(mirrors.join("org")).unwrap();
    git(
        d,
        &[
            "clone",
            "-q",
            "--bare",
            repo.to_str().unwrap(),
            mirrors.join("org/repo.git").to_str().unwrap(),
        ],
    );
    let inner = d.join("upstream/inner");
    std::fs::create_dir_all(&inner).unwrap();
    git(&inner, &["init", "-q"]);
    std::fs::write(inner.join("inner.txt"), "inner, a submodule\n").unwrap();
    git(&inner, &["add", "-A"]);
    git(&inner, &["commit", "-qm", "inner"]);
    let inner_commit = git(&inner, &["rev-parse", "HEAD"]);
    git(
        d,
        &[
            "clone",
            "-q",
            "--bare",
            inner.to_str().unwrap(),
            mirrors.join("org/inner.git").to_str().unwrap(),
        ],
    );
    let upstream = d.join("upstream/kernels");
    let v1 = kernels_upstream(&upstream, &inner);
    let partial = mirrors.join("org/kernels.git");
    git(
        d,
        &[
            "clone",
            "-q",
            "--bare",
            "--filter=blob:none",
            &format!("file://{}", upstream.display()),
            partial.to_str().unwrap(),
        ],
    );
    // v1's blobs fetched now (lazily, from the upstream), v2's never.
    git(&partial, &["archive", "-o", "/dev/null", "v1"]);
    force_remove(&d.join("upstream"));
    let missing = git(
        &partial,
        &["rev-list", "--objects", "--missing=print", "--all"],
    );
    assert!(
        missing.lines().any(|l| l.starts_with('?')),
        "the kernels mirror is a partial clone missing a blob: {missing}"
    );

    let recipe = d.join("fx.yaml");
    std::fs::write(
        &recipe,
        recipe_text("fx", &repo, &commit, SMOKE).replace(
            &format!("file://{}", repo.display()),
            "https://git.invalid/org/repo.git",
        ),
    )
    .unwrap();
    let config = fx.store().join("config.toml");
    std::fs::create_dir_all(fx.store()).unwrap();
    let git_mirror = format!(
        "[[mirror]]\nprefix = \"https://git.invalid/\"\nurl = \"file://{}/\"\n",
        mirrors.display()
    );
    std::fs::write(&config, &git_mirror).unwrap();
    let r = recipe.to_str().unwrap();

    // The index nobody answers: refused naming the file, the line and the fix.
    let out = fx.run(&["lock", r]);
    assert_ne!(code(&out), 0, "{}", text(&out));
    let want =
        format!("requirements/build/cpu.txt:1 names the package index {dead_index}, unreachable");
    assert!(text(&out).contains(&want), "{want} not in\n{}", text(&out));
    let fix = format!(
        "add [[mirror]] prefix = \"{dead_index}\" url = \"none\" (or a reachable mirror) to {}",
        config.display()
    );
    assert!(text(&out).contains(&fix), "{fix} not in\n{}", text(&out));

    // `none` drops it: the build goes through (source and ext by mirror).
    std::fs::write(
        &config,
        format!("{git_mirror}\n[[mirror]]\nprefix = \"{dead_index}\"\nurl = \"none\"\n"),
    )
    .unwrap();
    let report = fx.build_json(fx.store(), &recipe);
    let keys = report["keys"].clone();
    let wheel = keys["wheel"].as_str().unwrap();
    let record = read_json(
        &fx.store()
            .join("store/wheels")
            .join(wheel)
            .join("build.json"),
    );
    // Keyed by the declared URLs, origins recorded beside them.
    assert_eq!(
        record["inputs"]["ext"][0]["origin"]["git"]["repo"], "https://git.invalid/org/kernels.git",
        "{record}"
    );
    assert_eq!(
        record["origins"]["source"],
        format!("file://{}/org/repo.git", mirrors.display()),
        "{record}"
    );
    assert_eq!(
        record["origins"]["ext"]["kernels"],
        format!("file://{}/org/kernels.git", mirrors.display()),
        "{record}"
    );
    assert_eq!(
        record["inputs"]["ext"][0]["commit"],
        v1.as_str(),
        "{record}"
    );
    let ext = only_entry(&fx.store().join("store/ext"));
    assert!(
        ext.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("kernels-v1-"),
        "{}",
        ext.display()
    );
    assert_eq!(
        std::fs::read_to_string(ext.join("src/kernel.h")).unwrap(),
        "int kernel(void);\n"
    );
    // The submodule, declared at git.invalid, came through the mirror too.
    assert_eq!(
        std::fs::read_to_string(ext.join("src/third-party/inner/inner.txt")).unwrap(),
        "inner, a submodule\n"
    );
    let ext_json = read_json(&ext.join("ext.json"));
    assert_eq!(
        ext_json["submodules"]["third-party/inner"],
        inner_commit.as_str(),
        "{ext_json}"
    );
    assert_eq!(
        ext_json["fetched_from"],
        format!("file://{}/org/kernels.git", mirrors.display())
    );

    // `plan` shows each source with its origin.
    let plan = fx.run(&["plan", r]);
    assert_eq!(code(&plan), 0, "{}", text(&plan));
    let shown = text(&plan);
    for origin in ["org/repo.git", "org/kernels.git"] {
        let line = format!("fetched from file://{}/{origin}", mirrors.display());
        assert!(shown.contains(&line), "{line} not in\n{shown}");
    }

    // Without the git mirrors (git's own URL rewrite reaching the same
    // repositories instead), `plan` computes the same keys: no mirror URL
    // is in any of them. The dead index stays dropped: that is a key input
    // of the store lock (`keys.lock`).
    assert!(keys["lock"].is_string(), "{keys}");
    std::fs::write(
        &config,
        format!("[[mirror]]\nprefix = \"{dead_index}\"\nurl = \"none\"\n"),
    )
    .unwrap();
    let home = d.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let gitconfig = home.join(".gitconfig");
    std::fs::write(
        &gitconfig,
        format!(
            "[url \"file://{}/\"]\n\tinsteadOf = https://git.invalid/\n",
            mirrors.display()
        ),
    )
    .unwrap();
    let plan = fx
        .cmd(&["plan", r, "--json"])
        .env("GIT_CONFIG_GLOBAL", &gitconfig)
        .output()
        .unwrap();
    assert_eq!(plan_exit(&plan), code(&plan), "{}", text(&plan));
    let plan = json(&plan);
    assert_eq!(plan["keys"], keys, "{plan}");
    assert!(
        plan["source_fetched_from"] == "https://git.invalid/org/repo.git",
        "{plan}"
    );

    // A git URL mapped to `none` is refused, naming the source and the entry.
    std::fs::remove_file(&config).unwrap();
    std::fs::write(
        &config,
        "[[mirror]]\nprefix = \"https://git.invalid/org/repo\"\nurl = \"none\"\n",
    )
    .unwrap();
    let out = fx.run(&["fetch", r]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "the recipe's repository https://git.invalid/org/repo.git is dropped by {}: line 2: mirror[0]",
            config.display()
        )),
        "{}",
        text(&out)
    );
}

/// Issue 41, item 5: an index the site drops (`[[mirror]] url = "none"`)
/// changes what a lock can resolve, so it is an input of the store lock's
/// key; an index a mirror serves from another URL, or a `none` for an index
/// the pin never names, leaves the key as it was. The fixture's build
/// requirements name an extra index (served from this test) that holds an
/// `idna` of its own: box A resolves it from there, box D (the index
/// dropped) from PyPI.
#[test]
fn an_index_the_site_drops_is_a_lock_key_input_and_a_mirrored_one_is_not() {
    let fx = Fx::new();
    let d = fx.dir();
    make_index(&d.join("extra"), &["idna==2.0"]);
    let extra = Server::start(&d.join("extra"));
    let (repo, _) = fx.repo();
    let reqs = repo.join("requirements/build/cpu.txt");
    let old = std::fs::read_to_string(&reqs).unwrap();
    std::fs::write(
        &reqs,
        format!("--extra-index-url {}\n{old}idna\n", extra.url),
    )
    .unwrap();
    git(
        &repo,
        &["commit", "-qam", "an extra index for the build set"],
    );
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    // Files of a local index carry no upload time: no cut-off.
    let recipe = fx.recipe(
        "fx",
        &repo,
        &commit,
        &format!("{SMOKE}lock:\n  exclude_newer: none\n"),
    );
    let r = recipe.to_str().unwrap();
    // The same index through another URL of the same server.
    let port = extra
        .url
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let boxes = [
        ("a", String::new()),
        (
            "dropped",
            format!("[[mirror]]\nprefix = \"{}\"\nurl = \"none\"\n", extra.url),
        ),
        (
            "mirrored",
            format!(
                "[[mirror]]\nprefix = \"{}\"\nurl = \"http://localhost:{port}/simple\"\n",
                extra.url
            ),
        ),
        (
            "unrelated",
            "[[mirror]]\nprefix = \"https://download.pytorch.org/whl/cpu\"\nurl = \"none\"\n"
                .into(),
        ),
    ];
    let mut lock_keys = std::collections::BTreeMap::new();
    for (name, config) in &boxes {
        let store = d.join(format!("store-{name}"));
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join("config.toml"), config).unwrap();
        let out = fx.run_at(&store, &["fetch", r]);
        assert_eq!(code(&out), 0, "{name}: {}", text(&out));
        let plan = fx.run_at(&store, &["plan", r, "--json"]);
        let plan = json(&plan);
        let key = plan["keys"]["lock"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: plan names the store lock's key: {plan}"))
            .to_string();
        lock_keys.insert(*name, key);
    }
    assert_ne!(lock_keys["dropped"], lock_keys["a"], "{lock_keys:?}");
    assert_eq!(lock_keys["mirrored"], lock_keys["a"], "{lock_keys:?}");
    assert_eq!(lock_keys["unrelated"], lock_keys["a"], "{lock_keys:?}");

    // Through a registry: A builds and pushes its signed store lock; the
    // box that drops the index, trusting A, does not take it (under the
    // same key it would have installed the dropped index's idna) and
    // resolves its own.
    let reg = crate::registry::Registry::start(None);
    let url = reg.url("team/oracles");
    let (key, line) = keypair(d, "builder-a@test");
    let allowed = d.join("allowed_signers");
    std::fs::write(&allowed, line).unwrap();
    let cache = |signing: bool| {
        let mut t = format!(
            "[[cache]]\nname = \"team\"\nurl = \"{url}\"\ntrusted_signers = \"{}\"\n",
            allowed.display()
        );
        if signing {
            t.push_str(&format!("signing_key = \"{}\"\n", key.display()));
        }
        t
    };
    let build = |name: &str, args: &[&str]| {
        let store = d.join(format!("store-{name}"));
        let out = fx
            .cmd_at(&store, args)
            .env("ORACLE_BUILD_BUILDER", "builder-a@test")
            .env("DOCKER_CONFIG", d.join("no-docker-config"))
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{name} {args:?}: {}", text(&out));
        out
    };
    std::fs::write(d.join("store-a/config.toml"), cache(true)).unwrap();
    build("a", &["build", r]);
    build("a", &["push", r]);
    let dropped = d.join("store-dropped/config.toml");
    let mut config = std::fs::read_to_string(&dropped).unwrap();
    config.push_str(&cache(false));
    std::fs::write(&dropped, config).unwrap();
    let built = json(&build("dropped", &["build", r, "--json"]));
    assert!(
        !built["substituted"].to_string().contains("lock"),
        "the dropping box took A's lock: {built}"
    );
    assert_eq!(
        built["keys"]["lock"],
        lock_keys["dropped"].as_str(),
        "{built}"
    );

    // What each resolves: A takes the extra index's idna, D PyPI's.
    let idna = |name: &str| -> String {
        let store = d.join(format!("store-{name}"));
        let locks = d.join(format!("lockfiles-{name}"));
        let out = fx
            .cmd_at(&store, &["lock", r, "--lockfiles", locks.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{name}: {}", text(&out));
        let lock = std::fs::read_to_string(locks.join("fx/pylock.build.toml")).unwrap();
        let block = lock
            .split("[[packages]]")
            .find(|b| b.lines().any(|l| l == "name = \"idna\""))
            .unwrap_or_else(|| panic!("{name}: idna not locked:\n{lock}"));
        block
            .lines()
            .find_map(|l| l.strip_prefix("version = "))
            .unwrap()
            .trim_matches('"')
            .to_string()
    };
    assert_eq!(idna("a"), "2.0");
    assert_ne!(idna("dropped"), "2.0");
}
