//! Helpers shared by the crate's unit tests.

/// A small deterministic generator (xorshift) for test data.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `n` incompressible bytes from `seed`.
pub(crate) fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    (0..n).map(|_| (rng.next() >> 32) as u8).collect()
}

/// Runs `tool args` with `input` on stdin; `None` (after saying so) when
/// the tool is missing and we are not under CI.
pub(crate) fn run(tool: &str, args: &[&str], input: &[u8]) -> Option<Vec<u8>> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{tool} is required under CI: {e}"
            );
            eprintln!("skipping: {tool} not available ({e})");
            return None;
        }
    };
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{tool} {args:?} failed");
    Some(out.stdout)
}

/// Data with what a disk image has: text-like runs that repeat at
/// distances near and far (so chunks start with back-references into
/// the unknown window), zero runs, and incompressible stretches (stored
/// blocks).
pub(crate) fn image_like(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let words: Vec<Vec<u8>> = (0..300)
        .map(|i| format!("w{}{} ", i * 7919 % 1000, ["ab", "xyz", "q"][i % 3]).into_bytes())
        .collect();
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        match rnd() % 10 {
            0 => v.resize(v.len() + (rnd() % 70_000) as usize, 0),
            1 => {
                let n = (rnd() % 40_000) as usize;
                v.extend((0..n).map(|_| rnd() as u8));
            }
            2 if v.len() > 40_000 => {
                let from = v.len() - 1 - (rnd() % 32_000) as usize;
                let n = (rnd() % 3_000) as usize;
                for k in 0..n {
                    let b = v[from + k % (v.len() - from)];
                    v.push(b);
                }
            }
            _ => {
                for _ in 0..(rnd() % 2_000) {
                    v.extend_from_slice(&words[(rnd() % 300) as usize]);
                }
            }
        }
    }
    v.truncate(len);
    v
}

/// Image-like data (`first_len` bytes, then `rest_len`) and a raw DEFLATE
/// stream of it: the first part as stored blocks, the rest as fixed-code
/// blocks of literals (a stream as zlib's `Z_FIXED` or a simple encoder
/// writes), the last one final; checked against flate2 first.
pub(crate) fn stored_then_fixed(
    first_len: usize,
    rest_len: usize,
    seed: u64,
) -> (Vec<u8>, Vec<u8>) {
    let first = image_like(first_len, seed);
    let rest = image_like(rest_len, seed + 1);
    let stream = encode_stored_then_fixed(&first, &rest);
    let data = [first, rest].concat();
    let mut check = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::DeflateDecoder::new(&stream[..]),
        &mut check,
    )
    .expect("the test's own encoder");
    assert!(check == data, "the test's own encoder");
    (data, stream)
}

fn encode_stored_then_fixed(first: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in first.chunks(60_000) {
        // Each starts at a byte: the header's three zero bits, padding.
        out.push(0);
        let len = piece.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(piece);
    }
    let (mut acc, mut n) = (0u64, 0u32);
    let mut put = |out: &mut Vec<u8>, value: u32, bits: u32| {
        acc |= u64::from(value) << n;
        n += bits;
        while n >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            n -= 8;
        }
    };
    // Huffman codes go out from their first (highest) bit.
    let code = |c: u32, bits: u32| c.reverse_bits() >> (32 - bits);
    let blocks: Vec<&[u8]> = rest.chunks(20_000).collect();
    for (i, block) in blocks.iter().enumerate() {
        put(&mut out, u32::from(i + 1 == blocks.len()), 1);
        put(&mut out, 1, 2);
        for &b in *block {
            match b {
                0..=143 => put(&mut out, code(0x30 + u32::from(b), 8), 8),
                _ => put(&mut out, code(0x190 + u32::from(b) - 144, 9), 9),
            }
        }
        put(&mut out, 0, 7);
    }
    put(&mut out, 0, 7);
    out
}
