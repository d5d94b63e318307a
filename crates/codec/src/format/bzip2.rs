//! bzip2: PLACEHOLDER being replaced.
#![allow(missing_docs, dead_code)]
use super::{BlockMeta, Unit};
use crate::error::{CodecError, Result};
use crate::input::Input;

pub fn block_size(level: i32) -> usize {
    level.clamp(1, 9) as usize * 100_000 - 1000
}
pub struct Encoder {
    level: i32,
}
impl Encoder {
    pub fn new(level: i32) -> Self {
        Encoder { level }
    }
}
impl super::BlockEncoder for Encoder {
    fn encode(&mut self, src: &[u8], out: &mut Vec<u8>) -> Result<BlockMeta> {
        let start = out.len();
        crate::block::bzip2_compress_stream(self.level, src, out)?;
        Ok(BlockMeta {
            raw_len: src.len() as u64,
            packed_len: (out.len() - start) as u64,
            check: 0,
        })
    }
}
pub struct Splitter {
    input: Input,
}
impl Splitter {
    pub fn new(input: Input) -> Self {
        Splitter { input }
    }
}
impl super::Splitter for Splitter {
    fn next_unit(&mut self, _unit: &mut Unit) -> Result<bool> {
        Err(CodecError::Invalid(
            "bzip2 decoding is not built yet".into(),
        ))
    }
    fn offset(&self) -> u64 {
        self.input.offset()
    }
}
pub struct Decoder;
impl super::UnitDecoder for Decoder {
    fn decode(&mut self, unit: &mut Unit, out: &mut Vec<u8>) -> Result<()> {
        super::pass_plain(unit, out);
        Ok(())
    }
}
