#![no_main]
//! The PEP 751 lock reader: `wheelhouse::parse_pylock_str` (TOML, then the
//! artifacts the wheelhouse keeps and the hash-pinned requirement lines).
use libfuzzer_sys::fuzz_target;
use oracle_build::stages::lock::pylock as wheelhouse;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(pkgs) = wheelhouse::parse_pylock_str(text, std::path::Path::new("pylock.fuzz.toml")) {
        for p in &pkgs {
            for a in p.wanted() {
                // The file name becomes a file name inside a store entry.
                let f = &a.filename;
                assert!(
                    !f.is_empty() && !f.contains('/') && f != "." && f != "..",
                    "{f:?}"
                );
            }
        }
        let _ = wheelhouse::requirements_text(&pkgs);
    }
});
