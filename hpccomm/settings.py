"""Every ``HPCCOMM_*`` environment variable hpccomm reads, declared once and parsed one way.

Each variable is a :class:`Setting` below: its name, kind, default, when it is read and
what it means. Code reads a setting through its declaration (``settings.SHM.get()``),
never through ``os.environ``; ``tests/test_architecture.py`` fails on an undeclared
``HPCCOMM_*`` name anywhere in the package and on a read of one outside this module.
``hpccomm info`` lists them with their current values, and ``docs/settings.md`` holds
the table :func:`markdown_table` writes (``python tests/test_settings.py --write-docs``).

One parser per kind:

* **flag**: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``, any case;
* **count**: a whole number, at least 0;
* **size**: bytes, a number with an optional binary suffix: ``4096``, ``64K``,
  ``64KiB``, ``1M``, ``2MB``, ``1G`` (K = 1024), ``1e6``;
* **seconds** and **microseconds**: a number, at least 0, in the unit the name says,
  or with a unit of its own: ``1.5``, ``200ms``, ``50us``, ``2s``;
* **choice**: one of a few words, any case;
* **text**: any string, as given.

One rule for values. Unset or blank: the default. Malformed: a ``RuntimeWarning``
that names the variable, the value, what was expected and the default used instead,
once per variable and value in a process, and the run goes on with the default: a typo
on one rank must not make it raise while the others wait for it in a collective. The
one exception is a setting declared ``strict``: the debug level, whose reader
(``set_debug_level_from_env``) raises ``ValueError`` as torch's does.

A setting is read when its :attr:`Setting.read` says: most at each use (a program may set
them after ``import hpccomm``), a few once, at import, into a module constant that
paths taken often read (the store's spin windows, the gating table, the roll call's
limits). This module imports only the standard library, so the launcher may use it.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import warnings
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set,
                    Tuple)

PREFIX = "HPCCOMM_"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_SCALES = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


# -- one parser per kind ---------------------------------------------------------------------
def parse_flag(text: str) -> bool:
    """``1``/``true``/``yes``/``on`` -> ``True``, ``0``/``false``/``no``/``off`` ->
    ``False`` (any case); anything else raises ``ValueError``."""
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"not a flag: {text!r} (1/true/yes/on or 0/false/no/off)")


def parse_count(text: str) -> int:
    """A whole number, at least 0."""
    word = text.strip()
    if not re.fullmatch(r"\+?\d+", word):
        raise ValueError(f"not a whole number of at least 0: {text!r}")
    return int(word)


def parse_size(text: str) -> int:
    """Bytes: ``"4096"``, ``"64K"``, ``"64KiB"``, ``"1M"``, ``"2MB"``, ``"1G"``, ``"1e6"``
    (binary suffixes, any case); at least 0."""
    word = text.strip().upper()
    word = word[:-1] if word.endswith("B") else word
    word = word[:-1] if word.endswith("I") and word[-2:-1] in "KMGT" else word
    suffix = word[-1:] if word[-1:] in "KMGT" else ""
    try:
        value = float(word[:len(word) - len(suffix)]) * _SCALES[suffix]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 4096, 64K, 1MiB)") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a size: {text!r} (at least 0 bytes)")
    return int(value)


def parse_seconds(text: str, unit: float = 1.0) -> float:
    """Seconds from a number in ``unit`` seconds, or with a unit of its own (``s``,
    ``ms``, ``us``); at least 0."""
    word = text.strip().lower()
    number = word.rstrip("abcdefghijklmnopqrstuvwxyzµ")
    suffix = word[len(number):].strip()
    if suffix and suffix not in _UNITS:
        raise ValueError(f"not a duration: {text!r} (a number, or with s, ms or us)")
    try:
        value = float(number) * (_UNITS[suffix] if suffix else unit)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (a number, or with s, ms or us)") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a duration: {text!r} (at least 0)")
    return value


def parse_choice(text: str, choices: Sequence[str]) -> str:
    """The one of ``choices`` that ``text`` names (any case), in its declared spelling."""
    word = text.strip().upper()
    for choice in choices:
        if choice.upper() == word:
            return choice
    raise ValueError(f"not one of {', '.join(choices)}: {text!r}")


class Kind:
    """How a kind of setting is parsed and shown (one instance per kind below)."""

    def __init__(self, name: str, parse: Callable[[str], Any],
                 show: Callable[[Any], str] = str):
        self.name, self.parse, self.show = name, parse, show

    def __repr__(self) -> str:
        return f"<Kind {self.name}>"


def _show_size(value: int) -> str:
    for suffix in ("G", "M", "K"):
        if value and value % _SCALES[suffix] == 0:
            return f"{value // _SCALES[suffix]}{suffix}"
    return str(value)


def _show_number(value: float) -> str:
    return f"{value:g}"


FLAG = Kind("flag", parse_flag, lambda value: "1" if value else "0")
COUNT = Kind("count", parse_count)
SIZE = Kind("size", parse_size, _show_size)
SECONDS = Kind("seconds", parse_seconds, _show_number)
MICROSECONDS = Kind("microseconds", lambda text: parse_seconds(text, 1e-6),
                    lambda value: _show_number(round(value * 1e6, 6)))
TEXT = Kind("text", lambda text: text)


def choice(*choices: str) -> Kind:
    """The kind of a setting that takes one of ``choices``."""
    return Kind("choice of " + "/".join(choices),
                lambda text: parse_choice(text, choices))


# -- the declaration -------------------------------------------------------------------------
_warned: Set[Tuple[str, str]] = set()


class Setting:
    """One ``HPCCOMM_*`` variable: ``get()`` its value (the default when it is unset,
    blank or malformed; see the module's rule)."""

    __slots__ = ("name", "kind", "default", "read", "meaning", "also", "secret", "strict")

    def __init__(self, name: str, kind: Kind, default: Any, read: str, meaning: str, *,
                 also: Tuple[str, ...] = (), secret: bool = False, strict: bool = False):
        #: The variable, ``HPCCOMM_...``.
        self.name = name
        self.kind = kind
        #: The value when the variable is unset, blank or malformed (``None``: none).
        self.default = default
        #: When hpccomm reads it: ``"import"``, ``"each use"``, ``"group creation"``...
        self.read = read
        #: One line for the docs table and ``hpccomm info``.
        self.meaning = meaning
        #: Other variables read, in order, when this one is unset (torch's names).
        self.also = also
        #: Whether ``hpccomm info`` hides the value.
        self.secret = secret
        #: Whether a malformed value raises ``ValueError`` instead of warning.
        self.strict = strict

    def lookup(self, environ: Optional[Mapping[str, str]] = None) -> Optional[Tuple[str, str]]:
        """``(variable, text)`` of the first of this variable and :attr:`also` that is set
        and not blank, or ``None``."""
        environ = os.environ if environ is None else environ
        for name in (self.name,) + self.also:
            text = environ.get(name)
            if text is not None and text.strip():
                return name, text
        return None

    def is_set(self, environ: Optional[Mapping[str, str]] = None) -> bool:
        """Whether the variable itself is in the environment, even blank."""
        return self.name in (os.environ if environ is None else environ)

    def get(self, environ: Optional[Mapping[str, str]] = None) -> Any:
        """The value from ``environ`` (default ``os.environ``), parsed by the kind."""
        found = self.lookup(environ)
        if found is None:
            return self.default
        name, text = found
        try:
            return self.kind.parse(text if self.kind is TEXT else text.strip())
        except ValueError as exc:
            return self.reject(text, str(exc), name)

    def reject(self, text: str, why: str, name: Optional[str] = None,
               using: Optional[str] = None) -> Any:
        """Apply the rule for a malformed value ``text`` (``why`` says what is wrong):
        raise if :attr:`strict`, else warn once and return the default. For code that
        parses a text setting's grammar itself; ``using`` says what applies instead
        when the default is not a value (``"the table for MPICH"``)."""
        name = name or self.name
        message = f"hpccomm: {name}={text!r} is malformed: {why}"
        if self.strict:
            raise ValueError(message)
        if (name, text) not in _warned:
            _warned.add((name, text))
            using = using or f"the default ({self.show(self.default)})"
            warnings.warn(f"{message}; using {using}",
                          RuntimeWarning, stacklevel=3)
        return self.default

    def show(self, value: Any) -> str:
        """``value`` as the docs and ``hpccomm info`` write it."""
        if value is None:
            return "unset"
        return self.kind.show(value)

    def describe(self, environ: Optional[Mapping[str, str]] = None) -> str:
        """The current value for ``hpccomm info``: ``"1 (set)"``, ``"0 (default)"``, or
        the default with the malformed text that was ignored."""
        found = self.lookup(environ)
        if found is None:
            return f"{self.show(self.default)} (default)"
        name, text = found
        source = "" if name == self.name else f" from {name}"
        if self.secret:
            return f"(set{source}, hidden)"
        try:
            value = self.kind.parse(text if self.kind is TEXT else text.strip())
        except ValueError:
            return f"{self.show(self.default)} (default: {text!r}{source} is malformed)"
        return f"{self.show(value)} (set{source})"

    @contextlib.contextmanager
    def overridden(self, text: str) -> Iterator[None]:
        """Set the variable to ``text`` in this process for the ``with`` block, then
        restore it (``bench`` makes a group without shared memory this way)."""
        saved = os.environ.get(self.name)
        os.environ[self.name] = text
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop(self.name, None)
            else:
                os.environ[self.name] = saved

    def __repr__(self) -> str:
        return f"<Setting {self.name}>"


SETTINGS: Dict[str, Setting] = {}


def _declare(suffix: str, kind: Kind, default: Any, read: str, meaning: str,
             **extra: Any) -> Setting:
    setting = Setting(PREFIX + suffix, kind, default, read, meaning, **extra)
    SETTINGS[setting.name] = setting
    return setting


# -- the settings, by area -------------------------------------------------------------------
# Shared memory (backends/shm/)
SHM = _declare(
    "SHM", FLAG, True, "group creation",
    "Large collectives of a group on one node may go through shared memory; 0: MPI only.")
SHM_MIN_BYTES = _declare(
    "SHM_MIN_BYTES", SIZE, 0, "group creation",
    "One threshold from which all_reduce, reduce_scatter, all_gather and broadcast use "
    "shared memory; 0: the measured threshold of each operation.")
SHM_SMALL = _declare(
    "SHM_SMALL", SIZE, None, "group creation",
    "Largest message of the small-collective path through shared memory (all_reduce, "
    "broadcast, all_gather, reduce_scatter, all_to_all, barrier); 0: MPI for small "
    "messages; unset: the measured sizes of each operation.")
SHM_SPLIT = _declare(
    "SHM_SPLIT", SIZE, None, "group creation",
    "Bytes from which the small channel's all_reduce is split among 3 or more ranks (each "
    "reduces one part, then copies the others'); 0: never; unset: the cost model's size "
    "for the group (docs/performance.md).")
SHM_TREE = _declare(
    "SHM_TREE", COUNT, None, "group creation",
    "Ranks of one node from which the small channel's hand-off is a combining tree "
    "(each rank polls one cache line, not one per rank); 0: never; unset: 32.")
SHM_TREE_RADIX = _declare(
    "SHM_TREE_RADIX", COUNT, 8, "group creation",
    "Children of each node of the small channel's hand-off tree (2 or more).")
SHM_CHUNK = _declare(
    "SHM_CHUNK", SIZE, 0, "group creation",
    "Bytes of one shared-memory ring slot, split among the ranks; 0: 512K, at least 64K "
    "per rank.")
SHM_KERNEL = _declare(
    "SHM_KERNEL", FLAG, True, "import",
    "Two-rank shared-memory sums use the C kernel where it is built; 0: NumPy steps only.")
SHM_FENCE = _declare(
    "SHM_FENCE", FLAG, None, "group creation",
    "1: memory barriers around shared-memory counters even on x86; 0: none; unset: "
    "barriers except on x86.")
SHM_CMA = _declare(
    "SHM_CMA", FLAG, True, "group creation",
    "Probe cross-memory attach, which reads a peer's private array in one copy; 0: "
    "always stage through shared memory.")
# Placement (backends/mpi/placement.py)
NODES = _declare(
    "NODES", COUNT, 0, "each use",
    "Testing aid: treat the job's ranks as this many nodes of consecutive world ranks; "
    "0: the nodes MPI reports.")
OVERSUBSCRIBED = _declare(
    "OVERSUBSCRIBED", FLAG, None, "init_process_group, group creation",
    "1/0: treat the node as running more ranks than CPUs, or not; unset: compare the "
    "ranks with the CPUs they may run on together.")
# MPI (mpi_level.py, backends/mpi/)
MPI_THREAD_LEVEL = _declare(
    "MPI_THREAD_LEVEL", choice("single", "funneled", "serialized", "multiple"), None,
    "MPI initialization",
    "The thread level hpccomm starts MPI at; unset: mpi4py's (mpi4py.rc.thread_level, "
    "multiple unless the program changed it).")
MPI_DIRECT = _declare(
    "MPI_DIRECT", FLAG, True, "first use",
    "A blocking in-place sum may start and spin in the C helper; 0: the general path only.")
MPI_GATED = _declare(
    "MPI_GATED", TEXT, None, "import",
    "Gated blocking calls: off, all=256K, or all_reduce=64K,all_gather=1M; unset: the "
    "table for the MPI library.")
MPI_CUDA_AWARE = _declare(
    "MPI_CUDA_AWARE", FLAG, None, "GPU backend creation",
    "1/0: the MPI library takes GPU pointers, or not; unset: ask the library.")
# GPUs (backends/cuda/nccl.py, backends/cuda/device.py)
NCCL_BLOCKING_WAIT = _declare(
    "NCCL_BLOCKING_WAIT", FLAG, False, "GPU backend creation",
    "wait() on GPU work blocks the CPU, under the timeout, instead of ordering the stream.")
NCCL_BINDING = _declare(
    "NCCL_BINDING", choice("cupy", "nccl4py"), "cupy", "GPU backend creation",
    "Which binding makes and calls NCCL communicators: CuPy's, or NVIDIA's nccl4py "
    "(needed for nonblocking and many-root creation, and ncclCommShrink).")
NCCL_NONBLOCKING = _declare(
    "NCCL_NONBLOCKING", FLAG, False, "GPU backend creation",
    "Nonblocking NCCL communicators (nccl4py): a creation past the timeout raises "
    "DistTimeoutError and the process goes on.")
NCCL_RANKS_PER_ROOT = _declare(
    "NCCL_RANKS_PER_ROOT", COUNT, 128, "GPU backend creation",
    "With nccl4py, a group of more ranks is made from one unique id per this many ranks "
    "(ncclCommInitRankScalable); 0: always one id.")
# Stores (stores/)
STORE_TOKEN = _declare(
    "STORE_TOKEN", TEXT, None, "store creation",
    "Shared secret with which a TCPStore server authenticates its clients.", secret=True)
STORE_LOCAL_SOCKET = _declare(
    "STORE_LOCAL_SOCKET", FLAG, True, "store creation",
    "Clients on a TCPStore server's host move to its Unix socket; 0: TCP only.")
STORE_SPIN_US = _declare(
    "STORE_SPIN_US", MICROSECONDS, 1e-3, "import",
    "How long a store server keeps polling without blocking after a request; 0: never.")
STORE_CLIENT_SPIN_US = _declare(
    "STORE_CLIENT_SPIN_US", MICROSECONDS, 2e-4, "import",
    "How long a store client polls for its reply before it blocks; 0: never.")
# Objects (unpickling.py)
OBJECTS_WEIGHTS_ONLY = _declare(
    "OBJECTS_WEIGHTS_ONLY", FLAG, False, "import",
    "Object collectives unpickle through the allowlist (set_weights_only) from the start.")
# Diagnostics (diagnostics/)
DISTRIBUTED_DEBUG = _declare(
    "DISTRIBUTED_DEBUG", choice("OFF", "INFO", "DETAIL"), "OFF",
    "import, init_process_group",
    "Debug level: INFO logs start-up facts, DETAIL also checks that ranks agree on every "
    "collective; a malformed value raises, as torch's does.",
    also=("TORCH_DISTRIBUTED_DEBUG",), strict=True)
LOG_LEVEL = _declare(
    "LOG_LEVEL", choice("ERROR", "WARNING", "WARN", "INFO", "DEBUG", "TRACE"), None,
    "each change of the debug level",
    "Level of the hpccomm logger, combined with the debug level as torch does; unset: "
    "INFO from debug level INFO on.", also=("TORCH_CPP_LOG_LEVEL",))
ROLLCALL_GRACE = _declare(
    "ROLLCALL_GRACE", SECONDS, 1.0, "import",
    "How long a timed-out rank listens for the other ranks' reports; 0: no roll call.")
ROLLCALL_MAX_RANKS = _declare(
    "ROLLCALL_MAX_RANKS", COUNT, 256, "import",
    "Largest group that runs a roll call after a timeout.")
TRACE_BUFFER = _declare(
    "TRACE_BUFFER", COUNT, None, "init_process_group",
    "Operations the flight recorder keeps; 0: off; unset: off, or 2000 from debug level "
    "INFO on.")
TRACE_DIR = _declare(
    "TRACE_DIR", TEXT, None, "each dump",
    "Directory of the flight recorder's dumps; set, a timeout or desync writes them.")
NO_ABORT_ON_EXCEPTION = _declare(
    "NO_ABORT_ON_EXCEPTION", FLAG, False, "init_process_group",
    "An uncaught exception on one rank does not abort the job.")
# Growing a job (fault.grow_group, backends/mpi/join.py)
JOIN = _declare(
    "JOIN", TEXT, None, "init_process_group",
    "A directory: this job joins a running one whose grow_group waits there; 0: never "
    "join (not even when spawned).")
# Checkpoints (checkpoint/)
CHECKPOINT_PROGRESS = _declare(
    "CHECKPOINT_PROGRESS", FLAG, None, "each save or load",
    "1/0: show the progress bar on rank 0, or never; unset: at a terminal only.")
# Launching and testing (launch.py, pytest_plugin.py)
MPIEXEC = _declare(
    "MPIEXEC", TEXT, None, "each launch",
    "The mpiexec that hpccomm run uses; unset: the one next to this Python, else PATH.")
SRUN_MPI = _declare(
    "SRUN_MPI", TEXT, None, "each launch",
    "srun's --mpi plugin; set and empty: Slurm's default; unset: chosen for the MPI library.")
TEST_TMPDIR = _declare(
    "TEST_TMPDIR", TEXT, None, "each test session",
    "Shared directory for the pytest plugin's tmp_path on several nodes.")


def undeclared(environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """``HPCCOMM_*`` variables set in ``environ`` that no setting declares (typos)."""
    environ = os.environ if environ is None else environ
    return sorted(name for name in environ if name.startswith(PREFIX) and name not in SETTINGS)


# -- the docs table --------------------------------------------------------------------------
BEGIN = "<!-- settings table: written by `python tests/test_settings.py --write-docs` -->"
END = "<!-- end of the settings table -->"


def markdown_table() -> str:
    """The table of every setting, as ``docs/settings.md`` holds it."""
    lines = ["| variable | kind | default | read at | meaning |", "|---|---|---|---|---|"]
    for setting in SETTINGS.values():
        name = f"`{setting.name}`"
        if setting.also:
            name += " (or " + ", ".join(f"`{other}`" for other in setting.also) + ")"
        lines.append(f"| {name} | {setting.kind.name} | `{setting.show(setting.default)}` | "
                     f"{setting.read} | {setting.meaning} |")
    return "\n".join(lines)


def with_table(page: str) -> str:
    """``page`` with the text between its table markers replaced by :func:`markdown_table`."""
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    return page[:start] + "\n" + markdown_table() + "\n" + page[end:]
