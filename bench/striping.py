#!/usr/bin/env python3
"""striping.py: cairn backup striped over 1, 2, 4 and 8 slow disks.

What: N loop devices (files on the work filesystem, `losetup
--direct-io=on`), each with ext4, each limited to --mbps MB/s of writes
by the cgroup v1 blkio throttle (`blkio.throttle.write_bps_device`; the
backup runs inside that cgroup, and cairn writes its packs with O_DIRECT,
so the limit holds exactly). For each input, codec and device count, a
fresh repository with one target directory per device (`cairn init
--target D1 --target D2 ...`) takes `cairn backup -T 2` of the input;
time = wall time of the backup, which fsyncs its packs. The repository's
metadata sits on the work filesystem (not throttled). With
--lvm, the same devices are also joined by LVM striping (`lvcreate -i N`,
64 KiB stripes) into one ext4 that holds a one-target repository: the
kernel stripes instead of cairn.

Inputs: random (--random-mib MiB of bench/data/random.bin: disk-bound,
the bytes stored are the bytes read) and os2.img (compressible: the
cores become the limit as disks are added). Codecs: lz4, zstd:1,
zstd:3. Medians of --runs rounds, device counts in turn within a round.

Why: issue 20 ("striping that scales, shown"), seed 000's table: one
compressing writer per disk, throughput scaling with the disks. Target:
at least 1.8x from 1 to 2 devices and 3.2x from 1 to 4.

Needs: root (losetup, mount, cgroup v1 blkio), mkfs.ext4, a release
build of cairn, matplotlib for the plot; lvm2 for --lvm.

Usage: bench/striping.py [--cairn PATH] [--devices 1,2,4,8] [--mbps 50]
                         [--runs 3] [--random-mib 512] [--lvm]
Output: bench/runs/<UTC date>-striping[-K]/ (results.csv, summary.csv,
report.md, commands.txt, versions.txt, striping.png).
"""
import argparse
import csv
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plotting import new_run_dir, plt, save  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CGROUP = "/sys/fs/cgroup/blkio/cairn-striping"
LVM_CONFIG = ("activation { udev_sync = 0 udev_rules = 0 } "
              "devices { obtain_device_list_from_udev = 0 }")
CODECS = ["lz4", "zstd:1", "zstd:3"]


def log(msg):
    print(f"[{datetime.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


os.environ["LVM_SUPPRESS_FD_WARNINGS"] = "1"


class Disks:
    """N throttled loop devices with ext4, mounted under WORK/mnt/dI."""

    def __init__(self, work, n, size_gib, mbps):
        self.work, self.n, self.mbps = work, n, mbps
        self.files = [os.path.join(work, f"disk{i}.img") for i in range(n)]
        self.mounts = [os.path.join(work, "mnt", f"d{i}") for i in range(n)]
        self.loops = []
        for f in self.files:
            with open(f, "wb") as h:
                h.truncate(size_gib << 30)
            self.loops.append(sh(["losetup", "--find", "--show", "--direct-io=on", f]).strip())
        os.makedirs(CGROUP, exist_ok=True)
        rules = []
        for dev in self.loops:
            st = os.stat(dev)
            rules.append(f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)} {mbps * 10**6}")
        for r in rules:
            with open(os.path.join(CGROUP, "blkio.throttle.write_bps_device"), "w") as h:
                h.write(r)
        self.rules = rules

    def make_filesystems(self):
        for dev, m in zip(self.loops, self.mounts):
            sh(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev])
            os.makedirs(m, exist_ok=True)
            sh(["mount", "-o", "noatime", dev, m])

    def unmount(self):
        for m in self.mounts:
            subprocess.run(["umount", m], capture_output=True)

    def close(self):
        self.unmount()
        for dev in self.loops:
            subprocess.run(["losetup", "-d", dev], capture_output=True)
        for f in self.files:
            if os.path.exists(f):
                os.remove(f)
        # Remove the throttle rules, then the group.
        for r in getattr(self, "rules", []):
            try:
                with open(os.path.join(CGROUP, "blkio.throttle.write_bps_device"), "w") as h:
                    h.write(r.split()[0] + " 0")
            except OSError:
                pass
        try:
            os.rmdir(CGROUP)
        except OSError:
            pass


def throttled(cmd):
    """cmd run inside the throttled blkio cgroup."""
    return ["sh", "-c", f'echo $$ > {CGROUP}/cgroup.procs && exec "$@"', "sh"] + cmd


