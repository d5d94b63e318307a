#!/usr/bin/env python3
"""gunzip-kinds.py: cairn's parallel gunzip on the kinds of single-member
gzip streams that are not `gzip -6` of compressible data, beside igzip,
pigz and gzip, read from the file and from a pipe.

The kinds (each made here, from the image given, and decoded by zlib once
to check it):
  gzip-6      `gzip -6` of the image: dynamic blocks, the common case
  stored      `gzip -6` of random bytes of the image's size: every block
              stored (a .gz of compressed or encrypted data)
  mixed       the image with a random 1 MiB after every 8 MiB, `gzip -6`:
              stored blocks after compressed ones
  fixed       zlib with strategy Z_FIXED: fixed-code blocks only, which no
              block search can find

Each round runs every decoder once per kind and source, output to
/dev/null; medians of the rounds. Every decoder's output is compared with
the input once first. Needs: gzip, igzip (Debian isal), pigz, zlib (Python).

Usage: bench/gunzip-kinds.py --cairn PATH [--also NAME=PATH]...
                             [--image bench/data/os2.img] [--rounds 3]
                             [--threads 2] [--tmp /dev/shm/gunzip-kinds]
Output: bench/runs/<UTC date>-gunzip-kinds[-K]/ (results.csv, summary.md,
commands.txt)
"""
import argparse
import csv
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import zlib

from plotting import new_run_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_inputs(image, tmp):
    """{kind: (raw path, gz path)}"""
    os.makedirs(tmp, exist_ok=True)
    size = os.path.getsize(image)
    rnd = random.Random(7)
    out = {}
    raw = os.path.join(tmp, "stored.raw")
    if not os.path.exists(raw):
        with open(raw, "wb") as f:
            left = size
            while left:
                n = min(left, 1 << 20)
                f.write(rnd.randbytes(n))
                left -= n
    out["stored"] = raw
    raw = os.path.join(tmp, "mixed.raw")
    if not os.path.exists(raw):
        with open(image, "rb") as src, open(raw, "wb") as f:
            while True:
                b = src.read(8 << 20)
                if not b:
                    break
                f.write(b)
                f.write(rnd.randbytes(1 << 20))
    out["mixed"] = raw
    out["gzip-6"] = image
    gz = {}
    for kind, path in out.items():
        g = os.path.join(tmp, kind + ".gz")
        if not os.path.exists(g):
            with open(g, "wb") as f:
                subprocess.run(["gzip", "-6", "-c", path], stdout=f, check=True)
        gz[kind] = (path, g)
    g = os.path.join(tmp, "fixed.gz")
    if not os.path.exists(g):
        c = zlib.compressobj(6, zlib.DEFLATED, 31, 8, zlib.Z_FIXED)
        with open(image, "rb") as src, open(g, "wb") as f:
            while True:
                b = src.read(1 << 20)
                if not b:
                    break
                f.write(c.compress(b))
            f.write(c.flush())
    gz["fixed"] = (image, g)
    return gz


def decoders(cairn, threads, also):
    t = str(threads)
    return [
        ("cairn unpack", [cairn, "unpack", "-T", t, "-c"]),
        *[(f"cairn ({name})", [path, "unpack", "-T", t, "-c"]) for name, path in also],
        ("igzip -d", ["igzip", "-d", "-c"]),
        ("pigz -d", ["pigz", "-p", t, "-d", "-c"]),
        ("gzip -d", ["gzip", "-d", "-c"]),
    ]


def command(argv, gz, source):
    cmd = " ".join(argv)
    return f"cat {gz} | {cmd}" if source == "pipe" else f"{cmd} {gz}"


def same(argv, gz, raw, source):
    """The decoder's output is the raw input, byte for byte."""
    p = subprocess.run(["sh", "-c", command(argv, gz, source) + f" | cmp -s - {raw}"])
    return p.returncode == 0


def timed(argv, gz, source):
    """Seconds, or None if the decoder failed (some fail only now and then)."""
    t = time.monotonic()
    p = subprocess.run(["sh", "-c", command(argv, gz, source) + " > /dev/null"])
    return time.monotonic() - t if p.returncode == 0 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--image", default=os.path.join(ROOT, "bench/data/os2.img"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tmp", default="/dev/shm/gunzip-kinds")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=PATH",
                    help="another cairn build, in the same rounds (repeat)")
    a = ap.parse_args()
    for tool in ("gzip", "igzip", "pigz"):
        if shutil.which(tool) is None:
            sys.exit(f"gunzip-kinds.py: {tool} is not installed")
    inputs = make_inputs(a.image, a.tmp)
    decs = decoders(a.cairn, a.threads, [x.split("=", 1) for x in a.also])
    out = new_run_dir(ROOT, "gunzip-kinds")
    rows, commands = [], []
    for kind, (raw, gz) in inputs.items():
        for source in ("file", "pipe"):
            for name, argv in decs:
                ok = same(argv, gz, raw, source)
                commands.append(command(argv, gz, source))
                if not ok:
                    print(f"{name} {kind} {source}: WRONG OUTPUT OR FAILED", file=sys.stderr)
                rows.append({"kind": kind, "source": source, "decoder": name,
                             "round": -1, "seconds": "", "correct": ok})
    for rnd in range(a.rounds):
        for kind, (raw, gz) in inputs.items():
            for source in ("file", "pipe"):
                for name, argv in decs:
                    if not next(r["correct"] for r in rows if r["kind"] == kind
                                and r["source"] == source and r["decoder"] == name):
                        continue
                    s = timed(argv, gz, source)
                    if s is None:
                        print(f"{name} {kind} {source}: FAILED in round {rnd}", file=sys.stderr)
                    rows.append({"kind": kind, "source": source, "decoder": name, "round": rnd,
                                 "seconds": "" if s is None else f"{s:.3f}",
                                 "correct": s is not None})
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(out, "commands.txt"), "w") as f:
        f.write(" ".join(sys.argv) + "\n" + "\n".join(commands) + "\n")
    sizes = {k: (os.path.getsize(r), os.path.getsize(g)) for k, (r, g) in inputs.items()}
    lines = [f"# gunzip of kinds of gzip streams, {a.threads} threads, output to /dev/null, "
             f"medians of {a.rounds}", "",
             "| kind | raw MB | gz MB | source | " + " | ".join(n for n, _ in decs)
             + " | igzip -d ÷ cairn |", "|---|--:|--:|---|" + "--:|" * (len(decs) + 1)]
    for kind in inputs:
        for source in ("file", "pipe"):
            med = {}
            for name, _ in decs:
                mine = [r for r in rows if r["kind"] == kind and r["source"] == source
                        and r["decoder"] == name]
                v = [float(r["seconds"]) for r in mine if r["round"] >= 0 and r["seconds"]]
                # A decoder that failed once, on any round, is reported failed.
                med[name] = statistics.median(v) if v and all(r["correct"] for r in mine) else None
            cells = [f"{med[n]:.2f}" if med[n] is not None else "failed" for n, _ in decs]
            c, i = med["cairn unpack"], med["igzip -d"]
            ratio = f"{i / c:.2f}x" if c and i else ""
            raw, g = sizes[kind]
            lines.append(f"| {kind} | {raw / 1e6:.0f} | {g / 1e6:.0f} | {source} | "
                         + " | ".join(cells) + f" | {ratio} |")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(out)


if __name__ == "__main__":
    main()
