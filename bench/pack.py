#!/usr/bin/env python3
"""pack.py: cairn pack/unpack side by side with the standard compressors.

What: for each benchmark input (bench/data/os.img, mem.core, random.bin)
and each format, compresses with `cairn pack -T2` and with its peers
(pigz, gzip, zstd, lz4, lzop, lbzip2, pbzip2, xz) at the same level,
measures compression and decompression time with hyperfine, and records
output sizes, peak memory, and the machine's physical limits (memory copy,
reading the input from the page cache and from the disk). Everything goes
to bench/runs/<UTC date>-pack/: results.csv, the hyperfine JSON, the exact
command lines, tool versions and machine facts. bench/report.py turns the
CSV into the tables and charts of docs/benchmarks.md.

Why: issue 2 asks for these figures against stated targets, and
../shared/BENCHMARKING.md fixes the method: same input, same thread count,
same level, cairn and the peer run alternately (A B A B ...), >= 5 counted
runs after a warm-up, medians and the ratio of medians, raw data kept.

How the runs alternate: hyperfine runs all runs of its first command
before its second, so one `hyperfine --runs 5 A B` is A A A A A B B B B B.
To get A B A B this script runs one hyperfine invocation per round with
every command of the comparison in it (`--runs 1`); the first round is the
warm-up and is not counted. Every other round runs the commands in
reverse order (A B, B A, A B, ...): what runs just before a command
changes its time on this machine (cairn's two threads started right
after a one-core `zstd -d` ran 8-15 % slower than right after another
cairn run), so each command follows each other command equally often.
`--no-interleave` runs one invocation with `--warmup 1 --runs N` instead.

Every command reads the input file on stdin and writes to /dev/null, so
cairn and the peers do the same I/O. The page cache is warm (the inputs
are read before timing and never dropped). Each compressed stream is
written once to a file to measure its size and peak RSS, and checked by
decoding it back (cmp against the input) before any decoder is timed.

Usage: bench/pack.py [--inputs os,mem,random] [--only gzip,zstd,...]
                     [--quick] [--runs N] [--with-t1] [--dry-run] ...
Only the Python 3 standard library is used.
"""

import argparse
import csv
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)

# Benchmark inputs, as made by bench/datasets/make-*.
INPUTS = {
    "os": ("os.img", "ext4 image of a Debian bookworm minbase tree (make-os-image)"),
    "mem": ("mem.core", "gcore dump of a Python process holding mixed data (make-memdump)"),
    "random": ("random.bin", "1 GiB from /dev/urandom (make-random)"),
}
FORMATS = ["gzip", "zstd", "lz4", "lzop", "snappy", "bzip2", "xz"]
SIZE_TOLERANCE = 1.02  # a speed target counts at an output size within 2 % of the peer's

CSV_COLUMNS = [
    # the columns asked for by issue 2
    "input", "operation", "tool", "level", "threads", "median_s", "mb_per_s",
    "output_bytes", "ratio_vs_peer_speed", "size_vs_peer",
    # context: which comparison, what was decoded, spread, target, checks
    "format", "group", "role", "stream", "input_bytes", "runs", "min_s", "max_s",
    "stdev_s", "cpu_s", "target", "met", "peak_rss_kib", "verified", "load1", "note", "command",
]


@dataclass
class Tool:
    """One contestant in a comparison: how it compresses and decodes."""
    tool: str                  # program name, e.g. "pigz"
    level: str                 # level as given, e.g. "6"; "" if none
    threads: int               # threads it was told to use (1 if no option)
    compress: list             # argv: stdin -> stdout
    decompress: list           # argv decoding a stream of this format
    dthreads: int = 1          # threads of the decoder
    role: str = "peer"         # "cairn", "cairn-T1" or "peer"
    target: float = None       # compress: cairn speed / this peer's >= target
    dtarget: float = None      # decompress of own output: cairn / this >= dtarget
    slug: str = ""             # file-name friendly id
    label: str = ""            # shown in hyperfine output

    def __post_init__(self):
        if not self.slug:
            self.slug = "-".join(a.lstrip("-") for a in self.compress if a not in ("-c", "-q"))
            self.slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.slug)
        if not self.label:
            self.label = " ".join(a for a in self.compress if a not in ("-c", "-q"))


@dataclass
class Group:
    """A comparison: cairn first, then its peers, all at one format and level."""
    gid: str
    fmt: str
    ext: str
    tools: list
    note: str = ""
    cross_bz2: bool = False    # also decode every .bz2 with cairn and lbzip2
    outputs: dict = field(default_factory=dict)


