//! The prompts of a smoke case that holds several (`prompts:` or
//! `prompts_file:`, docs/smoke.md): each is generated and compared on its own.

use std::io::Read;
use std::path::PathBuf;

use crate::recipe::{Case, LoadedRecipe};

/// The most bytes of a `prompts_file` read.
pub const MAX_PROMPTS_FILE: u64 = 1 << 20;

/// Where `case.prompts_file` is: relative to the recipe's directory (the
/// working directory for recipes compiled into the binary).
pub fn prompts_file(lr: &LoadedRecipe, case: &Case) -> Option<PathBuf> {
    let f = PathBuf::from(case.prompts_file.as_deref()?);
    Some(if f.is_absolute() {
        f
    } else {
        lr.dir.clone().unwrap_or_default().join(f)
    })
}

/// The prompts of `case`: `None` for a single-prompt case (`prompt` or
/// `prompt_token_ids`), else its `prompts` list or the prompts read from its
/// `prompts_file`: a `.json` file holds a JSON list of strings, a `.yaml` or
/// `.yml` file a YAML list of strings, any other file one prompt per
/// non-blank line (the line's end stripped).
///
/// Errors (text for the report, naming the file): the file is missing,
/// larger than [`MAX_PROMPTS_FILE`], not UTF-8, not a list of strings, empty,
/// or holds an empty prompt.
pub fn case_prompts(lr: &LoadedRecipe, case: &Case) -> Option<Result<Vec<String>, String>> {
    if let Some(list) = &case.prompts {
        return Some(Ok(list.clone()));
    }
    let path = prompts_file(lr, case)?;
    Some(read_prompts(&path))
}

fn read_prompts(path: &std::path::Path) -> Result<Vec<String>, String> {
    let show = path.display();
    let file = std::fs::File::open(path)
        .map_err(|e| format!("prompts_file {show} cannot be read: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_PROMPTS_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("prompts_file {show} cannot be read: {e}"))?;
    if bytes.len() as u64 > MAX_PROMPTS_FILE {
        return Err(format!(
            "prompts_file {show} is larger than {MAX_PROMPTS_FILE} bytes"
        ));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| format!("prompts_file {show} is not UTF-8 text"))?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default();
    let list: Vec<String> = match ext {
        "json" => serde_json::from_str(&text)
            .map_err(|e| format!("prompts_file {show} is not a JSON list of strings ({e})"))?,
        "yaml" | "yml" => serde_saphyr::from_str(&text)
            .map_err(|e| format!("prompts_file {show} is not a YAML list of strings ({e})"))?,
        _ => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
    };
    if list.is_empty() {
        return Err(format!("prompts_file {show} holds no prompt"));
    }
    if let Some(i) = list.iter().position(String::is_empty) {
        return Err(format!("prompts_file {show}: prompt {i} is empty"));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompts_file_is_json_yaml_or_lines() {
        let d = tempfile::tempdir().unwrap();
        let j = d.path().join("p.json");
        std::fs::write(&j, r#"["a b", "c"]"#).unwrap();
        assert_eq!(read_prompts(&j).unwrap(), ["a b", "c"]);
        let y = d.path().join("p.yaml");
        std::fs::write(&y, "- a b\n- \"c: d\"\n").unwrap();
        assert_eq!(read_prompts(&y).unwrap(), ["a b", "c: d"]);
        let t = d.path().join("p.txt");
        std::fs::write(&t, "first one\n\n  second\n").unwrap();
        assert_eq!(read_prompts(&t).unwrap(), ["first one", "  second"]);
        std::fs::write(&t, "\n\n").unwrap();
        assert!(read_prompts(&t).unwrap_err().contains("holds no prompt"));
        std::fs::write(&j, r#"{"a": 1}"#).unwrap();
        assert!(read_prompts(&j).unwrap_err().contains("JSON list"));
        assert!(
            read_prompts(&d.path().join("none"))
                .unwrap_err()
                .contains("cannot be read")
        );
    }
}
