//! Pack records on arbitrary bytes: walking a pack, and decoding a record
//! whose CRC has been fixed up so that the codec decoders behind it are
//! reached with hostile input and hostile declared lengths.
#![no_main]
use cairn_store::id::{PackId, RepoId};
use cairn_store::pack::{self, Decoders, RecordHeader, RECORD_FIXED_LEN};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let p = Path::new("fuzz");
    let repo = RepoId([7; 16]);
    let _ = pack::check_pack_header(p, data, repo);
    let mut whole = pack::encode_pack_header(repo, PackId([9; 16])).to_vec();
    whole.extend_from_slice(data);
    let _ = pack::walk_records(&whole, |_, r| {
        let _ = r.chunks().count();
        Ok(())
    });

    let mut rec = data.to_vec();
    if let Ok(h) = RecordHeader::parse(&rec) {
        if rec.len() >= RECORD_FIXED_LEN {
            let crc = crc32c::crc32c_append(crc32c::crc32c(&rec[..16]), &rec[RECORD_FIXED_LEN..]);
            rec[16..20].copy_from_slice(&crc.to_le_bytes());
            rec.truncate(h.record_len().min(rec.len()));
            let mut out = Vec::new();
            if let Ok(r) = pack::decode_record(p, 0, &rec, &mut Decoders::default(), &mut out) {
                for (id, at, len) in r.chunks() {
                    if let Some(chunk) = out.get(at as usize..(at + len) as usize) {
                        let _ = pack::check_chunk(p, 0, &id, chunk);
                    }
                }
            }
        }
    }
});
