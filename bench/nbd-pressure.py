#!/usr/bin/env python3
"""The NBD server held past its memory budget for tens of seconds.

What the pace rule, first-come order and socket polls of `cairn serve`
(`--max-inflight`, docs/nbd.md) cost where they act: while requests wait
for memory. One fio run per server and round, two kinds of client at once:

  bulk    --bulk-jobs connections, each random writes of --bulk-bs at depth
          --bulk-depth (4 x 32 x 1 MiB = 128 MiB wanted in flight, eight
          times the 16M budget given to cairn): they wait for memory all
          the time
  probe   one connection, random 4 KiB reads at depth 1: how long a small
          request waits behind them (latency percentiles and maximum)

over a file of --size (in tmpfs by default, so the server is measured, not
a disk), for --seconds after --ramp seconds. Servers: each --build NAME=PATH
(`cairn serve --file ... --max-inflight BUDGET`), and nbdkit's file plugin
(no budget: what the same load gives a server that holds everything asked).
Rounds alternate the servers' order. Also the server's peak RSS (VmHWM) and
any client that was cut (fio's errors).

Usage: bench/nbd-pressure.py --build head=target/release/cairn [--build ...]
       [--rounds 3] [--seconds 30] [--budget 16M] [--size 4G] [--work /dev/shm]
       bench/nbd-pressure.py --report RUN_DIR   (the table again from results.json)
Results in bench/runs/<date>-nbd-pressure/.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plotting import new_run_dir  # noqa: E402
from serve import ROOT, Server, log, run, save_run, uri  # noqa: E402

JOBFILE = """[global]
ioengine=nbd
uri={uri}
size={size}
time_based
ramp_time={ramp}
runtime={seconds}
randrepeat=0
group_reporting=0

[bulk]
rw=randwrite
bs={bulk_bs}
iodepth={bulk_depth}
numjobs={bulk_jobs}
new_group

