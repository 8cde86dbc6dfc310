//! The tree's compiler requirement, read before the build: every
//! `message(FATAL_ERROR ...)` of the tree's CMake files whose guard (the
//! `if()` / `elseif()` / `else()` branches it sits in, the enclosing ones
//! included) tests `CMAKE_C_COMPILER_VERSION`, `CMAKE_CXX_COMPILER_VERSION`
//! or their `_ID`, evaluated with the measured compilers and the target's
//! facts ([`super::condition`]). vLLM's `cmake/cpu_extension.cmake` is the
//! model:
//!
//! ```cmake
//! if (CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|amd64" OR ENABLE_X86_ISA)
//!     if (NOT (CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND
//!             CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12.3))
//!         message(FATAL_ERROR "X86 backend requires gcc/g++ >= 12.3")
//!     endif()
//! ```
//!
//! Guard true: CMake would stop there, so the build is refused before any
//! compile; unknown: a warning; false: nothing. The tree is only read.

use std::path::Path;

use fs_err as fs;

use super::cmake::calls;
use super::condition::{self, Arg, Facts, Truth};
use crate::host::compilers::Compilers;

/// One requirement of the tree that the measured compilers meet not (or
/// may not) meet.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    /// The CMake file, relative to the checkout.
    pub file: String,
    /// The line of the `message(FATAL_ERROR ...)`.
    pub line: usize,
    /// The message's text.
    pub message: String,
    /// The guard as written: each branch condition, outermost first, joined by ` AND `.
    pub guard: String,
    /// `True`: CMake stops there with these compilers; `Unknown`: the tree
    /// decides at configure time.
    pub truth: Truth,
    /// The measured compilers the guard tests, e.g. `g++ GNU 12.2.0 (/usr/bin/x86_64-linux-gnu-g++-12)`.
    pub compilers: String,
}

impl Requirement {
    /// One line naming the file:line, the message, the requirement and the compilers.
    pub fn describe(&self) -> String {
        format!(
            "{}:{}: message(FATAL_ERROR \"{}\") under `{}` ({}); measured {}",
            self.file,
            self.line,
            self.message,
            self.guard,
            match self.truth {
                Truth::True => "true for this build",
                _ => "decided by the tree at configure time",
            },
            self.compilers
        )
    }
}

/// The largest CMake file read; a bigger one is skipped.
const MAX_FILE: u64 = 4 << 20;
/// The most CMake files read in one tree.
const MAX_FILES: usize = 2000;

/// Every compiler requirement of the checkout at `src` whose guard is true
/// or unknown for `device` on this machine with `compilers`, in file and
/// line order. Reads every `CMakeLists.txt` and `*.cmake` of the tree
/// (hidden directories skipped; bounded in size and count).
pub fn check_tree(src: &Path, device: &str, compilers: &Compilers) -> Vec<Requirement> {
    let files = cmake_files(src);
    let facts = facts(device, compilers);
    let mut out = Vec::new();
    for rel in files {
        let Ok(text) = fs::read_to_string(src.join(&rel)) else {
            continue;
        };
        out.extend(check_file(&rel, &text, &facts, compilers));
    }
    out
}

