#!/bin/bash
# Paired A/B used in docs/benchmarks.md (2026-12-01-nbd-hardening): 6 pairs, base then new,
# a fresh `cairn serve --file` on a unix socket each, fio nbd 4 KiB depth 16 for 10 s.
# /tmp/cairn-base = 8e9a19d (before the NBD changes), /tmp/cairn-new = ce1f9a4.
# paired A/B: fio randwrite 4k depth 16 over cairn serve --file (unix socket)
rw=${1:-randwrite}
for i in 1 2 3 4 5 6; do
  for b in base new; do
    sock=/tmp/ab/s.sock; rm -f $sock
    /tmp/cairn-$b serve --file os=/tmp/ab/disk.img --socket $sock 2>/tmp/ab/$b.err &
    pid=$!
    for t in $(seq 50); do [ -S $sock ] && break; sleep 0.1; done
    v=$(fio --name=b --ioengine=nbd --uri="nbd+unix:///os?socket=$sock" --rw=$rw --bs=4k --iodepth=16 --size=400000000 --time_based --runtime=10 --output-format=json 2>/dev/null | python3 -c "import json,sys; s=sys.stdin.read(); j=json.loads(s[s.index(chr(123)):])['jobs'][0]; k='write' if 'write' in '$rw' else 'read'; print(round(j[k]['iops']))")
    kill $pid; wait $pid 2>/dev/null
    echo "$i $b $v"
  done
done
