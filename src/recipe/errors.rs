//! Recipe parse errors in plain words.
//!
//! serde-saphyr reports a line and column and a message written for Rust
//! programmers ("invalid u32", "use Option<String>", "set DuplicateKeyPolicy
//! in Options"). [`describe`] turns such an error into
//! `<file>: line N: field `<dotted.path>`: <plain explanation>`, finding the
//! field from the position ([`super::lines::field_at`]).

use serde_saphyr::Error;

use super::lines::{self, FieldAt, Seg};

/// The message for a serde-saphyr error on recipe `text` read from `origin`.
pub fn describe(err: &Error, text: &str, origin: &str) -> String {
    let inner = innermost(err);
    let Some(loc) = inner.location().or_else(|| err.location()) else {
        return format!("{origin}: {}", plain_tail(inner));
    };
    let (line, column) = (loc.line() as usize, loc.column() as usize);
    // The scanner names where the scalar it was reading began, not the
    // line of the tab it then found: name the tab's line.
    if inner.to_string().contains("found a tab")
        && let Some(tab) = text
            .lines()
            .enumerate()
            .skip(line.saturating_sub(1))
            .find(|(_, l)| l.contains('\t'))
            .map(|(i, _)| i + 1)
    {
        return format!("{origin}: line {tab}: a tab character; YAML indents with spaces only");
    }
    let at = lines::field_at(text, line, column);
    let (path, msg) = match at.as_ref().and_then(|a| a.path.first()) {
        Some(Seg::Index(_)) => (
            String::new(),
            "a recipe is a mapping of `key: value` entries (name, source, python, ...), not a list"
                .to_string(),
        ),
        _ => explain(inner, at.as_ref(), text, line),
    };
    if path.is_empty() {
        format!("{origin}: line {line}: {msg}")
    } else {
        format!("{origin}: line {line}: field `{path}`: {msg}")
    }
}

/// The error under snippet and alias wrappers.
fn innermost(err: &Error) -> &Error {
    match err {
        Error::WithSnippet { error, .. } | Error::AliasError { error, .. } => innermost(error),
        other => other,
    }
}

/// The field path to name and the explanation.
fn explain(err: &Error, at: Option<&FieldAt>, text: &str, line: usize) -> (String, String) {
    let path: Vec<Seg> = at.map(|a| a.path.clone()).unwrap_or_default();
    let value = at.map_or("", |a| a.value.as_str());
    let here = lines::render(&path);
    match err {
        Error::SerdeUnknownField {
            field, expected, ..
        } => {
            let path = key_path(at, field);
            let allowed = if expected.is_empty() {
                "this mapping takes no keys".to_string()
            } else {
                format!("allowed keys here: {}", expected.join(", "))
            };
            (
                lines::render(&path),
                format!("unknown key `{field}` ({allowed})"),
            )
        }
        Error::DuplicateMappingKey { key, .. } => {
            let key = key.clone().unwrap_or_else(|| last_key(&path));
            let path = key_path(at, &key);
            let rendered = lines::render(&path);
            let first = lines::locate(text, &rendered)
                .filter(|&l| l < line)
                .map_or(String::new(), |l| format!(" (first at line {l})"));
            (
                rendered,
                format!("`{key}` is given twice in the same mapping{first}; keep one"),
            )
        }
        Error::SerdeMissingField { field, .. } => {
            let mut parent = path.clone();
            if at.is_some_and(|a| a.at_key) {
                parent.pop();
            }
            parent.push(Seg::Key((*field).to_string()));
            (
                lines::render(&parent),
                "is required but missing".to_string(),
            )
        }
        Error::SerdeUnknownVariant {
            variant, expected, ..
        } => (
            here,
            format!("`{variant}` is not one of: {}", expected.join(", ")),
        ),
        Error::NullIntoString { .. } => (
            here,
            "has no value; write one after the colon, or remove the line if the field is optional"
                .to_string(),
        ),
        Error::Unexpected { expected, .. } => (
            here,
            format!(
                "expected {}, found {}",
                plain_expected(expected),
                found_at(value, text, line)
            ),
        ),
        Error::InvalidScalar { ty, .. } => (
            here,
            format!(
                "expected {}, found {}",
                plain_expected(ty),
                found_at(value, text, line)
            ),
        ),
        Error::SerdeInvalidType {
            unexpected,
            expected,
            ..
        }
        | Error::SerdeInvalidValue {
            unexpected,
            expected,
            ..
        } => (
            here,
            format!(
                "expected {}, found {}",
                plain_expected(expected),
                plain_found(unexpected)
            ),
        ),
        Error::SerdeInvalidLength { len, expected, .. } => (
            here,
            format!(
                "has {len} item{}, expected {}",
                if *len == 1 { "" } else { "s" },
                plain_expected(expected)
            ),
        ),
        Error::Budget { .. } => (
            String::new(),
            "the YAML is too large, too deeply nested or expands too many aliases to be a recipe (the parser stopped at its safety limit)".into(),
        ),
        // Messages of our own deserializers (`strict`, the probe) are plain already.
        Error::Message { msg, .. } => (here, msg.clone()),
        Error::Eof { .. }
            if text.lines().all(|l| {
                let l = l.trim();
                l.is_empty() || l.starts_with('#') || l == "---"
            }) =>
        {
            (
                String::new(),
                "the recipe is empty (it needs at least name, source and python)".into(),
            )
        }
        Error::Eof { .. } => (
            String::new(),
            "the file ends in the middle of a value (an unclosed quote or bracket?)".into(),
        ),
        other => (
            String::new(),
            format!("not valid YAML: {}", plain_tail(other)),
        ),
    }
}

