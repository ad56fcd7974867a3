"""Debug levels: OFF, INFO (log set-up facts), DETAIL (check every collective's agreement).

The level is read from ``HPCCOMM_DISTRIBUTED_DEBUG`` (or torch's
``TORCH_DISTRIBUTED_DEBUG``) at import and by :func:`set_debug_level_from_env`; a level
set at run time applies to the next call on every existing group, because the dispatch
path reads :data:`level` on each call.
"""
from __future__ import annotations

import logging
import os

from .types import DebugLevel

logger = logging.getLogger("hpccomm")

#: The current level; read on every call by the dispatch path.
level: DebugLevel = DebugLevel.OFF

ENV_VARS = ("HPCCOMM_DISTRIBUTED_DEBUG", "TORCH_DISTRIBUTED_DEBUG")


def set_debug_level(new_level: "DebugLevel | str | int") -> None:
    """Set the debug level for all following calls, on all groups."""
    global level
    if isinstance(new_level, str):
        try:
            new_level = DebugLevel[new_level.strip().upper()]
        except KeyError:
            raise ValueError(f"debug level must be OFF, INFO or DETAIL, got {new_level!r}") from None
    level = DebugLevel(new_level)
    if level >= DebugLevel.INFO and logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def get_debug_level() -> DebugLevel:
    """The current debug level."""
    return level


def set_debug_level_from_env() -> None:
    """Read the level from ``HPCCOMM_DISTRIBUTED_DEBUG``, else ``TORCH_DISTRIBUTED_DEBUG``."""
    for name in ENV_VARS:
        value = os.environ.get(name)
        if value:
            set_debug_level(value)
            return
    set_debug_level(DebugLevel.OFF)


set_debug_level_from_env()
