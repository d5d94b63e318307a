#!/usr/bin/env python3
"""bonnie.py: seed 003's matrix, bonnie++ on ext4 on a served writable
image, compression off/on and dedup off/on, against the same filesystem
on a plain file (issue 20, item 5).

What: for each configuration, a fresh stack

    bonnie++ -> ext4 -> loop device (direct I/O) -> nbdfuse file
             -> NBD over a unix socket -> server -> disk under --work

and `bonnie++ -u root -f -n 0 -s SIZE -r RAM -d MNT -x K` in it
(sequential block write, rewrite, block read, random seeks). The
configurations (--configs):

  plain        ext4 on a loop device straight on a sparse file (no
               server, no FUSE): the disk and ext4 themselves
  nbdkit-file  `nbdkit file` on a sparse file (the peer server)
  cairn-file   `cairn serve --file d=FILE`: seed 003's base cell
               (compression off, dedup off: no repository at all)
  image-none   `cairn serve --repo R --image d,rw` on a blank image
               backed up with `-c none`: compression off, dedup on
  image-zstd   the same with cairn's default codec (zstd:3):
               compression on, dedup on
  image-zstd-wbc  image-zstd with a write-back log cache in front
               (`--image d,cache=CACHE`, CACHE of --cache-gib)

cairn has no way to turn dedup off: every chunk a repository stores is
looked up by its id (BLAKE3 of its bytes) in the chunk index
(crates/store/src/edit.rs `ImageEditor::commit`, backup.rs), whatever
the chunker; there is no flag, and none is invented here. A repository
image is therefore always "dedup on"; "dedup off" is a plain file (no
repository), and "compression on, dedup off" has no cairn equivalent.

The writable image: writes land in an overlay file on the work disk and
are committed (chunked, hashed, looked up, compressed, packed) every
--commit-every seconds (10 here, like a ZFS transaction group's 5 s, so
the commits run while bonnie does), and once more when the server stops:
that last commit is timed (`stop_s`). Reads of committed data come back
from the packs (decompressed).

The caches, each bounded so that SIZE is several times what they hold
(cgroup v1 memory controller):
- bonnie++ runs in a memory cgroup of --ram-mib (default 1024): ext4's
  page cache of its files is at most that, and `-r` says the same;
- the loop device reads and writes the nbdfuse file with direct I/O
  (checked in /sys/block/loopN/loop/dio): no second copy;
- the server (cairn or nbdkit) runs in a memory cgroup of
  --server-mem-mib (default 1536), its RSS included: its page cache of
  the overlay, the file, the packs and cairn's decoded-chunk cache
  (--image-cache, 256M) together fit in it; the write-back cache, when
  there is one, is --cache-gib on disk;
- the page cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`)
  before every stack is built. The machine's virtual disk may still be
  cached by its host (not under this script's control).

Also measured: the server's peak RSS (VmHWM) and CPU time (wait4), the
time of the final commit, the repository after the run (`cairn stats
--json`: chunks, index bytes per chunk; `cairn ls --json`: how many
commits, their time, raw and stored bytes), and the RSS of a fresh
`cairn serve` of the image over that repository against one over an
empty repository (what the loaded chunk index costs the server).

Needs: root, /dev/fuse, cgroup v1 memory at /sys/fs/cgroup/memory,
bonnie++, nbdfuse (libnbd-bin), nbdkit (for nbdkit-file), losetup,
mkfs.ext4, a release build of cairn, matplotlib. Installs nothing.

Usage: bench/bonnie.py [--cairn PATH] [--size-gib 8] [--ram-mib 1024]
                       [--server-mem-mib 1536] [--runs 2] [-x 1]
                       [--configs LIST] [--commit-every 10] [--seeks 65536]
                       [--quick] [--replot RUN]
Output: bench/runs/<UTC date>-bonnie[-K]/ (results.csv, stacks.csv,
summary.csv, report.md, commands.txt, versions.txt, machine.txt,
bonnie.png, errors.txt, run.txt, bonnie/ with bonnie's own output).
"""
import argparse
import csv
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plotting import drop_caches, grouped_bars, new_run_dir, plt, save  # noqa: E402
from serve import ROOT, Server, log, run, save_run, uri  # noqa: E402

