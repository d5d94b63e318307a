//! Shared by the inflate targets: read a parallel inflate's output until
//! it ends (`Some`, the whole output), fails, or passes 64 MiB (a fuzz
//! input may expand hugely).
use cairn_codec::inflate::ParallelInflate;

pub fn drain(p: &mut ParallelInflate) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut piece = Vec::new();
    loop {
        match p.next_piece(&mut piece) {
            Ok(true) => {}
            Ok(false) => return Some(out),
            Err(_) => return None,
        }
        out.extend_from_slice(&piece);
        piece.clear();
        if out.len() > 1 << 26 {
            return None;
        }
    }
}
