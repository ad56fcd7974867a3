"""The C kernel of the two-rank shared-memory all-reduce (``_pair.c``), where it applies.

Pair mode (:class:`~hpccomm.backends.shm.algorithms.AllReduce`) stages each chunk into
the ring and adds the peer's staged copy into the rank's own buffer. In Python every
chunk step costs about 10 us of interpreter work (counter reads, views, two NumPy
calls); the C kernel does the same steps for a whole operation in one call and can wait
for the peer's counters itself, with the GIL released, for a bounded slice.

The kernel can also start an operation itself (publish the descriptor, resolve the
peer's): the *direct form* of a synchronous sum, which skips the Python set-up too and
hands an operation still running after its slice back to the state machine. C and
Python speak the same counter protocol, so ranks may mix them.

It serves plain sums of the types C adds exactly as NumPy does: float32 and float64
(complex64/complex128 as pairs of them) and integers of 1-8 bytes (wrapping, computed
unsigned). Every other dtype and reduction keeps the NumPy steps. Without a compiled
helper, or with ``HPCCOMM_SHM_KERNEL=0``, everything keeps the NumPy steps.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from ... import settings

#: Longest wait for the peer inside C per call: the caller's loop checks its deadline,
#: advances other groups' operations and lets MPI progress between slices.
SLICE_S = 0.002
#: Bytes of one half's chunk (a ring slot holds two: the staged input, the sum). Chunks of
#: 128 KiB measured 3-7% faster than 256 KiB at 4-8 MiB here, and alike below.
PIECE_BYTES = 128 * 1024

try:
    from . import _pair as _shm_pair  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: NumPy steps only
    _shm_pair = None

#: The kernel's element kind for each (NumPy kind, item size), by its name in the kernel
#: (a complex number is summed as two reals).
_KIND_NAMES = {("f", 4): "F32", ("f", 8): "F64", ("c", 8): "F32", ("c", 16): "F64",
               ("i", 1): "U8", ("u", 1): "U8", ("i", 2): "U16", ("u", 2): "U16",
               ("i", 4): "U32", ("u", 4): "U32", ("i", 8): "U64", ("u", 8): "U64"}
#: The kernel's codes for those kinds, as the compiled kernel defines them.
_KINDS = ({key: getattr(_shm_pair, f"KIND_{name}") for key, name in _KIND_NAMES.items()}
          if _shm_pair is not None else {})
#: ``Pair.run``'s result once resolved packs chunks reduced, staged and gathered in fields of
#: this many bits (the kernel's own constant); operations of more chunks keep the NumPy
#: steps. Before the peer has resolved the operation ``Pair.run`` returns a negative status.
FIELD_BITS = _shm_pair.FIELD_BITS if _shm_pair is not None else 0
MAX_CHUNKS = 1 << FIELD_BITS
_FIELD = MAX_CHUNKS - 1


def unpack(result: int) -> Tuple[int, int, int]:
    """``(reduced, staged, gathered)`` chunks from ``run``'s (non-negative) result."""
    return result >> 2 * FIELD_BITS, (result >> FIELD_BITS) & _FIELD, result & _FIELD


def available() -> bool:
    """Whether the C kernel is built and ``HPCCOMM_SHM_KERNEL`` allows it."""
    return _shm_pair is not None and settings.SHM_KERNEL.get()


def bind(rank: int, slots: int, slot_bytes: int, regions: Any, words: Any,
         layout: Dict[str, int]) -> Any:
    """The kernel of one two-rank communicator, configured once: whether this rank adds
    first, the ring's shape, both rings' and both control blocks' addresses, and the
    control block's ``layout`` (word positions, the descriptor's fields, the staging
    lookahead). Its ``run(own, count, kind, ce, half, nch, k0, enter, r, s, g, slice,
    yield_every)`` takes what changes per operation. ``None`` when :func:`available`
    is false. The caller keeps ``regions`` and ``words`` alive as long as the kernel."""
    if not available():
        return None
    peer = 1 - rank
    return _shm_pair.Pair(first=rank == 0, slots=slots, slot_bytes=slot_bytes,
                          mine=regions[rank].ctypes.data, theirs=regions[peer].ctypes.data,
                          my_words=_address(words[rank]), peer_words=_address(words[peer]),
                          **layout)


def kind_of(dtype: Any) -> Optional[Tuple[int, int]]:
    """``(kernel kind, reals per element)`` for summing ``dtype`` with the kernel, or
    ``None`` where the NumPy steps apply (another dtype, a byte-swapped one)."""
    if not dtype.isnative:
        return None
    code = _KINDS.get((dtype.kind, dtype.itemsize))
    return None if code is None else (code, 2 if dtype.kind == "c" else 1)


def _address(words: Any) -> int:
    return np.frombuffer(words, np.int64).ctypes.data
