//! The repository's metadata parsers (manifest, index and trash list
//! bodies, the envelope itself) on arbitrary bytes: an error or a value, never a panic
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
    match which % 4 {
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
        2 => {
            // A trash list names what to delete: whatever decodes names
            // only index files and packs of the targets.
            let sealed = meta::seal(Kind::Garbage, u32::from(which >> 7) + 1, body);
            if let Ok(g) = cairn_store::repo::check_trash_list(p, &sealed, 2) {
                assert!(g.packs.iter().all(|(t, _)| *t < 2));
                assert!(g
                    .index_files
                    .iter()
                    .all(|n| n.len() == 36 && n.ends_with(".idx")));
            }
        }
        _ => {
            let _ = meta::open(p, body, Kind::Manifest, 1);
            let _ = Manifest::decode(p, body);
            let _ = IndexFile::decode(p, body);
        }
    }
});
