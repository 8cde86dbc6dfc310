//! Preflight: find every tool and check every precondition before any work,
//! so a build that cannot succeed stops at once and names *everything* missing.

use anyhow::{Result, anyhow};

use crate::host::toolchain::{self, Python, Tool, Toolchain};
use crate::progress;
use crate::recipe::LoadedRecipe;
use crate::stages::source;
use crate::store::Store;

/// What the preflight found: the toolchain if complete, and every problem.
#[derive(Debug, Clone)]
pub struct Findings {
    /// The recipe's Python, if found.
    pub python: Option<Python>,
    /// uv, if found (not provisioned yet).
    pub uv: Option<Tool>,
    /// nvcc, if found.
    pub nvcc: Option<Tool>,
    /// Whether the mirror already holds the commit.
    pub source_mirrored: bool,
    /// Every reason the build cannot proceed, one line each.
    pub problems: Vec<String>,
}

/// Checks, without changing anything: the recipe's Python, uv (found or
/// installable), nvcc and a GPU for `cuda` builds with `cuda_arch_list: auto`,
/// and the repository (mirrored, or reachable unless `offline`).
pub fn inspect(store: &Store, lr: &LoadedRecipe, offline: bool) -> Findings {
    let r = &lr.recipe;
    let mut problems = Vec::new();
    let uv = toolchain::find_uv(store, None, false).ok();
    let python = match toolchain::find_python(&r.python, uv.as_ref()) {
        Ok(p) => Some(p),
        Err(e) => {
            problems.push(e);
            None
        }
    };
    if uv.is_none() && (offline || which::which("python3").is_err() && python.is_none()) {
        problems.push(format!(
            "uv not found on PATH or in {}, and it cannot be installed {}: put uv on PATH, set ORACLE_BUILD_UV=/path/to/uv, or copy a provisioned tools directory (`<root>/tools/` of an online store) and set ORACLE_BUILD_TOOLS to it",
            store.tools_dir().display(),
            if offline {
                "offline"
            } else {
                "(no working Python with pip)"
            }
        ));
    }
    let nvcc = toolchain::find_nvcc();
    if r.build.device() == crate::recipe::TargetDevice::Cuda {
        if nvcc.is_none() {
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
            .and_then(|from| source::check_reachable(&from))
        {
            problems.push(format!("{e:#}"));
        }
    }
    Findings {
        python,
        uv,
        nvcc,
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
    // A bad ORACLE_BUILD_DOWNLOADS is bad input (exit 2): refused before anything is written.
    crate::host::http::downloads()?;
    let f = inspect(store, lr, offline);
    if !f.problems.is_empty() {
        return Err(anyhow!(
            "cannot build {}: \n  - {}\n(nothing was written to {})",
            lr.recipe.name,
            f.problems.join("\n  - "),
            store.root().display()
        ));
    }
    store.init()?;
    let python = f.python.ok_or_else(|| anyhow!("python vanished"))?;
    let uv = match f.uv {
        Some(uv) => uv,
        None => toolchain::find_uv(store, Some(&python), true)?,
    };
    let tc = Toolchain {
        python,
        uv,
        git: toolchain::find_git(),
        libgit2: toolchain::libgit2_version(),
        gcc: toolchain::find_gcc(),
        nvcc: f.nvcc,
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
    Ok(tc)
}