def build_groups(cairn, threads, with_t1):
    T = str(threads)

    def c(fmt, level, ext_level=True):
        lv = [f"-{level}"] if ext_level and level else []
        return Tool("cairn", level, threads,
                    [cairn, "pack", "-q", "-F", fmt] + lv + ["-T", T, "-c"],
                    [cairn, "unpack", "-q", "-T", T, "-c"], dthreads=threads,
                    role="cairn", slug=f"cairn-{fmt}-{level or 'default'}",
                    label=f"cairn {fmt}{' -' + level if level else ''} -T{T}")

    def c1(fmt, level):
        lv = [f"-{level}"] if level else []
        return Tool("cairn", level, 1, [cairn, "pack", "-q", "-F", fmt] + lv + ["-T", "1", "-c"],
                    [cairn, "unpack", "-q", "-T", "1", "-c"], role="cairn-T1",
                    slug=f"cairn-{fmt}-{level or 'default'}-T1",
                    label=f"cairn {fmt}{' -' + level if level else ''} -T1")

    groups = [
        Group("gzip-6", "gzip", "gz", [
            c("gzip", "6"),
            Tool("pigz", "6", threads, ["pigz", f"-p{T}", "-6", "-c"], ["pigz", f"-p{T}", "-d", "-c"],
                 dthreads=threads, target=1.5, dtarget=1.8),
            Tool("gzip", "6", 1, ["gzip", "-6", "-c"], ["gzip", "-d", "-c"], dtarget=1.8),
        ], note="pigz and gzip decode on one core (pigz -d adds I/O and check threads only)"),
        Group("gzip-1", "gzip", "gz", [
            c("gzip", "1"),
            Tool("pigz", "1", threads, ["pigz", f"-p{T}", "-1", "-c"], ["pigz", f"-p{T}", "-d", "-c"],
                 dthreads=threads, target=1.5, dtarget=1.8),
        ]),
        Group("zstd-1", "zstd", "zst", [
            c("zstd", "1"),
            Tool("zstd", "1", threads, ["zstd", "-q", f"-T{T}", "-1", "-c"], ["zstd", "-q", "-d", "-c"],
                 target=1.0, dtarget=1.8),
        ], note="zstd -d decodes on one core"),
        Group("zstd-3", "zstd", "zst", [
            c("zstd", "3"),
            Tool("zstd", "3", threads, ["zstd", "-q", f"-T{T}", "-3", "-c"], ["zstd", "-q", "-d", "-c"],
                 target=1.0, dtarget=1.8),
        ]),
        Group("lz4-1", "lz4", "lz4", [
            c("lz4", "1"),
            Tool("lz4", "1", 1, ["lz4", "-q", "-1", "-c"], ["lz4", "-q", "-d", "-c"], target=1.8, dtarget=1.8),
        ], note="the lz4 CLI is single-threaded"),
        Group("lzop-1", "lzop", "lzo", [
            c("lzop", "1"),
            Tool("lzop", "1", 1, ["lzop", "-1", "-c"], ["lzop", "-d", "-c"], target=1.8, dtarget=1.8),
        ], note="lzop is single-threaded"),
        Group("snappy", "snappy", "sz", [c("snappy", "")],
              note="no snappy CLI peer in Debian; python-snappy is not a fair peer "
                   "(interpreter overhead, one thread), so absolute figures only"),
        Group("bzip2-9", "bzip2", "bz2", [
            c("bzip2", "9"),
            Tool("lbzip2", "9", threads, ["lbzip2", f"-n{T}", "-9", "-c"], ["lbzip2", f"-n{T}", "-d", "-c"],
                 dthreads=threads, target=1.0, dtarget=1.0),
            Tool("pbzip2", "9", threads, ["pbzip2", f"-p{T}", "-9", "-c"], ["pbzip2", f"-p{T}", "-d", "-c"],
                 dthreads=threads),
        ], cross_bz2=True,
            note="decoding is also measured across producers: cairn and lbzip2 -d on every .bz2, "
                 "including a single-stream file from bzip2 -9"),
        Group("xz-1", "xz", "xz", [
            c("xz", "1"),
            Tool("xz", "1", threads, ["xz", f"-T{T}", "-1", "-c"], ["xz", "-d", "-c"], target=1.0, dtarget=1.8),
            # Not a target: xz 5.4 decodes multi-block files in parallel with -T.
            Tool("xz", "1", threads, ["xz", f"-T{T}", "-1", "-c"], ["xz", f"-T{T}", "-d", "-c"],
                 dthreads=threads, slug=f"xz-T{T}-1-dT{T}"),
        ], note="xz -d decodes on one core; xz -T2 -d (xz >= 5.4) in parallel, shown without a target"),
    ]
    if with_t1:
        for g in groups:
            cairn_tool = g.tools[0]
            g.tools.insert(1, c1(g.fmt, cairn_tool.level))
    return groups


# ---------------------------------------------------------------- helpers

def log(msg):
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def sh_cmd(argv, infile, outfile="/dev/null"):
    return f"{shlex.join(argv)} < {shlex.quote(infile)} > {shlex.quote(outfile)}"


def run_text(argv):
    """Output (stdout+stderr) of a small informational command, or the error."""
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=30, text=True)
        return p.stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"({e})"


def load1():
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return ""


