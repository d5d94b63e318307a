//! Fixed newstyle negotiation: the greeting, then options until the client
//! picks an export (NBD_OPT_GO or NBD_OPT_EXPORT_NAME) or leaves.

use crate::proto::{self, info, opt, rep, tflag, Cursor, Replies, BASE_ALLOCATION};
use crate::Export;
use std::io::{self, Read, Write};

/// Option data longer than this is refused (and drained while it is at
/// most [`DRAIN_LIMIT`]; past that the connection is closed).
const MAX_OPTION_LEN: usize = 64 << 10;
const DRAIN_LIMIT: u64 = 16 << 20;
/// Options in one negotiation before the server gives up on the client.
const MAX_OPTIONS: usize = 4096;
/// The id of `base:allocation` in this server.
pub(crate) const BASE_ALLOCATION_ID: u32 = 1;

/// What the client chose.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Negotiated {
    /// Index of the export.
    pub export: usize,
    /// The headers transmission uses: compact with simple or structured
    /// replies, or extended.
    pub replies: Replies,
    /// `base:allocation` was selected for this export.
    pub base_allocation: bool,
}

/// The transmission flags of `e`: what its device can really do. DF
/// only once replies are chunked, as the spec requires (`replies`: what
/// is negotiated when the flags are sent).
pub(crate) fn transmission_flags(e: &Export, replies: Replies) -> u16 {
    let caps = e.dev.caps();
    let mut f = tflag::HAS_FLAGS;
    if replies.chunked() {
        f |= tflag::SEND_DF;
    }
    if e.is_read_only() {
        f |= tflag::READ_ONLY;
    } else {
        f |= tflag::SEND_FLUSH | tflag::SEND_FUA | tflag::SEND_TRIM | tflag::SEND_WRITE_ZEROES;
        if caps.fast_zero {
            f |= tflag::SEND_FAST_ZERO;
        }
    }
    if caps.rotational {
        f |= tflag::ROTATIONAL;
    }
    // Only the device knows whether connections see each other's writes
    // and whether one flush covers them all (a cache private to each
    // connection would not); every connection of an export shares the
    // one device object, so its word is the whole answer.
    if caps.multi_conn {
        f |= tflag::CAN_MULTI_CONN;
    }
    f
}

fn find(exports: &[Export], name: &str) -> Option<usize> {
    if name.is_empty() {
        return (!exports.is_empty()).then_some(0);
    }
    exports.iter().position(|e| e.name == name)
}

/// TLS as this negotiation stands.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TlsState {
    /// NBD_OPT_STARTTLS is answered.
    pub offered: bool,
    /// Nothing but STARTTLS and ABORT is answered before TLS.
    pub required: bool,
    /// The connection is already under TLS.
    pub active: bool,
}

/// How option haggling ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// An export was chosen: transmission follows.
    Chosen(Negotiated),
    /// The client aborted, asked for an export that does not exist by
    /// NBD_OPT_EXPORT_NAME (the spec's answer to that is closing the
    /// connection), or cannot speak fixed newstyle.
    Leave,
    /// STARTTLS was acknowledged: the TLS handshake comes next, then the
    /// options start again (nothing said before TLS counts).
    StartTls,
}

/// Send the greeting and read the client's flags. `Ok(None)`: a client
/// that cannot do fixed newstyle (the spec has the server close);
/// `Ok(Some(no_zeroes))` otherwise.
pub(crate) fn greet<S: Read + Write>(s: &mut S) -> io::Result<Option<bool>> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&proto::NBD_MAGIC.to_be_bytes());
    out.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&out)?;
    s.flush()?;
    let mut b4 = [0u8; 4];
    s.read_exact(&mut b4)?;
    let client = u32::from_be_bytes(b4);
    if client & !(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES) != 0
        || client & proto::CLIENT_FIXED_NEWSTYLE == 0
    {
        return Ok(None);
    }
    Ok(Some(client & proto::CLIENT_NO_ZEROES != 0))
}

