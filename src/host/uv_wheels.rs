//! The pinned uv's wheels, by sha256, compiled into the binary (issues 40
//! and 41): the installer of every oracle is fixed by this table, not by a
//! version number, an index or a record from a cache or a bundle.
//!
//! Source: PyPI's JSON API for uv [`UV_VERSION`]
//! (`https://pypi.org/pypi/uv/0.13.9/json`, its `releases["0.13.9"]`
//! list: `filename`, `digests.sha256`, `size`, `url`), read on 2026-05-09;
//! each hash was checked against the file downloaded from its URL. The
//! rows are the wheels of the platforms this tool builds on
//! ([`crate::host::platform`]: glibc Linux on x86_64 and aarch64). uv
//! publishes two aarch64 wheels (`manylinux_2_17`, also tagged
//! `musllinux_1_1`, and `manylinux_2_28`); both are pinned, and a host with
//! glibc 2.28 or newer fetches the `manylinux_2_28` one. The `musllinux`
//! x86_64 wheel is left out: this tool needs glibc.
//!
//! Every uv this tool installs into `tools/` comes from a wheel whose
//! sha256 is a row of this table for the host's architecture
//! ([`check`]); a wheel with another hash is refused naming both.

use crate::host::platform::Platform;

/// The uv version this tool installs (and the one it accepts from PATH);
/// its wheels are [`UV_WHEELS`].
pub const UV_VERSION: &str = "0.13.9";

/// One pinned wheel of uv [`UV_VERSION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UvWheel {
    /// The CPU architecture it runs on (`x86_64`, `aarch64`), as
    /// [`Platform::arch`] spells it.
    pub arch: &'static str,
    /// The oldest glibc it runs on, as its minor version (`17` for
    /// `manylinux_2_17`).
    pub glibc_minor: u32,
    /// Its file name (PEP 427).
    pub filename: &'static str,
    /// Its lowercase hex sha256.
    pub sha256: &'static str,
    /// Its size in bytes.
    pub size: u64,
    /// Where PyPI serves it (mapped through `[[mirror]]` before a fetch).
    pub url: &'static str,
}

/// The pinned wheels (see the module docs for where they come from).
pub const UV_WHEELS: &[UvWheel] = &[
    UvWheel {
        arch: "x86_64",
        glibc_minor: 17,
        filename: "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        sha256: "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
        size: 17_606_939,
        url: "https://files.pythonhosted.org/packages/3d/aa/26d64642d808de4a652579ef950d7cd2d37f080a8babf9c67c6b75fc4c3f/uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    },
    UvWheel {
        arch: "aarch64",
        glibc_minor: 28,
        filename: "uv-0.13.9-py3-none-manylinux_2_28_aarch64.whl",
        sha256: "ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375",
        size: 16_864_124,
        url: "https://files.pythonhosted.org/packages/fe/2f/51a5de367c602592c018a42a23d57fba5f2689fe6c3bf025dcf043b39c61/uv-0.13.9-py3-none-manylinux_2_28_aarch64.whl",
    },
    UvWheel {
        arch: "aarch64",
        glibc_minor: 17,
        filename: "uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
        sha256: "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
        size: 18_026_789,
        url: "https://files.pythonhosted.org/packages/57/15/94b6cd62ac3ff6550288328e8035288875197cbc183f51554b266a69877b/uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
    },
];

/// The wheel to fetch for `platform`: the one of its architecture that
/// needs the newest glibc `platform` still has. `None` when uv has no
/// pinned wheel for it.
pub fn for_platform(platform: &Platform) -> Option<&'static UvWheel> {
    UV_WHEELS
        .iter()
        .filter(|w| w.arch == platform.arch && w.glibc_minor <= platform.glibc_minor)
        .max_by_key(|w| w.glibc_minor)
}

/// The pinned wheels of architecture `arch`.
pub fn of_arch(arch: &str) -> impl Iterator<Item = &'static UvWheel> {
    UV_WHEELS.iter().filter(move |w| w.arch == arch)
}

