//! Shared by the inflate targets: read a parallel inflate's output until
//! it ends, fails, or passes 64 MiB (a fuzz input may expand hugely).
use cairn_codec::inflate::ParallelInflate;

pub fn drain(p: &mut ParallelInflate) {
    let mut piece = Vec::new();
    let mut total = 0usize;
    while let Ok(true) = p.next_piece(&mut piece) {
        total += piece.len();
        piece.clear();
        if total > 1 << 26 {
            break;
        }
    }
}
