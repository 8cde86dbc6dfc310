//! Kernel families, as the tree's configure reports them (`build.json`
//! `kernel_families`): vLLM's CMake files say, family by family, what they
//! compile, and this reads what they said from the build's log. Nothing of
//! vLLM's arch logic is re-implemented here: a family is built or not
//! because its configure line says so.
//!
//! The lines read (vLLM's `CMakeLists.txt` and `cmake/cpu_extension.cmake`):
//!
//! ```text
//! -- Building SM12x NVFP4 for archs: 12.0a;12.1a             built, its archs
//! -- Not building SM12x NVFP4 as no compatible archs were found.   not built, the reason
//! -- CPU extension (AVX512F) compile flags: -fopenmp;-mavx512f   built, ISA AVX512F, its flags
//! -- CPU extension compile flags: -fopenmp;-march=armv8.2-a   built, its flags
//! CMake Warning at cmake/cpu_extension.cmake:141 (message):
//!   Disable AVX512-BF16 ISA support, requires gcc/g++ >= 12.3   not built, the reason
//! ```
//!
//! Each family is traced to the `message()` call of the checkout that can
//! print its line ([`crate::stages::ext::messages`]); a warning names its
//! own file and line. The parser is pure ([`Reader`], [`parse`]).

use std::io::{BufRead, Read};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::stages::ext::messages::{self, Message};

/// One kernel family the tree's configure reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelFamily {
    /// The family as the configure names it (`SM12x NVFP4`, `Marlin
    /// kernels`, `CPU extension (AVX512F)`, `AVX512-BF16 ISA`).
    pub name: String,
    /// Whether the configure builds it.
    pub built: bool,
    /// What it is built for: the CUDA archs of its line (`12.0a`, `12.1a`),
    /// or the ISA a CPU extension's line names (`AVX512F`, `BF16`); empty
    /// when not built or none is named.
    #[serde(default)]
    pub archs: Vec<String>,
    /// Why it is not built, as the configure says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A CPU extension's compile flags, as its line lists them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    /// The configure's line (without CMake's `-- `).
    pub line: String,
    /// The `message()` calls of the checkout that can print that line
    /// (`CMakeLists.txt:981`; several when more than one can), or the file
    /// and line a warning names; empty when none can be found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub declared: Vec<String>,
}

impl KernelFamily {
    /// One line: `SM12x NVFP4: built for 12.0a;12.1a (CMakeLists.txt:981)`
    /// or `...: not built: <reason> (...)`.
    pub fn describe(&self) -> String {
        let what = if self.built {
            if self.archs.is_empty() {
                "built".to_string()
            } else {
                format!("built for {}", self.archs.join(";"))
            }
        } else {
            format!(
                "not built: {}",
                self.reason.as_deref().unwrap_or("(no reason given)")
            )
        };
        let at = if self.declared.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.declared.join(", "))
        };
        format!("{}: {what}{at}", self.name)
    }
}

/// The family a configure line (without `-- `) reports, if it has one of
/// the shapes above; `declared` left empty.
pub fn family_of(text: &str) -> Option<KernelFamily> {
    let text = text.trim();
    let family = |name: &str, built: bool| KernelFamily {
        name: name.trim().to_string(),
        built,
        archs: Vec::new(),
        reason: None,
        flags: Vec::new(),
        line: text.to_string(),
        declared: Vec::new(),
    };
    if let Some(rest) = text.strip_prefix("Building ")
        && let Some((name, archs)) = rest.split_once(" for archs:")
        && !name.trim().is_empty()
    {
        let mut f = family(name, true);
        f.archs = list(archs);
        return Some(f);
    }
    if let Some(rest) = text.strip_prefix("Not building ")
        && let Some((name, reason)) = rest.split_once(" as ")
        && !name.trim().is_empty()
    {
        let mut f = family(name, false);
        f.reason = Some(reason.trim().trim_end_matches('.').to_string());
        return Some(f);
    }
    if let Some(rest) = text.strip_prefix("CPU extension")
        && let Some((isa, flags)) = rest.split_once("compile flags:")
    {
        let isa = isa.trim();
        let name = if isa.is_empty() {
            "CPU extension".to_string()
        } else {
            format!("CPU extension {isa}")
        };
        let mut f = family(&name, true);
        if let Some(inner) = isa.strip_prefix('(').and_then(|i| i.strip_suffix(')')) {
            f.archs = inner
                .split('+')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .collect();
        }
        f.flags = list(flags);
        return Some(f);
    }
    if let Some(rest) = text.strip_prefix("Disable ")
        && let Some((isa, reason)) = rest.split_once(" support,")
        && isa.ends_with(" ISA")
    {
        let mut f = family(isa, false);
        f.reason = Some(reason.trim().trim_end_matches('.').to_string());
        return Some(f);
    }
    None
}

