#![no_main]
//! The wheel RECORD reader: `dist_record::parse` (CSV rows of path, hash, size).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(rows) = oracle_build::stages::identity::record::parse(text)
    {
        for r in &rows {
            assert!(!r.path.is_empty());
        }
    }
});