/// Negotiate on `s` without TLS: greeting and options. `Ok(None)`: the
/// client left (see [`Outcome::Leave`]).
pub(crate) fn negotiate<S: Read + Write>(
    s: &mut S,
    exports: &[Export],
    max_request: u32,
) -> io::Result<Option<Negotiated>> {
    let Some(no_zeroes) = greet(s)? else {
        return Ok(None);
    };
    match options(s, exports, max_request, no_zeroes, TlsState::default())? {
        Outcome::Chosen(n) => Ok(Some(n)),
        Outcome::Leave | Outcome::StartTls => Ok(None),
    }
}

/// Answer options until the client picks an export, leaves, or starts TLS.
pub(crate) fn options<S: Read + Write>(
    s: &mut S,
    exports: &[Export],
    max_request: u32,
    no_zeroes: bool,
    tls: TlsState,
) -> io::Result<Outcome> {
    let mut out = Vec::with_capacity(256);
    // Local to this call: after STARTTLS the client negotiates again.
    let mut replies = Replies::Simple;
    // (export name it was set for, selected)
    let mut meta: Option<(String, bool)> = None;
    for _ in 0..MAX_OPTIONS {
        let mut h = [0u8; 16];
        s.read_exact(&mut h)?;
        if proto::be64(&h[0..8]) != proto::IHAVEOPT {
            return Ok(Outcome::Leave);
        }
        let option = proto::be32(&h[8..12]);
        let len = proto::be32(&h[12..16]) as usize;
        out.clear();
        if len > MAX_OPTION_LEN {
            if len as u64 > DRAIN_LIMIT {
                return Ok(Outcome::Leave);
            }
            io::copy(&mut (&mut *s).take(len as u64), &mut io::sink())?;
            proto::option_reply(&mut out, option, rep::ERR_TOO_BIG, b"option too long");
            s.write_all(&out)?;
            s.flush()?;
            continue;
        }
        let mut data = vec![0u8; len];
        s.read_exact(&mut data)?;
        if option == opt::STARTTLS {
            let (reply, msg): (u32, &[u8]) = if !tls.offered {
                (rep::ERR_UNSUP, b"TLS is not offered (cairn serve --tls)")
            } else if tls.active {
                (rep::ERR_INVALID, b"TLS is already on")
            } else if !data.is_empty() {
                (rep::ERR_INVALID, b"STARTTLS takes no data")
            } else {
                (rep::ACK, b"")
            };
            proto::option_reply(&mut out, option, reply, msg);
            s.write_all(&out)?;
            s.flush()?;
            if reply == rep::ACK {
                return Ok(Outcome::StartTls);
            }
            continue;
        }
        if tls.required && !tls.active && option != opt::ABORT {
            if option == opt::EXPORT_NAME {
                // It has no error reply: closing is the only refusal.
                return Ok(Outcome::Leave);
            }
            proto::option_reply(
                &mut out,
                option,
                rep::ERR_TLS_REQD,
                b"this server requires TLS (NBD_OPT_STARTTLS)",
            );
            s.write_all(&out)?;
            s.flush()?;
            continue;
        }
        match option {
            // A client that agreed on extended headers must not use
            // EXPORT_NAME, which cannot say which headers follow; it has
            // no error reply, so closing is the only refusal.
            opt::EXPORT_NAME if replies == Replies::Extended => return Ok(Outcome::Leave),
            opt::EXPORT_NAME => {
                let Some(i) = std::str::from_utf8(&data)
                    .ok()
                    .and_then(|name| find(exports, name))
                else {
                    return Ok(Outcome::Leave);
                };
                let e = &exports[i];
                out.extend_from_slice(&e.dev.size().to_be_bytes());
                out.extend_from_slice(&transmission_flags(e, replies).to_be_bytes());
                if !no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&out)?;
                s.flush()?;
                return Ok(Outcome::Chosen(chosen(i, replies, &meta, exports)));
            }
            opt::ABORT => {
                proto::option_reply(&mut out, option, rep::ACK, &[]);
                // The client may already be gone.
                let _ = s.write_all(&out).and_then(|_| s.flush());
                return Ok(Outcome::Leave);
            }
            opt::LIST => {
                if !data.is_empty() {
                    proto::option_reply(&mut out, option, rep::ERR_INVALID, b"LIST takes no data");
                } else {
                    for e in exports {
                        let mut d = Vec::with_capacity(4 + e.name.len() + e.description.len());
                        d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                        d.extend_from_slice(e.name.as_bytes());
                        d.extend_from_slice(e.description.as_bytes());
                        proto::option_reply(&mut out, option, rep::SERVER, &d);
                    }
                    proto::option_reply(&mut out, option, rep::ACK, &[]);
                }
            }
            opt::INFO | opt::GO => match parse_info_request(&data) {
                None => proto::option_reply(
                    &mut out,
                    option,
                    rep::ERR_INVALID,
                    b"malformed INFO/GO request",
                ),
                Some((name, wanted)) => match find(exports, name) {
                    None => proto::option_reply(
                        &mut out,
                        option,
                        rep::ERR_UNKNOWN,
                        format!("no export named {name:?}").as_bytes(),
                    ),
                    Some(i) => {
                        info_replies(&mut out, option, &exports[i], &wanted, max_request, replies);
                        proto::option_reply(&mut out, option, rep::ACK, &[]);
                        if option == opt::GO {
                            s.write_all(&out)?;
                            s.flush()?;
                            return Ok(Outcome::Chosen(chosen(i, replies, &meta, exports)));
                        }
                    }
                },
            },
            opt::STRUCTURED_REPLY => {
                if !data.is_empty() {
                    proto::option_reply(&mut out, option, rep::ERR_INVALID, b"takes no data");
                } else if replies == Replies::Extended {
                    // The spec's answer: extended headers take precedence
                    // and there is no going back to 20-byte chunks.
                    proto::option_reply(
                        &mut out,
                        option,
                        rep::ERR_EXT_HEADER_REQD,
                        b"extended headers are already on",
                    );
                } else {
                    replies = Replies::Structured;
                    proto::option_reply(&mut out, option, rep::ACK, &[]);
                }
            }
            opt::EXTENDED_HEADERS => {
                if !data.is_empty() {
                    proto::option_reply(&mut out, option, rep::ERR_INVALID, b"takes no data");
                } else {
                    // Implies structured replies, whether or not they were
                    // asked for first; asking twice is harmless.
                    replies = Replies::Extended;
                    proto::option_reply(&mut out, option, rep::ACK, &[]);
                }
            }
            opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
                let set = option == opt::SET_META_CONTEXT;
                match parse_meta_request(&data) {
                    None => proto::option_reply(
                        &mut out,
                        option,
                        rep::ERR_INVALID,
                        b"malformed meta context request",
                    ),
                    Some(_) if set && !replies.chunked() => proto::option_reply(
                        &mut out,
                        option,
                        rep::ERR_INVALID,
                        b"structured replies or extended headers must be negotiated first",
                    ),
                    Some((name, queries)) => {
                        if find(exports, name).is_none() {
                            proto::option_reply(
                                &mut out,
                                option,
                                rep::ERR_UNKNOWN,
                                format!("no export named {name:?}").as_bytes(),
                            );
                        } else {
                            let matched = if set {
                                queries.contains(&BASE_ALLOCATION)
                            } else {
                                queries.is_empty()
                                    || queries
                                        .iter()
                                        .any(|q| *q == BASE_ALLOCATION || *q == "base:")
                            };
                            if matched {
                                let mut d = Vec::new();
                                d.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
                                d.extend_from_slice(BASE_ALLOCATION.as_bytes());
                                proto::option_reply(&mut out, option, rep::META_CONTEXT, &d);
                            }
                            if set {
                                meta = Some((name.to_string(), matched));
                            }
                            proto::option_reply(&mut out, option, rep::ACK, &[]);
                        }
                    }
                }
            }
            _ => proto::option_reply(&mut out, option, rep::ERR_UNSUP, b"unknown option"),
        }
        s.write_all(&out)?;
        s.flush()?;
    }
    Ok(Outcome::Leave)
}

