#!/usr/bin/env python3
"""random-read.py: a served OS image under sustained 4 KiB random reads,
cairn against qemu-nbd on a compressed qcow2 (issue 20: "4 KiB random
reads at depth 16 over the whole image at least 3x qemu-nbd on a
compressed qcow2, repository size growing at most 5 %").

What: IMAGE (default bench/data/os2.img) backed up with cairn's defaults
(zstd:3, 2 MiB groups, encrypted) and converted with `qemu-img convert -c`.
Servers, each started fresh on a unix socket:
  qemu-qcow2          qemu-nbd -t -r -f qcow2 on the qcow2
  cairn               cairn serve --repo R (defaults: --image-cache 256M,
                      --image-compact-cache 1G)
  cairn-no-compact    the same with --image-compact-cache 0 (the decoded
                      cache alone: what cairn did before the second tier)
  cairn-compact-64M   --image-compact-cache 64M: a second tier smaller than
                      the image's compact form, so its copies are spilled
                      to the third tier on disk (--image-spill, 8G)
  cairn-compact-64M-no-spill
                      the same with --image-spill 0: reads that miss the
                      64M tier decode whole groups (before the spill tier)
Each server: fio's nbd engine, randread 4 KiB, iodepth 16, over the whole
image; a first phase of --cold seconds from the fresh server (caches
empty), then a steady phase of --steady seconds; IOPS, completion latency
p50/p99/p99.9/max of each phase, the reads the disk holding the work
directory served in each phase (its /sys/block stat: requests and MB, the
whole device's, so nothing else should run), and the server's peak RSS
(VmHWM) at the end. Rounds run the servers in turn, in a rotated order each round.

With --also NAME=BIN (repeatable), another cairn build serves too, as
"cairn (NAME)" and "cairn-no-compact (NAME)": a change paired against the
build before it in the same rounds. --servers keeps only the servers named
(qemu-qcow2, the report's yardstick, is always kept).

With --memory-limit SIZE each server runs in a cgroup v1 memory cgroup of
SIZE, which counts its page cache too (needs root), the page cache dropped
before each: a machine whose memory is smaller than what the server reads,
so that what does not fit comes from the disk (the repository's packs and
cairn's spill file; the qcow2 for qemu-nbd).

Usage: bench/random-read.py [--cairn BIN] [--image IMG] [--rounds 2]
                            [--cold 10] [--steady 30] [--out DIR]
                            [--also NAME=BIN]... [--servers A,B,...]
                            [--memory-limit SIZE]
Results in bench/runs/<date>-random-read/: results.csv, report.md,
random-read.png, commands.txt.
"""
import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plotting  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASSWORD = "cairn-bench"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def fio(sock, export, seconds, commands):
    cmd = ["fio", "--name=rand", "--ioengine=nbd", f"--uri=nbd+unix:///{export}?socket={sock}",
           "--rw=randread", "--bs=4k", "--iodepth=16", "--time_based", f"--runtime={seconds}",
           "--output-format=json"]
    commands.append(" ".join(cmd))
    out = run(cmd).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    p = j["clat_ns"]["percentile"]
    return {
        "iops": j["iops"],
        "p50_us": p["50.000000"] / 1e3,
        "p99_us": p["99.000000"] / 1e3,
        "p999_us": p["99.900000"] / 1e3,
        "max_us": j["clat_ns"]["max"] / 1e3,
    }


CGROUP = "/sys/fs/cgroup/memory"


