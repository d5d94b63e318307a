#!/usr/bin/env python3
"""backup.py: cairn backup/restore side by side with borg, restic and casync.

What: backs up the benchmark inputs into deduplicating repositories with
`cairn backup` and its peers, restores them, and records time, MB/s, peak
RSS, repository size and the dedup saving across two versions of a disk:

- os:      bench/data/os.img then os2.img (make-os-image --with-packages)
           into one repository (two snapshots): backup time of each, repo
           size (du -sb) after each, restore time of each (to a file on the
           same filesystem, then compared by SHA-256 with the input), and
           os2.img alone into a fresh repository. Dedup saving on the second
           image = 1 - (bytes os2.img adds to the repo holding os.img)
           / (repo size of os2.img alone).
- mem, random: mem.core and random.bin alone: backup, repo size, restore.
- targets: cairn only (seed 000's table): mem.core backed up to 1, 2 and 4
           targets (bench/work/targets/t0..t3) with codecs none, lzo,
           snappy, lz4, zstd and threads = targets.

Contestants: cairn -c lz4 against borg --compression lz4, cairn -c zstd:3
against borg --compression zstd,3 and restic (compression auto, its zstd
"fastest"), and casync if installed. Every tool gets 2 threads where it has
the option (cairn -T 2, restic GOMAXPROCS=2; borg 1.2 and casync have one
thread), repositories on the same filesystem under bench/work.
Encryption: cairn-* are encrypted (cairn's default, AES-256-GCM, password
in CAIRN_PASSWORD) except cairn-zstd3-plain (--encryption none, to show
what encryption costs); borg-zstd3-enc is borg's repokey-blake2, the other
borg runs --encryption none; restic always encrypts (RESTIC_PASSWORD).

Why: issue "backup and dedup" sets targets for cairn: backup >= 2x borg at
the same codec and >= 2x restic, restore >= 2x restic, dedup saving on the
second image >= 30 %, repository no larger than the smaller of borg's and
restic's. ../shared/BENCHMARKING.md fixes the method: same input, same
threads, tools alternated (A B C A B C ...), medians, raw data kept.

How: each round runs every tool once on every input, in turn; every
measurement uses a fresh repository (and fresh tool caches) and is repeated
--runs times (default 3); the page cache is warm (each input read just
before each backup: borg drops what it reads from the cache). Times are wall-clock times of the command;
after each step `sync` is run and its time recorded apart (sync_s), so data
a tool left unflushed is visible. Output: bench/runs/<UTC date>-backup/
with results.csv (every measurement), summary.csv (medians), report.md,
commands.txt, versions.txt, machine.txt, inputs.txt, run.txt, errors.txt.

This script installs nothing. Needs: borg (apt-get install -y borgbackup),
restic (apt-get install -y restic), optionally casync (apt-get install -y
casync), GNU time (package time) for peak RSS, a cairn binary with
`backup` (cargo build --release).

Usage: bench/backup.py [--inputs os,mem,random,targets] [--only cairn,borg,restic,casync]
                       [--runs N] [--quick] [--dry-run] [--cairn PATH] ...
       bench/backup.py --report bench/runs/<date>-backup   (rewrite report.md from results.csv)
Only the Python 3 standard library is used.
"""

import argparse
import csv
import datetime
import hashlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
GNU_TIME = "/usr/bin/time"
THREADS = 2
RESTIC_PASSWORD = "cairn-bench"  # restic cannot write an unencrypted repository
BENCH_PASSWORD = "cairn-bench"   # cairn's and borg's encrypted repositories

FILES = {
    "os": ("os.img", "ext4 image of a Debian bookworm minbase tree (make-os-image)"),
    "os2": ("os2.img", "the same tree plus python3, perl, gcc (make-os-image --with-packages)"),
    "mem": ("mem.core", "gcore dump of a Python process holding mixed data (make-memdump)"),
    "random": ("random.bin", "1 GiB from /dev/urandom (make-random)"),
}
INPUT_SETS = ["os", "mem", "random", "targets"]
TARGET_COUNTS = [1, 2, 4]

CSV_COLUMNS = [
    "input", "step", "file", "tool_id", "tool", "codec", "threads", "targets", "run", "counted",
    "seconds", "mb_per_s", "cpu_s", "peak_rss_kib", "input_bytes", "repo_bytes", "added_bytes",
    "tool_reported_added", "verified", "sync_s", "busy_before", "load1", "note", "command",
]
SUMMARY_COLUMNS = [
    "input", "step", "tool_id", "tool", "codec", "threads", "targets", "runs", "median_s", "min_s",
    "max_s", "mb_per_s", "median_cpu_s", "max_peak_rss_kib", "input_bytes", "median_repo_bytes",
    "median_added_bytes", "median_sync_s", "verified",
]


def log(msg):
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def load1():
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return ""


def run_text(argv, env=None):
    """Output (stdout+stderr) of a small informational command, or the error."""
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env,
                           stderr=subprocess.STDOUT, timeout=30, text=True)
        return p.stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"({e})"


# ---------------------------------------------------------------- commands

@dataclass
class Cmd:
    """One command line: argv, extra environment, optional stdout file."""
    argv: list
    env: dict = field(default_factory=dict)
    stdout: str = None   # a file to write stdout to (restore to a file); else captured

    def shell(self):
        envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        s = (envs + " " if envs else "") + shlex.join(self.argv)
        return s + (f" > {shlex.quote(self.stdout)}" if self.stdout else "")


@dataclass
class Result:
    seconds: float = None
    cpu_s: float = None
    rss_kib: int = None
    out: str = ""         # captured stdout (not when stdout went to a file)
    err: str = None       # None on success
    busy_before: float = None  # share of all cores busy just before the command


def run_cmd(cmd, scratch):
    """Run cmd once under GNU time; wall time from here, CPU and peak RSS from time(1)."""
    rss_file = os.path.join(scratch, "time.out")
    out_file = cmd.stdout or os.path.join(scratch, "stdout.txt")
    err_file = os.path.join(scratch, "stderr.txt")
    argv = cmd.argv
    if os.access(GNU_TIME, os.X_OK):
        # GNU time, not wait4() here: a child forked from this Python process
        # would report the parent's RSS as its own peak.
        argv = [GNU_TIME, "-f", "%U %S %M", "-o", rss_file] + argv
    env = dict(os.environ, **cmd.env)
    with open(out_file, "wb") as fo, open(err_file, "wb") as fe:
        t0 = time.perf_counter()
        rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe, env=env).returncode
        secs = time.perf_counter() - t0
    r = Result(seconds=secs)
    try:
        with open(rss_file) as f:
            u, s, m = f.read().strip().splitlines()[-1].split()
        r.cpu_s, r.rss_kib = float(u) + float(s), int(m)
    except (OSError, ValueError, IndexError):
        pass
    if not cmd.stdout:
        with open(out_file, errors="replace") as f:
            r.out = f.read()
    if rc != 0:
        with open(err_file, errors="replace") as f:
            tail = [x for x in f.read().strip().splitlines() if x.strip()][-4:]
        r.err = f"exit {rc}: {' | '.join(tail)}"
    return r


def json_objects(text):
    """Every JSON object printed in text (one per line, or one spanning lines)."""
    objs = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                objs.append(json.loads(line))
            except ValueError:
                pass
    if not objs:
        try:
            objs.append(json.loads(text))
        except ValueError:
            pass
    return objs


# ---------------------------------------------------------------- tools

