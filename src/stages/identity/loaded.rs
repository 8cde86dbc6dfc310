//! Kernel coverage of what the engine loads: the oracle's compiled
//! extensions that a gate case's engine processes mapped (read from
//! `/proc/<pid>/maps` by the smoke driver, the engine's child processes
//! included) are judged against the GPU the gate ran on; the extensions no
//! case mapped are listed with what they hold and not refused (a
//! multi-arch oracle holds Hopper-only libraries that no engine loads on a
//! 12.x GPU). Recorded in `oracle.json` as `smoke.kernel_coverage`
//! (docs/identity.md, "Kernel coverage").

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::CompiledExtension;
use super::coverage::{self, Target};
use super::fatbin::{Arch, Kernels};

/// Who judged the coverage recorded in [`KernelCoverage::judged_by`].
pub const JUDGED_BY_GATE: &str = "gate";

/// The most mapped shared objects kept per case (and in
/// [`KernelCoverage::device_libraries`]); more are dropped.
pub const MAX_MAPPED: usize = 4096;

/// The longest mapped path kept (longer ones are dropped).
pub const MAX_PATH: usize = 4096;

/// The coverage of what the gate's engines loaded (`smoke.kernel_coverage`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KernelCoverage {
    /// `gate`: judged from the gate cases' mapped objects.
    pub judged_by: String,
    /// What the loaded extensions were judged against (the GPUs the gate
    /// ran on); `None`: not judged (no GPU, or a recipe not for CUDA).
    pub target: Option<Target>,
    /// The compiled extensions some case's engine mapped.
    pub loaded: Vec<LoadedExtension>,
    /// The compiled extensions no case's engine mapped: listed, not refused.
    pub not_loaded: Vec<NotLoaded>,
    /// The other shared objects of the venv the engines mapped (torch's,
    /// FlashInfer's...), relative to the venv, sorted.
    pub device_libraries: Vec<String>,
}

/// A compiled extension some case's engine mapped, with its verdict.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoadedExtension {
    /// Relative to the package directory, as in `compiled_extensions`.
    pub path: String,
    /// The cases whose engine processes mapped it.
    pub cases: Vec<String>,
    /// Its cubins.
    pub cubins: Vec<Arch>,
    /// Its PTX.
    pub ptx: Vec<Arch>,
    /// In words: what runs on the target and what it holds, or why it was not judged.
    pub verdict: String,
    /// Whether it passes (true when not judged).
    pub ok: bool,
}

/// A compiled extension no case's engine mapped.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NotLoaded {
    /// Relative to the package directory, as in `compiled_extensions`.
    pub path: String,
    /// What it holds, e.g. `cubins sm_90a; PTX none` or `no device code`.
    pub holds: String,
    /// Its cubins.
    pub cubins: Vec<Arch>,
    /// Its PTX.
    pub ptx: Vec<Arch>,
}

impl KernelCoverage {
    /// One reason per loaded extension that failed: the extension, the
    /// cases that loaded it, and what it holds.
    pub fn reasons(&self) -> Vec<String> {
        let Some(t) = &self.target else {
            return Vec::new();
        };
        self.loaded
            .iter()
            .filter(|l| !l.ok)
            .map(|l| {
                format!(
                    "kernels: case {} loaded {}, which has no cubin for {}: {}",
                    l.cases.join(", "),
                    l.path,
                    t.described,
                    l.verdict
                )
            })
            .collect()
    }
}

/// The path of `p` relative to the venv `venv` (`None` outside it).
fn under(p: &str, venv: &Path) -> Option<String> {
    Path::new(p)
        .strip_prefix(venv)
        .ok()
        .map(|r| r.to_string_lossy().into_owned())
}

