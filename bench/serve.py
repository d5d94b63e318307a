#!/usr/bin/env python3
"""cairn serve against qemu-nbd and nbdkit, side by side in one run.

Servers (each on a unix socket, started fresh for every measurement):
  cairn-image   `cairn serve --repo R` on os.img backed up with zstd:3
  qemu-qcow2    `qemu-nbd -r -f qcow2` on `qemu-img convert -c` of os.img
  cairn-file    `cairn serve --file` on a copy of os.img
  nbdkit-file   `nbdkit file` on the same copy
  qemu-raw      `qemu-nbd -f raw` on the same copy
Loads:
  seq-1M        qemu-img bench -s 1M -S 1M -d 4 over the whole image (MB/s)
  stride-4k     qemu-img bench -s 4k -d 16 with a 1 MiB + 4 KiB step
                (every read in another 64 KiB region; reads/s)
  randread-4k   fio --ioengine=nbd --rw=randread --bs=4k --iodepth=16 (IOPS)
  randwrite-4k  fio --ioengine=nbd --rw=randwrite --bs=4k --iodepth=16
                (file exports only; IOPS)
  nbdcopy       nbdcopy URI null: (MB/s)
Every round runs every (load, server) pair once, in turn; medians over
--runs rounds; page cache warm. Results in bench/runs/<date>-serve/ (-2, -3...
when that run exists).

Usage: bench/serve.py [--image bench/data/os.img] [--runs 5] [--warmup 1] [--quick]
                      [--fio-seconds 5] [--loads L,L..] [--servers S,S..]
"""
import argparse
import csv
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


class Server:
    """A server process on a unix socket, stopped on exit."""

    def __init__(self, cmd, sock):
        self.cmd = cmd
        self.sock = sock
        # A file, not a pipe: a pipe nobody reads would block a chatty server.
        self.log = sock + ".log"
        with open(self.log, "w") as err:
            self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.time() + 30
        while not os.path.exists(sock):
            if self.p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"server did not start: {' '.join(cmd)}: {open(self.log).read()}")
            time.sleep(0.02)
        time.sleep(0.05)

    def stop(self, timeout=20):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        if os.path.exists(self.sock):
            os.unlink(self.sock)


def save_run(out_dir, work, lines, commands=None):
    """End a run: commands.txt (if given), machine.txt and report.md in
    OUT_DIR, the report printed, the work directory removed."""
    if commands is not None:
        with open(os.path.join(out_dir, "commands.txt"), "w") as f:
            f.write("\n".join(sorted(commands)) + "\n")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    with open(os.path.join(out_dir, "machine.txt"), "w") as f:
        f.write(f"{os.cpu_count()} cores, {cpu}\n" + run(["df", "-T", work]).stdout)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    subprocess.run(["rm", "-rf", work])


def uri(sock, export=""):
    return f"nbd+unix:///{export}?socket={sock}"


def image_opts(sock, export=""):
    o = f"driver=nbd,server.type=unix,server.path={sock}"
    return o + (f",export={export}" if export else "")


def qemu_bench(sock, export, size, bufsize, step, depth, count, write=False):
    cmd = ["qemu-img", "bench", "--image-opts", "-c", str(count), "-d", str(depth),
           "-s", str(bufsize), "-S", str(step), "-t", "none"]
    if write:
        cmd.append("-w")
    cmd.append(image_opts(sock, export))
    t = time.monotonic()
    out = run(cmd).stdout
    secs = time.monotonic() - t
    m = re.search(r"Run completed in ([0-9.]+) seconds", out)
    if m:
        secs = float(m.group(1))
    return secs, cmd


# fio command line -> completion latency (p99, p99.9, max) in µs of its
# last run.
LATENCY = {}


def fio(sock, export, rw, size, runtime):
    cmd = ["fio", "--name=bench", "--ioengine=nbd", f"--uri={uri(sock, export)}", f"--rw={rw}",
           "--bs=4k", "--iodepth=16", f"--size={size}", "--time_based", f"--runtime={runtime}",
           "--output-format=json", "--randseed=42"]
    out = run(cmd).stdout
    j = json.loads(out[out.index("{"):])
    job = j["jobs"][0]
    side = job["read"] if "read" in rw else job["write"]
    p = side["clat_ns"]["percentile"]
    LATENCY[" ".join(cmd)] = (p["99.000000"] / 1e3, p["99.900000"] / 1e3, side["clat_ns"]["max"] / 1e3)
    return side["iops"], cmd


