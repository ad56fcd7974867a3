"""torch CPU tensors as the NumPy arrays hpccomm's MPI backend takes, without copies.

A contiguous CPU tensor becomes a NumPy view of its own memory (``Tensor.numpy()``), so
MPI reads and writes the tensor itself. bfloat16, which NumPy lacks, is viewed as int16
and reinterpreted as ``ml_dtypes.bfloat16`` (the MPI backend reduces it in float32). A
dtype NumPy cannot hold at all (float8, complex32) still moves bit-exactly as bytes but
cannot be reduced. A non-contiguous output is staged: the operation runs on a contiguous
copy that is copied back when it completes.

A tensor reduced again and again (a gradient, a metric) is given a lasting view
(:func:`lasting_view`): a fresh ``Tensor.numpy()`` per call costs ~1 µs of Python and,
measured, slows the MPI transfer after it by a few percent at 0.25-4 MiB.

Reduction ops arrive as torch ``ReduceOp`` objects and leave as hpccomm's
``RedOpType`` (plus the ``PREMUL_SUM`` factor, as hpccomm's ``ReduceOp``).
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from ..types import ReduceOp, RedOpType

try:  # the torch extra installs it; without it bfloat16 tensors are refused clearly
    import ml_dtypes

    _BFLOAT16: Optional[np.dtype] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BFLOAT16 = None

#: torch dtypes that ``Tensor.numpy()`` views directly.
_VIEWABLE = frozenset([
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64,
    torch.complex64, torch.complex128])

#: hpccomm's RedOpType by torch's number for it (the two enums number kinds alike).
_KINDS: Tuple[RedOpType, ...] = tuple(RedOpType)
_PREMUL = int(RedOpType.PREMUL_SUM)
_SUM, _TORCH_SUM = RedOpType.SUM, dist.ReduceOp.SUM


#: dtypes MPI reduces (bfloat16 through float32); others only move (as bytes).
REDUCIBLE = _VIEWABLE | {torch.bfloat16}


def direct_types(numpy_types: Dict[np.dtype, int]) -> Dict[torch.dtype, Tuple[int, int]]:
    """torch dtype -> ``(MPI datatype handle, itemsize)`` for the NumPy dtypes in
    ``numpy_types`` (a backend's ``direct_types``) that torch tensors view as is.

    Complex dtypes are left out: a complex tensor may carry a lazy conjugate bit, and
    summing its memory as is would be wrong wherever the ranks' bits differ (torch's
    all_reduce hands complex tensors over as real views anyway)."""
    found = {}
    for dtype in _VIEWABLE:
        if dtype.is_complex:
            continue
        as_numpy = torch.empty(0, dtype=dtype).numpy().dtype
        if as_numpy in numpy_types:
            found[dtype] = (numpy_types[as_numpy], as_numpy.itemsize)
    return found


class Unsupported(TypeError):
    """A tensor hpccomm cannot hand to MPI (the caller words the error)."""


def view(t: torch.Tensor) -> np.ndarray:
    """A NumPy array sharing ``t``'s memory (``t`` must be a contiguous CPU tensor)."""
    dtype = t.dtype
    if dtype in _VIEWABLE:
        try:
            return t.numpy()
        except RuntimeError:  # requires grad, or a lazy conjugate/negative view
            if t.is_conj() or t.is_neg():
                raise Unsupported(f"a {dtype} tensor with a lazy conjugate or negative bit "
                                  f"cannot be shared with MPI; call resolve_conj()/"
                                  f"resolve_neg() first") from None
            return t.detach().numpy()
    if t.layout is not torch.strided:
        raise Unsupported(f"{t.layout} tensors are not supported (dense tensors only)")
    if dtype is torch.bfloat16:
        if _BFLOAT16 is None:
            raise Unsupported("bfloat16 tensors need the ml_dtypes package "
                              "(pip install 'hpccomm[torch]')")
        return t.detach().view(torch.int16).numpy().view(_BFLOAT16)
    if t.dim() == 0:
        t = t.reshape(1)
    return t.detach().view(torch.uint8).numpy()  # moved as bytes; reductions refuse it