/// A CMake list as printed (`12.0a;12.1a`, `-fopenmp;-mavx2`), empty items dropped.
fn list(text: &str) -> Vec<String> {
    text.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Reads a configure's output line by line ([`Reader::line`]) and gives the
/// families it reported ([`Reader::finish`]), in the order printed.
#[derive(Debug, Default)]
pub struct Reader {
    out: Vec<KernelFamily>,
    /// An open `CMake Warning at <file>:<line> (message):` block: where, and its text so far.
    warning: Option<(String, String)>,
}

impl Reader {
    /// Takes one line of the log (no line break).
    pub fn line(&mut self, line: &str) {
        if let Some((at, text)) = &mut self.warning {
            // CMake indents the text by two spaces and ends it with a
            // blank line or its call stack.
            if let Some(more) = line.strip_prefix("  ")
                && !line.trim().is_empty()
            {
                if !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(more.trim());
                return;
            }
            let (at, text) = (at.clone(), text.clone());
            self.warning = None;
            if let Some(mut f) = family_of(&text) {
                f.declared = vec![at];
                self.out.push(f);
            }
        }
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("CMake Warning at ")
            && let Some(at) = rest.strip_suffix(" (message):")
        {
            self.warning = Some((at.to_string(), String::new()));
            return;
        }
        if let Some(text) = trimmed.strip_prefix("-- ")
            && let Some(f) = family_of(text)
        {
            self.out.push(f);
        }
    }

    /// The families read.
    pub fn finish(mut self) -> Vec<KernelFamily> {
        self.line("");
        self.out
    }
}

/// The families of the configure output `log` (pure; see [`Reader`]).
pub fn parse(log: &str) -> Vec<KernelFamily> {
    let mut r = Reader::default();
    for l in log.lines() {
        r.line(l);
    }
    r.finish()
}

/// The families of the log file at `path`, read line by line (its size
/// does not matter); `None` when it cannot be opened.
pub fn read_log(path: &Path) -> Option<Vec<KernelFamily>> {
    let file = std::fs::File::open(path).ok()?;
    let mut r = Reader::default();
    let mut reader = std::io::BufReader::new(file);
    let mut buf = Vec::new();
    // A line is bounded: a longer one is read in pieces of this size.
    const MAX_LINE: u64 = 1 << 20;
    loop {
        buf.clear();
        match Read::by_ref(&mut reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) | Err(_) => break,
            Ok(_) => r.line(String::from_utf8_lossy(&buf).trim_end_matches(['\n', '\r'])),
        }
    }
    Some(r.finish())
}

/// Each STATUS family without a place gets the `message(STATUS ...)` calls
/// of `messages` that can print its line.
pub fn trace(families: &mut [KernelFamily], messages: &[Message]) {
    for f in families.iter_mut().filter(|f| f.declared.is_empty()) {
        f.declared = messages
            .iter()
            .filter(|m| m.mode == "STATUS" && m.could_print(&f.line))
            .map(Message::at)
            .collect();
    }
}