MEMCG = "/sys/fs/cgroup/memory"
CONFIGS = ["plain", "nbdkit-file", "cairn-file", "image-none", "image-zstd", "image-zstd-wbc"]
# Seed 003 (NexentaStor, ZFS, bonnie++ -x 4 -f -s 4096): KiB/s, seeks/s.
SEED = {
    "base": {"write": 28793, "rewrite": 17127, "read": 59934, "seeks": 517.45},
    "compression": {"write": 38811, "rewrite": 18659, "read": 52830, "seeks": 1188.95},
    "dedup": {"write": 27550, "rewrite": 15179, "read": 45806, "seeks": 464},
    "both": {"write": 34315, "rewrite": 17654, "read": 53844, "seeks": 1331},
}
METRICS = ["write", "rewrite", "read", "seeks"]
# Fields of bonnie++ 2.00's CSV line (format 1.98) we keep: value, %CPU, latency.
BONNIE_FIELDS = {"write": (11, 12, 39), "rewrite": (13, 14, 40), "read": (17, 18, 42), "seeks": (19, 20, 43)}
# The seed's cells and the cairn configurations that stand for them.
CELLS = [("compression off, dedup off", "base", "cairn-file"),
         ("compression on, dedup off", "compression", None),
         ("compression off, dedup on", "dedup", "image-none"),
         ("compression on, dedup on", "both", "image-zstd")]
TOOLS = {"bonnie++": "bonnie++", "nbdfuse": "libnbd-bin", "losetup": "mount", "mkfs.ext4": "e2fsprogs",
         "mount": "mount", "umount": "mount"}


