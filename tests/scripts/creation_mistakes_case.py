"""The ranks of a group creation come for different things, or late, and try again.

Usage: mpiexec -n 3 python creation_mistakes_case.py members|kinds|retry

* ``members``: ranks 0 and 1 call ``new_group([0, 1, 2])``, rank 2 ``new_group([0, 2])``
  (a rank that computes its member list differently);
* ``kinds``: ranks 0 and 1 call ``new_group([0, 1, 2])``, rank 2
  ``split_group(split_ranks=[[0, 1, 2]])``;
* ``retry``: rank 2 comes ``LATE_S`` late to ``new_group([0, 1, 2], timeout=TIMEOUT_S)``,
  then all three meet at a barrier of the default group and call it again.

Each rank prints ``RESULT rank=R type=... elapsed=... error=...`` for the first call
(``type=none`` if it returned), and for ``retry`` also ``again=ok`` (or the retry's
error) once the second call and an all_reduce on its group returned.
"""
import os
import sys
import time

import numpy as np

import hpccomm as dist

#: The creations' timeout, and how late rank 2 comes in ``retry``.
TIMEOUT_S = 2.0
LATE_S = 3.5


def report(rank: int, **fields: object) -> None:
    """One write per line, so ranks sharing the launcher's pipe never interleave."""
    text = " ".join(f"{key}={value}" for key, value in fields.items())
    os.write(1, f"RESULT rank={rank} {text}\n".encode())


def first_call(case: str, rank: int) -> None:
    if case == "members":
        dist.new_group([0, 2] if rank == 2 else [0, 1, 2], timeout=TIMEOUT_S)
    elif case == "kinds":
        if rank == 2:
            dist.split_group(split_ranks=[[0, 1, 2]], timeout=TIMEOUT_S)
        else:
            dist.new_group([0, 1, 2], timeout=TIMEOUT_S)
    elif case == "retry":
        if rank == 2:
            time.sleep(LATE_S)
        dist.new_group([0, 1, 2], timeout=TIMEOUT_S)
    else:
        raise SystemExit(f"unknown case {case}")


def main() -> None:
    case = sys.argv[1]
    dist.init_process_group(timeout=60)
    rank = dist.get_rank()
    began = time.monotonic()
    try:
        first_call(case, rank)
        kind, error = "none", "-"
    except Exception as exc:  # noqa: BLE001 - the class is what the test checks
        kind, error = type(exc).__name__, " ".join(str(exc).split())
    fields = {"type": kind, "elapsed": f"{time.monotonic() - began:.2f}"}
    if case == "retry":
        dist.barrier()
        try:
            pg = dist.new_group([0, 1, 2], timeout=TIMEOUT_S)
            x = np.ones(2)
            dist.all_reduce(x, group=pg)
            fields["again"] = "ok" if x.tolist() == [3.0, 3.0] else f"wrong:{x.tolist()}"
        except Exception as exc:  # noqa: BLE001
            fields["again"] = f"{type(exc).__name__}:{' '.join(str(exc).split())[:300]}"
    fields["error"] = error
    report(rank, **fields)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