class _Memory:
    """Memory as NumPy sees it (``__array_interface__``): an array made from it owns
    nothing and keeps nothing alive."""
    __slots__ = ("__array_interface__",)


def _unowned(arr: np.ndarray) -> np.ndarray:
    """A view of ``arr``'s memory that does not keep ``arr`` (or its tensor) alive."""
    memory = _Memory()
    memory.__array_interface__ = arr.__array_interface__
    out = np.asarray(memory)
    return out if out.dtype == arr.dtype else out.view(arr.dtype)


#: What :func:`lasting_view` knows of a tensor, by ``id``: ``[weak reference, data_ptr,
#: numel, dtype, view]``; the view is made at the second sighting. An entry leaves when
#: its tensor dies.
_SEEN: Dict[int, List[Any]] = {}


def _forget(key: int) -> Callable[[Any], None]:
    def forget(_: Any) -> None:
        _SEEN.pop(key, None)
    return forget


def lasting_view(t: torch.Tensor) -> np.ndarray:
    """:func:`view` of contiguous CPU tensor ``t``, flat (for elementwise operations),
    made once per tensor and reused.

    The reused view owns nothing: the caller keeps ``t`` alive while MPI uses it. It is
    reused only while ``t`` is the same tensor object with the same memory, size and
    dtype (``set_``, ``resize_`` or ``.data =`` make a new one). Seen once, a tensor
    gets an ordinary view and a note, so tensors that live for one call (the buckets
    C++ hands over) cost a dictionary entry, not a second view."""
    key = id(t)
    seen = _SEEN.get(key)
    if seen is not None and seen[0]() is t and seen[1] == t.data_ptr() \
            and seen[2] == t.numel() and seen[3] is t.dtype:
        arr = seen[4]
        if arr is None:
            arr = seen[4] = _unowned(view(t).reshape(-1))
        return arr
    arr = view(t)
    _SEEN[key] = [weakref.ref(t, _forget(key)), t.data_ptr(), t.numel(), t.dtype, None]
    return arr


def output(t: torch.Tensor) -> Tuple[np.ndarray, Optional[Callable[[], None]]]:
    """``(array, copy_back)`` for a tensor the operation writes: its own memory when it
    is contiguous (``copy_back`` is ``None``), else a contiguous copy and the step that
    copies the result back into ``t``."""
    if t.is_contiguous():
        return view(t), None
    staged = t.contiguous()

    def copy_back() -> None:
        with torch.no_grad():
            t.copy_(staged)
    return view(staged), copy_back


def reducible(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, after checking that its dtype can be reduced (not moved as bytes)."""
    if t.dtype not in REDUCIBLE:
        raise Unsupported(f"{t.dtype} tensors can be moved but not reduced")
    return t


def inputs(t: torch.Tensor) -> np.ndarray:
    """The array for a tensor the operation only reads (copied if not contiguous)."""
    return view(t if t.is_contiguous() else t.contiguous())


def reduce_op(op: Any) -> Any:
    """hpccomm's form of a torch reduction (a ``ReduceOp`` or its ``RedOpType``): a
    ``RedOpType``, or a ``ReduceOp`` with the ``PREMUL_SUM`` factor (a Python number or
    a one-element CPU tensor)."""
    if op == _TORCH_SUM:  # the common case, one C++ comparison
        return _SUM
    try:
        number = op.op.value
    except AttributeError:  # a bare RedOpType
        number = op.value
    if number != _PREMUL:
        return _KINDS[number]
    factor = op.__getstate__()[1]
    if isinstance(factor, torch.Tensor):
        factor = factor.detach().cpu().reshape(-1)[0].item()
    return ReduceOp(RedOpType.PREMUL_SUM, factor)


_UNSET = dist.AllreduceOptions().timeout  # torch's "no timeout given": -1 ms


def timeout_of(opts: Any) -> Optional[float]:
    """The per-operation timeout in seconds from torch's options, or ``None`` when unset
    (torch marks "unset" with -1 ms; zero means the same for a ``wait``)."""
    timeout = opts.timeout
    if timeout == _UNSET:
        return None
    seconds = timeout.total_seconds()
    return seconds if seconds > 0 else None