class Memcg:
    """A cgroup v1 memory group with a limit; commands run inside it."""

    def __init__(self, name, limit):
        self.path = os.path.join(MEMCG, name)
        os.makedirs(self.path, exist_ok=True)
        with open(os.path.join(self.path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        self.reset()

    def wrap(self, cmd):
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh"] + cmd

    def reset(self):
        for k in ("memory.max_usage_in_bytes", "memory.failcnt"):
            with open(os.path.join(self.path, k), "w") as f:
                f.write("0")

    def read(self, key):
        with open(os.path.join(self.path, key)) as f:
            return int(f.read())

    def remove(self):
        try:
            os.rmdir(self.path)
        except OSError:
            pass


class Measured(Server):
    """A server whose stop reports its peak RSS (VmHWM, read until it
    exits: wait4's ru_maxrss would count the forking Python's pages), CPU
    time and how long it took to stop (a writable image's final commit)."""

    def stop(self, timeout=600):
        hwm = vm_kib(self.p.pid, "VmHWM")
        t = time.monotonic()
        self.p.send_signal(signal.SIGTERM)
        while True:
            try:
                hwm = max(hwm, vm_kib(self.p.pid, "VmHWM"))
            except (OSError, StopIteration):
                pass
            pid, status, ru = os.wait4(self.p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > t + timeout:
                self.p.kill()
            time.sleep(0.02)
        self.p.returncode = os.waitstatus_to_exitcode(status)
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        return {"stop_s": round(time.monotonic() - t, 2), "server_peak_rss_kib": hwm,
                "server_cpu_s": round(ru.ru_utime + ru.ru_stime, 1), "server_exit": self.p.returncode}


def vm_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith(key + ":"))


def sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)


class Stack:
    """Backing store, server, nbdfuse, loop device and ext4 for one
    configuration; close() takes them down in reverse, whatever failed."""

    def __init__(self, a, config, work, commands):
        self.a, self.config, self.work = a, config, work
        self.commands = commands
        self.env = dict(os.environ, CAIRN_CACHE_DIR=os.path.join(work, "cache"),
                        CAIRN_STATE_DIR=os.path.join(work, "state"))
        self.server = self.nbdfuse = self.loop = None
        self.mounted = False
        self.mnt = os.path.join(work, "mnt")
        self.fuse = os.path.join(work, "fuse")
        self.sock = os.path.join(work, "sock")
        self.repo = os.path.join(work, "repo")
        for d in (self.mnt, self.fuse):
            os.makedirs(d, exist_ok=True)

    def start(self, server_cg):
        """Build the stack (close() undoes whatever part of it was made)."""
        a, config, work = self.a, self.config, self.work
        size = a.image_gib << 30
        backing = os.path.join(work, "disk.img")
        sparse(backing, size)
        drop_caches()
        if config == "plain":
            device = backing
        else:
            self.server = Measured(server_cg.wrap(self.server_cmd(backing)), self.sock)
            export = "" if config == "nbdkit-file" else "d"
            self.nbdfuse = subprocess.Popen(["nbdfuse", self.fuse, uri(self.sock, export)],
                                            stderr=subprocess.DEVNULL)
            self.note(f"nbdfuse {self.fuse} {uri(self.sock, export)}")
            device = os.path.join(self.fuse, "nbd")
            t = time.monotonic()
            while not os.path.exists(device):
                if time.monotonic() - t > 30:
                    raise RuntimeError("nbdfuse did not come up")
                time.sleep(0.05)
        self.loop = self.sh(["losetup", "--find", "--show", "--direct-io=on", device]).strip()
        with open(f"/sys/block/{os.path.basename(self.loop)}/loop/dio") as f:
            self.dio = f.read().strip() == "1"
        self.sh(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.loop])
        self.sh(["mount", "-o", "noatime", self.loop, self.mnt])
        self.mounted = True

    def note(self, cmd):
        self.commands.append(f"[{self.config}] {cmd}")

    def sh(self, cmd, **kw):
        self.note(" ".join(cmd))
        return run(cmd, env=self.env, **kw).stdout

    def server_cmd(self, backing):
        a = self.a
        if self.config == "nbdkit-file":
            cmd = ["nbdkit", "-f", "-U", self.sock, "file", backing]
        elif self.config == "cairn-file":
            cmd = [a.cairn, "serve", "--file", f"d={backing}", "--socket", self.sock]
        else:
            os.remove(backing)
            self.sh([a.cairn, "init", self.repo, "--encryption", "none"])
            blank = os.path.join(self.work, "blank.img")
            sparse(blank, a.image_gib << 30)
            codec = ["-c", "none"] if self.config == "image-none" else []
            self.sh([a.cairn, "backup", blank, "--repo", self.repo, "--name", "d", "-q"] + codec)
            os.remove(blank)
            spec = f"d,rw,overlay={os.path.join(self.work, 'overlay')}"
            if self.config.endswith("-wbc"):
                cache = os.path.join(self.work, "wbcache.dev")
                sparse(cache, a.cache_gib << 30)
                spec += f",cache={cache}"
            cmd = [a.cairn, "serve", "--repo", self.repo, "--image", spec, "--socket", self.sock,
                   "--commit-every", str(a.commit_every)]
        self.note("(in the server's memory cgroup) " + " ".join(cmd))
        return cmd

    def close(self):
        """Unmount, detach, stop; the server's figures (or {})."""
        if self.mounted:
            subprocess.run(["umount", self.mnt], capture_output=True)
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True)
        if self.nbdfuse:
            subprocess.run(["umount", self.fuse], capture_output=True)
            try:
                self.nbdfuse.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.nbdfuse.kill()
                self.nbdfuse.wait()
        return self.server.stop() if self.server else {}


def parse_bonnie(line):
    """bonnie++'s CSV line -> {metric: (value, %cpu, latency)}; "+++++"
    (a test under 500 ms) gives None."""
    f = line.strip().split(",")

    def num(s):
        try:
            return float(s)
        except ValueError:
            return None
    return {m: (num(f[v]), num(f[c]), f[lat] if lat < len(f) else "") for m, (v, c, lat) in BONNIE_FIELDS.items()}


