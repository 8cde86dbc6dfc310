//! Kernel coverage: does every compiled extension with device code hold a
//! cubin that runs on the GPU the oracle runs on?
//!
//! The rules, from NVIDIA's CUDA C++ Programming Guide ("Binary
//! Compatibility", "PTX Compatibility") and the CUDA 12.9 release notes /
//! NVIDIA's "family-specific architecture features" description:
//!
//! - a cubin `sm_XY` runs on a device of compute capability X.Z with Z >= Y
//!   (same major, equal or higher minor), never on another major;
//! - a family cubin `sm_XYf` runs on the same devices (its family: same
//!   major, minor >= Y);
//! - an arch-specific cubin `sm_XYa` runs on compute capability X.Y only;
//! - PTX `compute_XY` is JIT-compiled by the driver on any device of
//!   compute capability >= X.Y; `compute_XYa` only on X.Y, `compute_XYf`
//!   only on its family (same major, minor >= Y).
//!
//! Coverage is checked against the GPUs `nvidia-smi` lists (the GPU the
//! smoke runs on); without a GPU, against the arch list the wheel was built
//! for (its `build.json`'s `TORCH_CUDA_ARCH_LIST`, else the recipe's
//! `build.cuda_arch_list`). PTX-only coverage is a failure (the code that
//! would run is compiled at load, not the code that was built) unless the
//! recipe sets `smoke.allow_ptx_jit: true`.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::CompiledExtension;
use super::fatbin::{Arch, Kernels, Variant};
use crate::host::toolchain::Gpu;

/// A compute capability, `major.minor` (`9.0`, `12.1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Capability {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl std::str::FromStr for Capability {
    type Err = String;
    /// Parses `9.0` (`nvidia-smi --query-gpu=compute_cap`).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a compute capability like 9.0");
        let (a, b) = s.trim().split_once('.').ok_or_else(bad)?;
        let num = |t: &str| {
            (!t.is_empty() && t.len() <= 3 && t.chars().all(|c| c.is_ascii_digit()))
                .then(|| t.parse::<u32>().ok())
                .flatten()
                .ok_or_else(bad)
        };
        let (major, minor) = (num(a)?, num(b)?);
        if minor > 9 {
            return Err(bad());
        }
        Ok(Capability { major, minor })
    }
}

/// Whether the cubin of real architecture `a` runs on a device of `cc` (rules above).
pub fn cubin_runs_on(a: Arch, cc: Capability) -> bool {
    match a.variant {
        Variant::Specific => a.major() == cc.major && a.minor() == cc.minor,
        Variant::Plain | Variant::Family => a.major() == cc.major && a.minor() <= cc.minor,
    }
}

/// Whether PTX of virtual architecture `a` JIT-compiles for a device of `cc` (rules above).
pub fn ptx_jits_on(a: Arch, cc: Capability) -> bool {
    match a.variant {
        Variant::Plain => (a.major(), a.minor()) <= (cc.major, cc.minor),
        Variant::Specific => a.major() == cc.major && a.minor() == cc.minor,
        Variant::Family => a.major() == cc.major && a.minor() <= cc.minor,
    }
}

/// How one extension's device code meets one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A cubin runs there (the first that does).
    Cubin(Arch),
    /// No cubin does; these PTX would be JIT-compiled.
    PtxOnly(Vec<Arch>),
    /// Nothing runs there.
    Missing,
    /// The fat binary did not read.
    Unreadable(String),
}

/// The verdict for the device code `k` on a device of `cc`.
pub fn verdict(k: &Kernels, cc: Capability) -> Verdict {
    if let Some(e) = &k.error {
        return Verdict::Unreadable(e.clone());
    }
    if let Some(a) = k.cubins.iter().find(|a| cubin_runs_on(**a, cc)) {
        return Verdict::Cubin(*a);
    }
    let jit: Vec<Arch> = k
        .ptx
        .iter()
        .copied()
        .filter(|a| ptx_jits_on(*a, cc))
        .collect();
    if jit.is_empty() {
        Verdict::Missing
    } else {
        Verdict::PtxOnly(jit)
    }
}

/// Where the devices coverage is checked against come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetSource {
    /// The GPUs `nvidia-smi` lists on the box the identity was measured on.
    Gpu,
    /// The arch list the wheel was built for (no GPU visible).
    ArchList,
}

