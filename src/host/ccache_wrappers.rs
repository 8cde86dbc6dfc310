//! The compilers of a build that does not take CMake's compiler launchers
//! through ccache (issue 43): setuptools' `build_ext` runs `CC` / `CXX`,
//! torch's `cpp_extension` runs `CXX` and `PYTORCH_NVCC`. Each is a small
//! script in the build's work directory, `<work>/ccache-bin/<name>`, that
//! runs `ccache <the real compiler>` (or the build's team-cache launcher
//! script, `host::team_cache`, which runs ccache).
//!
//! A script called by a ccache that already wraps the call (CMake's
//! launcher, when a tree's CMake takes `CC` for its compiler) runs the real
//! compiler at once: ccache sets `CCACHE_DISABLE=1` in the environment of
//! the compiler it runs (ccache 4, `src/ccache.cpp`), so a nested ccache
//! would be disabled anyway, and the script skips it. The build also names
//! the real compilers to CMake (`CMAKE_<LANG>_COMPILER` in `CMAKE_ARGS`) so
//! CMake's own launcher wraps the real compiler, never a script. Each script
//! gets a fixed modification time: ccache hashes a compiler's size and
//! modification time (`compiler_check = mtime`), so a script rewritten by
//! every build would otherwise key every call anew.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The directory of the scripts in a build's work directory.
const DIR: &str = "ccache-bin";

/// The modification time every script gets (the Unix epoch plus one day:
/// some tools take a zero time for "unknown").
const FIXED_MTIME_S: u64 = 86_400;

/// The scripts written for one build, each `None` where its compiler is
/// not known.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wrappers {
    /// `CC`: the C compiler through ccache.
    pub cc: Option<PathBuf>,
    /// `CXX`: the C++ compiler through ccache.
    pub cxx: Option<PathBuf>,
    /// `PYTORCH_NVCC`: nvcc through ccache.
    pub nvcc: Option<PathBuf>,
}

/// The real compilers to wrap (paths as found on PATH or declared, not
/// symlinks followed: `clang++` run as `clang-17` compiles C).
#[derive(Debug, Clone, Default)]
pub struct Real<'a> {
    /// The C compiler.
    pub cc: Option<&'a Path>,
    /// The C++ compiler.
    pub cxx: Option<&'a Path>,
    /// nvcc.
    pub nvcc: Option<&'a Path>,
}

/// The text of the script that runs `real` through `ccache` (a path to
/// ccache or to a launcher script that runs it).
pub fn script(ccache: &Path, real: &Path) -> String {
    let q = |p: &Path| crate::shell::shell_quote(&p.display().to_string());
    format!(
        "#!/bin/sh\n# oracle-build: {real} through ccache (docs/compiler-cache.md)\n# Called by a ccache already (CCACHE_DISABLE set): the compiler itself.\nif [ -n \"${{CCACHE_DISABLE:-}}\" ]; then exec {real} \"$@\"; fi\nexec {ccache} {real} \"$@\"\n",
        real = q(real),
        ccache = q(ccache),
    )
}

/// Writes the scripts of a build in `work` (`<work>/ccache-bin/{cc,c++,nvcc}`,
/// mode 0755, a fixed modification time) for each compiler of `real`.
///
/// Errors: a script cannot be written.
pub fn install(work: &Path, ccache: &Path, real: &Real<'_>) -> Result<Wrappers> {
    let dir = work.join(DIR);
    fs_err::create_dir_all(&dir)?;
    let write = |name: &str, r: Option<&Path>| -> Result<Option<PathBuf>> {
        let Some(r) = r else { return Ok(None) };
        let path = dir.join(name);
        fs_err::write(&path, script(ccache, r))?;
        let f = std::fs::File::options()
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        f.set_permissions(
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
        )
        .with_context(|| format!("making {} executable", path.display()))?;
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(FIXED_MTIME_S))
            .with_context(|| format!("setting the time of {}", path.display()))?;
        Ok(Some(path))
    };
    Ok(Wrappers {
        cc: write("cc", real.cc)?,
        cxx: write("c++", real.cxx)?,
        nvcc: write("nvcc", real.nvcc)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_runs_ccache_with_the_real_compiler_and_the_compiler_alone_under_a_ccache() {
        let t = tempfile::tempdir().unwrap();
        // A fake ccache and compiler that say how they were called.
        let fake_ccache = t.path().join("ccache");
        std::fs::write(&fake_ccache, "#!/bin/sh\necho \"ccache $*\"\n").unwrap();
        let real = t.path().join("my cc");
        std::fs::write(&real, "#!/bin/sh\necho \"cc $*\"\n").unwrap();
        for p in [&fake_ccache, &real] {
            std::fs::set_permissions(
                p,
                <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
            )
            .unwrap();
        }
        let w = install(
            t.path(),
            &fake_ccache,
            &Real {
                cc: Some(&real),
                ..Real::default()
            },
        )
        .unwrap();
        assert!(w.cxx.is_none() && w.nvcc.is_none());
        let cc = w.cc.unwrap();
        let run = |disable: bool| {
            let mut c = std::process::Command::new(&cc);
            c.args(["-c", "x.c"]).env_remove("CCACHE_DISABLE");
            if disable {
                c.env("CCACHE_DISABLE", "1");
            }
            String::from_utf8(c.output().unwrap().stdout).unwrap()
        };
        assert_eq!(
            run(false).trim(),
            format!("ccache {} -c x.c", real.display())
        );
        assert_eq!(run(true).trim(), "cc -c x.c");
        // The same time for every build, so ccache's mtime check keys alike.
        let m = std::fs::metadata(&cc).unwrap().modified().unwrap();
        assert_eq!(
            m,
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(FIXED_MTIME_S)
        );
    }
}
