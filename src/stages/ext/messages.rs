//! The `message(STATUS ...)` and `message(WARNING ...)` calls of a tree's
//! CMake files, each with its file, line and text: what the wheel stage
//! traces a configure line back to (`build.json` `kernel_families`,
//! `stages::wheel::families`). The text is the call's arguments after the
//! mode, concatenated as CMake's `message()` joins them, with every
//! `${VAR}`, `$ENV{VAR}` and `$CACHE{VAR}` kept as written: the part CMake
//! fills in at configure time. The tree is only read.

use std::path::Path;

use fs_err as fs;

use super::cmake::calls;
use super::requirement::cmake_files;

/// One `message(<mode> ...)` call of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The CMake file, relative to the checkout.
    pub file: String,
    /// The line the call starts on (1-based).
    pub line: usize,
    /// `STATUS` or `WARNING`.
    pub mode: String,
    /// The text, variable references kept as written (`${FP4_SM120_ARCHS}`).
    pub text: String,
}

impl Message {
    /// `file:line`.
    pub fn at(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }

    /// Whether CMake could print `printed` for this call: the literal parts
    /// of [`Message::text`] in order, each variable reference any text.
    pub fn could_print(&self, printed: &str) -> bool {
        let mut pattern = String::from("^");
        for (literal, var) in pieces(&self.text) {
            pattern.push_str(&regex::escape(literal));
            if var {
                pattern.push_str("(?s:.*)");
            }
        }
        pattern.push('$');
        regex::Regex::new(&pattern).is_ok_and(|re| re.is_match(printed))
    }
}

/// `text` cut at its variable references: (the literal before one, whether
/// a reference follows), the last piece with `false`.
fn pieces(text: &str) -> Vec<(&str, bool)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = var_start(rest) {
        let open = start + rest[start..].find('{').unwrap_or(0);
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(open + i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        out.push((&rest[..start], true));
        rest = &rest[end..];
    }
    out.push((rest, false));
    out
}

/// Where the first `${`, `$ENV{` or `$CACHE{` of `text` starts.
fn var_start(text: &str) -> Option<usize> {
    ["${", "$ENV{", "$CACHE{"]
        .iter()
        .filter_map(|p| text.find(p))
        .min()
}

/// Whether `text` holds a variable reference (a part CMake fills in).
pub fn has_var(text: &str) -> bool {
    var_start(text).is_some()
}

/// The `message(STATUS ...)` and `message(WARNING ...)` calls of the CMake
/// file `rel` with text `text`, in line order (pure).
pub fn of_file(rel: &str, text: &str) -> Vec<Message> {
    calls(text)
        .into_iter()
        .filter(|c| c.name == "message")
        .filter_map(|c| {
            let mode = c.args.first()?;
            if mode != "STATUS" && mode != "WARNING" {
                return None;
            }
            Some(Message {
                file: rel.to_string(),
                line: c.line,
                mode: mode.clone(),
                text: c.args[1..].concat(),
            })
        })
        .collect()
}

/// Every such call of the checkout at `src` (its `CMakeLists.txt` and
/// `*.cmake` files, as the compiler requirement reads them: hidden
/// directories skipped, bounded in size and count), in file and line order.
/// A file that cannot be read is skipped.
pub fn in_tree(src: &Path) -> Vec<Message> {
    let mut out = Vec::new();
    for rel in cmake_files(src) {
        if let Ok(text) = fs::read_to_string(src.join(&rel)) {
            out.extend(of_file(&rel, &text));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_split_over_arguments_is_one_text_and_its_variables_match_anything() {
        // As vLLM's CMakeLists.txt at 5559679229 writes them.
        let text = "if(X)\n  message(STATUS \"Building SM12x NVFP4 for archs: ${FP4_SM120_ARCHS}\")\nelse()\n  message(STATUS \"Not building scaled_mm_c3x_sm120 as CUDA Compiler version is \"\n                 \"not >= 12.8, we recommend upgrading to CUDA 12.8 or \"\n                 \"later if you intend on running FP8 quantized models on \"\n                 \"Blackwell.\")\nendif()\nmessage(FATAL_ERROR \"no\")\nmessage(WARNING \"Disable AVX512-BF16 ISA support, requires gcc/g++ >= 12.3\")\n";
        let m = of_file("CMakeLists.txt", text);
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(m[0].at(), "CMakeLists.txt:2");
        assert!(m[0].could_print("Building SM12x NVFP4 for archs: 12.0a;12.1a"));
        assert!(m[0].could_print("Building SM12x NVFP4 for archs: "));
        assert!(!m[0].could_print("Building SM10x/11x NVFP4/MXFP4 for archs: 10.0a"));
        assert_eq!(m[1].line, 4);
        assert!(m[1].could_print(
            "Not building scaled_mm_c3x_sm120 as CUDA Compiler version is not >= 12.8, we recommend upgrading to CUDA 12.8 or later if you intend on running FP8 quantized models on Blackwell."
        ));
        assert!(!m[1].could_print("Not building scaled_mm_c3x_sm120 as no compatible archs"));
        assert_eq!((m[2].mode.as_str(), m[2].line), ("WARNING", 10));
        assert!(has_var(&m[0].text) && !has_var(&m[1].text));
    }

    #[test]
    fn nested_and_environment_references_are_one_variable_each() {
        let m = Message {
            file: "a.cmake".into(),
            line: 1,
            mode: "STATUS".into(),
            text: "Using ${${dep}_SOURCE_DIR} from $ENV{X} (a+b)".into(),
        };
        assert!(m.could_print("Using /s/cutlass from /e (a+b)"));
        assert!(!m.could_print("Using /s/cutlass from /e (ab)"));
    }
}