[probe]
rw=randread
bs=4k
iodepth=1
new_group
"""


def peak_rss_mib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def measure(a, name, cmd, sock, export, jobfile):
    srv = Server(cmd, sock)
    try:
        with open(jobfile, "w") as f:
            f.write(JOBFILE.format(uri=uri(sock, export), size=a.size, ramp=a.ramp, seconds=a.seconds,
                                   bulk_bs=a.bulk_bs, bulk_depth=a.bulk_depth, bulk_jobs=a.bulk_jobs))
        p = subprocess.run(["fio", "--output-format=json", jobfile], capture_output=True, text=True)
        rss = peak_rss_mib(srv.p.pid)
    finally:
        srv.stop()
    out = p.stdout
    if "{" not in out:
        raise RuntimeError(f"{name}: fio printed no result: {p.stderr[-2000:]}")
    if p.returncode != 0:
        log(f"  fio exited {p.returncode}: {p.stderr[-500:]}")
    j = json.loads(out[out.index("{"):])
    bulk = [job for job in j["jobs"] if job["jobname"] == "bulk"]
    probe = next(job for job in j["jobs"] if job["jobname"] == "probe")
    errors = sum(job["error"] for job in j["jobs"])
    pct = probe["read"]["clat_ns"]["percentile"]
    bpct = [job["write"]["clat_ns"] for job in bulk]
    return {
        "server": name,
        "bulk_mbs": sum(job["write"]["bw_bytes"] for job in bulk) / 1e6,
        "bulk_p50_ms": statistics.median(c["percentile"]["50.000000"] for c in bpct) / 1e6,
        "bulk_p99_ms": max(c["percentile"]["99.000000"] for c in bpct) / 1e6,
        "bulk_max_ms": max(c["max"] for c in bpct) / 1e6,
        "probe_iops": probe["read"]["iops"],
        "probe_p50_us": pct["50.000000"] / 1e3,
        "probe_p99_us": pct["99.000000"] / 1e3,
        "probe_p999_us": pct["99.900000"] / 1e3,
        "probe_max_us": probe["read"]["clat_ns"]["max"] / 1e3,
        "rss_mib": rss,
        "errors": errors,
        "fio_rc": p.returncode,
    }


def measure_rounds(a, servers, sock, jobfile, rows):
    """Every server once per round, rounds alternating the order; rows
    appended as they come."""
    for r in range(a.rounds):
        order = servers if r % 2 == 0 else servers[::-1]
        for name, cmd, export in order:
            log(f"round {r + 1}: {name}")
            row = measure(a, name, cmd, sock, export, jobfile)
            row["round"] = r + 1
            rows.append(row)
            log(f"  bulk {row['bulk_mbs']:.0f} MB/s, probe p99 {row['probe_p99_us']:.0f} µs, "
                f"max {row['probe_max_us']:.0f} µs, rss {row['rss_mib']:.0f} MiB, errors {row['errors']}")


def table(rows):
    """The report's table: per server, medians over rounds (and ranges)
    of throughput and IOPS, medians of each round's percentiles, and the
    largest maximum and peak RSS of any round."""
    lines = ["| server | bulk MB/s | bulk p50 / p99 / max ms | probe IOPS | probe p50 / p99 / p99.9 / max µs "
             "| peak RSS MiB | clients cut |",
             "|---|--:|---|--:|---|--:|--:|"]
    for name in dict.fromkeys(row["server"] for row in rows):
        mine = [row for row in rows if row["server"] == name]

        def med(key):
            return statistics.median(row[key] for row in mine)

        def most(key):
            return max(row[key] for row in mine)

        def rng(key, fmt):
            v = [row[key] for row in mine]
            return f"{statistics.median(v):{fmt}} ({min(v):{fmt}}-{max(v):{fmt}})"

        lines.append(
            f"| {name} | {rng('bulk_mbs', ',.0f')} | {med('bulk_p50_ms'):.1f} / {med('bulk_p99_ms'):.1f} / "
            f"{most('bulk_max_ms'):.1f} | {rng('probe_iops', ',.0f')} | {med('probe_p50_us'):,.0f} / "
            f"{med('probe_p99_us'):,.0f} / {med('probe_p999_us'):,.0f} / {most('probe_max_us'):,.0f} | "
            f"{most('rss_mib'):.0f} | {sum(row['errors'] for row in mine)} |")
    lines += ["", "Latencies are medians over rounds of each round's percentile; maxima and peak RSS are "
              "the largest of any round."]
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="append", default=[], help="NAME=PATH of a cairn binary")
    ap.add_argument("--no-nbdkit", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--ramp", type=int, default=5)
    ap.add_argument("--budget", default="16M", help="cairn's --max-inflight")
    ap.add_argument("--size", default="4G")
    ap.add_argument("--bulk-bs", default="1M")
    ap.add_argument("--bulk-depth", type=int, default=32)
    ap.add_argument("--bulk-jobs", type=int, default=4)
    ap.add_argument("--work", default="/dev/shm")
    ap.add_argument("--report", metavar="RUN_DIR", help="write RUN_DIR/report.md's table again from its "
                    "results.json, measuring nothing")
    a = ap.parse_args()
    if a.report:
        path = os.path.join(a.report, "report.md")
        head = open(path).read().split("\n| server |")[0]
        rows = json.load(open(os.path.join(a.report, "results.json")))
        with open(path, "w") as f:
            f.write(head + "\n" + "\n".join(table(rows)) + "\n")
        print(open(path).read())
        return
    if not a.build:
        a.build = [f"head={os.path.join(ROOT, 'target/release/cairn')}"]
    for tool in ["fio"] + ([] if a.no_nbdkit else ["nbdkit"]):
        if shutil.which(tool) is None:
            sys.exit(f"missing {tool}: apt-get install -y fio nbdkit")
    builds = [b.split("=", 1) for b in a.build]
    out_dir = new_run_dir(ROOT, "nbd-pressure")
    work = tempfile.mkdtemp(prefix="cairn-pressure-", dir=a.work)
    disk = os.path.join(work, "disk.img")
    run(["fallocate", "-l", a.size, disk])
    sock = os.path.join(work, "s.sock")
    jobfile = os.path.join(work, "load.fio")
    servers = [(n, [p, "serve", "--file", f"disk={disk}", "--socket", sock, "--max-inflight", a.budget], "disk")
               for n, p in builds]
    if not a.no_nbdkit:
        servers.append(("nbdkit-file", ["nbdkit", "-f", "-U", sock, "-e", "disk", "file", disk], "disk"))
    commands = {" ".join(c) for _, c, _ in servers}
    commands.add("fio --output-format=json load.fio  # load.fio in this directory")
    with open(os.path.join(out_dir, "load.fio"), "w") as f:
        f.write(JOBFILE.format(uri=uri(sock, "disk"), size=a.size, ramp=a.ramp, seconds=a.seconds,
                               bulk_bs=a.bulk_bs, bulk_depth=a.bulk_depth, bulk_jobs=a.bulk_jobs))
    rows = []
    try:
        measure_rounds(a, servers, sock, jobfile, rows)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    versions = [run([p, "--version"]).stdout.strip() for _, p in builds]
    lines = [f"# The NBD server past its memory budget ({os.path.basename(out_dir)})", "",
             f"`bench/nbd-pressure.py {' '.join(sys.argv[1:])}`", "",
             f"bulk: {a.bulk_jobs} connections of random {a.bulk_bs} writes at depth {a.bulk_depth}; "
             f"probe: one connection of random 4 KiB reads at depth 1; file of {a.size} in {a.work}; "
             f"{a.seconds} s after {a.ramp} s of ramp; cairn's --max-inflight {a.budget}; "
             f"medians of {a.rounds} rounds (range). Builds: " + "; ".join(versions), ""]
    lines += table(rows)
    save_run(out_dir, work, lines, commands)


if __name__ == "__main__":
    main()
