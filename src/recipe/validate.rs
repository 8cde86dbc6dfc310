//! Recipe validation: every check a parsed [`Recipe`] must pass, and the
//! name, version and variable rules it applies. Each error names the file,
//! the line and the field (exit 2).

use anyhow::Result;

use super::{
    ALIAS_ROOT_PREFIX, Index, MAX_LOGPROBS, MAX_NAME_LEN, MAX_RUNS, Mode, Probe, Recipe, Serve,
    TARGET_DEVICES, TargetDevice,
};
use super::{env_references, locate};
use crate::exit::bad_input;

/// When `key` is a build variable oracle-build controls, what sets it instead
/// (the recipe field, or where its value comes from); `None` for any other variable.
///
/// Source: the wheel stage's environment (`stages::wheel`), and vLLM's
/// `setup.py` / `envs.py` (`VLLM_USE_PRECOMPILED`, `VLLM_PRECOMPILED_WHEEL_LOCATION`,
/// `VLLM_SKIP_PRECOMPILED_VERSION_SUFFIX`, `VLLM_VERSION_OVERRIDE`), and
/// setuptools-scm's `SETUPTOOLS_SCM_PRETEND_VERSION[_FOR_<DIST>]`.
pub fn controlled_build_var(key: &str) -> Option<&'static str> {
    if key.starts_with("SETUPTOOLS_SCM_PRETEND") || key == "VLLM_VERSION_OVERRIDE" {
        return Some(
            "the version comes from the history of `source.commit` (a hand-set version is what the identity gate refuses)",
        );
    }
    Some(match key {
        "VLLM_TARGET_DEVICE" => "set `build.target_device`",
        "VLLM_USE_PRECOMPILED"
        | "VLLM_PRECOMPILED_WHEEL_LOCATION"
        | "VLLM_SKIP_PRECOMPILED_VERSION_SUFFIX" => "set `build.mode`",
        "MAX_JOBS" => "set `build.max_jobs` (or `--jobs N`)",
        "NVCC_THREADS" => "set `build.nvcc_threads`",
        "TORCH_CUDA_ARCH_LIST" => "set `build.cuda_arch_list`",
        "VLLM_REQUIRE_RUST_FRONTEND" => {
            "it is 1 for a tree that reads it unless `build.optional_missing_ok` names the extensions that may be absent"
        }
        "SOURCE_DATE_EPOCH" => "it is the committer time of `source.commit` (reproducible builds)",
        "PYTHONPATH" | "PYTHONHOME" | "PIP_CONSTRAINT" => {
            "it is removed from every build: the build venv holds exactly the build requirements"
        }
        _ => return None,
    })
}

/// The variables the gate sets for every engine run so that the engine's
/// caches, configuration and scratch are the oracle's (`stages::smoke`'s
/// confinement): a recipe's `smoke.env` or a case's `env` may not set them.
/// `VLLM_CPU_KVCACHE_SPACE` is not one of them: the gate gives it a default
/// for `target_device: cpu` that `smoke.env` may override.
///
/// Source: vLLM's `envs.py` (`VLLM_CACHE_ROOT`), Triton (`TRITON_CACHE_DIR`),
/// torch inductor (`TORCHINDUCTOR_CACHE_DIR`), the XDG base directory spec,
/// huggingface_hub (`HF_HOME`, `HF_HUB_OFFLINE`), transformers
/// (`TRANSFORMERS_OFFLINE`), CUDA (`CUDA_CACHE_PATH`), FlashInfer's
/// `flashinfer/jit/env.py` (`FLASHINFER_WORKSPACE_BASE`), POSIX `TMPDIR`
/// and Python's `tempfile` (`TMP`, `TEMP`).
pub const CONFINED_SMOKE_VARS: &[&str] = &[
    "VLLM_CACHE_ROOT",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "HF_HOME",
    "CUDA_CACHE_PATH",
    "FLASHINFER_WORKSPACE_BASE",
    "HOME",
    "TMPDIR",
    "TMP",
    "TEMP",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
];

/// When `key` is a variable the gate sets itself for every engine run
/// ([`CONFINED_SMOKE_VARS`]), why; `None` for any other variable.
pub fn controlled_smoke_var(key: &str) -> Option<&'static str> {
    CONFINED_SMOKE_VARS.contains(&key).then_some(
        "the gate points the engine's caches, HOME and TMPDIR into the oracle's own run directory in the store, and runs it offline (docs/smoke.md)",
    )
}

