#!/bin/bash
# sparse.sh: a mostly-sparse image (a VM disk with little written) backed
# up by cairn, borg and restic, packed by cairn, zstd and pigz, and
# unpacked into a file by cairn and zstd -d: side by side, one round each
# in turn.
#
# usage: bench/sparse.sh [-c CAIRN]... [-s SIZE] [-d DATA_FILE] [-o OUT_DIR]
#   -c CAIRN   a cairn binary (repeat to compare builds); default target/release/cairn
#   -s SIZE    logical size of the image (truncate syntax), default 20G
#   -d FILE    data written into the image: the first 128 MiB of FILE at
#              offset 4000 MiB (default bench/data/os.img)
#   -o DIR     where results.txt goes (default: print only)
#
# The image lives in $TMPDIR (default /tmp) and is removed at the end; the
# repositories too. Every tool writes its repository to the same disk.
# Needs borg and restic on PATH (as bench/backup.py); a missing peer is
# reported and skipped.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cairns=()
size=20G
data=$here/data/os.img
out=
while getopts "c:s:d:o:" opt; do
    case $opt in
        c) cairns+=("$OPTARG") ;;
        s) size=$OPTARG ;;
        d) data=$OPTARG ;;
        o) out=$OPTARG ;;
        *) sed -n 2,14p "$0"; exit 2 ;;
    esac
done
[ ${#cairns[@]} -gt 0 ] || cairns=("$here/../target/release/cairn")
work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-sparse.XXXXXX")
trap 'rm -rf "$work"' EXIT
img=$work/sparse.img
truncate -s "$size" "$img"
dd if="$data" of="$img" bs=4M count=32 seek=1000 conv=notrunc,sparse status=none
export BORG_BASE_DIR=$work/borg-home BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes
export RESTIC_PASSWORD=cairn-bench RESTIC_CACHE_DIR=$work/restic-cache GOMAXPROCS=2
results=$(mktemp)
{
    echo "# bench/sparse.sh $(date -u +%FT%TZ) on $(nproc) cores, $(uname -r)"
    echo "# image: $(du -h --apparent-size "$img" | cut -f1) logical, $(du -h "$img" | cut -f1) allocated, on $(df --output=source,fstype "$work" | tail -1)"
    echo "# columns: tool, wall seconds, user, system (GNU time); page cache warm (image read once first)"
} | tee "$results"
timed() { # label cmd...
    local label=$1; shift
    cat "$img" > /dev/null
    /usr/bin/time -f "$label %e %U %S" "$@" > /dev/null 2> "$work/err" || { cat "$work/err"; return 1; }
    tail -1 "$work/err" | tee -a "$results"
}
for c in "${cairns[@]}"; do
    rm -rf "$work/cairn"; "$c" init "$work/cairn" --encryption none > /dev/null 2>&1
    timed "cairn($c)" "$c" backup "$img" --repo "$work/cairn" --name s -q -c zstd:3
done
if command -v borg > /dev/null; then
    borg init --encryption none "$work/borg" > /dev/null 2>&1
    timed "borg-zstd3" borg create --compression zstd,3 "$work/borg::s" "$img"
else
    echo "borg: not installed, skipped" | tee -a "$results"
fi
if command -v restic > /dev/null; then
    restic --repo "$work/restic" init --repository-version 2 > /dev/null 2>&1
    timed "restic" restic --repo "$work/restic" backup -q "$img"
else
    echo "restic: not installed, skipped" | tee -a "$results"
fi
# pack to /dev/null (the image read by name), then unpack into a file.
for c in "${cairns[@]}"; do
    timed "pack-zstd3 cairn($c)" "$c" pack -F zstd -3 -T 2 -q -c "$img"
    timed "pack-gzip6 cairn($c)" "$c" pack -F gzip -6 -T 2 -q -c "$img"
done
timed "pack-zstd3 zstd -T2" zstd -T2 -3 -q -c "$img"
if command -v pigz > /dev/null; then
    timed "pack-gzip6 pigz -p2" pigz -p2 -6 -c "$img"
fi
"${cairns[-1]}" pack -F zstd -3 -q -c "$img" > "$work/img.zst"
for c in "${cairns[@]}"; do
    rm -f "$work/out.img"
    timed "unpack-to-file cairn($c)" "$c" unpack -q -k "$work/img.zst" -o "$work/out.img"
    echo "  allocated: $(du -h "$work/out.img" | cut -f1)" | tee -a "$results"
done
rm -f "$work/out.img"
timed "unpack-to-file zstd -d" zstd -d -q -f "$work/img.zst" -o "$work/out.img"
echo "  allocated: $(du -h "$work/out.img" | cut -f1)" | tee -a "$results"
rm -f "$work/out.img"
if [ -n "$out" ]; then mkdir -p "$out"; cp "$results" "$out/results.txt"; fi
rm -f "$results"
