#!/bin/bash
# usage: nbdbench2.sh LABEL SERVER-COMMAND... ; serves /dev/shm/nb/img.raw on /tmp/nb2.sock
L=$1; shift; S=/tmp/nb2.sock; rm -f $S
"$@" >/dev/null 2>&1 &
P=$!; sleep 1.5
for rw in randread randwrite; do
fio --name=t --ioengine=nbd --uri="nbd+unix:///img.raw?socket=$S" --rw=$rw --bs=4k --iodepth=16 --runtime=20 --ramp_time=3 --time_based --size=1G --output-format=json --output=/tmp/fio2-$L-$rw.json >/dev/null 2>&1
python3 -c "
import json;j=json.load(open('/tmp/fio2-$L-$rw.json'))['jobs'][0];k='read' if 'read' in '$rw' else 'write';d=j[k];p=d['clat_ns']['percentile']
print('%-8s %-9s iops %6.0f  p50 %5.0f us  p99 %6.0f us  p99.9 %6.0f us  max %7.0f us'%('$L','$rw',d['iops'],p['50.000000']/1e3,p['99.000000']/1e3,p['99.900000']/1e3,d['clat_ns']['max']/1e3))"
done
kill $P; wait $P 2>/dev/null