/// What the coverage check holds the extensions against (recorded in the
/// identity as `kernel_target`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Where the capabilities come from.
    pub source: TargetSource,
    /// The compute capabilities, unique, e.g. `["9.0"]`.
    pub capabilities: Vec<String>,
    /// In words, e.g. `the GPU NVIDIA H200 (9.0)`.
    pub described: String,
}

/// The compute capabilities an arch list (`TORCH_CUDA_ARCH_LIST` syntax as
/// the recipe allows it: `8.0;9.0a 12.1a+PTX`) is built for, unique, in order.
///
/// Errors: an entry that is not `M.m` with an optional `a`/`f` and `+PTX`.
pub fn arch_list_capabilities(list: &str) -> Result<Vec<Capability>, String> {
    let mut out = Vec::new();
    for (cubin, _) in arch_list_entries(list)? {
        let cc = Capability {
            major: cubin.major(),
            minor: cubin.minor(),
        };
        if !out.contains(&cc) {
            out.push(cc);
        }
    }
    Ok(out)
}

/// The cubins and PTX a `TORCH_CUDA_ARCH_LIST` asks for, as
/// `torch.utils.cpp_extension` turns it into `-gencode` flags (and the CUDA
/// fixture's `setup.py` does): `M.m[a|f]` gives the cubin `sm_Mm[a|f]`,
/// `+PTX` adds the PTX `compute_Mm[a|f]`. Sorted, unique. What a tree's own
/// build makes of the list (vLLM's CMake narrows it per kernel) may be less.
///
/// Errors: as [`arch_list_capabilities`].
pub fn planned(list: &str) -> Result<(Vec<Arch>, Vec<Arch>), String> {
    let mut cubins = Vec::new();
    let mut ptx = Vec::new();
    for (cubin, with_ptx) in arch_list_entries(list)? {
        cubins.push(cubin);
        if with_ptx {
            ptx.push(Arch {
                virtual_arch: true,
                ..cubin
            });
        }
    }
    cubins.sort();
    cubins.dedup();
    ptx.sort();
    ptx.dedup();
    Ok((cubins, ptx))
}

/// The device code a build of a recipe with `build.cuda_arch_list` =
/// `cuda_arch_list` will ask nvcc for, on this box: `auto` is resolved from
/// the GPUs `nvidia-smi` lists (as the wheel stage does,
/// [`crate::host::toolchain::arch_list_for`]), then read by [`planned`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Planned {
    /// The `TORCH_CUDA_ARCH_LIST` the build will set.
    pub arch_list: String,
    /// The cubins it asks for.
    pub cubins: Vec<Arch>,
    /// The PTX it asks for.
    pub ptx: Vec<Arch>,
}

/// [`Planned`] for `cuda_arch_list`.
///
/// Errors: `auto` with no GPU visible; an arch list that does not read.
pub fn planned_build(cuda_arch_list: &str) -> Result<Planned, String> {
    let arch_list = if cuda_arch_list == "auto" {
        let caps: Vec<String> = crate::host::toolchain::gpus()
            .into_iter()
            .map(|g| g.compute_cap)
            .collect();
        if caps.is_empty() {
            return Err("cuda_arch_list is auto and no GPU is visible".into());
        }
        crate::host::toolchain::arch_list_for(&caps)
    } else {
        cuda_arch_list.to_string()
    };
    let (cubins, ptx) = planned(&arch_list)?;
    Ok(Planned {
        arch_list,
        cubins,
        ptx,
    })
}

fn arch_list_entries(list: &str) -> Result<Vec<(Arch, bool)>, String> {
    let mut out = Vec::new();
    for entry in list.split([';', ' ']).filter(|s| !s.is_empty()) {
        let bad = || format!("arch list {list:?}: {entry:?} is not like 9.0, 9.0a or 8.0+PTX");
        let (arch, with_ptx) = match entry.strip_suffix("+PTX") {
            Some(a) => (a, true),
            None => (entry, false),
        };
        let (digits, suffix) = match arch.strip_suffix(['a', 'f']) {
            Some(d) => (d, &arch[d.len()..]),
            None => (arch, ""),
        };
        let cc: Capability = digits.parse().map_err(|_| bad())?;
        let cubin: Arch = format!("sm_{}{}{suffix}", cc.major, cc.minor)
            .parse()
            .map_err(|_| bad())?;
        out.push((cubin, with_ptx));
    }
    if out.is_empty() {
        return Err(format!("arch list {list:?} names no architecture"));
    }
    Ok(out)
}

