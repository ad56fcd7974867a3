"""Collective operations on arrays, with torch.distributed's names and semantics.

Each function resolves its group, validates its arguments once through :mod:`._call`,
and starts one nonblocking backend operation. With ``async_op=True`` it returns the
:class:`~hpccomm.work.Work`; otherwise it waits (under the group's timeout) and returns
``None``; a synchronous call first tries the backends' whole-call channels: the
shared-memory small channel (``_call.small``) for NumPy arrays, the CUDA backend's
stream channel (``_call.stream``) for CuPy arrays. Results are written into the
caller's arrays exactly where torch writes into tensors. ``src``/``dst`` are global
ranks; ``group_src``/``group_dst`` are group ranks.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from . import _call
from ._arrays import dtype_family
from ._call import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BARRIER, BROADCAST, REDUCE,
                    REDUCE_SCATTER)
from .group import GroupLike
from .types import ReduceOp, timeout_seconds
from .work import Work

_SUM = ReduceOp.SUM


def broadcast(tensor: Any, src: Optional[int] = None, group: GroupLike = None,
              async_op: bool = False, group_src: Optional[int] = None) -> Optional[Work]:
    """Copy ``tensor`` of rank ``src`` into ``tensor`` on every rank of the group.

    ``src`` (global) or ``group_src`` is required, as in torch 2.13.
    """
    # positional: a keyword argument costs every call tens of nanoseconds (CPython 3.11)
    rooted = _call.rooted(group, "broadcast", src, group_src, "src", True)
    if rooted is None:
        return None
    pg, root = rooted
    if not async_op and (_call.small(pg, "broadcast", BROADCAST, tensor, tensor, 0, root) or
                         _call.stream(pg, "broadcast", BROADCAST, tensor, tensor, 0, root)):
        return None
    comm, arr = _call.array(pg, "broadcast", tensor)
    return _call.launch(pg, "broadcast", comm.broadcast, (arr, root), arr, async_op, root,
                        result=(tensor,))


def all_reduce(tensor: Any, op: Any = _SUM, group: GroupLike = None,
               async_op: bool = False) -> Optional[Work]:
    """Reduce ``tensor`` over the group; every rank gets the result in ``tensor``."""
    pg = _call.member(group, "all_reduce")
    if pg is None:
        return None
    if not async_op and (_call.small(pg, "all_reduce", ALL_REDUCE, tensor, tensor, op) or
                         _call.stream(pg, "all_reduce", ALL_REDUCE, tensor, tensor, op)):
        return None
    comm, arr, kind, factor = _call.reduce_operand(pg, "all_reduce", tensor, op)
    return _call.launch(pg, "all_reduce", comm.all_reduce, (arr, kind, factor), arr,
                        async_op, result=(tensor,))


def reduce(tensor: Any, dst: Optional[int] = None, op: Any = _SUM, group: GroupLike = None,
           async_op: bool = False, group_dst: Optional[int] = None) -> Optional[Work]:
    """Reduce ``tensor`` over the group into ``tensor`` of rank ``dst`` only.

    ``dst`` (global) or ``group_dst`` is required, as in torch 2.13.
    """
    # positional: a keyword argument costs every call tens of nanoseconds (CPython 3.11)
    rooted = _call.rooted(group, "reduce", dst, group_dst, "dst", True)
    if rooted is None:
        return None
    pg, root = rooted
    at_root = pg.rank() == root
    if not async_op and _call.stream(pg, "reduce", REDUCE, tensor, tensor, op, root):
        return None
    comm, arr, kind, factor = _call.reduce_operand(pg, "reduce", tensor, op, output=at_root)
    return _call.launch(pg, "reduce", comm.reduce, (arr, kind, factor, root), arr,
                        async_op, root, result=(tensor,))


def _array_list(pg, op: str, comm, dtype, tensors: Sequence[Any], what: str,
                output: bool = True) -> List[Any]:
    """Validate a per-rank list of arrays (one per rank, same device, and dtype ``dtype``
    unless it is ``None``: then :func:`_same_real_dtype` checks the dtypes).

    Output lists are written through a staging buffer (:func:`._call.scatter_into`), so,
    as in torch, their arrays may be non-contiguous views.
    """
    arrays = []
    for index, tensor in enumerate(_call.count_list(pg, op, tensors, what)):
        if output and type(tensor) is np.ndarray and not tensor.flags.c_contiguous:
            item_comm, arr = pg.cpu, _strided_output(pg, op, tensor, f"{what}[{index}]")
        else:
            item_comm, arr = _call.array(pg, op, tensor, f"{what}[{index}]", output=output)
        _call.same_device(pg, op, comm, item_comm, f"{what}[{index}]")
        if dtype is not None:
            _call.same_dtype(pg, op, dtype, arr, f"{what}[{index}]")
        arrays.append(arr)
    return arrays


#: Complex dtype -> its element type: torch views complex tensors as real ones, so a
#: complex array may meet arrays of its element type in one operation.
_REAL_OF = {np.dtype(np.complex64): np.dtype(np.float32),
            np.dtype(np.complex128): np.dtype(np.float64)}


def _same_real_dtype(arr: Any, arrays: List[Any], pg, op: str, what: str):
    """``(arr, arrays)`` with complex arrays viewed as their element type, as torch views
    complex tensors as real ones (so complex and real arrays of that type may meet, on one
    rank or across ranks), after checking that they all share one dtype."""
    if arr.dtype in _REAL_OF:
        arr = _as_real(arr)
    dtype = arr.dtype
    for index, item in enumerate(arrays):
        if item.dtype is not dtype and item.dtype != dtype:
            if item.dtype in _REAL_OF and _REAL_OF[item.dtype] == dtype:
                arrays[index] = _as_real(item)
                continue
            raise pg.error(op, f"tensors with different dtypes: {what}[{index}] has dtype "
                               f"{item.dtype}, expected {dtype} (all arrays of one "
                               f"operation share a dtype; complex ones count as their "
                               f"element type)")
    return arr, arrays


def _as_real(arr: Any) -> Any:
    """A contiguous complex array as a flat view of its real and imaginary parts, else
    the array itself."""
    real = _REAL_OF.get(arr.dtype)
    if real is None or not arr.flags.c_contiguous:
        return arr
    return arr.reshape(-1).view(real)


def _strided_output(pg, op: str, arr: np.ndarray, what: str) -> np.ndarray:
    """A non-contiguous NumPy output array, after the checks :func:`_call.array` makes:
    it is written from the staging buffer, never handed to MPI, so any layout works."""
    if not arr.flags.writeable:
        raise pg.error(op, f"{what} is read-only, but results are written into it")
    if dtype_family(arr.dtype) is None:
        raise pg.error(op, f"{what} has dtype {arr.dtype}, which cannot be communicated")
    return arr


def all_gather(tensor_list: List[Any], tensor: Any, group: GroupLike = None,
               async_op: bool = False) -> Optional[Work]:
    """Gather every rank's ``tensor`` into ``tensor_list`` on every rank (sizes may differ)."""
    op = "all_gather"
    pg = _call.member(group, op)
    if pg is None:
        return None
    comm, arr = _call.array(pg, op, tensor, output=False)
    _call.uncaptured(pg, op, comm, "all_gather_into_tensor")
    arr, outputs = _same_real_dtype(arr, _array_list(pg, op, comm, None, tensor_list,
                                                     "tensor_list"), pg, op, "tensor_list")
    counts = [out.size for out in outputs]
    if counts[pg.rank()] != arr.size:
        raise pg.error(op, f"tensor has {arr.size} elements but tensor_list[{pg.rank()}] "
                           f"has {counts[pg.rank()]}")
    staging = _call.empty(arr, sum(counts))
    return _call.launch(pg, op, comm.all_gather, (arr.reshape(-1), staging,
                        _call.uneven_counts(counts)), arr, async_op, result=tuple(tensor_list),
                        after=_call.scatter_into(staging, outputs), keep=staging)


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: GroupLike = None,
                           async_op: bool = False) -> Optional[Work]:
    """Concatenate every rank's ``input_tensor`` into ``output_tensor`` (rank order).

    If ``input_tensor`` is this rank's block of ``output_tensor`` (a view), the gather runs
    in place (``MPI_IN_PLACE``) with no extra copy.
    """
    op = "all_gather_into_tensor"
    pg = _call.member(group, op)
    if pg is None:
        return None
    if not async_op and (_call.small(pg, op, ALL_GATHER, input_tensor, output_tensor) or
                         _call.stream(pg, op, ALL_GATHER, input_tensor, output_tensor)):
        return None
    comm, out, arr = _call.pair(pg, op, output_tensor, input_tensor, "output_tensor",
                                "input_tensor")
    size = pg.size()
    if out.size != arr.size * size:
        raise pg.error(op, f"output_tensor has {out.size} elements, expected "
                           f"{size} x {arr.size} (group size x input size)")
    send = _call.apart(arr, out, pg.rank(), comm, pg, op)  # None: in place
    return _call.launch(pg, op, comm.all_gather, (send, out, None), arr, async_op,
                        result=(output_tensor,))


