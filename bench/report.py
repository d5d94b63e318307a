#!/usr/bin/env python3
"""report.py: turn a bench/pack.py run into markdown tables and SVG charts.

What: reads RUN_DIR/results.csv (and machine.txt, inputs.txt, run.txt) and
writes RUN_DIR/report.md, a section to paste into docs/benchmarks.md: per
input, one row per tool with compression and decompression throughput,
output size, cairn's speed and size relative to each peer, the target of
issue 2 and whether it is met; the bzip2 cross-decoding table; the
physical limits. It also draws, by hand (no plotting library), one SVG bar
chart per input of compression speed per format comparison
(compress-<input>.svg) and one of decompression speed (decompress-<input>.svg).

Why: BENCHMARKING.md wants the published tables and plots made from the
kept raw files by a script, so anyone can regenerate them.

Usage: bench/report.py RUN_DIR [--out FILE.md] [--svg-dir DIR] [--svg-link-prefix P]
Only the Python 3 standard library is used.
"""

import argparse
import csv
import math
import os
import shlex
import sys
from collections import OrderedDict

MB = 1e6
MIB = 1 << 20


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def fmt_speed(v):
    return "" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")


def fmt_ratio(v, nd=2):
    return "" if v is None else f"{v:.{nd}f}×"


def decoder_label(command):
    """'xz -T2 -d -c < f > /dev/null' -> 'xz -T2 -d'."""
    try:
        argv = shlex.split(command.split(" < ")[0])
    except ValueError:
        return command
    if not argv:
        return ""
    return " ".join([os.path.basename(argv[0])] + [a for a in argv[1:] if a not in ("-c", "-q")])


def compressor_label(row):
    return decoder_label(row["command"]) if row["command"] else f"{row['tool']} -{row['level']}"


def read_kv(path):
    out = OrderedDict()
    if os.path.exists(path):
        for line in open(path):
            if ":" in line and not line.startswith(" "):
                k, v = line.split(":", 1)
                out[k.strip()] = v.strip()
    return out


