#![no_main]
//! The parity-pin block reader: `pinfile::parse` (CommonMark fences, then
//! `key = value` lines).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(pin) = oracle_build::stages::identity::pin_block::parse(text, "fuzz.md")
    {
        // What parses renders back to a block that parses to the same record.
        let again = oracle_build::stages::identity::pin_block::parse(&pin.render(), "render")
            .expect("a rendered pin block parses");
        assert_eq!(again, pin);
    }
});