def backup(cairn, repo, targets, image, codec, env, commands):
    """Init a fresh repository over `targets`, back `image` up into it;
    the backup's wall seconds."""
    for t in targets + [repo]:
        shutil.rmtree(t, ignore_errors=True)
    init = [cairn, "init", repo, "--encryption", "none"] + sum((["--target", t] for t in targets), [])
    sh(init, env=env)
    cmd = [cairn, "backup", image, "--repo", repo, "--name", "img", "-c", codec, "-T", "2", "-q"]
    commands.append(" ".join(init) + " && " + " ".join(throttled(cmd)))
    subprocess.run(["sync"], check=True)
    t = time.monotonic()
    sh(throttled(cmd), env=env)
    return time.monotonic() - t


def lvm_volume(disks, n, mount):
    """An LVM striped volume over the first n loop devices, with ext4,
    mounted at `mount`; returns a function that removes it."""
    cfg = ["--config", LVM_CONFIG]
    vg = f"cairnstripe{n}"
    pvs = disks.loops[:n]
    sh(["pvcreate", "-ff", "-y", "-q"] + cfg + pvs)
    sh(["vgcreate", "-q"] + cfg + [vg] + pvs)
    stripes = ["-i", str(n), "-I", "64k"] if n > 1 else []
    sh(["lvcreate", "-q", "-y", "-Zn", "-l", "100%FREE", "-n", "lv"] + stripes + cfg + [vg])
    dev = f"/dev/mapper/{vg}-lv"
    if not os.path.exists(dev):
        dev = f"/dev/{vg}/lv"
    sh(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev])
    os.makedirs(mount, exist_ok=True)
    sh(["mount", "-o", "noatime", dev, mount])

    def remove():
        subprocess.run(["umount", mount], capture_output=True)
        subprocess.run(["vgremove", "-f", "-y", "-q"] + cfg + [vg], capture_output=True)
        subprocess.run(["pvremove", "-ff", "-y", "-q"] + cfg + pvs, capture_output=True)
    return remove


def summarize(rows):
    groups = {}
    for r in rows:
        groups.setdefault((r["layout"], r["input"], r["codec"], r["devices"]), []).append(r["mbps"])
    return {k: statistics.median(v) for k, v in groups.items()}


