//! The S3 backend against a real SeaweedFS (cairn-testkit): the backend
//! conformance check, concurrent ranged reads, multipart uploads, racing
//! conditional creates, leases (refreshed, expired, broken, taken over by
//! one of many), and a server that stops mid-work.
//!
//! Skipped with a `skipped:` line where `weed` is missing, a failure under
//! `CI=true`.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use cairn_store::backend::{conformance, Key, Liveness, ReadBackend, WriteBackend};
use cairn_store::StoreError;
use cairn_store::{S3Backend, S3Config};
use cairn_testkit::SeaweedFs;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A backend on `fs` under `prefix`, with `extra` environment.
fn backend(fs: &SeaweedFs, prefix: &str, extra: &[(&str, &str)]) -> S3Backend {
    let mut env: HashMap<String, String> = fs.env().into_iter().collect();
    for (k, v) in extra {
        env.insert(k.to_string(), v.to_string());
    }
    let config = S3Config::new(&fs.url(prefix), &|k| env.get(k).cloned()).unwrap();
    S3Backend::new(config).unwrap()
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

#[test]
fn seaweedfs_passes_the_backend_conformance_check() {
    let Some(fs) = SeaweedFs::start_or_skip() else {
        return;
    };
    // At the bucket's root and under a prefix.
    conformance(&backend(&fs, "", &[])).unwrap();
    let b = backend(&fs, "some/repo", &[]);
    conformance(&b).unwrap();
    // A child's listing is relative to it, and sees only its folder.
    b.put(&Key::new("data/packs/aa/1.pack"), b"x").unwrap();
    b.put(&Key::new("data-not/2"), b"y").unwrap();
    let c = b.child("data");
    let keys: Vec<String> = c
        .list("")
        .unwrap()
        .into_iter()
        .map(|l| l.key.to_string())
        .collect();
    assert_eq!(keys, ["packs/aa/1.pack"]);
    // A prefix that is not a whole folder filters names.
    let mut keys: Vec<String> = b
        .list("data")
        .unwrap()
        .into_iter()
        .map(|l| l.key.to_string())
        .collect();
    keys.sort();
    assert_eq!(keys, ["data-not/2", "data/packs/aa/1.pack"]);
    // A missing object is NotFound, named by its URL.
    let mut buf = [0u8; 4];
    match b.read_at(&Key::new("nothing/here"), 0, &mut buf) {
        Err(StoreError::Io { path, source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            assert_eq!(
                path.to_str().unwrap(),
                format!("s3://{}/some/repo/nothing/here", fs.bucket())
            );
        }
        other => panic!("{other:?}"),
    }
    // A read wholly past the end is damage too.
    match b.read_at(&Key::new("data-not/2"), 5, &mut buf) {
        Err(StoreError::Corrupt { .. }) => {}
        other => panic!("{other:?}"),
    }
    // Many deletions at once.
    let many: Vec<Key> = (0..100).map(|i| Key::new(format!("bulk/{i:03}"))).collect();
    for k in &many {
        b.put(k, b"z").unwrap();
    }
    assert_eq!(b.list("bulk/").unwrap().len(), 100);
    b.delete(&many).unwrap();
    assert!(b.list("bulk/").unwrap().is_empty());
    // The bucket holds nothing the check made, but these two.
    let left = backend(&fs, "", &[]).list("").unwrap();
    assert_eq!(left.len(), 2, "{left:?}");
}

#[test]
fn many_threads_read_ranges_at_once() {
    let Some(fs) = SeaweedFs::start_or_skip() else {
        return;
    };
    let b = Arc::new(backend(&fs, "reads", &[]));
    let data = Arc::new(pattern(12 << 20, 7));
    let key = Key::new("packs/cd/big.pack");
    b.put(&key, &data).unwrap();
    let t = Instant::now();
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let (b, data, key) = (b.clone(), data.clone(), key.clone());
            std::thread::spawn(move || {
                let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                for _ in 0..40 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let len = 1 + (x % (256 << 10)) as usize;
                    let off = ((x >> 20) % (data.len() - len) as u64) as usize;
                    let mut buf = vec![0u8; len];
                    b.read_at(&key, off as u64, &mut buf).unwrap();
                    assert!(buf == data[off..off + len], "bytes {off}+{len} differ");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    eprintln!(
        "16 threads x 40 ranged reads in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    // Called from inside another tokio runtime (the backend's own cannot
    // block there): still works.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let got = rt.block_on(async { b.read_prefix(&key, 1000) }).unwrap();
    assert!(got == data[..1000]);
}

#[test]
fn big_objects_go_up_in_parts_and_discarded_ones_leave_nothing() {
    let Some(fs) = SeaweedFs::start_or_skip() else {
        return;
    };
    let b = backend(&fs, "parts", &[]);
    let data = pattern(40 << 20, 3);
    let key = Key::new("packs/ef/multi.pack");
    let mut w = b.create(&key).unwrap();
    for part in data.chunks(3_000_017) {
        w.append(part).unwrap();
    }
    // Nothing is visible before finish.
    assert_eq!(b.get(&key).unwrap(), None);
    w.finish().unwrap();
    assert!(b.get(&key).unwrap().unwrap() == data);
    let mut buf = vec![0u8; 1 << 20];
    b.read_at(&key, 33 << 20, &mut buf).unwrap();
    assert!(buf[..] == data[33 << 20..34 << 20]);
    // A big object discarded, and one dropped unfinished.
    for discard in [true, false] {
        let k = Key::new(format!("packs/ef/gone-{discard}.pack"));
        let mut w = b.create(&k).unwrap();
        w.append(&data[..30 << 20]).unwrap();
        if discard {
            w.discard();
        } else {
            drop(w);
        }
        assert_eq!(b.get(&k).unwrap(), None);
    }
    let listed = b.list("packs/").unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].len, data.len() as u64);
}

#[test]
fn one_of_many_racing_creates_wins() {
    let Some(fs) = SeaweedFs::start_or_skip() else {
        return;
    };
    let b = Arc::new(backend(&fs, "race", &[]));
    // SeaweedFS answers racing conditional PUTs of one key one a second
    // (the losers wait on the server, up to N-1 s; no client retries):
    // eight callers, three rounds.
    for round in 0..3 {
        let t = Instant::now();
        let key = Key::new(format!("locks/{round}"));
        let threads: Vec<_> = (0..8u8)
            .map(|i| {
                let (b, key) = (b.clone(), key.clone());
                std::thread::spawn(move || b.put_new(&key, &[i]).unwrap().then_some(i))
            })
            .collect();
        let winners: Vec<u8> = threads
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        assert_eq!(b.get(&key).unwrap().unwrap(), winners);
        eprintln!("round {round}: {:.2} s", t.elapsed().as_secs_f64());
    }
    // A create refused by an object holding exactly the bytes sent is
    // the caller's own (a retry after a first try that landed, its
    // answer lost); other bytes there, and it lost.
    let key = Key::new("locks/again");
    assert!(b.put_new(&key, b"mine").unwrap());
    assert!(b.put_new(&key, b"mine").unwrap());
    assert!(!b.put_new(&key, b"theirs").unwrap());
    assert_eq!(b.get(&key).unwrap().as_deref(), Some(&b"mine"[..]));
}

#[test]
fn held_objects_are_refreshed_and_dead_ones_expire() {
    let Some(fs) = SeaweedFs::start_or_skip() else {
        return;
    };
    let b = backend(&fs, "lease", &[]).with_timing(Duration::from_secs(1), Duration::from_secs(4));
    let key = Key::new("sessions/a");
    let h = b.hold(&key, b"me").unwrap();
    // Past several leases, refreshed all along.
    for _ in 0..4 {
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(b.liveness(&key).unwrap(), Liveness::Live);
        h.check().unwrap();
    }
    drop(h);
    assert_eq!(b.liveness(&key).unwrap(), Liveness::Gone);
    // As a killed holder leaves it: written once, never refreshed.
    b.put(&key, b"pid 1").unwrap();
    assert_eq!(b.liveness(&key).unwrap(), Liveness::Live);
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(b.liveness(&key).unwrap(), Liveness::Dead);
}

/// A holder letting go of a store that does not answer waits 15 s for
/// its refresh under way and 15 s for the delete, not their whole retry
/// budget each (90 s here; a command's exit took minutes); its object is
/// left as a killed holder leaves it.
#[test]
fn a_holder_lets_go_promptly_of_a_store_that_does_not_answer() {
    let Some(mut fs) = SeaweedFs::start_or_skip() else {
        return;
    };
    let b = backend(&fs, "letgo", &[("CAIRN_S3_RETRY_SECS", "90")])
        .with_timing(Duration::from_millis(500), Duration::from_secs(60));
    let key = Key::new("sessions/w");
    let held = b.hold(&key, b"me").unwrap();
    fs.stop();
    // A refresh is under way, retried.
    std::thread::sleep(Duration::from_secs(1));
    let t = Instant::now();
    drop(held);
    let took = t.elapsed();
    fs.start_again().unwrap();
    assert!(took < Duration::from_secs(40), "{took:?}");
    assert_eq!(b.get(&key).unwrap().as_deref(), Some(&b"me"[..]));
}

#[test]
fn a_stopped_server_fails_calls_in_one_line_and_a_restarted_one_serves_again() {
    let Some(mut fs) = SeaweedFs::start_or_skip() else {
        return;
    };
    let b = backend(&fs, "fault", &[("CAIRN_S3_RETRY_SECS", "2")])
        .with_timing(Duration::from_millis(500), Duration::from_secs(3));
    let key = Key::new("config");
    b.put(&key, b"v1").unwrap();
    let held = b.hold(&Key::new("sessions/w"), b"me").unwrap();
    fs.stop();
    let t = Instant::now();
    let e = b.put(&key, b"v2").unwrap_err();
    let took = t.elapsed();
    let msg = e.to_string();
    eprintln!("put to a stopped server failed after {took:.1?}: {msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert!(
        msg.starts_with(&format!("s3://{}/fault/config: put: ", fs.bucket())),
        "{msg}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(30),
        "{took:?}"
    );
    assert!(
        matches!(b.get(&key), Err(StoreError::Io { .. })),
        "a get must fail too"
    );
    // The hold's refreshes fail: its check fails once the lease nears.
    std::thread::sleep(Duration::from_secs(3));
    let e = held.check().unwrap_err().to_string();
    assert!(
        e.contains("sessions/w") && e.contains("lease") && !e.contains('\n'),
        "{e}"
    );
    fs.start_again().unwrap();
    b.put(&key, b"v3").unwrap();
    assert_eq!(b.get(&key).unwrap().as_deref(), Some(&b"v3"[..]));
    // Refreshed again: the object is live once more, but the lease ran
    // out while the store was out of reach, and another process may have
    // taken the holder for dead and deleted what it uses meanwhile, so
    // the hold stays lost: a writer must not commit on it.
    let t = Instant::now();
    while b.liveness(&Key::new("sessions/w")).unwrap() != Liveness::Live {
        assert!(t.elapsed() < Duration::from_secs(30), "never refreshed");
        std::thread::sleep(Duration::from_millis(200));
    }
    let e = held.check().unwrap_err().to_string();
    assert!(e.contains("sessions/w") && e.contains("once"), "{e}");
    drop(held);
    assert_eq!(b.liveness(&Key::new("sessions/w")).unwrap(), Liveness::Gone);
}

/// A hold removed by another process (`cairn unlock --remove-all`) is
/// lost for good: its check fails before any commit, its refreshes do not
/// bring it back nor overwrite a new holder's object, and dropping it
/// leaves the new holder's object alone.
#[test]
fn a_broken_hold_is_lost_and_left_to_its_taker() {
    let Some(fs) = SeaweedFs::start_or_skip() else {
        return;
    };
    let b = backend(&fs, "broken", &[]).with_timing(Duration::from_secs(1), Duration::from_secs(4));
    let key = Key::new("locks/vm");
    let h = b.hold(&key, b"first").unwrap();
    h.check().unwrap();
    assert!(!b.break_hold(&key, b"another body").unwrap());
    assert!(b.break_hold(&key, b"first").unwrap());
    let e = h.check().unwrap_err();
    assert!(matches!(e, StoreError::HoldTaken { .. }), "{e}");
    assert!(e.to_string().contains("locks/vm"), "{e}");
    let second = b.hold(&key, b"second").unwrap();
    // Several of the first holder's heartbeats: none lands.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(b.get(&key).unwrap().as_deref(), Some(&b"second"[..]));
    assert!(h.check().is_err());
    drop(h);
    assert_eq!(b.get(&key).unwrap().as_deref(), Some(&b"second"[..]));
    second.check().unwrap();
    // Its refresh thread alone finds a hold broken (no check called).
    assert!(b.break_hold(&key, b"second").unwrap());
    b.put(&key, b"third").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(b.get(&key).unwrap().as_deref(), Some(&b"third"[..]));
    assert!(matches!(second.check(), Err(StoreError::HoldTaken { .. })));
    drop(second);
    assert_eq!(b.get(&key).unwrap().as_deref(), Some(&b"third"[..]));
}

/// Many processes finding one dead lock at once: one takes it over, the
/// others are refused naming it (the takeover replaces the dead version
/// by its ETag; a delete then a create let two win). The same for a lock
/// taken over from a holder the caller found ended.
#[test]
fn one_of_many_takers_of_a_dead_lock_wins() {
    let Some(fs) = SeaweedFs::start_or_skip() else {
        return;
    };
    let b = Arc::new(
        backend(&fs, "takers", &[]).with_timing(Duration::from_secs(1), Duration::from_secs(2)),
    );
    for round in 0..2 {
        let key = Key::new(format!("locks/{round}"));
        // As a killed holder leaves it: written once, never refreshed.
        b.put(&key, b"dead").unwrap();
        if round == 0 {
            std::thread::sleep(Duration::from_secs(3));
            assert_eq!(b.liveness(&key).unwrap(), Liveness::Dead);
        }
        let threads: Vec<_> = (0..6u8)
            .map(|i| {
                let (b, key) = (b.clone(), key.clone());
                std::thread::spawn(move || {
                    let body = [b'a' + i];
                    let r = if round == 0 {
                        b.hold(&key, &body)
                    } else {
                        b.take_over(&key, &body, b"dead")
                    };
                    match r {
                        Ok(h) => Some((body[0], h)),
                        Err(StoreError::Locked { holder, .. }) => {
                            assert_ne!(holder, "dead", "refused by the dead holder");
                            None
                        }
                        Err(e) => panic!("{e}"),
                    }
                })
            })
            .collect();
        let winners: Vec<_> = threads
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        let bodies: Vec<u8> = winners.iter().map(|w| w.0).collect();
        assert_eq!(bodies.len(), 1, "round {round}: {bodies:?} won");
        assert_eq!(b.get(&key).unwrap().unwrap(), bodies);
        winners[0].1.check().unwrap();
    }
}

/// A slow link in front of `to`: a TCP proxy on 127.0.0.1 that passes
/// what the client sends at once and what the server sends at `rate`
/// bytes per second, each connection on its own. Stops with the test
/// process (its threads only copy).
fn slow_link(to: std::net::SocketAddr, rate: u64) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(to) else {
                continue;
            };
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_in, &mut s_out);
                let _ = s_out.shutdown(Shutdown::Write);
            });
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut sent = 0u64;
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = match s_in.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    sent += n as u64;
                    let due = Duration::from_secs_f64(sent as f64 / rate as f64);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
                let _ = c_out.shutdown(Shutdown::Write);
            });
        }
    });
    addr
}