/// The target for a box with `gpus` (from `nvidia-smi`), else for the arch
/// list `built_for` (the wheel's `TORCH_CUDA_ARCH_LIST`); `None` when there is neither.
pub fn target(gpus: &[Gpu], built_for: Option<&str>) -> Option<Target> {
    let mut caps: Vec<String> = Vec::new();
    let mut names = Vec::new();
    for g in gpus {
        if !caps.contains(&g.compute_cap) {
            caps.push(g.compute_cap.clone());
            names.push(format!("{} ({})", g.name, g.compute_cap));
        }
    }
    if !caps.is_empty() {
        return Some(Target {
            source: TargetSource::Gpu,
            capabilities: caps,
            described: format!(
                "the GPU{} {} (nvidia-smi)",
                if names.len() > 1 { "s" } else { "" },
                names.join(", ")
            ),
        });
    }
    let list = built_for?;
    let caps = arch_list_capabilities(list).ok()?;
    Some(Target {
        source: TargetSource::ArchList,
        capabilities: caps.iter().map(Capability::to_string).collect(),
        described: format!("the arch list the wheel was built for, {list} (no GPU visible)"),
    })
}

/// One check per compiled extension with device code, against `target`
/// (else the recipe's arch list `recipe_arch_list` unless it is `auto`),
/// plus one `kernels` check that some extension holds device code at all.
/// PTX-only coverage passes only with `allow_jit` (`smoke.allow_ptx_jit`).
pub fn checks(
    exts: &[CompiledExtension],
    target: Option<&Target>,
    recipe_arch_list: &str,
    allow_jit: bool,
) -> Vec<super::Check> {
    let check = |field: String, expected: String, found: String, ok: bool| super::Check {
        field,
        expected,
        found,
        ok,
    };
    let fallback;
    let target = match target {
        Some(t) => t,
        None => {
            let caps = (recipe_arch_list != "auto")
                .then(|| arch_list_capabilities(recipe_arch_list).ok())
                .flatten();
            match caps {
                Some(caps) => {
                    fallback = Target {
                        source: TargetSource::ArchList,
                        capabilities: caps.iter().map(Capability::to_string).collect(),
                        described: format!(
                            "the recipe's build.cuda_arch_list {recipe_arch_list} (no GPU visible, no build record)"
                        ),
                    };
                    &fallback
                }
                None => {
                    return vec![check(
                        "kernels".into(),
                        "a GPU or an arch list to check the device code against".into(),
                        format!(
                            "no GPU visible, no build record, and build.cuda_arch_list is {recipe_arch_list:?}"
                        ),
                        false,
                    )];
                }
            }
        }
    };
    let (caps, expected) = expectation(target, allow_jit);
    let mut out = Vec::new();
    let with_code: Vec<(&CompiledExtension, &Kernels)> = exts
        .iter()
        .filter_map(|e| e.kernels.as_ref().map(|k| (e, k)))
        .filter(|(_, k)| k.has_device_code())
        .collect();
    out.push(check(
        "kernels".into(),
        "device code in at least one compiled extension".into(),
        if with_code.is_empty() {
            format!(
                "none of the {} compiled extension(s) holds device code",
                exts.len()
            )
        } else {
            format!(
                "{} of {} compiled extension(s) hold device code",
                with_code.len(),
                exts.len()
            )
        },
        !with_code.is_empty(),
    ));
    for (ext, k) in with_code {
        let (ok, found) = judge(k, &caps, allow_jit);
        out.push(check(
            format!("kernels {}", ext.path),
            expected.clone(),
            found,
            ok,
        ));
    }
    out
}

