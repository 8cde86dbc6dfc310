//! Content keys (docs/store.md).
//!
//! A key is the sha256 of the canonical JSON of every input that can change a
//! result: objects with sorted keys, no whitespace. Same inputs, same key; any
//! change, a new key. Keys are shortened to 32 hex digits (128 bits) for paths.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Version of the key schema; bump it when the meaning of a stage's inputs changes.
pub const KEY_SCHEMA: u32 = 1;

/// The canonical JSON text of `value`: object keys sorted at every depth.
pub fn canonical_json<T: Serialize>(value: &T) -> String {
    let v = serde_json::to_value(value).unwrap_or(Value::Null);
    sorted(v).to_string()
}

fn sorted(v: Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> =
                map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// The content key of `inputs`: the first 32 hex digits of the sha256 of its canonical JSON.
pub fn content_key<T: Serialize>(inputs: &T) -> String {
    let digest = Sha256::digest(canonical_json(inputs).as_bytes());
    hex::encode(digest)[..32].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_ignores_key_order_but_not_values() {
        let a = content_key(&json!({"a": 1, "b": {"y": 2, "x": 1}}));
        let b = content_key(&json!({"b": {"x": 1, "y": 2}, "a": 1}));
        let c = content_key(&json!({"b": {"x": 1, "y": 3}, "a": 1}));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), 32);
    }

    #[test]
    fn canonical_json_sorts_nested_objects_but_keeps_array_order() {
        let v = json!({"b": [{"z": 1, "a": 2}, 3], "a": null});
        assert_eq!(canonical_json(&v), r#"{"a":null,"b":[{"a":2,"z":1},3]}"#);
        let swapped = json!({"b": [3, {"z": 1, "a": 2}], "a": null});
        assert_ne!(content_key(&v), content_key(&swapped));
    }

    #[test]
    fn a_key_is_the_first_32_hex_of_the_sha256_of_the_canonical_text() {
        // sha256("{}") = 44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a
        assert_eq!(content_key(&json!({})), "44136fa355b3678a1146ad16f7e8649e");
        assert_ne!(
            content_key(&json!({"a": 1})),
            content_key(&json!({"a": "1"}))
        );
    }
}