/// Whether `s` is a valid recipe or case name: `[a-z0-9._-]+`, not `.` or
/// `..`, and not starting with `-` (a command line would read it as an option).
pub fn is_valid_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('-')
        && s != "."
        && s != ".."
        && !s.contains("..")
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
}

/// Whether `s` is a full lowercase 40-hex git commit id.
pub fn is_full_commit(s: &str) -> bool {
    s.len() == 40
        && s.chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

pub(super) fn validate(r: &Recipe, text: &str, origin: &str) -> Result<()> {
    let fail = |field: &str, msg: String| -> anyhow::Error {
        let line = locate(text, field).map_or(String::new(), |l| format!("line {l}: "));
        bad_input(format!("{origin}: {line}field `{field}`: {msg}"))
    };
    if r.name.len() > MAX_NAME_LEN {
        return Err(fail(
            "name",
            format!(
                "is {} characters long; a name is at most {MAX_NAME_LEN} (it names files and GC roots in the store)",
                r.name.len()
            ),
        ));
    }
    if r.name.starts_with('-') {
        return Err(fail(
            "name",
            format!(
                "{:?} starts with `-`, which a command line reads as an option (`oracle-build {}`); start the name with a letter or digit",
                r.name, r.name
            ),
        ));
    }
    if !is_valid_name(&r.name) {
        return Err(fail(
            "name",
            format!(
                "{:?} is not a valid name (use [a-z0-9._-], no `/` or `..`)",
                r.name
            ),
        ));
    }
    if r.name.starts_with(ALIAS_ROOT_PREFIX) {
        return Err(fail(
            "name",
            format!(
                "{:?} starts with {ALIAS_ROOT_PREFIX:?}, which is reserved for the GC roots of aliases (roots/{ALIAS_ROOT_PREFIX}<name>-<hash>); choose another name",
                r.name
            ),
        ));
    }
    if !is_full_commit(&r.source.commit) {
        return Err(fail(
            "source.commit",
            format!(
                "{:?} is not a full 40-hex lowercase commit id",
                r.source.commit
            ),
        ));
    }
    if r.source.repo.trim().is_empty() {
        return Err(fail("source.repo", "must not be empty".into()));
    }
    if r.source.repo.starts_with('-') {
        // git would read it as an option (`--upload-pack=<command>`).
        return Err(fail(
            "source.repo",
            format!(
                "{:?} starts with '-': a repository URL or path cannot",
                r.source.repo
            ),
        ));
    }
    let mut index_names = Vec::new();
    for (i, idx) in r.indexes.iter().enumerate() {
        let field = format!("indexes[{i}]");
        if idx.url().trim().is_empty() {
            return Err(fail(&field, "the index URL must not be empty".into()));
        }
        if let Index::Explicit { name, packages, .. } = idx {
            let ok = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && name != "default";
            if !ok || index_names.contains(name) {
                return Err(fail(
                    &field,
                    format!("name {name:?} must be [a-z0-9-]+, not `default`, and unique"),
                ));
            }
            index_names.push(name.clone());
            if packages.is_empty() {
                return Err(fail(
                    &field,
                    "an explicit index names the packages it serves (`packages: [...]`)".into(),
                ));
            }
            for pkg in packages {
                if pep508_rs::PackageName::new(pkg.clone()).is_err() {
                    return Err(fail(&field, format!("{pkg:?} is not a distribution name")));
                }
            }
        }
    }
    let pkg = &r.source.package;
    if pkg.is_empty()
        || pkg.starts_with(|c: char| c.is_ascii_digit())
        || !pkg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(fail(
            "source.package",
            format!("{pkg:?} is not an importable package name"),
        ));
    }
    let py_ok = r
        .python
        .split_once('.')
        .is_some_and(|(a, b)| a == "3" && !b.is_empty() && b.chars().all(|c| c.is_ascii_digit()));
    if !py_ok {
        return Err(fail(
            "python",
            format!("{:?} is not a Python version like \"3.12\"", r.python),
        ));
    }
    for (name, version) in &r.pins {
        let field = format!("pins.{name}");
        if !is_distribution_name(name) {
            return Err(fail(
                &field,
                format!("{name:?} is not a distribution name (letters, digits, `.`, `_`, `-`)"),
            ));
        }
        if !is_exact_version(version) {
            return Err(fail(
                &field,
                format!(
                    "{version:?} is not an exact version; a pin is one PEP 440 version such as 2.13.0, 0.6.15.post1 or 2.13.0+cu130 (no operators, commas, spaces or markers)"
                ),
            ));
        }
    }
    let mut added: std::collections::BTreeMap<String, usize> = Default::default();
    for (i, entry) in r.install.with.iter().enumerate() {
        let field = format!("install.with[{i}]");
        let (name, version) =
            super::parse_with(entry).map_err(|m| fail(&field, format!("{entry:?} {m}")))?;
        if let Some(j) = added.insert(name.clone(), i) {
            return Err(fail(
                &field,
                format!("{entry:?} names {name} again (install.with[{j}] added it already)"),
            ));
        }
        let pinned = r.pins.iter().find(|(n, _)| {
            n.parse::<pep508_rs::PackageName>()
                .ok()
                .map(|n| n.to_string())
                == Some(name.clone())
        });
        if let Some((n, v)) = pinned
            && v.parse::<pep440_rs::Version>().ok().map(|v| v.to_string()) != Some(version.clone())
        {
            return Err(fail(
                &field,
                format!(
                    "{entry:?} contradicts `pins.{n}: {v}` (a pin overrides every requirement of {name}; name one version)"
                ),
            ));
        }
    }
    let mut extras_seen: Vec<pep508_rs::ExtraName> = Vec::new();
    for (i, extra) in r.install.extras.iter().enumerate() {
        let field = format!("install.extras[{i}]");
        // pep508_rs takes "" as a name; PEP 685 names have at least one character.
        let name = match extra.parse::<pep508_rs::ExtraName>() {
            Ok(n) if !extra.trim().is_empty() => n,
            _ => {
                return Err(fail(
                    &field,
                    format!(
                        "{extra:?} is not an extra name (PEP 685: letters, digits, `.`, `_`, `-`)"
                    ),
                ));
            }
        };
        if let Some(j) = extras_seen.iter().position(|n| *n == name) {
            return Err(fail(
                &field,
                format!(
                    "{extra:?} names extra `{name}` again (install.extras[{j}]; PEP 685 names compare normalized)"
                ),
            ));
        }
        extras_seen.push(name);
    }
    let b = &r.build;
    if TargetDevice::parse(&b.target_device).is_none() {
        return Err(fail(
            "build.target_device",
            format!(
                "{:?} is not one of {}",
                b.target_device,
                TARGET_DEVICES.join(", ")
            ),
        ));
    }
    if b.max_jobs != "auto" && b.max_jobs.parse::<u32>().map_or(true, |n| n == 0) {
        return Err(fail(
            "build.max_jobs",
            format!("{:?} is not `auto` or a positive integer", b.max_jobs),
        ));
    }
    if let Some(v) = b.mem_per_job_gib.filter(|v| !(*v > 0.0 && v.is_finite())) {
        return Err(fail(
            "build.mem_per_job_gib",
            format!("{v} is not a memory size in GiB (a number above 0, such as 4 or 5.5)"),
        ));
    }
    if b.nvcc_threads == 0 {
        return Err(fail("build.nvcc_threads", "must be at least 1".into()));
    }
    let arch_ok = b.cuda_arch_list == "auto"
        || b.cuda_arch_list
            .split([';', ' '])
            .filter(|s| !s.is_empty())
            .all(|a| {
                let a = a.trim_end_matches("+PTX").trim_end_matches(['a', 'f']);
                a.split_once('.').is_some_and(|(x, y)| {
                    !x.is_empty()
                        && x.chars().all(|c| c.is_ascii_digit())
                        && y.chars().all(|c| c.is_ascii_digit())
                })
            });
    if !arch_ok {
        return Err(fail(
            "build.cuda_arch_list",
            format!(
                "{:?} is not `auto` or a list like \"9.0a;12.1a\"",
                b.cuda_arch_list
            ),
        ));
    }
    for (field, v) in [
        ("source_gib", b.disk.source_gib),
        ("wheel_gib", b.disk.wheel_gib),
        ("venv_gib", b.disk.venv_gib),
    ] {
        if let Some(v) = v.filter(|v| !(*v >= 0.0 && v.is_finite())) {
            return Err(fail(
                &format!("build.disk.{field}"),
                format!("{v} is not a size in GiB (a number, 0 or more)"),
            ));
        }
    }
    for (i, target) in b.optional_missing_ok.iter().enumerate() {
        let field = format!("build.optional_missing_ok[{i}]");
        let valid = !target.is_empty()
            && !target.starts_with('.')
            && !target.ends_with('.')
            && !target.contains("..")
            && target
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if !valid {
            return Err(fail(
                &field,
                format!(
                    "{target:?} is not an extension's target: a dotted module path or a binary name the tree declares (e.g. `vllm._rust_tool_parser`, `vllm.vllm-rs`)"
                ),
            ));
        }
        if b.optional_missing_ok[..i].contains(target) {
            return Err(fail(&field, format!("{target:?} is listed twice")));
        }
    }
    for (i, family) in r.expect.kernel_families.iter().enumerate() {
        let field = format!("expect.kernel_families[{i}]");
        if family.trim().is_empty()
            || family.trim() != family
            || family.chars().any(char::is_control)
        {
            return Err(fail(
                &field,
                format!(
                    "{family:?} is not a kernel family: name one as the tree's configure does in `-- Building <family> for archs: ...` (e.g. \"SM12x NVFP4\"), without surrounding spaces"
                ),
            ));
        }
        if r.expect.kernel_families[..i].contains(family) {
            return Err(fail(&field, format!("{family:?} is listed twice")));
        }
    }
    for (section, env) in [("build.env", &b.env), ("smoke.env", &r.smoke.env)] {
        if let Some(key) = env.keys().find(|k| !is_env_name(k)) {
            return Err(fail(
                &format!("{section}.{key}"),
                format!("{key:?} is not an environment variable name"),
            ));
        }
        if let Some((key, value)) = env.iter().find(|(_, v)| v.contains('\0')) {
            return Err(fail(
                &format!("{section}.{key}"),
                format!("{value:?} holds a NUL character, which no environment variable can carry"),
            ));
        }
    }
    if let Some((key, owner)) = b
        .env
        .keys()
        .find_map(|k| controlled_build_var(k).map(|o| (k, o)))
    {
        return Err(fail(
            &format!("build.env.{key}"),
            format!("{key} is set by oracle-build itself, not by the recipe: {owner}"),
        ));
    }
    if let Some((key, why)) = r
        .smoke
        .env
        .keys()
        .find_map(|k| controlled_smoke_var(k).map(|w| (k, w)))
    {
        return Err(fail(
            &format!("smoke.env.{key}"),
            format!("{key} is set by oracle-build itself, not by the recipe: {why}"),
        ));
    }
    if r.smoke.runs == 0 {
        return Err(fail(
            "smoke.runs",
            format!("0 is not a number of runs; expected 1 to {MAX_RUNS}"),
        ));
    }
    if r.smoke.allow_ptx_jit && b.device() != TargetDevice::Cuda {
        return Err(fail(
            "smoke.allow_ptx_jit",
            format!(
                "is for build.target_device: cuda (PTX is CUDA's), not {}",
                b.target_device
            ),
        ));
    }
    if r.smoke.runs > MAX_RUNS {
        return Err(fail(
            "smoke.runs",
            format!(
                "{} is more than {MAX_RUNS} (each run loads the model again)",
                r.smoke.runs
            ),
        ));
    }
    if let Some(v) = r.lock.exclude_newer.as_deref()
        && v != "commit"
        && v != "none"
        && let Err(e) = v.parse::<jiff::Timestamp>()
    {
        return Err(fail(
            "lock.exclude_newer",
            format!(
                "{v:?} is not `commit`, `none` or an RFC 3339 timestamp such as \"2026-01-01T00:00:00Z\" ({e})"
            ),
        ));
    }
    if r.smoke.timeout_s == 0 {
        return Err(fail("smoke.timeout_s", "must be at least 1".into()));
    }
    if !(r.smoke.near_tie_nats.is_finite() && r.smoke.near_tie_nats > 0.0) {
        return Err(fail(
            "smoke.near_tie_nats",
            format!("{} is not a positive number of nats", r.smoke.near_tie_nats),
        ));
    }
    if r.smoke.logprobs > MAX_LOGPROBS {
        return Err(fail(
            "smoke.logprobs",
            format!(
                "{} is more than {MAX_LOGPROBS} (vLLM's max_logprobs)",
                r.smoke.logprobs
            ),
        ));
    }
    if let Probe::Custom(p) = &r.smoke.probe {
        let dotted = |s: &str| {
            !s.is_empty()
                && s.split('.').all(|part| {
                    !part.is_empty()
                        && !part.starts_with(|c: char| c.is_ascii_digit())
                        && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
        };
        if !dotted(&p.module) {
            return Err(fail(
                "smoke.probe.module",
                format!("{:?} is not an importable module name", p.module),
            ));
        }
        if !dotted(&p.function) || p.function.contains('.') {
            return Err(fail(
                "smoke.probe.function",
                format!("{:?} is not a function name", p.function),
            ));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, case) in r.smoke.cases.iter().enumerate() {
        let field = |f: &str| format!("smoke.cases[{i}].{f}");
        if case.name.len() > MAX_NAME_LEN {
            return Err(fail(
                &field("name"),
                format!(
                    "is {} characters long; a case name is at most {MAX_NAME_LEN} (it names golden and log files)",
                    case.name.len()
                ),
            ));
        }
        if !is_valid_name(&case.name) {
            return Err(fail(
                &field("name"),
                format!("{:?} is not a valid case name", case.name),
            ));
        }
        if !seen.insert(case.name.as_str()) {
            return Err(fail(
                &field("name"),
                format!("{:?} appears twice", case.name),
            ));
        }
        if case.model.trim().is_empty() {
            return Err(fail(
                &field("model"),
                format!("case {:?} has an empty model", case.name),
            ));
        }
        if let Err(e) = env_references(&case.model) {
            return Err(fail(&field("model"), format!("case {:?}: {e}", case.name)));
        }
        let several = case.prompts.is_some() || case.prompts_file.is_some();
        if several {
            let given = [
                case.prompt.is_some(),
                case.prompt_token_ids.is_some(),
                case.prompts.is_some(),
                case.prompts_file.is_some(),
            ];
            if given.iter().filter(|g| **g).count() != 1 {
                return Err(fail(
                    &field(if case.prompts.is_some() {
                        "prompts"
                    } else {
                        "prompts_file"
                    }),
                    format!(
                        "case {:?}: give exactly one of `prompt`, `prompt_token_ids`, `prompts` and `prompts_file`",
                        case.name
                    ),
                ));
            }
            if let Some(list) = &case.prompts {
                if list.is_empty() {
                    return Err(fail(
                        &field("prompts"),
                        format!("case {:?}: the prompt list is empty", case.name),
                    ));
                }
                if let Some(j) = list.iter().position(String::is_empty) {
                    return Err(fail(
                        &field(&format!("prompts[{j}]")),
                        format!("case {:?}: the prompt is empty", case.name),
                    ));
                }
            }
            if case
                .prompts_file
                .as_deref()
                .is_some_and(|f| f.trim().is_empty())
            {
                return Err(fail(
                    &field("prompts_file"),
                    format!("case {:?}: the prompts file path is empty", case.name),
                ));
            }
        }
        match (&case.prompt, &case.prompt_token_ids) {
            _ if several => {}
            (Some(_), Some(_)) | (None, None) => {
                return Err(fail(
                    &field("prompt"),
                    format!(
                        "case {:?}: give exactly one of `prompt` (text), `prompt_token_ids`, `prompts` and `prompts_file`",
                        case.name
                    ),
                ));
            }
            (Some(p), None) if p.is_empty() => {
                return Err(fail(
                    &field("prompt"),
                    format!("case {:?}: the prompt is empty", case.name),
                ));
            }
            (None, Some(ids)) if ids.is_empty() => {
                return Err(fail(
                    &field("prompt_token_ids"),
                    format!("case {:?}: the prompt has no token ids", case.name),
                ));
            }
            _ => {}
        }
        if case.golden.as_deref().is_some_and(|g| g.trim().is_empty()) {
            return Err(fail(
                &field("golden"),
                format!("case {:?}: the golden path is empty", case.name),
            ));
        }
        if let Some(key) = case.env.keys().find(|k| !is_env_name(k)) {
            return Err(fail(
                &field(&format!("env.{key}")),
                format!(
                    "case {:?}: {key:?} is not an environment variable name",
                    case.name
                ),
            ));
        }
        if let Some((key, why)) = case
            .env
            .keys()
            .find_map(|k| controlled_smoke_var(k).map(|w| (k, w)))
        {
            return Err(fail(
                &field(&format!("env.{key}")),
                format!(
                    "case {:?}: {key} is set by oracle-build itself, not by the recipe: {why}",
                    case.name
                ),
            ));
        }
        if case.max_tokens == 0 {
            return Err(fail(
                &field("max_tokens"),
                format!("case {:?}: must be at least 1", case.name),
            ));
        }
        if let Some(v) = case.engine_args.get("enforce_eager") {
            let why = match (case.mode, v.as_bool()) {
                (_, None) => Some(format!("{v} is not true or false")),
                (Mode::Compiled, Some(true)) => Some(
                    "true contradicts `mode: compiled` (vLLM's default compilation and CUDA graphs); \
                     drop it, or write `mode: eager`"
                        .to_string(),
                ),
                (Mode::Eager, Some(false)) => Some(
                    "false contradicts `mode: eager` (the default); for vLLM's compilation and \
                     CUDA graphs write `mode: compiled` and drop `enforce_eager`"
                        .to_string(),
                ),
                _ => None,
            };
            if let Some(why) = why {
                return Err(fail(
                    &field("engine_args.enforce_eager"),
                    format!("case {:?}: {why}", case.name),
                ));
            }
        }
    }
    if let Some(serve) = &r.smoke.serve {
        validate_serve(serve, r, &fail)?;
    }
    Ok(())
}

/// The checks of `smoke.serve` (`fail` names file, line and field).
fn validate_serve(
    serve: &Serve,
    r: &Recipe,
    fail: &dyn Fn(&str, String) -> anyhow::Error,
) -> Result<()> {
    if serve.cases.is_empty() {
        return Err(fail(
            "smoke.serve.cases",
            "names no case; list the offline cases to serve (`cases: [NAME, ...]`) or remove `smoke.serve`".into(),
        ));
    }
    for (i, name) in serve.cases.iter().enumerate() {
        let field = format!("smoke.serve.cases[{i}]");
        if !r.smoke.cases.iter().any(|c| &c.name == name) {
            let known: Vec<&str> = r.smoke.cases.iter().map(|c| c.name.as_str()).collect();
            return Err(fail(
                &field,
                format!(
                    "{name:?} is not a case of this recipe (smoke.cases: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        if serve.cases[..i].contains(name) {
            return Err(fail(&field, format!("{name:?} is listed twice")));
        }
        // The online leg sends one request: the case's one prompt.
        if r.smoke
            .cases
            .iter()
            .any(|c| &c.name == name && (c.prompts.is_some() || c.prompts_file.is_some()))
        {
            return Err(fail(
                &field,
                format!(
                    "{name:?} holds several prompts (prompts / prompts_file); the online leg serves a case of one prompt: serve another case, or split this one"
                ),
            ));
        }
    }
    let c = &serve.command;
    if c.is_empty()
        || c.starts_with(['-', '.'])
        || !c
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch))
    {
        return Err(fail(
            "smoke.serve.command",
            format!(
                "{c:?} is not a console script name of the oracle's bin/ (e.g. `vllm`): letters, digits, `.`, `_`, `-`, no path"
            ),
        ));
    }
    for (i, a) in serve.args.iter().enumerate() {
        let field = format!("smoke.serve.args[{i}]");
        if a.contains('\0') {
            return Err(fail(
                &field,
                format!("{a:?} holds a NUL character, which no argument can carry"),
            ));
        }
        let flag = a.split('=').next().unwrap_or(a);
        // argparse takes a unique prefix (`--hos`) for the option itself.
        let names = |opt: &str| flag.len() >= 4 && opt.starts_with(flag);
        if names("--host") || names("--port") {
            return Err(fail(
                &field,
                format!(
                    "{a:?}: the gate chooses the server's address itself (127.0.0.1 and a free port)"
                ),
            ));
        }
    }
    if serve.timeout_s == 0 {
        return Err(fail("smoke.serve.timeout_s", "must be at least 1".into()));
    }
    Ok(())
}

/// Whether `s` can name an environment variable: not empty, no `=`, no NUL.
pub fn is_env_name(s: &str) -> bool {
    !s.is_empty() && !s.contains(['=', '\0'])
}

/// Whether `s` is a valid distribution (project) name (PEP 508).
pub fn is_distribution_name(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric();
    s.starts_with(ok) && s.ends_with(ok) && s.chars().all(|c| ok(c) || "._-".contains(c))
}

/// Whether `s` is one exact PEP 440 version (`2.13.0`, `0.6.15.post1`,
/// `1!2.0rc1.dev3`, `2.13.0+cu130`), as `pep440_rs` parses one: no
/// operators, wildcards, commas, spaces or markers.
pub fn is_exact_version(s: &str) -> bool {
    s.trim() == s && !s.is_empty() && s.parse::<pep440_rs::Version>().is_ok()
}
