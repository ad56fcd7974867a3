"""A one-line progress bar for long saves and loads, shown on rank 0 at a terminal only.

``mpiexec`` usually pipes the ranks' output, so rank 0 sees no terminal there:
``HPCCOMM_CHECKPOINT_PROGRESS=1`` shows the bar anyway, ``=0`` never shows it.
"""
from __future__ import annotations

import sys
import time
from typing import IO, Optional

from .. import settings

_WIDTH = 30
_EVERY_S = 0.1
#: The variable that overrides the terminal test.
ENV = settings.CHECKPOINT_PROGRESS.name


class Progress:
    """Bytes done out of ``total``, redrawn at most every 0.1 s; silent unless ``active``.

    ``active`` is true when the caller asks for it (rank 0) and ``stream`` (default
    ``sys.stdout``) is a terminal, so logs and batch output stay free of bar lines;
    the environment variable ``HPCCOMM_CHECKPOINT_PROGRESS`` (``1``/``0``) overrides the
    terminal test.
    """

    def __init__(self, total: int, label: str, enabled: bool = True,
                 stream: Optional[IO[str]] = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        isatty = getattr(self.stream, "isatty", None)
        forced = settings.CHECKPOINT_PROGRESS.get()
        shown = forced if forced is not None else isatty is not None and isatty()
        self.active = bool(enabled and total > 0 and shown)
        self.total = total
        self.label = label
        self.done = 0
        self.start = time.perf_counter()
        self.drawn = 0.0

    def update(self, nbytes: int) -> None:
        self.done += int(nbytes)
        now = time.perf_counter()
        if self.active and (now - self.drawn >= _EVERY_S or self.done >= self.total):
            self.drawn = now
            self._draw(now)

    def close(self) -> None:
        if self.active:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, now: float) -> None:
        fraction = min(1.0, self.done / self.total)
        filled = int(round(fraction * _WIDTH))
        rate = self.done / max(now - self.start, 1e-9) / 1e9
        self.stream.write(f"\r{self.label}: [{'#' * filled}{'.' * (_WIDTH - filled)}] "
                          f"{fraction:4.0%} {self.done / 2**20:.0f}/{self.total / 2**20:.0f} MiB "
                          f"{rate:.2f} GB/s")
        self.stream.flush()
