#!/usr/bin/env python3
"""dict-trade.py: does a trained zstd dictionary let chunks compressed
alone keep the ratio of 2 MiB groups? (issue 20, random access without
giving back the ratio: the measurement behind the layout decision.)

The image is cut into fixed pieces (32 KiB, cairn's average chunk, and
64 KiB; all-zero pieces are left out, as cairn stores them as holes) and
compressed with zstd -3 three ways: in groups of 2 MiB (cairn's default
record), each piece alone, and each piece alone with a dictionary trained
by zstd's trainer (ZDICT, through python-zstandard) on a random sample of
the pieces; the dictionary's own size is counted once. Also the time to
decode every piece alone, with and without the dictionary, on one core.
One run; the table goes to stdout and OUT/report.txt.

  bench/dict-trade.py IMAGE [--out DIR]      (pip install zstandard)
"""
import argparse
import os
import random
import time

import zstandard as zstd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("image")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    data = open(a.image, "rb").read()
    lines = ["image %s (%d MiB), zstd -3, python-zstandard %s (libzstd %s)"
             % (a.image, len(data) >> 20, zstd.__version__,
                ".".join(map(str, zstd.ZSTD_VERSION)))]
    c3 = zstd.ZstdCompressor(level=3)
    for piece in (32 << 10, 64 << 10):
        pieces = [data[i:i + piece] for i in range(0, len(data), piece)]
        pieces = [p for p in pieces if p.count(0) != len(p)]
        groups, buf = 0, bytearray()
        for p in pieces:
            buf += p
            if len(buf) >= 2 << 20:
                groups += len(c3.compress(bytes(buf)))
                buf = bytearray()
        if buf:
            groups += len(c3.compress(bytes(buf)))
        lines.append("piece %d KiB: %d pieces, %d MiB raw; 2 MiB groups: %.1f MiB"
                     % (piece >> 10, len(pieces), sum(map(len, pieces)) >> 20, groups / 2**20))
        alone = [c3.compress(p) for p in pieces]
        d0 = zstd.ZstdDecompressor()
        t = time.perf_counter()
        for f in alone:
            d0.decompress(f)
        dt = time.perf_counter() - t
        size = sum(map(len, alone))
        lines.append("  alone: %.1f MiB = %.3f x groups; decode %.1f us a piece"
                     % (size / 2**20, size / groups, dt / len(pieces) * 1e6))
        for dict_size, samples in ((112 << 10, 256), (112 << 10, 1024), (256 << 10, 1024)):
            random.seed(1)
            sample = random.sample(pieces, min(samples, len(pieces)))
            t = time.perf_counter()
            d = zstd.train_dictionary(dict_size, sample, level=3, threads=2)
            train = time.perf_counter() - t
            cd = zstd.ZstdCompressor(level=3, dict_data=d)
            framed = [cd.compress(p) for p in pieces]
            dd = zstd.ZstdDecompressor(dict_data=d)
            t = time.perf_counter()
            for f in framed:
                dd.decompress(f)
            dt = time.perf_counter() - t
            size = sum(map(len, framed)) + len(d.as_bytes())
            lines.append("  alone + %d KiB dictionary from %d samples (trained in %.1f s): "
                         "%.1f MiB = %.3f x groups; decode %.1f us a piece"
                         % (len(d.as_bytes()) >> 10, len(sample), train, size / 2**20,
                            size / groups, dt / len(pieces) * 1e6))
    text = "\n".join(lines)
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "report.txt"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
