#!/usr/bin/env python3
"""plot_wbcache_seed.py: seed 001's tables (A) and (B) from a
bench/wbcache.py run, drawn with matplotlib (medians over the runs):

  (A) time to write N random 4 KiB blocks back, by writeback batch size,
      against the same writes sent straight to the backing device, over
      the rotational model and over the disk;
  (B) random read IOPS by request size, through a clean cache and bare.

Usage: bench/plot_wbcache_seed.py RUN_DIR   (writes RUN_DIR/seed001.png)
"""
import sys

from plotting import grouped_bars, label_bars, plt, save, wbcache_medians

BATCHES = [1, 4, 32, 128, 256]
SIZES = ["1k", "4k", "16k", "64k", "128k"]


def main(run):
    med = wbcache_medians(run)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, tag in zip(axes[:2], ["hdd", "disk"]):
        labels = ["straight"] + [f"batch {b}" for b in BATCHES]
        ys = [med.get(("A", f"{tag} straight to backing", "s"), 0)]
        ys += [med.get(("A", f"{tag} writeback batch {b}", "s"), 0) for b in BATCHES]
        bars = ax.bar(labels, ys, color=["#999"] + ["#2a7"] * len(BATCHES))
        label_bars(ax, bars, ys, "{:.1f}")
        ax.set_ylabel("seconds")
        what = "rotational model" if tag == "hdd" else "this machine's disk"
        ax.set_title(f"(A) writeback of random 4 KiB writes, {what}")
        ax.tick_params(axis="x", labelrotation=30)
    ax = axes[2]
    series = [(name, [med.get(("B", f"read {s} {v}", "IOPS"), 0) for s in SIZES])
              for name, v in [("bare", "bare"), ("through a clean cache", "cache")]]
    grouped_bars(ax, SIZES, series, colors=["#999", "#2a7"])
    ax.set_yscale("log")
    ax.set_ylabel("random read IOPS (log scale)")
    ax.set_title("(B) read overhead of the cache, by request size")
    ax.legend(fontsize=8)
    save(fig, run, "seed001.png")


if __name__ == "__main__":
    main(sys.argv[1])
