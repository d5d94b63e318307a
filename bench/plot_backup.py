#!/usr/bin/env python3
"""plot_backup.py: bar charts of a bench/backup.py run (backup and restore
MB/s of every tool on every input), drawn with matplotlib.

Usage: bench/plot_backup.py RUN_DIR   (writes RUN_DIR/backup.png)
"""
import csv
import os
import sys

from plotting import grouped_bars, plt, save

STEPS = {  # (input, step) -> label
    ("os+os2", "backup-1"): "os.img",
    ("os+os2", "backup-2"): "os2.img after os.img",
    ("mem", "backup"): "mem.core",
    ("random", "backup"): "random.bin",
}
RESTORES = {
    ("os+os2", "restore-1"): "os.img",
    ("os+os2", "restore-2"): "os2.img",
    ("mem", "restore"): "mem.core",
    ("random", "restore"): "random.bin",
}


def main(run):
    rows = list(csv.DictReader(open(os.path.join(run, "summary.csv"))))
    tools = []
    for r in rows:
        if r["tool_id"] not in tools and r["step"] != "copy":
            tools.append(r["tool_id"])
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, steps, title in ((axes[0], STEPS, "backup"), (axes[1], RESTORES, "restore")):
        labels = [v for v in steps.values()]
        series = []
        for t in tools:
            vals = []
            for key in steps:
                m = [float(r["mb_per_s"]) for r in rows
                     if (r["input"], r["step"]) == key and r["tool_id"] == t and r["mb_per_s"]]
                vals.append(m[0] if m else 0)
            series.append((t, vals))
        grouped_bars(ax, labels, series)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_ylabel("MB/s (median)")
        ax.set_title(f"{title}, {os.path.basename(run.rstrip('/'))}")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    save(fig, run, "backup.png")


if __name__ == "__main__":
    main(sys.argv[1])
