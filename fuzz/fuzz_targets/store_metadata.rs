//! The repository's metadata parsers (manifest and index bodies, the
//! envelope itself) on arbitrary bytes: an error or a value, never a panic
//! or a huge allocation. The body is sealed with a correct checksum first,
//! so the fuzzer reaches the body parsers instead of stopping at the
//! BLAKE3 trailer; the raw bytes also go through the envelope check.
#![no_main]
use cairn_store::index::IndexFile;
use cairn_store::manifest::Manifest;
use cairn_store::meta::{self, Kind};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let p = Path::new("fuzz");
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            let sealed = meta::seal(Kind::Manifest, 1, body);
            if let Ok(m) = Manifest::decode(p, &sealed) {
                // What decodes must encode back to the same bytes.
                assert_eq!(m.encode(), sealed);
            }
        }
        1 => {
            let sealed = meta::seal(Kind::Index, 1, body);
            if let Ok(f) = IndexFile::decode(p, &sealed) {
                assert_eq!(f.encode(), sealed);
            }
        }
        _ => {
            let _ = meta::open(p, body, Kind::Manifest, 1);
            let _ = Manifest::decode(p, body);
            let _ = IndexFile::decode(p, body);
        }
    }
});
