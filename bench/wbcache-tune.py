#!/usr/bin/env python3
"""How the write-back cache's tunables were chosen: dirty_high,
idle_writeback and flush_deadline swept one at a time, the others at their
defaults, over cairn-blockdev's rotational cost model (`,hdd`: the cache
matters only in front of a slow backing, see bench/wbcache.py).

  (H) dirty_high, and (I) idle_writeback: a bursty load with a hot set.
      fio writes random 4 KiB blocks over the first 32 MiB of the device,
      depth 16, a FLUSH every 1000 writes, in bursts of 1024 writes
      separated by 1 s of think time, 12288 writes in all (48 MiB: three
      times the 16 MiB cache, so writeback must run during the load).
      Reported: the client's time, its write latency (mean, p99), the
      blocks written back while the load ran (rewrites of the hot set
      absorbed in the ring are not written back), and the time from the
      start until everything is on the backing (client + drain).
  (D) flush_deadline: a trickle of writes without any FLUSH (fio
      --rate_iops, 20 s, 512 MiB region, 64 MiB cache) at 10, 50 and 250
      writes/s. Reported: segments sealed per minute, data blocks per
      sealed segment (a part-filled segment still spends a whole 1 MiB
      ring slot), and the server's write overhead (bytes it passed to
      write calls, /proc/PID/io wchar, beyond the data sealed). The
      deadline itself bounds how long acknowledged writes stay in RAM
      only.

Usage: bench/wbcache-tune.py [--runs 2] [--tests H,I,D]
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
from wbcache import fresh  # noqa: E402

DIRTY_HIGH = [0.25, 0.5, 0.75, 0.9]
IDLE_MS = [100, 250, 1000, 3000]
DEADLINE_MS = [0, 500, 1000, 2000, 5000, 10000]
RATES = [10, 50, 250]


def fio_json(sock, extra):
    cmd = ["fio", "--name=tune", "--ioengine=nbd", f"--uri={uri(sock, 'd')}", "--rw=randwrite",
           "--bs=4k", "--output-format=json", "--randseed=42", "--norandommap",
           "--verify_state_save=0"] + extra
    t = time.monotonic()
    out = run(cmd).stdout
    secs = time.monotonic() - t
    return json.loads(out[out.index("{"):])["jobs"][0]["write"], secs, cmd


def status(cairn, control):
    out = json.loads(run([cairn, "cache", "status", "--json", "--control", control]).stdout)
    return out["caches"][0]


def proc_io(pid):
    """Bytes a process has passed to write calls (wchar)."""
    with open(f"/proc/{pid}/io") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("wchar:"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target/release/cairn"))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--tests", default="H,I,D")
    a = ap.parse_args()
    tests = set(a.tests.split(","))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out_dir = a.out or os.path.join(ROOT, f"bench/runs/{date}-wbcache-tune")
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(os.path.join(ROOT, "bench/work"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="wbtune-", dir=os.path.join(ROOT, "bench/work"))
    sock, control = os.path.join(work, "sock"), os.path.join(work, "control")
    back, cache = os.path.join(work, "back.raw"), os.path.join(work, "cache.dev")
    C = a.cairn
    rows = []
    commands = set()

    def rec(test, variant, metric, value, cmd=None):
        rows.append((test, variant, metric, value))
        if cmd:
            commands.add(" ".join(cmd))
        log(f"{test} {variant:22} {metric:28} {value:12.2f}")

    def serve(extra, cache_mb):
        fresh(back, 512 << 20)
        fresh(cache, cache_mb << 20)
        cmd = [C, "serve", "--file", f"d={back},hdd,cache={cache}", "--socket", sock,
               "--control", control, *extra]
        commands.add(" ".join(cmd))
        return Server(cmd, sock)

    def bursts(test, variant, extra):
        srv = serve(extra, 16)
        w, secs, cmd = fio_json(sock, ["--size=32m", "--iodepth=16", "--number_ios=12288",
                                       "--fsync=1000", "--thinktime=1000000",
                                       "--thinktime_blocks=1024"])
        st = status(C, control)
        t = time.monotonic()
        run([C, "cache", "drain", "--control", control, "--export", "d"])
        dsecs = time.monotonic() - t
        srv.stop()
        rec(test, variant, "client s", secs, cmd)
        rec(test, variant, "write lat mean ms", w["clat_ns"]["mean"] / 1e6)
        rec(test, variant, "write lat p99 ms", w["clat_ns"]["percentile"]["99.000000"] / 1e6)
        rec(test, variant, "write lat p99.9 ms", w["clat_ns"]["percentile"]["99.900000"] / 1e6)
        rec(test, variant, "write lat max ms", w["clat_ns"]["max"] / 1e6)
        rec(test, variant, "written back during load", st["written_back_blocks"])
        rec(test, variant, "client + drain s", secs + dsecs)

    for _ in range(a.runs):
        for dh in DIRTY_HIGH if "H" in tests else []:
            bursts("H", f"dirty_high {dh}", ["--cache-dirty-high", str(dh)])
        for ms in IDLE_MS if "I" in tests else []:
            bursts("I", f"idle {ms} ms", ["--cache-idle-ms", str(ms)])
        for rate in RATES if "D" in tests else []:
            for ms in DEADLINE_MS:
                srv = serve(["--cache-flush-deadline-ms", str(ms)], 64)
                before, io0 = status(C, control), proc_io(srv.p.pid)
                w, _, cmd = fio_json(sock, ["--size=512m", "--iodepth=1", f"--rate_iops={rate}",
                                            "--time_based", "--runtime=20"])
                st, io1 = status(C, control), proc_io(srv.p.pid)
                srv.stop()
                secs = w["runtime"] / 1000
                sealed = st["last_written_id"] - before["last_written_id"]
                data = (w["total_ios"] - st["open_blocks"]) * 4096
                v = f"{rate}/s deadline {ms} ms"
                rec("D", v, "segments sealed per min", sealed * 60 / secs, cmd)
                rec("D", v, "blocks per sealed segment", data / 4096 / sealed if sealed else 0)
                # Everything the server wrote (log, NBD replies) beyond the
                # data of the sealed segments: the price of sealing early.
                rec("D", v, "write overhead %", 100 * ((io1 - io0) - data) / data if data else 0)

    med = {}
    for t, v, m, val in rows:
        med.setdefault((t, v, m), []).append(val)
    with open(os.path.join(out_dir, "results.csv"), "w") as f:
        f.write("test,variant,metric,run,value\n")
        counts = {}
        for t, v, m, val in rows:
            counts[(t, v, m)] = counts.get((t, v, m), 0) + 1
            f.write(f"{t},{v},{m},{counts[(t, v, m)]},{val:.4f}\n")
    lines = [f"# Write-back cache tunables ({os.path.basename(out_dir)})", "",
             f"{a.runs} rounds, medians; backing = the rotational cost model.", ""]
    for test in ["H", "I", "D"]:
        variants = list(dict.fromkeys(v for t, v, _ in med if t == test))
        metrics = list(dict.fromkeys(m for t, _, m in med if t == test))
        if not variants:
            continue
        lines += ["| " + test + " | " + " | ".join(metrics) + " |", "|---" + "|--:" * len(metrics) + "|"]
        for v in variants:
            vals = [statistics.median(med[(test, v, m)]) for m in metrics]
            lines.append(f"| {v} | " + " | ".join(f"{x:.2f}" for x in vals) + " |")
        lines.append("")
    save_run(out_dir, work, lines, commands)


if __name__ == "__main__":
    main()
