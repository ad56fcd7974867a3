"""Flight recorder: the last N operations of this process, dumped when something fails.

A preallocated ring of ``Work`` references and a counter; recording one operation is one
call that stores a reference (the dispatch path reads the time only when a recorder is
set). A ``Work`` already carries seq, op, group, shape, dtype, start/end time and state,
so nothing is formatted until a dump. The ring keeps the last N ``Work`` objects alive
(with their output arrays); size it accordingly.

Size: ``HPCCOMM_TRACE_BUFFER=N`` (read by ``init_process_group``); unset, it is
:data:`DEFAULT_SIZE` at debug level INFO or DETAIL and 0 (off) at OFF. :func:`enable`
changes it at run time.

Dumps: on a timeout (a ``work.timeout_hooks`` hook, after the roll call) or a desync,
each failing rank writes ``$HPCCOMM_TRACE_DIR/rank<global rank>.json`` when that
variable is set; :func:`dump` writes one on demand. ``python -m hpccomm.trace DIR``
merges the per-rank files into a one-screen summary of which ranks are behind and where.
"""
from __future__ import annotations

import itertools
import os
import platform
import time
from typing import Any, Callable, Dict, List, Optional

from .. import _call
from . import debug, rollcall
from ..group import registry
from ..types import DebugLevel
from ..work import Work, timeout_hooks

ENV_SIZE = "HPCCOMM_TRACE_BUFFER"
ENV_DIR = "HPCCOMM_TRACE_DIR"
#: Ring size when ``HPCCOMM_TRACE_BUFFER`` is unset and the debug level is INFO or DETAIL.
DEFAULT_SIZE = 2000

_ring: List[Optional[Work]] = []
_counter: Any = itertools.count()
_STATES = ("pending", "completed", "failed")


def _make_recorder(ring: List[Optional[Work]], counter: Any) -> Callable[[Work], None]:
    size = len(ring)
    step = counter.__next__

    def record(work: Work) -> None:
        ring[step() % size] = work
    return record


def enable(size: int) -> None:
    """Record the last ``size`` operations from now on (0 turns recording off)."""
    global _ring, _counter
    if size <= 0:
        disable()
        return
    _ring, _counter = [None] * int(size), itertools.count()
    _call.recorder = _make_recorder(_ring, _counter)
    Work.timed = True  # completions now record their end time


def disable() -> None:
    """Stop recording and forget the recorded operations."""
    global _ring, _counter
    _call.recorder = None
    Work.timed = False
    _ring, _counter = [], itertools.count()


def size() -> int:
    """The ring's size (0: off)."""
    return len(_ring) if _call.recorder is not None else 0


def configure() -> None:
    """Size the ring from ``HPCCOMM_TRACE_BUFFER`` or the debug level; install the hook."""
    value = os.environ.get(ENV_SIZE, "").strip()
    if value:
        try:
            wanted = int(value)
        except ValueError:
            raise ValueError(f"{ENV_SIZE}={value!r} is not an integer") from None
    elif debug.level >= DebugLevel.INFO:
        wanted = max(DEFAULT_SIZE, size())
    else:
        wanted = size()  # OFF: keep what enable() chose (off unless asked for)
    if wanted != size():
        enable(wanted)
    install_hooks()


def install_hooks() -> None:
    """Put the roll call, then the dump, into ``work.timeout_hooks`` (once)."""
    if rollcall.hook not in timeout_hooks:
        timeout_hooks.insert(0, rollcall.hook)
    if _timeout_hook not in timeout_hooks:
        timeout_hooks.append(_timeout_hook)


def _entry(work: Work, offset: float) -> Dict[str, Any]:
    group = work.group
    state = _STATES[work._state]
    if work._state == 2 and (work._error is None or
                             type(work._error).__name__ == "DistTimeoutError"):
        state = "timed out"
    entry: Dict[str, Any] = {
        "seq": work.seq, "op": work.op, "state": state,
        "group": group.group_name if group is not None else None,
        "group_ranks": list(group.ranks) if group is not None else None,
        "shape": list(work.shape) if work.shape is not None else None,
        "dtype": str(work.dtype) if work.dtype is not None else None,
        "peer": work.peer,
        "start": work.t_start + offset if work.t_start else None,
        "end": work.t_end + offset if work.t_end else None,
    }
    if work.t_start and work.t_end:
        entry["duration_s"] = work.t_end - work.t_start
    return entry


def entries() -> List[Dict[str, Any]]:
    """The recorded operations, oldest first, as dicts (times in seconds since the epoch)."""
    offset = time.time() - time.monotonic()
    ring = list(_ring)
    recorded = sorted((w for w in ring if w is not None), key=lambda w: (w.t_start, w.seq))
    return [_entry(work, offset) for work in recorded]


def snapshot(reason: str = "manual", error: str = "",
             failed: Optional[Work] = None) -> Dict[str, Any]:
    """Everything a dump holds, as a JSON-ready dict."""
    world = registry.world
    offset = time.time() - time.monotonic()
    failed_entry = _entry(failed, offset) if failed is not None else None
    if failed_entry is not None and reason == "timeout":
        failed_entry["state"] = "timed out"
    return {
        "rank": world.rank() if world is not None else None,
        "world_size": world.size() if world is not None else None,
        "host": platform.node(), "pid": os.getpid(), "time": time.time(),
        "reason": reason, "error": error, "failed_op": failed_entry,
        "rollcall": rollcall.last if reason == "timeout" else None,
        "groups": {name: {"ranks": list(pg.ranks), "seq": pg.seq}
                   for name, pg in registry.groups.items()},
        "buffer_size": size(), "entries": entries(),
    }


def dump(path: Optional[str] = None, reason: str = "manual", error: str = "",
         failed: Optional[Work] = None) -> str:
    """Write this rank's dump to ``path`` (default ``$HPCCOMM_TRACE_DIR/rank<r>.json``)."""
    import json  # dumps are rare: keep `import hpccomm` light

    data = snapshot(reason, error, failed)
    if path is None:
        directory = os.environ.get(ENV_DIR) or "."
        path = os.path.join(directory, f"rank{data['rank'] if data['rank'] is not None else 'X'}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        json.dump(data, handle, indent=1, default=str)
    os.replace(temporary, path)
    debug.logger.error("hpccomm: flight recorder (%s) written to %s", reason, path)
    return path


def dump_on_error(reason: str, error: str, failed: Optional[Work] = None) -> Optional[str]:
    """Dump if ``HPCCOMM_TRACE_DIR`` is set (timeouts and desyncs call this)."""
    if not os.environ.get(ENV_DIR):
        return None
    return dump(None, reason, error, failed)


def _timeout_hook(work: Work, waited: float) -> None:
    note = rollcall.sentence(rollcall.last) if rollcall.last is not None and \
        rollcall.last.get("seq") == work.seq else ""
    dump_on_error("timeout", f"{work.describe()} timed out after {waited:.3f} s. {note}",
                  work)
