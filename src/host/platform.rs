//! Target platforms of a lock: uv's `--python-platform` values for glibc Linux
//! (`x86_64-manylinux_2_28`, `aarch64-manylinux_2_28`, `x86_64-manylinux2014`),
//! and this host's own.
//!
//! A lock resolved for platform P lists the wheels that install on P. It may
//! be used to build on a host H when H has the same architecture and at
//! least P's glibc (PEP 600: `manylinux_x_y` wheels run on glibc >= x.y).

use std::fmt;

use crate::exit::bad_input;

/// The architectures uv offers `manylinux` targets for.
const ARCHES: &[&str] = &["x86_64", "aarch64"];

/// The highest `manylinux_2_<minor>` uv 0.13.9 accepts as `--python-platform`.
const MAX_GLIBC_MINOR: u32 = 40;

/// One glibc Linux target: `<arch>-manylinux_2_<glibc_minor>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `x86_64` or `aarch64`.
    pub arch: String,
    /// The glibc minor version (`28` for `manylinux_2_28`; `manylinux2014` is 17).
    pub glibc_minor: u32,
    /// How it was written (passed to uv as is).
    pub spelled: String,
}

impl Platform {
    /// Parses a `--platform` value: `<arch>-manylinux_2_<N>` or
    /// `<arch>-manylinux2014` (PEP 599: glibc 2.17), `<arch>` one of
    /// `x86_64`, `aarch64`.
    ///
    /// Errors (exit 2): anything else, naming the value and the accepted forms.
    pub fn parse(s: &str) -> anyhow::Result<Platform> {
        let bad = || {
            bad_input(format!(
                "--platform {s:?} is not a platform oracle-build can build on; use one of uv's glibc Linux `--python-platform` values: <arch>-manylinux_2_<N> (N 17..={MAX_GLIBC_MINOR}) or <arch>-manylinux2014, <arch> one of {}",
                ARCHES.join(", ")
            ))
        };
        let (arch, tag) = s.split_once('-').ok_or_else(bad)?;
        if !ARCHES.contains(&arch) {
            return Err(bad());
        }
        let glibc_minor = match tag {
            "manylinux2014" => 17,
            t => t
                .strip_prefix("manylinux_2_")
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| (17..=MAX_GLIBC_MINOR).contains(n))
                .ok_or_else(bad)?,
        };
        Ok(Platform {
            arch: arch.into(),
            glibc_minor,
            spelled: s.into(),
        })
    }

    /// This host: its architecture and glibc (`gnu_get_libc_version`),
    /// capped at the highest target uv knows. `None` on a host without glibc
    /// or on another architecture.
    pub fn host() -> Option<Platform> {
        let arch = std::env::consts::ARCH;
        if !ARCHES.contains(&arch) {
            return None;
        }
        let minor = glibc_minor()?.min(MAX_GLIBC_MINOR);
        Some(Platform {
            arch: arch.into(),
            glibc_minor: minor,
            spelled: format!("{arch}-manylinux_2_{minor}"),
        })
    }

    /// Whether a lock made for `lock` installs here: same architecture and
    /// `lock`'s glibc not newer than this one's.
    pub fn runs(&self, lock: &Platform) -> bool {
        self.arch == lock.arch && lock.glibc_minor <= self.glibc_minor
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spelled)
    }
}

/// The running glibc's minor version (`2.36` -> 36).
fn glibc_minor() -> Option<u32> {
    // SAFETY: gnu_get_libc_version returns a pointer to a static,
    // NUL-terminated string owned by glibc.
    let v = unsafe { std::ffi::CStr::from_ptr(gnu_get_libc_version()) };
    let v = v.to_str().ok()?;
    let mut parts = v.split('.');
    (parts.next()? == "2").then_some(())?;
    parts.next()?.parse().ok()
}

unsafe extern "C" {
    fn gnu_get_libc_version() -> *const libc::c_char;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_uv_linux_targets_and_refuses_the_rest() {
        let p = Platform::parse("aarch64-manylinux_2_28").unwrap();
        assert_eq!((p.arch.as_str(), p.glibc_minor), ("aarch64", 28));
        assert_eq!(
            Platform::parse("x86_64-manylinux2014").unwrap().glibc_minor,
            17
        );
        for bad in [
            "linux",
            "x86_64",
            "x86_64-manylinux_2_99",
            "riscv64-manylinux_2_28",
            "x86_64-manylinux_2_x",
            "x86_64-pc-windows-msvc",
        ] {
            assert!(Platform::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_lock_runs_on_the_same_arch_with_at_least_its_glibc() {
        let host = Platform::parse("x86_64-manylinux_2_36").unwrap();
        assert!(host.runs(&Platform::parse("x86_64-manylinux_2_28").unwrap()));
        assert!(host.runs(&host));
        assert!(!host.runs(&Platform::parse("x86_64-manylinux_2_39").unwrap()));
        assert!(!host.runs(&Platform::parse("aarch64-manylinux_2_28").unwrap()));
        let h = Platform::host().expect("the test host has glibc");
        assert!(h.runs(&h));
    }
}
