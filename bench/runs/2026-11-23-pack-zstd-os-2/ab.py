import subprocess, time, statistics, sys
cmds = dict(old="/tmp/cairn-bench unpack -q -T 2 -c < {f} > /dev/null",
            new="/tmp/cairn-new unpack -q -T 2 -c < {f} > /dev/null",
            zstd="zstd -q -d -c < {p} > /dev/null")
for lvl in ("1", "3"):
    f, p = f"/tmp/os{lvl}.zst", f"/tmp/os{lvl}p.zst"
    t = {k: [] for k in cmds}
    for r in range(int(sys.argv[1])):
        for k, c in cmds.items():
            s = time.perf_counter(); subprocess.run(c.format(f=f, p=p), shell=True, check=True); t[k].append(time.perf_counter() - s)
    m = {k: statistics.median(v) * 1000 for k, v in t.items()}
    print(f"-{lvl}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in m.items()), f"| zstd/old {m['zstd']/m['old']:.2f}x zstd/new {m['zstd']/m['new']:.2f}x")