/// What `target`'s devices are checked against: its capabilities (those
/// that read) and the `expected` text of a kernel check against them.
pub fn expectation(target: &Target, allow_jit: bool) -> (Vec<Capability>, String) {
    let caps: Vec<Capability> = target
        .capabilities
        .iter()
        .filter_map(|c| c.parse().ok())
        .collect();
    let caps_text = caps
        .iter()
        .map(Capability::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let expected = format!(
        "a cubin that runs on {caps_text}, {}{}",
        target.described,
        if allow_jit {
            " (or PTX for the JIT: smoke.allow_ptx_jit)"
        } else {
            ""
        }
    );
    (caps, expected)
}

/// Judges the device code `k` of one extension on every device of `caps`:
/// whether it passes (a cubin runs on each; PTX only with `allow_jit`) and,
/// in words, what runs where followed by what it holds.
pub fn judge(k: &Kernels, caps: &[Capability], allow_jit: bool) -> (bool, String) {
    let mut ok = !caps.is_empty();
    let mut found = Vec::new();
    for &cc in caps {
        match verdict(k, cc) {
            Verdict::Cubin(a) => found.push(format!("{a} runs on {cc}")),
            Verdict::PtxOnly(ptx) => {
                let ptx = join(&ptx);
                if allow_jit {
                    found.push(format!(
                        "PTX only for {cc}: {ptx} JIT-compiled at load (allowed by smoke.allow_ptx_jit)"
                    ));
                } else {
                    ok = false;
                    found.push(format!(
                        "PTX only for {cc}: no cubin runs on {cc}, {ptx} would be JIT-compiled at load (set smoke.allow_ptx_jit: true to accept it)"
                    ));
                }
            }
            Verdict::Missing => {
                ok = false;
                found.push(format!("no cubin or PTX runs on {cc}"));
            }
            Verdict::Unreadable(e) => {
                ok = false;
                found.push(format!("unreadable fat binary: {e}"));
                break;
            }
        }
    }
    (ok, format!("{} (holds {})", found.join("; "), k.describe()))
}

fn join(v: &[Arch]) -> String {
    v.iter().map(Arch::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Arch {
        s.parse().unwrap()
    }
    fn cc(s: &str) -> Capability {
        s.parse().unwrap()
    }

    #[test]
    fn cubin_and_ptx_rules() {
        // (arch, device, cubin runs / PTX JITs)
        let cases = [
            ("sm_80", "8.0", true),
            ("sm_80", "8.6", true),
            ("sm_86", "8.0", false),
            ("sm_80", "9.0", false),
            ("sm_90", "9.0", true),
            ("sm_90a", "9.0", true),
            ("sm_100a", "10.3", false),
            ("sm_100f", "10.3", true),
            ("sm_103f", "10.0", false),
            ("sm_120f", "12.1", true),
            ("sm_120", "12.1", true),
            ("sm_121a", "12.1", true),
            ("sm_90a", "12.1", false),
            ("sm_120", "10.0", false),
        ];
        for (arch, dev, want) in cases {
            assert_eq!(cubin_runs_on(a(arch), cc(dev)), want, "{arch} on {dev}");
        }
        let cases = [
            ("compute_80", "9.0", true),
            ("compute_80", "12.1", true),
            ("compute_90", "8.6", false),
            ("compute_90a", "9.0", true),
            ("compute_90a", "10.0", false),
            ("compute_100f", "10.3", true),
            ("compute_100f", "12.0", false),
        ];
        for (arch, dev, want) in cases {
            assert_eq!(ptx_jits_on(a(arch), cc(dev)), want, "{arch} on {dev}");
        }
    }

    #[test]
    fn arch_lists_as_torch_reads_them() {
        let (cubins, ptx) = planned("8.0;9.0a 12.1a+PTX").unwrap();
        assert_eq!(join(&cubins), "sm_80, sm_90a, sm_121a");
        assert_eq!(join(&ptx), "compute_121a");
        let (cubins, ptx) = planned("8.0+PTX").unwrap();
        assert_eq!(
            (join(&cubins), join(&ptx)),
            ("sm_80".into(), "compute_80".into())
        );
        let caps = arch_list_capabilities("8.0;9.0a;9.0+PTX;10.0f").unwrap();
        assert_eq!(
            caps.iter().map(Capability::to_string).collect::<Vec<_>>(),
            ["8.0", "9.0", "10.0"]
        );
        for bad in ["", "9", "9.0b", "Hopper", "9.0a+ptx", "9.10"] {
            assert!(planned(bad).is_err(), "{bad}");
        }
    }

    fn ext(path: &str, cubins: &[&str], ptx: &[&str]) -> CompiledExtension {
        CompiledExtension {
            path: path.into(),
            size: 1,
            sha256: None,
            kernels: Some(Kernels {
                sections: vec![".nv_fatbin".into()],
                cubins: cubins.iter().map(|s| a(s)).collect(),
                ptx: ptx.iter().map(|s| a(s)).collect(),
                entries: Vec::new(),
                error: None,
            }),
        }
    }

    fn gpu(cap: &str) -> Gpu {
        Gpu {
            name: "NVIDIA H200".into(),
            compute_cap: cap.into(),
            driver: "580".into(),
            memory_free: "1 MiB".into(),
        }
    }

    #[test]
    fn checks_name_the_extension_what_it_holds_and_the_device() {
        let host = CompiledExtension {
            path: "_C.so".into(),
            size: 1,
            sha256: None,
            kernels: Some(Kernels::default()),
        };
        let t = target(&[gpu("9.0")], Some("8.0")).unwrap();
        assert_eq!(t.source, TargetSource::Gpu);
        // Built for 8.0: refused, naming sm_80 and the device's 9.0.
        let c = checks(
            &[host.clone(), ext("_cuda_C.so", &["sm_80"], &[])],
            Some(&t),
            "8.0",
            false,
        );
        assert_eq!(c.len(), 2, "{c:?}");
        assert!(c[0].ok);
        assert_eq!(c[1].field, "kernels _cuda_C.so");
        assert!(!c[1].ok);
        assert!(
            c[1].found.contains("no cubin or PTX runs on 9.0") && c[1].found.contains("sm_80"),
            "{}",
            c[1].found
        );
        assert!(c[1].expected.contains("9.0") && c[1].expected.contains("NVIDIA H200"));
        // 8.0+PTX: PTX only, refused unless JIT is allowed.
        let e = ext("_cuda_C.so", &["sm_80"], &["compute_80"]);
        let c = checks(std::slice::from_ref(&e), Some(&t), "8.0+PTX", false);
        assert!(
            !c[1].ok && c[1].found.contains("PTX only for 9.0"),
            "{}",
            c[1].found
        );
        let c = checks(std::slice::from_ref(&e), Some(&t), "8.0+PTX", true);
        assert!(c[1].ok && c[1].found.contains("allowed by smoke.allow_ptx_jit"));
        // auto on this GPU: 9.0a.
        let c = checks(
            &[ext("_cuda_C.so", &["sm_90a"], &[])],
            Some(&t),
            "auto",
            false,
        );
        assert!(c.iter().all(|c| c.ok), "{c:?}");
        // No device code anywhere: refused.
        let c = checks(&[host], Some(&t), "auto", false);
        assert!(!c[0].ok && c[0].found.contains("none of the 1"));
        // An unreadable fat binary is a failure naming why.
        let mut bad = ext("_x.so", &[], &[]);
        bad.kernels.as_mut().unwrap().error = Some("truncated: ...".into());
        let c = checks(&[bad], Some(&t), "auto", false);
        assert!(!c[1].ok && c[1].found.contains("unreadable fat binary: truncated"));
    }

    #[test]
    fn without_a_gpu_the_arch_list_is_the_target() {
        let t = target(&[], Some("9.0a;12.1a")).unwrap();
        assert_eq!(t.source, TargetSource::ArchList);
        assert_eq!(t.capabilities, ["9.0", "12.1"]);
        // A build that dropped the 12.1a kernels fails for 12.1 only.
        let c = checks(
            &[ext("_C.so", &["sm_90a"], &[])],
            Some(&t),
            "9.0a;12.1a",
            false,
        );
        assert!(!c[1].ok);
        assert!(
            c[1].found.contains("sm_90a runs on 9.0")
                && c[1].found.contains("no cubin or PTX runs on 12.1")
        );
        // No target recorded: the recipe's list, unless auto.
        let c = checks(&[ext("_C.so", &["sm_90a"], &[])], None, "9.0a", false);
        assert!(c[1].ok && c[1].expected.contains("build.cuda_arch_list 9.0a"));
        let c = checks(&[ext("_C.so", &["sm_90a"], &[])], None, "auto", false);
        assert_eq!(c.len(), 1);
        assert!(!c[0].ok && c[0].found.contains("no GPU visible"));
        assert_eq!(target(&[], None), None);
    }
}
