//! `Python.h` of the recipe's Python (issue 43): a build from source compiles
//! C and C++ against the interpreter's headers, which distributions ship
//! apart (`python3.X-dev`). The preflight asks the interpreter where its
//! headers are (`sysconfig.get_paths()["include"]`) and names a missing
//! `Python.h` before any work, instead of a compiler error hours in.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::host::process::capture;
use crate::host::toolchain::Python;

/// What [`include_dir`] runs: the interpreter's header directory.
const PROBE: &str = "import sysconfig;print(sysconfig.get_paths()['include'])";

/// The header directory of `python` (`sysconfig.get_paths()["include"]`),
/// asked of the interpreter itself, isolated (`-I -S`) as the toolchain
/// probe runs it.
///
/// Errors: the interpreter does not run or prints nothing.
pub fn include_dir(python: &Python) -> Result<PathBuf> {
    let out = capture(
        &format!("{} (sysconfig include)", python.path.display()),
        duct::cmd(&python.path, ["-I", "-S", "-c", PROBE]),
    )?;
    let line = out
        .lines()
        .next()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .context("python printed no include directory")?;
    Ok(PathBuf::from(line))
}

/// The preflight's problem line when `include` (the header directory of
/// `python`) holds no `Python.h`, naming the interpreter, the directory and
/// the fix; `None` when the header is there.
pub fn missing_python_h(python: &Python, include: &Path) -> Option<String> {
    if include.join("Python.h").is_file() {
        return None;
    }
    let minor = python
        .version
        .split('.')
        .take(2)
        .collect::<Vec<_>>()
        .join(".");
    Some(format!(
        "Python.h not found in {} (sysconfig include of Python {} at {}): build.mode source compiles C/C++ against it; install the distribution's python{minor}-dev package (python{minor}-devel on Fedora/RHEL), or use a Python built with its headers (e.g. `uv python install {minor}` and ORACLE_BUILD_PYTHON)",
        include.display(),
        python.version,
        python.path.display(),
    ))
}

/// [`missing_python_h`] for `python`'s own header directory ([`include_dir`]);
/// a Python that cannot say where its headers are is a problem line too.
pub fn problem(python: &Python) -> Option<String> {
    match include_dir(python) {
        Ok(dir) => missing_python_h(python, &dir),
        Err(e) => Some(format!(
            "cannot ask Python {} at {} for its header directory (Python.h), which build.mode source compiles against: {e:#}",
            python.version,
            python.path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py() -> Python {
        Python {
            path: PathBuf::from("/opt/py/bin/python3.12"),
            version: "3.12.4".into(),
            implementation: "cpython".into(),
            platform: "linux-x86_64".into(),
        }
    }

    #[test]
    fn a_header_directory_without_python_h_is_named_with_the_interpreter_and_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("include/python3.12");
        std::fs::create_dir_all(&dir).unwrap();
        let line = missing_python_h(&py(), &dir).expect("a problem");
        assert!(line.contains(&dir.display().to_string()), "{line}");
        assert!(line.contains("/opt/py/bin/python3.12"), "{line}");
        assert!(line.contains("python3.12-dev"), "{line}");
        assert!(line.contains("built with its headers"), "{line}");
        // A directory that does not exist at all is the same problem.
        assert!(missing_python_h(&py(), &tmp.path().join("absent")).is_some());

        std::fs::write(dir.join("Python.h"), "/* header */\n").unwrap();
        assert_eq!(missing_python_h(&py(), &dir), None);
    }
}
