//! The first stage of the parallel gunzip: DEFLATE decoded with markers
//! for the unknown window (`cairn_codec::inflate::marker`), against
//! libdeflate inflating the same stream, on text (this workspace's own
//! sources, repeated to 8 MiB) and on binary data.
//!
//! `cargo bench -p cairn-codec --bench marker`

// A benchmark fails loudly on what cannot happen; criterion's macros
// write an undocumented function.
#![allow(clippy::expect_used, missing_docs)]

use cairn_codec::inflate::marker::{Bits, BlockEnd, MarkerDecoder};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::path::Path;

/// Every `.rs` file under `dir`, in name order, concatenated.
fn sources(dir: &Path, out: &mut Vec<u8>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            if let Ok(b) = std::fs::read(&p) {
                out.extend_from_slice(&b);
            }
        }
    }
}

/// Bytes like a disk image's: runs of a few kinds of records.
fn binary(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while v.len() < len {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let n = 64 + (x >> 54) as usize;
        match (x >> 40) % 3 {
            0 => v.extend(std::iter::repeat_n(0u8, n)),
            1 => v.extend((0..n).map(|i| (i as u64 ^ (x >> 20)) as u8 & 0x3f)),
            _ => v.extend((0..n).map(|i| (x >> (i % 56)) as u8)),
        }
    }
    v.truncate(len);
    v
}

fn deflate(data: &[u8]) -> Vec<u8> {
    let mut c = libdeflater::Compressor::new(libdeflater::CompressionLvl::default());
    let mut out = vec![0; c.deflate_compress_bound(data.len())];
    let n = c
        .deflate_compress(data, &mut out)
        .expect("a buffer of the bound holds the stream");
    out.truncate(n);
    out
}

fn bench(c: &mut Criterion) {
    let mut text = Vec::new();
    sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."), &mut text);
    assert!(!text.is_empty(), "no sources found");
    let len = 8 << 20;
    let text: Vec<u8> = text.iter().copied().cycle().take(len).collect();
    for (name, data) in [("text", text), ("binary", binary(len))] {
        let stream = deflate(&data);
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Bytes(data.len() as u64));
        g.sample_size(20);
        let mut dec = MarkerDecoder::default();
        g.bench_function("marker decoder", |b| {
            b.iter(|| {
                dec.clear();
                let mut bits = Bits::new(&stream, 0);
                while let Ok(BlockEnd::More) = dec.block(&mut bits) {}
                assert_eq!(dec.output().len(), data.len());
            })
        });
        let mut d = libdeflater::Decompressor::new();
        let mut out = vec![0; data.len()];
        g.bench_function("libdeflate", |b| {
            b.iter(|| {
                let n = d
                    .deflate_decompress(&stream, &mut out)
                    .expect("the stream inflates");
                assert_eq!(n, data.len());
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
