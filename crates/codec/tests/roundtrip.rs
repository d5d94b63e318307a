//! Property tests: random data of random sizes around the block size
//! round-trips byte for byte through every block codec and every format.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests fail loudly by design.

use cairn_codec::{decode_all, encode_all, CodecKind, CodecSpec, Format};
use proptest::prelude::*;

/// Data with structure (runs, repeats) and noise, from a seed.
fn data(seed: u64, len: usize, noise: u8) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if (x & 0xff) as u8 <= noise {
            out.push((x >> 8) as u8);
        } else if x & 0x100 != 0 && out.len() > 64 {
            let back = ((x >> 12) as usize % 64) + 1;
            let b = out[out.len() - back];
            out.push(b);
        } else {
            out.push(b'a' + ((x >> 20) % 4) as u8);
        }
    }
    out
}

fn sizes(block: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(block - 1),
        Just(block),
        Just(block + 1),
        Just(3 * block),
        0..6 * block,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn formats_round_trip(
        format in prop::sample::select(Format::ALL.to_vec()),
        block in prop::sample::select(vec![1000usize, 4096, 65_537]),
        seed in any::<u64>(),
        noise in any::<u8>(),
        size_pick in any::<prop::sample::Index>(),
    ) {
        let options = [0, 1, block - 1, block, block + 1, 3 * block, seed as usize % (6 * block)];
        let len = options[size_pick.index(options.len())];
        let input = data(seed, len, noise);
        let packed = encode_all(format, format.default_level(), block, &input).unwrap();
        prop_assert_eq!(Format::detect(&packed), Some(format));
        let back = decode_all(&packed).unwrap();
        prop_assert!(back == input, "{} len {} block {}", format, len, block);
    }

    #[test]
    fn codecs_round_trip(
        kind in prop::sample::select(CodecKind::ALL.to_vec()),
        len in sizes(4096),
        seed in any::<u64>(),
        noise in any::<u8>(),
    ) {
        let input = data(seed, len, noise);
        let mut codec = CodecSpec::default_for(kind).build();
        let mut packed = Vec::new();
        codec.compress(&input, &mut packed).unwrap();
        let mut back = Vec::new();
        codec.decompress(&packed, &mut back, input.len()).unwrap();
        prop_assert!(back == input, "{} len {}", kind, len);
    }

    #[test]
    fn every_level_round_trips(
        format in prop::sample::select(Format::ALL.to_vec()),
        seed in any::<u64>(),
    ) {
        let (lo, hi) = format.level_range();
        let input = data(seed, 20_000, 40);
        let levels: Vec<i32> = match format {
            Format::Zstd => vec![-5, -1, 1, 3, 9, 19],
            Format::Lz4 => [lo, -100, -1].into_iter().chain(1..=hi).collect(),
            _ => (lo..=hi).collect(),
        };
        for level in levels {
            let packed = encode_all(format, level, 8192, &input).unwrap();
            prop_assert!(decode_all(&packed).unwrap() == input, "{} -{}", format, level);
        }
    }
}