def bonnie(a, stack, client_cg, out, tag):
    cmd = ["bonnie++", "-u", "root", "-f", "-n", "0", "-s", f"{a.size_gib << 10}:8192:{a.seeks}", "-r", str(a.ram_mib),
           "-d", stack.mnt, "-x", str(a.x), "-m", stack.config, "-q"]
    stack.note("(in the client's memory cgroup) " + " ".join(cmd))
    t = time.monotonic()
    p = run(client_cg.wrap(cmd))
    secs = time.monotonic() - t
    with open(os.path.join(out, "bonnie", f"{tag}.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n\n" + p.stderr + "\n" + p.stdout)
    lines = [ln for ln in p.stdout.splitlines() if ln.count(",") > 20]
    return [parse_bonnie(ln) for ln in lines], secs


def repo_figures(a, stack):
    """What the run left in the repository: stats, and the commits' sums
    (the first snapshot is the blank image's backup)."""
    st = json.loads(stack.sh([a.cairn, "stats", "--repo", stack.repo, "--json"]))
    snaps = json.loads(stack.sh([a.cairn, "ls", "d", "--repo", stack.repo, "--json"]))["snapshots"][1:]
    return {"commits": len(snaps), "chunks": st["chunks"], "pack_bytes": st["pack_bytes"],
            "unique_raw_bytes": st["unique_raw_bytes"],
            "stats_index_rss_bytes_per_chunk": round(st["index_rss_bytes_per_chunk"], 1),
            "commit_new_raw_bytes": sum(s["new_raw_bytes"] for s in snaps),
            "commit_stored_bytes": sum(s["stored_bytes"] for s in snaps),
            "commit_s": round(sum(s["seconds"] for s in snaps), 1),
            "latest_chunks": snaps[-1]["chunks"] if snaps else 0}


def idle_rss(a, stack, repo):
    """RSS (KiB) of `cairn serve` of image d, writable, over `repo`,
    just after it opened (the chunk index loaded twice: the writer's and
    the reader's copy)."""
    sock = os.path.join(stack.work, "idle.sock")
    cmd = [a.cairn, "serve", "--repo", repo, "--image",
           f"d,rw,overlay={os.path.join(stack.work, 'idle-overlay-' + os.path.basename(repo))}",
           "--socket", sock, "--commit-every", "0"]
    stack.note(" ".join(cmd) + "  # VmRSS after 1 s")
    srv = Server(cmd, sock)
    try:
        time.sleep(1)
        return vm_kib(srv.p.pid, "VmRSS")
    finally:
        srv.stop()


def index_rss(a, stack):
    """The served image's RSS over the run's repository minus over an
    empty one with the same blank image."""
    empty = os.path.join(stack.work, "empty-repo")
    stack.sh([a.cairn, "init", empty, "--encryption", "none"])
    blank = os.path.join(stack.work, "blank.img")
    sparse(blank, a.image_gib << 30)
    stack.sh([a.cairn, "backup", blank, "--repo", empty, "--name", "d", "-q"])
    os.remove(blank)
    base, full = idle_rss(a, stack, empty), idle_rss(a, stack, stack.repo)
    return {"idle_rss_empty_kib": base, "idle_rss_full_kib": full}


def medians(rows):
    med = {}
    for r in rows:
        for m in METRICS:
            if r[m] not in ("", None):
                med.setdefault((r["config"], m), []).append(float(r[m]))
    return {k: statistics.median(v) for k, v in med.items()}


def ratio_rows(med):
    """(cell, metric, cairn ratio or None, seed ratio or None) for each
    of the seed's non-base cells, and the compression step with dedup on."""
    out = []
    base = "cairn-file"
    for cell, seed, cfg in CELLS[1:]:
        for m in METRICS:
            c = med.get((cfg, m)) / med[(base, m)] if cfg and (cfg, m) in med and (base, m) in med else None
            out.append((cell, m, c, SEED[seed][m] / SEED["base"][m]))
    for m in METRICS:
        ok = ("image-zstd", m) in med and ("image-none", m) in med
        out.append(("compression on, given dedup on", m,
                    med[("image-zstd", m)] / med[("image-none", m)] if ok else None,
                    SEED["both"][m] / SEED["dedup"][m]))
    return out


def plot(out, med, configs):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [3, 1.3, 3]})
    mbps = [("write", "block write"), ("rewrite", "rewrite"), ("read", "block read")]
    series = [(c, [med.get((c, m), 0) for m, _ in mbps]) for c in configs]
    grouped_bars(axes[0], [label for _, label in mbps], series)
    axes[0].set_ylabel("MB/s (10^6 bytes/s)")
    axes[0].set_title("bonnie++ sequential block I/O")
    axes[0].legend(fontsize=7)
    grouped_bars(axes[1], ["random seeks"], [(c, [med.get((c, "seeks"), 0)]) for c in configs])
    axes[1].set_ylabel("seeks/s")
    axes[1].set_title("random seeks")
    rr = ratio_rows(med)
    series, colors = [], []
    for cell, shade in (("compression off, dedup on", 0), ("compression on, dedup on", 1),
                        ("compression on, given dedup on", 2)):
        for who, k, cmap in (("cairn", 2, plt.cm.Blues), ("ZFS", 3, plt.cm.Greys)):
            series.append((f"{who}: {cell}", [next((r[k] or 0) for r in rr if r[0] == cell and r[1] == m)
                                             for m in METRICS]))
            colors.append(cmap(0.45 + 0.2 * shade))
    grouped_bars(axes[2], METRICS, series, colors=colors)
    axes[2].axhline(1.0, color="black", linewidth=0.8)
    axes[2].set_ylabel("ratio")
    axes[2].set_title("ratios, cairn beside ZFS (seed 003)")
    axes[2].legend(fontsize=6)
    save(fig, out, "bonnie.png")