/// Every `CMakeLists.txt` and `*.cmake` of the tree at `src`, relative to
/// it and sorted (hidden directories skipped; at most [`MAX_FILES`] files of
/// at most [`MAX_FILE`] bytes each).
pub(super) fn cmake_files(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    collect(src, src, &mut files, 0);
    files.sort();
    files
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<String>, depth: usize) {
    if depth > 16 || out.len() >= MAX_FILES {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() && !name.starts_with('.') {
            collect(root, &e.path(), out, depth + 1);
        } else if kind.is_file()
            && (name == "CMakeLists.txt" || name.ends_with(".cmake"))
            && e.metadata().is_ok_and(|m| m.len() <= MAX_FILE)
            && out.len() < MAX_FILES
            && let Ok(rel) = e.path().strip_prefix(root)
        {
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

/// The facts of the target ([`Facts::for_target`]) with the measured C and
/// C++ compilers' `CMAKE_<LANG>_COMPILER_ID` / `_VERSION` (left unknown
/// where none was measured).
pub fn facts(device: &str, compilers: &Compilers) -> Facts {
    let mut f = Facts::for_target(device);
    for (lang, c) in [("C", &compilers.cc), ("CXX", &compilers.cxx)] {
        if let Some(c) = c {
            f.set(&format!("CMAKE_{lang}_COMPILER_ID"), &c.id);
            f.set(
                &format!("CMAKE_{lang}_COMPILER_VERSION"),
                c.version_for_cmake(),
            );
        }
    }
    f
}

/// Whether a condition tests the C or C++ compiler's version or id.
fn tests_compiler(cond: &[Arg]) -> bool {
    [
        "CMAKE_CXX_COMPILER_VERSION",
        "CMAKE_C_COMPILER_VERSION",
        "CMAKE_CXX_COMPILER_ID",
        "CMAKE_C_COMPILER_ID",
    ]
    .iter()
    .any(|v| cond.iter().any(|a| a.text.contains(v)))
}

/// A condition as written (quoted arguments in quotes), on one line.
fn shown(cond: &[Arg]) -> String {
    cond.iter()
        .map(|a| {
            if a.quoted {
                format!("\"{}\"", a.text)
            } else {
                a.text.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One open `if()` block.
struct Frame {
    /// The conditions of the branches before the one being read.
    before: Vec<Vec<Arg>>,
    /// The branch being read: its condition (`None`: `else()`).
    current: Option<Vec<Arg>>,
}

impl Frame {
    fn truth(&self, facts: &Facts) -> Truth {
        let prior = self
            .before
            .iter()
            .fold(Truth::True, |t, c| t.and(!condition::eval(c, facts)));
        match &self.current {
            Some(c) => prior.and(condition::eval(c, facts)),
            None => prior,
        }
    }
    fn text(&self) -> String {
        let mut parts: Vec<String> = self
            .before
            .iter()
            .map(|c| format!("NOT ({})", shown(c)))
            .collect();
        parts.extend(self.current.as_deref().map(shown));
        parts.join(" AND ")
    }
    fn mentions_compiler(&self) -> bool {
        self.current.as_deref().is_some_and(tests_compiler)
            || self.before.iter().any(|c| tests_compiler(c))
    }
}

/// The requirements of one CMake file `rel` with text `text` (pure).
///
/// A `return()` outside a `function()` or `macro()` ends the file for
/// CMake: under a guard true for this build (vLLM's `CMakeLists.txt`
/// returns at its top for every target but `cuda` and `rocm`), nothing
/// after it is read; under an unknown guard the rest is read as before.
pub fn check_file(rel: &str, text: &str, facts: &Facts, compilers: &Compilers) -> Vec<Requirement> {
    let mut stack: Vec<Frame> = Vec::new();
    let mut out = Vec::new();
    // Open `function()` / `macro()` bodies: a `return()` there ends the call.
    let mut bodies = 0usize;
    for call in calls(text) {
        match call.name.as_str() {
            "function" | "macro" => bodies += 1,
            "endfunction" | "endmacro" => bodies = bodies.saturating_sub(1),
            "return" if bodies == 0 => {
                let truth = stack.iter().fold(Truth::True, |t, f| t.and(f.truth(facts)));
                if truth == Truth::True {
                    break;
                }
            }
            "if" => stack.push(Frame {
                before: Vec::new(),
                current: Some(call.cond_args()),
            }),
            "elseif" => {
                if let Some(f) = stack.last_mut() {
                    f.before.extend(f.current.take());
                    f.current = Some(call.cond_args());
                }
            }
            "else" => {
                if let Some(f) = stack.last_mut() {
                    f.before.extend(f.current.take());
                }
            }
            "endif" => {
                stack.pop();
            }
            "message" => {
                let args = call.cond_args();
                if args.first().is_none_or(|a| a.text != "FATAL_ERROR") {
                    continue;
                }
                if !stack.iter().any(Frame::mentions_compiler) {
                    continue;
                }
                let truth = stack.iter().fold(Truth::True, |t, f| t.and(f.truth(facts)));
                if truth == Truth::False {
                    continue;
                }
                let guard = stack
                    .iter()
                    .map(|f| format!("({})", f.text()))
                    .collect::<Vec<_>>()
                    .join(" AND ");
                let message = args[1..]
                    .iter()
                    .map(|a| a.text.as_str())
                    .collect::<String>();
                out.push(Requirement {
                    file: rel.to_string(),
                    line: call.line,
                    message,
                    guard,
                    truth,
                    compilers: measured(&stack, compilers),
                });
            }
            _ => {}
        }
    }
    out
}

/// The measured compilers the guard `stack` tests, described.
fn measured(stack: &[Frame], compilers: &Compilers) -> String {
    let all: String = stack.iter().map(Frame::text).collect();
    let mut parts = Vec::new();
    for (lang, name, c) in [
        ("CMAKE_C_COMPILER_", "CC", &compilers.cc),
        ("CMAKE_CXX_COMPILER_", "CXX", &compilers.cxx),
    ] {
        if all.contains(lang) {
            parts.push(match c {
                Some(c) => format!(
                    "{name} {} {} ({})",
                    c.id,
                    c.version_for_cmake(),
                    c.path.display()
                ),
                None => format!("{name}: none found"),
            });
        }
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::compilers::{Compiler, DeclaredBy};

    const VLLM: &str = r#"# vLLM's cmake/cpu_extension.cmake, shortened
include(CheckCXXCompilerFlag)
if (CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|amd64" OR ENABLE_X86_ISA)
    set(ENABLE_X86_ISA ON)
    if (NOT (CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND
            CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12.3))
        message(FATAL_ERROR "X86 backend requires gcc/g++ >= 12.3")
    endif()
elseif (CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64")
    if (NOT CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 10)
        message(FATAL_ERROR "ARM backend requires g++ >= 10")
    endif()
else()
    message(FATAL_ERROR "unsupported processor")
endif()
"#;

    fn gxx(version: &str) -> Compilers {
        Compilers {
            cxx: Some(Compiler {
                path: "/usr/bin/g++".into(),
                id: "GNU".into(),
                version: version.into(),
                cmake_version: None,
                declared_by: DeclaredBy::Path,
            }),
            ..Compilers::default()
        }
    }

    fn check(processor: &str, c: &Compilers) -> Vec<Requirement> {
        let facts = {
            let mut f = Facts::for_platform("cpu", processor, "linux");
            for (k, v) in facts("cpu", c).vars {
                if k.contains("COMPILER") {
                    f.set(&k, &v);
                }
            }
            f
        };
        check_file("cmake/cpu_extension.cmake", VLLM, &facts, c)
    }

    #[test]
    fn an_older_gcc_on_x86_is_refused_with_the_file_line_and_requirement() {
        let r = check("x86_64", &gxx("12.2.0"));
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].truth, Truth::True);
        assert_eq!(r[0].line, 7);
        assert_eq!(r[0].message, "X86 backend requires gcc/g++ >= 12.3");
        assert!(r[0].guard.contains("VERSION_GREATER_EQUAL 12.3"), "{r:?}");
        assert!(
            r[0].compilers.contains("GNU 12.2.0 (/usr/bin/g++)"),
            "{r:?}"
        );
        assert!(r[0].describe().starts_with("cmake/cpu_extension.cmake:7: "));
    }

    #[test]
    fn a_new_enough_gcc_or_another_processor_meets_it() {
        assert!(check("x86_64", &gxx("12.3.0")).is_empty());
        // aarch64: g++ 12.2 >= 10; the x86 branch is taken only if the
        // configure sets ENABLE_X86_ISA (unknown: a warning, no refusal);
        // the last message tests no compiler.
        let r = check("aarch64", &gxx("12.2.0"));
        assert!(r.iter().all(|r| r.truth == Truth::Unknown), "{r:?}");
        assert_eq!(r.len(), 1, "{r:?}");
        // g++ 9.4 on aarch64: the ARM requirement is reported too (unknown,
        // as the elseif is taken only when ENABLE_X86_ISA is not set).
        let r = check("aarch64", &gxx("9.4.0"));
        let lines: Vec<usize> = r.iter().map(|r| r.line).collect();
        assert_eq!(lines, [7, 11], "{r:?}");
    }

    /// vLLM's `CMakeLists.txt` shape: every target but cuda and rocm
    /// returns before the GPU part, which holds a compiler requirement.
    const TOP: &str = r#"function(check_lto)
    return()
endfunction()
if (NOT VLLM_TARGET_DEVICE STREQUAL "cuda" AND
    NOT VLLM_TARGET_DEVICE STREQUAL "rocm")
    if (VLLM_TARGET_DEVICE STREQUAL "cpu")
        include(cmake/cpu_extension.cmake)
    else()
        return()
    endif()
    return()
endif()
if (VLLM_GPU_LANG STREQUAL "HIP")
    if (CMAKE_CXX_COMPILER_VERSION VERSION_LESS 99)
        message(FATAL_ERROR "LTO is enabled for ROCm build")
    endif()
endif()
"#;

    #[test]
    fn a_return_true_for_the_target_ends_the_file() {
        let c = gxx("12.2.0");
        for (device, lines) in [("cpu", vec![]), ("empty", vec![]), ("cuda", vec![15])] {
            let facts = Facts::for_platform(device, "x86_64", "linux");
            let mut facts = facts;
            for (k, v) in super::facts(device, &c).vars {
                if k.contains("COMPILER") {
                    facts.set(&k, &v);
                }
            }
            let r = check_file("CMakeLists.txt", TOP, &facts, &c);
            let got: Vec<usize> = r.iter().map(|r| r.line).collect();
            assert_eq!(got, lines, "{device}: {r:?}");
        }
        // A return() in a function body, or under a guard not known for
        // this build, does not end the file.
        let unknown = TOP.replace(
            "NOT VLLM_TARGET_DEVICE STREQUAL \"rocm\")",
            "NOT VLLM_TARGET_DEVICE STREQUAL \"rocm\" AND NOT SOME_OPTION)",
        );
        let mut facts = Facts::for_platform("cpu", "x86_64", "linux");
        facts.set("CMAKE_CXX_COMPILER_VERSION", "12.2.0");
        let r = check_file("CMakeLists.txt", &unknown, &facts, &c);
        assert_eq!(r.len(), 1, "{r:?}");
    }

    #[test]
    fn an_unmeasured_compiler_leaves_the_guard_unknown() {
        let r = check("x86_64", &Compilers::default());
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].truth, Truth::Unknown);
        assert!(r[0].compilers.contains("CXX: none found"), "{r:?}");
    }
}
