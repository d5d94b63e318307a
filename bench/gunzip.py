#!/usr/bin/env python3
"""gunzip.py: decoding one gzip member written by gzip -6 (no sizes in it,
so it cannot be cut without decoding) of an OS image, cairn against the
gunzips people have: pigz -d, igzip -d (ISA-L), rapidgzip (parallel),
libdeflate-gunzip and gzip -d, in one run, interleaved round by round;
and cairn reading the file again with the checkpoint index its first read
wrote (`--index`).

Each decoder writes to a file in the page cache (dropped between runs is not
needed: the output is rewritten each time) and to /dev/null. The output of
every decoder is compared with the image once. Wall time, CPU time and peak
RSS come from /usr/bin/time; the table gives medians and the ratio of each
peer's time to cairn's.

With `--source pipe`, every decoder reads the .gz from a pipe (`cat GZ |
decoder`, the pipeline timed whole, cat's CPU included for all), as
`curl | gunzip` or `tar -xz` from a pipe would; the index run is left out
(an index belongs to a file).

With `--pause S`, each timed run starts S seconds after the one before:
on a virtual machine whose guest hands its free memory back to the host
(virtio-balloon free page reporting, as here), memory a run touches
afresh is then cold, as for a command run once, and a decoder pays for
its peak memory (back to back, the pages the last run freed are still
backed and cost little).

With `--also NAME=PATH` (repeatable), another cairn build's `unpack` runs
in the same rounds, as `cairn unpack (NAME)`: a change paired against the
build before it, with the peers beside both.

  bench/gunzip.py --cairn target/release/cairn --image IMG [--runs 5]
                  [--source file|pipe] [--also NAME=PATH]... [--pause S]
                  --out-dir bench/runs/DATE-gunzip
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from plotting import plt, save  # noqa: E402

RAPIDGZIP = os.environ.get("RAPIDGZIP", "/opt/cairn-venv/bin/rapidgzip")


def decoders(cairn, threads, index, also=()):
    t = str(threads)
    return [
        ("cairn unpack", [cairn, "unpack", "-T", t, "-c"]),
        *[(f"cairn unpack ({name})", [path, "unpack", "-T", t, "-c"]) for name, path in also],
        # The first run (the correctness pass) writes the index, every
        # counted run reads the file again with it.
        ("cairn --index (again)", [cairn, "unpack", "-T", t, "--index", index, "-c"]),
        ("pigz -d", ["pigz", "-p", t, "-d", "-c"]),
        ("igzip -d", ["igzip", "-d", "-c"]),
        ("rapidgzip", [RAPIDGZIP, "-P", t, "-d", "-c"]),
        ("libdeflate-gunzip", ["libdeflate-gunzip", "-c"]),
        ("gzip -d", ["gzip", "-d", "-c"]),
    ]


def timed(argv, src, dst, pipe=False):
    """(wall s, cpu s, max RSS KiB) of argv SRC > DST, or of cat SRC | argv
    > DST with `pipe`."""
    if pipe:
        cmd = ["sh", "-c", 'src="$1"; shift; cat "$src" | "$@"', "sh", src, *argv]
    else:
        cmd = [*argv, src]
    with open(dst, "wb") as out:
        p = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", *cmd],
                           stdout=out, stderr=subprocess.PIPE, check=True)
    wall, user, sys_, rss = p.stderr.decode().strip().splitlines()[-1].split()
    return float(wall), float(user) + float(sys_), int(rss)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--work", default=None, help="directory for the .gz and outputs")
    ap.add_argument("--source", choices=("file", "pipe"), default="file",
                    help="decoders read the .gz from the file, or from a pipe")
    ap.add_argument("--pause", type=float, default=0,
                    help="seconds of idle before each timed run (cold memory)")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=PATH",
                    help="another cairn build, timed in the same rounds")
    a = ap.parse_args()
    also = [x.split("=", 1) for x in a.also]
    pipe = a.source == "pipe"
    os.makedirs(a.out_dir, exist_ok=True)
    work = tempfile.mkdtemp(dir=a.work)
    try:
        gz = os.path.join(work, "image.gz")
        with open(a.image, "rb") as src, open(gz, "wb") as out:
            subprocess.run(["gzip", "-6", "-c"], stdin=src, stdout=out, check=True)
        index = os.path.join(work, "image.gz.index")
        decs = [d for d in decoders(a.cairn, a.threads, index, also) if shutil.which(d[1][0])
                and not (pipe and "--index" in d[1])]
        outfile = os.path.join(work, "out")
        # Correctness first: every decoder's output is the image.
        for name, argv in decs:
            timed(argv, gz, outfile, pipe)
            same = subprocess.run(["cmp", "-s", outfile, a.image]).returncode == 0
            print(f"{name}: output {'identical' if same else 'DIFFERS'}", flush=True)
            if not same:
                sys.exit(f"{name} output differs from the image")
        rows = []
        for r in range(a.runs):
            for sink in ("file", "null"):
                for name, argv in decs:
                    dst = outfile if sink == "file" else "/dev/null"
                    time.sleep(a.pause)
                    wall, cpu, rss = timed(argv, gz, dst, pipe)
                    rows.append(dict(round=r, sink=sink, decoder=name, wall_s=wall,
                                     cpu_s=cpu, rss_kib=rss))
                    print(f"round {r} {sink:4} {name:18} {wall:6.2f} s", flush=True)
        with open(os.path.join(a.out_dir, "results.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        size = os.path.getsize(a.image)
        lines = [f"# gunzip of one gzip -6 member, {size / 1e6:.0f} MB image "
                 f"({os.path.getsize(gz) / 1e6:.0f} MB compressed), {a.threads} threads, "
                 f"read from {'a pipe (cat GZ | decoder)' if pipe else 'the file'}, "
                 f"{f'{a.pause:g} s idle before each run, ' if a.pause else ''}"
                 f"medians of {a.runs}", ""]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, sink in zip(axes, ("file", "null")):
            med = {name: statistics.median(x["wall_s"] for x in rows
                                           if x["decoder"] == name and x["sink"] == sink)
                   for name, _ in decs}
            cpu = {name: statistics.median(x["cpu_s"] for x in rows
                                           if x["decoder"] == name and x["sink"] == sink)
                   for name, _ in decs}
            rss = {name: max(x["rss_kib"] for x in rows
                             if x["decoder"] == name and x["sink"] == sink)
                   for name, _ in decs}
            base = med["cairn unpack"]
            lines += [f"## output to {'a file' if sink == 'file' else '/dev/null'}", "",
                      "| decoder | wall s | MB/s | CPU s | peak RSS MiB | its time / cairn's |",
                      "|---|--:|--:|--:|--:|--:|"]
            for name, _ in decs:
                lines.append(f"| {name} | {med[name]:.2f} | {size / med[name] / 1e6:.0f} | "
                             f"{cpu[name]:.2f} | {rss[name] / 1024:.0f} | "
                             f"{med[name] / base:.2f}x |")
            lines.append("")
            names = [n for n, _ in decs]
            bars = ax.bar(names, [size / med[n] / 1e6 for n in names],
                          color=["#2a6f97" if n.startswith("cairn") else "#999999" for n in names])
            for b, n in zip(bars, names):
                ax.annotate(f"{size / med[n] / 1e6:.0f}", (b.get_x() + b.get_width() / 2,
                            b.get_height()), ha="center", va="bottom", fontsize=8)
            ax.set_title(f"to {'a file' if sink == 'file' else '/dev/null'}")
            ax.set_ylabel("MB/s of output (median)")
            ax.tick_params(axis="x", rotation=30)
        fig.suptitle(f"one gzip -6 member of an OS image, {a.threads} threads, "
                     f"read from {'a pipe' if pipe else 'the file'}")
        fig.tight_layout()
        save(fig, a.out_dir, "gunzip.png")
        with open(os.path.join(a.out_dir, "summary.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
