"""How the shared-memory path combines chunks: one NumPy ufunc per (dtype, reduction).

The arithmetic follows the MPI backend step for step, so that integer results are equal
bit for bit and floating results equal up to the order of additions:

* booleans reduce with logical ops (SUM/MAX/BOR: or, PRODUCT/MIN/BAND: and, BXOR: xor);
* bfloat16 (and float16 where MPI has no half type) accumulates in float32 and is
  rounded once at the end, as the MPI backend's float32 staging does;
* ``PREMUL_SUM`` multiplies every input by the factor (as a 0-d array, unsafe casting)
  before summing; ``AVG`` divides the sum by the group size in place.

Every input of a chunk is combined while the chunk's output is in cache: the output is
written by the first ufunc call and updated in place by the others.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ...types import RedOpType

_FLOAT32 = np.dtype(np.float32)
_ARITH = {RedOpType.SUM: np.add, RedOpType.AVG: np.add, RedOpType.PREMUL_SUM: np.add,
          RedOpType.PRODUCT: np.multiply, RedOpType.MIN: np.minimum,
          RedOpType.MAX: np.maximum, RedOpType.BAND: np.bitwise_and,
          RedOpType.BOR: np.bitwise_or, RedOpType.BXOR: np.bitwise_xor}
_LOGICAL = {RedOpType.SUM: np.logical_or, RedOpType.MAX: np.logical_or,
            RedOpType.BOR: np.logical_or, RedOpType.PRODUCT: np.logical_and,
            RedOpType.MIN: np.logical_and, RedOpType.BAND: np.logical_and,
            RedOpType.BXOR: np.logical_xor}


def accumulator(dtype: Any, half_native: bool) -> Optional[np.dtype]:
    """The dtype sums of ``dtype`` accumulate in when it is not ``dtype`` itself:
    float32 for bfloat16, and for float16 when the MPI library has no half type."""
    if getattr(dtype, "name", "") == "bfloat16" or (dtype.char == "e" and not half_native):
        return _FLOAT32
    return None


class Reducer:
    """Combines chunks of one reduction: ``combine(out, first, others)``."""

    __slots__ = ("kind", "ufunc", "acc", "factor", "divisor", "simple", "_scratch")

    def __init__(self, dtype: Any, kind: RedOpType, factor: Any, size: int,
                 half_native: bool = True):
        #: The reduction's kind, which the ranks compare before they combine.
        self.kind = int(kind)
        self.ufunc = (_LOGICAL if dtype.kind == "b" else _ARITH)[kind]
        self.acc = accumulator(dtype, half_native)
        self.factor = (np.asarray(factor).reshape(()) if kind == RedOpType.PREMUL_SUM
                       else None)
        self.divisor = size if kind == RedOpType.AVG else None
        self.simple = self.acc is None and self.factor is None and self.divisor is None
        self._scratch: Any = None

    def _buffers(self, count: int, dtype: Any) -> "tuple[np.ndarray, np.ndarray]":
        scratch = self._scratch
        if scratch is None or scratch[0].size < count:
            scratch = self._scratch = (np.empty(count, self.acc or dtype),
                                       np.empty(count, self.acc or dtype))
        return scratch[0][:count], scratch[1][:count]

    def combine(self, out: np.ndarray, first: np.ndarray, others: Sequence[np.ndarray]) -> None:
        """``out = first (op) others[0] (op) ...``; ``out`` may be ``first`` itself."""
        ufunc = self.ufunc
        if self.simple:
            ufunc(first, others[0], out=out)
            for other in others[1:]:
                ufunc(out, other, out=out)
            return
        factor = self.factor
        work, term = self._buffers(out.size, out.dtype)
        if self.acc is None and factor is None and all(other is not out for other in others):
            work = out
        if factor is not None:
            np.multiply(first, factor, out=work, casting="unsafe")
        elif work is not first:
            np.copyto(work, first, casting="unsafe")
        for other in others:
            if factor is not None:
                np.multiply(other, factor, out=term, casting="unsafe")
                other = term
            ufunc(work, other, out=work)
        if self.divisor is not None:
            np.true_divide(work, self.divisor, out=work, casting="unsafe")
        if work is not out:
            np.copyto(out, work, casting="unsafe")
