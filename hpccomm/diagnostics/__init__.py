"""Diagnostics: debug levels, desync checks, flight recorder, roll call, excepthook.

These watch the library from outside: nothing below this package imports it.
"""
from . import excepthook, flight_recorder
from .debug import get_debug_level, set_debug_level, set_debug_level_from_env
from .debugger import breakpoint
from .monitored_barrier import monitored_barrier
