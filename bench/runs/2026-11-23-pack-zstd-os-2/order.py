import subprocess, time, statistics, sys
cmds = dict(old="/tmp/cairn-bench unpack -q -T 2 -c < {f} > /dev/null",
            new="/tmp/cairn-new unpack -q -T 2 -c < {f} > /dev/null",
            zstd="zstd -q -d -c < {p} > /dev/null")
order = sys.argv[2].split(",")
for lvl in ("1",):
    f, p = f"/tmp/os{lvl}.zst", f"/tmp/os{lvl}p.zst"
    t = {k: [] for k in order}
    for r in range(int(sys.argv[1])):
        for k in order:
            s = time.perf_counter(); subprocess.run(cmds[k].format(f=f, p=p), shell=True, check=True); t[k].append(time.perf_counter() - s)
    m = {k: statistics.median(v) * 1000 for k, v in t.items()}
    print(order, ", ".join(f"{k} {v:.1f} ms" for k, v in m.items()))