def gather(tensor: Any, gather_list: Optional[List[Any]] = None, dst: Optional[int] = None,
           group: GroupLike = None, async_op: bool = False,
           group_dst: Optional[int] = None) -> Optional[Work]:
    """Gather every rank's ``tensor`` into ``gather_list`` on rank ``dst``.

    With neither ``dst`` nor ``group_dst``, the destination is global rank 0 (torch).
    """
    op = "gather"
    rooted = _call.rooted(group, op, dst, group_dst, "dst", default=0, checked_outside=False)
    if rooted is None:
        return None
    pg, root = rooted
    at_root = pg.rank() == root
    comm, arr = _call.array(pg, op, tensor, output=False)
    _call.uncaptured(pg, op, comm, "all_gather_into_tensor")
    arr = _as_real(arr)
    if not at_root:
        if gather_list:
            raise pg.error(op, "gather_list must be None or empty on ranks other than dst")
        return _call.launch(pg, op, comm.gather, (arr.reshape(-1), None, root, []), arr,
                            async_op, root)
    if not gather_list:
        raise pg.error(op, "gather_list is required on the destination rank")
    arr, outputs = _same_real_dtype(arr, _array_list(pg, op, comm, None, gather_list,
                                                     "gather_list"), pg, op, "gather_list")
    counts = [out.size for out in outputs]
    if counts[root] != arr.size:
        raise pg.error(op, f"tensor has {arr.size} elements but gather_list[{root}] has "
                           f"{counts[root]}")
    staging = _call.empty(arr, sum(counts))
    return _call.launch(pg, op, comm.gather, (arr.reshape(-1), staging, root, counts), arr,
                        async_op, root, result=tuple(gather_list),
                        after=_call.scatter_into(staging, outputs), keep=staging)