class Tool:
    """A contestant: how it makes a repository, backs up and restores one file."""
    family = ""
    label = ""

    def __init__(self, tid, codec, threads):
        self.tid, self.codec, self.threads = tid, codec, threads

    def env(self, home):
        return {}

    def init(self, repo, home, targets=()):
        raise NotImplementedError

    def backup(self, repo, home, src, name, seq):
        """Cmd backing up src as snapshot number seq (1, 2) of NAME."""
        raise NotImplementedError

    def parse_backup(self, out, name, seq):
        """(snapshot handle, bytes the tool says it added) from the backup's output."""
        return f"{name}-{seq}", None

    def restore(self, repo, home, handle, dest):
        raise NotImplementedError

    def restored_file(self, dest, src):
        return dest


class Cairn(Tool):
    family = "cairn"

    def __init__(self, tid, codec, threads, binary, chunker=None, encrypted=True):
        super().__init__(tid, codec, threads)
        self.binary, self.chunker, self.encrypted = binary, chunker, encrypted

    def env(self, home):
        # Encrypted (cairn's default) with the password in the environment;
        # plain repositories refuse a password, so theirs is empty (unset).
        return {"CAIRN_PASSWORD": BENCH_PASSWORD} if self.encrypted else {}

    def init(self, repo, home, targets=()):
        argv = [self.binary, "init", repo]
        for t in targets:
            argv += ["--target", t]
        if not self.encrypted:
            argv += ["--encryption", "none"]
        return [Cmd(argv, self.env(home))]

    def backup(self, repo, home, src, name, seq):
        argv = [self.binary, "backup", src, "--repo", repo, "--name", name, "-c", self.codec]
        if self.chunker:
            argv += ["--chunker", self.chunker]
        return Cmd(argv + ["-T", str(self.threads), "--json"], self.env(home))

    def parse_backup(self, out, name, seq):
        for o in reversed(json_objects(out)):
            if "snapshot" in o:
                return f"{o.get('name', name)}@{o['snapshot']}", o.get("bytes_stored_new")
        raise RuntimeError("cairn backup --json printed no object with a snapshot")

    def restore(self, repo, home, handle, dest):
        return Cmd([self.binary, "restore", handle, dest, "--repo", repo, "-T", str(self.threads), "--json"],
                   self.env(home))


class Borg(Tool):
    family = "borg"

    def __init__(self, tid, codec, threads, encryption="none"):
        super().__init__(tid, codec, threads)
        self.encryption = encryption

    def env(self, home):
        # Cache, config, keys and security dirs in a fresh dir per repository.
        return {"BORG_BASE_DIR": home, "BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK": "yes",
                "BORG_RELOCATED_REPO_ACCESS_IS_OK": "yes", "BORG_PASSPHRASE": BENCH_PASSWORD}

    def init(self, repo, home, targets=()):
        return [Cmd(["borg", "init", "--encryption", self.encryption, repo], self.env(home))]

    def backup(self, repo, home, src, name, seq):
        return Cmd(["borg", "create", "--json", "--compression", self.codec, f"{repo}::{name}-{seq}", src],
                   self.env(home))

    def parse_backup(self, out, name, seq):
        added = None
        for o in json_objects(out):
            added = o.get("archive", {}).get("stats", {}).get("deduplicated_size", added)
        return f"{name}-{seq}", added

    def restore(self, repo, home, handle, dest):
        return Cmd(["borg", "extract", "--stdout", f"{repo}::{handle}"], self.env(home), stdout=dest)


class Restic(Tool):
    family = "restic"

    def env(self, home):
        return {"RESTIC_PASSWORD": RESTIC_PASSWORD, "RESTIC_CACHE_DIR": os.path.join(home, "cache"),
                "GOMAXPROCS": str(self.threads)}

    def init(self, repo, home, targets=()):
        return [Cmd(["restic", "--repo", repo, "init", "--repository-version", "2"], self.env(home))]

    def backup(self, repo, home, src, name, seq):
        return Cmd(["restic", "--repo", repo, "--compression", self.codec, "backup", "--json",
                    "--host", "cairn-bench", "--tag", f"{name}-{seq}", src], self.env(home))

    def parse_backup(self, out, name, seq):
        for o in reversed(json_objects(out)):
            if o.get("message_type") == "summary" and o.get("snapshot_id"):
                return o["snapshot_id"], o.get("data_added")
        raise RuntimeError("restic backup --json printed no summary with a snapshot_id")

    def restore(self, repo, home, handle, dest):
        return Cmd(["restic", "--repo", repo, "restore", handle, "--target", dest], self.env(home))

    def restored_file(self, dest, src):
        return dest + os.path.abspath(src)  # restic recreates the absolute path under --target


class Casync(Tool):
    family = "casync"

    def init(self, repo, home, targets=()):
        return [Cmd(["mkdir", "-p", repo])]

    def backup(self, repo, home, src, name, seq):
        return Cmd(["casync", "make", f"--compression={self.codec}", f"--store={repo}/default.castr",
                    f"{repo}/{name}-{seq}.caibx", src])

    def restore(self, repo, home, handle, dest):
        return Cmd(["casync", "extract", f"--store={repo}/default.castr", f"{repo}/{handle}.caibx", dest])


def make_tools(cairn, chunker):
    return [
        Cairn("cairn-lz4", "lz4", THREADS, cairn, chunker),
        Borg("borg-lz4", "lz4", 1),
        Cairn("cairn-zstd3", "zstd:3", THREADS, cairn, chunker),
        Cairn("cairn-zstd3-plain", "zstd:3", THREADS, cairn, chunker, encrypted=False),
        Borg("borg-zstd3", "zstd,3", 1),
        Borg("borg-zstd3-enc", "zstd,3", 1, "repokey-blake2"),
        Restic("restic", "auto", THREADS),
        Casync("casync", "zstd", 1),
    ]


# Targets of the issue: (cairn tool, peer tool, backup speed, restore speed).
PAIRS = [
    ("cairn-lz4", "borg-lz4", 2.0, None),
    ("cairn-zstd3", "borg-zstd3", 2.0, None),
    ("cairn-zstd3", "borg-zstd3-enc", 2.0, None),
    # What encryption costs cairn: at most 10 % (>= 0.9x the plain speed).
    ("cairn-zstd3", "cairn-zstd3-plain", 0.9, None),
    ("cairn-zstd3", "restic", 2.0, 2.0),
    ("cairn-zstd3", "casync", None, None),
]
DEDUP_TARGET = 0.30
TOOL_NOTES = {
    "cairn": "-T 2 for backup and restore; cairn's default chunker unless --cairn-chunker; "
             "encrypted (AES-256-GCM, keyed BLAKE3 ids; CAIRN_PASSWORD set) except cairn-zstd3-plain "
             "(--encryption none)",
    "borg": "borg 1.2 is single-threaded; default chunker buzhash 19,23,21,4095 (~2 MiB chunks); "
            "borg-zstd3-enc: --encryption repokey-blake2 (BORG_PASSPHRASE), the others --encryption none; "
            "cache and config in a fresh BORG_BASE_DIR per repository",
    "restic": "GOMAXPROCS=2; repository version 2, --compression auto (zstd 'fastest'); encryption is "
              "mandatory in restic (RESTIC_PASSWORD set; AES-256 + Poly1305 cost included); "
              "restore with `restic restore --target`, cache in a fresh RESTIC_CACHE_DIR; "
              "`init --insecure-no-password` needs restic >= 0.17 (Debian 12 has 0.14)",
    "casync": "single-threaded; default chunker (64 KiB average), --compression=zstd",
}


# ---------------------------------------------------------------- measuring