/// The path of key `key` at the error's position: the position's own path
/// when it already ends with that key, else that path with `key` added.
fn key_path(at: Option<&FieldAt>, key: &str) -> Vec<Seg> {
    let mut path: Vec<Seg> = at.map(|a| a.path.clone()).unwrap_or_default();
    if path.last() != Some(&Seg::Key(key.to_string())) {
        path.push(Seg::Key(key.to_string()));
    }
    path
}

fn last_key(path: &[Seg]) -> String {
    match path.last() {
        Some(Seg::Key(k)) => k.clone(),
        _ => String::new(),
    }
}

/// [`found`], except that a `[` or `{` opened at 1-based `line` of `text`
/// and never closed anywhere after it (YAML's flow collections) is named as
/// such: `name: [bad` is an unclosed list, most likely meant as text.
fn found_at(value: &str, text: &str, line: usize) -> String {
    let v = value.trim();
    let rest: String = text
        .lines()
        .skip(line.saturating_sub(1))
        .collect::<Vec<_>>()
        .join("\n");
    let after = rest.split_once(':').map_or(rest.as_str(), |(_, r)| r);
    for (open, close, what) in [('[', ']', "list"), ('{', '}', "mapping")] {
        let opened = after.chars().filter(|&c| c == open).count();
        let closed = after.chars().filter(|&c| c == close).count();
        if v.starts_with(open) && opened > closed {
            let first = after.lines().next().unwrap_or("").trim();
            return format!(
                "`{first}`, which YAML reads as the start of a {what} that is never closed with `{close}` (quote the value if it is text: \"{first}\")"
            );
        }
    }
    found(value)
}

/// What the recipe wrote, for "found ...".
fn found(value: &str) -> String {
    match value.trim() {
        "" | "~" | "null" | "Null" | "NULL" => "no value".into(),
        v if v.starts_with('[') => "a list".into(),
        v if v.starts_with('{') => "a mapping".into(),
        v => format!("`{v}`"),
    }
}

/// A serde "expected" description in recipe words (no Rust type names).
fn plain_expected(expected: &str) -> String {
    let e = expected.trim();
    let bare = e
        .strip_prefix("a ")
        .or_else(|| e.strip_prefix("an "))
        .unwrap_or(e);
    match bare {
        "mapping start" | "map" | "mapping" => "a mapping (`key: value` entries)".into(),
        "sequence start" | "sequence" | "seq" => {
            "a list (`[a, b]`, or one `- item` per line)".into()
        }
        "string scalar" | "string" | "str" | "char" | "scalar" => "a text value".into(),
        "boolean" | "bool" => "`true` or `false`".into(),
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a whole number (0 or more)".into(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" | "integer" => "a whole number".into(),
        "f32" | "f64" | "floating point" | "float" | "number" => "a number".into(),
        b if b.starts_with("struct ") => "a mapping (`key: value` entries)".into(),
        b if b.starts_with("enum ") || b == "variant identifier" => {
            "one of the allowed words".into()
        }
        b if b.contains("::") || b.contains('<') => "another kind of value".into(),
        _ => e.to_string(),
    }
}

/// A serde "unexpected" description in recipe words.
fn plain_found(unexpected: &str) -> String {
    let u = unexpected.trim();
    if let Some(s) = u.strip_prefix("string ") {
        return format!("the text {s}");
    }
    for (prefix, what) in [
        ("integer ", "the number "),
        ("floating point ", "the number "),
        ("boolean ", ""),
    ] {
        if let Some(v) = u.strip_prefix(prefix) {
            return format!("{what}{v}");
        }
    }
    match u {
        "sequence" => "a list".into(),
        "map" => "a mapping".into(),
        "unit value" | "null" | "none" | "unit" => "no value".into(),
        other => other.to_string(),
    }
}

/// The library's own message, without its position suffix or Rust advice.
fn plain_tail(err: &Error) -> String {
    let mut s = err.to_string();
    if let Some(i) = s.find(" at line ") {
        s.truncate(i);
    }
    if let Some(i) = s.find("; use ") {
        s.truncate(i);
    }
    if let Some(i) = s.find(", set ") {
        s.truncate(i);
    }
    s.lines().next().unwrap_or("").trim().to_string()
}
