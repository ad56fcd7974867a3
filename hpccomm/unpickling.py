"""How object collectives turn received bytes back into objects.

By default they use ``pickle`` exactly as torch does, which runs whatever code the
sending rank chose: fine among your own job's ranks, dangerous if a peer is not trusted.
*Weights-only* mode, in the spirit of ``torch.load(weights_only=True)``, unpickles
through an allowlist instead: builtin scalars and containers, a few standard-library
value types (``OrderedDict``, ``deque``, ``datetime``...) and NumPy arrays, scalars and
dtypes. Anything else (a class of yours, a function, ``os.system``) is refused with
``pickle.UnpicklingError`` before any of its code runs; allow your own types with
:func:`add_safe_globals`.

Turn it on without changing any call (torch's signatures stay as they are):

- ``HPCCOMM_OBJECTS_WEIGHTS_ONLY=1`` in the environment of every rank, or
- ``hpccomm.objects.set_weights_only(True)`` in the program (every rank).
"""
from __future__ import annotations

import contextlib
import io
import pickle
from typing import Any, Iterable, Iterator, List, Set, Tuple

from . import settings

_BUILTINS = ("bool", "int", "float", "complex", "str", "bytes", "bytearray", "list",
             "tuple", "dict", "set", "frozenset", "slice", "range")
_NUMPY = [(f"numpy.{core}.{module}", name)
          for core in ("_core", "core")
          for module, name in (("multiarray", "_reconstruct"), ("multiarray", "scalar"),
                               ("numeric", "_frombuffer"))]

#: ``(module, name)`` pairs weights-only mode accepts, whatever the user adds.
DEFAULT_SAFE: Tuple[Tuple[str, str], ...] = (
    *[("builtins", name) for name in _BUILTINS],
    ("collections", "OrderedDict"), ("collections", "deque"), ("collections", "Counter"),
    ("datetime", "datetime"), ("datetime", "date"), ("datetime", "time"),
    ("datetime", "timedelta"), ("datetime", "timezone"),
    ("numpy", "ndarray"), ("numpy", "dtype"), *_NUMPY,
)

_weights_only: bool = settings.OBJECTS_WEIGHTS_ONLY.get()
_user_safe: Set[Tuple[str, str]] = set()


def set_weights_only(enabled: bool = True) -> None:
    """Unpickle received objects through the allowlist (``True``) or with plain
    ``pickle`` as torch does (``False``, the default unless the environment says so)."""
    global _weights_only
    _weights_only = bool(enabled)


def weights_only() -> bool:
    """Whether object collectives unpickle through the allowlist."""
    return _weights_only


def _key(item: Any) -> Tuple[str, str]:
    if isinstance(item, tuple) and len(item) == 2 and all(isinstance(p, str) for p in item):
        return item
    module, name = getattr(item, "__module__", None), getattr(item, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        raise TypeError(f"add_safe_globals takes classes or functions (or (module, name) "
                        f"pairs), got {item!r}")
    return module, name


def add_safe_globals(safe: Iterable[Any]) -> None:
    """Allow these classes (or ``(module, name)`` pairs) in weights-only mode, as
    ``torch.serialization.add_safe_globals`` does for ``torch.load``."""
    _user_safe.update(_key(item) for item in safe)


def get_safe_globals() -> List[Tuple[str, str]]:
    """The ``(module, name)`` pairs added with :func:`add_safe_globals`."""
    return sorted(_user_safe)


def clear_safe_globals() -> None:
    """Forget every pair added with :func:`add_safe_globals`."""
    _user_safe.clear()


@contextlib.contextmanager
def safe_globals(safe: Iterable[Any]) -> Iterator[None]:
    """Allow these classes for the duration of a ``with`` block."""
    added = {_key(item) for item in safe} - _user_safe
    _user_safe.update(added)
    try:
        yield
    finally:
        _user_safe.difference_update(added)


class _AllowlistUnpickler(pickle.Unpickler):
    """An unpickler that resolves only allowlisted globals."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in DEFAULT_SAFE or (module, name) in _user_safe:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"weights-only unpickling refused {module}.{name}: it is not an allowed type "
            f"(allow it on the receiving ranks with "
            f"hpccomm.objects.add_safe_globals([{name}]), or turn weights-only mode off "
            f"with hpccomm.objects.set_weights_only(False) if every peer is trusted)")


def loads(data: Any, where: Any = None) -> Any:
    """The object pickled in ``data`` (bytes-like), by the current rules.

    ``where`` (called only on a refusal) names the operation and rank for the error.
    """
    if not _weights_only:
        return pickle.loads(data)
    try:
        return _AllowlistUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        if where is None:
            raise
        raise pickle.UnpicklingError(f"{where()}: {exc}") from None
