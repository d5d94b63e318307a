#!/usr/bin/env python3
"""The write-back cache (cairn serve --file PATH,cache=CACHE), seed 001's
tests, side by side in one run.

Backing files live on the work filesystem; `hdd` runs put cairn-blockdev's
rotational cost model (7200 rpm: ~12.4 ms per random 4 KiB request, 2 ms
per flush) between the server and the backing file, since this machine's
disk is fast and host-cached.

  (A) writeback: N random 4 KiB writes go into the cache with writeback
      held off, the server stops, then `cairn cache drain --batch B` is
      timed for B in 1, 4, 32, 128, 256 segments; against the same writes
      sent straight to the backing file (served by cairn, one flush at the
      end).  N = 32768 (128 MiB) on the disk, 8192 (32 MiB) over the model.
  (B) read overhead: fio randread, block sizes 1k..128k, through a clean
      cache (every read misses) vs the backing file served alone.
  (C) random 4 KiB writes with a FLUSH every 1000 writes (fio --fsync=1000,
      depth 16): cache vs no cache, over the model and over the disk, and
      qemu-nbd on the bare file (disk).  Client-side IOPS, and over the
      model also the time until everything is on the backing (+ drain).
  (E) the same load (C) on a repository image (512 MiB: 256 MiB of random
      bytes, then zeros; lz4) made writable: `--image d,cache=CACHE` and
      `--image d,rw` (writes land in the image's overlay; the commit comes
      when the server stops, or at the drain), against the disk rows of
      (C). Client IOPS, snapshots committed, and the drain.
  (W) issue 17's writable stored image: the load of (T) (20 s counted after
      20 s of ramp) on bench/data/os2.img (576 MiB) stored in a repository
      (default settings: encrypted, zstd) and served `--image d,rw` and
      `--image d,cache=CACHE` (16 MiB), against qemu-nbd on an uncompressed
      qcow2 of the same image (`qemu-img convert -O qcow2`). Client IOPS
      and clat percentiles; for cairn also the stop, which commits the
      writes as a snapshot; and `--commit-every 10`, snapshots committed
      while the load runs.
  (T) sustained overflow, issue 17's measurement: fio randwrite 4 KiB,
      depth 16, a FLUSH every 1000 writes, 20 s counted after 20 s of
      ramp, over a 1 GiB backing file, with a 16 MiB cache and without;
      over the rotational model and over the plain file. Client IOPS and
      completion latency p50, p99, p99.9 and maximum (from fio's clat,
      steady state only: the ramp is not counted).
  (S) sequential cutoff: 1 GiB written sequentially in 1 MiB requests
      (fio, depth 16, an fsync at the end) to the bare file, through the
      cache with the cutoff off (--cache-seq-cutoff 0) and with the default
      (4M); time until the client is done, and until everything is on the
      backing file (+ drain).

Usage: bench/wbcache.py [--runs 3] [--quick] [--tests A,B,C,E,S,T,W]
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve import ROOT, Server, log, run, save_run, uri  # noqa: E402


def fio(sock, rw, bs, extra, **kw):
    cmd = ["fio", "--name=wb", "--ioengine=nbd", f"--uri={uri(sock, 'd')}", f"--rw={rw}",
           f"--bs={bs}", "--iodepth=16", "--output-format=json", "--randseed=42",
           "--norandommap", "--verify_state_save=0"] + extra
    t = time.monotonic()
    out = run(cmd).stdout
    secs = time.monotonic() - t
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    return side["iops"], secs, cmd


def fio_sustained(sock, ramp, runtime, size):
    """(T): IOPS and clat percentiles (ms) of the steady state."""
    cmd = ["fio", "--name=wb", "--ioengine=nbd", f"--uri={uri(sock, 'd')}", "--rw=randwrite",
           "--bs=4k", "--iodepth=16", "--output-format=json", "--randseed=42", "--norandommap",
           "--verify_state_save=0", "--fsync=1000", "--time_based", f"--ramp_time={ramp}",
           f"--runtime={runtime}", f"--size={size}", "--percentile_list=50:99:99.9"]
    out = run(cmd).stdout
    w = json.loads(out[out.index("{"):])["jobs"][0]["write"]
    clat = w["clat_ns"]
    pct = clat.get("percentile", {})

    def ms(key):
        return pct.get(key, 0) / 1e6

    return {"IOPS": w["iops"], "p50 ms": ms("50.000000"), "p99 ms": ms("99.000000"),
            "p99.9 ms": ms("99.900000"), "max ms": clat["max"] / 1e6}, cmd


def drain(cairn, cache, back, batch, hdd):
    cmd = [cairn, "cache", "drain", "--json", "--batch", str(batch), "--cache", cache, "--backing", back]
    if hdd:
        cmd.append("--hdd")
    out = json.loads(run(cmd).stdout)
    return out["seconds"], out["written_back_blocks"], cmd


def image_drain(cairn, cache, repo):
    cmd = [cairn, "cache", "drain", "--json", "--cache", cache, "--repo", repo, "--image", "d"]
    out = json.loads(run(cmd).stdout)
    return out["seconds"], cmd


def snapshots(cairn, repo):
    out = json.loads(run([cairn, "ls", "--json", "--repo", repo]).stdout)
    return len(out["snapshots"])


def fresh(path, size):
    # A new file, not the old one cut: a backing file's binding to a cache
    # is recorded by its device and inode, which a truncation keeps.
    if os.path.exists(path):
        os.unlink(path)
    with open(path, "wb") as f:
        f.truncate(size)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target/release/cairn"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tests", default="A,B,C,E,S,T,W", help="which tests to run (default all: A,B,C,E,S,T,W)")
    ap.add_argument("--ramp", type=int, default=20, help="(T): seconds of ramp, not counted")
    ap.add_argument("--runtime", type=int, default=20, help="(T): seconds counted")
    a = ap.parse_args()
    tests = set(a.tests.split(","))
    # Repositories are encrypted by default.
    os.environ.setdefault("CAIRN_PASSWORD", "cairn bench")
    if a.quick:
        a.runs = 1
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out_dir = a.out or os.path.join(ROOT, f"bench/runs/{date}-wbcache" + ("-quick" if a.quick else ""))
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(os.path.join(ROOT, "bench/work"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="wbcache-", dir=os.path.join(ROOT, "bench/work"))
    sock = os.path.join(work, "sock")
    back = os.path.join(work, "back.raw")
    cache = os.path.join(work, "cache.dev")
    C = a.cairn
    rows = []
    commands = set()

    def rec(test, variant, value, unit, cmd=None):
        rows.append((test, variant, value, unit))
        if cmd:
            commands.add(" ".join(cmd))
        log(f"{test:12} {variant:28} {value:12.2f} {unit}")

    def serve(spec, extra=()):
        cmd = [C, "serve", "--file", spec, "--socket", sock, *extra]
        commands.add(" ".join(cmd))
        return Server(cmd, sock)

    hold = ["--cache-dirty-high", "1.0", "--cache-idle-ms", "3600000"]
    for r in range(a.runs):
        # (A) writeback batches vs straight writes.
        for hdd, n, size in [(False, 32768, 512 << 20), (True, 8192, 512 << 20)] if "A" in tests else []:
            tag = "hdd" if hdd else "disk"
            model = ",hdd" if hdd else ""
            fio_extra = [f"--number_ios={n}", f"--size={size}"]
            fresh(back, size)
            srv = serve(f"d={back}{model}")
            _, secs, cmd = fio(sock, "randwrite", "4k", fio_extra + ["--end_fsync=1"])
            srv.stop()
            rec("A", f"{tag} straight to backing", secs, "s", cmd)
            for batch in [1, 4, 32, 128, 256]:
                fresh(back, size)
                fresh(cache, 256 << 20)
                srv = serve(f"d={back}{model},cache={cache}", hold)
                fio(sock, "randwrite", "4k", fio_extra + ["--end_fsync=1"])
                srv.stop()
                secs, blocks, cmd = drain(C, cache, back, batch, hdd)
                rec("A", f"{tag} writeback batch {batch}", secs, "s", cmd)
        # (B) read overhead through a clean cache.
        size = 256 << 20
        if "B" in tests:
            fresh(back, size)
            srv = serve(f"d={back}")
            fio(sock, "write", "1m", [f"--size={size}"])
            srv.stop()
        for bs in ["1k", "4k", "16k", "64k", "128k"] if "B" in tests else []:
            for variant in ["bare", "cache"]:
                spec = f"d={back}" if variant == "bare" else f"d={back},cache={cache}"
                if variant == "cache":
                    fresh(cache, 64 << 20)
                srv = serve(spec)
                iops, _, cmd = fio(sock, "randread", bs, [f"--size={size}", "--time_based", "--runtime=3"])
                srv.stop()
                rec("B", f"read {bs} {variant}", iops, "IOPS", cmd)
        # (C) random 4 KiB writes, FLUSH every 1000.
        for hdd, n in [(False, 65536), (True, 2000)] if "C" in tests else []:
            tag = "hdd" if hdd else "disk"
            model = ",hdd" if hdd else ""
            size = 512 << 20
            variants = [("no cache", f"d={back}{model}", None), ("cache", f"d={back}{model},cache={cache}", None)]
            if not hdd:
                variants.append(("qemu-nbd", None, ["qemu-nbd", "-t", "-e", "8", "-f", "raw", "-k", sock, "-x", "d", "--cache=writeback", back]))
            for name, spec, qcmd in variants:
                fresh(back, size)
                fresh(cache, 512 << 20)
                if qcmd:
                    commands.add(" ".join(qcmd))
                    srv = Server(qcmd, sock)
                else:
                    srv = serve(spec)
                iops, secs, cmd = fio(sock, "randwrite", "4k", [f"--number_ios={n}", f"--size={size}", "--fsync=1000"])
                srv.stop()
                rec("C", f"{tag} {name}", iops, "IOPS", cmd)
                if name == "cache":
                    dsecs, _, dcmd = drain(C, cache, back, 32, hdd)
                    rec("C", f"{tag} cache incl. drain", n / (secs + dsecs), "IOPS", dcmd)
        # (T) sustained overflow: 16 MiB cache, 1 GiB backing.
        for hdd in [True, False] if "T" in tests else []:
            tag = "hdd" if hdd else "file"
            model = ",hdd" if hdd else ""
            for name, spec in [("bare", f"d={back}{model}"), ("cache", f"d={back}{model},cache={cache}")]:
                fresh(back, 1 << 30)
                fresh(cache, 16 << 20)
                srv = serve(spec)
                res, cmd = fio_sustained(sock, a.ramp, a.runtime, 1 << 30)
                srv.stop()
                for unit, val in res.items():
                    rec("T", f"{tag} {name}", val, unit, cmd)
        # (S) a big sequential write, with and without the cutoff.
        if "S" in tests:
            size = 1 << 30
            for name, spec, extra in [("bare", f"d={back}", []),
                                      ("cache, cutoff off", f"d={back},cache={cache}", ["--cache-seq-cutoff", "0"]),
                                      ("cache, cutoff 4M", f"d={back},cache={cache}", [])]:
                fresh(back, size)
                fresh(cache, 256 << 20)
                srv = serve(spec, extra)
                _, secs, cmd = fio(sock, "write", "1m", [f"--size={size}", "--end_fsync=1"])
                srv.stop()
                rec("S", f"{name}: client", secs, "s", cmd)
                if spec.endswith(f"cache={cache}"):
                    dsecs, _, dcmd = drain(C, cache, back, 32, False)
                    rec("S", f"{name}: incl. drain", secs + dsecs, "s", dcmd)
        # (W) a stored image served writable, sustained, against qemu-nbd
        # on an uncompressed qcow2 of it.
        if "W" in tests:
            src = os.path.join(ROOT, "bench/data/os2.img")
            size = os.path.getsize(src)
            repo = os.path.join(work, "repo")
            qcow = os.path.join(work, "image.qcow2")
            overlay = os.path.join(work, "overlay")
            for name in ["qemu-nbd qcow2", "image rw", "image rw (commit every 10 s)", "image cache"]:
                run(["rm", "-rf", repo, qcow, overlay])
                if name.startswith("qemu"):
                    run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", src, qcow])
                    cmd = ["qemu-nbd", "-t", "-f", "qcow2", "-x", "d", "-k", sock, qcow]
                else:
                    run([C, "init", repo, "--encryption", "none"])
                    run([C, "backup", src, "--repo", repo, "--name", "d", "-q"])
                    opt = f"d,overlay={overlay}" + (f",cache={cache}" if name == "image cache" else ",rw")
                    fresh(cache, 16 << 20)
                    cmd = [C, "serve", "--repo", repo, "--image", opt, "--socket", sock]
                    if "every 10 s" in name:
                        cmd += ["--commit-every", "10"]
                commands.add(" ".join(cmd))
                srv = Server(cmd, sock)
                res, fcmd = fio_sustained(sock, a.ramp, a.runtime, size)
                t = time.monotonic()
                srv.stop(timeout=900)
                stop = time.monotonic() - t
                for unit, val in res.items():
                    rec("W", name, val, unit, fcmd)
                if not name.startswith("qemu"):
                    rec("W", f"{name}: stop (commit)", stop, "s")
                    rec("W", f"{name}: snapshots", snapshots(C, repo) - 1, "snapshots")
        # (E) the load of (C) on a writable repository image.
        if "E" in tests:
            n, size = 65536, 512 << 20
            src = os.path.join(work, "image.src")
            with open(src, "wb") as f:
                f.write(os.urandom(256 << 20))
                f.truncate(size)
            repo = os.path.join(work, "repo")
            for name, opt in [("image cache", f"d,cache={cache}"), ("image rw", "d,rw")]:
                run(["rm", "-rf", repo])
                run([C, "init", repo, "--encryption", "none"])
                run([C, "backup", src, "--repo", repo, "--name", "d", "-c", "lz4", "-q"])
                fresh(cache, 512 << 20)
                cmd = [C, "serve", "--repo", repo, "--image", opt, "--socket", sock]
                commands.add(" ".join(cmd))
                srv = Server(cmd, sock)
                iops, secs, fcmd = fio(sock, "randwrite", "4k", [f"--number_ios={n}", f"--size={size}", "--fsync=1000"])
                srv.stop()
                rec("E", f"disk {name}", iops, "IOPS", fcmd)
                rec("E", f"disk {name}: snapshots while served", snapshots(C, repo) - 1, "snapshots")
                if name == "image cache":
                    dsecs, dcmd = image_drain(C, cache, repo)
                    rec("E", f"disk {name} incl. drain", n / (secs + dsecs), "IOPS", dcmd)
                    rec("E", f"disk {name}: snapshots after drain", snapshots(C, repo) - 1, "snapshots")
            os.remove(src)

    med = {}
    for t, v, val, unit in rows:
        med.setdefault((t, v, unit), []).append(val)
    med = {k: statistics.median(x) for k, x in med.items()}
    with open(os.path.join(out_dir, "results.csv"), "w") as f:
        f.write("test,variant,run,value,unit\n")
        counts = {}
        for t, v, val, unit in rows:
            counts[(t, v)] = counts.get((t, v), 0) + 1
            f.write(f"{t},{v},{counts[(t, v)]},{val:.4f},{unit}\n")
    lines = [f"# Write-back cache, seed 001's tests ({os.path.basename(out_dir)})", "",
             f"{a.runs} rounds, medians. `hdd` = the rotational cost model between server and backing file.", "",
             "| test | variant | median | unit |", "|---|---|--:|---|"]
    for (t, v, unit), val in med.items():
        lines.append(f"| {t} | {v} | {val:.2f} | {unit} |")

    def get(t, v, unit):
        return med.get((t, v, unit))

    lines += ["", "| ratio | value | target |", "|---|--:|---|"]

    def ratio(label, x, y, target=None, higher=True):
        if x is None or y is None or y == 0:
            return
        r = x / y
        ok = ""
        if target is not None:
            ok = (f"≥ {target}: " if higher else f"≤ {target}: ") + ("yes" if (r >= target if higher else r <= target) else "**no**")
        lines.append(f"| {label} | {r:.2f} | {ok} |")

    for tag in ["disk", "hdd"]:
        for b in [1, 4, 32, 128, 256]:
            ratio(f"(A) {tag}: straight ÷ writeback batch {b} (time)", get("A", f"{tag} straight to backing", "s"), get("A", f"{tag} writeback batch {b}", "s"))
    for bs in ["1k", "4k", "16k", "64k", "128k"]:
        x, y = get("B", f"read {bs} cache", "IOPS"), get("B", f"read {bs} bare", "IOPS")
        if x and y:
            lines.append(f"| (B) read {bs}: overhead of the cache | {100 * (1 - x / y):.1f} % | {'≤ 5 %: ' + ('yes' if 1 - x / y <= 0.05 else '**no**') if bs == '128k' else ''} |")
    ratio("(C) hdd: cache ÷ no cache (client IOPS)", get("C", "hdd cache", "IOPS"), get("C", "hdd no cache", "IOPS"), 3.0)
    ratio("(C) hdd: cache incl. drain ÷ no cache", get("C", "hdd cache incl. drain", "IOPS"), get("C", "hdd no cache", "IOPS"))
    ratio("(C) disk: cache ÷ no cache", get("C", "disk cache", "IOPS"), get("C", "disk no cache", "IOPS"), 0.9)
    ratio("(C) disk: cache ÷ qemu-nbd", get("C", "disk cache", "IOPS"), get("C", "disk qemu-nbd", "IOPS"), 1.0)
    ratio("(T) hdd: cache ÷ bare (IOPS, steady state)", get("T", "hdd cache", "IOPS"), get("T", "hdd bare", "IOPS"), 3.0)
    ratio("(T) file: cache ÷ bare (IOPS, steady state)", get("T", "file cache", "IOPS"), get("T", "file bare", "IOPS"), 0.9)
    ratio("(W) image rw ÷ qemu-nbd qcow2 (IOPS, steady state)", get("W", "image rw", "IOPS"), get("W", "qemu-nbd qcow2", "IOPS"), 1.0)
    ratio("(W) image rw (commit every 10 s) ÷ qemu-nbd qcow2 (IOPS, steady state)", get("W", "image rw (commit every 10 s)", "IOPS"), get("W", "qemu-nbd qcow2", "IOPS"))
    ratio("(W) image cache ÷ qemu-nbd qcow2 (IOPS, steady state)", get("W", "image cache", "IOPS"), get("W", "qemu-nbd qcow2", "IOPS"), 1.0)
    for tag, unit, limit in [("hdd", "max ms", 1000.0), ("hdd", "p99.9 ms", 100.0)]:
        x = get("T", f"{tag} cache", unit)
        if x is not None:
            lines.append(f"| (T) {tag} cache: {unit} | {x:.1f} | ≤ {limit:g}: {'yes' if x <= limit else '**no**'} |")
    ratio("(S) bare ÷ cache with cutoff, incl. drain (time)", get("S", "bare: client", "s"), get("S", "cache, cutoff 4M: incl. drain", "s"))
    ratio("(S) bare ÷ cache without cutoff, incl. drain (time)", get("S", "bare: client", "s"), get("S", "cache, cutoff off: incl. drain", "s"))
    ratio("(E) disk: image with cache ÷ file with cache", get("E", "disk image cache", "IOPS"), get("C", "disk cache", "IOPS"))
    ratio("(E) disk: image with cache ÷ image without", get("E", "disk image cache", "IOPS"), get("E", "disk image rw", "IOPS"))
    ratio("(E) disk: image without cache ÷ bare file", get("E", "disk image rw", "IOPS"), get("C", "disk no cache", "IOPS"))
    save_run(out_dir, work, lines, commands)


if __name__ == "__main__":
    main()
