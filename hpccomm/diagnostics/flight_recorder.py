"""Flight recorder: the last N operations of this process, dumped when something fails.

A preallocated ring of ``Work`` references and a counter, filled by an observer of
operations (:mod:`hpccomm.observe`) that is registered only while the ring is on:
recording one operation stores a reference and its start time, completion its end
time. A ``Work`` already carries seq, op, group, shape, dtype and state, so nothing is
formatted until a dump. The ring keeps the last N ``Work`` objects alive
(with their output arrays); size it accordingly.

Size: ``HPCCOMM_TRACE_BUFFER=N`` (read by ``init_process_group``); unset, it is
:data:`DEFAULT_SIZE` at debug level INFO or DETAIL and 0 (off) at OFF. :func:`enable`
changes it at run time.

Dumps: on a timeout (an observer of timeouts, after the roll call) or a desync,
each failing rank writes ``$HPCCOMM_TRACE_DIR/rank<global rank>.json`` when that
variable is set; :func:`dump` writes one on demand. ``python -m hpccomm.trace DIR``
merges the per-rank files into a one-screen summary of which ranks are behind and where.
"""
from __future__ import annotations

import itertools
import os
import platform
import time
from typing import Any, Dict, List, Optional

from .. import observe, settings
from ..group import registry
from ..types import DebugLevel
from ..work import Work
from . import debug, rollcall

#: Ring size when ``HPCCOMM_TRACE_BUFFER`` is unset and the debug level is INFO or DETAIL.
DEFAULT_SIZE = 2000

_monotonic = time.monotonic


class Recorder(observe.Observer):
    """The ring: the last ``size`` started operations, with their start and end times."""

    def __init__(self, size: int):
        self.ring: List[Optional[Work]] = [None] * size
        self.size = size
        self._step = itertools.count().__next__

    def on_start(self, work: Work) -> None:
        work.t_start = _monotonic()
        self.ring[self._step() % self.size] = work

    def on_complete(self, work: Work) -> None:
        work.t_end = _monotonic()

    def on_failure(self, work: Work, error: BaseException) -> None:
        work.t_end = _monotonic()


class DumpOnTimeout(observe.Observer):
    """Writes this rank's dump when an operation times out (with ``HPCCOMM_TRACE_DIR``)."""

    def on_timeout(self, work: Work, waited: float) -> None:
        last = rollcall.last
        note = rollcall.sentence(last) if last is not None and last.get("seq") == work.seq \
            else ""
        dump_on_error("timeout", f"{work.describe()} timed out after {waited:.3f} s. {note}",
                      work)


_recorder: Optional[Recorder] = None
_dump_on_timeout = DumpOnTimeout()


def enable(size: int) -> None:
    """Record the last ``size`` operations from now on (0 turns recording off)."""
    global _recorder
    disable()
    if size > 0:
        _recorder = Recorder(int(size))
        observe.register(_recorder)


def disable() -> None:
    """Stop recording and forget the recorded operations."""
    global _recorder
    if _recorder is not None:
        observe.unregister(_recorder)
        _recorder = None


def size() -> int:
    """The ring's size (0: off)."""
    return _recorder.size if _recorder is not None else 0


def configure() -> None:
    """Size the ring from ``HPCCOMM_TRACE_BUFFER`` or the debug level; dump on timeouts."""
    wanted = settings.TRACE_BUFFER.get()
    if wanted is None and debug.level >= DebugLevel.INFO:
        wanted = max(DEFAULT_SIZE, size())
    elif wanted is None:
        wanted = size()  # OFF: keep what enable() chose (off unless asked for)
    if wanted != size():
        enable(wanted)
    observe.register(_dump_on_timeout)


def _entry(work: Work, offset: float) -> Dict[str, Any]:
    group = work.group
    state = work.state
    error = work.exception()
    if state == "failed" and (error is None or type(error).__name__ == "DistTimeoutError"):
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
    ring = list(_recorder.ring) if _recorder is not None else []
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
        directory = settings.TRACE_DIR.get() or "."
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
    if not settings.TRACE_DIR.get():
        return None
    return dump(None, reason, error, failed)
