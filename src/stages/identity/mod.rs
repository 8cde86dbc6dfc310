//! Stage 5, identity: measure what the oracle *is*, from its own Python, and
//! check each field against its own expected value (docs/identity.md).

pub mod coverage;
pub mod fatbin;
pub mod loaded;
pub mod pin_block;
pub mod record;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::recipe::{BuildMode, Recipe};

const IDENTITY_PY: &str = include_str!("../../py/identity.py");

/// One compiled module found under the package directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompiledExtension {
    /// Path relative to the package directory, e.g. `_C.abi3.so`.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// sha256 of the file (hex), read when the identity is measured; `None`
    /// in a record written before it was measured, or when the file could not be read.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Its device code, read from its CUDA fat binary ([`fatbin::read_elf`]);
    /// `None` in a record written before it was read.
    #[serde(default)]
    pub kernels: Option<fatbin::Kernels>,
}

/// What the identity script measured inside a venv, plus the recipe's commit
/// and the build mode of the wheel.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Identity {
    /// The recipe's commit (checked against `+g<sha>` of `runtime_version`).
    pub commit: String,
    /// `<package>.__version__`.
    pub runtime_version: Option<String>,
    /// `importlib.metadata.version(<package>)`.
    pub distribution_version: Option<String>,
    /// `flashinfer.__version__`, null when absent.
    pub flashinfer_version: Option<String>,
    /// Versions of the installed `flashinfer-*` distributions.
    #[serde(default)]
    pub flashinfer_packages: BTreeMap<String, String>,
    /// `torch.__version__`, null when absent.
    pub torch_version: Option<String>,
    /// `torch.version.cuda`.
    pub torch_cuda: Option<String>,
    /// `platform.python_version()`.
    pub python_version: String,
    /// `sysconfig.get_platform()`.
    pub platform: String,
    /// Any sign of an editable install (PEP 610 / PEP 660 / path outside the venv).
    pub editable: bool,
    /// What made it editable, one line each.
    #[serde(default)]
    pub editable_evidence: Vec<String>,
    /// The source trees an editable install points at (PEP 610 `url`, static `.pth` lines).
    #[serde(default)]
    pub editable_sources: Vec<String>,
    /// Resolved `<package>.__file__`.
    pub package_path: Option<String>,
    /// Whether `package_path` lies inside the venv.
    pub package_in_venv: bool,
    /// The package directory globbed for compiled modules (the imported one,
    /// else the one installed in site-packages; null when neither exists).
    #[serde(default)]
    pub package_dir: Option<String>,
    /// Compiled modules under the package (globbed, not a fixed list).
    pub compiled_extensions: Vec<CompiledExtension>,
    /// `source` or `precompiled`, as the built artifacts show it (see [`measured_mode`]).
    pub build_mode: String,
    /// What the build mode was decided from, one line each.
    #[serde(default)]
    pub build_mode_evidence: Vec<String>,
    /// The version the commit's history gives (setuptools-scm run on the
    /// store's checkout in the build venv, no pretend variables), from the
    /// wheel's `build.json`; `None` when unknown (not recorded, or the tree
    /// does not use setuptools-scm). Not measured in the venv.
    #[serde(default)]
    pub history_version: Option<String>,
    /// The venv's `sys.prefix` when measured.
    pub sys_prefix: String,
    /// Why `import <package>` failed, if it did.
    pub import_error: Option<String>,
    /// Tags of the source repository that point at `commit` (read with git,
    /// not measured in the venv): a build exactly at a release tag has a
    /// version without `+g<sha>` (setuptools-scm), which is then checked against them.
    #[serde(default)]
    pub tags_at_commit: Vec<String>,
    /// What the kernel coverage check holds the compiled extensions against
    /// when measured: the GPUs `nvidia-smi` listed, else the arch list the
    /// wheel was built for ([`coverage::target`]); `None` when neither was known.
    #[serde(default)]
    pub kernel_target: Option<coverage::Target>,
    /// Every extension the tree declares to setuptools-rust (from the
    /// wheel's `build.json`) and whether the venv holds it now (measured:
    /// [`crate::stages::rust::declared::measure_in_venv`]); empty for a
    /// tree without Rust, or without a wheel record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rust_extensions: Vec<crate::stages::rust::declared::Extension>,
}