def memory_box(size):
    """A cgroup v1 memory cgroup limited to SIZE (K/M/G suffix), with its
    page cache counted, for the servers: memory smaller than the image's
    copies, so what does not fit is read from the disk."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    unit = units.get(size[-1].upper())
    n = int(float(size[:-1]) * unit) if unit else int(size)
    if not os.path.exists(os.path.join(CGROUP, "memory.limit_in_bytes")):
        sys.exit(f"--memory-limit needs cgroup v1's memory controller at {CGROUP}")
    with open("/proc/swaps") as f:
        if len(f.read().splitlines()) > 1:
            log("swap is on: the servers' heap may go there, not only their page cache")
    box = os.path.join(CGROUP, f"cairn-bench-{os.getpid()}")
    os.mkdir(box)
    with open(os.path.join(box, "memory.limit_in_bytes"), "w") as f:
        f.write(str(n))
    return box


def enter(box):
    with open(os.path.join(box, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def disk_stat_path(path):
    """The /sys stat file of the block device holding PATH."""
    st = os.stat(path)
    return f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"


def disk_reads(stat):
    """(read requests completed, bytes read) of a block device so far."""
    with open(stat) as f:
        fields = f.read().split()
    return int(fields[0]), int(fields[2]) * 512


def timed(stat, fn):
    """fn()'s result, with the disk reads made while it ran."""
    r0, b0 = disk_reads(stat)
    m = fn()
    r1, b1 = disk_reads(stat)
    return dict(m, disk_reads=r1 - r0, disk_read_mb=(b1 - b0) / 1e6)


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target/release/cairn"))
    ap.add_argument("--image", default=os.path.join(ROOT, "bench/data/os2.img"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cold", type=int, default=10)
    ap.add_argument("--steady", type=int, default=30)
    ap.add_argument("--out", default=None)
    ap.add_argument("--also", action="append", default=[], metavar="NAME=BIN",
                    help="another cairn build, served in the same rounds")
    ap.add_argument("--servers", default=None, help="comma list of servers to keep")
    ap.add_argument("--memory-limit", default=None, metavar="SIZE",
                    help="run each server in a cgroup v1 memory cgroup of SIZE (e.g. 640M: "
                         "its page cache counts), the page cache dropped before each")
    a = ap.parse_args()
    for tool in ("fio", "qemu-img", "qemu-nbd"):
        if not shutil.which(tool):
            sys.exit(f"missing {tool}")
    out = a.out or plotting.new_run_dir(ROOT, "random-read")
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(dir=os.path.join(ROOT, "bench/work"), prefix="random-read.")
    box = memory_box(a.memory_limit) if a.memory_limit else None
    env = dict(os.environ, CAIRN_PASSWORD=PASSWORD, CAIRN_CACHE_DIR=os.path.join(work, "cache"))
    stat = disk_stat_path(work)
    if not os.path.exists(stat):
        sys.exit(f"no block device stat for {work} ({stat}): disk reads cannot be counted")
    commands = []
    try:
        repo, qcow = os.path.join(work, "repo"), os.path.join(work, "img.qcow2")
        for cmd in ([a.cairn, "init", repo], [a.cairn, "backup", a.image, "--repo", repo, "--name", "img", "-q"],
                    ["qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2", a.image, qcow]):
            commands.append(" ".join(cmd))
            run(cmd, env=env)
        sizes = {
            "image": os.path.getsize(a.image),
            "repo": int(run(["du", "-sb", repo]).stdout.split()[0]),
            "qcow2": os.path.getsize(qcow),
        }
        sock = os.path.join(work, "s.sock")
        servers = {
            "qemu-qcow2": ["qemu-nbd", "-t", "-r", "-f", "qcow2", "-k", sock, "-x", "img", qcow],
            "cairn": [a.cairn, "serve", "--repo", repo, "--socket", sock],
            "cairn-no-compact": [a.cairn, "serve", "--repo", repo, "--socket", sock,
                                 "--image-compact-cache", "0"],
            "cairn-compact-64M": [a.cairn, "serve", "--repo", repo, "--socket", sock,
                                  "--image-compact-cache", "64M"],
            "cairn-compact-64M-no-spill": [a.cairn, "serve", "--repo", repo, "--socket", sock,
                                           "--image-compact-cache", "64M", "--image-spill", "0"],
        }
        for name, binary in (x.split("=", 1) for x in a.also):
            servers[f"cairn ({name})"] = [binary, *servers["cairn"][1:]]
            servers[f"cairn-no-compact ({name})"] = [binary, *servers["cairn-no-compact"][1:]]
        if a.servers:
            keep = set(a.servers.split(",")) | {"qemu-qcow2"}
            servers = {k: v for k, v in servers.items()
                       if k in keep or k.split(" (")[0] in keep and " (" in k}
        for cmd in servers.values():
            commands.append(" ".join(cmd))
        rows = []
        names = list(servers)
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                if os.path.exists(sock):
                    os.unlink(sock)
                if box:
                    drop_caches()
                p = subprocess.Popen(servers[name], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL,
                                     preexec_fn=(lambda: enter(box)) if box else None)
                try:
                    t = time.monotonic()
                    while not os.path.exists(sock):
                        if p.poll() is not None or time.monotonic() - t > 30:
                            sys.exit(f"{name} did not start")
                        time.sleep(0.05)
                    cold = timed(stat, lambda: fio(sock, "img", a.cold, commands))
                    steady = timed(stat, lambda: fio(sock, "img", a.steady, commands))
                    rss = peak_rss_kib(p.pid)
                finally:
                    p.terminate()
                    p.wait()
                for phase, m in (("cold", cold), ("steady", steady)):
                    rows.append(dict(round=r + 1, server=name, phase=phase, rss_kib=rss, **m))
                log(f"round {r + 1} {name:18} cold {cold['iops']:9.0f} IOPS  steady "
                    f"{steady['iops']:9.0f} IOPS  p99.9 {steady['p999_us']:8.0f} us  "
                    f"max {steady['max_us']:8.0f} us  rss {rss // 1024} MiB  disk "
                    f"{steady['disk_reads']} reads {steady['disk_read_mb']:.0f} MB")
        with open(os.path.join(out, "results.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        with open(os.path.join(out, "commands.txt"), "w") as f:
            f.write("\n".join(dict.fromkeys(commands)) + "\n")
        report(out, a, sizes, rows, names)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if box:
            try:
                os.rmdir(box)
            except OSError as e:
                log(f"left cgroup {box}: {e}")


def report(out, a, sizes, rows, names):
    def med(server, phase, key):
        return statistics.median(r[key] for r in rows if r["server"] == server and r["phase"] == phase)

    cairn_v = run([a.cairn, "--version"]).stdout.strip()
    qemu_v = run(["qemu-nbd", "--version"]).stdout.splitlines()[0]
    lines = [
        "# Served image, sustained 4 KiB random reads (random-read.py)", "",
        f"Image {a.image} ({sizes['image']} bytes); cairn repository {sizes['repo']} bytes "
        f"(defaults: zstd:3, 2 MiB groups, encrypted), qcow2 -c {sizes['qcow2']} bytes. "
        f"{cairn_v}; {qemu_v}. fio nbd randread 4 KiB, depth 16, whole image: {a.cold} s from a "
        f"fresh server (cold), then {a.steady} s (steady). Medians of {a.rounds} rounds."
        + (f" Each server in a memory cgroup of {a.memory_limit} (page cache counted), "
           f"caches dropped before it." if a.memory_limit else ""), "",
        "| server | phase | IOPS | ÷ qcow2 | p50 µs | p99 µs | p99.9 µs | max µs | peak RSS MiB "
        "| disk reads | MB from disk |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for phase in ("cold", "steady"):
        q = med("qemu-qcow2", phase, "iops")
        for s in names:
            lines.append(
                f"| {s} | {phase} | {med(s, phase, 'iops'):.0f} | {med(s, phase, 'iops') / q:.2f}x "
                f"| {med(s, phase, 'p50_us'):.0f} | {med(s, phase, 'p99_us'):.0f} "
                f"| {med(s, phase, 'p999_us'):.0f} | {med(s, phase, 'max_us'):.0f} "
                f"| {med(s, phase, 'rss_kib') / 1024:.0f} | {med(s, phase, 'disk_reads'):.0f} "
                f"| {med(s, phase, 'disk_read_mb'):.0f} |")
    if "cairn" in names:
        lines += ["", f"Target (steady): cairn ÷ qemu-qcow2 ≥ 3x: "
                  f"{'yes' if med('cairn', 'steady', 'iops') >= 3 * med('qemu-qcow2', 'steady', 'iops') else 'no'}"
                  f" ({med('cairn', 'steady', 'iops') / med('qemu-qcow2', 'steady', 'iops'):.2f}x)."]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    fig, axes = plotting.plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((axes[0], "iops", "4 KiB random reads, IOPS (log)"),
                           (axes[1], "p999_us", "p99.9 completion latency, µs (log)")):
        series = [(s, [med(s, ph, key) for ph in ("cold", "steady")]) for s in names]
        plotting.grouped_bars(ax, [f"first {a.cold} s", f"next {a.steady} s"], series)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.legend(fontsize=8)
    plotting.save(fig, out, "random-read.png")


if __name__ == "__main__":
    main()
