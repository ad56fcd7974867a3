"""Debug levels: OFF, INFO (log set-up facts), DETAIL (check every collective's agreement).

The level is read from ``HPCCOMM_DISTRIBUTED_DEBUG`` (or torch's
``TORCH_DISTRIBUTED_DEBUG``) at import and by :func:`set_debug_level_from_env`; a level
set at run time applies to the next call on every existing group: the plug-ins that
follow the level (:func:`on_change`; the desync check at DETAIL) register or unregister
their observers at once.

Logging goes to ``logging.getLogger("hpccomm")``. Its level follows torch's matrix, with
``HPCCOMM_LOG_LEVEL`` (or ``TORCH_CPP_LOG_LEVEL``) as the log level:

==============  ============  ===========================================
log level       debug level   effective level of the ``hpccomm`` logger
==============  ============  ===========================================
ERROR           ignored       ERROR
WARNING         ignored       WARNING
INFO            OFF           INFO
INFO            INFO          DEBUG
INFO            DETAIL        TRACE (5: every checked collective is logged)
unset           OFF           left alone (Python's default: WARNING)
unset           INFO/DETAIL   INFO (so the initialization facts show)
==============  ============  ===========================================

When the environment sets a log level or the debug level is INFO or more, and neither
the ``hpccomm`` logger nor the root logger has a handler, a stderr handler is added.
"""
from __future__ import annotations

import logging
from typing import Callable, List

from .. import settings
from ..types import DebugLevel

logger = logging.getLogger("hpccomm")

#: Below DEBUG: one line per checked collective at DETAIL.
TRACE = 5
logging.addLevelName(TRACE, "TRACE")

#: The current level.
level: DebugLevel = DebugLevel.OFF
_listeners: List[Callable[[DebugLevel], None]] = []

_LOG_LEVELS = {"ERROR": logging.ERROR, "WARNING": logging.WARNING, "WARN": logging.WARNING,
               "INFO": logging.INFO, "DEBUG": logging.DEBUG, "TRACE": TRACE}
_handler: "logging.Handler | None" = None
_set_by_us = -1  # the logger level this module set last (a user's own level wins)


def set_debug_level(new_level: "DebugLevel | str | int") -> None:
    """Set the debug level for all following calls, on all groups."""
    global level
    if isinstance(new_level, str):
        try:
            new_level = DebugLevel[new_level.strip().upper()]
        except KeyError:
            raise ValueError(f"debug level must be OFF, INFO or DETAIL, got {new_level!r}") from None
    level = DebugLevel(new_level)
    apply_log_level()
    for listener in list(_listeners):
        listener(level)


def get_debug_level() -> DebugLevel:
    """The current debug level."""
    return level


def on_change(listener: Callable[[DebugLevel], None]) -> None:
    """Call ``listener(level)`` now and after every change of the level (once per
    listener, however often it is passed here)."""
    if listener not in _listeners:
        _listeners.append(listener)
    listener(level)


def set_debug_level_from_env() -> None:
    """Read the level from ``HPCCOMM_DISTRIBUTED_DEBUG``, else ``TORCH_DISTRIBUTED_DEBUG``
    (unset: OFF); a value other than OFF, INFO or DETAIL raises ``ValueError``."""
    set_debug_level(settings.DISTRIBUTED_DEBUG.get())


def effective_log_level(log_level: "str | None", debug_level: DebugLevel) -> "int | None":
    """The ``hpccomm`` logger level for a log level name and a debug level (the matrix)."""
    if not log_level:
        return logging.INFO if debug_level >= DebugLevel.INFO else None
    name = log_level.strip().upper()
    if name not in _LOG_LEVELS:
        raise ValueError(f"log level must be ERROR, WARNING, INFO (or DEBUG, TRACE), "
                         f"got {log_level!r}")
    value = _LOG_LEVELS[name]
    if value == logging.INFO and debug_level >= DebugLevel.DETAIL:
        return TRACE
    if value == logging.INFO and debug_level >= DebugLevel.INFO:
        return logging.DEBUG
    return value


def apply_log_level() -> None:
    """Set the ``hpccomm`` logger's level from the environment and :data:`level`."""
    global _handler, _set_by_us
    env = settings.LOG_LEVEL.get()  # a malformed one warns and counts as unset
    value = effective_log_level(env, level)
    if value is None:
        if logger.level == _set_by_us:  # back to OFF: undo what this module set
            logger.setLevel(logging.NOTSET)
            _set_by_us = -1
        return
    if env is not None or logger.level in (logging.NOTSET, _set_by_us):
        logger.setLevel(value)
        _set_by_us = value
    if _handler is None and not logger.handlers and not logging.getLogger().handlers:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("%(asctime)s hpccomm %(levelname)s: %(message)s"))
        logger.addHandler(_handler)


set_debug_level_from_env()
