"""What a state dict may hold: nested dicts of NumPy arrays and :class:`Shard` slices.

A plain array is replicated (every rank holds the same array). A :class:`Shard` is this
rank's slice of a global array: the slices of the group's ranks, concatenated in
group-rank order along ``axis``, make the global array (slices may differ in length).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import numpy as np

from .layout import CheckpointError, Entry

#: dtype kinds a checkpoint stores (bool, integers, floats, complex).
SUPPORTED_KINDS = "biufc"


@dataclass
class Shard:
    """This rank's slice ``local`` of a global array sharded along ``axis``."""

    local: np.ndarray
    axis: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.local, np.ndarray):
            raise CheckpointError(f"Shard needs a NumPy array, got {type(self.local).__name__}")
        ndim = self.local.ndim
        if isinstance(self.axis, bool) or not isinstance(self.axis, (int, np.integer)) \
                or not -ndim <= self.axis < max(ndim, 1) or ndim == 0:
            raise CheckpointError(f"Shard axis {self.axis!r} is out of range for an array of "
                                  f"shape {self.local.shape}")
        self.axis = int(self.axis) % ndim


Leaf = Any  # np.ndarray or Shard
#: One entry's description, compared across ranks: (kind, shape, dtype string, axis).
Spec = Tuple[str, Tuple[int, ...], str, int]


def flatten(state: Dict[str, Any], what: str) -> List[Tuple[str, Leaf]]:
    """``[(name, leaf), ...]`` in sorted key order; nested dicts become ``a/b/c`` names."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{what}: the state must be a dict, got {type(state).__name__}")
    found: List[Tuple[str, Leaf]] = []
    _walk(state, "", found, what)
    return found


def _walk(node: Dict[str, Any], prefix: str, found: List[Tuple[str, Leaf]], what: str) -> None:
    for key in sorted(node, key=lambda k: (not isinstance(k, str), str(k))):
        if not isinstance(key, str) or not key or "/" in key or key in (".", ".."):
            raise CheckpointError(f"{what}: state key {prefix + str(key)!r} must be a non-empty "
                                  f"string without '/'")
        name = prefix + key
        value = node[key]
        if isinstance(value, dict):
            _walk(value, name + "/", found, what)
        elif isinstance(value, (np.ndarray, Shard)):
            array = value.local if isinstance(value, Shard) else value
            if array.dtype.kind not in SUPPORTED_KINDS:
                raise CheckpointError(f"{what}: entry {name!r} has dtype {array.dtype}; "
                                      f"supported are bool, integer, float and complex")
            found.append((name, value))
        else:
            raise CheckpointError(f"{what}: entry {name!r} is a {type(value).__name__}; a state "
                                  f"holds dicts, NumPy arrays and hpccomm.checkpoint.Shard")


def spec(leaf: Leaf) -> Spec:
    """The entry's description; for a Shard the axis length is this rank's own."""
    if isinstance(leaf, Shard):
        return ("shard", tuple(leaf.local.shape), leaf.local.dtype.str, leaf.axis)
    return ("replicated", tuple(leaf.shape), leaf.dtype.str, -1)


def array_of(leaf: Leaf) -> np.ndarray:
    return leaf.local if isinstance(leaf, Shard) else leaf


def agree(pg: Any, state: Dict[str, Any], what: str) -> Tuple[List[Tuple[str, Leaf]], List[Entry]]:
    """Collective: this rank's leaves and the global entries every rank agrees on.

    The ranks exchange their entries' specs (one ``all_gather_object``) and derive the same
    global shapes and slice lengths; any rank's bad state raises on every rank.
    """
    from ..objects import all_gather_object

    leaves: List[Tuple[str, Leaf]] = []
    try:
        leaves = flatten(state, what)
        mine: Any = [(name, spec(leaf)) for name, leaf in leaves]
    except CheckpointError as exc:
        mine = str(exc)
    gathered: List[Any] = [None] * pg.size()
    all_gather_object(gathered, mine, group=pg)
    for rank, specs in enumerate(gathered):
        if isinstance(specs, str):
            raise CheckpointError(f"{specs} (on rank {rank} of group '{pg.group_name}')")
    return leaves, global_entries(gathered, what)


def global_entries(gathered: List[List[Tuple[str, Spec]]], what: str) -> List[Entry]:
    """The global arrays described by every rank's specs (rank order), or a clear error."""
    names = [name for name, _ in gathered[0]]
    for rank, specs in enumerate(gathered):
        theirs = [name for name, _ in specs]
        if theirs != names:
            missing = sorted(set(names) - set(theirs))
            extra = sorted(set(theirs) - set(names))
            raise CheckpointError(f"{what}: rank {rank}'s state has other entries than rank 0's "
                                  f"(missing {missing}, extra {extra})")
    entries = []
    for index, name in enumerate(names):
        specs = [specs[index][1] for specs in gathered]
        kind, shape, dtype, axis = specs[0]
        for rank, (other_kind, other_shape, other_dtype, other_axis) in enumerate(specs):
            same_rest = (other_shape[:axis] + other_shape[axis + 1:]
                         == shape[:axis] + shape[axis + 1:]) if kind == "shard" else \
                other_shape == shape
            if (other_kind, other_dtype, other_axis) != (kind, dtype, axis) or \
                    len(other_shape) != len(shape) or not same_rest:
                raise CheckpointError(
                    f"{what}: entry {name!r} differs between rank 0 ({kind}, shape {shape}, "
                    f"dtype {dtype}, axis {axis}) and rank {rank} ({other_kind}, shape "
                    f"{other_shape}, dtype {other_dtype}, axis {other_axis})")
        if kind == "shard":
            lengths = tuple(spec_[1][axis] for spec_ in specs)
            shape = shape[:axis] + (sum(lengths),) + shape[axis + 1:]
            entries.append(Entry(name, shape, dtype, "shard", axis, lengths))
        else:
            entries.append(Entry(name, shape, dtype, "replicated", -1, ()))
    return entries
