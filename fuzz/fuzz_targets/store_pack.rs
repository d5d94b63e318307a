//! Pack records on arbitrary bytes: walking a pack, and decoding a record
//! whose CRC has been fixed up so that the codec decoders behind it are
//! reached with hostile input and hostile declared lengths.
#![no_main]
use cairn_store::id::{PackId, RepoId};
use cairn_store::pack::{self, Decoders, RecordHeader, RECORD_HEADER_LEN};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let p = Path::new("fuzz");
    let repo = RepoId([7; 16]);
    let _ = pack::check_pack_header(p, data, repo);
    let mut whole = pack::encode_pack_header(repo, PackId([9; 16])).to_vec();
    whole.extend_from_slice(data);
    let _ = pack::walk_records(&whole, |_, _, _| Ok(()));

    let mut rec = data.to_vec();
    if let Ok(h) = RecordHeader::parse(&rec) {
        if rec.len() >= RECORD_HEADER_LEN {
            let crc = crc32c::crc32c_append(crc32c::crc32c(&rec[..48]), &rec[RECORD_HEADER_LEN..]);
            rec[48..52].copy_from_slice(&crc.to_le_bytes());
            let mut out = Vec::new();
            let _ = pack::decode_record(p, 0, &rec, Some(&h.id), &mut Decoders::default(), &mut out);
        }
    }
});
