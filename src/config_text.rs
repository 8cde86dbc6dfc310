//! Where a field is written in a TOML configuration file (`config.toml`),
//! and the error message that names it: `<file>: line N: field `f`: why`
//! (the callers make it an exit-2 error).
//!
//! One reading for every table of the file (`[[cache]]`, `[[mirror]]`,
//! `[compiler_cache]`): when `toml`'s typed reading fails (a missing field,
//! a value of the wrong type, an integer out of range, `[cache]` written as
//! a table where `[[cache]]` is an array of tables), the error's byte span
//! is looked up in the document's own spans ([`toml::de::DeTable`]) to name
//! the field holding it, e.g. `cache[1].read_timeout`.

use std::ops::Range;

use toml::de::{DeTable, DeValue};

/// The 1-based line of byte offset `at` of `text` (the last line when past its end).
pub fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The path of the innermost field of the TOML document `text` whose key
/// or value holds byte offset `at`, as `table[i].key` (array items by
/// index, tables by name); `None` when no field holds it or `text` is not
/// TOML at all. A table's own span is its header only (`[[cache]]`), so
/// every container is searched, not only the one whose span holds `at`.
pub fn field_at(text: &str, at: usize) -> Option<String> {
    let doc = DeTable::parse(text).ok()?;
    in_table(doc.get_ref(), at)
}

fn holds(span: &Range<usize>, at: usize) -> bool {
    span.start <= at && at < span.end.max(span.start + 1)
}

/// The path below `table` of the field holding `at`.
fn in_table(table: &DeTable<'_>, at: usize) -> Option<String> {
    table.iter().find_map(|(key, value)| {
        let name = key.get_ref().to_string();
        match in_value(value.get_ref(), at) {
            Some(rest) if rest.starts_with('[') => Some(format!("{name}{rest}")),
            Some(rest) => Some(format!("{name}.{rest}")),
            None if holds(&key.span(), at) || holds(&value.span(), at) => Some(name),
            None => None,
        }
    })
}

/// The path below `value` (`[i]...` or `key...`) of the field holding `at`.
fn in_value(value: &DeValue<'_>, at: usize) -> Option<String> {
    match value {
        DeValue::Table(t) => in_table(t, at),
        DeValue::Array(items) => {
            items
                .iter()
                .enumerate()
                .find_map(|(i, item)| match in_value(item.get_ref(), at) {
                    Some(rest) if rest.starts_with('[') => Some(format!("[{i}]{rest}")),
                    Some(rest) => Some(format!("[{i}].{rest}")),
                    None if holds(&item.span(), at) => Some(format!("[{i}]")),
                    None => None,
                })
        }
        _ => None,
    }
}

/// The message for `e`, `toml`'s failure to read the TOML `text` of the
/// file `origin`: `<origin>: line N: field `f`: <message>`, the line and
/// field from the error's span ([`field_at`]; for a document that does not
/// parse, such as one giving a key twice, the key as written; left out
/// when unknown), the
/// message passed through `redact` (a password in a URL) and kept on one
/// line. Callers report it as bad input (exit 2).
pub fn message(
    origin: &str,
    text: &str,
    e: &toml::de::Error,
    redact: impl Fn(&str) -> String,
) -> String {
    let mut at = String::new();
    if let Some(span) = e.span() {
        at.push_str(&format!("line {}: ", line_of(text, span.start)));
        if let Some(field) = field_at(text, span.start) {
            at.push_str(&format!("field `{field}`: "));
        } else if e.message().contains("key")
            && let Some(key) = text.get(span.clone()).map(str::trim)
            && !key.is_empty()
            && key.len() <= 100
            && !key.contains('\n')
        {
            // A document that does not parse (a key given twice) has no
            // spans to name the field by: the key as written, at its line.
            at.push_str(&format!("key `{key}`: "));
        }
    }
    format!("{origin}: {at}{}", redact(&e.message().replace('\n', " ")))
}

/// A timeout as written in a `config.toml` (`[[cache]]`, `[git]`,
/// `[compiler_cache]`): jiff's friendly duration format (`"10s"`,
/// `"500ms"`, `"2m"`, `"1m 30s"`) or ISO 8601 (`"PT10S"`), from 1 ms to
/// 1 hour.
///
/// Errors: the reason in plain words (the caller adds file, field and value).
pub fn parse_duration(text: &str) -> std::result::Result<std::time::Duration, String> {
    let d: jiff::SignedDuration = text
        .trim()
        .parse()
        .map_err(|_| "is not a duration; write it as \"10s\", \"500ms\" or \"2m\"".to_string())?;
    let d = std::time::Duration::try_from(d).map_err(|_| "is negative".to_string())?;
    if d < std::time::Duration::from_millis(1) || d > std::time::Duration::from_secs(3600) {
        return Err("must be from 1ms to 1h".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Raw {
        #[serde(default)]
        cache: Vec<Entry>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Entry {
        name: String,
        #[serde(default)]
        retries: Option<u8>,
    }

    fn message(text: &str) -> String {
        let e = toml::from_str::<Raw>(text).unwrap_err();
        super::message("config.toml", text, &e, str::to_string)
    }

    #[test]
    fn errors_name_the_line_and_the_field() {
        let big =
            "[[cache]]\nname = \"a\"\n\n[[cache]]\nname = \"b\"\nretries = 99999999999999999999\n";
        let m = message(big);
        assert!(
            m.starts_with("config.toml: line 6: field `cache[1].retries`: "),
            "{m}"
        );
        let small = "[[cache]]\nname = \"a\"\nretries = 300\n";
        let m = message(small);
        assert!(m.contains("line 3: field `cache[0].retries`: "), "{m}");
        let table = "[cache]\nname = \"a\"\n";
        let m = message(table);
        assert!(m.contains("line 1: field `cache`: "), "{m}");
        let missing = "[[cache]]\nretries = 1\n";
        let m = message(missing);
        assert!(m.contains("field `cache[0]`") && m.contains("name"), "{m}");
        assert_eq!(field_at("not = [toml", 3), None);
        assert_eq!(line_of("a\nb\nc", 4), 3);
    }
}