/// The pinned wheel of `arch` whose sha256 is `sha256`.
///
/// Errors: none has it; the message names `what` (the wheel, where it came
/// from), its sha256 and every pinned sha256 of `arch`, and says it is
/// refused.
pub fn check(sha256: &str, arch: &str, what: &str) -> anyhow::Result<&'static UvWheel> {
    if let Some(w) = of_arch(arch).find(|w| w.sha256 == sha256) {
        return Ok(w);
    }
    let pinned: Vec<String> = of_arch(arch)
        .map(|w| format!("{} ({})", w.sha256, w.filename))
        .collect();
    Err(anyhow::anyhow!(
        "{what} has sha256 {sha256}, but this oracle-build pins uv {UV_VERSION} for {arch} by sha256 {}; refusing it",
        if pinned.is_empty() {
            "(none: uv has no pinned wheel for this architecture)".to_string()
        } else {
            pinned.join(" or ")
        }
    ))
}

/// The architecture of a platform spelling (`x86_64-manylinux_2_28` ->
/// `x86_64`), as [`Platform::parse`] reads it; `None` when it does not parse.
pub fn arch_of(spelled: &str) -> Option<String> {
    Platform::parse(spelled).ok().map(|p| p.arch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_a_wheel_of_the_pinned_uv_for_a_platform_this_tool_builds_on() {
        for w in UV_WHEELS {
            let parsed = crate::store::wheelname::parse_wheel(w.filename).unwrap();
            assert_eq!(parsed.name.as_ref(), "uv", "{w:?}");
            assert_eq!(parsed.version.to_string(), UV_VERSION, "{w:?}");
            assert!(w.url.ends_with(&format!("/{}", w.filename)), "{w:?}");
            assert!(
                w.url
                    .starts_with("https://files.pythonhosted.org/packages/")
            );
            assert_eq!(w.sha256.len(), 64);
            assert!(
                w.sha256
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
            assert!(
                w.filename
                    .contains(&format!("manylinux_2_{}_{}", w.glibc_minor, w.arch))
            );
            assert!(w.size > 1 << 20);
        }
        for arch in ["x86_64", "aarch64"] {
            let p = Platform::parse(&format!("{arch}-manylinux_2_28")).unwrap();
            assert_eq!(for_platform(&p).unwrap().arch, arch);
        }
    }

    #[test]
    fn the_newest_wheel_the_hosts_glibc_runs_is_fetched() {
        let old = Platform::parse("aarch64-manylinux2014").unwrap();
        assert_eq!(for_platform(&old).unwrap().glibc_minor, 17);
        let new = Platform::parse("aarch64-manylinux_2_35").unwrap();
        assert_eq!(for_platform(&new).unwrap().glibc_minor, 28);
        let x86 = Platform::parse("x86_64-manylinux_2_17").unwrap();
        assert_eq!(
            for_platform(&x86).unwrap().sha256,
            "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19"
        );
    }

    #[test]
    fn another_hash_is_refused_naming_both() {
        let x86 = UV_WHEELS[0];
        assert_eq!(check(x86.sha256, "x86_64", "w").unwrap(), &x86);
        // The aarch64 wheel is not pinned for x86_64.
        let arm = for_platform(&Platform::parse("aarch64-manylinux_2_28").unwrap()).unwrap();
        let e = check(arm.sha256, "x86_64", "the wheel w")
            .unwrap_err()
            .to_string();
        assert!(e.contains(arm.sha256) && e.contains(x86.sha256), "{e}");
        assert!(e.contains("the wheel w") && e.contains("refusing"), "{e}");
        let other = "0".repeat(64);
        let e = check(&other, "aarch64", "w").unwrap_err().to_string();
        for w in of_arch("aarch64") {
            assert!(e.contains(w.sha256), "{e}");
        }
        assert!(e.contains(&other), "{e}");
    }
}
