#!/usr/bin/env python3
"""plot_wbcache_fs.py: a bench/wbcache-fs.py run as a chart, drawn with
matplotlib: for each filesystem load, the medians without the cache, with
it and with it in persistent-log mode, as multiples of the run without the
cache (so loads of different units share an axis), over this machine's
disk and over the rotational model.

Usage: bench/plot_wbcache_fs.py RUN_DIR   (writes RUN_DIR/fs.png)
"""
import csv
import os
import statistics
import sys

from plotting import grouped_bars, plt, save

VARIANTS = ["no cache", "cache", "plog"]
COLORS = ["#999", "#2a7", "#27a"]


def main(run):
    vals = {}
    with open(os.path.join(run, "results.csv")) as f:
        for r in csv.DictReader(f):
            vals.setdefault((r["load"], r["disk"], r["variant"]), []).append(float(r["value"]))
    med = {k: statistics.median(v) for k, v in vals.items()}
    loads = list(dict.fromkeys(k[0] for k in med))
    disks = [d for d in ("disk", "hdd") if any(k[1] == d for k in med)]
    fig, axes = plt.subplots(1, len(disks), figsize=(6 * len(disks), 4.5), squeeze=False)
    for ax, disk in zip(axes[0], disks):
        series = []
        for v in VARIANTS:
            series.append((v, [med.get((l, disk, v), 0) / med[(l, disk, "no cache")]
                               if med.get((l, disk, "no cache")) else 0 for l in loads]))
        grouped_bars(ax, loads, series, COLORS)
        log = max(max(v) for _, v in series) > 3
        if log:
            ax.set_yscale("log")
        ax.axhline(1, color="k", linewidth=0.8)
        ax.set_ylabel("÷ no cache" + (" (log scale)" if log else ""))
        ax.set_title(("this machine's disk" if disk == "disk" else "rotational model")
                     + ": ext4 on the served device")
        ax.legend(fontsize=8)
    save(fig, run, "fs.png")


if __name__ == "__main__":
    main(sys.argv[1])
