#!/usr/bin/env python3
"""gunzip-range.py: reading a byte range of a one-member gzip file (written
by gzip -6, no sizes in it), cairn `unpack --range` against rapidgzip
`--ranges`, each with the index it made of the file itself and without
one, in one run, interleaved round by round.

The indexes are made first (`cairn unpack -t --index`, `rapidgzip
--export-index`) and their sizes reported. Every output is compared with
the same bytes of the image once. Times are wall-clock medians of
`--runs` rounds (every command once per round, in turn); the page cache
is warm (the gzip file is read in full before).

  bench/gunzip-range.py --cairn target/release/cairn --image IMG --gz IMG.gz
                        [--runs 5] --out-dir bench/runs/DATE-gunzip-range
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys
import time

RAPIDGZIP = os.environ.get("RAPIDGZIP", "/opt/cairn-venv/bin/rapidgzip")
MIB = 1 << 20


def ranges(size):
    """(label, start, length): 1 MiB near the start, middle and end, and
    64 MiB from the middle."""
    mid = size // 2 // MIB * MIB
    end = (size - 2 * MIB) // MIB * MIB
    return [
        ("1 MiB at 1 MiB", MIB, MIB),
        (f"1 MiB at {mid // MIB} MiB", mid, MIB),
        (f"1 MiB at {end // MIB} MiB", end, MIB),
        (f"64 MiB at {mid // MIB} MiB", mid, 64 * MIB),
    ]


def commands(a, cidx, ridx, start, length):
    t = str(a.threads)
    cr = ["--range", f"{start}+{length}", "-c", a.gz]
    rr = ["--ranges", f"{length}@{start}", "-c", a.gz]
    return [
        ("cairn --index", [a.cairn, "unpack", "-T", t, "--index", cidx] + cr),
        ("rapidgzip --import-index", [RAPIDGZIP, "-P", t, "--import-index", ridx] + rr),
        ("cairn (no index)", [a.cairn, "unpack", "-T", t] + cr),
        ("rapidgzip (no index)", [RAPIDGZIP, "-P", t] + rr),
    ]


def timed(cmd, out_path):
    with open(out_path, "wb") as out:
        t = time.monotonic()
        subprocess.run(cmd, stdout=out, check=True)
        return time.monotonic() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--gz", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out-dir", required=True)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    work = os.path.join(a.out_dir, "work")
    os.makedirs(work, exist_ok=True)
    cidx = os.path.join(work, "cairn.gzx")
    ridx = os.path.join(work, "rapidgzip.idx")
    for p in (cidx, ridx):
        if os.path.exists(p):
            os.remove(p)
    t0 = time.monotonic()
    subprocess.run([a.cairn, "unpack", "-T", str(a.threads), "-t", "--index", cidx, a.gz], check=True)
    t1 = time.monotonic()
    subprocess.run([RAPIDGZIP, "-P", str(a.threads), "--export-index", ridx, "-d", "-o", "/dev/null",
                    "--force", a.gz], check=True)
    t2 = time.monotonic()
    with open(a.gz, "rb") as f:
        while f.read(16 * MIB):
            pass
    size = os.path.getsize(a.image)
    out = os.path.join(work, "out")
    rows = []
    with open(a.image, "rb") as img:
        for label, start, length in ranges(size):
            img.seek(start)
            want = img.read(length)
            cmds = commands(a, cidx, ridx, start, length)
            for name, cmd in cmds:
                timed(cmd, out)
                with open(out, "rb") as f:
                    if f.read() != want:
                        sys.exit(f"{name} {label}: output differs from the image")
            times = {name: [] for name, _ in cmds}
            for _ in range(a.runs):
                for name, cmd in cmds:
                    times[name].append(timed(cmd, out))
            for name, cmd in cmds:
                rows.append({"range": label, "tool": name, "median_s": statistics.median(times[name]),
                             "runs": " ".join(f"{x:.4f}" for x in times[name]), "command": " ".join(cmd)})
    os.remove(out)
    with open(os.path.join(a.out_dir, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    med = {(r["range"], r["tool"]): r["median_s"] for r in rows}
    lines = [f"# Range reads of {os.path.basename(a.gz)} ({size} bytes decoded)", "",
             f"Indexes: cairn {os.path.getsize(cidx)} bytes, made in {t1 - t0:.2f} s (`unpack -t --index`); "
             f"rapidgzip {os.path.getsize(ridx)} bytes, made in {t2 - t1:.2f} s (`--export-index`). "
             f"Medians of {a.runs} interleaved rounds, -T/-P {a.threads}, page cache warm, output to a file.", "",
             "| range | cairn --index | rapidgzip --import-index | ratio | cairn, no index | rapidgzip, no index | ratio |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for label, _, _ in ranges(size):
        ci, ri = med[(label, "cairn --index")], med[(label, "rapidgzip --import-index")]
        cn, rn = med[(label, "cairn (no index)")], med[(label, "rapidgzip (no index)")]
        lines.append(f"| {label} | {ci:.3f} s | {ri:.3f} s | {ri / ci:.2f}x | {cn:.3f} s | {rn:.3f} s | {rn / cn:.2f}x |")
    lines += ["", "Ratio: rapidgzip's time ÷ cairn's (above 1: cairn is faster)."]
    with open(os.path.join(a.out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(a.out_dir, "versions.txt"), "w") as f:
        for cmd in ([a.cairn, "--version"], [RAPIDGZIP, "--version"]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            f.write((r.stdout or r.stderr).splitlines()[0] + "\n")
    for p in (cidx, ridx):
        os.remove(p)
    os.rmdir(work)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