GNU_TIME = "/usr/bin/time"


def with_rss(argv, rss_file):
    """argv run under GNU time, which writes the peak RSS (KiB) to rss_file.

    GNU time, not wait4() from this process: a child forked from a big
    Python process reports that process's RSS as its own peak after exec.
    """
    if not os.access(GNU_TIME, os.X_OK):
        return argv
    return [GNU_TIME, "-f", "%M", "-o", rss_file] + argv


def read_rss(rss_file):
    try:
        with open(rss_file) as f:
            return int(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def run_once(argv, infile, outfile):
    """Run argv < infile > outfile once; return (peak RSS KiB, error or None)."""
    with open(infile, "rb") as fin, open(outfile, "wb") as fout, \
            tempfile.TemporaryFile() as ferr, tempfile.NamedTemporaryFile() as frss:
        rc = subprocess.run(with_rss(argv, frss.name), stdin=fin, stdout=fout, stderr=ferr).returncode
        if rc != 0:
            ferr.seek(0)
            err = ferr.read().decode(errors="replace").strip().splitlines()
            return None, f"exit {rc}: {' | '.join(err[-3:])}"
        return read_rss(frss.name), None


def verify_decode(argv, stream, original):
    """Decode stream with argv and compare with original; (ok, peak RSS KiB, error)."""
    with open(stream, "rb") as fin, tempfile.NamedTemporaryFile() as frss:
        dec = subprocess.Popen(with_rss(argv, frss.name), stdin=fin, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
        cmp = subprocess.Popen(["cmp", "-s", "-", original], stdin=dec.stdout)
        dec.stdout.close()
        drc, crc = dec.wait(), cmp.wait()
        rss = read_rss(frss.name)
    if drc != 0:
        return False, rss, f"decoder exit {drc}"
    if crc != 0:
        return False, rss, "decoded bytes differ from the input"
    return True, rss, None


@dataclass
class Timing:
    """Counted wall times of one command, and its CPU time (user + system) per run."""
    times: list
    cpu: list

    def row(self):
        """The CSV fields of these runs."""
        med, lo, hi, sd = stats(self.times)
        return {"median_s": fmt_f(med, 6), "runs": len(self.times), "min_s": fmt_f(lo, 6),
                "max_s": fmt_f(hi, 6), "stdev_s": fmt_f(sd, 6), "cpu_s": fmt_f(statistics.median(self.cpu), 6)}


class Runner:
    """Runs hyperfine comparisons and keeps every raw file in the run dir."""

    def __init__(self, run_dir, runs, warmup, interleave, dry_run):
        self.run_dir = run_dir
        self.runs = runs
        self.warmup = warmup
        self.interleave = interleave
        self.dry_run = dry_run
        self.commands = open(os.path.join(run_dir, "commands.txt"), "a")
        self.hflog = os.path.join(run_dir, "hyperfine.log")

    def note_command(self, what, cmd):
        self.commands.write(f"# {what}\n{cmd}\n")
        self.commands.flush()

    def _hyperfine(self, names_cmds, runs, warmup, json_path):
        argv = ["hyperfine", "--style", "basic", "--warmup", str(warmup), "--runs", str(runs),
                "--export-json", json_path]
        for name, cmd in names_cmds:
            argv += ["-n", name, cmd]
        with open(self.hflog, "a") as lf:
            lf.write(f"\n$ {shlex.join(argv)}\n")
            lf.flush()
            r = subprocess.run(argv, stdout=lf, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise RuntimeError(f"hyperfine exited {r.returncode} (see hyperfine.log)")
        with open(json_path) as f:
            results = json.load(f)["results"]
        # Per-run CPU time is only exported as a mean; with --runs 1 that is the run's.
        return [Timing(res["times"], [res["user"] + res["system"]]) for res in results]

    def compare(self, key, names_cmds):
        """Time the commands side by side; return a Timing per command."""
        for name, cmd in names_cmds:
            self.note_command(f"{key}: {name}", cmd)
        if self.dry_run:
            return [Timing([float("nan")], [float("nan")]) for _ in names_cmds]
        jdir = os.path.join(self.run_dir, "hyperfine", os.path.dirname(key))
        os.makedirs(jdir, exist_ok=True)
        base = os.path.join(jdir, os.path.basename(key))
        if not self.interleave or len(names_cmds) == 1:
            return self._hyperfine(names_cmds, self.runs, self.warmup, base + ".json")
        counted = [Timing([], []) for _ in names_cmds]
        rounds = []
        for r in range(self.warmup + self.runs):
            path = f"{base}.round{r}.json"
            # Odd rounds run the commands in reverse order (counterbalanced).
            order = names_cmds if r % 2 == 0 else names_cmds[::-1]
            timings = self._hyperfine(order, 1, 0, path)
            if r % 2:
                timings = timings[::-1]
            with open(path) as f:
                rounds.append(json.load(f))
            os.remove(path)
            if r >= self.warmup:
                for acc, t in zip(counted, timings):
                    acc.times += t.times
                    acc.cpu += t.cpu
        # One file per comparison: every round's hyperfine export, the first
        # `warmup` of them not counted, and the counted times per command.
        with open(base + ".json", "w") as f:
            json.dump({"method": "one hyperfine invocation per round, order reversed every "
                                 "other round (A B, B A, A B, ...)",
                       "warmup_rounds": self.warmup, "counted_rounds": self.runs,
                       "commands": [{"name": n, "command": c, "times": t.times, "cpu": t.cpu}
                                    for (n, c), t in zip(names_cmds, counted)],
                       "rounds": rounds}, f, indent=1)
        return counted


# ---------------------------------------------------------------- measuring

def stats(times):
    return (statistics.median(times), min(times), max(times),
            statistics.stdev(times) if len(times) > 1 else 0.0)


def fmt_f(x, nd=4):
    return "" if x is None else f"{x:.{nd}f}"


MEMCPY_PY = """
import os, sys, time
n, k = int(sys.argv[1]), int(sys.argv[2])
src = bytearray(os.urandom(1 << 20)) * (n >> 20)
dst = bytearray(n)
dst[:] = src  # fault every page in first
for _ in range(k):
    t0 = time.perf_counter()
    dst[:] = src
    print(time.perf_counter() - t0)
"""


def measure_limits(runner, inputs, quick, rows):
    """Physical limits: memory copy, page-cache read, disk read (O_DIRECT)."""
    gib = 1 if not quick else 0.25
    nbytes = int(gib * (1 << 30))
    if not runner.dry_run:
        # memcpy bandwidth, in a child so that this process stays small:
        # bytearray slice assignment is one memcpy.
        out = subprocess.run([sys.executable, "-c", MEMCPY_PY, str(nbytes), str(runner.warmup + runner.runs)],
                             stdout=subprocess.PIPE, text=True, check=True).stdout
        times = [float(x) for x in out.split()]
        med, lo, hi, sd = stats(times[runner.warmup:])
        rows.append({"input": "", "operation": "limit", "tool": "memcpy", "threads": 1,
                     "median_s": fmt_f(med, 6), "mb_per_s": f"{nbytes / 1e6 / med:.1f}",
                     "input_bytes": nbytes, "runs": runner.runs, "min_s": fmt_f(lo, 6),
                     "max_s": fmt_f(hi, 6), "stdev_s": fmt_f(sd, 6), "load1": load1(),
                     "note": "bytearray copy of 1 GiB (0.25 GiB with --quick) in Python, one thread",
                     "command": "python: dst[:] = src"})
    count = nbytes >> 20
    cmds = [("dd zero", f"dd if=/dev/zero of=/dev/null bs=1M count={count} status=none")]
    for name, path in inputs:
        cmds.append((f"cat {name}", f"cat {shlex.quote(path)} > /dev/null"))
    times = runner.compare("limits/read", cmds)
    sizes = [nbytes] + [os.path.getsize(p) for _, p in inputs]
    notes = ["kernel zero-fill to a 1 MiB buffer: an upper bound for moving bytes through a process"] + \
            ["read of the input from the page cache (warm)"] * len(inputs)
    for (name, cmd), t, n, note in zip(cmds, times, sizes, notes):
        med = statistics.median(t.times)
        rows.append({**t.row(), "input": name.split()[1] if name.startswith("cat ") else "",
                     "operation": "limit", "tool": name.split()[0], "threads": 1,
                     "mb_per_s": f"{n / 1e6 / med:.1f}", "input_bytes": n,
                     "load1": load1(), "note": note, "command": cmd})
    # The disk's sequential read, bypassing the page cache (not on tmpfs).
    direct = []
    for name, path in inputs:
        cmd = f"dd if={shlex.quote(path)} of=/dev/null bs=4M iflag=direct status=none"
        if runner.dry_run or subprocess.run(cmd, shell=True, stderr=subprocess.DEVNULL).returncode == 0:
            direct.append((name, path, cmd))
    if direct:
        times = runner.compare("limits/direct", [(f"dd direct {n}", c) for n, _, c in direct])
        for (name, path, cmd), t in zip(direct, times):
            med = statistics.median(t.times)
            n = os.path.getsize(path)
            rows.append({**t.row(), "input": name, "operation": "limit", "tool": "dd-direct", "threads": 1,
                         "mb_per_s": f"{n / 1e6 / med:.1f}", "input_bytes": n, "load1": load1(),
                         "note": "sequential read with O_DIRECT (disk, no page cache; sparse "
                                 "holes read as zeros without I/O)", "command": cmd})


def measure_group(runner, g, name, path, tmpdir, rows, errors):
    """Measure one comparison, then delete its compressed files (not the input slices)."""
    try:
        _measure_group(runner, g, name, path, tmpdir, rows, errors)
    finally:
        for f in os.listdir(tmpdir):
            if not f.endswith(".slice"):
                os.remove(os.path.join(tmpdir, f))


def _measure_group(runner, g, name, path, tmpdir, rows, errors):
    """Compress with every tool of the group, then time compression and decoding."""
    nbytes = os.path.getsize(path)
    base = {"input": name, "format": g.fmt, "group": g.gid, "input_bytes": nbytes}
    cairn = g.tools[0]
    ok_tools = []
    info = {}  # slug -> dict of one-shot results

    # 1. One compression per tool to a file: size, peak RSS, round-trip check.
    for t in g.tools:
        out = os.path.join(tmpdir, f"{name}.{t.slug}.{g.ext}")
        cmd = sh_cmd(t.compress, path, out)
        runner.note_command(f"{name}/{g.gid}: one compression for size and RSS", cmd)
        if runner.dry_run:
            ok_tools.append(t)
            info[t.slug] = {"out": out, "bytes": None, "rss": None, "verified": "", "drss": None,
                            "dec_ok": True}
            continue
        # Tools with the same compress command share one stream (xz -T2 -1,
        # decoded once with -d and once with -T2 -d).
        same = next((x for x in ok_tools if x.compress == t.compress), None)
        if same is not None:
            info[t.slug] = dict(info[same.slug])
        else:
            rss, err = run_once(t.compress, path, out)
            if err:
                errors.append(f"{name}/{g.gid}: {t.label} failed: {err}")
                log(f"  {t.label}: FAILED ({err})")
                rows.append({**base, "operation": "compress", "tool": t.tool, "level": t.level,
                             "threads": t.threads, "role": t.role, "note": f"failed: {err}",
                             "command": sh_cmd(t.compress, path)})
                os.remove(out)
                continue
            info[t.slug] = {"out": out, "bytes": os.path.getsize(out), "rss": rss}
            # Check the stream with the standard reader (the first peer's
            # decoder; cairn itself for snappy, which has no CLI reader).
            checker = next((x.decompress for x in g.tools if x.role == "peer"), cairn.decompress)
            ok, _, err = verify_decode(checker, out, path)
            info[t.slug]["verified"] = ("yes" if ok else f"no: {err}") + (
                "" if checker != cairn.decompress else " (by cairn itself)")
            if not ok:
                errors.append(f"{name}/{g.gid}: {t.label}: {shlex.join(checker)} check failed: {err}")
        # Decode with its own decoder (what gets timed), for RSS and correctness.
        ok2, drss, err2 = verify_decode(t.decompress, info[t.slug]["out"], path)
        info[t.slug]["drss"] = drss
        info[t.slug]["dverified"] = "yes" if ok2 else f"no: {err2}"
        info[t.slug]["dec_ok"] = ok2
        if not ok2:
            errors.append(f"{name}/{g.gid}: {t.label}: own decoder failed: {err2}")
        log(f"  {t.label}: {info[t.slug]['bytes']} bytes, check {info[t.slug]['verified']}")
        ok_tools.append(t)
    if not ok_tools:
        return

    # 2. Compression, side by side. Tools with identical commands are timed once.
    ctools = []
    for t in ok_tools:
        if not any(x.compress == t.compress for x in ctools):
            ctools.append(t)
    times = runner.compare(f"{name}/{g.gid}/compress",
                           [(t.label, sh_cmd(t.compress, path)) for t in ctools])
    cmed = None
    cbytes = info[cairn.slug]["bytes"] if cairn in ok_tools else None
    for t, ts in zip(ctools, times):
        med = statistics.median(ts.times)
        if t is cairn:
            cmed = med
        row = {**base, **ts.row(), "operation": "compress", "tool": t.tool, "level": t.level,
               "threads": t.threads, "role": t.role, "stream": t.label,
               "mb_per_s": f"{nbytes / 1e6 / med:.1f}", "output_bytes": info[t.slug]["bytes"],
               "peak_rss_kib": info[t.slug]["rss"],
               "verified": info[t.slug].get("verified", ""), "load1": load1(),
               "note": g.note if t.role == "cairn" else "", "command": sh_cmd(t.compress, path)}
        if t.role == "peer" and cmed is not None and not runner.dry_run:
            speed = med / cmed
            size = cbytes / info[t.slug]["bytes"]
            row["ratio_vs_peer_speed"] = f"{speed:.3f}"
            row["size_vs_peer"] = f"{size:.4f}"
            if t.target is not None:
                row["target"] = f">= {t.target}x"
                row["met"] = ("yes" if speed >= t.target and size <= SIZE_TOLERANCE else
                              "no (size)" if speed >= t.target else "no")
        rows.append(row)

    # 3. Decompression of each tool's own output (by those that decoded it right).
    dtools = [t for t in ok_tools if info[t.slug]["dec_ok"]]
    for t in ok_tools:
        if t not in dtools:
            rows.append({**base, "operation": "decompress", "tool": os.path.basename(t.decompress[0]),
                         "level": t.level, "threads": t.dthreads, "role": t.role, "stream": t.label,
                         "verified": info[t.slug]["dverified"], "note": "failed: " + info[t.slug]["dverified"],
                         "command": sh_cmd(t.decompress, info[t.slug]["out"])})
    if not dtools:
        return
    times = runner.compare(f"{name}/{g.gid}/decompress",
                           [(f"{dec_label(t.decompress)} < {t.label} output",
                             sh_cmd(t.decompress, info[t.slug]["out"])) for t in dtools])
    dmed = None
    for t, ts in zip(dtools, times):
        med = statistics.median(ts.times)
        if t is cairn:
            dmed = med
        row = {**base, **ts.row(), "operation": "decompress",
               "tool": os.path.basename(t.decompress[0]) if t.role == "peer" else "cairn",
               "level": t.level, "threads": t.dthreads, "role": t.role,
               "stream": t.label, "mb_per_s": f"{nbytes / 1e6 / med:.1f}",
               "peak_rss_kib": info[t.slug]["drss"], "verified": info[t.slug].get("dverified", ""),
               "load1": load1(), "command": sh_cmd(t.decompress, info[t.slug]["out"])}
        if t.role == "peer" and dmed is not None and not runner.dry_run:
            speed = med / dmed
            row["ratio_vs_peer_speed"] = f"{speed:.3f}"
            if t.dtarget is not None:
                row["target"] = f">= {t.dtarget}x"
                row["met"] = "yes" if speed >= t.dtarget else "no"
        rows.append(row)

    # 4. bzip2: cairn and lbzip2 decode every producer's .bz2, incl. plain bzip2.
    if g.cross_bz2 and cairn in ok_tools:
        lb = next((t for t in ok_tools if t.tool == "lbzip2"), None)
        streams = [(t.label, info[t.slug]["out"]) for t in ok_tools if t.role != "cairn-T1"]
        plain = os.path.join(tmpdir, f"{name}.bzip2-9.bz2")
        cmd = sh_cmd(["bzip2", "-9", "-c"], path, plain)
        runner.note_command(f"{name}/{g.gid}: single-stream .bz2 for cross decoding", cmd)
        if runner.dry_run or run_once(["bzip2", "-9", "-c"], path, plain)[1] is None:
            streams.append(("bzip2 -9", plain))
        for label, stream in streams:
            decoders = [("cairn", cairn.decompress)]
            if lb is not None:
                decoders.append(("lbzip2", lb.decompress))
            if stream == plain or label.startswith("pbzip2"):
                pb = next((t for t in ok_tools if t.tool == "pbzip2"), None)
                if pb is not None:
                    decoders.append(("pbzip2", pb.decompress))
            if not runner.dry_run:
                bad = [d for d, argv in decoders if not verify_decode(argv, stream, path)[0]]
                for d in bad:
                    errors.append(f"{name}/{g.gid}: {d} could not decode the .bz2 of {label}")
                decoders = [(d, a) for d, a in decoders if d not in bad]
                if not decoders:
                    continue
            slug = label.split()[0]
            times = runner.compare(f"{name}/{g.gid}/decode-{slug}",
                                   [(f"{dec_label(a)} < {label} output", sh_cmd(a, stream))
                                    for d, a in decoders])
            cm = None
            for (d, a), ts in zip(decoders, times):
                med = statistics.median(ts.times)
                if d == "cairn":
                    cm = med
                row = {**base, **ts.row(), "operation": "decompress-cross", "tool": d, "level": "",
                       "threads": argv_threads(a), "role": "cairn" if d == "cairn" else "peer",
                       "stream": label, "mb_per_s": f"{nbytes / 1e6 / med:.1f}",
                       "output_bytes": "" if runner.dry_run else os.path.getsize(stream),
                       "verified": "" if runner.dry_run else "yes", "load1": load1(),
                       "note": "output_bytes: size of the .bz2 decoded", "command": sh_cmd(a, stream)}
                if d != "cairn" and cm is not None and not runner.dry_run:
                    row["ratio_vs_peer_speed"] = f"{med / cm:.3f}"
                    if d == "lbzip2":
                        row["target"] = ">= 1.0x"
                        row["met"] = "yes" if med / cm >= 1.0 else "no"
                rows.append(row)


def dec_label(argv):
    """A short name for a decoder command: "cairn unpack -T 2", "pigz -p2 -d"."""
    return " ".join([os.path.basename(argv[0])] + [a for a in argv[1:] if a not in ("-c", "-q")])


def argv_threads(argv):
    """Threads a command line asks for (-T2, -T 2, -n2, -p2), else 1."""
    for a in argv:
        for opt in ("-T", "-n", "-p"):
            if a.startswith(opt) and a[len(opt):].isdigit():
                return int(a[len(opt):])
    if "-T" in argv:
        i = argv.index("-T")
        if i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
    return 1


# ---------------------------------------------------------------- facts

def machine_facts(data_dir, tmpdir, cairn):
    facts = []

    def add(k, v):
        facts.append(f"{k}: {v}")

    add("date_utc", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    add("nproc", run_text(["nproc"]))
    add("nproc_all", os.cpu_count())
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    fl = line.split(":", 1)[1].split()
                    flags = " ".join(x for x in fl if x in (
                        "sse4_2", "avx", "avx2", "avx512f", "avx512bw", "bmi2", "pclmulqdq", "sha_ni"))
        with open("/proc/meminfo") as f:
            add("memtotal", f.readline().split(":", 1)[1].strip())
    except OSError:
        pass
    add("cpu_model", model)
    add("cpu_flags_relevant", flags)
    add("kernel", " ".join(platform.uname()))
    add("os", run_text(["sh", "-c", ". /etc/os-release && echo \"$PRETTY_NAME\""]))
    add("loadavg_start", open("/proc/loadavg").read().strip())
    for what, d in (("data_dir", data_dir), ("tmp_dir", tmpdir)):
        add(what, d)
        add(f"{what}_fs", run_text(["findmnt", "-n", "-o", "FSTYPE,SOURCE,TARGET,OPTIONS", "-T", d]))
    add("cairn_binary", cairn)
    add("cairn_sha256", run_text(["sha256sum", cairn]).split()[0])
    add("cairn_mtime_utc", datetime.datetime.fromtimestamp(
        os.path.getmtime(cairn), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return facts


def tool_versions(cairn):
    out = []
    for argv in ([cairn, "--version"], ["hyperfine", "--version"], ["pigz", "--version"],
                 ["gzip", "--version"], ["zstd", "--version"], ["lz4", "--version"],
                 ["lzop", "--version"], ["bzip2", "--version"], ["lbzip2", "--version"],
                 ["pbzip2", "--version"], ["xz", "--version"], ["cat", "--version"],
                 ["rustc", "--version"], [sys.executable, "--version"]):
        text = run_text(argv).splitlines()
        out.append(f"$ {shlex.join(argv)}\n" + "\n".join(text[:2]))
    pkgs = run_text(["dpkg-query", "-W", "-f", "${Package} ${Version}\n", "pigz", "gzip", "zstd", "lz4",
                     "lzop", "bzip2", "lbzip2", "pbzip2", "xz-utils", "hyperfine", "coreutils"])
    out.append("$ dpkg-query -W (Debian packages)\n" + pkgs)
    return "\n\n".join(out) + "\n"


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", default="os,mem,random", help="comma list of: " + ",".join(INPUTS))
    ap.add_argument("--only", default=",".join(FORMATS), help="comma list of formats: " + ",".join(FORMATS))
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: a 64 MiB slice of each input and --runs 3")
    ap.add_argument("--runs", type=int, help="counted runs per command (default 5, 3 with --quick)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up runs (rounds), not counted (default 1)")
    ap.add_argument("--threads", type=int, default=2, help="threads for cairn and the parallel peers (2)")
    ap.add_argument("--with-t1", action="store_true", help="also time cairn -T1 (one core's codec speed)")
    ap.add_argument("--no-interleave", action="store_true",
                    help="one hyperfine call per comparison (A A A B B B) instead of rounds (A B A B)")
    ap.add_argument("--no-limits", action="store_true", help="skip the physical-limit measurements")
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target", "release", "cairn"))
    ap.add_argument("--data-dir", default=os.environ.get("CAIRN_BENCH_DATA", os.path.join(BENCH, "data")))
    ap.add_argument("--tmp-dir", help="where compressed files go (default: a new dir under bench/work)")
    ap.add_argument("--out-dir", help="run directory (default bench/runs/<UTC date>-pack[-quick])")
    ap.add_argument("--dry-run", action="store_true", help="write the command lines only, time nothing")
    args = ap.parse_args()

    runs = args.runs or (3 if args.quick else 5)
    names = [s for s in args.inputs.split(",") if s]
    fmts = [s for s in args.only.split(",") if s]
    for n in names:
        if n not in INPUTS:
            ap.error(f"unknown input {n!r} (known: {', '.join(INPUTS)})")
    for f in fmts:
        if f not in FORMATS:
            ap.error(f"unknown format {f!r} (known: {', '.join(FORMATS)})")
    if not os.access(args.cairn, os.X_OK):
        sys.exit(f"pack.py: {args.cairn} not found; run `cargo build --release` first")
    if not shutil.which("hyperfine"):
        sys.exit("pack.py: hyperfine not found (apt-get install hyperfine)")
    missing = [os.path.join(args.data_dir, INPUTS[n][0]) for n in names
               if not os.path.exists(os.path.join(args.data_dir, INPUTS[n][0]))]
    if missing:
        sys.exit("pack.py: missing inputs: " + " ".join(missing) +
                 "\n  make them with bench/datasets/make-os-image, make-memdump, make-random")

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    run_dir = args.out_dir
    if args.dry_run and not run_dir:
        run_dir = tempfile.mkdtemp(prefix="pack-dry-run-")
    if not run_dir:
        stem = os.path.join(BENCH, "runs", f"{date}-pack" + ("-quick" if args.quick else ""))
        run_dir, k = stem, 2
        while os.path.exists(run_dir):
            run_dir, k = f"{stem}-{k}", k + 1
    os.makedirs(run_dir, exist_ok=True)
    scratch = args.tmp_dir or os.path.join(BENCH, "work")
    os.makedirs(scratch, exist_ok=True)
    tmpdir = tempfile.mkdtemp(prefix="pack-", dir=scratch)
    log(f"run dir {run_dir}, scratch {tmpdir}")

    groups = [g for g in build_groups(args.cairn, args.threads, args.with_t1) if g.fmt in fmts]
    errors = []
    for g in groups:  # drop peers whose program is not installed
        keep = []
        for t in g.tools:
            if t.role == "peer" and not shutil.which(t.compress[0]):
                errors.append(f"{g.gid}: {t.compress[0]} not installed, skipped")
            else:
                keep.append(t)
        g.tools = keep

    runner = Runner(run_dir, runs, args.warmup, not args.no_interleave, args.dry_run)
    with open(os.path.join(run_dir, "machine.txt"), "w") as f:
        f.write("\n".join(machine_facts(args.data_dir, tmpdir, args.cairn)) + "\n")
    with open(os.path.join(run_dir, "versions.txt"), "w") as f:
        f.write(tool_versions(args.cairn))
    with open(os.path.join(run_dir, "run.txt"), "w") as f:
        f.write(f"argv: {shlex.join(sys.argv)}\nruns: {runs}\nwarmup: {args.warmup}\n"
                f"interleave: {not args.no_interleave}\norder: reversed every other round\n"
                f"threads: {args.threads}\nquick: {args.quick}\n"
                f"inputs: {','.join(names)}\nformats: {','.join(fmts)}\n"
                f"size_tolerance: {SIZE_TOLERANCE}\nmb: 10^6 bytes of uncompressed data per second\n"
                "page_cache: warm (inputs read before timing, never dropped)\n"
                "output: every timed command writes to /dev/null\n")

    rows = []
    t_start = time.time()
    try:
        # Inputs (64 MiB slices with --quick), read once so the cache is warm.
        inputs = []
        for n in names:
            src = os.path.join(args.data_dir, INPUTS[n][0])
            if args.quick:
                dst = os.path.join(tmpdir, f"{n}.slice")
                with open(src, "rb") as fi, open(dst, "wb") as fo:
                    fo.write(fi.read(64 << 20))
                src = dst
            elif not args.dry_run:
                subprocess.run(["cat", src], stdout=subprocess.DEVNULL, check=True)
            inputs.append((n, src))
        with open(os.path.join(run_dir, "inputs.txt"), "w") as f:
            for n, p in inputs:
                orig = os.path.join(args.data_dir, INPUTS[n][0])
                f.write(f"{n}: {orig} ({os.path.getsize(orig)} bytes; measured: {p}, "
                        f"{os.path.getsize(p)} bytes): {INPUTS[n][1]}\n")
                man = orig + ".manifest"
                if os.path.exists(man):
                    f.write("".join("    " + line for line in open(man).readlines()[:8]))

        if not args.no_limits:
            log("physical limits")
            measure_limits(runner, inputs, args.quick, rows)
        for n, p in inputs:
            for g in groups:
                log(f"{n}: {g.gid} ({os.path.getsize(p)} bytes, load {load1()})")
                try:
                    measure_group(runner, g, n, p, tmpdir, rows, errors)
                except (RuntimeError, OSError) as e:
                    errors.append(f"{n}/{g.gid}: {e}")
                    log(f"  {g.gid} failed: {e}")
                write_csv(run_dir, rows)  # keep what is done if a later step fails
    finally:
        write_csv(run_dir, rows)
        with open(os.path.join(run_dir, "errors.txt"), "w") as f:
            f.write("".join(e + "\n" for e in errors))
        with open(os.path.join(run_dir, "machine.txt"), "a") as f:
            f.write(f"loadavg_end: {open('/proc/loadavg').read().strip()}\n"
                    f"elapsed_s: {time.time() - t_start:.0f}\n")
        shutil.rmtree(tmpdir, ignore_errors=True)
    if args.dry_run:
        sys.stdout.write(open(os.path.join(run_dir, "commands.txt")).read())
        log(f"dry run: command lines above and in {run_dir}/commands.txt")
        return
    log(f"done: {run_dir}/results.csv ({len(rows)} rows, {len(errors)} problems"
        + (", see errors.txt)" if errors else ")"))
    log(f"report: {os.path.join(BENCH, 'report.py')} {run_dir}")


def write_csv(run_dir, rows):
    path = os.path.join(run_dir, "results.csv")
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in CSV_COLUMNS})
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