/// Refuse a client the server will not serve: greet it, answer every
/// option with NBD_REP_ERR_POLICY and `why` (clients show the message),
/// and close when it gives up, asks for an export by the old
/// NBD_OPT_EXPORT_NAME (which has no error reply) or sends too much.
pub(crate) fn refuse<S: Read + Write>(s: &mut S, why: &str) -> io::Result<()> {
    if greet(s)?.is_none() {
        return Ok(());
    }
    let mut out = Vec::with_capacity(256);
    for _ in 0..16 {
        let mut h = [0u8; 16];
        s.read_exact(&mut h)?;
        let option = proto::be32(&h[8..12]);
        let len = proto::be32(&h[12..16]);
        if proto::be64(&h[0..8]) != proto::IHAVEOPT
            || len as usize > MAX_OPTION_LEN
            || option == opt::EXPORT_NAME
        {
            return Ok(());
        }
        io::copy(&mut (&mut *s).take(u64::from(len)), &mut io::sink())?;
        out.clear();
        if option == opt::ABORT {
            proto::option_reply(&mut out, option, rep::ACK, &[]);
            return s.write_all(&out);
        }
        proto::option_reply(&mut out, option, rep::ERR_POLICY, why.as_bytes());
        s.write_all(&out)?;
    }
    Ok(())
}

