"""Diagnostics: debug levels, desync checks, flight recorder, roll call, excepthook,
``monitored_barrier``, ``breakpoint`` and the trace tool.

They watch the library from outside, through :mod:`hpccomm.observe`: each plug-in
registers an observer when its level or feature is switched on (the desync check at
debug level DETAIL, the flight recorder when its ring is on, the roll call and the
dump on timeouts at ``init_process_group``), and nothing below this package imports it.
``import hpccomm`` imports it, so the diagnostics serve every user of the package.
"""
from . import desync, excepthook, flight_recorder, startup
from .debug import get_debug_level, set_debug_level, set_debug_level_from_env
from .debugger import breakpoint
from .monitored_barrier import monitored_barrier

desync.install()   # the check before every collective, while the debug level is DETAIL
startup.install()  # at init_process_group: roll call, dumps, excepthook, INFO facts
