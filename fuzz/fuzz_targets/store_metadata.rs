//! The repository's metadata parsers (manifest, index, trash list and
//! removal record bodies, the local record of seen snapshots, the
//! envelope itself) on arbitrary bytes: an error or a value, never a panic
//! or a huge allocation. The body is sealed with a correct checksum first,
//! so the fuzzer reaches the body parsers instead of stopping at the
//! BLAKE3 trailer; the raw bytes also go through the envelope check.
#![no_main]
use cairn_store::internals::{self as meta, IndexFile, Kind};
use cairn_store::Manifest;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let p = Path::new("fuzz");
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 6 {
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
            if let Ok(g) = cairn_store::internals::check_trash_list(p, &sealed, 2) {
                assert!(g.packs.iter().all(|(t, _)| *t < 2));
                assert!(g
                    .index_files
                    .iter()
                    .all(|n| n.len() == 36 && n.ends_with(".idx")));
            }
        }
        3 if which & 0x80 != 0 => {
            // A key file: its JSON, and Argon2id parameters that must be
            // refused (not allocated) when out of bounds. Unwrapping runs
            // the KDF only with parameters the bounds allow, and cheap
            // ones here.
            let sealed = meta::seal(Kind::Key, 1, body);
            if let Ok((_, b)) = meta::open(p, &sealed, Kind::Key, 1) {
                if let Ok(mut k) = serde_json::from_slice::<cairn_store::internals::KeyFile>(b) {
                    if k.params.memory_kib > 64 || k.params.iterations > 1 {
                        k.params.memory_kib = 8;
                        k.params.iterations = 1;
                    }
                    let _ = k.unwrap(cairn_store::RepoId([1; 16]), b"pw");
                }
            }
        }
        4 => {
            let sealed = meta::seal(Kind::Removal, 1, body);
            if let Ok(r) = cairn_store::internals::Removal::decode(p, &sealed, None) {
                assert_eq!(r.encode(None).unwrap(), sealed);
            }
        }
        5 => {
            let sealed = meta::seal(Kind::Seen, 1, body);
            if let Ok(e) = cairn_store::internals::decode_seen(p, &sealed) {
                // Entries are kept sorted and once each: a record that
                // lists them otherwise reads, and is written back sorted.
                let again = cairn_store::internals::encode_seen(&e);
                assert_eq!(cairn_store::internals::decode_seen(p, &again).unwrap(), e);
            }
        }
        _ => {
            let _ = meta::open(p, body, Kind::Manifest, 1);
            let _ = Manifest::decode(p, body);
            let _ = IndexFile::decode(p, body);
        }
    }
});