/// Export `i` was chosen: what transmission runs with. `base:allocation`
/// holds only if it was selected for this same export.
fn chosen(
    i: usize,
    replies: Replies,
    meta: &Option<(String, bool)>,
    exports: &[Export],
) -> Negotiated {
    let base_allocation = meta
        .as_ref()
        .is_some_and(|(n, on)| *on && find(exports, n) == Some(i));
    Negotiated {
        export: i,
        replies,
        base_allocation,
    }
}

/// Export name and the NBD_INFO types asked for.
fn parse_info_request(data: &[u8]) -> Option<(&str, Vec<u16>)> {
    let mut c = Cursor::new(data);
    let name = c.string()?;
    let n = c.u16()? as usize;
    let wanted = (0..n).map(|_| c.u16()).collect::<Option<Vec<_>>>()?;
    (c.rest() == 0).then_some((name, wanted))
}

/// Export name and the queries.
fn parse_meta_request(data: &[u8]) -> Option<(&str, Vec<&str>)> {
    let mut c = Cursor::new(data);
    let name = c.string()?;
    let n = c.u32()? as usize;
    if n > 1024 {
        return None;
    }
    let queries = (0..n).map(|_| c.string()).collect::<Option<Vec<_>>>()?;
    (c.rest() == 0).then_some((name, queries))
}

fn info_replies(
    out: &mut Vec<u8>,
    option: u32,
    e: &Export,
    wanted: &[u16],
    max_request: u32,
    replies: Replies,
) {
    let mut d = Vec::with_capacity(12);
    d.extend_from_slice(&info::EXPORT.to_be_bytes());
    d.extend_from_slice(&e.dev.size().to_be_bytes());
    d.extend_from_slice(&transmission_flags(e, replies).to_be_bytes());
    proto::option_reply(out, option, rep::INFO, &d);
    // Block sizes are always sent: clients that did not ask ignore them.
    // The maximum is the largest payload (a read or a write) and stays 32
    // bits under extended headers too, as the spec keeps it; only effect
    // lengths (trim, zeroing, block status) grow to 64 bits.
    let bs = e.dev.block_sizes();
    let minimum = bs.minimum.clamp(1, 64 << 10).next_power_of_two();
    let preferred = bs.preferred.max(minimum).next_power_of_two();
    let maximum = bs.maximum.min(max_request).max(preferred);
    let mut d = Vec::with_capacity(14);
    d.extend_from_slice(&info::BLOCK_SIZE.to_be_bytes());
    d.extend_from_slice(&minimum.to_be_bytes());
    d.extend_from_slice(&preferred.to_be_bytes());
    d.extend_from_slice(&maximum.to_be_bytes());
    proto::option_reply(out, option, rep::INFO, &d);
    if wanted.contains(&info::NAME) {
        let mut d = info::NAME.to_be_bytes().to_vec();
        d.extend_from_slice(e.name.as_bytes());
        proto::option_reply(out, option, rep::INFO, &d);
    }
    if wanted.contains(&info::DESCRIPTION) && !e.description.is_empty() {
        let mut d = info::DESCRIPTION.to_be_bytes().to_vec();
        d.extend_from_slice(e.description.as_bytes());
        proto::option_reply(out, option, rep::INFO, &d);
    }
}