def fmt(v, nd=2):
    return "" if v is None else f"{v:.{nd}f}"


def report(out, a, med, stacks, configs):
    lines = [f"# bonnie++ on a served writable image: seed 003's matrix ({os.path.basename(out)})", "",
             f"`bonnie++ -u root -f -n 0 -s {a.size_gib << 10} -r {a.ram_mib} -x {a.x}` on ext4 "
             f"({a.image_gib} GiB device), {a.runs} round(s), configurations in turn (order reversed "
             f"every other round), medians. bonnie in a {a.ram_mib} MiB memory cgroup, each server in a "
             f"{a.server_mem_mib} MiB one, loop device with direct I/O, caches dropped before each "
             f"stack; writable images commit every {a.commit_every} s. MB/s = 10^6 bytes/s.", "",
             "| configuration | write MB/s | rewrite MB/s | read MB/s | seeks/s |", "|---|--:|--:|--:|--:|"]
    for c in configs:
        cells = [med.get((c, m)) for m in METRICS]
        lines.append(f"| {c} | " + " | ".join(fmt(v, 0 if i < 3 else 0) for i, v in enumerate(cells)) + " |")
    lines += ["", "| seed 003 cell | metric | cairn ratio | ZFS ratio |", "|---|---|--:|--:|"]
    for cell, m, c, z in ratio_rows(med):
        lines.append(f"| {cell} | {m} | {fmt(c) if c is not None else 'n/a'} | {z:.2f} |")
    cols = [("stop_s", "stop s (final commit)", 1, 1), ("server_peak_rss_kib", "server peak RSS MiB", 1024, 0),
            ("server_cpu_s", "server CPU s", 1, 1), ("server_cg_max_mib", "server cgroup max MiB", 1, 0),
            ("commits", "commits", 1, 0), ("commit_s", "commit s (sum)", 1, 1),
            ("commit_new_raw_bytes", "new raw MiB", 1 << 20, 0), ("commit_stored_bytes", "stored MiB", 1 << 20, 1),
            ("chunks", "chunks", 1, 0), ("idle_rss_empty_kib", "idle RSS empty MiB", 1024, 1),
            ("idle_rss_full_kib", "idle RSS full MiB", 1024, 1)]
    lines += ["", "| configuration | round | " + " | ".join(c[1] for c in cols) + " |",
              "|---|--:|" + "--:|" * len(cols)]
    for s in stacks:
        cells = [fmt(s[k] / div, nd) if s.get(k) not in (None, "") else "" for k, _, div, nd in cols]
        lines.append(f"| {s['config']} | {s['round']} | " + " | ".join(cells) + " |")
    lines += ["", "![bonnie](bonnie.png)"]
    return lines