#[derive(Deserialize)]
struct Measured {
    runtime_version: Option<String>,
    distribution_version: Option<String>,
    flashinfer_version: Option<String>,
    #[serde(default)]
    flashinfer_packages: BTreeMap<String, String>,
    torch_version: Option<String>,
    torch_cuda: Option<String>,
    python_version: String,
    platform: String,
    editable: bool,
    #[serde(default)]
    editable_evidence: Vec<String>,
    #[serde(default)]
    editable_sources: Vec<String>,
    package_path: Option<String>,
    package_in_venv: bool,
    #[serde(default)]
    package_dir: Option<String>,
    compiled_extensions: Vec<CompiledExtension>,
    sys_prefix: String,
    import_error: Option<String>,
}

/// How long the identity probe may run (importing vLLM with torch and CUDA
/// takes tens of seconds on a cold cache), unless [`PROBE_TIMEOUT_VAR`] says otherwise.
pub const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The environment variable overriding [`PROBE_TIMEOUT`] (whole seconds).
pub const PROBE_TIMEOUT_VAR: &str = "ORACLE_BUILD_PROBE_TIMEOUT";

/// The build mode the artifacts show: `precompiled` when the installed
/// distribution's (or package's) version carries vLLM's `precompiled` local
/// label (vLLM `setup.py` `get_vllm_version`), or when the wheel's own build
/// record (`build_env`: the environment `build.json` says the build got) has
/// `VLLM_USE_PRECOMPILED` set true or a `VLLM_PRECOMPILED_WHEEL_LOCATION`;
/// else `source`. Returns the mode and the evidence, one line each (the
/// compiled modules found are named too; their absence is its own check).
pub fn measured_mode(
    id: &Identity,
    build_env: Option<&BTreeMap<String, String>>,
) -> (BuildMode, Vec<String>) {
    let mut marks = Vec::new();
    for (what, v) in [
        ("distribution version", &id.distribution_version),
        ("runtime version", &id.runtime_version),
    ] {
        if let Some(v) = v
            .as_deref()
            .filter(|v| local_labels(v).any(|l| l == "precompiled"))
        {
            marks.push(format!("{what} {v} carries the precompiled label"));
        }
    }
    if let Some(env) = build_env {
        if let Some(v) = env
            .get("VLLM_USE_PRECOMPILED")
            .filter(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"))
        {
            marks.push(format!("the wheel's build.json: VLLM_USE_PRECOMPILED={v}"));
        }
        if let Some(v) = env.get("VLLM_PRECOMPILED_WHEEL_LOCATION") {
            marks.push(format!(
                "the wheel's build.json: VLLM_PRECOMPILED_WHEEL_LOCATION={v}"
            ));
        }
    }
    if !marks.is_empty() {
        return (BuildMode::Precompiled, marks);
    }
    let mut evidence = vec!["no precompiled label in the versions".to_string()];
    match build_env {
        Some(env) => evidence.push(format!(
            "the wheel's build.json: VLLM_USE_PRECOMPILED={}",
            env.get("VLLM_USE_PRECOMPILED")
                .map_or("(unset)", String::as_str)
        )),
        None => evidence.push("no wheel build record".into()),
    }
    if !id.compiled_extensions.is_empty() {
        evidence.push(format!(
            "{} compiled module(s)",
            id.compiled_extensions.len()
        ));
    }
    (BuildMode::Source, evidence)
}

/// The labels of a PEP 440 local version segment (`0.1+g1a2b.precompiled` ->
/// `g1a2b`, `precompiled`), lowercased; none when there is no `+`.
fn local_labels(version: &str) -> impl Iterator<Item = String> + '_ {
    version
        .split_once('+')
        .map(|(_, l)| l)
        .unwrap_or("")
        .split(['.', '-', '_'])
        .filter(|l| !l.is_empty())
        .map(str::to_ascii_lowercase)
}

/// Whether a version extends the history's (defined beside the version
/// the history gives, in the wheel stage, which checks it first).
pub use crate::stages::wheel::extends_history;

