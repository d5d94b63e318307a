#!/usr/bin/env python3
"""profile-threads.py: cairn restore of os.img and os2.img from a SeaweedFS bucket and from a local
directory repository holding the same two backups, at -T 1, 2, 4, 8: time, cairn CPU, SeaweedFS CPU,
S3 requests and bytes (run from the work tree: python3 bench/runs/2026-11-25-s3-2/profile-threads.py;
CAIRN=path/to/cairn). Output in profile.md."""
import sys, os, time, subprocess, json, shutil
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
import s3, backup as B
CAIRN=os.environ.get('CAIRN', '/tmp/cairn-s3bench')
D=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'work', 'exp'); shutil.rmtree(D, ignore_errors=True); os.makedirs(D)
w=s3.Weed('/opt/cairn-venv/bin/weed', D+'/weed'); w.start()
env=dict(os.environ, AWS_ENDPOINT_URL=w.endpoint(), **s3.s3_env(), CAIRN_CACHE_DIR=D+'/cache')
data=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'data')
url='s3://cairn-bench/exp'
local=D+'/localrepo'
def run(argv, out=None):
    t=time.perf_counter(); c0=w.cpu_s(); m0=w.metrics()
    p=subprocess.run(['/usr/bin/time','-f','%U %S %M']+argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dt=time.perf_counter()-t
    md=s3.metrics_delta(m0, w.metrics())
    u,sy,m=p.stderr.strip().splitlines()[-1].split()
    return dt, float(u)+float(sy), w.cpu_s()-c0, md, p.stdout, p.stderr
for repo in (url, local):
    subprocess.run([CAIRN,'init',repo], env=env, check=True, capture_output=True)
    for f in ('os.img','os2.img'):
        dt,cpu,wc,md,out,err=run([CAIRN,'backup',f'{data}/{f}','--repo',repo,'--name','os','-c','zstd:3','-T','2','--json'])
        print(repo, 'backup', f, f'{dt:.2f}s cpu {cpu:.2f} weed {wc:.2f}', md.get('s3_requests',''), flush=True)


try:
    for T in (2, 1, 4, 8, 2):
        for repo in (url, local):
            for snap, f in ((1,'os.img'),(2,'os2.img')):
                out=D+'/out'
                if os.path.exists(out): os.remove(out)
                B.warm_tree([D+'/weed/data', local])
                dt,cpu,wc,md,o,e=run([CAIRN,'restore',f'os@{snap}',out,'--repo',repo,'-T',str(T),'--json'])
                j=B.json_objects(o)
                print(f"T={T} {'s3' if repo==url else 'local'} {f}: {dt:.2f}s {os.path.getsize(f'{data}/{f}')/1e6/dt:.0f} MB/s cpu {cpu:.2f} weed {wc:.2f} out {md.get('s3_out_bytes','')} {md.get('s3_requests','')} | {j[-1] if j else o[-300:]}", flush=True)
finally:
    w.stop()
