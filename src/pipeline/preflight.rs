//! Preflight: find every tool and check every precondition before any work,
//! so a build that cannot succeed stops at once and names *everything* missing.

use anyhow::{Result, anyhow};

use crate::host::compilers::{self, Compilers};
use crate::host::python_headers;
use crate::host::rust::{self, RustToolchain};
use crate::host::toolchain::{self, Python, Tool, Toolchain};
use crate::progress;
use crate::recipe::LoadedRecipe;
use crate::stages::rust::TreeRust;
use crate::stages::source;
use crate::store::Store;

/// What the preflight found: the toolchain if complete, and every problem.
#[derive(Debug, Clone)]
pub struct Findings {
    /// The recipe's Python, if found.
    pub python: Option<Python>,
    /// uv, if found (not provisioned yet).
    pub uv: Option<Tool>,
    /// nvcc, if found (the declared one when `build.env` declares it).
    pub nvcc: Option<Tool>,
    /// git, if found on PATH.
    pub git: Option<Tool>,
    /// The compilers the build will use, measured (`None`: a declared one
    /// failed; see `compiler_problems`).
    pub compilers: Option<Compilers>,
    /// Each declared compiler or CUDA toolkit that does not exist or does
    /// not run, naming `build.env.<VAR>` and its value (bad input, exit 2).
    pub compiler_problems: Vec<String>,
    /// Whether the mirror already holds the commit.
    pub source_mirrored: bool,
    /// Every reason the build cannot proceed, one line each.
    pub problems: Vec<String>,
}

/// Checks, without changing anything: the recipe's Python (and its
/// `Python.h` when `build.mode` is `source`), uv (found or installable), nvcc and a GPU for `cuda` builds with `cuda_arch_list: auto`,
/// and the repository (mirrored, or reachable unless `offline`).
pub fn inspect(store: &Store, lr: &LoadedRecipe, offline: bool) -> Findings {
    let r = &lr.recipe;
    let mut problems = Vec::new();
    // Three groups of probes at once (each runs a few tools): uv and Python;
    // the compilers; nvcc and git.
    let ((uv, python, headers), (compilers, nvcc), git) = std::thread::scope(|s| {
        let interpreters = s.spawn(|| {
            let uv = toolchain::find_uv(store).ok();
            let python = toolchain::find_python(&r.python, uv.as_ref());
            // A build from source compiles against the Python's headers.
            let headers = match (&python, r.build.mode) {
                (Ok(p), crate::recipe::BuildMode::Source) => python_headers::problem(p),
                _ => None,
            };
            (uv, python, headers)
        });
        let builders = s.spawn(|| {
            let compilers = compilers::measure(&r.build.env, true);
            // The declared nvcc, else the one found as before.
            let declared = compilers
                .as_ref()
                .ok()
                .and_then(|c| c.cuda.as_ref())
                .filter(|k| k.declared_by == compilers::DeclaredBy::BuildEnv)
                .and_then(|k| k.nvcc.as_ref())
                .map(|n| Tool {
                    path: n.path.clone(),
                    version: n.version.clone(),
                });
            let nvcc = declared.or_else(toolchain::find_nvcc);
            (compilers, nvcc)
        });
        let git = toolchain::find_git();
        // A probe's panic is the run's, as it would be without the threads.
        (
            interpreters
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p)),
            builders
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p)),
            git,
        )
    });
    let python = match python {
        Ok(p) => Some(p),
        Err(e) => {
            problems.push(e);
            None
        }
    };
    problems.extend(headers);
    if uv.is_none() && offline {
        problems.push(format!(
            "uv not found on PATH or in {}, and --offline cannot download the pinned uv's wheel: put uv on PATH, set ORACLE_BUILD_UV=/path/to/uv, `pull` or `import` a pin (they install the uv they carry), or copy a provisioned tools directory (`<root>/tools/` of an online store) and set ORACLE_BUILD_TOOLS to it",
            toolchain::tools_dir(store).display(),
        ));
    }
    let (compilers, compiler_problems) = match compilers {
        Ok(c) => (Some(c), Vec::new()),
        Err(p) => (None, p),
    };
    if r.build.device() == crate::recipe::TargetDevice::Cuda {
        if nvcc.is_none() && compiler_problems.is_empty() {
            problems.push("no nvcc: target_device cuda needs the CUDA toolkit (set CUDA_HOME or put nvcc on PATH)".into());
        }
        if r.build.cuda_arch_list == "auto" && toolchain::gpus().is_empty() {
            problems.push("no GPU visible to nvidia-smi, so cuda_arch_list: auto cannot be resolved (set build.cuda_arch_list)".into());
        }
    }
    let source_mirrored = source::mirror_has(store, &r.source.repo, &r.source.commit);
    if !source_mirrored {
        if offline {
            problems.push(format!(
                "--offline: commit {} of {} is not in the store's mirror",
                r.source.commit, r.source.repo
            ));
        } else if let Err(e) = source::origin_url(store, &r.source.repo)
            .and_then(|from| source::check_reachable(store, &from))
        {
            problems.push(format!("{e:#}"));
        }
    }
    Findings {
        python,
        uv,
        nvcc,
        git,
        compilers,
        compiler_problems,
        source_mirrored,
        problems,
    }
}

