//! The gzip checkpoint index parser (`cairn unpack --index`) on arbitrary
//! bytes, with the CRC made right so that mutations reach the structure:
//! an error or an index that writes back the same, never a panic. An index
//! that parses is then used to read a fixed valid DEFLATE stream: the
//! output is the stream's or an error, and never wrong bytes with the
//! right CRC; and a range of it read with each index, which must not
//! panic.
#![no_main]
use cairn_codec::format::gzip_range::{read_range, ByteRange};
use cairn_codec::inflate::ParallelInflate;
use cairn_codec::input::SharedBytes;
use cairn_codec::{CodecKind, CodecSpec, GzipIndex};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

#[path = "drain.rs"]
mod drain;

/// Three chunks' worth (1 MiB each, an index's smallest) of DEFLATE and
/// the data it holds.
fn stream() -> &'static (Vec<u8>, Vec<u8>) {
    static S: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    S.get_or_init(|| {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<u8> = (0..4_000_000u32)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if (i / 50_000) % 3 == 0 {
                    b"cairn fuzz "[(i % 11) as usize]
                } else {
                    (x % 40) as u8 + b'0'
                }
            })
            .collect();
        let mut z = Vec::new();
        CodecSpec::default_for(CodecKind::Deflate)
            .build()
            .compress(&data, &mut z)
            .expect("deflate of memory");
        (data, z)
    })
}

/// `z` as a gzip member (a 10-byte header, no name) holding `data`.
fn gzip_member(z: &[u8], data: &[u8]) -> Vec<u8> {
    let mut gz = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];
    gz.extend_from_slice(z);
    gz.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    gz.extend_from_slice(&(data.len() as u32).to_le_bytes());
    gz
}

fuzz_target!(|input: &[u8]| {
    let mut bytes = input.to_vec();
    if bytes.len() >= 4 {
        let n = bytes.len() - 4;
        let crc = crc32c::crc32c(&bytes[..n]);
        bytes[n..].copy_from_slice(&crc.to_le_bytes());
    }
    let Ok(index) = GzipIndex::decode(&bytes) else {
        return;
    };
    assert_eq!(GzipIndex::decode(&index.encode()).ok(), Some(index.clone()));
    let (data, z) = stream();
    // A range read trusts the windows (docs/format/gzip-index.md), so any
    // output may come back; what may not is a panic or a hang. The stream
    // is framed as a gzip member whose DEFLATE data starts at 10.
    let gz = gzip_member(z, data);
    let mut trusted = GzipIndex::new(gz.len() as u64);
    if let Some((_, m)) = index.members.iter().next() {
        trusted.members.insert(10, m.clone());
    }
    let start = index.input_len % (data.len() as u64 + 10);
    let range = ByteRange {
        start,
        end: Some(start + 70_000),
    };
    let _ = read_range(&SharedBytes::from_vec(gz), Some(&trusted), range, 1, |_| {
        Ok::<(), cairn_codec::CodecError>(())
    });
    for (_, member) in index.members.into_iter().take(2) {
        let mut p = ParallelInflate::with_index(SharedBytes::from_vec(z.clone()), 2, member);
        if let Some(out) = drain::drain(&mut p) {
            let (_, crc, size) = p.finish();
            if crc == crc32fast::hash(data) && size == data.len() as u64 {
                assert!(out == *data, "wrong output with the right CRC");
            }
        }
    }
});
