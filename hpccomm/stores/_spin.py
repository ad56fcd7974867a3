"""How the store servers and clients wait: spin briefly, then block.

A kernel wake-up (a thread blocked in ``poll``/``sleep`` made runnable again) costs
tens of microseconds, several times a store request's own work. So after each request
a server keeps polling without blocking for a short window (:data:`SERVER_SPIN_S`),
and a client polls for its reply for :data:`CLIENT_SPIN_S` before blocking: during a
burst of requests nobody sleeps. Every spin iteration yields the core
(``sched_yield``) and releases the GIL, so a spinning thread lets the processes and
threads it shares a core or an interpreter with run, and when the burst ends the
waiting goes back to blocking (TCP) or to a sleep that grows with idleness (MPI),
which costs next to nothing.

Spinning only pays while a core is free. When runnable threads outnumber cores, each
``sched_yield`` hands the core to another task and the spinner finds, on its next turn,
that much more than a turn's time has passed. A gap over :data:`PREEMPTED_S` between two
turns therefore ends a TCPStore spin at once: on a busy machine the wait goes straight
to a blocking ``recv``/``epoll``, which the scheduler rewards, instead of competing for
the core. MPIStore has no blocking wait to fall back on (only timer sleeps, far slower
to notice a reply), so it yields for its whole window, as hpccomm's collective polls do.

The windows can be tuned with ``HPCCOMM_STORE_SPIN_US`` (server) and
``HPCCOMM_STORE_CLIENT_SPIN_US`` (client); 0 turns spinning off.
"""
from __future__ import annotations

import os

from .. import settings

sched_yield = getattr(os, "sched_yield", lambda: None)

#: How long a server keeps polling without blocking after it handled a request.
SERVER_SPIN_S = settings.STORE_SPIN_US.get()
#: How long a client polls for its reply before it blocks (or sleeps).
CLIENT_SPIN_S = settings.STORE_CLIENT_SPIN_US.get()
#: A gap this long between two spin turns means the spinner lost its core: stop spinning.
PREEMPTED_S = 50e-6
