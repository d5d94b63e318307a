#!/usr/bin/env python3
"""profile-io.py: what SeaweedFS reads and writes (rchar/wchar of /proc/PID/io) to serve cairn's and
restic's backups and restores of os.img then os2.img, and how it stores a pack (chunks, from the
filer's JSON listing). CAIRN=path/to/cairn. Output in profile.md."""
import sys, os, time, subprocess, shutil
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
import s3, backup as B
CAIRN=os.environ.get('CAIRN', '/tmp/cairn-s3bench')
D=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'work', 'exp'); shutil.rmtree(D, ignore_errors=True); os.makedirs(D)
w=s3.Weed('/opt/cairn-venv/bin/weed', D+'/weed'); w.start()
def io():
    d={}
    for l in open(f'/proc/{w.proc.pid}/io'):
        k,v=l.split(':'); d[k]=int(v)
    return d
def run(argv, env):
    i0=io(); m0=w.metrics(); c0=w.cpu_s(); t=time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    dt=time.perf_counter()-t; i1=io()
    md=s3.metrics_delta(m0,w.metrics())
    print(f"{argv[0]} {argv[1]} {argv[2] if len(argv)>2 else ''}: {dt:.2f}s weed cpu {w.cpu_s()-c0:.2f} weed rchar {(i1['rchar']-i0['rchar'])/1e6:.0f} MB wchar {(i1['wchar']-i0['wchar'])/1e6:.0f} MB; s3 out {int(md['s3_out_bytes'])/1e6:.0f} MB in {int(md['s3_in_bytes'])/1e6:.0f} MB {md['s3_requests']}", flush=True)
try:
    env=dict(os.environ, AWS_ENDPOINT_URL=w.endpoint(), **s3.s3_env(), CAIRN_CACHE_DIR=D+'/cache')
    data=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'data'); url='s3://cairn-bench/exp'
    subprocess.run([CAIRN,'init',url], env=env, check=True, capture_output=True)
    for f in ('os.img','os2.img'):
        run([CAIRN,'backup',f'{data}/{f}','--repo',url,'--name','os','-T','2'], env)
    renv=dict(os.environ, **s3.s3_env(), RESTIC_PASSWORD='x', RESTIC_CACHE_DIR=D+'/rcache', GOMAXPROCS='2')
    rrepo=f's3:{w.endpoint()}/cairn-bench/rexp'
    subprocess.run(['restic','-r',rrepo,'init','--repository-version','2'], env=renv, check=True, capture_output=True)
    for f in ('os.img','os2.img'):
        run(['restic','-r',rrepo,'backup',f'{data}/{f}'], renv)
    B.warm_tree([D+'/weed/data'])
    run([CAIRN,'restore','os@2',D+'/out','--repo',url,'-T','2'], env)
    os.remove(D+'/out')
    run([CAIRN,'restore','os@1',D+'/out','--repo',url,'-T','2'], env)
    run(['restic','-r',rrepo,'restore','latest','--target',D+'/rout'], renv)
    # object and chunk layout in the filer: one cairn pack, one restic pack
    import json, http.client
    def ls(path):
        c=http.client.HTTPConnection('127.0.0.1', w.ports['filer']); c.request('GET', path+'?limit=1000', headers={'Accept':'application/json'}); r=c.getresponse(); return json.loads(r.read())
    for p in ('/buckets/cairn-bench/exp/data/packs/', '/buckets/cairn-bench/rexp/data/'):
        top=ls(p)
        e=top['Entries'][0]
        sub=ls(e['FullPath']+'/')
        for f in sub['Entries'][:2]:
            ch=f.get('chunks') or []
            print(f['FullPath'], f.get('FileSize'), 'chunks', len(ch), [c.get('size') for c in ch][:10])
finally:
    w.stop(); shutil.rmtree(D, ignore_errors=True)