def gather_single(tensor: Any, gather_tensor: Any = None, dst: Optional[int] = None,
                  group: GroupLike = None, async_op: bool = False,
                  group_dst: Optional[int] = None) -> Optional[Work]:
    """Gather every rank's ``tensor`` into the one array ``gather_tensor`` on rank
    ``dst``, in rank order (group size x ``tensor``'s elements; a flat or a stacked
    shape); ``gather_tensor`` is needed and used on ``dst`` only.

    With neither ``dst`` nor ``group_dst``, the destination is global rank 0 (torch).
    """
    op = "gather_single"
    rooted = _call.rooted(group, op, dst, group_dst, "dst", default=0, checked_outside=False)
    if rooted is None:
        return None
    pg, root = rooted
    comm, arr = _call.array(pg, op, tensor, output=False)
    _call.uncaptured(pg, op, comm, "all_gather_into_tensor")
    if pg.rank() != root:
        return _call.launch(pg, op, comm.gather, (arr.reshape(-1), None, root, None), arr,
                            async_op, root)
    if gather_tensor is None:
        raise pg.error(op, "gather_tensor must be specified on the destination rank")
    comm, out, arr = _call.pair(pg, op, gather_tensor, tensor, "gather_tensor", "tensor")
    if out.size != arr.size * pg.size():
        raise pg.error(op, f"gather_tensor has {out.size} elements, expected {pg.size()} x "
                           f"{arr.size} (group size x tensor size)")
    send = _call.apart(arr, out, None, comm, pg, op)
    return _call.launch(pg, op, comm.gather, (send.reshape(-1), out.reshape(-1), root, None),
                        arr, async_op, root, result=(gather_tensor,))


