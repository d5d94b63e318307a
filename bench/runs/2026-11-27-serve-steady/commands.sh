#!/bin/bash
# 30 s steady-state 4k random r/w at depth 16 on a served 604 MB file: cairn serve --file vs nbdkit file
S=/tmp/ss/sock
for rw in randwrite randread; do for srv in cairn nbdkit; do
  rm -f $S
  if [ $srv = cairn ]; then /tmp/cairn-rc serve --file os=/tmp/ss/f.raw --socket $S 2>/dev/null & else nbdkit -f -U $S -e os file /tmp/ss/f.raw & fi
  pid=$!; for i in $(seq 50); do [ -S $S ] && break; sleep 0.1; done
  fio --name=b --ioengine=nbd --uri="nbd+unix:///os?socket=$S" --rw=$rw --bs=4k --iodepth=16 --size=603979776 --time_based --runtime=30 --output-format=json --randseed=42 > /tmp/ss/$rw-$srv.json 2>/dev/null
  kill $pid; wait $pid 2>/dev/null
  python3 - $rw $srv <<'P'
import json,sys
rw,srv=sys.argv[1:]
j=json.load(open(f"/tmp/ss/{rw}-{srv}.json"))["jobs"][0]["write" if rw=="randwrite" else "read"]
p=j["clat_ns"]["percentile"]
print(f"{rw} {srv}: {j['iops']:.0f} IOPS, clat p50 {p['50.000000']/1e3:.0f} us, p99 {p['99.000000']/1e3:.0f} us, p99.9 {p['99.900000']/1e3:.0f} us, max {j['clat_ns']['max']/1e3:.0f} us")
P
done; done
