#![no_main]
//! The CMake reader of the ext stage: `stages::ext::parse` (FetchContent_Declare,
//! FetchContent_Populate, ExternalProject_Add and set() calls). The input is
//! split at NUL bytes into several files, as a tree has several CMake files.
use libfuzzer_sys::fuzz_target;
use oracle_build::stages::ext;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let files: Vec<(String, String)> = text
        .split('\0')
        .enumerate()
        .map(|(i, t)| (format!("cmake/f{i}.cmake"), t.to_string()))
        .collect();
    let d = ext::parse(&files);
    for s in &d.sources {
        // The entry name becomes a directory name in the store.
        let name = s.entry_name();
        assert!(
            !name.contains('/') && !name.starts_with('.') && name != "..",
            "{name:?}"
        );
        let _ = ext::describe(&s.origin);
    }
});