#[test]
fn a_long_read_over_a_slow_link_is_made_of_requests_that_each_fit_the_time_limit() {
    let Some(fs) = SeaweedFs::start_or_skip() else {
        return;
    };
    let fast = backend(&fs, "slow", &[]);
    let data = pattern(64 << 20, 11);
    let key = Key::new("packs/big.pack");
    fast.put(&key, &data).unwrap();

    // 8 MiB/s: the whole object takes 8 s, over a 4 s limit on one
    // request; a piece of 16 MiB takes 2 s.
    let server = fs.endpoint().trim_start_matches("http://").parse().unwrap();
    let proxy = format!("http://{}", slow_link(server, 8 << 20));
    let mut env: HashMap<String, String> = fs.env().into_iter().collect();
    env.insert("AWS_ENDPOINT_URL".into(), proxy);
    env.insert("CAIRN_S3_RETRY_SECS".into(), "1".into());
    let mut config = S3Config::new(&fs.url("slow"), &|k| env.get(k).cloned()).unwrap();
    config.request_timeout = Duration::from_secs(4);
    let slow = S3Backend::new(config).unwrap();

    let mut whole = vec![0; data.len()];
    slow.read_at(&key, 0, &mut whole).unwrap();
    assert!(whole == data, "read_at gave other bytes");
    assert!(
        slow.get(&key).unwrap().unwrap() == data,
        "get gave other bytes"
    );
    // Pieces that start and end inside the object.
    let mut part = vec![0; 20 << 20];
    slow.read_at(&key, (10 << 20) + 5, &mut part).unwrap();
    assert!(
        part[..] == data[(10 << 20) + 5..(30 << 20) + 5],
        "a middle range"
    );
    // Past the end is still damage, not a failure to read: a range that
    // ends past it, and one that starts past it (refused, 416).
    for at in [(54 << 20) + 1, 70 << 20] {
        match slow.read_at(&key, at, &mut part) {
            Err(StoreError::Corrupt { .. }) => {}
            other => panic!("a read past the end at {at} gave {other:?}"),
        }
    }
}

