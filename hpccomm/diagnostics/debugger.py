"""``breakpoint(rank)``: pdb on one rank while the other ranks wait for it.

Every rank of the default group calls ``hpccomm.breakpoint(rank=r)`` with the same
``r``. Rank ``r`` enters pdb (``up`` reaches the caller's frame); the others wait in a
:func:`~hpccomm.monitored_barrier` (sleeping, not spinning) until it continues, for at
most ``timeout_s`` seconds. mpiexec forwards the terminal's stdin to rank 0 only:
debug rank 0, or ask the launcher to forward stdin to all ranks (hydra:
``mpiexec -s all``; Open MPI: ``--stdin all``).
"""
from __future__ import annotations

import sys
from typing import Dict, Tuple

from ..group import registry, resolve
from .monitored_barrier import monitored_barrier

_seen: Dict[Tuple[str, int], int] = {}


def breakpoint(rank: int = 0, skip: int = 0, timeout_s: float = 3600) -> None:
    """Drop into pdb on global rank ``rank``; every other rank waits until it continues.

    ``skip``: ignore the first ``skip`` calls from this call site (all ranks alike).
    """
    world = resolve(None, "breakpoint")
    caller = sys._getframe(1)
    if skip > 0:
        key = (caller.f_code.co_filename, caller.f_lineno)
        count = _seen[key] = _seen.get(key, 0) + 1
        if count <= skip:
            return
    if world.rank() == rank:
        import pdb  # imported here: importing pdb costs ~50 ms

        debugger = pdb.Pdb()
        debugger.prompt = f"(Pdb rank {rank}) "
        debugger.message(f"\n!!! hpccomm.breakpoint on rank {rank}: the other ranks wait "
                         f"(at most {timeout_s:g} s) until you continue ('c'). Type 'up' to get to "
                         f"the frame that called it.\n")
        debugger.set_trace(sys._getframe())
    monitored_barrier(registry.world, timeout=timeout_s)
