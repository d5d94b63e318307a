#!/usr/bin/env python3
"""plot_wbcache_sustained.py: bench/wbcache.py's test (T) as a chart, drawn
with matplotlib: steady-state IOPS of the bare device and of the cache in
front of it (rotational model and plain file), and the completion latency
percentiles of each (median over the runs).

Usage: bench/plot_wbcache_sustained.py RUN_DIR   (writes RUN_DIR/sustained.png)
"""
import sys

from plotting import grouped_bars, label_bars, plt, save, wbcache_medians

VARIANTS = ["hdd bare", "hdd cache", "file bare", "file cache"]
LATENCY = ["p50 ms", "p99 ms", "p99.9 ms", "max ms"]


def main(run):
    med = wbcache_medians(run)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    iops = [med.get(("T", v, "IOPS"), 0) for v in VARIANTS]
    bars = a.bar(VARIANTS, iops, color=["#999", "#2a7", "#999", "#2a7"])
    a.set_yscale("log")
    a.set_ylabel("IOPS (log scale)")
    a.set_title("4 KiB random writes, depth 16, FLUSH every 1000\n20 s after 20 s of ramp, 16 MiB cache, 1 GiB backing")
    label_bars(a, bars, iops, "{:,.0f}")
    grouped_bars(b, VARIANTS, [(u, [med.get(("T", v, u), 0) for v in VARIANTS]) for u in LATENCY])
    b.set_yscale("log")
    b.set_ylabel("write completion latency, ms (log scale)")
    b.axhline(100, color="r", linestyle=":", linewidth=1)
    b.axhline(1000, color="r", linestyle="--", linewidth=1)
    b.set_title("latency (dotted: 100 ms p99.9 target; dashed: 1 s max)")
    b.legend(fontsize=8)
    save(fig, run, "sustained.png")


if __name__ == "__main__":
    main(sys.argv[1])
