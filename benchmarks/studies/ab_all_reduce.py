"""A/B of ``all_reduce`` between this checkout and another one, interleaved in one job.

On a busy machine two benchmark runs taken minutes apart differ by more than a small
change costs. This script imports both versions into the same processes (the other one
renamed ``hpccomm_ab``) and alternates between them every few milliseconds, so load
spikes hit both alike; compare the minimum and 10th percentile.

    mpiexec -n 2 python benchmarks/studies/ab_all_reduce.py /path/to/other/checkout
    python benchmarks/studies/ab_all_reduce.py /path/to/other/checkout     # a world of one

Prints, on rank 0, per size (8 B and 1 MiB): min, p10 and median microseconds per call
for ``this`` and ``other``.
"""
import atexit
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def import_other(checkout):
    """The other checkout's ``hpccomm`` package, imported as ``hpccomm_ab``."""
    scratch = tempfile.mkdtemp(prefix="hpccomm-ab-")
    atexit.register(shutil.rmtree, scratch, True)
    target = os.path.join(scratch, "hpccomm_ab")
    shutil.copytree(os.path.join(checkout, "hpccomm"), target)
    for folder, _, files in os.walk(target):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as handle:
                    text = handle.read()
                # plugin paths such as "hpccomm.backends.mpi.communicator:MPICommunicator"
                text = re.sub(r'(["\'])hpccomm\.', r"\1hpccomm_ab.", text)
                with open(path, "w") as handle:
                    handle.write(text)
    sys.path.insert(0, os.path.dirname(target))
    import hpccomm_ab
    return hpccomm_ab


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.path.insert(0, ROOT)
    import hpccomm as this
    other = import_other(sys.argv[1])
    this.init_process_group()
    other.init_process_group()
    variants = {"this": this.all_reduce, "other": other.all_reduce}
    for label, x, calls in [("8 B", np.ones(1), 2000), ("1 MiB", np.ones(1 << 17), 20)]:
        for fn in variants.values():
            for _ in range(calls):
                fn(x)
        times = {name: [] for name in variants}
        for rep in range(150):
            order = list(variants.items())
            for name, fn in (order if rep % 2 else order[::-1]):
                this.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    fn(x)
                times[name].append((time.perf_counter() - start) / calls * 1e6)
        if this.get_rank() == 0:
            for name, values in times.items():
                values.sort()
                print(f"all_reduce {label:>5} n={this.get_world_size()} {name:>5}: "
                      f"min {values[0]:8.2f} us  p10 {values[len(values) // 10]:8.2f} us  "
                      f"median {values[len(values) // 2]:8.2f} us", flush=True)
    other.destroy_process_group()
    this.destroy_process_group()


if __name__ == "__main__":
    main()
