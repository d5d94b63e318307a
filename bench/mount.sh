#!/bin/bash
# mount.sh: reading a snapshot through `cairn mount` against `cairn
# restore` of the same snapshot, in turn, for N rounds.
#
# usage: bench/mount.sh [-c CAIRN] [-r ROUNDS] IMAGE
#   -c CAIRN   the cairn binary (default target/release/cairn)
#   -r ROUNDS  rounds (default 5)
#   IMAGE      the file to back up once and read back each round
#
# Per round: restore to /dev/null, restore to a file on /dev/shm, then a
# fresh mount read by `cat DIR/img/latest > /dev/null` and another read by
# `dd bs=1M`; the repository's files are read just before each step (page
# cache warm), and each mount is new (no page cache of the mounted file).
# MB/s = 10^6 bytes of the image per second of wall time. The repository
# and mount point live under $TMPDIR-like WORK (default bench/work/mount)
# on the disk of bench/work; needs root or fusermount, and /dev/fuse.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cairn=$here/../target/release/cairn
rounds=5
while getopts "c:r:" opt; do
    case $opt in
        c) cairn=$OPTARG ;;
        r) rounds=$OPTARG ;;
        *) sed -n 2,16p "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || { sed -n 2,16p "$0"; exit 2; }
image=$1
work=${CAIRN_BENCH_WORK:-$here/work}/mount
rm -rf "$work" && mkdir -p "$work/mnt"
repo=$work/repo mnt=$work/mnt
size=$(stat -c %s "$image")
unmount() { fusermount3 -u "$mnt" 2>/dev/null || fusermount -u "$mnt"; }
trap 'unmount 2>/dev/null || true; rm -rf "$work" /dev/shm/cairn-mount-bench.out' EXIT
"$cairn" init "$repo" --encryption none >/dev/null 2>&1
"$cairn" backup "$image" --repo "$repo" --name img -q
warm() { find "$repo" -type f -exec cat {} + >/dev/null; }
timed() {
    local what=$1 s e
    shift
    warm
    s=$(date +%s.%N)
    "$@"
    e=$(date +%s.%N)
    python3 -c "print(f'{\"$what\":<28} {$size/($e-$s)/1e6:8.1f} MB/s {$e-$s:7.3f} s')"
}
mounted() {
    "$cairn" mount --repo "$repo" "$mnt" 2>/dev/null &
    pid=$!
    while ! grep -q " $mnt " /proc/self/mountinfo; do sleep 0.05; done
    timed "$@"
    unmount
    wait "$pid"
}
uptime
for r in $(seq 1 "$rounds"); do
    echo "round $r"
    timed "restore > /dev/null" sh -c "'$cairn' restore img - --repo '$repo' -q > /dev/null"
    timed "restore to /dev/shm" "$cairn" restore img /dev/shm/cairn-mount-bench.out --repo "$repo" -q
    rm -f /dev/shm/cairn-mount-bench.out
    mounted "mount: cat > /dev/null" sh -c "cat '$mnt/img/latest' > /dev/null"
    mounted "mount: dd bs=1M" dd if="$mnt/img/latest" of=/dev/null bs=1M status=none
done
uptime
