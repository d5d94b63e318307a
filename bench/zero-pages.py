#!/usr/bin/env python3
"""zero-pages.py: zero pages inside chunks, left out as holes (issue 20).

What: `cairn backup` and `cairn restore` of images whose zero pages sit
among data pages, with two builds of cairn side by side (--cairn, and
--cairn-before, a build that left out only whole zero chunks):
- bench/data/mem.core (bench/datasets/make-memdump: a Python process's
  core, its zero pages mostly in long runs);
- a made image of --mib MiB whose 4 KiB pages are zero with probability
  --zero-share, at random (seeded), the others random bytes: zero pages
  scattered among data, the case whole zero chunks miss.
For each: the backup's zero bytes, new raw bytes, stored bytes and chunks
(`--json`), its wall time, the restore's wall time (into a new file on
the work filesystem, fsync'd by restore) and the restored file's bytes on
disk (`du`), the file compared with the input. Repositories on tmpfs;
the page cache is dropped before every timed run. Rounds alternate the
builds; the report gives medians.

Needs: root (drop_caches), a release build of cairn (two to compare).

Usage: bench/zero-pages.py [--cairn PATH] [--cairn-before PATH] [--runs 3]
                           [--mib 512] [--zero-share 0.3]
       bench/zero-pages.py --report RUN   (report.md again from RUN's CSV)
Output: bench/runs/<UTC date>-zero-pages[-K]/ (results.csv, report.md,
commands.txt, versions.txt).
"""
import argparse
import csv
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plotting import drop_caches, new_run_dir  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = 4096


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_scattered(path, mib, share):
    """MIB MiB of pages, each zero with probability SHARE (seed 7)."""
    if os.path.exists(path) and os.path.getsize(path) == mib << 20:
        return
    rng = random.Random(7)
    with open(path, "wb") as f:
        for _ in range((mib << 20) // PAGE):
            f.write(bytes(PAGE) if rng.random() < share else rng.randbytes(PAGE))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target/release/cairn"))
    ap.add_argument("--cairn-before", metavar="PATH")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--zero-share", type=float, default=0.3)
    ap.add_argument("--work", default=os.path.join(ROOT, "bench/work/zero-pages"))
    ap.add_argument("--tmpfs", default="/dev/shm/cairn-zero-pages")
    ap.add_argument("--report", metavar="RUN", help="only write RUN/report.md again from RUN/results.csv")
    a = ap.parse_args()
    if a.report:
        with open(os.path.join(a.report, "results.csv")) as f:
            report(a.report, list(csv.DictReader(f)))
        return
    os.makedirs(a.work, exist_ok=True)
    scattered = os.path.join(a.work, "scattered.bin")
    log(f"input: {a.mib} MiB, {a.zero_share:.0%} of its pages zero")
    make_scattered(scattered, a.mib, a.zero_share)
    inputs = [("scattered", scattered)]
    core = os.path.join(ROOT, "bench/data/mem.core")
    if os.path.exists(core):
        inputs.insert(0, ("mem.core", core))
    else:
        log("no bench/data/mem.core (bench/datasets/make-memdump makes it): skipped")
    builds = [("cairn", a.cairn)] + ([("before", a.cairn_before)] if a.cairn_before else [])
    out = new_run_dir(ROOT, "zero-pages")
    commands, rows = [], []
    dest = os.path.join(a.work, "restored")

    def timed(cmd):
        drop_caches()
        commands.append(" ".join(cmd))
        t = time.monotonic()
        p = subprocess.run(cmd, check=True, capture_output=True, text=True)
        return time.monotonic() - t, p.stdout

    try:
        for rnd in range(a.runs):
            for name, path in inputs:
                for build, binary in builds:
                    shutil.rmtree(a.tmpfs, ignore_errors=True)
                    os.makedirs(a.tmpfs)
                    repo = os.path.join(a.tmpfs, "repo")
                    subprocess.run([binary, "init", repo, "--encryption", "none"], check=True,
                                   capture_output=True)
                    b_secs, o = timed([binary, "backup", path, "--repo", repo, "--name", "img",
                                       "-T", "2", "-q", "--json"])
                    j = json.loads(o)
                    if os.path.exists(dest):
                        os.remove(dest)
                    r_secs, _ = timed([binary, "restore", "img", dest, "--repo", repo, "-T", "2", "-q"])
                    if subprocess.run(["cmp", "-s", path, dest]).returncode != 0:
                        sys.exit(f"{build}: the restored {name} differs from the input")
                    row = {"round": rnd, "input": name, "build": build,
                           "zero_bytes": j["bytes_zero"], "new_raw": j["bytes_new_raw"],
                           "stored": j["bytes_stored_new"], "chunks": j["chunks"],
                           "backup_s": round(b_secs, 3), "restore_s": round(r_secs, 3),
                           "restored_on_disk": os.stat(dest).st_blocks * 512}
                    rows.append(row)
                    log(str(row))
    finally:
        shutil.rmtree(a.tmpfs, ignore_errors=True)
        if os.path.exists(dest):
            os.remove(dest)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    report(out, rows)
    with open(os.path.join(out, "commands.txt"), "w") as f:
        f.write("\n".join(commands) + "\n")
    with open(os.path.join(out, "versions.txt"), "w") as f:
        for build, binary in builds:
            ver = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
            f.write(f"{build}: {binary}: {ver}\n")
        f.write(f"{platform.platform()}, {os.cpu_count()} cores\n")


def report(out, rows):
    """RUN/report.md: medians per input and build (bytes in MB)."""
    cols = [("zero_bytes", "zero MB", 1e6), ("new_raw", "new raw MB", 1e6),
            ("stored", "stored MB", 1e6), ("chunks", "chunks", 1),
            ("backup_s", "backup s", 1), ("restore_s", "restore s", 1),
            ("restored_on_disk", "restored file on disk MB", 1e6)]
    rounds = len({r["round"] for r in rows})
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(f"Medians of {rounds} rounds.\n\n| input | build | "
                + " | ".join(c[1] for c in cols) + " |\n")
        f.write("|---|---|" + "--:|" * len(cols) + "\n")
        for key in dict.fromkeys((r["input"], r["build"]) for r in rows):
            mine = [r for r in rows if (r["input"], r["build"]) == key]
            vals = [statistics.median(float(r[c]) for r in mine) / unit for c, _, unit in cols]
            f.write(f"| {key[0]} | {key[1]} | " + " | ".join(
                f"{v:.3f}" if c == "backup_s" or c == "restore_s" else f"{v:,.1f}" if unit > 1 else f"{v:,.0f}"
                for v, (c, _, unit) in zip(vals, cols)) + " |\n")
    print(open(os.path.join(out, "report.md")).read())


if __name__ == "__main__":
    main()