/// The family names the tree's `messages` can report (each message's text
/// read as a configure line, variables kept), and whether one of them names
/// its family through a variable (then any name may be reported).
pub fn known_names(messages: &[Message]) -> (Vec<String>, bool) {
    let mut names = Vec::new();
    let mut any = false;
    for m in messages {
        if let Some(f) = family_of(&m.text) {
            if messages::has_var(&f.name) {
                any = true;
            } else if !names.contains(&f.name) {
                names.push(f.name);
            }
        }
    }
    (names, any)
}

/// What is wrong with each family of `expected` given the families a build
/// recorded (`None`: not recorded): one line per family not built, naming
/// it, the tree's reason and where it says so; empty when all are built.
pub fn unmet(expected: &[String], recorded: Option<&[KernelFamily]>) -> Vec<String> {
    let Some(families) = recorded else {
        return expected
            .iter()
            .map(|e| format!("{e}: the build recorded no kernel families"))
            .collect();
    };
    let mut out = Vec::new();
    for e in expected {
        let same: Vec<&KernelFamily> = families.iter().filter(|f| &f.name == e).collect();
        if same.iter().any(|f| f.built) {
            continue;
        }
        if same.is_empty() {
            let said: Vec<&str> = families.iter().map(|f| f.name.as_str()).collect();
            out.push(format!(
                "{e}: the tree's configure did not report it (it reported: {})",
                if said.is_empty() {
                    "no family".to_string()
                } else {
                    said.join(", ")
                }
            ));
        } else {
            out.push(
                same.iter()
                    .map(|f| f.describe())
                    .collect::<Vec<_>>()
                    .join("; "),
            );
        }
    }
    out
}