/// Runs [`inspect`] and, when nothing is missing, creates the store's
/// directories and completes the toolchain (provisioning uv if needed).
///
/// Errors (exit 1): any problem; the message lists them all. Exit 2: a bad
/// `ORACLE_BUILD_DOWNLOADS` ([`crate::host::http::downloads`]).
pub fn toolchain(store: &Store, lr: &LoadedRecipe, offline: bool) -> Result<Toolchain> {
    toolchain_of(store, lr, inspect(store, lr, offline))
}

/// [`toolchain`] from the findings `f` of an [`inspect`] already made (a
/// build runs it beside its other checks).
///
/// Errors: as [`toolchain`].
pub fn toolchain_of(store: &Store, lr: &LoadedRecipe, f: Findings) -> Result<Toolchain> {
    // A bad ORACLE_BUILD_DOWNLOADS is bad input (exit 2): refused before anything is written.
    crate::host::http::downloads()?;
    if !f.compiler_problems.is_empty() {
        // A declared compiler that is not there is bad input: exit 2.
        return Err(crate::exit::bad_input(format!(
            "cannot build {}: a compiler the recipe declares in build.env is not usable:\n  - {}\n(nothing was written to {})",
            lr.recipe.name,
            f.compiler_problems.join("\n  - "),
            store.root().display()
        )));
    }
    if !f.problems.is_empty() {
        return Err(anyhow!(
            "cannot build {}:\n  - {}\n(nothing was written to {})",
            lr.recipe.name,
            f.problems.join("\n  - "),
            store.root().display()
        ));
    }
    store.init()?;
    let python = f.python.ok_or_else(|| anyhow!("python vanished"))?;
    let uv = match f.uv {
        Some(uv) => uv,
        None => crate::stages::installer::find_or_provision_uv(store)?,
    };
    let compilers = f.compilers.unwrap_or_default();
    let tc = Toolchain {
        python,
        uv,
        git: f.git,
        libgit2: toolchain::libgit2_version(),
        gcc: gcc_of(&compilers),
        nvcc: f.nvcc,
        compilers,
        rust: None,
    };
    progress::stage(
        "toolchain",
        format!(
            "python {} ({}), {}",
            tc.python.version,
            tc.python.path.display(),
            tc.uv.version
        ),
    );
    let show = |name: &str, c: &Option<compilers::Compiler>| {
        c.as_ref().map(|c| {
            format!(
                "{name} {} {} ({}, {})",
                c.id,
                c.version,
                c.path.display(),
                serde_json::to_value(c.declared_by)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            )
        })
    };
    let shown: Vec<String> = [
        show("cc", &tc.compilers.cc),
        show("cxx", &tc.compilers.cxx),
        show(
            "nvcc",
            &tc.compilers.cuda.as_ref().and_then(|k| k.nvcc.clone()),
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !shown.is_empty() {
        progress::stage("toolchain", shown.join("; "));
    }
    Ok(tc)
}

/// The `gcc` of the record: the measured C compiler when it is GNU's, else
/// `gcc` on PATH (as before).
pub fn gcc_of(c: &Compilers) -> Option<Tool> {
    match &c.cc {
        Some(cc) if cc.id == "GNU" => Some(Tool {
            path: cc.path.clone(),
            version: cc.version.clone(),
        }),
        _ => toolchain::find_gcc(),
    }
}

/// The tree's compiler requirements ([`crate::stages::ext::requirement`])
/// for the checkout at `src` with the measured `compilers`: (those the
/// compilers fail, each one line naming the file:line, the message, the
/// requirement and the compiler; those the tree decides at configure time).
/// Nothing for a target whose build runs no CMake.
pub fn tree_requirements(
    lr: &LoadedRecipe,
    src: &std::path::Path,
    compilers: &Compilers,
) -> (Vec<String>, Vec<String>) {
    use crate::stages::ext::{condition::Truth, requirement, runs_cmake};
    let device = &lr.recipe.build.target_device;
    if !runs_cmake(device) {
        return (Vec::new(), Vec::new());
    }
    let (mut refused, mut unknown) = (Vec::new(), Vec::new());
    for r in requirement::check_tree(src, device, compilers) {
        if r.truth == Truth::True {
            refused.push(r.describe());
        } else {
            unknown.push(r.describe());
        }
    }
    (refused, unknown)
}

/// [`tree_requirements`] as the build applies them, after the checkout and
/// before the wheel stage: a requirement the compilers fail is bad input
/// (exit 2; the tree's CMake would stop there after the build had started),
/// one the tree decides at configure time a warning.
pub fn check_tree_requirements(
    lr: &LoadedRecipe,
    src: &std::path::Path,
    compilers: &Compilers,
) -> Result<()> {
    let (refused, unknown) = tree_requirements(lr, src, compilers);
    for w in &unknown {
        progress::stage(
            "toolchain",
            format!("warning: the tree may refuse this compiler: {w}"),
        );
    }
    if !refused.is_empty() {
        return Err(crate::exit::bad_input(format!(
            "cannot build {}: the tree's CMake refuses the compiler this build uses (nothing was compiled):\n  - {}\ndeclare a compiler that meets it in the recipe's build.env (CC, CXX)",
            lr.recipe.name,
            refused.join("\n  - ")
        )));
    }
    Ok(())
}

/// Each of the recipe's `expect.kernel_families` that no `message()` of the
/// checkout at `src` can report (the tree's CMake files read as
/// [`crate::stages::wheel::families::known_names`] reads them), one line
/// each, naming the field, its line and the families the tree can report;
/// empty when every name can be reported (or a message names its family
/// through a variable, so any may be).
pub fn unknown_families(lr: &LoadedRecipe, src: &std::path::Path) -> Vec<String> {
    let expected = &lr.recipe.expect.kernel_families;
    if expected.is_empty() {
        return Vec::new();
    }
    let messages = crate::stages::ext::messages::in_tree(src);
    let (names, any) = crate::stages::wheel::families::known_names(&messages);
    if any {
        return Vec::new();
    }
    expected
        .iter()
        .enumerate()
        .filter(|(_, e)| !names.contains(e))
        .map(|(i, e)| {
            let field = format!("expect.kernel_families[{i}]");
            let line = crate::recipe::locate(&lr.text, &field)
                .map_or(String::new(), |l| format!("line {l}: "));
            format!(
                "{}: {line}field `{field}`: {e:?} is no kernel family the tree's CMake files report ({})",
                lr.origin,
                if names.is_empty() {
                    "they report none".to_string()
                } else {
                    format!("they report: {}", names.join(", "))
                }
            )
        })
        .collect()
}

/// [`unknown_families`] as the build applies them, after the checkout and
/// before the wheel stage: a name the tree cannot report is bad input
/// (exit 2; a typo would otherwise fail only after the wheel is built).
pub fn check_expected_families_known(lr: &LoadedRecipe, src: &std::path::Path) -> Result<()> {
    let unknown = unknown_families(lr, src);
    if unknown.is_empty() {
        return Ok(());
    }
    Err(crate::exit::bad_input(unknown.join("\n")))
}

/// The Rust of the tree at `src` and the toolchain that builds it
/// (`None` when its build needs no Rust, [`crate::stages::rust`]):
/// measured and held against the channels its toolchain files declare
/// ([`crate::host::rust::measure`]), each problem one line.
pub fn tree_rust(
    lr: &LoadedRecipe,
    src: &std::path::Path,
) -> Result<Option<(TreeRust, std::result::Result<RustToolchain, rust::Problem>)>> {
    let Some(tree) = crate::stages::rust::discover_in_tree(src, &lr.recipe.build.target_device)?
    else {
        return Ok(None);
    };
    let measured = rust::measure(&tree.toolchain_files);
    Ok(Some((tree, measured)))
}

/// [`tree_rust`] as the build applies it, after the checkout and before
/// the lock and the wheel stage: a declared channel no installed toolchain
/// satisfies is bad input (exit 2, naming the file and both versions:
/// rustup would stop the build there, or setuptools-rust skip an optional
/// extension); no rustc or cargo is a failure (exit 1). Says which
/// toolchain builds the tree.
pub fn check_tree_rust(
    lr: &LoadedRecipe,
    src: &std::path::Path,
) -> Result<Option<(TreeRust, RustToolchain)>> {
    let Some((tree, measured)) = tree_rust(lr, src)? else {
        return Ok(None);
    };
    let name = &lr.recipe.name;
    match measured {
        Ok(tc) => {
            let declared: Vec<String> = tree
                .toolchain_files
                .iter()
                .filter_map(|d| Some(format!("{} channel {}", d.file, d.channel.as_deref()?)))
                .collect();
            progress::stage(
                "toolchain",
                format!(
                    "{}, {} ({}){}",
                    tc.describe(),
                    tc.cargo.version,
                    tree.needs.join("; "),
                    if declared.is_empty() {
                        String::new()
                    } else {
                        format!(", for {}", declared.join(", "))
                    }
                ),
            );
            Ok(Some((tree, tc)))
        }
        Err(rust::Problem::Mismatch(why)) => Err(crate::exit::bad_input(format!(
            "cannot build {name}: the tree's Rust toolchain is not on this machine (nothing was compiled): {why}"
        ))),
        Err(rust::Problem::Missing(why)) => Err(anyhow!(
            "cannot build {name}: {why} (the tree needs Rust: {})",
            tree.needs.join("; ")
        )),
    }
}

/// What stops a build that would gate, before any work (issue 43): each
/// case whose model path refers to an unset `${VAR}` (the built-in recipe's
/// `${ORACLE_MODELS}`), names a directory that does not exist, or a link
/// that does not resolve (dangling, a loop). One line each, naming the
/// case, the path as written and the fix.
pub fn gate_blockers(lr: &LoadedRecipe) -> Vec<String> {
    use crate::stages::smoke::model::Presence;
    let mut out = Vec::new();
    for c in &lr.recipe.smoke.cases {
        match crate::recipe::expand_env(&c.model) {
            Err(e) => out.push(format!(
                "smoke case {}: model {}: {e}; the gate could not run after the build: set it (or build with --no-smoke)",
                c.name, c.model
            )),
            Ok(m) => {
                let from = if m == c.model {
                    String::new()
                } else {
                    format!(" (from {})", c.model)
                };
                match crate::stages::smoke::model::presence(std::path::Path::new(&m)) {
                    Presence::Present => {}
                    Presence::Absent => out.push(format!(
                        "smoke case {}: model directory {m} does not exist{from}; the gate could not run after the build: download the model there (or build with --no-smoke)",
                        c.name
                    )),
                    Presence::Unresolvable(why) => out.push(format!(
                        "smoke case {}: model path {m}{from} {why}; the gate would fail after the build: fix or remove the link (or build with --no-smoke)",
                        c.name
                    )),
                }
            }
        }
    }
    out
}

/// The recipe's package indexes (`indexes`, through the site's
/// `[[mirror]]`) that do not answer ([`crate::host::http::unreachable`]):
/// one line each, naming the index, the URL asked and why. An index a
/// mirror drops (`url = "none"`) is not asked. Nothing is asked when the
/// mirrors do not load (the build reports that itself).
pub fn index_blockers(store: &Store, lr: &LoadedRecipe) -> Vec<String> {
    let Ok(mirrors) = crate::host::mirror::load(store.root()) else {
        return Vec::new();
    };
    let mut asked = Vec::new();
    let mut out = Vec::new();
    for index in lr.recipe.indexes.iter().map(|i| i.url()) {
        match mirrors.map(index) {
            // Dropped on purpose by the site: not asked.
            crate::host::mirror::Mapped::Dropped(_) => {}
            mapped => {
                if let Some(url) = mapped.url() {
                    asked.push((index.to_string(), url.to_string()));
                }
            }
        }
    }
    let urls: Vec<String> = asked.iter().map(|(_, u)| u.clone()).collect();
    let Ok(dead) = crate::host::http::unreachable(&urls) else {
        return out;
    };
    for (url, why) in dead {
        let index = asked
            .iter()
            .find(|(_, u)| *u == url)
            .map_or(url.clone(), |(i, _)| i.clone());
        let through = if index == url {
            String::new()
        } else {
            format!(" (asked at {url}, its [[mirror]])")
        };
        out.push(format!(
            "package index {index}{through} does not answer: {why}; the lock and the wheelhouse need it: map it with a [[mirror]] in the store's config.toml, or build --offline from a lock and wheelhouse brought by `import` or `pull`"
        ));
    }
    out.extend(dropped_index_blockers(store, lr, &mirrors));
    out
}

/// How long uv may take to answer whether one package has a source.
const FINDS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// What the site's dropped indexes (`[[mirror]] url = "none"`) take away
/// from the lock: each recipe pin (`name==version`), and each package of a
/// dropped explicit index, that no index left has ([`Uv::finds`]: uv asks
/// the default index and every index the recipe names that the site does
/// not drop, as the lock would). The parity pin's
/// `flashinfer-cubin==0.6.15.post1` is published on FlashInfer's index
/// only: dropping that index cannot work, and this says so before the
/// lock fails. One line each, naming the pin, the dropped indexes and what
/// uv said. Nothing is asked when no index of the recipe is dropped or
/// uv is not there yet (the lock reports what it cannot find).
///
/// [`Uv::finds`]: crate::host::uv::Uv::finds
fn dropped_index_blockers(
    store: &Store,
    lr: &LoadedRecipe,
    mirrors: &crate::host::mirror::Mirrors,
) -> Vec<String> {
    use crate::host::mirror::Mapped;
    use crate::recipe::Index;
    let r = &lr.recipe;
    let dropped: Vec<&Index> = r
        .indexes
        .iter()
        .filter(|i| matches!(mirrors.map(i.url()), Mapped::Dropped(_)))
        .collect();
    if dropped.is_empty() {
        return Vec::new();
    }
    let Ok(tool) = toolchain::find_uv(store) else {
        return Vec::new();
    };
    let left: Vec<String> = crate::stages::lock::indexes::map_indexes(mirrors, &r.indexes)
        .iter()
        .map(|i| i.url().to_string())
        .collect();
    let uv = crate::host::uv::Uv {
        tool,
        indexes: left,
        offline: false,
        cache_dir: Some(store.uv_cache_dir()),
        tmp_dir: Some(store.uv_tmp_dir()),
    };
    // Each pin, then each package of a dropped explicit index (its pin
    // when it has one), once.
    let mut asked: Vec<(String, String)> = r
        .pins
        .iter()
        .map(|(n, v)| (format!("pins.{n} = {v}"), format!("{n}=={v}")))
        .collect();
    for i in &dropped {
        if let Index::Explicit { name, packages, .. } = i {
            for p in packages {
                if !r.pins.contains_key(p) {
                    asked.push((format!("indexes.{name}.packages: {p}"), p.clone()));
                }
            }
        }
    }
    let names: Vec<&str> = dropped.iter().map(|i| i.url()).collect();
    let _ = std::fs::create_dir_all(store.uv_tmp_dir());
    let mut out = Vec::new();
    for (what, requirement) in asked {
        if let Ok(Some(why)) = uv.finds(&requirement, &r.python, FINDS_TIMEOUT) {
            out.push(format!(
                "{what}: no index left once the site drops {} has it (uv: {why}); mapping that index to `none` cannot work for it: give it a [[mirror]] that serves it, or build --offline from a lock and wheelhouse brought by `import` or `pull`",
                names.join(", ")
            ));
        }
    }
    out
}