def repo_path(path):
    """path relative to the repository root when inside it, else absolute."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rel = os.path.relpath(os.path.abspath(path), root)
    return os.path.abspath(path) if rel.startswith("..") else rel


def met_cell(row):
    m = row.get("met", "")
    return {"yes": "✅ yes", "no": "❌ no", "no (size)": "❌ no (size > 102 %)"}.get(m, m)


# ---------------------------------------------------------------- markdown

def tables(rows, run_dir, svg_prefix):
    machine = read_kv(os.path.join(run_dir, "machine.txt"))
    run = read_kv(os.path.join(run_dir, "run.txt"))
    out = []
    name = os.path.basename(os.path.normpath(run_dir))
    out.append(f"## cairn pack / unpack against the standard tools ({name})\n")
    kernel = (machine.get("kernel", "").split()[2:3] or ["?"])[0]
    load_start = " ".join(machine.get("loadavg_start", "?").split()[:3])
    load_end = " ".join(machine.get("loadavg_end", "?").split()[:3])
    data_fs = (machine.get("data_dir_fs", "").split()[:1] or ["?"])[0]
    out.append(f"Measured {machine.get('date_utc', '?')} on {machine.get('nproc', '?')} cores "
               f"({machine.get('cpu_model', '?')}), Linux {kernel}; "
               f"load average (1, 5, 15 min) at start {load_start}, at end {load_end} "
               "(the machine is shared: load above the core count means the figures are noisy). "
               f"Data on {data_fs}. "
               f"Threads: {run.get('threads', '2')}; {run.get('runs', '?')} counted runs after "
               f"{run.get('warmup', '?')} warm-up, "
               + (("alternating (A B, B A, A B …)" if run.get("order") else "alternating (A B A B …)")
                  if run.get("interleave") == "True" else "not alternating")
               + ", medians; MB/s are 10⁶ bytes of uncompressed data per second; page cache warm, "
               "output to /dev/null. Ratios are cairn ÷ peer: speed above 1 means cairn is faster, "
               "size below 1 means cairn's output is smaller. A speed target counts only at an output "
               "size within 2 % of the peer's. Raw data: `" + repo_path(run_dir) + "`.\n")
    if run.get("quick") == "True":
        out.append("**Smoke run (`--quick`): 64 MiB slices, few runs; not a result.**\n")
    inputs_txt = os.path.join(run_dir, "inputs.txt")
    if os.path.exists(inputs_txt):
        out.append("Inputs:\n")
        for line in open(inputs_txt):
            if not line.startswith(" "):
                out.append(f"- {line.strip()}")
        out.append("")

    limits = [r for r in rows if r["operation"] == "limit"]
    if limits:
        out.append("### Physical limits\n")
        out.append("| measure | input | MB/s | what |")
        out.append("|---|---|---:|---|")
        for r in limits:
            out.append(f"| {r['tool']} | {r['input'] or '–'} | {fmt_speed(num(r['mb_per_s']))} | {r['note']} |")
        out.append("")

    summary = []
    for inp in OrderedDict.fromkeys(r["input"] for r in rows if r["operation"] != "limit"):
        irows = [r for r in rows if r["input"] == inp]
        nbytes = int(irows[0]["input_bytes"])
        out.append(f"### {inp} ({nbytes / MIB:.0f} MiB)\n")
        out.append(f"![compression speed, {inp}]({svg_prefix}compress-{inp}.svg) "
                   f"![decompression speed, {inp}]({svg_prefix}decompress-{inp}.svg)\n")
        out.append("| comparison | compressor / decoder | threads | compress MB/s | output MiB | "
                   "in/out | decompress MB/s | cairn ÷ peer, compress speed | cairn ÷ peer, size | "
                   "target | met | cairn ÷ peer, decompress speed | target | met |")
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|")
        notes = OrderedDict()
        for gid in OrderedDict.fromkeys(r["group"] for r in irows if r["group"]):
            grows = [r for r in irows if r["group"] == gid]
            comp = [r for r in grows if r["operation"] == "compress"]
            dec = [r for r in grows if r["operation"] == "decompress"]
            for r in grows:
                if r["role"] == "cairn" and r["note"] and r["operation"] == "compress":
                    notes[gid] = r["note"]
            used = set()
            lines = []
            for c in comp:
                d = next((x for x in dec if x["stream"] == c["stream"] and id(x) not in used), None)
                if d is not None:
                    used.add(id(d))
                lines.append((c, d))
            lines += [(None, d) for d in dec if id(d) not in used]
            for c, d in lines:
                base = c or d
                label = compressor_label(c) if c else f"(stream of {d['stream']})"
                if d is not None:
                    label += f" / {decoder_label(d['command'])}"
                if base["role"] == "cairn":
                    label = f"**{label}**"
                if c is not None and c["note"].startswith("failed"):
                    out.append(f"| {gid} | {label} | {c['threads']} | failed | | | | | | | | | | |")
                    summary.append((inp, gid, "compress", c["tool"], "", "", "failed"))
                    continue
                ob = num(c["output_bytes"]) if c else None
                threads = c["threads"] if c else ""
                if d is not None and d["threads"] != threads:
                    threads = f"{threads}/{d['threads']}" if threads else d["threads"]
                cells = [gid, label, threads,
                         fmt_speed(num(c["mb_per_s"])) if c else "",
                         f"{ob / MIB:.1f}" if ob else "",
                         f"{nbytes / ob:.2f}" if ob else "",
                         ("failed" if d["note"].startswith("failed") else fmt_speed(num(d["mb_per_s"])))
                         if d else "",
                         fmt_ratio(num(c["ratio_vs_peer_speed"])) if c else "",
                         fmt_ratio(num(c["size_vs_peer"]), 3) if c else "",
                         c["target"] if c else "", met_cell(c) if c else "",
                         fmt_ratio(num(d["ratio_vs_peer_speed"])) if d else "",
                         d["target"] if d else "", met_cell(d) if d else ""]
                out.append("| " + " | ".join(cells) + " |")
                for r, op in ((c, "compress"), (d, "decompress")):
                    if r is not None and r["target"]:
                        summary.append((inp, gid, op, decoder_label(r["command"]), r["target"],
                                        r["ratio_vs_peer_speed"], r["met"]))
        out.append("")
        for gid, note in notes.items():
            out.append(f"- {gid}: {note}")
        if notes:
            out.append("")

        cross = [r for r in irows if r["operation"] == "decompress-cross"]
        if cross:
            out.append(f"bzip2 decoders on every producer's .bz2 ({inp}):\n")
            out.append("| .bz2 made by | size MiB | decoder | threads | MB/s | cairn ÷ this | target | met |")
            out.append("|---|---:|---|---:|---:|---:|---|---|")
            for r in cross:
                ob = num(r["output_bytes"])
                dl = decoder_label(r["command"])
                if r["role"] == "cairn":
                    dl = f"**{dl}**"
                out.append(f"| {r['stream']} | {ob / MIB:.1f} | {dl} | {r['threads']} | "
                           f"{fmt_speed(num(r['mb_per_s']))} | {fmt_ratio(num(r['ratio_vs_peer_speed']))} | "
                           f"{r['target']} | {met_cell(r)} |")
                if r["target"]:
                    summary.append((inp, "bzip2-9", f"decode {r['stream']} .bz2", dl, r["target"],
                                    r["ratio_vs_peer_speed"], r["met"]))
            out.append("")

    if summary:
        met = sum(1 for s in summary if s[6] == "yes")
        out.append(f"### Targets: {met} of {len(summary)} met\n")
        missed = [s for s in summary if s[6] != "yes"]
        if missed:
            out.append("| input | comparison | operation | peer | target | cairn ÷ peer | result |")
            out.append("|---|---|---|---|---|---:|---|")
            for inp, gid, op, peer, target, ratio, m in missed:
                out.append(f"| {inp} | {gid} | {op} | {peer} | {target} | "
                           f"{fmt_ratio(num(ratio))} | {m} |")
            out.append("")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- SVG

def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def nice_step(vmax, ticks=5):
    if vmax <= 0:
        return 1
    raw = vmax / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def bar_chart(title, subtitle, groups):
    """groups: [(group id, [(label, MB/s, is_cairn)])] -> SVG text (horizontal bars)."""
    label_w, bar_w, value_w, pad = 250, 520, 70, 12
    row_h, gap, head_h, top = 18, 10, 18, 58
    width = pad + label_w + bar_w + value_w + pad
    n_rows = sum(len(b) for _, b in groups)
    height = top + len(groups) * (head_h + gap) + n_rows * row_h + 40
    vmax = max([v for _, bars in groups for _, v, _ in bars if v] + [1])
    step = nice_step(vmax)
    scale_max = math.ceil(vmax / step) * step
    x0 = pad + label_w

    def x(v):
        return x0 + bar_w * v / scale_max

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="{pad}" y="22" font-size="16" font-weight="bold">{esc(title)}</text>',
         f'<text x="{pad}" y="40" fill="#555">{esc(subtitle)}</text>']
    grid_bottom = height - 30
    t = 0.0
    while t <= scale_max + 1e-9:
        gx = x(t)
        o.append(f'<line x1="{gx:.1f}" y1="{top - 6}" x2="{gx:.1f}" y2="{grid_bottom}" stroke="#ddd"/>')
        o.append(f'<text x="{gx:.1f}" y="{grid_bottom + 14}" text-anchor="middle" fill="#555">{t:g}</text>')
        t += step
    o.append(f'<text x="{x0 + bar_w / 2:.0f}" y="{grid_bottom + 28}" text-anchor="middle" fill="#555">'
             'MB/s of uncompressed data (higher is better)</text>')
    y = top
    for gid, bars in groups:
        o.append(f'<text x="{pad}" y="{y + 13}" font-weight="bold">{esc(gid)}</text>')
        y += head_h
        for label, v, is_cairn in bars:
            color = "#d35400" if is_cairn else "#7f8c8d"
            weight = ' font-weight="bold"' if is_cairn else ""
            o.append(f'<text x="{x0 - 6}" y="{y + 13}" text-anchor="end"{weight}>{esc(label)}</text>')
            if v:
                o.append(f'<rect x="{x0}" y="{y + 3}" width="{max(x(v) - x0, 1):.1f}" height="{row_h - 5}" '
                         f'fill="{color}"><title>{esc(label)}: {v:.1f} MB/s</title></rect>')
                o.append(f'<text x="{x(v) + 4:.1f}" y="{y + 13}" fill="#333">{fmt_speed(v)}</text>')
            else:
                o.append(f'<text x="{x0 + 4}" y="{y + 13}" fill="#c0392b">failed</text>')
            y += row_h
        y += gap
    o.append("</svg>")
    return "\n".join(o) + "\n"


def charts(rows, svg_dir, run_name):
    written = []
    for inp in OrderedDict.fromkeys(r["input"] for r in rows if r["operation"] != "limit"):
        irows = [r for r in rows if r["input"] == inp]
        nbytes = int(irows[0]["input_bytes"])
        for op in ("compress", "decompress"):
            groups = []
            for gid in OrderedDict.fromkeys(r["group"] for r in irows if r["group"]):
                bars = []
                for r in irows:
                    if r["group"] != gid or r["operation"] != op:
                        continue
                    label = compressor_label(r) if op == "compress" else decoder_label(r["command"])
                    if op == "decompress" and r["role"] == "peer":
                        label += "" if r["stream"].startswith(label.split()[0]) else f" ({r['stream']})"
                    bars.append((label, num(r["mb_per_s"]), r["role"].startswith("cairn")))
                if bars:
                    groups.append((gid, bars))
            if not groups:
                continue
            what = "Compression" if op == "compress" else "Decompression of each tool's own output"
            svg = bar_chart(f"{what}: {inp} ({nbytes / MIB:.0f} MiB)",
                            f"cairn (orange) vs peers (grey), medians; run {run_name}", groups)
            path = os.path.join(svg_dir, f"{op}-{inp}.svg")
            with open(path, "w") as f:
                f.write(svg)
            written.append(path)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--out", help="markdown output (default RUN_DIR/report.md; - for stdout)")
    ap.add_argument("--svg-dir", help="where the SVG charts go (default RUN_DIR)")
    ap.add_argument("--svg-link-prefix", default="",
                    help="prefix of the chart links in the markdown (default: none, i.e. the charts "
                         "sit beside the markdown), e.g. ../bench/runs/2024-06-01-pack/")
    args = ap.parse_args()
    csv_path = os.path.join(args.run_dir, "results.csv")
    if not os.path.exists(csv_path):
        sys.exit(f"report.py: {csv_path} not found")
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    svg_dir = args.svg_dir or args.run_dir
    os.makedirs(svg_dir, exist_ok=True)
    svgs = charts(rows, svg_dir, os.path.basename(os.path.normpath(args.run_dir)))
    md = tables(rows, args.run_dir, args.svg_link_prefix)
    if args.out == "-":
        sys.stdout.write(md)
    else:
        out = args.out or os.path.join(args.run_dir, "report.md")
        with open(out, "w") as f:
            f.write(md)
        print(f"report.py: wrote {out}", file=sys.stderr)
    for p in svgs:
        print(f"report.py: wrote {p}", file=sys.stderr)


if __name__ == "__main__":
    main()
