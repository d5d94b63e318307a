//! A whole NBD session on arbitrary client bytes: the handshake's option
//! parser, then the request parser and every command against a small
//! writable memory export and a read-only one. The server must never
//! panic or hang, whatever the client sends.
#![no_main]
use cairn_blockdev::MemDev;
use cairn_nbd::{session_over_bytes, Export};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let exports = [
        Export {
            name: "mem".into(),
            description: "fuzz".into(),
            dev: Arc::new(MemDev::new(1 << 16)),
            read_only: false,
        },
        Export {
            name: "ro".into(),
            description: String::new(),
            dev: Arc::new(MemDev::new(4096)),
            read_only: true,
        },
    ];
    let _ = session_over_bytes(data, &exports, 1);
});
