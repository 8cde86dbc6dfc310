#![no_main]
//! The CUDA fat-binary reader: `fatbin::read_elf` on an input that starts
//! like an ELF file, else `fatbin::read_section` on it as the bytes of a
//! `.nv_fatbin` section. Never a panic; what reads is consistent.
use libfuzzer_sys::fuzz_target;
use oracle_build::stages::identity::fatbin::{self, EntryKind, LOADABLE};

fuzz_target!(|data: &[u8]| {
    if data.starts_with(b"\x7fELF") {
        let k = fatbin::read_elf(data);
        if k.error.is_some() {
            assert!(k.cubins.is_empty() && k.ptx.is_empty() && k.entries.is_empty());
        }
        for a in &k.cubins {
            assert!(k.entries.iter().any(|e| e.section == LOADABLE
                && e.kind == EntryKind::Cubin
                && e.arch == *a));
        }
        let _ = k.describe();
    } else if let Ok(entries) = fatbin::read_section(data, LOADABLE) {
        for e in &entries {
            assert_eq!(e.arch.virtual_arch, e.kind == EntryKind::Ptx);
            assert!(e.stored_bytes <= data.len() as u64);
            // What is read names itself the same way again.
            let name = e.arch.to_string();
            assert_eq!(name.parse::<fatbin::Arch>().unwrap(), e.arch);
        }
    }
});
