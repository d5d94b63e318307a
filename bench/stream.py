#!/usr/bin/env python3
"""stream.py: cold streaming reads and writes of a multi-GiB file: cairn
against fio and dd (seed 004's table).

What: a file of --gib GiB of random bytes on the work filesystem (the
machine's disk). Before every run the page cache is dropped
(`echo 3 > /proc/sys/vm/drop_caches`), so every run reads the disk.

Reads:
- fio, `--rw=read --direct=1 --ioengine=io_uring` at every block size of
  --bs and queue depth of --qd (a run stops after --fio-runtime seconds;
  MB/s is what it moved over the time it ran);
- dd `iflag=direct bs=4M` and plain dd `bs=4M` (the page cache's
  readahead) to /dev/null;
- cairn backup of the file into a repository on tmpfs (so only the read
  touches the disk), `-c none -T 2`, with `--direct` at every --cairn-bs x
  --cairn-qd (the reads queued ahead of the chunker), and without
  `--direct` (buffered: the kernel's readahead). Each is the file's
  second backup into that repository (every chunk already stored: what a
  nightly backup of an unchanged disk does: read, cut, hash, look up);
  the first backup (`--direct`, the default queue) is timed too.

Writes (the restore side):
- fio `--rw=write --direct=1 --ioengine=io_uring --end_fsync=1
  --fallocate=none` into a new file, every --bs x --qd;
- dd `oflag=direct bs=4M conv=fsync` into a new file;
- cairn restore of the image from that tmpfs repository into a new file
  (written with O_DIRECT from its worker threads, fsync'd), `-T 2`.

MB/s = 10^6 bytes per second of wall time. Medians of --runs rounds.

--paired N: only the target's comparison, N cold rounds of fio's best
read setting (--paired-fio BS,QD) then `cairn backup --direct` at its
defaults (and, with --cairn-before, another fio run then an older build
the same way), each backup's ratio to the fio run just before it: the
disk's speed drifts, and a read leaves part of the file in the host's
cache, so a ratio of neighbours with the same predecessor says more than
medians far apart. Output: results.csv
(every round), report.md (medians and ratios).

Why: issue 20, seed 004 (streaming at device speed); the target is a
cold streaming read at least 0.9x fio's best setting on the same file.

Needs: root (drop_caches), fio, dd, a release build of cairn, matplotlib.

Usage: bench/stream.py [--cairn PATH] [--gib 4] [--runs 2]
                       [--bs 4K,64K,1M,4M] [--qd 1,4,16,64]
                       [--cairn-bs 64K,1M,4M] [--cairn-qd 1,2,8,32]
                       [--replot RUN]
       bench/stream.py --paired N [--paired-fio 4M,64] [--cairn-before PATH]
Output: bench/runs/<UTC date>-stream[-K]/ (results.csv, summary.csv,
report.md, commands.txt, versions.txt, stream.png).
"""
import argparse
import csv
import datetime
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
from plotting import drop_caches, new_run_dir, plt, save  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(f"[{datetime.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def size_arg(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def make_input(path, gib):
    if os.path.exists(path) and os.path.getsize(path) == gib << 30:
        return
    rng = random.Random(4)
    with open(path, "wb") as f:
        for _ in range(gib * 16):
            f.write(rng.randbytes(64 << 20))
        f.flush()
        os.fsync(f.fileno())


class Runner:
    def __init__(self, cairn, work, size, commands):
        self.cairn, self.work, self.size, self.commands = cairn, work, size, commands
        self.env = dict(os.environ, CAIRN_CACHE_DIR=os.path.join(work, "cache"))

    def timed(self, cmd, **kw):
        """Drop the page cache, run cmd, return its wall seconds."""
        drop_caches()
        self.commands.append(" ".join(cmd))
        t = time.monotonic()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=self.env, **kw)
        return time.monotonic() - t, out.stdout

    def fio(self, rw, path, bs, qd, runtime):
        cmd = ["fio", "--name=s", f"--filename={path}", f"--rw={rw}", f"--bs={bs}",
               f"--iodepth={qd}", "--direct=1", "--ioengine=io_uring", f"--size={self.size}",
               f"--runtime={runtime}", "--output-format=json"]
        if rw == "write":
            cmd += ["--end_fsync=1", "--fallocate=none"]
        _, out = self.timed(cmd)
        job = json.loads(out)["jobs"][0][rw]
        return job["io_bytes"] / (job["runtime"] / 1000) / 1e6, job


