#!/usr/bin/env python3
"""chunker.py: choose cairn's default chunker by measurement.

What: for each chunker, back up the first OS image into a fresh repository,
then the second version on top; and the second alone into another fresh
repository. Reports, per chunker: chunks (index RAM at 32 bytes each),
backup speed of each image, repository size after each, and the dedup
saving on the second image = 1 - (bytes it adds on top of the first) /
(bytes it costs alone).

Why: small chunks find more shared data (ext4 lays the same files out at
different offsets in the two images) but cost index memory and per-chunk
overhead; the default must reach the issue's >= 30% saving at a good speed.

Run: python3 bench/chunker.py [--cairn target/release/cairn] [--codec zstd:3]
      [--chunkers cdc:4K,16K,64K,fixed:4K ...] [--out-dir bench/runs/DATE-chunker]
Inputs: bench/data/os.img and bench/data/os2.img (bench/datasets/make-os-image).
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, time

DEFAULT = ["cdc:2K,8K,32K", "cdc:4K,16K,64K", "cdc:8K,32K,128K", "cdc:16K,64K,256K",
           "fixed:4K", "fixed:16K", "fixed:64K"]


def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def backup(cairn, repo, src, name, chunker, codec, threads):
    out = subprocess.run([cairn, "backup", src, "--repo", repo, "--name", name, "--chunker", chunker,
                          "-c", codec, "-T", str(threads), "-q", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cairn", default="target/release/cairn")
    ap.add_argument("--codec", default="zstd:3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunkers", nargs="*", default=DEFAULT)
    ap.add_argument("--data-dir", default="bench/data")
    ap.add_argument("--out-dir", default=time.strftime("bench/runs/%Y-%m-%d-chunker", time.gmtime()))
    a = ap.parse_args()
    img1, img2 = os.path.join(a.data_dir, "os.img"), os.path.join(a.data_dir, "os2.img")
    for p in (img1, img2):
        if not os.path.exists(p):
            sys.exit(f"missing {p}: build it with bench/datasets/make-os-image")
    os.makedirs(a.out_dir, exist_ok=True)
    version = subprocess.run([a.cairn, "--version"], capture_output=True, text=True).stdout.strip()
    rows = []
    for ch in a.chunkers:
        work = tempfile.mkdtemp(prefix="cairn-chunker-", dir="bench/work" if os.path.isdir("bench/work") else None)
        try:
            both, alone = os.path.join(work, "both"), os.path.join(work, "alone")
            for r in (both, alone):
                subprocess.run([a.cairn, "init", r, "--encryption", "none"], check=True, capture_output=True)
            b1 = backup(a.cairn, both, img1, "os", ch, a.codec, a.threads)
            size1 = du(both)
            b2 = backup(a.cairn, both, img2, "os", ch, a.codec, a.threads)
            size2 = du(both)
            b3 = backup(a.cairn, alone, img2, "os", ch, a.codec, a.threads)
            alone_size = du(alone)
            stats = json.loads(subprocess.run([a.cairn, "stats", "--repo", both, "--json"], check=True,
                                              capture_output=True, text=True).stdout)
            added = size2 - size1
            row = {
                "chunker": ch, "codec": a.codec,
                "chunks": stats["chunks"],
                "index_bytes": stats["chunks"] * 32,
                "img1_mb_s": b1["mb_per_s"], "img2_mb_s": b2["mb_per_s"],
                "repo_after_1": size1, "repo_after_2": size2,
                "img2_adds": added, "img2_alone": alone_size,
                "saving": 1 - added / alone_size,
                "img2_dedup_bytes": b2["bytes_dedup"], "img2_alone_dedup_bytes": b3["bytes_dedup"],
            }
            rows.append(row)
            print(f"{ch:>18}: saving {row['saving']*100:5.1f}%  adds {added/2**20:7.1f} MiB of "
                  f"{alone_size/2**20:7.1f} alone  repo {size2/2**20:7.1f} MiB  chunks {row['chunks']:7d}  "
                  f"{b1['mb_per_s']:6.0f} / {b2['mb_per_s']:6.0f} MB/s", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(a.out_dir, "results.json"), "w") as f:
        json.dump({"cairn": version, "threads": a.threads, "rows": rows,
                   "nproc": os.cpu_count(), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f, indent=1)


if __name__ == "__main__":
    main()
