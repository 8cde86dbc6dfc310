//! Disk preflight: refuse a stage early when the store's filesystem lacks
//! the space it needs, naming needed and free bytes and the path.

use std::path::Path;

use anyhow::{Result, bail};

use crate::recipe::Recipe;

const GIB: f64 = (1u64 << 30) as f64;

/// A stage that needs disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Mirror fetch and checkout.
    Source,
    /// Wheel build (copy of the tree, build venv, objects, wheel).
    Wheel,
    /// The oracle venv.
    Venv,
}

impl Stage {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Source => "source",
            Stage::Wheel => "wheel",
            Stage::Venv => "venv",
        }
    }
}

/// Bytes `stage` needs for `recipe`: `build.disk.<stage>_gib` when set, else
/// by target device: cuda/rocm 1 / 18 / 20 GiB (measured vLLM CUDA builds),
/// otherwise 0.1 / 0.5 / 1 GiB.
pub fn needed(recipe: &Recipe, stage: Stage) -> u64 {
    let d = &recipe.build.disk;
    let heavy = recipe.build.device().compiles_kernels();
    let (set, heavy_default, light_default) = match stage {
        Stage::Source => (d.source_gib, 1.0, 0.1),
        Stage::Wheel => (d.wheel_gib, 18.0, 0.5),
        Stage::Venv => (d.venv_gib, 20.0, 1.0),
    };
    (set.unwrap_or(if heavy { heavy_default } else { light_default }) * GIB) as u64
}

/// Free bytes for unprivileged users on the filesystem holding `path` (or its
/// nearest existing ancestor); `None` when it cannot be read.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value for this plain C struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path and s a properly sized out-parameter.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    #[allow(clippy::unnecessary_cast)]
    (rc == 0).then(|| s.f_bavail as u64 * s.f_frsize as u64)
}

/// Where [`needed`]'s estimate for `stage` of `recipe` comes from, in
/// words: the recipe's `build.disk.<stage>_gib`, or the default for its
/// target device (for `cuda`/`rocm`, sizes measured on vLLM's CUDA builds,
/// said to be vLLM's when the recipe builds another package).
pub fn basis(recipe: &Recipe, stage: Stage) -> String {
    let d = &recipe.build.disk;
    let set = match stage {
        Stage::Source => d.source_gib,
        Stage::Wheel => d.wheel_gib,
        Stage::Venv => d.venv_gib,
    };
    let field = format!("build.disk.{}_gib", stage.as_str());
    if let Some(v) = set {
        return format!("the recipe's {field} = {v}");
    }
    let device = recipe.build.device();
    if device.compiles_kernels() {
        let package = &recipe.source.package;
        let note = if package == "vllm" {
            String::new()
        } else {
            format!(
                "; the recipe builds {package}, not vllm, so this may be far more than it needs: set {field}"
            )
        };
        format!(
            "the default for target_device {}, measured on vLLM's CUDA builds{note}",
            recipe.build.target_device
        )
    } else {
        format!(
            "the default for target_device {} (set {field} to change it)",
            recipe.build.target_device
        )
    }
}

/// Refuses `stage` when fewer bytes than it needs are free at `root`.
///
/// Errors (exit 1): not enough space; the message gives needed and free bytes and the path.
pub fn check(root: &Path, recipe: &Recipe, stage: Stage) -> Result<()> {
    let need = needed(recipe, stage);
    if let Some(free) = free_bytes(root)
        && free < need
    {
        bail!(
            "not enough disk for the {} stage: it needs {} bytes ({:.2} GiB: {}), {} bytes ({:.2} GiB) are free at {} (set build.disk.{}_gib to change the estimate)",
            stage.as_str(),
            need,
            need as f64 / GIB,
            basis(recipe, stage),
            free,
            free as f64 / GIB,
            root.display(),
            stage.as_str()
        );
    }
    Ok(())
}

/// Whether `err` comes from a full disk (ENOSPC), by cause or by message.
pub fn is_disk_full(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::ENOSPC))
            || e.to_string().contains("No space left on device")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(package: &str, device: &str, extra: &str) -> Recipe {
        crate::recipe::parse(
            &format!(
                "name: x\nsource:\n  repo: file:///r\n  commit: {}\n  package: {package}\npython: \"3.12\"\nbuild:\n  target_device: {device}\n{extra}",
                "a".repeat(40)
            ),
            "x.yaml",
        )
        .unwrap()
    }

    #[test]
    fn the_estimate_says_where_it_comes_from() {
        let tiny = recipe("fixturellm", "cuda", "  cuda_arch_list: \"9.0\"\n");
        assert_eq!(needed(&tiny, Stage::Wheel), 18 << 30);
        let why = basis(&tiny, Stage::Wheel);
        assert!(why.contains("measured on vLLM's CUDA builds"), "{why}");
        assert!(
            why.contains("builds fixturellm, not vllm") && why.contains("set build.disk.wheel_gib"),
            "{why}"
        );
        let vllm = recipe("vllm", "cuda", "  cuda_arch_list: \"9.0\"\n");
        assert!(!basis(&vllm, Stage::Venv).contains("not vllm"));
        let set = recipe(
            "fixturellm",
            "cuda",
            "  cuda_arch_list: \"9.0\"\n  disk:\n    wheel_gib: 2\n",
        );
        assert_eq!(
            basis(&set, Stage::Wheel),
            "the recipe's build.disk.wheel_gib = 2"
        );
    }
}
