//! nvcc's CUDA against the CUDA the locked torch was built for: a `cuda`
//! wheel compiled by an nvcc of another major.minor than torch's links
//! kernels against a runtime torch does not ship (the team saw an nvcc
//! 13.3 from a lease give `vllm-…cu133` against a torch built for CUDA
//! 13.0). Checked before the wheel stage compiles anything.
//!
//! torch's CUDA comes from the locked torch's local version label
//! (`2.13.0+cu130` is CUDA 13.0, as PyTorch's own indexes name their
//! wheels), else, when it has none (PyPI's torch), from `torch/version.py`
//! (`cuda = '13.0'`, written by torch's `tools/generate_torch_version.py`)
//! read from the locked wheel in the wheelhouse, without installing it.

use anyhow::{Result, anyhow};

use crate::host::compilers::DeclaredBy;
use crate::host::toolchain::Toolchain;
use crate::stages::lock::pylock::LockedPackage;
use crate::stages::wheelhouse;
use crate::store::Store;

/// The CUDA version torch was built for and where it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchCuda {
    /// `X.Y`.
    pub version: String,
    /// Where it comes from, e.g. `the local version label of the locked
    /// torch 2.13.0+cu130 (build lock)`.
    pub from: String,
}

/// The CUDA version of a torch local version label: `2.13.0+cu130` ->
/// `13.0`, `2.7.1+cu118` -> `11.8`; `None` without a `cuNNN` label.
pub fn cuda_of_label(version: &str) -> Option<String> {
    let (_, local) = version.split_once('+')?;
    local.split(['.', '-', '_']).find_map(|seg| {
        let digits = seg.strip_prefix("cu")?;
        (digits.len() >= 2 && digits.chars().all(|c| c.is_ascii_digit())).then(|| {
            format!(
                "{}.{}",
                &digits[..digits.len() - 1],
                &digits[digits.len() - 1..]
            )
        })
    })
}

/// The `cuda` value of a `torch/version.py` text (`cuda = '13.0'` or
/// `cuda: Optional[str] = '13.0'`); `None` when absent or `None` (a CPU torch).
pub fn cuda_of_version_py(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.trim_start().strip_prefix("cuda")?;
        let rest = rest.trim_start();
        if !(rest.starts_with('=') || rest.starts_with(':')) {
            return None;
        }
        let value = rest.rsplit_once('=')?.1.trim();
        let v = value.strip_prefix(['\'', '"'])?.strip_suffix(['\'', '"'])?;
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// `(major, minor)` of a version such as `13.0`, `13.3.20`.
pub fn major_minor(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next().unwrap_or("0").parse().ok()?;
    Some((major, minor))
}

/// torch's CUDA from the locked `packages` (`lock`: which lock, for the
/// message): its local label, else `torch/version.py` of its wheel in the
/// wheelhouse of `store`. `None`: no torch locked, or a torch without CUDA
/// or whose CUDA cannot be read (then nothing is checked).
pub fn of_locked(store: &Store, packages: &[LockedPackage], lock: &str) -> Option<TorchCuda> {
    let torch = packages.iter().find(|p| p.name == "torch")?;
    if let Some(v) = cuda_of_label(&torch.version) {
        return Some(TorchCuda {
            version: v,
            from: format!(
                "the local version label of the locked torch {} ({lock})",
                torch.version
            ),
        });
    }
    torch.wheels.iter().find_map(|a| {
        let entry = wheelhouse::entry(store, &a.sha256);
        let file = wheelhouse::file_of(&entry).ok()?;
        let text = crate::store::wheelname::read_wheel_member(&file, "torch/version.py").ok()?;
        Some(TorchCuda {
            version: cuda_of_version_py(&text)?,
            from: format!(
                "torch/version.py of {} in the wheelhouse ({lock})",
                a.filename
            ),
        })
    })
}

/// Refuses `nvcc` (its version and where it was found) against `torch`
/// when their major.minor differ, naming both and where each comes from.
/// An nvcc version that does not read as `X.Y` is not checked.
///
/// Errors (exit 1: the host's toolkit, not the recipe's text, is wrong, and
/// the store already holds the inputs fetched before the wheel stage).
pub fn check(nvcc_version: &str, nvcc_from: &str, torch: &TorchCuda) -> Result<()> {
    let (Some(n), Some(t)) = (major_minor(nvcc_version), major_minor(&torch.version)) else {
        return Ok(());
    };
    if n == t {
        return Ok(());
    }
    Err(anyhow!(
        "nvcc is CUDA {}.{} ({nvcc_version}, {nvcc_from}) but the locked torch was built for CUDA {} ({}): a wheel compiled so would not run against that torch; refusing before the wheel stage. Use a CUDA {} toolkit (build.env CUDA_HOME or CUDACXX), or lock a torch built for CUDA {}.{}",
        n.0,
        n.1,
        torch.version,
        torch.from,
        torch.version,
        n.0,
        n.1
    ))
}

/// The check of a `cuda` build about to compile, with the toolchain `tc`
/// and the locked sets `locks` (name, packages; the first that locks a
/// torch whose CUDA is known decides). Nothing to check (no nvcc, no
/// torch's CUDA known): `Ok`.
///
/// Errors: as [`check`].
pub fn check_build(
    store: &Store,
    tc: &Toolchain,
    locks: &[(&str, &[LockedPackage])],
) -> Result<()> {
    let Some(nvcc) = &tc.nvcc else {
        return Ok(());
    };
    let Some(torch) = locks
        .iter()
        .find_map(|(name, packages)| of_locked(store, packages, name))
    else {
        return Ok(());
    };
    let declared = tc
        .compilers
        .cuda
        .as_ref()
        .is_some_and(|c| c.declared_by == DeclaredBy::BuildEnv);
    let from = format!(
        "{}{}",
        nvcc.path.display(),
        if declared {
            ", declared in the recipe's build.env"
        } else {
            ", found on CUDA_HOME, PATH or /usr/local/cuda"
        }
    );
    check(&nvcc.version, &from, &torch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cuda_from_a_label_and_from_version_py() {
        assert_eq!(cuda_of_label("2.13.0+cu130").as_deref(), Some("13.0"));
        assert_eq!(cuda_of_label("2.7.1+cu118").as_deref(), Some("11.8"));
        assert_eq!(cuda_of_label("2.13.0+cpu"), None);
        assert_eq!(cuda_of_label("2.13.0"), None);
        assert_eq!(
            cuda_of_version_py("__version__ = '2.13.0'\ncuda: Optional[str] = '13.0'\n").as_deref(),
            Some("13.0")
        );
        assert_eq!(
            cuda_of_version_py("cuda = \"12.8\"\n").as_deref(),
            Some("12.8")
        );
        assert_eq!(cuda_of_version_py("cuda: Optional[str] = None\n"), None);
        assert_eq!(cuda_of_version_py("cudnn = '9'\n"), None);
    }

    #[test]
    fn a_major_minor_mismatch_is_refused_naming_both() {
        let torch = TorchCuda {
            version: "13.0".into(),
            from: "the label".into(),
        };
        assert!(check("13.0.48", "nvcc", &torch).is_ok());
        let e = format!("{:#}", check("13.3.20", "/x/nvcc", &torch).unwrap_err());
        assert!(e.contains("CUDA 13.3 (13.3.20, /x/nvcc)"), "{e}");
        assert!(e.contains("built for CUDA 13.0 (the label)"), "{e}");
        assert!(check("garbage", "nvcc", &torch).is_ok());
    }
}
