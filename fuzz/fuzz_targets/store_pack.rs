//! Pack records on arbitrary bytes: walking a pack (plain and sealed),
//! and decoding a record whose CRC has been fixed up so that the codec
//! decoders behind it are reached with hostile input and hostile declared
//! lengths; and the same record sealed with a key, so that the sealed
//! frame and what it decrypts to are reached too.
#![no_main]
use cairn_store::internals::{self as pack, Crypt, RecordDecoder, RecordHeader, RECORD_FIXED_LEN};
use cairn_store::{PackId, RepoId};
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::{Arc, OnceLock};

fuzz_target!(|data: &[u8]| {
    let p = Path::new("fuzz");
    let repo = RepoId([7; 16]);
    static KEY: OnceLock<Option<Arc<Crypt>>> = OnceLock::new();
    let key = KEY
        .get_or_init(|| Crypt::generate().ok().map(Arc::new))
        .clone();
    let _ = pack::check_pack_header(p, data, repo, false);
    let _ = pack::check_pack_header(p, data, repo, true);
    let mut whole = pack::encode_pack_header(repo, PackId([9; 16]), false).to_vec();
    whole.extend_from_slice(data);
    for crypt in [None, key.as_deref()] {
        let _ = pack::walk_records(&whole, crypt, |_, _, r| {
            let _ = r.chunks().count();
            Ok(())
        });
        let _ = pack::scan_records(&whole, crypt, |_, _, r| {
            let _ = r.chunks().count();
            Ok(())
        });
    }

    let mut rec = data.to_vec();
    if let Ok(h) = RecordHeader::parse(&rec) {
        if rec.len() >= RECORD_FIXED_LEN {
            let crc = crc32c::crc32c_append(crc32c::crc32c(&rec[..16]), &rec[RECORD_FIXED_LEN..]);
            rec[16..20].copy_from_slice(&crc.to_le_bytes());
            rec.truncate(h.record_len().min(rec.len()));
            let mut out = Vec::new();
            let mut dec = RecordDecoder::default();
            if let Ok(r) = dec.decode(p, 0, &rec, &mut out) {
                for (id, at, len) in r.chunks() {
                    if let Some(chunk) = out.get(at as usize..(at + len) as usize) {
                        let _ = pack::check_chunk(None, p, 0, &id, chunk);
                    }
                }
            }
            // The same bytes as the plaintext of a sealed record.
            if let Some(c) = &key {
                let mut sealed = b"CSEA".to_vec();
                sealed.extend_from_slice(&((rec.len() + 16) as u32).to_le_bytes());
                let from = sealed.len() + 12;
                sealed.resize(from, 0);
                sealed.extend_from_slice(&rec);
                let aad: [u8; 8] = sealed[..8].try_into().unwrap_or([0; 8]);
                if c.seal_in_place(&aad, &mut sealed, from).is_ok() {
                    let mut dec = RecordDecoder::new(Some(c.clone()));
                    let _ = dec
                        .decode(p, 0, &sealed, &mut out)
                        .map(|r| r.chunks().count());
                }
            }
        }
    }
});