/// Judges what the gate cases loaded. `cases` holds each case's name and
/// the absolute paths its engine processes mapped, with the venv at
/// `venv` (the paths as they are now, final not staging); `exts` are the
/// oracle's compiled extensions under `package_dir` (absolute, inside
/// `venv`); `target` the GPUs to judge against, `None` to record without
/// judging (each loaded extension's verdict then says why).
pub fn judge(
    exts: &[CompiledExtension],
    package_dir: &Path,
    venv: &Path,
    cases: &[(String, Vec<String>)],
    target: Option<&Target>,
    allow_jit: bool,
) -> KernelCoverage {
    let pkg_rel = package_dir.strip_prefix(venv).map(Path::to_path_buf).ok();
    let ext_rel = |e: &CompiledExtension| -> String {
        match &pkg_rel {
            Some(r) => r.join(&e.path).to_string_lossy().into_owned(),
            None => package_dir.join(&e.path).to_string_lossy().into_owned(),
        }
    };
    let mapped_rel = |p: &str| -> String {
        match &pkg_rel {
            Some(_) => under(p, venv).unwrap_or_else(|| p.to_string()),
            None => p.to_string(),
        }
    };
    let expectation = target.map(|t| coverage::expectation(t, allow_jit));
    let empty = Kernels::default();
    let mut loaded = Vec::new();
    let mut not_loaded = Vec::new();
    let mut is_ext = std::collections::BTreeSet::new();
    for e in exts {
        let rel = ext_rel(e);
        is_ext.insert(rel.clone());
        let by: Vec<String> = cases
            .iter()
            .filter(|(_, m)| m.iter().any(|p| mapped_rel(p) == rel))
            .map(|(n, _)| n.clone())
            .collect();
        let k = e.kernels.as_ref().unwrap_or(&empty);
        if by.is_empty() {
            not_loaded.push(NotLoaded {
                path: e.path.clone(),
                holds: match &e.kernels {
                    Some(k) => k.describe(),
                    None => "not read".into(),
                },
                cubins: k.cubins.clone(),
                ptx: k.ptx.clone(),
            });
            continue;
        }
        let (ok, verdict) = match (&expectation, &e.kernels) {
            (_, Some(k)) if !k.has_device_code() => (true, "no device code (not judged)".into()),
            (None, Some(k)) => (
                true,
                format!(
                    "not judged: no GPU visible to the gate (holds {})",
                    k.describe()
                ),
            ),
            (_, None) => (true, "its device code was not read (not judged)".into()),
            (Some((caps, _)), Some(k)) => coverage::judge(k, caps, allow_jit),
        };
        loaded.push(LoadedExtension {
            path: e.path.clone(),
            cases: by,
            cubins: k.cubins.clone(),
            ptx: k.ptx.clone(),
            verdict,
            ok,
        });
    }
    let mut device_libraries: Vec<String> = cases
        .iter()
        .flat_map(|(_, m)| m.iter())
        .filter_map(|p| under(p, venv))
        .filter(|r| !is_ext.contains(r))
        .collect();
    device_libraries.sort();
    device_libraries.dedup();
    device_libraries.truncate(MAX_MAPPED);
    KernelCoverage {
        judged_by: JUDGED_BY_GATE.into(),
        target: target.cloned(),
        loaded,
        not_loaded,
        device_libraries,
    }
}