def scatter(tensor: Any, scatter_list: Optional[List[Any]] = None, src: Optional[int] = None,
            group: GroupLike = None, async_op: bool = False,
            group_src: Optional[int] = None) -> Optional[Work]:
    """Give entry ``i`` of ``scatter_list`` on rank ``src`` to ``tensor`` of group rank ``i``.

    With neither ``src`` nor ``group_src``, the source is global rank 0 (torch).
    """
    op = "scatter"
    rooted = _call.rooted(group, op, src, group_src, "src", default=0)
    if rooted is None:
        return None
    pg, root = rooted
    at_root = pg.rank() == root
    comm, out = _call.array(pg, op, tensor)
    _call.uncaptured(pg, op, comm, "broadcast, or all_to_all_single")
    out = _as_real(out)
    if not at_root:
        if scatter_list:
            raise pg.error(op, "scatter_list must be None or empty on ranks other than src")
        return _call.launch(pg, op, comm.scatter, (None, out.reshape(-1), root, []), out,
                            async_op, root, result=(tensor,))
    if not scatter_list:
        raise pg.error(op, "scatter_list is required on the source rank")
    out, inputs = _same_real_dtype(out, _array_list(pg, op, comm, None, scatter_list,
                                                    "scatter_list", output=False),
                                   pg, op, "scatter_list")
    counts = [arr.size for arr in inputs]
    if counts[root] != out.size:
        raise pg.error(op, f"tensor has {out.size} elements but scatter_list[{root}] has "
                           f"{counts[root]}")
    staging = _call.concatenate(inputs, out)
    return _call.launch(pg, op, comm.scatter, (staging, out.reshape(-1), root, counts), out,
                        async_op, root, result=(tensor,), keep=staging)


def reduce_scatter(output: Any, input_list: List[Any], op: Any = _SUM, group: GroupLike = None,
                   async_op: bool = False) -> Optional[Work]:
    """Reduce ``input_list`` element-wise over ranks; rank ``i`` gets entry ``i`` in ``output``."""
    name = "reduce_scatter"
    pg = _call.member(group, name)
    if pg is None:
        return None
    comm, out = _call.array(pg, name, output, "output")
    _call.uncaptured(pg, name, comm, "reduce_scatter_tensor")
    inputs = _array_list(pg, name, comm, None, input_list, "input_list", output=False)
    complex_dtype = next((a.dtype for a in [out, *inputs] if a.dtype in _REAL_OF), out.dtype)
    kind, factor = _call.reduction(pg, name, op, complex_dtype)  # complex: SUM/AVG only
    out, inputs = _same_real_dtype(out, inputs, pg, name, "input_list")
    counts = [arr.size for arr in inputs]
    if counts[pg.rank()] != out.size:
        raise pg.error(name, f"output has {out.size} elements but input_list[{pg.rank()}] "
                             f"has {counts[pg.rank()]}")
    staging = _call.concatenate(inputs, out)
    return _call.launch(pg, name, comm.reduce_scatter,
                        (staging, out.reshape(-1), kind, factor, _call.uneven_counts(counts)),
                        out, async_op, result=(output,), keep=staging)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = _SUM, group: GroupLike = None,
                          async_op: bool = False) -> Optional[Work]:
    """Reduce ``input`` over ranks; rank ``i`` gets block ``i`` of the result in ``output``."""
    name = "reduce_scatter_tensor"
    pg = _call.member(group, name)
    if pg is None:
        return None
    if not async_op and (_call.small(pg, name, REDUCE_SCATTER, input, output, op) or
                         _call.stream(pg, name, REDUCE_SCATTER, input, output, op)):
        return None
    comm, out, arr = _call.pair(pg, name, output, input, "output", "input")
    if arr.size != out.size * pg.size():
        raise pg.error(name, f"input has {arr.size} elements, expected {pg.size()} x "
                             f"{out.size} (group size x output size)")
    kind, factor = _call.reduction(pg, name, op, out.dtype)
    arr = _call.apart(arr, out, None, comm, pg, name)  # e.g. output is a block of input
    return _call.launch(pg, name, comm.reduce_scatter, (arr, out, kind, factor, None), arr,
                        async_op, result=(output,))