/// The names of `families` that are built, in order, each once.
pub fn built_names(families: &[KernelFamily]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for f in families.iter().filter(|f| f.built) {
        if !out.contains(&f.name) {
            out.push(f.name.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as vLLM's configure prints them (CMakeLists.txt and
    /// cmake/cpu_extension.cmake at 5559679229, and CMake's warning block).
    const LOG: &str = "\
$ uv build --wheel --no-build-isolation
-- Target device: cuda
-- CUDA target architectures: 12.1a
-- Building Marlin kernels for archs: 8.0;8.6;8.7;8.9;9.0;10.0;12.0;12.1
-- Not building Machete kernels as no compatible archs found in CUDA target architectures
-- Not building scaled_mm_c3x_sm120 as CUDA Compiler version is not >= 12.8, we recommend upgrading to CUDA 12.8 or later if you intend on running FP8 quantized models on Blackwell.
-- Building SM12x NVFP4 for archs: 12.1a
-- Not building SM10x/11x NVFP4/MXFP4 as no compatible archs were found.
-- Building mxfp4_experts_quant unsupported stubs because CUDA compiler version is not >= 12.9 (found 12.8).
-- Building hadacore
CMake Warning at cmake/cpu_extension.cmake:141 (message):
  Disable AVX512-BF16 ISA support, no avx512_bf16 found in local CPU flags.
  If cross-compilation is required, please set env VLLM_CPU_AVX512BF16=1.
Call Stack (most recent call first):
  CMakeLists.txt:204 (include)


-- CPU extension (AVX512F + BF16 + VNNI + AMX) compile flags: -fopenmp;-DVLLM_CPU_EXTENSION;-mf16c;-mavx512f;-mamx-bf16
-- CPU extension compile flags: -fopenmp;-DVLLM_CPU_EXTENSION;-march=armv8.2-a+bf16+dotprod+fp16
-- Configuring done
";

    #[test]
    fn the_configure_lines_give_each_family_built_or_not_with_archs_and_reason() {
        let f = parse(LOG);
        let names: Vec<&str> = f.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "Marlin kernels",
                "Machete kernels",
                "scaled_mm_c3x_sm120",
                "SM12x NVFP4",
                "SM10x/11x NVFP4/MXFP4",
                "AVX512-BF16 ISA",
                "CPU extension (AVX512F + BF16 + VNNI + AMX)",
                "CPU extension",
            ]
        );
        assert!(f[0].built);
        assert_eq!(f[0].archs.len(), 8);
        assert_eq!(f[0].archs[7], "12.1");
        assert!(!f[1].built && f[1].archs.is_empty());
        assert_eq!(
            f[1].reason.as_deref(),
            Some("no compatible archs found in CUDA target architectures")
        );
        assert!(
            f[2].reason
                .as_deref()
                .unwrap()
                .starts_with("CUDA Compiler version is not >= 12.8, we recommend")
        );
        assert_eq!(
            (f[3].built, f[3].archs.as_slice()),
            (true, &["12.1a".to_string()][..])
        );
        assert_eq!(
            f[4].reason.as_deref(),
            Some("no compatible archs were found")
        );
        assert!(!f[5].built);
        assert_eq!(
            f[5].reason.as_deref(),
            Some(
                "no avx512_bf16 found in local CPU flags. If cross-compilation is required, please set env VLLM_CPU_AVX512BF16=1"
            )
        );
        assert_eq!(f[5].declared, ["cmake/cpu_extension.cmake:141"]);
        assert_eq!(f[6].archs, ["AVX512F", "BF16", "VNNI", "AMX"]);
        assert_eq!(f[6].flags[4], "-mamx-bf16");
        assert!(f[7].built && f[7].archs.is_empty());
        assert_eq!(f[7].flags[2], "-march=armv8.2-a+bf16+dotprod+fp16");
        assert!(parse("-- Configuring done\n-- Generating done\n").is_empty());
    }

    #[test]
    fn a_family_is_traced_to_the_message_that_prints_it() {
        let cmake = "message(STATUS \"Building SM12x NVFP4 for archs: ${FP4_SM120_ARCHS}\")\nmessage(STATUS \"Not building SM12x NVFP4 as no compatible archs were found.\")\nmessage(STATUS \"Building grouped_mm_c3x for archs: ${SCALED_MM_ARCHS}\")\nmessage(STATUS \"Building grouped_mm_c3x for archs: ${SCALED_MM_ARCHS}\")\n";
        let msgs = crate::stages::ext::messages::of_file("CMakeLists.txt", cmake);
        let mut f = parse(
            "-- Building SM12x NVFP4 for archs: 12.0a\n-- Building grouped_mm_c3x for archs: 9.0a\n-- Building Foo for archs: 1\n",
        );
        trace(&mut f, &msgs);
        assert_eq!(f[0].declared, ["CMakeLists.txt:1"]);
        assert_eq!(f[1].declared, ["CMakeLists.txt:3", "CMakeLists.txt:4"]);
        assert!(f[2].declared.is_empty());
        assert!(
            f[0].describe()
                .ends_with("built for 12.0a (CMakeLists.txt:1)")
        );
        let (names, any) = known_names(&msgs);
        assert_eq!(names, ["SM12x NVFP4", "grouped_mm_c3x"]);
        assert!(!any);
    }

    #[test]
    fn an_expected_family_not_built_names_the_reason_and_one_not_reported_the_others() {
        let f = parse(LOG);
        assert!(unmet(&["SM12x NVFP4".into(), "Marlin kernels".into()], Some(&f)).is_empty());
        let u = unmet(&["Machete kernels".into(), "SM12X NVFP4".into()], Some(&f));
        assert_eq!(u.len(), 2);
        assert_eq!(
            u[0],
            "Machete kernels: not built: no compatible archs found in CUDA target architectures"
        );
        assert!(
            u[1].starts_with(
                "SM12X NVFP4: the tree's configure did not report it (it reported: Marlin kernels, "
            ),
            "{}",
            u[1]
        );
        assert_eq!(
            unmet(&["SM12x NVFP4".into()], None),
            ["SM12x NVFP4: the build recorded no kernel families"]
        );
        assert_eq!(built_names(&f)[..2], ["Marlin kernels", "SM12x NVFP4"]);
    }
}