/// The kernel checks of a recorded gate coverage `cov` against the
/// extensions `exts` as measured now and `target`: the loaded extensions
/// are judged (one `kernels <path>` check each, `loaded by case ...`), the
/// others listed as passing checks that say they were not loaded.
pub fn checks(
    cov: &KernelCoverage,
    exts: &[CompiledExtension],
    target: Option<&Target>,
    allow_jit: bool,
) -> Vec<super::Check> {
    let mut out = Vec::new();
    let expectation = target.map(|t| coverage::expectation(t, allow_jit));
    for l in &cov.loaded {
        let now = exts.iter().find(|e| e.path == l.path);
        let cases = format!("loaded by case {} in the recorded gate", l.cases.join(", "));
        let (expected, found, ok) = match (&expectation, now.and_then(|e| e.kernels.as_ref())) {
            (_, None) if now.is_none() => (
                "the extension the gate loaded".to_string(),
                format!("{cases}; missing from the venv now"),
                false,
            ),
            (_, Some(k)) if !k.has_device_code() => (
                "device code judged by the gate".into(),
                format!("{cases}; no device code (not judged)"),
                true,
            ),
            (Some((caps, expected)), Some(k)) => {
                let (ok, found) = coverage::judge(k, caps, allow_jit);
                (expected.clone(), format!("{cases}; {found}"), ok)
            }
            _ => (
                "a GPU or arch list to judge against".into(),
                format!("{cases}; not judged: {}", l.verdict),
                l.ok,
            ),
        };
        out.push(super::Check {
            field: format!("kernels {}", l.path),
            expected,
            found,
            ok,
        });
    }
    for n in &cov.not_loaded {
        let holds = exts
            .iter()
            .find(|e| e.path == n.path)
            .and_then(|e| e.kernels.as_ref())
            .map_or_else(|| n.holds.clone(), Kernels::describe);
        out.push(super::Check {
            field: format!("kernels {}", n.path),
            expected: "judged only when a gate case's engine loads it".into(),
            found: format!(
                "not loaded by any case of the recorded gate (holds {holds}); not refused"
            ),
            ok: true,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::toolchain::Gpu;

    fn ext(path: &str, cubins: &[&str]) -> CompiledExtension {
        CompiledExtension {
            path: path.into(),
            size: 1,
            sha256: None,
            kernels: Some(Kernels {
                sections: vec![".nv_fatbin".into()],
                cubins: cubins.iter().map(|s| s.parse().unwrap()).collect(),
                ptx: Vec::new(),
                entries: Vec::new(),
                error: None,
            }),
        }
    }

    fn gb10() -> Target {
        coverage::target(
            &[Gpu {
                name: "NVIDIA GB10".into(),
                compute_cap: "12.1".into(),
                driver: "580".into(),
                memory_free: "1 MiB".into(),
            }],
            None,
        )
        .unwrap()
    }

    const VENV: &str = "/s/venvs/k";
    const PKG: &str = "/s/venvs/k/lib/python3.12/site-packages/vllm";

    fn mapped(rels: &[&str]) -> Vec<(String, Vec<String>)> {
        vec![(
            "nvfp4".into(),
            rels.iter().map(|r| format!("{VENV}/{r}")).collect(),
        )]
    }

    #[test]
    fn a_hopper_only_extension_not_loaded_on_a_gb10_is_listed_not_refused() {
        let exts = [
            ext("_C.abi3.so", &["sm_90a", "sm_121a"]),
            ext("vllm_flash_attn/_vllm_fa3_C.abi3.so", &["sm_90a"]),
        ];
        let t = gb10();
        let cases = mapped(&[
            "lib/python3.12/site-packages/vllm/_C.abi3.so",
            "lib/python3.12/site-packages/torch/lib/libtorch_cuda.so",
        ]);
        let cov = judge(
            &exts,
            Path::new(PKG),
            Path::new(VENV),
            &cases,
            Some(&t),
            false,
        );
        assert!(cov.reasons().is_empty(), "{:?}", cov.reasons());
        assert_eq!(cov.loaded.len(), 1);
        assert_eq!(cov.loaded[0].path, "_C.abi3.so");
        assert!(cov.loaded[0].ok && cov.loaded[0].verdict.contains("sm_121a runs on 12.1"));
        assert_eq!(cov.loaded[0].cases, ["nvfp4"]);
        assert_eq!(cov.not_loaded.len(), 1);
        assert_eq!(
            cov.not_loaded[0].path,
            "vllm_flash_attn/_vllm_fa3_C.abi3.so"
        );
        assert_eq!(cov.not_loaded[0].holds, "cubins sm_90a; PTX none");
        assert_eq!(
            cov.device_libraries,
            ["lib/python3.12/site-packages/torch/lib/libtorch_cuda.so"]
        );
        // The recorded coverage, judged again by verify: the listed one passes.
        let c = checks(&cov, &exts, Some(&t), false);
        assert!(c.iter().all(|c| c.ok), "{c:?}");
        assert!(c[1].found.contains("not loaded by any case"));
    }

    #[test]
    fn a_loaded_hopper_only_extension_on_a_gb10_is_refused_naming_case_and_holdings() {
        let exts = [
            ext("_C.abi3.so", &["sm_121a"]),
            ext("vllm_flash_attn/_vllm_fa3_C.abi3.so", &["sm_90a"]),
        ];
        let t = gb10();
        let cases = mapped(&[
            "lib/python3.12/site-packages/vllm/_C.abi3.so",
            "lib/python3.12/site-packages/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        ]);
        let cov = judge(
            &exts,
            Path::new(PKG),
            Path::new(VENV),
            &cases,
            Some(&t),
            false,
        );
        assert!(cov.not_loaded.is_empty());
        let r = cov.reasons();
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].contains("case nvfp4")
                && r[0].contains("_vllm_fa3_C.abi3.so")
                && r[0].contains("no cubin or PTX runs on 12.1")
                && r[0].contains("cubins sm_90a"),
            "{}",
            r[0]
        );
        let c = checks(&cov, &exts, Some(&t), false);
        assert!(c[0].ok && !c[1].ok, "{c:?}");
        // Without a GPU nothing is judged: recorded, not refused.
        let cov = judge(&exts, Path::new(PKG), Path::new(VENV), &cases, None, false);
        assert!(cov.reasons().is_empty() && cov.loaded.iter().all(|l| l.ok));
        assert!(cov.loaded[1].verdict.contains("not judged"));
    }
}