def write_csv(path, rows):
    fields = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def preflight(a, configs):
    if os.geteuid() != 0:
        sys.exit("bonnie.py needs root (losetup, mount, cgroups, drop_caches)")
    need = dict(TOOLS)
    if "nbdkit-file" in configs:
        need["nbdkit"] = "nbdkit"
    missing = [f"{t} (apt-get install {pkg})" for t, pkg in need.items() if not shutil.which(t)]
    if missing:
        sys.exit("missing: " + ", ".join(missing))
    if not os.path.exists("/dev/fuse"):
        sys.exit("missing /dev/fuse (nbdfuse needs FUSE)")
    if not os.path.exists(os.path.join(MEMCG, "memory.limit_in_bytes")):
        sys.exit(f"missing the cgroup v1 memory controller at {MEMCG}")
    if not os.access(a.cairn, os.X_OK):
        sys.exit(f"missing cairn binary {a.cairn} (--cairn PATH)")


def facts(a, out, work):
    with open(os.path.join(out, "versions.txt"), "w") as f:
        for cmd in ([a.cairn, "--version"], ["nbdkit", "--version"], ["nbdfuse", "--version"],
                    ["losetup", "--version"], ["mkfs.ext4", "-V"]):
            p = subprocess.run(cmd, capture_output=True, text=True)
            f.write(((p.stdout or p.stderr).strip().splitlines() or ["?"])[0] + "\n")
        f.write(run(["dpkg-query", "-W", "bonnie++", "libnbd-bin", "nbdkit", "e2fsprogs"]).stdout)
        f.write(f"python {platform.python_version()}\n")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    mem = next(ln.strip() for ln in open("/proc/meminfo") if ln.startswith("MemTotal"))
    return (f"nproc {os.cpu_count()}; {cpu}; kernel {platform.release()}; {mem}\n"
            f"load at start: {open('/proc/loadavg').read().strip()}\n"
            f"cairn binary sha256: {run(['sha256sum', a.cairn]).stdout.split()[0]}\n"
            f"work directory {work} on:\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target/release/cairn"))
    ap.add_argument("--size-gib", type=int, default=8, help="bonnie -s (GiB)")
    ap.add_argument("--image-gib", type=int, default=12, help="device size (sparse)")
    ap.add_argument("--ram-mib", type=int, default=1024, help="bonnie -r and its memory cgroup")
    ap.add_argument("--server-mem-mib", type=int, default=1536, help="each server's memory cgroup")
    ap.add_argument("--cache-gib", type=int, default=1, help="write-back cache of image-zstd-wbc")
    ap.add_argument("--commit-every", type=int, default=10)
    ap.add_argument("--seeks", type=int, default=65536, help="bonnie's seeks (its default 8192 ends "
                    "in under 0.5 s on the plain file here, which bonnie reports as +++++)")
    ap.add_argument("--runs", type=int, default=2, help="rounds; each config once per round")
    ap.add_argument("-x", type=int, default=1, help="bonnie -x: tests per stack")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--work", default="/tmp/bonnie-work")
    ap.add_argument("--quick", action="store_true", help="-s 2 GiB, -r 512, 1 round: a smoke test")
    ap.add_argument("--replot", metavar="RUN", help="redraw RUN/bonnie.png and RUN/report.md from its CSVs")
    a = ap.parse_args()
    configs = a.configs.split(",")
    if a.replot:
        with open(os.path.join(a.replot, "results.csv")) as f:
            med = medians(list(csv.DictReader(f)))
        plot(a.replot, med, configs)
        return
    if a.quick:
        a.size_gib, a.image_gib, a.ram_mib, a.runs = 2, 4, 512, 1
    preflight(a, configs)
    out = new_run_dir(ROOT, "bonnie" + ("-quick" if a.quick else ""))
    os.makedirs(os.path.join(out, "bonnie"))
    os.makedirs(a.work, exist_ok=True)
    work = os.path.join(a.work, os.path.basename(out))
    machine = facts(a, out, work)
    client_cg = Memcg("cairn-bonnie-client", a.ram_mib << 20)
    server_cg = Memcg("cairn-bonnie-server", a.server_mem_mib << 20)
    commands, rows, stacks, problems = [], [], [], []
    started = time.monotonic()
    try:
        for rnd in range(a.runs):
            order = configs if rnd % 2 == 0 else configs[::-1]
            for config in order:
                shutil.rmtree(work, ignore_errors=True)
                os.makedirs(work)
                client_cg.reset()
                server_cg.reset()
                log(f"round {rnd} {config}: building the stack")
                info = {"round": rnd, "config": config, "load1": os.getloadavg()[0]}
                stack = Stack(a, config, work, commands)
                try:
                    stack.start(server_cg)
                    info["loop_dio"] = stack.dio
                    results, secs = bonnie(a, stack, client_cg, out, f"{rnd}-{config}")
                    info["bonnie_s"] = round(secs, 1)
                    for k, res in enumerate(results):
                        row = {"round": rnd, "config": config, "test": k}
                        for m in METRICS:
                            v, cpu, lat = res[m]
                            scale = 1 if m == "seeks" else 1024 / 1e6
                            row[m] = "" if v is None else round(v * scale, 2)
                            row[f"{m}_cpu_pct"] = "" if cpu is None else cpu
                            row[f"{m}_latency"] = lat
                        rows.append(row)
                        log(f"round {rnd} {config} test {k}: " +
                            ", ".join(f"{m} {row[m]}" for m in METRICS))
                    info["client_cg_max_mib"] = client_cg.read("memory.max_usage_in_bytes") >> 20
                    info["server_cg_max_mib"] = server_cg.read("memory.max_usage_in_bytes") >> 20
                except (subprocess.CalledProcessError, OSError, RuntimeError) as e:
                    said = getattr(e, "stderr", "") or str(e)
                    problems.append(f"round {rnd} {config}: {' '.join(map(str, getattr(e, 'cmd', [])))}: "
                                    f"{said.strip()[-500:]}")
                    log(problems[-1])
                finally:
                    info.update(stack.close())
                    log(f"round {rnd} {config}: stopped in {info.get('stop_s', 0)} s")
                if config.startswith("image") and "stop_s" in info:
                    try:
                        info.update(repo_figures(a, stack))
                        if rnd == 0:
                            info.update(index_rss(a, stack))
                    except (subprocess.CalledProcessError, OSError, RuntimeError, KeyError) as e:
                        problems.append(f"round {rnd} {config}: repository figures: {e}")
                stacks.append(info)
                log(f"elapsed {(time.monotonic() - started) / 60:.1f} min")
    finally:
        client_cg.remove()
        server_cg.remove()
    write_csv(os.path.join(out, "results.csv"), rows)
    write_csv(os.path.join(out, "stacks.csv"), stacks)
    med = medians(rows)
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "metric", "median", "unit"])
        for (c, m), v in sorted(med.items()):
            w.writerow([c, m, round(v, 2), "seeks/s" if m == "seeks" else "MB/s"])
    with open(os.path.join(out, "errors.txt"), "w") as f:
        f.write("\n".join(problems) + ("\n" if problems else "(none)\n"))
    with open(os.path.join(out, "run.txt"), "w") as f:
        f.write(" ".join(sys.argv) + "\n" + json.dumps(vars(a), indent=1) + "\n"
                f"wall time {(time.monotonic() - started) / 60:.1f} min\n")
    if rows:
        plot(out, med, [c for c in configs if any((c, m) in med for m in METRICS)])
    os.makedirs(work, exist_ok=True)
    save_run(out, work, report(out, a, med, stacks, configs), commands=None)
    with open(os.path.join(out, "commands.txt"), "w") as f:
        f.write("\n".join(dict.fromkeys(commands)) + "\n")
    with open(os.path.join(out, "machine.txt")) as f:
        cores = f.read()
    with open(os.path.join(out, "machine.txt"), "w") as f:
        f.write(machine + cores)


if __name__ == "__main__":
    main()
