#![no_main]
//! The recipe YAML reader: `recipe::parse` (serde-saphyr, then validation and
//! the error messages that point at a line and field).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = oracle_build::recipe::parse(text, "fuzz.yaml");
    }
});