def all_to_all_single(output: Any, input: Any, output_split_sizes: Optional[List[int]] = None,
                      input_split_sizes: Optional[List[int]] = None, group: GroupLike = None,
                      async_op: bool = False) -> Optional[Work]:
    """Split ``input`` along dim 0, send block ``j`` to rank ``j``, gather into ``output``.

    Without split sizes the blocks are equal (``MPI_Alltoall``); with them,
    ``MPI_Alltoallv``. All ranks must pass split sizes, or none.
    """
    name = "all_to_all_single"
    pg = _call.member(group, name)
    if pg is None:
        return None
    if (not async_op and output_split_sizes is None and input_split_sizes is None and
            (_call.small(pg, name, ALL_TO_ALL, input, output) or
             _call.stream(pg, name, ALL_TO_ALL, input, output))):
        return None
    comm, out, arr = _call.pair(pg, name, output, input, "output", "input")
    arr = _call.apart(arr, out, None, comm, pg, name)  # in place: output is input
    if output_split_sizes is None and input_split_sizes is None:
        if arr.size != out.size or arr.size % pg.size():
            raise pg.error(name, f"input ({arr.size} elements) and output ({out.size}) must "
                                 f"have equal sizes divisible by the group size {pg.size()}")
        args = (arr, out, None, None)
    else:
        args = (arr, out, _call.split_counts(pg, name, arr, input_split_sizes, "input"),
                _call.split_counts(pg, name, out, output_split_sizes, "output"))
    return _call.launch(pg, name, comm.all_to_all, args, arr, async_op, result=(output,))


def all_to_all(output_tensor_list: List[Any], input_tensor_list: List[Any],
               group: GroupLike = None, async_op: bool = False) -> Optional[Work]:
    """Send ``input_tensor_list[j]`` to rank ``j``; receive rank ``j``'s into ``output[j]``."""
    name = "all_to_all"
    pg = _call.member(group, name)
    if pg is None:
        return None
    first_raw = _call.count_list(pg, name, input_tensor_list, "input_tensor_list")[0]
    comm, first = _call.array(pg, name, first_raw, "input_tensor_list[0]", output=False)
    _call.uncaptured(pg, name, comm, "all_to_all_single")
    inputs = _array_list(pg, name, comm, None, input_tensor_list, "input_tensor_list",
                         output=False)
    outputs = _array_list(pg, name, comm, None, output_tensor_list, "output_tensor_list")
    first, both = _same_real_dtype(inputs[0], inputs + outputs, pg, name,
                                   "(input_tensor_list + output_tensor_list)")
    inputs, outputs = both[:len(inputs)], both[len(inputs):]
    staging_in = _call.concatenate(inputs, inputs[0])
    staging_out = _call.empty(first, sum(out.size for out in outputs))
    return _call.launch(pg, name, comm.all_to_all,
                        (staging_in, staging_out, [a.size for a in inputs],
                         [o.size for o in outputs]), first, async_op,
                        result=tuple(output_tensor_list),
                        after=_call.scatter_into(staging_out, outputs),
                        keep=(staging_in, staging_out))


def barrier(group: GroupLike = None, async_op: bool = False, device_ids: Any = None,
            timeout: Any = None) -> Optional[Work]:
    """Return once every rank of the group has entered the barrier (or raise on timeout).

    As in torch, the barrier first waits for the group's earlier async collectives, so
    their results are in place when it returns, whether or not their Work was kept.
    """
    pg = _call.member(group, "barrier")
    if pg is None:
        return None
    if pg.pending:
        pg.finish_pending()
    if not async_op and timeout is None and _call.small(pg, "barrier", BARRIER, None, None):
        return None
    return _call.launch(pg, "barrier", pg.cpu.barrier, (), None, async_op,
                        timeout=timeout_seconds(timeout))


#: torch's names for the ``_tensor`` collectives: 2.13 deprecates ``all_gather_into_tensor``
#: and ``reduce_scatter_tensor`` for the ``_single`` ones, 2.14 ``gather_into_tensor``.
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor
gather_into_tensor = gather_single
