"""What the diagnostics do once ``init_process_group`` has made the default group.

An observer of initialization: it reads the debug level from the environment again (a
program may set it after ``import hpccomm``), installs the roll call and the flight
recorder's dump on timeouts, installs the abort-on-exception hook in jobs of more than
one rank, and at debug level INFO logs the start-up facts on every rank.
"""
from __future__ import annotations

import os
from typing import Any, Dict

from .. import observe
from ..types import DebugLevel
from . import debug, excepthook, flight_recorder, rollcall


class Startup(observe.Observer):
    """Switches the diagnostics on when the default group is made."""

    def on_initialized(self, world: Any, facts: Dict[str, str]) -> None:
        if debug.level == DebugLevel.OFF:
            debug.set_debug_level_from_env()
        rollcall.install()
        flight_recorder.configure()
        size = world.size()
        if size > 1:
            excepthook.install()
        if debug.level >= DebugLevel.INFO:
            debug.logger.info(
                "hpccomm: rank %d/%d initialized on %s, pid %d; MPI library: %s; thread "
                "level %s; backends %s; store %s; timeout %s; debug level %s; flight recorder "
                "%s; abort on uncaught exception: %s; cores: %s", world.rank(), size,
                facts.get("host"), os.getpid(), facts.get("MPI library"),
                facts.get("thread level"), facts.get("backends"), facts.get("store"),
                facts.get("timeout"),
                debug.level.name, _recorder_state(), _abort_state(size), facts.get("cores"))


def _recorder_state() -> str:
    size = flight_recorder.size()
    return f"last {size} ops" if size else "off"


def _abort_state(size: int) -> str:
    if size == 1:
        return "no (world of one)"
    return "yes" if excepthook.installed() else f"no ({excepthook.OPT_OUT_ENV} is set)"


_observer = Startup()


def install() -> None:
    """Switch the diagnostics on at every ``init_process_group`` from now on."""
    observe.register(_observer)