def plot(out, med, bss, qds, cbss, cqds, gib):
    """MB/s against block size, a line per queue depth, reads and writes;
    cairn's settings as dashed lines, dd's and the other single settings
    as labelled horizontal lines."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, op in zip(axes, ["read", "write"]):
        for qd in qds:
            ys = [med.get((op, "fio", bs, str(qd))) for bs in bss]
            ax.plot(range(len(bss)), ys, marker="o", label=f"fio qd {qd}")
        xs = {bs: i for i, bs in enumerate(bss)}
        if op == "read":
            for qd in cqds:
                pts = [(xs[bs], med[(op, "cairn backup --direct", bs, str(qd))]) for bs in cbss if bs in xs]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", linestyle="--",
                        label=f"cairn backup --direct, {qd} ahead")
        single = [(tool, v) for (o, tool, _, _), v in med.items()
                  if o == op and tool.startswith(("dd", "cairn restore", "cairn backup (", "cairn first"))]
        for k, (tool, v) in enumerate(sorted(single, key=lambda t: t[1])):
            ax.axhline(v, linestyle=":", linewidth=1, color="grey")
            ax.annotate(f"{tool} {v:.0f}", (k * 0.9, v), fontsize=7, va="bottom")
        ax.set_xticks(range(len(bss)))
        ax.set_xticklabels(bss)
        ax.set_xlabel("block size")
        ax.set_ylabel("MB/s (cold)")
        ax.set_title(f"{op}: {gib} GiB file, page cache dropped")
        ax.legend(fontsize=7)
    save(fig, out, "stream.png")


def paired(a, out, src, size):
    """--paired: fio's best read and cairn's backup --direct, round by
    round, and their ratios."""
    commands, rows = [], []
    r = Runner(a.cairn, a.work, size, commands)
    bs, qd = a.paired_fio.split(",")
    builds = [("cairn", a.cairn)] + ([("cairn before", a.cairn_before)] if a.cairn_before else [])
    shutil.rmtree(a.tmpfs, ignore_errors=True)
    os.makedirs(a.tmpfs)
    repo = os.path.join(a.tmpfs, "repo")
    try:
        sh([a.cairn, "init", repo, "--encryption", "none"], env=r.env)
        sh([a.cairn, "backup", src, "--repo", repo, "--name", "first", "-c", "none", "-q"], env=r.env)
        for rnd in range(a.paired):
            row = {"round": rnd}
            for name, binary in builds:
                # Each build right after a fio run of its own: a read of
                # the file leaves some of it in the host's cache, so the
                # run after fio is faster than the one after that.
                fio, _ = r.fio("read", src, bs, int(qd), a.fio_runtime)
                row[f"fio before {name}"] = round(fio, 1)
                secs, o = r.timed([binary, "backup", src, "--repo", repo, "--name", "again",
                                   "-c", "none", "-T", "2", "-q", "--json", "--direct"])
                assert json.loads(o)["bytes_in"] == size
                row[name] = round(size / secs / 1e6, 1)
                row[f"{name} / fio"] = round(size / secs / 1e6 / fio, 3)
            rows.append(row)
            log(f"round {rnd}: {row}")
    finally:
        shutil.rmtree(a.tmpfs, ignore_errors=True)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(f"{a.paired} paired cold rounds, {size / 2**30:.0f} GiB file; medians:\n\n")
        f.write("| column | median |\n|---|--:|\n")
        for k in rows[0]:
            if k != "round":
                f.write(f"| {k} | {statistics.median(row[k] for row in rows)} |\n")
    with open(os.path.join(out, "commands.txt"), "w") as f:
        f.write("\n".join(commands) + "\n")
    versions(out, a.cairn)
    print(open(os.path.join(out, "report.md")).read())


def versions(out, cairn):
    """RUN/versions.txt: the tools and the machine."""
    with open(os.path.join(out, "versions.txt"), "w") as f:
        f.write(sh([cairn, "--version"]).strip() + "\n")
        f.write(sh(["fio", "--version"]).strip() + "\n")
        f.write(sh(["dd", "--version"]).splitlines()[0] + "\n")
        f.write(f"{platform.platform()}, {os.cpu_count()} cores\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target/release/cairn"))
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--bs", default="4K,64K,1M,4M")
    ap.add_argument("--qd", default="1,4,16,64")
    ap.add_argument("--cairn-bs", default="64K,1M,8M")
    ap.add_argument("--cairn-qd", default="1,2,8,32")
    ap.add_argument("--fio-runtime", type=int, default=15)
    ap.add_argument("--work", default=os.path.join(ROOT, "bench/work/stream"))
    ap.add_argument("--tmpfs", default="/dev/shm/cairn-stream")
    ap.add_argument("--replot", metavar="RUN", help="only draw RUN/stream.png again from RUN/summary.csv")
    ap.add_argument("--paired", type=int, metavar="N", help="only N paired rounds: fio's best read, then cairn")
    ap.add_argument("--paired-fio", default="4M,64", metavar="BS,QD")
    ap.add_argument("--cairn-before", metavar="PATH", help="with --paired: an older build, timed the same way")
    a = ap.parse_args()
    bss, qds = a.bs.split(","), [int(x) for x in a.qd.split(",")]
    cbss, cqds = a.cairn_bs.split(","), [int(x) for x in a.cairn_qd.split(",")]
    if a.replot:
        with open(os.path.join(a.replot, "summary.csv")) as f:
            med = {(r["op"], r["tool"], r["bs"], r["qd"]): float(r["median_mbps"]) for r in csv.DictReader(f)}
        plot(a.replot, med, bss, qds, cbss, cqds, a.gib)
        return
    out = new_run_dir(ROOT, "stream-paired" if a.paired else "stream")
    os.makedirs(a.work, exist_ok=True)
    src = os.path.join(a.work, "input.bin")
    log(f"input: {a.gib} GiB of random bytes")
    make_input(src, a.gib)
    size = os.path.getsize(src)
    if a.paired:
        paired(a, out, src, size)
        return
    dest = os.path.join(a.work, "out.bin")
    shutil.rmtree(a.tmpfs, ignore_errors=True)
    repo = os.path.join(a.tmpfs, "repo")
    commands, rows = [], []
    r = Runner(a.cairn, a.work, size, commands)

    def add(rnd, op, tool, bs, qd, secs=None, mbps=None, extra=None):
        mbps = mbps if mbps is not None else size / secs / 1e6
        rows.append({"round": rnd, "op": op, "tool": tool, "bs": bs, "qd": qd,
                     "mbps": round(mbps, 1), **(extra or {})})
        log(f"round {rnd} {op} {tool} bs {bs} qd {qd}: {mbps:.0f} MB/s")

    def backup(name, extra):
        secs, o = r.timed([a.cairn, "backup", src, "--repo", repo, "--name", name, "-c", "none",
                           "-T", "2", "-q", "--json"] + extra)
        j = json.loads(o)
        assert j["bytes_in"] == size, j
        return secs

    def rm_dest():
        if os.path.exists(dest):
            os.remove(dest)

    try:
        for rnd in range(a.runs):
            # Reads.
            for bs in bss:
                for qd in qds:
                    mbps, job = r.fio("read", src, bs, qd, a.fio_runtime)
                    lat = job["clat_ns"]["percentile"]
                    add(rnd, "read", "fio", bs, qd, mbps=mbps,
                        extra={"p50_us": round(lat.get("50.000000", 0) / 1e3),
                               "p99_us": round(lat.get("99.000000", 0) / 1e3),
                               "max_us": round(job["clat_ns"]["max"] / 1e3)})
            secs, _ = r.timed(["dd", f"if={src}", "of=/dev/null", "bs=4M", "iflag=direct"])
            add(rnd, "read", "dd direct", "4M", 1, secs)
            secs, _ = r.timed(["dd", f"if={src}", "of=/dev/null", "bs=4M"])
            add(rnd, "read", "dd buffered", "4M", "ra", secs)
            shutil.rmtree(a.tmpfs, ignore_errors=True)
            os.makedirs(a.tmpfs)
            sh([a.cairn, "init", repo, "--encryption", "none"], env=r.env)
            add(rnd, "read", "cairn first backup --direct", "8M", 8, backup("first", ["--direct"]))
            for bs in cbss:
                for qd in cqds:
                    secs = backup("again", ["--direct", "--read-block", bs, "--read-depth", str(qd)])
                    add(rnd, "read", "cairn backup --direct", bs, qd, secs)
            add(rnd, "read", "cairn backup (buffered)", "-", "ra", backup("again", []))
            # Writes.
            for bs in bss:
                for qd in qds:
                    rm_dest()
                    mbps, job = r.fio("write", dest, bs, qd, a.fio_runtime)
                    add(rnd, "write", "fio", bs, qd, mbps=mbps)
            rm_dest()
            secs, _ = r.timed(["dd", "if=/dev/zero", f"of={dest}", "bs=4M", f"count={size >> 22}",
                               "oflag=direct", "conv=fsync"])
            add(rnd, "write", "dd direct", "4M", 1, secs)
            rm_dest()
            secs, _ = r.timed([a.cairn, "restore", "first", dest, "--repo", repo, "-T", "2", "-q"])
            add(rnd, "write", "cairn restore", "-", "2 threads", secs)
            if subprocess.run(["cmp", "-s", src, dest]).returncode != 0:
                sys.exit("the restored file differs from the input")
            rm_dest()
    finally:
        shutil.rmtree(a.tmpfs, ignore_errors=True)
        rm_dest()

    fields = ["round", "op", "tool", "bs", "qd", "mbps", "p50_us", "p99_us", "max_us"]
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    med = {}
    for row in rows:
        med.setdefault((row["op"], row["tool"], row["bs"], str(row["qd"])), []).append(row["mbps"])
    med = {k: statistics.median(v) for k, v in med.items()}
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "tool", "bs", "qd", "median_mbps"])
        for key, v in med.items():
            w.writerow(list(key) + [v])
    with open(os.path.join(out, "commands.txt"), "w") as f:
        f.write("\n".join(commands) + "\n")
    versions(out, a.cairn)

    plot(out, med, bss, qds, cbss, cqds, a.gib)

    best_read = max(v for (o, t, _, _), v in med.items() if o == "read" and t == "fio")
    best_write = max(v for (o, t, _, _), v in med.items() if o == "write" and t == "fio")
    lines = [f"# Cold streaming reads and writes ({os.path.basename(out)})", "",
             f"{a.gib} GiB of random bytes on the work filesystem; page cache dropped before every "
             f"run; medians of {a.runs} rounds; MB/s = 10^6 bytes/s of wall time. cairn backs up into "
             "and restores from an unencrypted repository on tmpfs (`-c none -T 2`).", "",
             "| op | tool | block | queue | MB/s | ÷ fio's best |", "|---|---|--:|--:|--:|--:|"]
    for (o, t, bs, qd), v in med.items():
        best = best_read if o == "read" else best_write
        lines.append(f"| {o} | {t} | {bs} | {qd} | {v:.0f} | {v / best:.2f}x |")
    lines += ["", "![stream](stream.png)", ""]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines))
    print(os.path.join(out, "report.md"))


if __name__ == "__main__":
    main()
