#!/usr/bin/env python3
"""Seed 001's filesystem workloads (C)/(D) on an exported device:
ext4 on a loop device over nbdfuse over `cairn serve`, with and without
the write-back cache, over this machine's disk and over the rotational
cost model (`,hdd`).

  dbench    `dbench -D MNT -t SECS 4` (its default client load: many
            small files, fsync'd regularly); MB/s as dbench reports it
  fsync-1   fio 4 KiB random writes into a 64 MiB file, fsync after every
            write (the FLUSH-heavy load a persistent log is for); IOPS
  fsync-32  the same with an fsync every 32 writes; IOPS
  extract   seed 001's git-extract-like load: a tar of /usr/include (about
            22k files, 290 MB on Debian 12 with the build tools) unpacked
            into the filesystem, then `sync -f`; files per second, from
            the start of tar to the end of the sync

The ext4 filesystem (1 GiB, no discard) is made on the backing file
before each measurement; the cache file is new each time. Needs root,
/dev/fuse, nbdfuse (libnbd-bin), losetup, dbench and fio.

Each runs without the cache, with it, and with it in persistent-log
mode (`--cache-plog`).

Usage: bench/wbcache-fs.py [--runs 3] [--seconds 10] [--quick]
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve import ROOT, Server, log, run, save_run  # noqa: E402


class Stack:
    """server -> nbdfuse -> loop device -> ext4, torn down in reverse."""

    def __init__(self, cairn, work, spec, extra):
        self.work = work
        self.sock = os.path.join(work, "sock")
        self.fuse = os.path.join(work, "fuse")
        self.mnt = os.path.join(work, "mnt")
        os.makedirs(self.fuse, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        self.server = Server([cairn, "serve", "--file", spec, "--socket", self.sock, *extra], self.sock)
        self.nbdfuse = subprocess.Popen(["nbdfuse", self.fuse, f"nbd+unix:///d?socket={self.sock}"],
                                        stderr=subprocess.DEVNULL)
        t = time.time()
        while not os.path.exists(os.path.join(self.fuse, "nbd")):
            if time.time() - t > 20:
                raise RuntimeError("nbdfuse did not come up")
            time.sleep(0.05)
        self.loop = run(["losetup", "-f", "--show", os.path.join(self.fuse, "nbd")]).stdout.strip()
        run(["mount", "-t", "ext4", self.loop, self.mnt])

    def close(self):
        for cmd in (["umount", self.mnt], ["losetup", "-d", self.loop]):
            subprocess.run(cmd, capture_output=True)
        # Root: umount works without fusermount (not installed by default).
        subprocess.run(["umount", self.fuse], capture_output=True)
        try:
            self.nbdfuse.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.nbdfuse.kill()
        self.server.stop()


def dbench(mnt, secs):
    out = run(["dbench", "-D", mnt, "-t", str(secs), "4"]).stdout
    m = re.search(r"Throughput ([0-9.]+) MB/sec", out)
    return float(m.group(1))


def fio_fsync(mnt, every, secs):
    out = run(["fio", "--name=fs", f"--directory={mnt}", "--rw=randwrite", "--bs=4k", "--size=64M",
               f"--fsync={every}", "--time_based", f"--runtime={secs}", "--output-format=json",
               "--randseed=42"]).stdout
    return json.loads(out[out.index("{"):])["jobs"][0]["write"]["iops"]


def extract(mnt, tarball, files):
    t = time.monotonic()
    run(["tar", "-C", mnt, "-xf", tarball])
    run(["sync", "-f", mnt])
    return files / (time.monotonic() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target/release/cairn"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--disks", default="disk,hdd", help="backings to run: disk, hdd (default both)")
    ap.add_argument("--loads", default="dbench,fsync-1,fsync-32,extract")
    ap.add_argument("--cache-args", default="", help="extra serve arguments for the cached variants, "
                    "e.g. '--cache-dirty-high 0.5'")
    a = ap.parse_args()
    if a.quick:
        a.runs, a.seconds = 1, 4
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out_dir = a.out or os.path.join(ROOT, f"bench/runs/{date}-wbcache-fs" + ("-quick" if a.quick else ""))
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(os.path.join(ROOT, "bench/work"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="wbfs-", dir=os.path.join(ROOT, "bench/work"))
    back = os.path.join(work, "back.raw")
    cache = os.path.join(work, "cache.dev")
    more = a.cache_args.split()
    variants = [
        ("disk", "no cache", f"d={back}", []),
        ("disk", "cache", f"d={back},cache={cache}", more),
        ("disk", "plog", f"d={back},cache={cache}", ["--cache-plog", *more]),
        ("hdd", "no cache", f"d={back},hdd", []),
        ("hdd", "cache", f"d={back},hdd,cache={cache}", more),
        ("hdd", "plog", f"d={back},hdd,cache={cache}", ["--cache-plog", *more]),
    ]
    disks = [d for d in ("disk", "hdd") if d in a.disks.split(",")]
    variants = [v for v in variants if v[0] in disks]
    loads = [("dbench", "MB/s", lambda m: dbench(m, a.seconds)),
             ("fsync-1", "IOPS", lambda m: fio_fsync(m, 1, a.seconds)),
             ("fsync-32", "IOPS", lambda m: fio_fsync(m, 32, a.seconds))]
    if "extract" in a.loads.split(","):
        tarball = os.path.join(work, "src.tar")
        run(["tar", "-C", "/", "-cf", tarball, "usr/include"])
        files = int(run(["sh", "-c", f"tar -tf {tarball} | grep -vc '/$'"]).stdout.strip())
        loads.append(("extract", "files/s", lambda m: extract(m, tarball, files)))
    loads = [x for x in loads if x[0] in a.loads.split(",")]
    rows = []
    for r in range(a.runs):
        for lname, unit, fn in loads:
            for disk, name, spec, extra in variants:
                with open(back, "wb") as f:
                    f.truncate(1 << 30)
                run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", back])
                with open(cache, "wb") as f:
                    f.truncate(512 << 20)
                st = Stack(a.cairn, work, spec, extra)
                try:
                    v = fn(st.mnt)
                finally:
                    st.close()
                rows.append((lname, disk, name, v, unit))
                log(f"run {r + 1} {lname:9} {disk:5} {name:9} {v:10.1f} {unit}")
    med = {}
    for l, d, n, v, u in rows:
        med.setdefault((l, d, n, u), []).append(v)
    med = {k: statistics.median(v) for k, v in med.items()}
    with open(os.path.join(out_dir, "results.csv"), "w") as f:
        f.write("load,disk,variant,value,unit\n")
        for l, d, n, v, u in rows:
            f.write(f"{l},{d},{n},{v:.2f},{u}\n")
    lines = [f"# Filesystem workloads through the write-back cache ({os.path.basename(out_dir)})", "",
             f"ext4 on loop on nbdfuse on `cairn serve`; {a.runs} rounds of {a.seconds} s, medians.", "",
             "`plog` = the cache in persistent-log mode (`--cache-plog`).", "",
             "| load | unit | " + " | ".join(
                 f"{'hdd model' if d == 'hdd' else d}: no cache | cache | plog | cache ÷ none | plog ÷ none"
                 for d in disks) + " |",
             "|---|---|" + "--:|" * (5 * len(disks))]
    for lname, unit, _ in loads:
        cells = []
        for d in disks:
            c = [med.get((lname, d, n, unit)) or 0 for n in ("no cache", "cache", "plog")]
            cells += [f"{c[0]:.1f}", f"{c[1]:.1f}", f"{c[2]:.1f}",
                      f"{c[1] / c[0]:.2f}×" if c[0] else "", f"{c[2] / c[0]:.2f}×" if c[0] else ""]
        lines.append(f"| {lname} | {unit} | " + " | ".join(cells) + " |")
    save_run(out_dir, work, lines)


if __name__ == "__main__":
    main()
