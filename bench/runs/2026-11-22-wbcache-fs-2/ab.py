#!/usr/bin/env python3
"""A/B of two cairn binaries on the dbench disk rows of bench/wbcache-fs.py
(no cache / cache / plog), alternating binaries within every round, with
`perf stat -e context-switches,task-clock -p SERVER` around each dbench.

Usage: ab.py --a BIN --b BIN [--runs 5] [--seconds 10] --out DIR
Writes DIR/ab.csv (one row per measurement) and prints medians.
"""
import argparse
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
spec = importlib.util.spec_from_file_location("wbfs", os.path.join(ROOT, "bench/wbcache-fs.py"))
wbfs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wbfs)
from serve import log, run  # noqa: E402


def perf_parse(path):
    out = {}
    for line in open(path):
        p = line.strip().split(",")
        if len(p) > 3 and p[0] and p[0][0].isdigit():
            out[p[2]] = float(p[0])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--variants", default="none,cache,plog")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(os.path.join(ROOT, "bench/work"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="wbab-", dir=os.path.join(ROOT, "bench/work"))
    back = os.path.join(work, "back.raw")
    cache = os.path.join(work, "cache.dev")
    allv = {"none": (f"d={back}", []), "cache": (f"d={back},cache={cache}", []),
            "plog": (f"d={back},cache={cache}", ["--cache-plog"]),
            # Tunable experiments (same code, other settings).
            "cache-b256": (f"d={back},cache={cache}", ["--cache-batch", "256"]),
            "cache-nowb": (f"d={back},cache={cache}", ["--cache-dirty-high", "0.99", "--cache-idle-ms", "60000"])}
    variants = a.variants.split(",")
    bins = [("A", a.a), ("B", a.b)]
    csv = open(os.path.join(a.out, "ab.csv"), "a")
    csv.write("round,variant,bin,mbps,ctxsw,task_clock_ms\n")
    rows = []
    for r in range(a.runs):
        order = bins if r % 2 == 0 else bins[::-1]
        for v in variants:
            for bname, binp in order:
                spec_, extra = allv[v]
                with open(back, "wb") as f:
                    f.truncate(1 << 30)
                run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", back])
                with open(cache, "wb") as f:
                    f.truncate(512 << 20)
                st = wbfs.Stack(binp, work, spec_, extra)
                pf = os.path.join(work, "perf.txt")
                perf = subprocess.Popen(["perf", "stat", "-x,", "-o", pf, "-e", "context-switches,task-clock",
                                         "-p", str(st.server.p.pid)], stderr=subprocess.DEVNULL)
                time.sleep(0.3)
                try:
                    mb = wbfs.dbench(st.mnt, a.seconds)
                finally:
                    perf.send_signal(signal.SIGINT)
                    perf.wait()
                    st.close()
                p = perf_parse(pf)
                cs, tc = p.get("context-switches", 0), p.get("task-clock", 0)
                rows.append((v, bname, mb, cs, tc))
                csv.write(f"{r + 1},{v},{bname},{mb:.2f},{cs:.0f},{tc:.0f}\n")
                csv.flush()
                log(f"run {r + 1} {v:6} {bname} {mb:8.1f} MB/s  cs {cs:9.0f}  task-clock {tc:8.0f} ms")
    lines = [f"A = {a.a}", f"B = {a.b}", f"{a.runs} rounds of dbench {a.seconds} s, medians", "",
             "| variant | bin | MB/s | context switches | server task-clock ms | MB/s ÷ none (same bin) |",
             "|---|---|--:|--:|--:|--:|"]
    med = {}
    for v, b, mb, cs, tc in rows:
        med.setdefault((v, b), []).append((mb, cs, tc))
    for v in variants:
        for b, _ in bins:
            xs = med[(v, b)]
            m = [statistics.median(x[i] for x in xs) for i in range(3)]
            base = statistics.median(x[0] for x in med[("none", b)]) if ("none", b) in med else 0
            ratio = f"{m[0] / base:.3f}" if base else ""
            lines.append(f"| {v} | {b} | {m[0]:.1f} | {m[1]:.0f} | {m[2]:.0f} | {ratio} |")
    with open(os.path.join(a.out, "ab.md"), "a") as f:
        f.write("\n".join(lines) + "\n\n")
    print("\n".join(lines))
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