def plot(out, summary, counts, mbps):
    inputs = sorted({k[1] for k in summary})
    fig, axes = plt.subplots(1, len(inputs), figsize=(6 * len(inputs), 4.5), squeeze=False)
    for ax, inp in zip(axes[0], inputs):
        for layout, style in (("cairn", "-o"), ("lvm", "--s")):
            for codec in CODECS:
                ys = [summary.get((layout, inp, codec, n)) for n in counts]
                if all(y is None for y in ys):
                    continue
                ax.plot(counts, ys, style, label=f"{layout} {codec}")
        ax.plot(counts, [n * mbps for n in counts], ":", color="grey", label=f"disks' sum ({mbps} MB/s each)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts)
        ax.set_xticklabels([str(n) for n in counts])
        ax.set_xlabel("devices")
        ax.set_ylabel("backup MB/s of input")
        ax.set_title(f"{inp}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    lvm = any(k[0] == "lvm" for k in summary)
    fig.suptitle("cairn backup striped over throttled loop devices" + (", against LVM striping" if lvm else ""))
    save(fig, out, "striping.png")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target/release/cairn"))
    ap.add_argument("--devices", default="1,2,4,8")
    ap.add_argument("--mbps", type=int, default=50)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--random-mib", type=int, default=512)
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--lvm", action="store_true")
    ap.add_argument("--work", default=os.path.join(ROOT, "bench/work/striping"))
    a = ap.parse_args()
    counts = [int(x) for x in a.devices.split(",")]
    codecs = a.codecs.split(",")
    out = new_run_dir(ROOT, "striping")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    random_in = os.path.join(a.work, "random.bin")
    with open(os.path.join(ROOT, "bench/data/random.bin"), "rb") as src, open(random_in, "wb") as dst:
        dst.write(src.read(a.random_mib << 20))
    inputs = {"random": random_in, "os2.img": os.path.join(ROOT, "bench/data/os2.img")}
    for p in inputs.values():  # into the page cache: the input is not what is measured
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass
    env = dict(os.environ, CAIRN_CACHE_DIR=os.path.join(a.work, "cache"))
    commands, rows, problems = [], [], []
    size_gib = max(2, (a.random_mib >> 10) + 2)
    disks = Disks(a.work, max(counts), size_gib, a.mbps)
    repo = os.path.join(a.work, "repo")
    try:
        disks.make_filesystems()
        for rnd in range(a.runs):
            for inp, path in inputs.items():
                for codec in codecs:
                    for n in counts:
                        targets = [os.path.join(m, "t") for m in disks.mounts[:n]]
                        secs = backup(a.cairn, repo, targets, path, codec, env, commands)
                        mbps = os.path.getsize(path) / secs / 1e6
                        rows.append({"round": rnd, "layout": "cairn", "input": inp, "codec": codec,
                                     "devices": n, "seconds": round(secs, 3), "mbps": round(mbps, 1)})
                        log(f"round {rnd} cairn {inp} {codec} x{n}: {secs:.2f} s, {mbps:.0f} MB/s")
        # The restore reads back what the last backup wrote, across all devices.
        check = os.path.join(a.work, "check.img")
        sh([a.cairn, "restore", "img", check, "--repo", repo, "-q"], env=env)
        if subprocess.run(["cmp", "-s", check, inputs["os2.img"]]).returncode != 0:
            problems.append("restore of the striped os2.img differs")
        os.remove(check)
        if a.lvm:
            disks.unmount()
            lvm_mount = os.path.join(a.work, "mnt", "lvm")
            try:
                for rnd in range(a.runs):
                    for n in counts:
                        remove = lvm_volume(disks, n, lvm_mount)
                        try:
                            for inp, path in inputs.items():
                                for codec in codecs:
                                    secs = backup(a.cairn, repo, [os.path.join(lvm_mount, "t")], path, codec,
                                                  env, commands)
                                    mbps = os.path.getsize(path) / secs / 1e6
                                    rows.append({"round": rnd, "layout": "lvm", "input": inp, "codec": codec,
                                                 "devices": n, "seconds": round(secs, 3),
                                                 "mbps": round(mbps, 1)})
                                    log(f"round {rnd} lvm {inp} {codec} x{n}: {secs:.2f} s, {mbps:.0f} MB/s")
                        finally:
                            remove()
            except (subprocess.CalledProcessError, OSError) as e:
                said = [ln.strip() for ln in (getattr(e, "stderr", "") or str(e)).splitlines()
                        if ln.strip() and "leaked on" not in ln]
                why = next((ln for ln in said if "device-mapper" in ln), said[0] if said else str(e))
                problems.append(f"LVM could not run here: {why}")
                log(problems[-1])
    finally:
        shutil.rmtree(repo, ignore_errors=True)
        disks.close()

    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    summary = summarize(rows)
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["layout", "input", "codec", "devices", "median_mbps"])
        for key in sorted(summary):
            w.writerow(list(key) + [summary[key]])
    with open(os.path.join(out, "commands.txt"), "w") as f:
        f.write("\n".join(commands) + "\n")
    with open(os.path.join(out, "versions.txt"), "w") as f:
        f.write(sh([a.cairn, "--version"]).strip() + "\n")
        f.write(subprocess.run(["mkfs.ext4", "-V"], capture_output=True, text=True).stderr.strip() + "\n")
        f.write(f"{platform.platform()}, {os.cpu_count()} cores\n")
    plot(out, summary, counts, a.mbps)

    lines = [f"# cairn backup striped over throttled devices ({os.path.basename(out)})", "",
             f"{max(counts)} loop devices (`losetup --direct-io=on`, files on the work filesystem), ext4 each, "
             f"each limited to {a.mbps} MB/s of writes by the cgroup v1 blkio throttle; `cairn backup -T 2` "
             f"(2 cores) of each input into a fresh unencrypted repository with one target per device. "
             f"Medians of {a.runs} rounds. MB/s = 10⁶ bytes of input per second. Inputs: random "
             f"({a.random_mib} MiB of random.bin) and os2.img (576 MiB, compressible).", ""]
    for layout in ("cairn", "lvm"):
        if not any(k[0] == layout for k in summary):
            continue
        lines += [f"## {'cairn: one target per device' if layout == 'cairn' else 'LVM striping (lvcreate -i N -I 64k), one target'}",
                  "", "| input | codec | " + " | ".join(f"{n} dev" for n in counts) + " | "
                  + " | ".join(f"{n}÷1" for n in counts[1:]) + " |",
                  "|---|---|" + "--:|" * (2 * len(counts) - 1)]
        for inp in inputs:
            for codec in codecs:
                v = [summary.get((layout, inp, codec, n)) for n in counts]
                if v[0] is None:
                    continue
                lines.append(f"| {inp} | {codec} | " + " | ".join(f"{x:.0f}" for x in v) + " | "
                             + " | ".join(f"{x / v[0]:.2f}x" for x in v[1:]) + " |")
        lines.append("")
    lines += ["![MB/s against devices](striping.png)", "",
              "Problems: " + ("; ".join(problems) if problems else "none (the striped os2.img restored equal)"),
              "", f"Command: `bench/striping.py {' '.join(sys.argv[1:])}`", ""]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("striping.py: needs root (losetup, mount, cgroup v1 blkio)")
    main()
