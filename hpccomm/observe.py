"""Observers: how diagnostics watch operations without the dispatch path knowing them.

The dispatch path (``_call.launch``), :class:`~hpccomm.work.Work` and
``init_process_group`` report what happens here; a plug-in (desync checks, flight
recorder, roll call...) subclasses :class:`Observer`, overrides the events it needs and
calls :func:`register` when its level or feature is switched on. The events:

====================  ==================================================================
``before_start``      before an operation starts: may communicate on the group and
                      raise (then the operation is not started)
``on_start``          the operation started; its ``Work`` says what it is
``on_complete``       it completed (its finishing step ran)
``on_timeout``        a wait passed its deadline; a returned sentence joins the error
``on_failure``        it failed with ``error``
``on_initialized``    ``init_process_group`` made the default group
====================  ==================================================================

Per-operation events cost the dispatch path one module-attribute test, :data:`active`,
while no observer wants them; timeouts, failures and initialization are rare and always
reported. This module imports nothing from hpccomm: every layer may report to it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

#: Whether any observer wants per-operation events (``before_start``, ``on_start``,
#: ``on_complete``): the one flag the dispatch path reads on every call.
active: bool = False
#: Whether one wants ``on_start``/``on_complete``, for which every operation needs a
#: ``Work`` (the DETAIL check alone leaves synchronous calls on their lighter path).
tracks_work: bool = False

_PER_OPERATION = ("before_start", "on_start", "on_complete")
_EVENTS = _PER_OPERATION + ("on_timeout", "on_failure", "on_initialized")


class Observer:
    """Base class of plug-ins: override the events you need (the others cost nothing).

    ``work`` is the operation's :class:`~hpccomm.work.Work` (``op``, ``seq``, ``group``,
    ``shape``, ``dtype``, ``peer``, ``describe()``); ``pg`` a ``ProcessGroup``.
    """

    def before_start(self, pg: Any, op: str, args: tuple, arr: Any, peer: Optional[int],
                     timeout: Optional[float]) -> None:
        """``op`` is about to start ``backend(*args)`` on ``pg``; raise to stop it."""

    def on_start(self, work: Any) -> None:
        """An operation started."""

    def on_complete(self, work: Any) -> None:
        """An operation completed (after its finishing step)."""

    def on_timeout(self, work: Any, waited: float) -> Optional[str]:
        """A wait outlived its deadline; return a sentence for the error, or ``None``."""
        return None

    def on_failure(self, work: Any, error: BaseException) -> None:
        """An operation failed with ``error`` (a ``DistError``)."""

    def on_initialized(self, world: Any, facts: Dict[str, str]) -> None:
        """``init_process_group`` made ``world``; ``facts`` describe the start-up."""


_observers: List[Observer] = []
_handlers: Dict[str, Tuple[Callable[..., Any], ...]] = {event: () for event in _EVENTS}


def register(observer: Observer, first: bool = False) -> None:
    """Add ``observer`` (once), after the others or, with ``first``, before them."""
    if observer in _observers:
        return
    if first:
        _observers.insert(0, observer)
    else:
        _observers.append(observer)
    _rebuild()


def unregister(observer: Observer) -> None:
    """Remove ``observer`` if it is registered."""
    if observer in _observers:
        _observers.remove(observer)
        _rebuild()


def registered() -> Tuple[Observer, ...]:
    """The registered observers, in the order their events run."""
    return tuple(_observers)


def _rebuild() -> None:
    """Per event, the bound methods of the observers that override it."""
    global active, tracks_work
    for event in _EVENTS:
        default = getattr(Observer, event)
        _handlers[event] = tuple(getattr(o, event) for o in _observers
                                 if getattr(type(o), event) is not default)
    active = any(_handlers[event] for event in _PER_OPERATION)
    tracks_work = bool(_handlers["on_start"] or _handlers["on_complete"])


def before_start(pg: Any, op: str, args: tuple, arr: Any, peer: Optional[int],
                 timeout: Optional[float]) -> None:
    """Run the checks due before ``op`` starts (any of them may raise)."""
    for check in _handlers["before_start"]:
        check(pg, op, args, arr, peer, timeout)


def started(work: Any) -> None:
    """Report that ``work``'s operation started."""
    for handler in _handlers["on_start"]:
        handler(work)


def completed(work: Any) -> None:
    """Report that ``work``'s operation completed."""
    for handler in _handlers["on_complete"]:
        handler(work)


def timed_out(work: Any, waited: float) -> List[str]:
    """The observers' sentences about a timeout; a failing observer is skipped, so that
    it cannot hide the timeout itself."""
    notes = []
    for handler in _handlers["on_timeout"]:
        try:
            note = handler(work, waited)
        except Exception:
            note = None
        if note:
            notes.append(note)
    return notes


def failed(work: Any, error: BaseException) -> None:
    """Report a failure; a failing observer is skipped, so that it cannot hide the error."""
    for handler in _handlers["on_failure"]:
        try:
            handler(work, error)
        except Exception:
            pass


def initialized(world: Any, facts: Dict[str, str]) -> None:
    """Report the default group and the facts of the start-up (errors propagate: a
    diagnostic that cannot start, such as a bad ``HPCCOMM_TRACE_BUFFER``, is reported)."""
    for handler in _handlers["on_initialized"]:
        handler(world, facts)