def nbdcopy(sock, export):
    cmd = ["nbdcopy", uri(sock, export), "null:"]
    t = time.monotonic()
    run(cmd)
    return time.monotonic() - t, cmd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default=os.path.join(ROOT, "bench/data/os.img"))
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target/release/cairn"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted")
    ap.add_argument("--fio-seconds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="1 run, 2 s fio: a smoke test")
    ap.add_argument("--out", default=None)
    ap.add_argument("--loads", default=None, help="comma list of loads to run (default: all)")
    ap.add_argument("--servers", default=None, help="comma list of servers to run (default: all)")
    a = ap.parse_args()
    if a.quick:
        a.runs, a.warmup, a.fio_seconds = 1, 0, 2
    for tool in ["qemu-img", "qemu-nbd", "nbdkit", "fio", "nbdcopy"]:
        if not shutil.which(tool):
            sys.exit(f"missing {tool}: apt-get install -y qemu-utils nbdkit fio libnbd-bin")
    if not os.path.exists(a.image):
        sys.exit(f"missing {a.image}: build it with bench/datasets/make-os-image")
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out_dir = a.out
    if not out_dir:
        # A new directory: -2, -3... after one of the same day (a run is
        # the evidence a figure in docs/ cites, never overwritten).
        base = os.path.join(ROOT, f"bench/runs/{date}-serve" + ("-quick" if a.quick else ""))
        out_dir, k = base, 2
        while os.path.exists(out_dir):
            out_dir, k = f"{base}-{k}", k + 1
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="serve-", dir=os.path.join(ROOT, "bench/work") if os.path.isdir(os.path.join(ROOT, "bench/work")) else None)
    size = os.path.getsize(a.image)
    log(f"image {a.image}: {size} bytes; work in {work}")

    repo = os.path.join(work, "repo")
    run([a.cairn, "init", repo, "--encryption", "none"])
    run([a.cairn, "backup", a.image, "--repo", repo, "--name", "os", "-q"])
    qcow = os.path.join(work, "os.qcow2")
    run(["qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2", a.image, qcow])
    raw = os.path.join(work, "os.raw")
    shutil.copyfile(a.image, raw)
    sizes = {"repo": int(run(["du", "-sb", repo]).stdout.split()[0]), "qcow2": os.path.getsize(qcow)}
    log(f"repository {sizes['repo']} bytes, qcow2 {sizes['qcow2']} bytes")
    sock = os.path.join(work, "sock")

    servers = {
        "cairn-image": ([a.cairn, "serve", "--repo", repo, "--socket", sock], "os", False),
        "qemu-qcow2": (["qemu-nbd", "-t", "-e", "8", "-r", "-f", "qcow2", "-k", sock, "-x", "os", "--cache=writeback", qcow], "os", False),
        "cairn-file": ([a.cairn, "serve", "--file", f"os={raw}", "--socket", sock], "os", True),
        "nbdkit-file": (["nbdkit", "-f", "-U", sock, "-e", "os", "file", raw], "os", True),
        "qemu-raw": (["qemu-nbd", "-t", "-e", "8", "-f", "raw", "-k", sock, "-x", "os", "--cache=writeback", raw], "os", True),
    }
    seq_count = size // (1 << 20)
    stride = (1 << 20) + 4096
    stride_count = 20000 if not a.quick else 5000
    loads = [
        ("seq-1M", lambda s, e: qemu_bench(s, e, size, 1 << 20, 1 << 20, 4, seq_count), "MB/s", lambda secs: seq_count * (1 << 20) / secs / 1e6, False),
        ("stride-4k", lambda s, e: qemu_bench(s, e, size, 4096, stride, 16, stride_count), "reads/s", lambda secs: stride_count / secs, False),
        ("randread-4k", lambda s, e: fio(s, e, "randread", size, a.fio_seconds), "IOPS", None, False),
        ("randwrite-4k", lambda s, e: fio(s, e, "randwrite", size, a.fio_seconds), "IOPS", None, True),
        ("nbdcopy", lambda s, e: nbdcopy(s, e), "MB/s", lambda secs: size / secs / 1e6, False),
    ]
    if a.loads:
        want = a.loads.split(",")
        unknown = set(want) - {l[0] for l in loads}
        if unknown:
            sys.exit(f"unknown loads: {', '.join(sorted(unknown))}")
        loads = [l for l in loads if l[0] in want]
    if a.servers:
        want = a.servers.split(",")
        unknown = set(want) - set(servers)
        if unknown:
            sys.exit(f"unknown servers: {', '.join(sorted(unknown))}")
        servers = {k: v for k, v in servers.items() if k in want}
    rows = []
    commands = {}
    for r in range(1 - a.warmup, a.runs + 1):
        for lname, fn, unit, conv, writes in loads:
            for sname, (cmd, export, writable) in servers.items():
                if writes and not writable:
                    continue
                srv = Server(cmd, sock)
                try:
                    v, lcmd = fn(sock, export)
                finally:
                    srv.stop()
                value = conv(v) if conv else v
                if r < 1:
                    log(f"warm-up {lname:13} {sname:12} {value:12.1f} {unit}")
                    continue
                lat = LATENCY.get(" ".join(lcmd), ("", "", ""))
                rows.append({"load": lname, "server": sname, "run": r, "value": round(value, 1), "unit": unit,
                             "p99_us": lat[0], "p999_us": lat[1], "max_us": lat[2]})
                commands[(lname, sname)] = (" ".join(cmd), " ".join(lcmd))
                log(f"run {r} {lname:13} {sname:12} {value:12.1f} {unit}")

    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["load", "server", "run", "value", "unit", "p99_us", "p999_us", "max_us"])
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(out_dir, "commands.txt"), "w") as f:
        for (l, s), (sc, lc) in sorted(commands.items()):
            f.write(f"{l} {s}\n  server: {sc}\n  load:   {lc}\n")
    versions = []
    for cmd in [[a.cairn, "--version"], ["qemu-nbd", "--version"], ["nbdkit", "--version"], ["fio", "--version"], ["nbdcopy", "--version"]]:
        try:
            versions.append(run(cmd).stdout.splitlines()[0])
        except Exception as e:  # noqa: BLE001 - a missing version is reported, not fatal
            versions.append(f"{cmd[0]}: {e}")
    with open(os.path.join(out_dir, "versions.txt"), "w") as f:
        f.write("\n".join(versions) + "\n")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    with open(os.path.join(out_dir, "machine.txt"), "w") as f:
        f.write(f"{os.cpu_count()} cores, {cpu}, kernel {platform.release()}\n")
        f.write(run(["df", "-T", work]).stdout)

    med = {}
    for row in rows:
        med.setdefault((row["load"], row["server"]), []).append(row["value"])
    med = {k: statistics.median(v) for k, v in med.items()}
    lines = [f"# cairn serve against qemu-nbd and nbdkit ({os.path.basename(out_dir)})", "",
             f"Image: {a.image} ({size} bytes); cairn repository {sizes['repo']} bytes (zstd:3), "
             f"qcow2 (zlib, `qemu-img convert -c`) {sizes['qcow2']} bytes. {a.runs} rounds after {a.warmup} warm-up, medians; "
             "every measurement starts a fresh server on a unix socket; page cache warm.", "",
             "| load | unit | " + " | ".join(servers) + " |", "|---|---|" + "--:|" * len(servers)]
    for lname, _, unit, _, _ in loads:
        cells = [f"{med[(lname, s)]:.1f}" if (lname, s) in med else "" for s in servers]
        lines.append(f"| {lname} | {unit} | " + " | ".join(cells) + " |")
    fio_rows = [row for row in rows if row["p999_us"] != ""]
    if fio_rows:
        lines += ["", "fio completion latency, medians over the rounds (µs):", "",
                  "| load | server | p99 | p99.9 | max |", "|---|---|--:|--:|--:|"]
        for lname, _, _, _, _ in loads:
            for sname in servers:
                rs = [row for row in fio_rows if (row["load"], row["server"]) == (lname, sname)]
                if rs:
                    lines.append(f"| {lname} | {sname} | " + " | ".join(
                        f"{statistics.median(row[k] for row in rs):.0f}" for k in ("p99_us", "p999_us", "max_us")) + " |")
    lines += ["", "| ratio | load | value | target |", "|---|---|--:|---|"]

    def ratio(a_, b_, load, target):
        if (load, a_) in med and (load, b_) in med and med[(load, b_)] > 0:
            r = med[(load, a_)] / med[(load, b_)]
            ok = "" if target is None else (f"≥ {target}×: " + ("yes" if r >= target else "**no**"))
            lines.append(f"| {a_} ÷ {b_} | {load} | {r:.2f}× | {ok} |")

    ratio("cairn-image", "qemu-qcow2", "seq-1M", 1.5)
    ratio("cairn-image", "qemu-qcow2", "nbdcopy", 1.5)
    ratio("cairn-image", "qemu-qcow2", "stride-4k", 3.0)
    ratio("cairn-image", "qemu-qcow2", "randread-4k", 3.0)
    ratio("cairn-file", "nbdkit-file", "randread-4k", 1.0)
    ratio("cairn-file", "nbdkit-file", "randwrite-4k", 1.0)
    ratio("cairn-file", "nbdkit-file", "stride-4k", 1.0)
    ratio("cairn-file", "qemu-raw", "randread-4k", None)
    ratio("cairn-file", "qemu-raw", "randwrite-4k", None)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
