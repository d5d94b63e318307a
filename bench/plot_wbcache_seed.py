#!/usr/bin/env python3
"""plot_wbcache_seed.py: seed 001's tables (A) and (B) from a
bench/wbcache.py run, drawn with matplotlib (medians over the runs):

  (A) time to write N random 4 KiB blocks back, by writeback batch size,
      against the same writes sent straight to the backing device, over
      the rotational model and over the disk;
  (B) random read IOPS by request size, through a clean cache and bare.

Usage: bench/plot_wbcache_seed.py RUN_DIR   (writes RUN_DIR/seed001.png)
"""
import csv
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BATCHES = [1, 4, 32, 128, 256]
SIZES = ["1k", "4k", "16k", "64k", "128k"]


def main(run):
    vals = {}
    with open(os.path.join(run, "results.csv")) as f:
        for r in csv.DictReader(f):
            vals.setdefault((r["test"], r["variant"]), []).append(float(r["value"]))
    med = {k: statistics.median(v) for k, v in vals.items()}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, tag in zip(axes[:2], ["hdd", "disk"]):
        labels = ["straight"] + [f"batch {b}" for b in BATCHES]
        ys = [med.get(("A", f"{tag} straight to backing"), 0)]
        ys += [med.get(("A", f"{tag} writeback batch {b}"), 0) for b in BATCHES]
        bars = ax.bar(labels, ys, color=["#999"] + ["#2a7"] * len(BATCHES))
        for bar, y in zip(bars, ys):
            ax.annotate(f"{y:.1f}", (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("seconds")
        what = "rotational model" if tag == "hdd" else "this machine's disk"
        ax.set_title(f"(A) writeback of random 4 KiB writes, {what}")
        ax.tick_params(axis="x", labelrotation=30)
    ax = axes[2]
    width = 0.4
    xs = range(len(SIZES))
    bare = [med.get(("B", f"read {s} bare"), 0) for s in SIZES]
    cache = [med.get(("B", f"read {s} cache"), 0) for s in SIZES]
    ax.bar([x - width / 2 for x in xs], bare, width, label="bare", color="#999")
    ax.bar([x + width / 2 for x in xs], cache, width, label="through a clean cache", color="#2a7")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(SIZES)
    ax.set_yscale("log")
    ax.set_ylabel("random read IOPS (log scale)")
    ax.set_title("(B) read overhead of the cache, by request size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = os.path.join(run, "seed001.png")
    fig.savefig(out, dpi=100)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1])
