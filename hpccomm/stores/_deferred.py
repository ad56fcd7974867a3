"""Release work handed over by garbage-collection finalizers, run where it cannot deadlock.

A ``weakref.finalize`` callback runs in whichever thread the collector happens to run
in, at any allocation: possibly in a thread that holds the very lock the release needs
(a non-reentrant lock: self-deadlock), or in a thread another one is waiting for while
holding it (a new thread that has not signalled its start yet). So a finalizer never
blocks: it queues a *step* (a callable that returns False when it could not take its
locks without waiting) and tries to run the queue at once; every code path that
releases one of those locks runs the queue afterwards, so a step deferred because a
lock was busy runs as soon as the holder lets go.
"""
from __future__ import annotations

import atexit
import collections
from typing import Callable, Deque

Step = Callable[[], bool]


class Deferred:
    """A queue of non-blocking release steps."""

    def __init__(self) -> None:
        self._steps: Deque[Step] = collections.deque()
        atexit.register(self.run)

    def submit(self, step: Step) -> None:
        """Queue ``step`` and try the queue now (safe from a finalizer: never blocks)."""
        self._steps.append(step)
        self.run()

    def run(self) -> None:
        """Try every queued step once; those that could not run stay queued."""
        for _ in range(len(self._steps)):
            try:
                step = self._steps.popleft()
            except IndexError:
                return
            if not step():
                self._steps.append(step)

    def __len__(self) -> int:
        return len(self._steps)
