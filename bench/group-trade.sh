#!/bin/bash
# group-trade.sh: how the compression group size trades repository size
# for random 4 KiB reads of a served image, against qemu-nbd on a
# compressed qcow2 (issue 20, "random access without giving back the
# ratio": the measurement a layout decision starts from).
#
# What: IMAGE (default bench/data/os2.img) backed up into a fresh
# encrypted repository per --group (2M, the default, down to 0: one record
# per chunk), served by `cairn serve --image-cache 64M` (smaller than the
# image, so reads leave the cache) and read by fio's nbd engine,
# randread 4 KiB, iodepth 16, 10 s after a 10 s warm-up pass; the same
# for `qemu-nbd -t -r` on `qemu-img convert -c -O qcow2` of the image.
# Repository size: du -sb. One run; output on stdout and in OUT/report.txt.
#
# Usage: bench/group-trade.sh [CAIRN] [IMAGE] [OUT]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
C=${1:-$ROOT/target/release/cairn}
IMG=${2:-$ROOT/bench/data/os2.img}
OUT=${3:-$ROOT/bench/runs/$(date -u +%F)-group-trade}
W=$(mktemp -d "$ROOT/bench/work/group-trade.XXXXXX")
trap 'pkill -f "qemu-nbd.*$W" || true; rm -rf "$W"' EXIT
mkdir -p "$OUT"
export CAIRN_PASSWORD=cairn-bench CAIRN_CACHE_DIR=$W/cache
fio_run() {
  fio --name=b --ioengine=nbd --uri="nbd+unix:///$2?socket=$1" --rw=randread --bs=4k \
    --iodepth=16 --time_based --runtime=10 --output-format=json 2>/dev/null |
    python3 -c '
import json, sys
s = sys.stdin.read()
j = json.loads(s[s.index("{"):])["jobs"][0]["read"]
p = j["clat_ns"]["percentile"]
print("%.0f IOPS, p50 %.0f us, p99 %.0f us, max %.0f us"
      % (j["iops"], p["50.000000"] / 1e3, p["99.000000"] / 1e3, j["clat_ns"]["max"] / 1e3))'
}
{
  echo "image $IMG ($(($(stat -c %s "$IMG") / 1048576)) MiB); $("$C" --version); $(qemu-nbd --version | head -1)"
  for g in 2M 512K 128K 64K 0; do
    "$C" init "$W/r$g" --encryption none >/dev/null 2>&1
    "$C" backup "$IMG" --repo "$W/r$g" --name img --group "$g" -T 2 -q
    sz=$(du -sb "$W/r$g" | cut -f1)
    "$C" serve --repo "$W/r$g" --socket "$W/s$g.sock" --image-cache 64M >/dev/null 2>&1 &
    P=$!
    while [ ! -S "$W/s$g.sock" ]; do sleep 0.1; done
    fio_run "$W/s$g.sock" img >/dev/null
    r=$(fio_run "$W/s$g.sock" img)
    kill $P; wait $P 2>/dev/null || true
    echo "cairn --group $g: repository $((sz / 1048576)) MiB; $r"
  done
  qemu-img convert -c -O qcow2 "$IMG" "$W/img.qcow2c"
  qemu-nbd -t -r -f qcow2 -k "$W/q.sock" -x img "$W/img.qcow2c" &
  P=$!
  while [ ! -S "$W/q.sock" ]; do sleep 0.1; done
  fio_run "$W/q.sock" img >/dev/null
  r=$(fio_run "$W/q.sock" img)
  kill $P; wait $P 2>/dev/null || true
  echo "qemu-nbd qcow2 -c: file $(($(stat -c %s "$W/img.qcow2c") / 1048576)) MiB; $r"
} | tee "$OUT/report.txt"