/// Measures the identity of `package` in the venv at `venv` by running the
/// venv's own Python (`-I`, isolated) from an empty directory outside any
/// source tree. The build mode is measured from the versions found and the
/// wheel's build record (`build_env`, see [`measured_mode`]).
///
/// Errors: the interpreter does not run or prints something that is not the expected JSON, or
/// runs past [`PROBE_TIMEOUT`] (then its process group is killed).
pub fn measure(
    venv: &Path,
    package: &str,
    commit: &str,
    build_env: Option<&BTreeMap<String, String>>,
) -> Result<Identity> {
    let work = tempfile::tempdir().context("creating a scratch directory")?;
    let script = work.path().join("identity.py");
    fs_err::write(&script, IDENTITY_PY)?;
    let python = venv.join("bin/python");
    // A Python that hangs (a broken CUDA driver on import, a stuck NFS
    // mount) must not hang verify or doctor: the probe has a limit.
    let limit = crate::host::process::timeout_from_env(PROBE_TIMEOUT_VAR, PROBE_TIMEOUT)?;
    let out = crate::host::process::capture_within(
        &format!("the identity probe {} identity.py", python.display()),
        duct::cmd(
            &python,
            // -B: a check never writes into the oracle (a source that no
            // longer matches its checked-hash .pyc is compiled in memory,
            // not written back into __pycache__).
            [
                "-I".as_ref(),
                "-B".as_ref(),
                script.as_os_str(),
                package.as_ref(),
            ],
        )
        .dir(work.path())
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME"),
        limit,
        &format!("raise the limit with ${PROBE_TIMEOUT_VAR}=<seconds>"),
    )?;
    let line = out.lines().last().unwrap_or("");
    let m: Measured =
        serde_json::from_str(line).with_context(|| format!("identity script printed: {out}"))?;
    let mut id = Identity {
        commit: commit.to_string(),
        runtime_version: m.runtime_version,
        distribution_version: m.distribution_version,
        flashinfer_version: m.flashinfer_version,
        flashinfer_packages: m.flashinfer_packages,
        torch_version: m.torch_version,
        torch_cuda: m.torch_cuda,
        python_version: m.python_version,
        platform: m.platform,
        editable: m.editable,
        editable_evidence: m.editable_evidence,
        editable_sources: m.editable_sources,
        package_path: m.package_path,
        package_in_venv: m.package_in_venv,
        package_dir: m.package_dir,
        compiled_extensions: m.compiled_extensions,
        build_mode: String::new(),
        build_mode_evidence: Vec::new(),
        history_version: None,
        sys_prefix: m.sys_prefix,
        import_error: m.import_error,
        tags_at_commit: Vec::new(),
        rust_extensions: Vec::new(),
        kernel_target: coverage::target(
            &crate::host::toolchain::gpus(),
            build_env
                .and_then(|e| e.get("TORCH_CUDA_ARCH_LIST"))
                .map(String::as_str),
        ),
    };
    if let Some(dir) = id.package_dir.clone() {
        for ext in &mut id.compiled_extensions {
            read_device_code(Path::new(&dir), ext);
        }
    }
    let (mode, evidence) = measured_mode(&id, build_env);
    id.build_mode = mode.as_str().to_string();
    id.build_mode_evidence = evidence;
    Ok(id)
}

/// Fills `ext`'s `sha256` and `kernels` from the file `package_dir/<path>`
/// (read whole: a fat binary's section may be most of it). A file that
/// cannot be read has no sha256 and an unreadable-kernels record naming why.
pub fn read_device_code(package_dir: &Path, ext: &mut CompiledExtension) {
    use sha2::Digest;
    let path = package_dir.join(&ext.path);
    match fs_err::read(&path) {
        Ok(bytes) => {
            ext.sha256 = Some(hex::encode(sha2::Sha256::digest(&bytes)));
            ext.kernels = Some(fatbin::read_elf(&bytes));
        }
        Err(e) => {
            ext.sha256 = None;
            ext.kernels = Some(fatbin::Kernels {
                error: Some(format!("cannot read {}: {e}", path.display())),
                ..fatbin::Kernels::default()
            });
        }
    }
}

/// The `<hex>` of a PEP 440 local version segment `+g<hex>` (setuptools-scm), if any.
pub fn scm_sha(version: &str) -> Option<&str> {
    let local = version.split_once('+')?.1;
    local.split('.').find_map(|part| {
        let hex = part.strip_prefix('g')?;
        (hex.len() >= 7 && hex.chars().all(|c| c.is_ascii_hexdigit())).then_some(hex)
    })
}

/// Whether `version` is setuptools-scm's fallback `0.1.devN` (no tag was
/// reachable: a shallow clone, a mirror without tags, a repository without history).
pub fn lacks_history(version: &str) -> bool {
    version
        .split('+')
        .next()
        .and_then(|public| public.strip_prefix("0.1.dev"))
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// The `dYYYYMMDD` part of a local version segment: setuptools-scm's mark of
/// a build from a modified ("dirty") tree, if any.
pub fn dirty_mark(version: &str) -> Option<&str> {
    let local = version.split_once('+')?.1;
    local.split('.').find(|part| {
        part.len() == 9 && part.starts_with('d') && part[1..].chars().all(|c| c.is_ascii_digit())
    })
}

/// Whether an installed `found` version satisfies the recipe pin `pin` the way
/// `==pin` does (PEP 440): a pin without a local segment (`2.13.0`) matches
/// any local build of it (`2.13.0+cu130`); a pin with one must match exactly.
pub fn version_matches_pin(found: &str, pin: &str) -> bool {
    if pin.contains('+') {
        found == pin
    } else {
        found.split('+').next() == Some(pin)
    }
}

/// PEP 503 normalized distribution name: lowercase, runs of `-_.` -> `-`.
pub fn normalize_dist_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// One identity check: a field, what it should be, what was measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Check {
    /// The field or property checked, e.g. `runtime_version`.
    pub field: String,
    /// What a correct oracle reports.
    pub expected: String,
    /// What was measured.
    pub found: String,
    /// Whether they agree.
    pub ok: bool,
}

