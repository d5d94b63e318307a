#!/usr/bin/env python3
"""plot_wbcache_sustained.py: bench/wbcache.py's sustained tests as a
chart, drawn with matplotlib: steady-state IOPS of each variant and the
completion latency percentiles of each (median over the runs).

  T  the bare device and the cache in front of it (rotational model and
     plain file): RUN_DIR/sustained.png
  W  a stored image served writable against qemu-nbd on a qcow2 of it:
     RUN_DIR/writable.png

Usage: bench/plot_wbcache_sustained.py RUN_DIR [T|W]
"""
import sys

from plotting import grouped_bars, label_bars, plt, save, wbcache_medians

LATENCY = ["p50 ms", "p99 ms", "p99.9 ms", "max ms"]
# Per test: the variants (peer grey, cairn green), the subtitle, the file.
TESTS = {
    "T": (["hdd bare", "hdd cache", "file bare", "file cache"], ["#999", "#2a7", "#999", "#2a7"],
          "16 MiB cache, 1 GiB backing", "sustained.png", "log"),
    "W": (["qemu-nbd qcow2", "image rw", "image rw (commit every 10 s)", "image cache"],
          ["#999", "#2a7", "#2a7", "#2a7"], "os2.img (576 MiB): qcow2 vs cairn repository image", "writable.png",
          "linear"),
}


def main(run, test="T"):
    variants, colors, what, name, scale = TESTS[test]
    med = wbcache_medians(run)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    iops = [med.get((test, v, "IOPS"), 0) for v in variants]
    labels = [v.replace(" (", "\n(") for v in variants]
    bars = a.bar(labels, iops, color=colors)
    a.set_yscale(scale)
    a.set_ylabel("IOPS" + (" (log scale)" if scale == "log" else ""))
    a.set_title(f"4 KiB random writes, depth 16, FLUSH every 1000\n20 s after 20 s of ramp, {what}", fontsize=9)
    label_bars(a, bars, iops, "{:,.0f}")
    grouped_bars(b, labels, [(u, [med.get((test, v, u), 0) for v in variants]) for u in LATENCY])
    b.set_yscale("log")
    b.set_ylabel("write completion latency, ms (log scale)")
    b.axhline(100, color="r", linestyle=":", linewidth=1)
    b.axhline(1000, color="r", linestyle="--", linewidth=1)
    b.set_title("latency (dotted: 100 ms p99.9 target; dashed: 1 s max)")
    b.legend(fontsize=8)
    save(fig, run, name)


if __name__ == "__main__":
    main(*sys.argv[1:3])
