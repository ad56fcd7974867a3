"""Handing a survivor's state to the ranks that just joined, in memory.

After :func:`hpccomm.grow_group` the newcomers have a freshly built model and nothing
else. :func:`hand_over` sends them one rank's state (a module's and an optimizer's
``state_dict``, or any nested dicts and lists of NumPy arrays, torch tensors and
picklable values) straight from that rank's memory: the structure goes as one pickled
object, each array as one broadcast of its bytes (no pickling of the data), over a
group of the sender and the receivers only. Where the state holds this rank's shard of
a sharded array (:class:`~hpccomm.checkpoint.Shard`) no survivor has the dead rank's
shard in memory, so every rank loads it from the checkpoint on disk (``fallback``),
which is also the way out when the transfer itself fails.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from ..collectives import all_reduce, broadcast
from ..errors import DistError, DistValueError
from ..fault import newcomers
from ..group import destroy, new_group, resolve
from ..objects import broadcast_object_list
from ..types import ReduceOp
from .reader import load
from .state import Shard

#: A leaf sent as bytes: (kind, dtype name, shape, index into the list of buffers).
_ARRAY = "__hpccomm_array__"


def hand_over(state: Any, *, src: int = 0, to: Optional[Sequence[int]] = None,
              group: Any = None, fallback: Optional[str] = None) -> Any:
    """Rank ``src``'s ``state`` on the ranks ``to`` (default: the newcomers of the last
    ``grow_group``), returned there; other ranks get their own ``state`` back.

    Every rank of ``group`` (default: the default group) calls it; only ``src`` and the
    receivers communicate. Torch tensors arrive as CPU tensors of the same dtype and
    shape, NumPy arrays as arrays: load them with ``module.load_state_dict`` and
    ``optimizer.load_state_dict``. With ``fallback`` (the path of an hpccomm
    checkpoint of the same state, :func:`hpccomm.checkpoint.save`), a state holding
    :class:`Shard` leaves, or a transfer that failed on any rank, is loaded from the
    checkpoint instead, on every rank of ``group``, into ``state`` (filled in place, as
    :func:`hpccomm.checkpoint.load` does), which is returned.
    """
    pg = resolve(group, "hand_over")
    receivers = sorted(set(newcomers() if to is None else to))
    if src in receivers:
        raise pg.error("hand_over", f"src {src} is also among the receivers {receivers}")
    for rank in [src] + receivers:
        pg.group_rank(rank, "hand_over", "rank")
    if fallback is not None and _has_shards(state):
        load(state, fallback, group=pg)
        return state
    if not receivers:
        return state
    failed = 0
    got = state
    try:
        got = _transfer(pg, state, src, receivers)
    except DistError:
        if fallback is None:
            raise
        failed = 1
    if fallback is not None:
        flag = np.array([failed], dtype=np.int32)
        all_reduce(flag, op=ReduceOp.MAX, group=pg)
        if flag[0]:
            load(state, fallback, group=pg)
            return state
    return got


def _has_shards(state: Any) -> bool:
    if isinstance(state, Shard):
        return True
    if isinstance(state, dict):
        return any(_has_shards(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return any(_has_shards(v) for v in state)
    return False


def _transfer(pg: Any, state: Any, src: int, receivers: List[int]) -> Any:
    me = pg.ranks[pg.rank()]
    if me != src and me not in receivers:
        return state
    members = sorted([src] + receivers)
    sub = new_group(members, use_local_synchronization=True, group_desc="hand_over")
    try:
        if me == src:
            buffers: List[np.ndarray] = []
            skeleton = pack(state, buffers)
            broadcast_object_list([skeleton], src=src, group=sub)
            for buffer in buffers:
                broadcast(buffer, src=src, group=sub)
            return state
        holder: List[Any] = [None]
        broadcast_object_list(holder, src=src, group=sub)
        arrays = buffers_for(holder[0])
        for buffer in arrays:
            broadcast(buffer, src=src, group=sub)
        return unpack(holder[0], arrays)
    finally:
        destroy(sub)


def pack(node: Any, buffers: List[np.ndarray]) -> Any:
    """``node`` with each array leaf (NumPy array, torch tensor) replaced by its spec,
    the skeleton that :func:`buffers_for` and :func:`unpack` read; the arrays (a
    tensor's as its bytes) appended to ``buffers``."""
    if isinstance(node, dict):
        return {key: pack(value, buffers) for key, value in node.items()}
    if isinstance(node, list):
        return [pack(value, buffers) for value in node]
    if isinstance(node, tuple):
        return tuple(pack(value, buffers) for value in node)
    if isinstance(node, np.ndarray):
        buffers.append(np.ascontiguousarray(node))
        return (_ARRAY, "numpy", node.dtype.str, node.shape, node.nbytes)
    if type(node).__module__.startswith("torch") and hasattr(node, "untyped_storage"):
        tensor = node.detach().cpu().contiguous()
        raw = tensor.reshape(-1).view(_torch().uint8).numpy() if tensor.numel() else \
            np.empty(0, dtype=np.uint8)
        buffers.append(raw)
        return (_ARRAY, "torch", str(tensor.dtype).replace("torch.", ""),
                tuple(tensor.shape), raw.nbytes)
    return node


def _is_spec(node: Any) -> bool:
    return isinstance(node, tuple) and len(node) == 5 and node[0] == _ARRAY


def buffers_for(skeleton: Any) -> List[np.ndarray]:
    """Empty arrays to receive the arrays of a skeleton :func:`pack` made, in order."""
    specs: List[Any] = []
    _collect(skeleton, specs)
    return [np.empty(nbytes, dtype=np.uint8) if kind == "torch" else
            np.empty(shape, dtype=np.dtype(dtype)) for kind, dtype, shape, nbytes in specs]


def _collect(node: Any, specs: List[Any]) -> None:
    if _is_spec(node):
        specs.append(node[1:])
    elif isinstance(node, dict):
        for value in node.values():
            _collect(value, specs)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _collect(value, specs)


def unpack(node: Any, arrays: List[np.ndarray]) -> Any:
    """The skeleton with each spec replaced by its array of ``arrays``, in order (a torch
    tensor made again, sharing the array's memory)."""
    position = [0]

    def walk(item: Any) -> Any:
        if _is_spec(item):
            _, kind, dtype, shape, _ = item
            array = arrays[position[0]]
            position[0] += 1
            if kind == "numpy":
                return array
            torch = _torch()
            return torch.from_numpy(array).view(getattr(torch, dtype)).reshape(shape)
        if isinstance(item, dict):
            return {key: walk(value) for key, value in item.items()}
        if isinstance(item, list):
            return [walk(value) for value in item]
        if isinstance(item, tuple):
            return tuple(walk(value) for value in item)
        return item
    return walk(node)


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # a torch state was sent to a rank without torch
        raise DistValueError("hpccomm.checkpoint.hand_over: the state holds torch tensors, "
                             "and torch does not import on this rank") from exc
    return torch

