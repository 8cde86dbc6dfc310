#![no_main]
//! The bundle checks of `import`, on raw bytes: `store::bundle::check_archive`.
//! An input that starts with the gzip magic is read as is; any other input is
//! taken as the tar inside and gzip-compressed first, so mutations reach the
//! tar reader and the manifest instead of breaking the deflate stream.
use std::io::Write;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let gz = if data.starts_with(&[0x1f, 0x8b]) {
        data.to_vec()
    } else {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("writing to a Vec");
        e.finish().expect("writing to a Vec")
    };
    let _ = oracle_build::store::bundle::check_archive(&gz[..]);
});