BUSY_LIMIT = 0.25  # share of all cores that others may use before a timed step


def cpu_busy(interval=0.5):
    """Share of all cores busy (not idle, not iowait) over interval seconds."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v[:8]), v[3] + v[4]
    t0, i0 = snap()
    time.sleep(interval)
    t1, i1 = snap()
    return 1 - (i1 - i0) / (t1 - t0) if t1 > t0 else 0.0


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(4 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def warm_tree(paths):
    """Read every file under `paths` (files or directories) so that it is in
    the page cache: a repository is read warm by every tool alike, whether
    the tool wrote it through the page cache (borg, restic, casync) or past
    it (cairn's packs are written with O_DIRECT); an input is read again
    before every backup, because borg drops the files it has read from the
    page cache (posix_fadvise DONTNEED: `fincore` of random.bin shows
    1012 MiB cached before `borg create`, 62 MiB after), which left the
    tool after borg to read its input from disk."""
    for top in paths:
        files = [top] if os.path.isfile(top) else \
            [os.path.join(root, name) for root, _dirs, names in os.walk(top) for name in names]
        for path in files:
            try:
                with open(path, "rb", buffering=0) as f:
                    while f.read(4 << 20):
                        pass
            except OSError:
                pass  # a file gone meanwhile (a tool's lock or temp file)


def du_bytes(paths):
    """Apparent size in bytes (du -sb) of the paths together."""
    total = 0
    for p in paths:
        if os.path.exists(p):
            total += int(subprocess.run(["du", "-sb", p], stdout=subprocess.PIPE, text=True,
                                        check=True).stdout.split()[0])
    return total


def rmtree(p):
    if os.path.lexists(p):
        shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)


class Bench:
    """Runs the measurements; keeps commands, rows and errors."""

    def __init__(self, run_dir, scratch, dry_run, inputs, sums, idle_wait=0):
        self.run_dir, self.scratch, self.dry_run = run_dir, scratch, dry_run
        self.idle_wait = idle_wait  # seconds to wait at most for other processes to stop
        self.inputs = inputs    # key -> path measured
        self.sums = sums        # path -> sha256
        self.rows, self.errors, self.failures = [], [], []
        self.commands = open(os.path.join(run_dir, "commands.txt"), "a")

    def note(self, what, cmd):
        self.commands.write(f"# {what}\n{cmd.shell()}\n")
        self.commands.flush()

    def wait_idle(self):
        """Before a timed command: the share of CPU others use; wait while it is high.

        The machine is shared; between two steps this script uses no CPU,
        so what /proc/stat shows busy then is someone else's work.
        """
        busy = cpu_busy()
        t0 = time.time()
        if busy > BUSY_LIMIT and self.idle_wait > 0:
            log(f"  machine busy ({100 * busy:.0f} % of all cores used by other processes): waiting "
                f"up to {self.idle_wait} s")
            while busy > BUSY_LIMIT and time.time() - t0 < self.idle_wait:
                time.sleep(5)
                busy = cpu_busy()
            log(f"  {'idle' if busy <= BUSY_LIMIT else 'still busy'} after {time.time() - t0:.0f} s")
        return busy

    def step(self, what, cmd, timed=True):
        """Run one command (or only note it with --dry-run); raise on failure."""
        self.note(what, cmd)
        if self.dry_run:
            return Result(seconds=float("nan"), out="")
        busy = self.wait_idle() if timed else None
        r = run_cmd(cmd, self.scratch)
        r.busy_before = busy
        if r.err:
            raise RuntimeError(f"{what}: {r.err}")
        return r

    def sync(self):
        if self.dry_run:
            return None
        t0 = time.perf_counter()
        subprocess.run(["sync"], check=False)
        return time.perf_counter() - t0

    def row(self, base, res, **kw):
        nbytes = kw.get("input_bytes") or base.get("input_bytes")
        r = {**base, "seconds": f"{res.seconds:.6f}" if res.seconds == res.seconds else "",
             "cpu_s": "" if res.cpu_s is None else f"{res.cpu_s:.3f}",
             "peak_rss_kib": "" if res.rss_kib is None else res.rss_kib,
             "busy_before": "" if res.busy_before is None else f"{res.busy_before:.2f}",
             "load1": load1(), **kw}
        if nbytes and res.seconds and res.seconds == res.seconds:
            r["mb_per_s"] = f"{nbytes / 1e6 / res.seconds:.1f}"
        for k in ("sync_s",):
            if isinstance(r.get(k), float):
                r[k] = f"{r[k]:.3f}"
        self.rows.append(r)
        return r

    def verify(self, path, src, what):
        """Compare a restored file with its input; a mismatch is a failed run."""
        if self.dry_run:
            return ""
        if not os.path.exists(path):
            msg = f"{what}: restored file {path} does not exist"
        elif os.path.getsize(path) != os.path.getsize(src):
            msg = f"{what}: restored {os.path.getsize(path)} bytes, input has {os.path.getsize(src)}"
        elif sha256_file(path) != self.sums[src]:
            msg = f"{what}: restored bytes differ from the input (SHA-256)"
        else:
            return "yes"
        self.failures.append(msg)
        log("!" * 72)
        log(f"!!! RESTORE MISMATCH: {msg}")
        log("!" * 72)
        return "MISMATCH"

    def fresh(self, tool, label):
        """A fresh repo path, tool home dir and restore dir for one measurement."""
        d = os.path.join(self.scratch, f"{tool.tid}-{label}")
        rmtree(d)
        os.makedirs(os.path.join(d, "home"))
        os.makedirs(os.path.join(d, "restore"))
        return os.path.join(d, "repo"), os.path.join(d, "home"), os.path.join(d, "restore"), d

    def restore_and_check(self, tool, repo, home, rdir, handle, src, base, step, run_label):
        dest = os.path.join(rdir, "out") if tool.family != "restic" else os.path.join(rdir, "out.d")
        cmd = tool.restore(repo, home, handle, dest)
        if not self.dry_run:
            warm_tree([repo, home])
        res = self.step(f"{run_label}: {step}", cmd)
        sync_s = self.sync()
        ok = self.verify(tool.restored_file(dest, src), src, f"{run_label} {step} ({tool.tid})")
        self.row(base, res, step=step, file=os.path.basename(src), input_bytes=os.path.getsize(src),
                 verified=ok, sync_s=sync_s, command=cmd.shell())
        rmtree(dest)

    def copy_limit(self, key, run, counted):
        """The physical limit of a restore: cp of the input to the same filesystem."""
        src = self.inputs[key]
        dest = os.path.join(self.scratch, "copy.out")
        cmd = Cmd(["cp", "--sparse=never", src, dest])
        base = {"input": key, "step": "copy", "file": os.path.basename(src), "tool_id": "cp", "tool": "cp",
                "codec": "", "threads": 1, "run": run, "counted": "yes" if counted else "no (warm-up)",
                "input_bytes": os.path.getsize(src)}
        try:
            if not self.dry_run:
                warm_tree([src])
            res = self.step(f"run {run} {key}: physical limit, copy to the same filesystem", cmd)
            sync_s = self.sync()
            self.row(base, res, sync_s=sync_s, note="page cache -> file on the work filesystem; "
                     "sync timed apart", command=cmd.shell())
        finally:
            rmtree(dest)

    # -- one tool, one input set, one run

    def os_sequence(self, tool, run, counted):
        """os.img then os2.img into one repo; restore both; os2.img alone in a fresh repo."""
        src1, src2 = self.inputs["os"], self.inputs["os2"]
        label = f"run {run} os+os2 {tool.tid}"
        base = {"input": "os+os2", "tool_id": tool.tid, "tool": tool.family, "codec": tool.codec,
                "threads": tool.threads, "run": run, "counted": "yes" if counted else "no (warm-up)"}
        repo, home, rdir, d = self.fresh(tool, "os")
        try:
            for c in tool.init(repo, home):
                self.step(f"{label}: init", c, timed=False)
            sizes, handles = [0], []
            for seq, src in ((1, src1), (2, src2)):
                cmd = tool.backup(repo, home, src, "os", seq)
                if not self.dry_run:
                    warm_tree([src])
                res = self.step(f"{label}: backup-{seq}", cmd)
                sync_s = self.sync()
                handle, reported = (f"<snapshot {seq}>", None) if self.dry_run else \
                    tool.parse_backup(res.out, "os", seq)
                handles.append(handle)
                size = None if self.dry_run else du_bytes([repo])
                sizes.append(size)
                self.row(base, res, step=f"backup-{seq}", file=os.path.basename(src),
                         input_bytes=os.path.getsize(src), repo_bytes=size,
                         added_bytes=None if size is None else size - sizes[-2],
                         tool_reported_added=reported, sync_s=sync_s, command=cmd.shell())
            for seq, src in ((1, src1), (2, src2)):
                self.restore_and_check(tool, repo, home, rdir, handles[seq - 1], src, base,
                                       f"restore-{seq}", label)
        finally:
            rmtree(d)
        repo, home, rdir, d = self.fresh(tool, "os2")
        try:
            for c in tool.init(repo, home):
                self.step(f"{label}: init (os2 alone)", c, timed=False)
            cmd = tool.backup(repo, home, src2, "os", 1)
            res = self.step(f"{label}: backup-alone (os2.img into a fresh repo)", cmd)
            sync_s = self.sync()
            reported = None if self.dry_run else tool.parse_backup(res.out, "os", 1)[1]
            size = None if self.dry_run else du_bytes([repo])
            self.row(base, res, step="backup-alone", file=os.path.basename(src2),
                     input_bytes=os.path.getsize(src2), repo_bytes=size, added_bytes=size,
                     tool_reported_added=reported, sync_s=sync_s, command=cmd.shell())
        finally:
            rmtree(d)

    def single(self, key, tool, run, counted):
        """One file alone: backup into a fresh repo, repo size, restore, check."""
        src = self.inputs[key]
        label = f"run {run} {key} {tool.tid}"
        base = {"input": key, "tool_id": tool.tid, "tool": tool.family, "codec": tool.codec,
                "threads": tool.threads, "run": run, "counted": "yes" if counted else "no (warm-up)",
                "file": os.path.basename(src), "input_bytes": os.path.getsize(src)}
        repo, home, rdir, d = self.fresh(tool, key)
        try:
            for c in tool.init(repo, home):
                self.step(f"{label}: init", c, timed=False)
            cmd = tool.backup(repo, home, src, key, 1)
            if not self.dry_run:
                warm_tree([src])
            res = self.step(f"{label}: backup", cmd)
            sync_s = self.sync()
            handle, reported = (f"<snapshot 1>", None) if self.dry_run else tool.parse_backup(res.out, key, 1)
            size = None if self.dry_run else du_bytes([repo])
            self.row(base, res, step="backup", repo_bytes=size, added_bytes=size,
                     tool_reported_added=reported, sync_s=sync_s, command=cmd.shell())
            self.restore_and_check(tool, repo, home, rdir, handle, src, base, "restore", label)
        finally:
            rmtree(d)

    def targets(self, cairn, codec, ntargets, tdirs, run, counted):
        """Seed 000's table: mem.core to N targets, codec, -T N."""
        src = self.inputs["mem"]
        tool = Cairn(f"cairn-{codec.replace(':', '')}", codec, ntargets, cairn.binary, cairn.chunker)
        label = f"run {run} targets={ntargets} {codec}"
        base = {"input": "mem", "step": "backup-targets", "tool_id": tool.tid, "tool": "cairn",
                "codec": codec, "threads": ntargets, "targets": ntargets, "run": run,
                "counted": "yes" if counted else "no (warm-up)", "file": os.path.basename(src),
                "input_bytes": os.path.getsize(src)}
        repo, home, rdir, d = self.fresh(tool, f"targets{ntargets}")
        used = tdirs[:ntargets]
        try:
            for t in tdirs:
                rmtree(t)
                os.makedirs(t)
            for c in tool.init(repo, home, used):
                self.step(f"{label}: init", c, timed=False)
            cmd = tool.backup(repo, home, src, "mem", 1)
            if not self.dry_run:
                warm_tree([src])
            res = self.step(f"{label}: backup", cmd)
            sync_s = self.sync()
            reported = None if self.dry_run else tool.parse_backup(res.out, "mem", 1)[1]
            size = None if self.dry_run else du_bytes([repo] + used)
            self.row(base, res, repo_bytes=size, added_bytes=size, tool_reported_added=reported,
                     sync_s=sync_s, note=f"targets: {' '.join(used)}", command=cmd.shell())
        finally:
            rmtree(d)
            for t in tdirs:
                rmtree(t)


# ---------------------------------------------------------------- summary and report

def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def summarize(rows):
    """Medians of the counted runs per (input, step, tool_id, targets)."""
    groups = {}
    for r in rows:
        if r.get("counted") != "yes":
            continue
        k = (r["input"], r["step"], r["tool_id"], str(r.get("targets") or ""))
        groups.setdefault(k, []).append(r)
    out = []
    for (inp, step, tid, targets), rs in groups.items():
        secs = [fnum(r["seconds"]) for r in rs if fnum(r.get("seconds")) is not None]
        med = lambda key: (statistics.median(v) if (v := [fnum(r.get(key)) for r in rs
                                                          if fnum(r.get(key)) is not None]) else None)
        nbytes = fnum(rs[0].get("input_bytes"))
        ms = statistics.median(secs) if secs else None
        rss = [fnum(r.get("peak_rss_kib")) for r in rs if fnum(r.get("peak_rss_kib")) is not None]
        ver = {r.get("verified", "") for r in rs} - {""}
        out.append({
            "input": inp, "step": step, "tool_id": tid, "tool": rs[0]["tool"], "codec": rs[0]["codec"],
            "threads": rs[0]["threads"], "targets": targets, "runs": len(secs),
            "median_s": ms, "min_s": min(secs) if secs else None, "max_s": max(secs) if secs else None,
            "mb_per_s": nbytes / 1e6 / ms if ms and nbytes else None, "median_cpu_s": med("cpu_s"),
            "max_peak_rss_kib": max(rss) if rss else None, "input_bytes": nbytes,
            "median_repo_bytes": med("repo_bytes"), "median_added_bytes": med("added_bytes"),
            "median_sync_s": med("sync_s"),
            "verified": "" if not ver else ("MISMATCH" if "MISMATCH" in ver else ",".join(sorted(ver))),
        })
    return out


def dedup_savings(rows):
    """Per tool: median over counted runs of 1 - added(os2 after os) / alone(os2)."""
    per = {}
    for r in rows:
        if r.get("counted") == "yes" and r["input"] == "os+os2" and r["step"] in ("backup-2", "backup-alone"):
            per.setdefault((r["tool_id"], r["run"]), {})[r["step"]] = fnum(r.get("added_bytes"))
    sav = {}
    for (tid, _), d in per.items():
        a, b = d.get("backup-2"), d.get("backup-alone")
        if a is not None and b:
            sav.setdefault(tid, []).append(1 - a / b)
    return {t: statistics.median(v) for t, v in sav.items()}


def mib(x):
    return "" if x is None else f"{x / 2**20:.1f}"


def f1(x, nd=1):
    return "" if x is None else f"{x:.{nd}f}"


def write_summary(run_dir, summ):
    with open(os.path.join(run_dir, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        w.writeheader()
        for s in summ:
            w.writerow({k: ("" if s.get(k) is None else (f"{s[k]:.6g}" if isinstance(s[k], float) else s[k]))
                        for k in SUMMARY_COLUMNS})


def write_report(run_dir):
    """report.md from results.csv (and run.txt, machine.txt, errors.txt, overlap.json)."""
    with open(os.path.join(run_dir, "results.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    summ = summarize(rows)
    write_summary(run_dir, summ)
    S = {(s["input"], s["step"], s["tool_id"], s["targets"]): s for s in summ}
    sav = dedup_savings(rows)
    tools = []
    for s in summ:
        if s["step"] != "backup-targets" and s["tool_id"] not in tools:
            tools.append(s["tool_id"])
    order = ["cairn-lz4", "borg-lz4", "cairn-zstd3", "borg-zstd3", "restic", "casync"]
    tools.sort(key=lambda t: order.index(t) if t in order else len(order))

    def get(inp, step, tid, key, targets=""):
        s = S.get((inp, step, tid, targets))
        return None if s is None else s.get(key)

    def read(name):
        p = os.path.join(run_dir, name)
        return open(p).read() if os.path.exists(p) else ""

    runinfo = dict(line.split(": ", 1) for line in read("run.txt").splitlines() if ": " in line)
    machine = dict(line.split(": ", 1) for line in read("machine.txt").splitlines() if ": " in line)
    errors = [e for e in read("errors.txt").splitlines() if e.strip()]
    failures = [e for e in errors if "MISMATCH" in e or "differ" in e or "does not exist" in e]
    L = []
    L.append(f"# cairn backup / restore against borg, restic and casync ({os.path.basename(run_dir)})\n")
    if any(r.get("verified") == "MISMATCH" for r in rows) or failures:
        L.append("**FAILED: a restored file differed from its input. These runs are failures:**\n")
        L += [f"- {e}" for e in failures] + [""]
    L.append(f"Machine: {machine.get('nproc', '?')} cores ({machine.get('cpu_model', '?')}), "
             f"{machine.get('memtotal', '?')} RAM, {machine.get('os', '?')}; repositories and restores on "
             f"`{machine.get('work_dir_fs', '?')}`. Load average at start {machine.get('loadavg_start', '?')}.\n")
    L.append(f"Method: every tool runs once per round on each input, in turn (A B C A B C); "
             f"{runinfo.get('runs', '?')} counted rounds ({runinfo.get('warmup', '0')} warm-up), medians; "
             "a fresh repository and fresh tool caches for every measurement; page cache warm (each input read "
             "just before each backup, since borg drops the files it reads from the page cache; each tool's "
             "repository read just before each restore, since cairn writes its packs past the page cache). Time = wall time of the command; `sync` after each "
             "step is timed apart (sync_s in the CSV). MB/s = 10⁶ bytes of input per second, for restore too. "
             "Repo size = `du -sb` of the repository. Restores write a file on the same filesystem, compared "
             "by SHA-256 with the input. \"sync after\" is the median time of the `sync` that follows a step: "
             "near 0 when the tool flushed its own writes (inside its time), larger when it left them to the "
             "page cache (the os columns: the second backup and restore).\n")
    busy = [fnum(r.get("busy_before")) for r in rows if r.get("counted") == "yes"]
    busy = [b for b in busy if b is not None]
    if busy:
        hot = sum(b > 0.25 for b in busy)
        L.append(f"Shared machine: before each timed step the share of all cores used by other processes "
                 f"was measured (busy_before; the script waits up to --idle-wait s while it is above 25 %): "
                 f"median {100 * statistics.median(busy):.0f} %, max {100 * max(busy):.0f} %, "
                 f"{hot} of {len(busy)} steps started above 25 %. 1-minute load average during the run: "
                 f"{min(fnum(r['load1']) for r in rows if fnum(r.get('load1')) is not None):.2f} to "
                 f"{max(fnum(r['load1']) for r in rows if fnum(r.get('load1')) is not None):.2f} "
                 f"(this script's own tools put it near 2).\n")
    L.append("Tools:\n")
    for fam in ("cairn", "borg", "restic", "casync"):
        if any(t.startswith(fam) for t in tools) or (fam == "cairn" and any(
                s["step"] == "backup-targets" for s in summ)):
            L.append(f"- {fam}: {TOOL_NOTES[fam]}")
    L.append("")

    # 1. OS image versions
    if any(k[0] == "os+os2" for k in S):
        L.append("## OS image, two versions: os.img then os2.img into one repository\n")
        L.append("| tool | codec | backup os.img MB/s | backup os2.img MB/s | repo after os.img MiB | "
                 "after os2.img MiB | os2.img adds MiB | os2.img alone MiB | dedup saving | "
                 "restore os.img MB/s | restore os2.img MB/s | peak RSS backup / restore MiB | "
                 "sync after backup / restore s | verified |")
        L.append("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
        for t in tools:
            if not any(k[0] == "os+os2" and k[2] == t for k in S):
                continue
            g = lambda step, key: get("os+os2", step, t, key)
            rssb = max([x for x in (g("backup-1", "max_peak_rss_kib"), g("backup-2", "max_peak_rss_kib"))
                        if x is not None], default=None)
            rssr = max([x for x in (g("restore-1", "max_peak_rss_kib"), g("restore-2", "max_peak_rss_kib"))
                        if x is not None], default=None)
            ver = {g(s, "verified") for s in ("restore-1", "restore-2")} - {None, ""}
            L.append(f"| {t} | {g('backup-1', 'codec') or ''} | {f1(g('backup-1', 'mb_per_s'))} | "
                     f"{f1(g('backup-2', 'mb_per_s'))} | {mib(g('backup-1', 'median_repo_bytes'))} | "
                     f"{mib(g('backup-2', 'median_repo_bytes'))} | {mib(g('backup-2', 'median_added_bytes'))} | "
                     f"{mib(g('backup-alone', 'median_repo_bytes'))} | "
                     f"{'' if t not in sav else f'{100 * sav[t]:.1f} %'} | {f1(g('restore-1', 'mb_per_s'))} | "
                     f"{f1(g('restore-2', 'mb_per_s'))} | {mib(rssb and rssb * 1024)} / {mib(rssr and rssr * 1024)} | "
                     f"{f1(g('backup-2', 'median_sync_s'), 2)} / {f1(g('restore-2', 'median_sync_s'), 2)} | "
                     f"{'MISMATCH' if 'MISMATCH' in ver else ','.join(sorted(ver))} |")
        ov = read("overlap.json")
        if ov:
            try:
                o = json.loads(ov)
                parts = [f"{r['block_bytes'] >> 10} KiB: {r['found_pct']:.1f} %" for r in o["sizes"]]
                r4 = o["sizes"][0]
                L.append(f"\nUpper bound with fixed blocks (bench/datasets/block-overlap): share of os2.img's "
                         f"non-zero aligned blocks already in os.img: {', '.join(parts)}; at "
                         f"{r4['block_bytes'] >> 10} KiB os2.img has {mib(r4['new_distinct_bytes'])} MiB of "
                         "distinct new blocks (uncompressed).")
            except (ValueError, KeyError, IndexError):
                pass
        L.append("\nDedup saving = 1 − (what os2.img adds to the repository holding os.img) ÷ "
                 "(repository of os2.img alone), median over runs.\n")

    # 2. single inputs
    singles = [i for i in ("mem", "random") if any(k[0] == i and k[1] == "backup" for k in S)]
    if singles:
        L.append("## One file alone\n")
        L.append("| input | tool | codec | backup MB/s | repo MiB | repo ÷ input | restore MB/s | "
                 "peak RSS backup / restore MiB | sync after backup / restore s | verified |")
        L.append("|---|---|---|--:|--:|--:|--:|--:|--:|---|")
        for i in singles:
            for t in tools:
                if (i, "backup", t, "") not in S:
                    continue
                g = lambda step, key: get(i, step, t, key)
                rb, nb = g("backup", "median_repo_bytes"), g("backup", "input_bytes")
                rssb, rssr = g("backup", "max_peak_rss_kib"), g("restore", "max_peak_rss_kib")
                L.append(f"| {i} | {t} | {g('backup', 'codec')} | {f1(g('backup', 'mb_per_s'))} | {mib(rb)} | "
                         f"{f1(rb / nb, 3) if rb and nb else ''} | {f1(g('restore', 'mb_per_s'))} | "
                         f"{mib(rssb and rssb * 1024)} / {mib(rssr and rssr * 1024)} | "
                         f"{f1(g('backup', 'median_sync_s'), 2)} / {f1(g('restore', 'median_sync_s'), 2)} | "
                         f"{g('restore', 'verified') or ''} |")
        L.append("")

    lim = [s for s in summ if s["step"] == "copy"]
    if lim:
        L.append("## Physical limit: the input copied to the work filesystem\n")
        L.append("What no restore can beat: `cp` from the page cache to a file on the same filesystem "
                 "(and with the `sync` after it).\n")
        L.append("| input | size MiB | cp MB/s | cp + sync MB/s |")
        L.append("|---|--:|--:|--:|")
        for s in lim:
            tot = (s["median_s"] or 0) + (s["median_sync_s"] or 0)
            L.append(f"| {s['input']} | {mib(s['input_bytes'])} | {f1(s['mb_per_s'])} | "
                     f"{f1(s['input_bytes'] / 1e6 / tot) if tot else ''} |")
        L.append("")

    # 3. ratios and targets
    cases = [("os+os2", "backup-1", "restore-1", "os.img"), ("os+os2", "backup-2", "restore-2", "os2.img after os.img"),
             ("mem", "backup", "restore", "mem.core"), ("random", "backup", "restore", "random.bin")]
    lines = []
    for c, p, bt, rt in PAIRS:
        for inp, bstep, rstep, what in cases:
            cb, pb = get(inp, bstep, c, "median_s"), get(inp, bstep, p, "median_s")
            cr, pr = get(inp, rstep, c, "median_s"), get(inp, rstep, p, "median_s")
            if not ((cb and pb) or (cr and pr)):
                continue
            bs = pb / cb if cb and pb else None
            rs = pr / cr if cr and pr else None
            # Restore with the sync after it: the time until the restored
            # image is on disk, whether the tool syncs it (cairn does,
            # inside its time) or leaves it to the page cache.
            crs, prs = get(inp, rstep, c, "median_sync_s"), get(inp, rstep, p, "median_sync_s")
            rss = (pr + (prs or 0)) / (cr + (crs or 0)) if cr and pr else None
            lines.append(f"| {c} ÷ {p} | {what} | {f1(bs, 2)}{'' if bs is None else '×'} | "
                         f"{'≥ ' + str(bt) + '×: ' + ('yes' if bs >= bt else '**no**') if bt and bs else ''} | "
                         f"{f1(rs, 2)}{'' if rs is None else '×'} | "
                         f"{f1(rss, 2)}{'' if rss is None else '×'} | "
                         f"{'≥ ' + str(rt) + '×: ' + ('yes' if rss >= rt else '**no**') if rt and rss else ''} |")
    if lines:
        L.append("## cairn ÷ peer: speed (ratio of medians; > 1 means cairn is faster)\n")
        L.append("Restore is shown by the command's time and by its time plus the `sync` after it "
                 "(until the image is on disk): cairn fsyncs what it restored before it exits, restic, "
                 "borg and casync leave it in the page cache. The target is judged on the second.\n")
        L.append("| pair | input | backup | target | restore | restore + sync | target |")
        L.append("|---|---|--:|---|--:|--:|---|")
        L += lines + [""]
    size_lines = []
    for c in ("cairn-zstd3", "cairn-lz4"):
        peers = ["borg-zstd3", "restic"] if c == "cairn-zstd3" else ["borg-lz4"]
        for inp, step, what in (("os+os2", "backup-2", "os.img + os2.img"), ("os+os2", "backup-alone", "os2.img alone"),
                                ("mem", "backup", "mem.core"), ("random", "backup", "random.bin")):
            cs = get(inp, step, c, "median_repo_bytes")
            ps = {p: get(inp, step, p, "median_repo_bytes") for p in peers}
            ps = {p: v for p, v in ps.items() if v}
            if not cs or not ps:
                continue
            best = min(ps, key=ps.get)
            ratio = cs / ps[best]
            tgt = "≤ 1.0: " + ("yes" if ratio <= 1.0 else "**no**") if c == "cairn-zstd3" else "(no target)"
            size_lines.append(f"| {c} | {what} | {mib(cs)} | {best} {mib(ps[best])} | {ratio:.3f} | {tgt} |")
    if size_lines:
        L.append("## Repository size: cairn ÷ the smaller peer repository\n")
        L.append("| cairn | content | cairn MiB | smaller peer MiB | ratio | target |")
        L.append("|---|---|--:|---|--:|---|")
        L += size_lines
        L.append("\ncairn zstd:3 is held to the smaller of borg zstd,3 and restic; cairn lz4 is shown "
                 "against borg lz4 without a target.\n")
    dl = [f"| {t} | {100 * sav[t]:.1f} % | "
          f"{'≥ 30 %: ' + ('yes' if sav[t] >= DEDUP_TARGET else '**no**') if t.startswith('cairn') else ''} |"
          for t in tools if t in sav]
    if dl:
        L.append("## Dedup saving on the second image\n")
        L.append("| tool | saving | target |")
        L.append("|---|--:|---|")
        L += dl + [""]

    # 4. seed 000's table
    tg = [s for s in summ if s["step"] == "backup-targets"]
    if tg:
        codecs = []
        for s in tg:
            if s["codec"] not in codecs:
                codecs.append(s["codec"])
        counts = sorted({int(s["targets"]) for s in tg})
        L.append("## cairn backup of mem.core to several targets (seed 000's table), MB/s\n")
        L.append("Threads = targets. The targets are directories on one filesystem "
                 f"(`{machine.get('work_dir_fs', '?')}`), so this shows the pipeline's parallelism, not "
                 f"striping over disks; {machine.get('nproc', '?')} cores.\n")
        L.append("| codec | " + " | ".join(f"{n} target{'s' if n > 1 else ''}" for n in counts) + " | repo MiB |")
        L.append("|---|" + "--:|" * len(counts) + "--:|")
        for cd in codecs:
            cells = [f1(get("mem", "backup-targets", f"cairn-{cd.replace(':', '')}", "mb_per_s", str(n)))
                     for n in counts]
            rb = get("mem", "backup-targets", f"cairn-{cd.replace(':', '')}", "median_repo_bytes", str(counts[0]))
            L.append(f"| {cd} | " + " | ".join(cells) + f" | {mib(rb)} |")
        L.append("")
    if errors:
        L.append("## Problems\n")
        L += [f"- {e}" for e in errors] + [""]
    L.append("Raw data: results.csv (every measurement), summary.csv (medians), commands.txt, versions.txt, "
             "machine.txt, inputs.txt.\n")
    with open(os.path.join(run_dir, "report.md"), "w") as f:
        f.write("\n".join(L))
    return os.path.join(run_dir, "report.md")


# ---------------------------------------------------------------- facts

def machine_facts(data_dir, work_dir, cairn):
    facts = []

    def add(k, v):
        facts.append(f"{k}: {v}")

    add("date_utc", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    add("nproc", run_text(["nproc"]))
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
        with open("/proc/meminfo") as f:
            add("memtotal", f.readline().split(":", 1)[1].strip())
    except OSError:
        pass
    add("cpu_model", model)
    add("kernel", " ".join(platform.uname()))
    add("os", run_text(["sh", "-c", ". /etc/os-release && echo \"$PRETTY_NAME\""]))
    add("loadavg_start", open("/proc/loadavg").read().strip())
    add("data_dir", data_dir)
    add("data_dir_fs", " ".join(run_text(["findmnt", "-n", "-o", "FSTYPE,SOURCE,TARGET", "-T", data_dir]).split()))
    add("work_dir", work_dir)
    add("work_dir_fs", " ".join(run_text(["findmnt", "-n", "-o", "FSTYPE,SOURCE,TARGET", "-T", work_dir]).split()))
    add("page_cache", "warm: each input read just before each backup (borg drops what it reads); "
        "each repository read before each restore")
    add("cairn_binary", cairn)
    if os.path.exists(cairn):
        add("cairn_sha256", run_text(["sha256sum", cairn]).split()[0])
        add("cairn_mtime_utc", datetime.datetime.fromtimestamp(
            os.path.getmtime(cairn), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return facts


def tool_versions(cairn):
    out = []
    for argv in ([cairn, "--version"], ["borg", "--version"], ["restic", "version"], ["casync", "--version"],
                 ["du", "--version"], [GNU_TIME, "--version"], [sys.executable, "--version"]):
        text = run_text(argv).splitlines() if shutil.which(argv[0]) or os.path.exists(argv[0]) else \
            ["(not installed)"]
        out.append(f"$ {shlex.join(argv)}\n" + "\n".join(text[:2]))
    if os.access(cairn, os.X_OK):
        out.append(f"$ {cairn} backup --help\n" + run_text([cairn, "backup", "--help"]))
    pkgs = run_text(["dpkg-query", "-W", "-f", "${Package} ${Version}\n", "borgbackup", "restic", "casync",
                     "coreutils", "time"])
    out.append("$ dpkg-query -W (Debian packages)\n" + pkgs)
    return "\n\n".join(out) + "\n"


MISSING_HINT = {"borg": "apt-get install -y borgbackup", "restic": "apt-get install -y restic",
                "casync": "apt-get install -y casync"}


def check_tools(tools, cairn, explicit_casync):
    """(tools to run, problems that stop the run, notes)."""
    keep, stop, notes = [], [], []
    cairn_state = None
    for t in tools:
        if t.family == "cairn":
            if cairn_state is None:
                if not os.access(cairn, os.X_OK):
                    cairn_state = f"cairn: {cairn} not found (cargo build --release, or pass --cairn PATH)"
                elif subprocess.run([cairn, "backup", "--help"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL).returncode != 0:
                    cairn_state = f"cairn: {cairn} has no `backup` command yet (`{cairn} backup --help` fails)"
                else:
                    cairn_state = ""
            if cairn_state:
                stop.append(cairn_state)
                continue
        elif not shutil.which(t.family):
            msg = f"{t.family}: not installed ({MISSING_HINT[t.family]})"
            if t.family == "casync" and not explicit_casync:
                notes.append(msg + ", skipped (optional)")
                continue
            stop.append(msg)
            continue
        keep.append(t)
    return keep, sorted(set(stop)), notes


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", default="os,mem,random,targets",
                    help="comma list of: os (os.img then os2.img), mem, random, targets (cairn only)")
    ap.add_argument("--only", default=None,
                    help="comma list of tools or families: cairn, cairn-lz4, cairn-zstd3, borg, borg-lz4, "
                         "borg-zstd3, restic, casync (casync is skipped quietly if not installed, unless named)")
    ap.add_argument("--runs", type=int, help="counted runs of every measurement (default 3, 1 with --quick)")
    ap.add_argument("--warmup", type=int, default=0, help="warm-up rounds, not counted (default 0)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 64 MiB slices of the inputs, --runs 1; run dir <date>-backup-quick")
    ap.add_argument("--targets-codecs", default="none,lzo,snappy,lz4,zstd",
                    help="codecs of the targets table (cairn -c), default none,lzo,snappy,lz4,zstd")
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target", "release", "cairn"))
    ap.add_argument("--cairn-chunker", help="pass --chunker SPEC to cairn backup (default: cairn's default)")
    ap.add_argument("--data-dir", default=os.environ.get("CAIRN_BENCH_DATA", os.path.join(BENCH, "data")))
    ap.add_argument("--work-dir", default=os.environ.get("CAIRN_BENCH_WORK", os.path.join(BENCH, "work")),
                    help="repositories, restores and targets go here (default bench/work)")
    ap.add_argument("--out-dir", help="run directory (default bench/runs/<UTC date>-backup[-quick])")
    ap.add_argument("--idle-wait", type=int, default=600, metavar="S",
                    help="before each timed step, wait up to S seconds while other processes use more "
                         "than 25 %% of the cores (default 600; 0: never wait). The share is in busy_before")
    ap.add_argument("--no-limits", action="store_true",
                    help="skip the physical limit (cp of each input to the work filesystem, every round)")
    ap.add_argument("--dry-run", action="store_true", help="write the command lines only, run nothing")
    ap.add_argument("--report", metavar="RUN_DIR", help="only rewrite RUN_DIR/report.md from its results.csv")
    args = ap.parse_args()

    if args.report:
        log(f"wrote {write_report(args.report)}")
        return 0

    runs = args.runs or (1 if args.quick else 3)
    sets = [s for s in args.inputs.split(",") if s]
    for s in sets:
        if s not in INPUT_SETS:
            ap.error(f"unknown input {s!r} (known: {', '.join(INPUT_SETS)})")
    only = [s for s in (args.only or "cairn,borg,restic,casync").split(",") if s]
    all_tools = make_tools(args.cairn, args.cairn_chunker)
    known = {t.tid for t in all_tools} | {t.family for t in all_tools}
    for s in only:
        if s not in known:
            ap.error(f"unknown tool {s!r} (known: {', '.join(sorted(known))})")
    tools = [t for t in all_tools if t.tid in only or t.family in only]
    cairn_tool = next((t for t in all_tools if t.family == "cairn"), None)
    want_targets = "targets" in sets and any(t.family == "cairn" for t in tools)
    if "targets" in sets and not want_targets:
        log("targets: cairn only, and cairn is not selected; skipped")

    # What is missing is said, never installed.
    check = [t for t in tools if t.family != "cairn" or any(s != "targets" for s in sets)]
    if want_targets and not any(t.family == "cairn" for t in check):
        check.append(cairn_tool)
    keep, stop, notes = check_tools(check, args.cairn, explicit_casync=args.only is not None and "casync" in only)
    for n in notes:
        log(n)
    if stop and not args.dry_run:
        sys.exit("backup.py: cannot run, missing:\n  " + "\n  ".join(stop) +
                 "\n(this script installs nothing; install them, or leave the tool out with --only)")
    for s in stop:
        log(f"dry run: missing {s}")
    if not args.dry_run:
        tools = [t for t in tools if t in keep]
    if not os.access(GNU_TIME, os.X_OK):
        log(f"{GNU_TIME} not found (apt-get install -y time): no peak RSS")

    need = {"os": ["os", "os2"], "mem": ["mem"], "random": ["random"], "targets": ["mem"]}
    keys = sorted({k for s in sets for k in need[s]}, key=list(FILES).index)
    missing = [os.path.join(args.data_dir, FILES[k][0]) for k in keys
               if not os.path.exists(os.path.join(args.data_dir, FILES[k][0]))]
    if missing and not args.dry_run:
        sys.exit("backup.py: missing inputs: " + " ".join(missing) +
                 "\n  make them with bench/datasets/make-os-image (os.img), make-os-image --with-packages "
                 "\"python3 perl gcc\" (os2.img), make-memdump, make-random")

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    run_dir = args.out_dir
    if args.dry_run and not run_dir:
        run_dir = tempfile.mkdtemp(prefix="backup-dry-run-")
    if not run_dir:
        stem = os.path.join(BENCH, "runs", f"{date}-backup" + ("-quick" if args.quick else ""))
        run_dir, k = stem, 2
        while os.path.exists(run_dir):
            run_dir, k = f"{stem}-{k}", k + 1
    os.makedirs(run_dir, exist_ok=True)
    os.makedirs(args.work_dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="backup-", dir=args.work_dir)
    tdirs = [os.path.join(args.work_dir, "targets", f"t{i}") for i in range(max(TARGET_COUNTS))]
    log(f"run dir {run_dir}, scratch {scratch}")

    with open(os.path.join(run_dir, "machine.txt"), "w") as f:
        f.write("\n".join(machine_facts(args.data_dir, args.work_dir, args.cairn)) + "\n")
    with open(os.path.join(run_dir, "versions.txt"), "w") as f:
        f.write(tool_versions(args.cairn))
    with open(os.path.join(run_dir, "run.txt"), "w") as f:
        f.write(f"argv: {shlex.join(sys.argv)}\nruns: {runs}\nwarmup: {args.warmup}\nquick: {args.quick}\n"
                f"inputs: {','.join(sets)}\ntools: {','.join(t.tid for t in tools)}\nthreads: {THREADS}\n"
                f"targets_codecs: {args.targets_codecs}\ntarget_counts: {TARGET_COUNTS}\n"
                "order: every round runs each tool once per input, in turn (A B C A B C)\n"
                "repositories: fresh for every measurement, tool caches too\n"
                "page_cache: warm (each input read just before each backup; each repository read "
                "before each restore)\n"
                "mb: 10^6 bytes of input per second (backup and restore)\n"
                f"restic_password: RESTIC_PASSWORD={RESTIC_PASSWORD} (restic always encrypts)\n")

    errors = list(notes)
    bench = None
    t_start = time.time()
    try:
        # Inputs (64 MiB slices with --quick), read once so the cache is warm.
        inputs = {}
        for k in keys:
            src = os.path.join(args.data_dir, FILES[k][0])
            if args.quick and os.path.exists(src):
                dst = os.path.join(scratch, f"{k}.slice")
                with open(src, "rb") as fi, open(dst, "wb") as fo:
                    fo.write(fi.read(64 << 20))
                src = dst
            inputs[k] = os.path.abspath(src)
        sums = {}
        with open(os.path.join(run_dir, "inputs.txt"), "w") as f:
            for k, p in inputs.items():
                if not os.path.exists(p):
                    f.write(f"{k}: {p} (missing)\n")
                    continue
                if not args.dry_run:
                    sums[p] = sha256_file(p)  # also warms the page cache
                orig = os.path.join(args.data_dir, FILES[k][0])
                f.write(f"{k}: {orig} ({os.path.getsize(orig)} bytes; measured: {p}, {os.path.getsize(p)} "
                        f"bytes, sha256 {sums.get(p, '?')}): {FILES[k][1]}\n")
                man = orig + ".manifest"
                if os.path.exists(man):
                    f.write("".join("    " + line for line in open(man).readlines()[:9]))
        if "os" in sets and all(os.path.exists(inputs[k]) for k in ("os", "os2")):
            # The fixed-block upper bound on the second image's dedup, for the report.
            ov = subprocess.run([os.path.join(BENCH, "datasets", "block-overlap"), "--json",
                                 inputs["os"], inputs["os2"]], stdout=subprocess.PIPE, text=True)
            if ov.returncode == 0:
                with open(os.path.join(run_dir, "overlap.json"), "w") as f:
                    f.write(ov.stdout)

        bench = Bench(run_dir, scratch, args.dry_run, inputs, sums, args.idle_wait)
        codecs = [c for c in args.targets_codecs.split(",") if c]
        for r in range(args.warmup + runs):
            counted = r >= args.warmup
            run = r + 1
            for s in sets:
                if s == "targets":
                    if not want_targets:
                        continue
                    for n in TARGET_COUNTS:
                        for cd in codecs:
                            log(f"round {run}: targets={n} {cd} (load {load1()})")
                            try:
                                bench.targets(cairn_tool, cd, n, tdirs, run, counted)
                            except (RuntimeError, OSError) as e:
                                bench.errors.append(f"round {run}: targets={n} {cd}: {e}")
                                log(f"  failed: {e}")
                    continue
                if not args.no_limits:
                    for k in need[s]:
                        try:
                            bench.copy_limit(k, run, counted)
                        except (RuntimeError, OSError) as e:
                            bench.errors.append(f"round {run}: copy {k}: {e}")
                for t in tools:
                    log(f"round {run}: {s} {t.tid} (load {load1()})")
                    try:
                        if s == "os":
                            bench.os_sequence(t, run, counted)
                        else:
                            bench.single(s, t, run, counted)
                    except (RuntimeError, OSError) as e:
                        bench.errors.append(f"round {run}: {s} {t.tid}: {e}")
                        log(f"  failed: {e}")
                    write_csv(run_dir, bench.rows)  # keep what is done if a later step fails
    finally:
        if bench is not None:
            write_csv(run_dir, bench.rows)
            errors += bench.errors + [f"RESTORE MISMATCH: {m}" for m in bench.failures]
        with open(os.path.join(run_dir, "errors.txt"), "w") as f:
            f.write("".join(e + "\n" for e in errors))
        with open(os.path.join(run_dir, "machine.txt"), "a") as f:
            f.write(f"loadavg_end: {open('/proc/loadavg').read().strip()}\n"
                    f"elapsed_s: {time.time() - t_start:.0f}\n")
        shutil.rmtree(scratch, ignore_errors=True)
        for t in tdirs:
            shutil.rmtree(t, ignore_errors=True)
    if args.dry_run:
        sys.stdout.write(open(os.path.join(run_dir, "commands.txt")).read())
        log(f"dry run: command lines above and in {run_dir}/commands.txt")
        return 0
    report = write_report(run_dir)
    log(f"done: {run_dir}/results.csv ({len(bench.rows)} rows, {len(errors)} problems"
        + (", see errors.txt)" if errors else ")") + f"; {report}")
    if bench.failures:
        log("!!! FAILED: restored data differed from the input in " + str(len(bench.failures)) +
            " measurement(s); see errors.txt and report.md")
        return 1
    return 0


def write_csv(run_dir, rows):
    path = os.path.join(run_dir, "results.csv")
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS})
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