#[test]
fn a_long_read_never_mixes_two_versions_of_an_object() {
    let Some(fs) = SeaweedFs::start_or_skip() else {
        return;
    };
    let b = backend(&fs, "versions", &[]);
    let key = Key::new("index/big");
    let (one, two) = (
        Arc::new(pattern(40 << 20, 1)),
        Arc::new(pattern(40 << 20, 2)),
    );
    b.put(&key, &one).unwrap();
    // Replaced over and over while another thread reads it whole.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (b, key, stop) = (b.clone(), key.clone(), stop.clone());
        let (one, two) = (one.clone(), two.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                b.put(&key, if n % 2 == 0 { &two } else { &one }).unwrap();
                n += 1;
            }
            n
        })
    };
    let mut whole = 0;
    for _ in 0..20 {
        match b.get(&key) {
            Ok(Some(got)) => {
                assert!(got == *one || got == *two, "a read mixed two versions");
                whole += 1;
            }
            Ok(None) => panic!("the object vanished"),
            Err(e) => assert!(e.to_string().contains("changed while read"), "{e}"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let puts = writer.join().unwrap();
    eprintln!("{whole} whole reads of 20, {puts} replacements");
    // (A replacement takes longer than a read here: most reads are whole.)
    assert!(whole > 0, "no read was whole");
    assert!(puts > 0, "nothing was replaced");
}
