"""Memory bandwidth of this machine: NumPy copy, the physical ceiling for large all_reduce.

Single process, ``np.copyto(dst, src)`` of float32 arrays; GB/s = bytes copied / time
(the memory traffic is twice that: one read and one write per byte). The bandwidth with
all ranks copying at once is measured inside ``collectives.py`` (same processes as the
collectives) and reported from its ``.json``. Writes ``docs/bench_membw.csv``.
"""
from __future__ import annotations

import csv
import json
import glob
import os
import statistics
import time

import numpy as np

KiB, MiB = 1024, 1024 * 1024
HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.normpath(os.path.join(HERE, "..", "docs"))


def copy_gbs(nbytes, repeats=21):
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    inner = max(1, (64 * MiB) // nbytes)
    np.copyto(dst, src)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            np.copyto(dst, src)
        samples.append((time.perf_counter_ns() - t0) * 1e-9 / inner)
    return nbytes / statistics.median(samples) / 1e9


def main():
    rows = [dict(what="NumPy copy, 1 process", bytes=n, GBs=copy_gbs(n))
            for n in (256 * KiB, 2 * MiB, 16 * MiB, 64 * MiB)]
    for path in sorted(glob.glob(os.path.join(DOCS, "bench_collectives_n*.json"))):
        meta = json.load(open(path))
        if meta.get("copy_GBs_all_ranks"):
            rows.append(dict(what=f"NumPy copy, {meta['ranks']} ranks at once (per rank)",
                             bytes=64 * MiB, GBs=meta["copy_GBs_all_ranks"]))
    with open(os.path.join(DOCS, "bench_membw.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["what", "bytes", "GBs"])
        writer.writeheader()
        writer.writerows(rows)
    for r in rows:
        print(f"{r['what']:45s} {r['bytes'] // KiB:>8d} KiB {r['GBs']:7.2f} GB/s")


if __name__ == "__main__":
    main()
