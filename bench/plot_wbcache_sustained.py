#!/usr/bin/env python3
"""plot_wbcache_sustained.py: bench/wbcache.py's test (T) as a chart, drawn
with matplotlib: steady-state IOPS of the bare device and of the cache in
front of it (rotational model and plain file), and the completion latency
percentiles of each (median over the runs).

Usage: bench/plot_wbcache_sustained.py RUN_DIR   (writes RUN_DIR/sustained.png)
"""
import csv
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

VARIANTS = ["hdd bare", "hdd cache", "file bare", "file cache"]
LATENCY = ["p50 ms", "p99 ms", "p99.9 ms", "max ms"]


def main(run):
    vals = {}
    with open(os.path.join(run, "results.csv")) as f:
        for r in csv.DictReader(f):
            if r["test"] == "T":
                vals.setdefault((r["variant"], r["unit"]), []).append(float(r["value"]))
    med = {k: statistics.median(v) for k, v in vals.items()}
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    iops = [med.get((v, "IOPS"), 0) for v in VARIANTS]
    bars = a.bar(VARIANTS, iops, color=["#999", "#2a7", "#999", "#2a7"])
    a.set_yscale("log")
    a.set_ylabel("IOPS (log scale)")
    a.set_title("4 KiB random writes, depth 16, FLUSH every 1000\n20 s after 20 s of ramp, 16 MiB cache, 1 GiB backing")
    for bar, x in zip(bars, iops):
        a.annotate(f"{x:,.0f}", (bar.get_x() + bar.get_width() / 2, x), ha="center", va="bottom", fontsize=8)
    width = 0.2
    for i, unit in enumerate(LATENCY):
        ys = [med.get((v, unit), 0) for v in VARIANTS]
        xs = [j + (i - 1.5) * width for j in range(len(VARIANTS))]
        b.bar(xs, ys, width, label=unit)
    b.set_yscale("log")
    b.set_xticks(range(len(VARIANTS)))
    b.set_xticklabels(VARIANTS)
    b.set_ylabel("write completion latency, ms (log scale)")
    b.axhline(100, color="r", linestyle=":", linewidth=1)
    b.axhline(1000, color="r", linestyle="--", linewidth=1)
    b.set_title("latency (dotted: 100 ms p99.9 target; dashed: 1 s max)")
    b.legend(fontsize=8)
    fig.tight_layout()
    out = os.path.join(run, "sustained.png")
    fig.savefig(out, dpi=100)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1])