fn check(field: &str, expected: impl Into<String>, found: impl Into<String>, ok: bool) -> Check {
    Check {
        field: field.into(),
        expected: expected.into(),
        found: found.into(),
        ok,
    }
}

fn show(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "(none)".into())
}

/// Checks `id` against the recipe: import works, `+g<sha>` prefixes the
/// commit, no dirty-tree mark, not editable, imported from inside the venv,
/// compiled extensions present (except for `target_device: empty`), for
/// `target_device: cuda` their kernel coverage ([`coverage::checks`]), build
/// mode, Python version, the installed torch and FlashInfer against the
/// recipe's `pins` (`pins.<name>`), and every field of the recipe's `expect`
/// block. Each check compares one measured value with its own expected value.
pub fn checks(id: &Identity, recipe: &Recipe) -> Vec<Check> {
    checks_with(id, recipe, KernelRule::PerExtension)
}

/// How [`checks_with`] judges the compiled extensions' kernel coverage.
#[derive(Debug, Clone, Copy)]
pub enum KernelRule<'a> {
    /// Every extension with device code must run on the target
    /// ([`coverage::checks`]): a build without a gate, or without a GPU.
    PerExtension,
    /// Only that some extension holds device code: the gate, about to run
    /// on the GPU, judges the extensions its engines load
    /// ([`loaded::judge`]).
    ByGate,
    /// `verify`: with the coverage a gate recorded, the extensions it
    /// loaded are judged and the others listed ([`loaded::checks`]);
    /// without one, per extension, marked as such.
    Recorded(Option<&'a loaded::KernelCoverage>),
}

/// The marker of per-extension kernel checks made where a gate could have
/// judged what its engine loads.
pub const NO_GATE_RUN: &str = "per extension: no gate run recorded";

/// [`checks`] with the kernel coverage judged by `rule`.
pub fn checks_with(id: &Identity, recipe: &Recipe, rule: KernelRule<'_>) -> Vec<Check> {
    let mut out = Vec::new();
    out.push(check(
        "import",
        "imports",
        id.import_error.clone().unwrap_or_else(|| "imports".into()),
        id.import_error.is_none(),
    ));
    out.push(commit_check(id));
    let mut dirty: Vec<String> = [&id.runtime_version, &id.distribution_version]
        .into_iter()
        .flatten()
        .filter(|v| dirty_mark(v).is_some())
        .cloned()
        .collect();
    dirty.dedup();
    out.push(check(
        "clean_tree",
        "no .dYYYYMMDD mark (built from the unmodified commit)",
        if dirty.is_empty() {
            "no mark".to_string()
        } else {
            format!("built from a modified tree: {}", dirty.join(", "))
        },
        dirty.is_empty(),
    ));
    out.push(check(
        "editable",
        "false (a regular, non-editable install)",
        if id.editable {
            format!("true: {}", id.editable_evidence.join("; "))
        } else {
            "false".into()
        },
        !id.editable,
    ));
    out.push(check(
        "package_path",
        format!("inside the venv {}", id.sys_prefix),
        show(&id.package_path),
        id.package_in_venv,
    ));
    if recipe.build.device() != crate::recipe::TargetDevice::Empty {
        let names: Vec<&str> = id
            .compiled_extensions
            .iter()
            .map(|e| e.path.as_str())
            .collect();
        out.push(check(
            "compiled_extensions",
            "at least one compiled module",
            if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            },
            !names.is_empty(),
        ));
    }
    if let Some(c) = optional_check(id, recipe) {
        out.push(c);
    }
    if recipe.build.device() == crate::recipe::TargetDevice::Cuda {
        let per_ext = coverage::checks(
            &id.compiled_extensions,
            id.kernel_target.as_ref(),
            &recipe.build.cuda_arch_list,
            recipe.smoke.allow_ptx_jit,
        );
        match rule {
            KernelRule::PerExtension => out.extend(per_ext),
            KernelRule::ByGate => out.extend(per_ext.into_iter().filter(|c| c.field == "kernels")),
            KernelRule::Recorded(Some(cov)) if cov.judged_by == loaded::JUDGED_BY_GATE => {
                out.extend(per_ext.into_iter().filter(|c| c.field == "kernels"));
                out.extend(loaded::checks(
                    cov,
                    &id.compiled_extensions,
                    id.kernel_target.as_ref(),
                    recipe.smoke.allow_ptx_jit,
                ));
            }
            KernelRule::Recorded(_) => out.extend(per_ext.into_iter().map(|mut c| {
                if c.field != "kernels" {
                    c.expected = format!("{} ({NO_GATE_RUN})", c.expected);
                }
                c
            })),
        }
    }
    let precompiled_mark = id
        .distribution_version
        .as_deref()
        .is_some_and(|v| v.contains("precompiled"));
    out.push(check(
        "build_mode",
        recipe.build.mode.as_str(),
        if id.build_mode_evidence.is_empty() {
            id.build_mode.clone()
        } else {
            format!("{} ({})", id.build_mode, id.build_mode_evidence.join("; "))
        },
        id.build_mode == recipe.build.mode.as_str()
            && (recipe.build.mode == BuildMode::Precompiled || !precompiled_mark),
    ));
    let py_ok = id.python_version == recipe.python
        || id
            .python_version
            .starts_with(&format!("{}.", recipe.python));
    out.push(check(
        "python_version",
        recipe.python.clone(),
        id.python_version.clone(),
        py_ok,
    ));
    out.extend(history_checks(id));
    out.extend(pin_checks(id, recipe));
    let e = &recipe.expect;
    let fields = [
        (
            "expect.runtime_version",
            &e.runtime_version,
            &id.runtime_version,
        ),
        (
            "expect.distribution_version",
            &e.distribution_version,
            &id.distribution_version,
        ),
        (
            "expect.flashinfer_version",
            &e.flashinfer_version,
            &id.flashinfer_version,
        ),
        ("expect.torch_version", &e.torch_version, &id.torch_version),
    ];
    for (field, want, got) in fields {
        if let Some(want) = want {
            out.push(check(
                field,
                want.clone(),
                show(got),
                got.as_deref() == Some(want.as_str()),
            ));
        }
    }
    out
}

