"""plotting.py: what the bench scripts share (matplotlib, Agg): grouped
bars, value labels on bars, the medians of a bench/wbcache.py run, saving
a figure into its run directory, naming a new run directory, and dropping
the page cache before a cold run."""
import csv
import datetime
import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402,F401  (re-exported for the scripts)


def grouped_bars(ax, labels, series, colors=None):
    """One group of bars per label, one bar per (name, values) in series."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series):
        xs = [k + (i - (len(series) - 1) / 2) * width for k in range(len(labels))]
        ax.bar(xs, values, width, label=name, color=colors[i] if colors else None)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)


def label_bars(ax, bars, values, fmt):
    """Write each value (with fmt, e.g. "{:.1f}") above its bar."""
    for bar, y in zip(bars, values):
        ax.annotate(fmt.format(y), (bar.get_x() + bar.get_width() / 2, y),
                    ha="center", va="bottom", fontsize=8)


def wbcache_medians(run):
    """(test, variant, unit) -> median value over the rounds of a
    bench/wbcache.py run (its results.csv)."""
    vals = {}
    with open(os.path.join(run, "results.csv")) as f:
        for r in csv.DictReader(f):
            vals.setdefault((r["test"], r["variant"], r["unit"]), []).append(float(r["value"]))
    return {k: statistics.median(v) for k, v in vals.items()}


def save(fig, run, name):
    """Lay out, write RUN/name and print its path."""
    fig.tight_layout()
    out = os.path.join(run, name)
    fig.savefig(out, dpi=100)
    print(out)


def new_run_dir(root, name):
    """Make and return ROOT/bench/runs/<UTC date>-NAME, or -NAME-2, -3...
    when that run exists."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = os.path.join(root, "bench/runs", f"{stamp}-{name}")
    k = 2
    while os.path.exists(out):
        out = os.path.join(root, "bench/runs", f"{stamp}-{name}-{k}")
        k += 1
    os.makedirs(out)
    return out


def drop_caches():
    """Write back and drop the page cache (root), so the next run reads
    the disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
