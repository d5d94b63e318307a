#!/usr/bin/env python3
"""Pool the A/B runs in this directory (final/, final2/): medians per
(variant, binary) of MB/s, server context switches and task-clock, and
per-round ratios against the mean of the two `none` runs of the same
round (`none` does not use the cache, so A and B are the same code there)."""
import csv
import os
import statistics as S

HERE = os.path.dirname(os.path.abspath(__file__))
rows = []
for d in ("final", "final2"):
    for r in csv.DictReader(open(os.path.join(HERE, d, "ab.csv"))):
        r["round"] = f"{d}-{r['round']}"
        rows.append(r)
rounds = sorted({r["round"] for r in rows})
print(f"{len(rounds)} rounds (A = before 23bd00c, B = after)\n")
print("| variant | bin | MB/s median | min..max | ctx switches median | task-clock ms median | MB/s per-round ratio to none: median (min..max) |")
print("|---|---|--:|--:|--:|--:|--:|")
for v in ("none", "cache", "plog"):
    for b in "AB":
        sel = [r for r in rows if r["variant"] == v and r["bin"] == b]
        mb = [float(r["mbps"]) for r in sel]
        cs = [float(r["ctxsw"]) for r in sel]
        tc = [float(r["task_clock_ms"]) for r in sel]
        rat = []
        for rnd in rounds:
            n = [float(r["mbps"]) for r in rows if r["variant"] == "none" and r["round"] == rnd]
            x = [float(r["mbps"]) for r in sel if r["round"] == rnd]
            if n and x:
                rat.append(x[0] / S.mean(n))
        print(f"| {v} | {b} | {S.median(mb):.1f} | {min(mb):.0f}..{max(mb):.0f} | {S.median(cs):.0f} | {S.median(tc):.0f} | "
              f"{S.median(rat):.3f} ({min(rat):.2f}..{max(rat):.2f}) |")
