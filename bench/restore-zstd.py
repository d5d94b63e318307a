#!/usr/bin/env python3
"""restore-zstd.py: cairn restore of an OS image stored with zstd -3
against single-threaded `zstd -d` of the same image (issue 20's
"restore at the codec's limit").

What: the image is backed up once into a repository on tmpfs (`-c zstd:3`,
default chunker and 2 MiB groups) and compressed once with `zstd -3` next
to it. Each round then times, for each cairn build given, `zstd -d -T1`
and right after it that build's `cairn restore -T 2` of the same image,
to the same kind of destination:
  null  standard output to /dev/null
  pipe  standard output through `cat` to /dev/null
  file  a new file on the work disk (cairn: O_DIRECT and fsync; zstd:
        its own sparse write, then `sync` of the file)
The machine's speed drifts from minute to minute, so each cairn run is
divided by the zstd run just before it; builds alternate their order by
round. Reported: medians and ranges of those ratios.

Needs: zstd, a release build of cairn. Output: bench/runs/<UTC date>-restore-zstd[-K]/
(results.csv, report.md, commands.txt).

Usage: bench/restore-zstd.py [--image bench/data/os2.img] [--rounds 7]
                             [--dest null,pipe,file] [--build NAME=PATH]...
                             [--pause S]

With `--pause S`, every timed command starts S seconds after the one
before, so that memory it touches afresh is cold (see bench/gunzip.py).
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import time

from plotting import new_run_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd):
    t = time.monotonic()
    subprocess.run(["sh", "-c", cmd], check=True)
    return time.monotonic() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default=os.path.join(ROOT, "bench/data/os2.img"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dest", default="null,pipe,file")
    ap.add_argument("--build", action="append", metavar="NAME=PATH",
                    help="a cairn build (repeat); default: target/release/cairn")
    ap.add_argument("--pause", type=float, default=0,
                    help="seconds of idle before each timed command (cold memory)")
    ap.add_argument("--tmpfs", default="/dev/shm/cairn-restore-zstd")
    ap.add_argument("--work", default=os.path.join(ROOT, "bench/work/restore-zstd"))
    a = ap.parse_args()
    builds = [b.split("=", 1) for b in (a.build or [f"cairn={ROOT}/target/release/cairn"])]
    out = new_run_dir(ROOT, "restore-zstd")
    shutil.rmtree(a.tmpfs, ignore_errors=True)
    os.makedirs(a.tmpfs)
    os.makedirs(a.work, exist_ok=True)
    repo, zst = os.path.join(a.tmpfs, "repo"), os.path.join(a.tmpfs, "image.zst")
    first = builds[0][1]
    subprocess.run([first, "init", repo, "--encryption", "none"], check=True, capture_output=True)
    subprocess.run([first, "backup", a.image, "--repo", repo, "--name", "img", "-c", "zstd:3", "-q"], check=True)
    subprocess.run(["zstd", "-3", "-q", "-f", a.image, "-o", zst], check=True)
    fz, fc = os.path.join(a.work, "zstd.out"), os.path.join(a.work, "cairn.out")
    zstd_cmd = {
        "null": f"zstd -d -T1 -q -c {zst} > /dev/null",
        "pipe": f"zstd -d -T1 -q -c {zst} | cat > /dev/null",
        "file": f"rm -f {fz}; zstd -d -T1 -q -f {zst} -o {fz} && sync {fz}",
    }

    def cairn_cmd(binary, dest):
        r = f"{binary} restore -q -T 2 --repo {repo} img"
        return {"null": f"{r} - > /dev/null", "pipe": f"{r} - | cat > /dev/null",
                "file": f"rm -f {fc}; {r} {fc}"}[dest]

    rows, commands = [], set()
    try:
        for dest in a.dest.split(","):
            for rnd in range(a.rounds):
                order = builds if rnd % 2 == 0 else builds[::-1]
                for name, binary in order:
                    time.sleep(a.pause)
                    z = timed(zstd_cmd[dest])
                    time.sleep(a.pause)
                    c = timed(cairn_cmd(binary, dest))
                    commands.update([zstd_cmd[dest], cairn_cmd(binary, dest)])
                    rows.append({"dest": dest, "round": rnd, "build": name, "zstd_s": round(z, 3),
                                 "cairn_s": round(c, 3), "zstd_over_cairn": round(z / c, 3)})
                    print(f"{dest} round {rnd} {name}: zstd -d {z:.3f} s, cairn {c:.3f} s, {z / c:.2f}x",
                          file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(a.tmpfs, ignore_errors=True)
        shutil.rmtree(a.work, ignore_errors=True)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(out, "commands.txt"), "w") as f:
        f.write("\n".join(sorted(commands)) + "\n")
    lines = [f"Restore of {os.path.basename(a.image)} against `zstd -d -T1`, {a.rounds} rounds, "
             "each cairn run divided by the zstd run just before it"
             + (f", {a.pause:g} s idle before each command." if a.pause else "."), "",
             "| destination | build | cairn s (median) | zstd -d s (median) | zstd ÷ cairn, median (range) |",
             "|---|---|--:|--:|--:|"]
    for dest in a.dest.split(","):
        for name, _ in builds:
            rs = [r for r in rows if r["dest"] == dest and r["build"] == name]
            ratios = [r["zstd_over_cairn"] for r in rs]
            lines.append(f"| {dest} | {name} | {statistics.median(r['cairn_s'] for r in rs):.3f} | "
                         f"{statistics.median(r['zstd_s'] for r in rs):.3f} | "
                         f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
