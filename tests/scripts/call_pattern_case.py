"""Scenarios for tests/test_mpi_libraries.py, run as ``mpiexec -n N python this.py CASE``.

Each breaks the group on purpose (an absent rank, ranks in different collectives), so it
runs in its own job. ``RESULT`` lines are what the test reads. ``HPCCOMM_MPI_GATED``
picks the call pattern under test (e.g. ``all=1K``: gated blocking calls from 1 KiB).
"""
import os
import sys
import time

import numpy as np

import hpccomm as dist
from never_hang_case import TIMEOUT, leave, say  # the same RESULT lines and exit

ABSENT = int(os.environ.get("CASE_ABSENT", "1"))


def absent_rank():
    """Rank ABSENT skips every operation; the others run each collective, small and large,
    synchronous and async, and must get a timeout error within the timeout each time."""
    n = dist.get_world_size()
    dist.barrier()  # everyone is up: the timeouts below measure the operations alone
    if dist.get_rank() == ABSENT:
        time.sleep(float(os.environ.get("CASE_SLEEP", "60")))
        leave()
    for count in (2, 1 << 17):  # 16 B (nonblocking everywhere) and 1 MiB of float64
        ops = {
            "all_reduce": lambda: dist.all_reduce(np.ones(count)),
            "all_reduce async": lambda: dist.all_reduce(np.ones(count), async_op=True).wait(),
            "broadcast": lambda: dist.broadcast(np.ones(count), src=ABSENT),
            "reduce": lambda: dist.reduce(np.ones(count), dst=0),
            "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
                np.ones(count * n), np.ones(count)),
            "gather": lambda: dist.gather(np.ones(count), None if dist.get_rank() else
                                          [np.ones(count) for _ in range(n)], dst=0),
            "scatter": lambda: dist.scatter(np.ones(count), None, src=ABSENT),
            "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
                np.ones(count), np.ones(count * n)),
            "all_to_all_single": lambda: dist.all_to_all_single(np.ones(count * n),
                                                                np.ones(count * n)),
        }
        for name, run in ops.items():
            start = time.monotonic()
            try:
                run()
            except dist.DistTimeoutError:
                say(f"op={name}", f"bytes={8 * count}",
                    f"elapsed={time.monotonic() - start:.3f}")
            except Exception as exc:  # noqa: BLE001 (reported, the test fails on it)
                say(f"op={name}", f"bytes={8 * count}", "error=" + repr(exc)[:300])
            else:
                say(f"op={name}", f"bytes={8 * count}", "error=no error")
    leave()


def different_collectives():
    """Rank 0 calls all_reduce, the others broadcast, on the same large buffer size."""
    x = np.ones(1 << 17)
    dist.barrier()
    start = time.monotonic()
    try:
        if dist.get_rank() == 0:
            dist.all_reduce(x)
        else:
            dist.broadcast(x, src=0)
    except dist.DistError as exc:
        say(f"kind={type(exc).__name__}", f"elapsed={time.monotonic() - start:.3f}",
            "error=" + str(exc).replace("\n", " "))
        leave()
    say("kind=none", "error=no error")
    leave()


CASES = {f.__name__: f for f in (absent_rank, different_collectives)}

if __name__ == "__main__":
    dist.init_process_group(timeout=TIMEOUT)
    CASES[sys.argv[1]]()
