"""How the NCCL backend reduces each (dtype, op): NCCL type and op, views and fix-ups.

NCCL has no complex, bool, int16 or bitwise reductions, and ``ncclAvg`` only from 2.10;
:func:`make_plan` says how to get torch's result anyway (see ``nccl.py``). Pure Python
over the ``cupy.cuda.nccl`` constants, so it is testable without a GPU.
"""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Sequence

import numpy as np

from ...errors import DistBackendError
from ...types import RedOpType
from . import device as _cuda

class Plan(NamedTuple):
    """How to reduce one (dtype, op): mode, NCCL type and op, views and fix-ups."""

    mode: str            # "native", "stage" (reduce in a wider dtype) or "gather"
    nccl_type: int
    nccl_op: int
    unit: Any            # dtype whose elements NCCL counts (float32 for complex64...)
    stage: Any           # dtype reduced in, for "stage"
    divide: bool         # AVG as a sum, divided afterwards


_AVG = RedOpType.AVG
_BITWISE = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)
#: The CuPy ufunc that combines two partial results of each reduction.
UFUNC = {RedOpType.SUM: "add", RedOpType.AVG: "add", RedOpType.PREMUL_SUM: "add",
         RedOpType.PRODUCT: "multiply", RedOpType.MIN: "minimum", RedOpType.MAX: "maximum",
         RedOpType.BAND: "bitwise_and", RedOpType.BOR: "bitwise_or",
         RedOpType.BXOR: "bitwise_xor"}


def make_plan(nccl: Any, dtype: Any, kind: RedOpType, has_avg: bool) -> Plan:
    """The reduction plan for ``dtype`` and ``kind`` given the ``cupy.cuda.nccl`` module."""
    ops = {RedOpType.SUM: nccl.NCCL_SUM, RedOpType.PRODUCT: nccl.NCCL_PROD,
           RedOpType.MIN: nccl.NCCL_MIN, RedOpType.MAX: nccl.NCCL_MAX,
           RedOpType.PREMUL_SUM: nccl.NCCL_SUM}
    gather = Plan("gather", nccl.NCCL_INT8, nccl.NCCL_SUM, np.dtype(np.uint8), None, False)
    if dtype.kind == "b":
        if kind == RedOpType.BXOR:
            return gather
        up = kind in (RedOpType.SUM, RedOpType.MAX, RedOpType.BOR)
        return Plan("native", nccl.NCCL_UINT8, nccl.NCCL_MAX if up else nccl.NCCL_MIN,
                    np.dtype(np.uint8), None, False)
    if kind in _BITWISE or (dtype.kind == "c" and kind == RedOpType.PRODUCT):
        return gather
    if kind == _AVG:
        avg = getattr(nccl, "NCCL_AVG", None) if has_avg else None
        nop, divide = (avg, False) if avg is not None else (nccl.NCCL_SUM, True)
    else:
        nop, divide = ops[kind], False
    if _cuda.is_bfloat16(dtype):
        bf16 = getattr(nccl, "NCCL_BFLOAT16", None)
        if bf16 is None or divide:
            raise DistBackendError("bfloat16 reductions need NCCL >= 2.10 and a CuPy that "
                                   "exposes NCCL_BFLOAT16")
        return Plan("native", bf16, nop, dtype, None, False)
    if dtype in (np.dtype(np.int16), np.dtype(np.uint16)):
        stage = np.dtype(np.int32 if dtype.kind == "i" else np.uint32)
        return Plan("stage", _TYPES(nccl)[stage], nop, stage, stage, divide)
    unit = np.dtype(dtype.char.lower()) if dtype.kind == "c" else dtype
    ntype = _TYPES(nccl).get(unit)
    if ntype is None:
        raise DistBackendError(f"NCCL cannot reduce dtype {dtype}")
    return Plan("native", ntype, nop, unit, None, divide)


def _TYPES(nccl: Any) -> Dict[Any, int]:
    return {np.dtype(np.int8): nccl.NCCL_INT8, np.dtype(np.uint8): nccl.NCCL_UINT8,
            np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.uint32): nccl.NCCL_UINT32,
            np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.uint64): nccl.NCCL_UINT64,
            np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.float32): nccl.NCCL_FLOAT32,
            np.dtype(np.float64): nccl.NCCL_FLOAT64}


def offsets(counts: Sequence[int]) -> List[int]:
    """Start of each block given block sizes."""
    out, total = [], 0
    for count in counts:
        out.append(total)
        total += count
    return out
