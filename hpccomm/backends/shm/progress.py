"""What every wait of the process advances: operations under way in shared memory.

A shared-memory operation moves only when some rank's code steps it, and its peers may
need this rank's step (a read of their data, a copy into their slot) while this rank
waits for something else: another operation of the same group, or of another group. So
every object with operations under way (a shared-memory communicator's ring and small
channel, the hierarchical all-reduce's chains) joins :data:`busy`, and every wait of the
process calls :func:`advance_all` between its polls (:data:`hpccomm.work.while_waiting`),
as MPI's progress engine would. Each object's ``advance_pending()`` moves its operations
as far as they go without waiting, in the order they were started, and calls
:func:`release` once none is left.
"""
from __future__ import annotations

from typing import Any, List

from ... import work as _work

#: Objects with operations under way, each with an ``advance_pending()`` method.
busy: List[Any] = []


def advance_all() -> None:
    """Advance every busy object once (installed as the waits' ``while_waiting``)."""
    if len(busy) == 1:
        busy[0].advance_pending()
        return
    for item in tuple(busy):
        item.advance_pending()


def register(item: Any) -> None:
    """``item`` has operations under way: every wait advances it from now on."""
    if item not in busy:
        busy.append(item)
        _work.while_waiting = advance_all


def release(item: Any) -> None:
    """``item`` has nothing under way any more."""
    if item in busy:
        busy.remove(item)
        if not busy:
            _work.while_waiting = None
