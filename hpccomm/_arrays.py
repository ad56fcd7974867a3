"""Arrays as hpccomm sees them: where they live, which dtypes and ops make sense.

NumPy arrays are CPU tensors and CuPy arrays CUDA tensors. Anything else that exports
DLPack (a torch CPU tensor) or the buffer protocol is viewed as a NumPy array without a
copy, so writes land in the caller's memory exactly as torch writes into a tensor.
CuPy is recognised by its type's module, never imported here.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from .types import RedOpType

ndarray = np.ndarray

#: dtype -> family: "bool", "int", "float", "complex", or "bfloat16" (ml_dtypes, added
#: when first seen). The dispatch path tests ``dtype in FAMILY`` before anything slower.
FAMILY: Dict[Any, str] = {}
for _char in "bBhHiIlLqQ":
    FAMILY[np.dtype(_char)] = "int"
for _char in "efd":
    FAMILY[np.dtype(_char)] = "float"
for _char in "FD":
    FAMILY[np.dtype(_char)] = "complex"
FAMILY[np.dtype("?")] = "bool"

SUPPORTED_DTYPES = ("bool, int8/16/32/64, uint8/16/32/64, float16/32/64, complex64/128, "
                    "bfloat16 (ml_dtypes)")


def dtype_family(dtype: Any) -> Optional[str]:
    """The family of a dtype, or ``None`` if hpccomm cannot communicate it."""
    family = FAMILY.get(dtype)
    if family is None and getattr(dtype, "name", "") == "bfloat16":
        family = FAMILY[dtype] = "bfloat16"
    return family


# Which op kinds are defined for which families; an undefined pair is a clear error.
_OPS_FOR = {
    "bool": {RedOpType.SUM, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX,
             RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR},
    "int": {RedOpType.SUM, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX,
            RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR},
    "float": {RedOpType.SUM, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX,
              RedOpType.AVG, RedOpType.PREMUL_SUM},
    "bfloat16": {RedOpType.SUM, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX,
                 RedOpType.AVG, RedOpType.PREMUL_SUM},
    # torch's denylist for complex tensors: MAX, MIN, PRODUCT and the bitwise ops
    "complex": {RedOpType.SUM, RedOpType.AVG, RedOpType.PREMUL_SUM},
}


def reduce_problem(kind: RedOpType, dtype: Any) -> Optional[str]:
    """Why ``kind`` cannot reduce ``dtype``, or ``None`` if it can."""
    family = dtype_family(dtype)
    if family is None:
        return f"dtype {dtype} is not supported (supported: {SUPPORTED_DTYPES})"
    if kind not in _OPS_FOR[family]:
        if kind in (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR) and family != "complex":
            return f"bitwise op {kind.name} needs an integer or bool dtype, not {dtype}"
        if kind in (RedOpType.AVG, RedOpType.PREMUL_SUM):
            return f"{kind.name} needs a floating or complex dtype, not {dtype}"
        if family == "complex":
            return (f"{kind.name} is not supported on complex tensors (dtype {dtype}); "
                    f"SUM, AVG and PREMUL_SUM are")
        return f"op {kind.name} is not supported for dtype {dtype}"
    return None


def device_of(x: Any) -> str:
    """``"cuda"`` for a CuPy array (or a CUDA tensor), ``"cpu"`` otherwise."""
    if type(x) is ndarray:
        return "cpu"
    module = type(x).__module__
    if module.startswith("cupy"):
        return "cuda"
    device = getattr(x, "device", None)
    if device is not None and getattr(device, "type", None) == "cuda":
        return "cuda"
    return "cpu"


def as_array(x: Any) -> Any:
    """``x`` as an array the backends accept: itself if NumPy/CuPy, else a zero-copy view.

    Raises ``TypeError`` for objects that are neither arrays, DLPack exporters nor
    buffers, and for CUDA tensors of other libraries (pass a CuPy view instead).
    """
    if type(x) is ndarray:
        return x
    if isinstance(x, ndarray):
        return x
    module = type(x).__module__
    if module.startswith("cupy"):
        return x
    if device_of(x) == "cuda":
        import cupy  # only reached for a CUDA tensor of another library

        return cupy.from_dlpack(x)
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError) as exc:
            raise TypeError(f"cannot view {type(x).__name__} as a NumPy array via DLPack: "
                            f"{exc}") from exc
    try:
        view = memoryview(x)
    except TypeError:
        raise TypeError(f"expected a NumPy or CuPy array (or an object exporting DLPack "
                        f"or the buffer protocol), got {type(x).__name__}") from None
    return np.asarray(view)


def is_writable(arr: Any) -> bool:
    """Whether results may be written into ``arr`` (CuPy arrays always are)."""
    flags = getattr(arr, "flags", None)
    return bool(getattr(flags, "writeable", True)) if flags is not None else True


def rows_and_row_size(arr: Any) -> Tuple[int, int]:
    """``(len(arr), elements per row)``, treating a 0-d array as one row of one."""
    if arr.ndim == 0:
        return 1, 1
    rows = arr.shape[0]
    return rows, (arr.size // rows if rows else int(np.prod(arr.shape[1:], dtype=np.int64)))