/// The `optional_extensions` check of a tree that declares Rust
/// extensions (`None` for any other): every one the tree declares is in the
/// venv, except those the recipe's `build.optional_missing_ok` lets be
/// absent. Names the present ones, the absent ones accepted, and the
/// absent ones not accepted with where each is declared.
fn optional_check(id: &Identity, recipe: &Recipe) -> Option<Check> {
    if id.rust_extensions.is_empty() {
        return None;
    }
    let ok_missing = &recipe.build.optional_missing_ok;
    let (present, absent): (Vec<_>, Vec<_>) = id.rust_extensions.iter().partition(|e| e.present);
    let (accepted, refused): (Vec<_>, Vec<_>) = absent
        .into_iter()
        .partition(|e| ok_missing.contains(&e.target));
    let names = |v: &[&crate::stages::rust::declared::Extension], with_place: bool| {
        v.iter()
            .map(|e| {
                if with_place {
                    format!("{} ({})", e.target, e.declared)
                } else {
                    e.target.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let all: Vec<&_> = id.rust_extensions.iter().collect();
    let mut expected = format!("every extension the tree declares: {}", names(&all, true));
    if !ok_missing.is_empty() {
        expected.push_str(&format!(
            "; build.optional_missing_ok lets {} be absent",
            ok_missing.join(", ")
        ));
    }
    let mut found = vec![format!(
        "present: {}",
        if present.is_empty() {
            "none".to_string()
        } else {
            names(&present, false)
        }
    )];
    if !accepted.is_empty() {
        found.push(format!(
            "absent, accepted by build.optional_missing_ok: {}",
            names(&accepted, false)
        ));
    }
    if !refused.is_empty() {
        found.push(format!("absent: {}", names(&refused, true)));
    }
    Some(check(
        "optional_extensions",
        expected,
        found.join("; "),
        refused.is_empty(),
    ))
}

/// The tag at the commit that names `version` exactly (`v<version>` or
/// `<version>`, ignoring a local `+...` segment), if any: the evidence that a
/// version without `+g<sha>` is setuptools-scm's version of a build exactly at
/// that release tag. `tags` are the tags pointing at the commit
/// ([`Identity::tags_at_commit`]). Shared by `verify` and `doctor`.
pub fn release_tag<'a>(version: &str, tags: &'a [String]) -> Option<&'a str> {
    let base = version.split('+').next().unwrap_or("");
    if base.is_empty() {
        return None;
    }
    tags.iter()
        .find(|t| *t == base || t.strip_prefix('v') == Some(base))
        .map(String::as_str)
}

/// The `commit` check: `+g<sha>` of the runtime version is a prefix (>= 7 hex)
/// of the commit; or, for a version with no `+g<sha>` (an exact release tag
/// under setuptools-scm), a tag `v<version>` or `<version>` points at the
/// commit (see [`release_tag`]).
fn commit_check(id: &Identity) -> Check {
    let version = id.runtime_version.as_deref().unwrap_or("");
    match scm_sha(version) {
        Some(sha) => check(
            "commit",
            format!(
                "runtime_version carrying +g<sha> with <sha> a prefix of {}",
                id.commit
            ),
            version,
            id.commit.starts_with(&sha.to_ascii_lowercase()),
        ),
        None => {
            let tagged = release_tag(version, &id.tags_at_commit).is_some();
            let base = version.split('+').next().unwrap_or("");
            check(
                "commit",
                format!(
                    "runtime_version carrying +g<sha> of {} (or a release tag at that commit)",
                    id.commit
                ),
                if id.tags_at_commit.is_empty() {
                    format!(
                        "{} (no +g<sha>; no tag is known to point at the commit)",
                        show(&id.runtime_version)
                    )
                } else if tagged {
                    format!(
                        "{} (release tag at the commit: {})",
                        show(&id.runtime_version),
                        id.tags_at_commit.join(", ")
                    )
                } else if base.is_empty() {
                    format!(
                        "(none) (no version; tags at the commit: {})",
                        id.tags_at_commit.join(", ")
                    )
                } else {
                    format!(
                        "{} (no +g<sha>; tags at the commit: {}, none of which is v{base} or {base}, so none matches the version)",
                        show(&id.runtime_version),
                        id.tags_at_commit.join(", ")
                    )
                },
                tagged,
            )
        }
    }
}

/// The measured versions against the version the commit's history gives
/// ([`Identity::history_version`]), each against its own expectation: the
/// runtime version (`<package>.__version__`, written by setuptools-scm into
/// the tree's version file) is exactly the history's version; the
/// distribution version is it, or it with local labels the tree's `setup.py`
/// appends ([`extends_history`]). No checks when the history's version is unknown.
fn history_checks(id: &Identity) -> Vec<Check> {
    let Some(history) = &id.history_version else {
        return Vec::new();
    };
    vec![
        check(
            "runtime_version (history)",
            format!("{history} (what the commit's history gives, by setuptools-scm)"),
            show(&id.runtime_version),
            id.runtime_version.as_deref() == Some(history.as_str()),
        ),
        check(
            "distribution_version (history)",
            format!(
                "{history} (what the commit's history gives, by setuptools-scm), local labels may be appended"
            ),
            show(&id.distribution_version),
            id.distribution_version
                .as_deref()
                .is_some_and(|v| extends_history(v, history)),
        ),
    ]
}

/// The installed torch and FlashInfer against the recipe's `pins`: one
/// `pins.<name>` check per pinned `torch` / `flashinfer-*` distribution, and
/// `flashinfer.__version__` against `pins.flashinfer-python`.
fn pin_checks(id: &Identity, recipe: &Recipe) -> Vec<Check> {
    let mut out = Vec::new();
    for (name, pin) in &recipe.pins {
        let norm = normalize_dist_name(name);
        let found = if norm == "torch" {
            id.torch_version.clone()
        } else if norm.starts_with("flashinfer") {
            id.flashinfer_packages
                .iter()
                .find(|(k, _)| normalize_dist_name(k) == norm)
                .map(|(_, v)| v.clone())
        } else {
            continue;
        };
        out.push(check(
            &format!("pins.{norm}"),
            pin.clone(),
            show(&found),
            found
                .as_deref()
                .is_some_and(|f| version_matches_pin(f, pin)),
        ));
        if norm == "flashinfer-python" {
            out.push(check(
                "flashinfer.__version__",
                format!("{pin} (pins.flashinfer-python)"),
                show(&id.flashinfer_version),
                id.flashinfer_version
                    .as_deref()
                    .is_some_and(|f| version_matches_pin(f, pin)),
            ));
        }
    }
    out
}

/// `field: expected X, found Y` for every failed check, one per line.
pub fn describe_failures(checks: &[Check]) -> String {
    checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| format!("  {}: expected {}, found {}", c.field, c.expected, c.found))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_scm_sha() {
        assert_eq!(scm_sha("0.23.1rc1.dev1511+g555967922"), Some("555967922"));
        assert_eq!(
            scm_sha("0.23.1rc1.dev1511+g555967922.d20260101"),
            Some("555967922")
        );
        assert_eq!(scm_sha("0.23.1+cu130"), None);
        assert_eq!(scm_sha("0.23.1"), None);
    }

    #[test]
    fn reads_history_and_dirty_marks() {
        assert!(lacks_history("0.1.dev1+g555967922"));
        assert!(lacks_history("0.1.dev1511"));
        assert!(!lacks_history("0.23.1rc1.dev1511+g555967922"));
        assert!(!lacks_history("0.1.1.dev1+g555967922"));
        assert_eq!(
            dirty_mark("0.1.1.dev1+g0f1dd7fb0.d20260101"),
            Some("d20260101")
        );
        assert_eq!(dirty_mark("0.1.0+d20260101"), Some("d20260101"));
        assert_eq!(dirty_mark("0.1.1.dev1+g0f1dd7fb0"), None);
        assert_eq!(dirty_mark("0.1.1+deadbeef1"), None);
    }

    #[test]
    fn pins_match_like_pep_440_equality() {
        assert!(version_matches_pin("2.13.0+cu130", "2.13.0"));
        assert!(version_matches_pin("2.13.0", "2.13.0"));
        assert!(!version_matches_pin("2.13.1", "2.13.0"));
        assert!(!version_matches_pin("2.13.0+cu128", "2.13.0+cu130"));
        assert_eq!(
            normalize_dist_name("FlashInfer_Python"),
            "flashinfer-python"
        );
    }
}

#[cfg(test)]
mod history_tests {
    use super::*;

    #[test]
    fn the_distribution_may_only_append_local_labels_to_the_history_version() {
        let h = "0.1.1.dev1+g0f1dd7fb0";
        assert!(extends_history(h, h));
        assert!(extends_history("0.1.1.dev1+g0f1dd7fb0.precompiled", h));
        assert!(extends_history("0.1.1.dev1+g0f1dd7fb0.cu130.x", h));
        assert!(!extends_history("9.9.9+g0f1dd7fb0", h));
        assert!(!extends_history("0.1.1.dev1+g0f1dd7fb0.", h));
        assert!(!extends_history("0.1.1.dev1+g0f1dd7fb01", h));
        assert!(extends_history("0.23.1+cu130", "0.23.1"));
        assert!(!extends_history("0.23.1.post1", "0.23.1"));
        assert!(!extends_history("0.23.10", "0.23.1"));
    }

    #[test]
    fn the_mode_is_read_from_labels_and_the_build_record() {
        let mut id = commit_tests::id("0.1.1.dev1+g0f1dd7fb0", &[]);
        assert_eq!(measured_mode(&id, None).0, BuildMode::Source);
        let env: BTreeMap<String, String> =
            [("VLLM_USE_PRECOMPILED".to_string(), "1".to_string())].into();
        assert_eq!(measured_mode(&id, Some(&env)).0, BuildMode::Precompiled);
        let env: BTreeMap<String, String> =
            [("VLLM_USE_PRECOMPILED".to_string(), "0".to_string())].into();
        assert_eq!(measured_mode(&id, Some(&env)).0, BuildMode::Source);
        id.distribution_version = Some("0.1.1.dev1+g0f1dd7fb0.precompiled".into());
        let (mode, why) = measured_mode(&id, Some(&env));
        assert_eq!(mode, BuildMode::Precompiled);
        assert!(why[0].contains("precompiled label"), "{why:?}");
    }
}

#[cfg(test)]
mod commit_tests {
    use super::*;

    pub(super) fn id(version: &str, tags: &[&str]) -> Identity {
        Identity {
            commit: "0f1dd7fb00ab4fd99f50ba5da0155ad026f163c5".into(),
            runtime_version: Some(version.into()),
            distribution_version: None,
            flashinfer_version: None,
            flashinfer_packages: Default::default(),
            torch_version: None,
            torch_cuda: None,
            python_version: "3.12.1".into(),
            platform: "linux-x86_64".into(),
            editable: false,
            editable_evidence: vec![],
            editable_sources: vec![],
            package_dir: None,
            package_path: None,
            package_in_venv: true,
            compiled_extensions: vec![],
            kernel_target: None,
            rust_extensions: vec![],
            build_mode: "source".into(),
            build_mode_evidence: vec![],
            history_version: None,
            sys_prefix: "/v".into(),
            import_error: None,
            tags_at_commit: tags.iter().map(|t| t.to_string()).collect(),
        }
    }

    #[test]
    fn commit_is_proven_by_scm_sha_or_by_an_exact_tag() {
        assert!(commit_check(&id("0.1.1.dev1+g0f1dd7fb0", &[])).ok);
        assert!(!commit_check(&id("0.1.1.dev1+g1111111", &[])).ok);
        assert!(commit_check(&id("0.1.0", &["v0.1.0"])).ok);
        assert!(commit_check(&id("0.1.0+cu130", &["v0.1.0"])).ok);
        assert!(
            !commit_check(&id("0.1.0", &[])).ok,
            "a bare version proves nothing"
        );
        assert!(!commit_check(&id("0.2.0", &["v0.1.0"])).ok);
        assert!(!commit_check(&id("0.1.0rc1", &["v0.1.0"])).ok);
        assert!(!commit_check(&id("1.0", &["vv1.0"])).ok);
    }

    #[test]
    fn a_refused_tag_build_names_the_tags_and_says_none_matches() {
        let c = commit_check(&id("9.9.9", &["v0.1.0", "release-1"]));
        assert!(!c.ok);
        assert!(
            c.found.contains("tags at the commit: v0.1.0, release-1")
                && c.found.contains("none matches the version")
                && !c.found.contains("no tag"),
            "{}",
            c.found
        );
        let c = commit_check(&id("9.9.9", &[]));
        assert!(c.found.contains("no tag is known"), "{}", c.found);
        assert_eq!(
            release_tag("0.2.0+cu130", &["v0.2.0".into()]),
            Some("v0.2.0")
        );
        assert_eq!(release_tag("", &["v".into()]), None);
    }
}

#[cfg(test)]
mod kernel_rule_tests {
    use super::*;
    use crate::host::toolchain::Gpu;

    fn ext(path: &str, cubins: &[&str]) -> CompiledExtension {
        CompiledExtension {
            path: path.into(),
            size: 1,
            sha256: None,
            kernels: Some(fatbin::Kernels {
                sections: vec![".nv_fatbin".into()],
                cubins: cubins.iter().map(|s| s.parse().unwrap()).collect(),
                ..fatbin::Kernels::default()
            }),
        }
    }

    fn kernel_checks(c: Vec<Check>) -> Vec<Check> {
        c.into_iter()
            .filter(|c| c.field.starts_with("kernels"))
            .collect()
    }

    /// A `9.0a;12.1a` oracle on a GB10 whose FlashAttention 3 holds sm_90a only.
    #[test]
    fn per_extension_refuses_by_gate_defers_and_a_recorded_gate_judges_what_it_loaded() {
        let recipe = crate::recipe::parse(
            &format!(
                "name: x\nsource:\n  repo: file:///r\n  commit: {}\n  package: vllm\npython: \"3.12\"\nbuild:\n  target_device: cuda\n  cuda_arch_list: \"9.0a;12.1a\"\n",
                "a".repeat(40)
            ),
            "x.yaml",
        )
        .unwrap();
        let mut id = commit_tests::id("0.1.0", &[]);
        id.compiled_extensions = vec![
            ext("_C.abi3.so", &["sm_90a", "sm_121a"]),
            ext("_vllm_fa3_C.abi3.so", &["sm_90a"]),
        ];
        let gpu = Gpu {
            name: "NVIDIA GB10".into(),
            compute_cap: "12.1".into(),
            driver: "580".into(),
            memory_free: "1 MiB".into(),
        };
        id.kernel_target = coverage::target(&[gpu], None);
        // Today's rule: the Hopper-only extension refuses the oracle.
        let per = kernel_checks(checks(&id, &recipe));
        assert!(!per[2].ok && per[2].field == "kernels _vllm_fa3_C.abi3.so");
        // Gating on the GPU: only "some device code" at identity time.
        let by_gate = kernel_checks(checks_with(&id, &recipe, KernelRule::ByGate));
        assert_eq!(by_gate.len(), 1);
        assert!(by_gate[0].ok && by_gate[0].field == "kernels");
        // verify without a recorded gate: per extension, marked.
        let none = kernel_checks(checks_with(&id, &recipe, KernelRule::Recorded(None)));
        assert!(!none[2].ok && none[2].expected.contains(NO_GATE_RUN));
        // verify with a gate that loaded _C only: the other one is listed.
        let cases = vec![("nvfp4".to_string(), vec!["/v/pkg/_C.abi3.so".to_string()])];
        let cov = loaded::judge(
            &id.compiled_extensions,
            Path::new("/v/pkg"),
            Path::new("/v"),
            &cases,
            id.kernel_target.as_ref(),
            false,
        );
        let rec = kernel_checks(checks_with(&id, &recipe, KernelRule::Recorded(Some(&cov))));
        assert!(rec.iter().all(|c| c.ok), "{rec:?}");
        assert!(
            rec[1].found.contains("loaded by case nvfp4"),
            "{}",
            rec[1].found
        );
        assert!(
            rec[2].found.contains("not loaded by any case"),
            "{}",
            rec[2].found
        );
    }
}
