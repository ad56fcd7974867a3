"""Layout arithmetic for DeviceMesh: which ranks a mesh dimension groups together.

A root mesh keeps its ranks as one flat array (its *rank map*, row-major). Every mesh
dimension, sliced, flattened or unflattened, is a *layout* over positions in that
array: a tuple of ``(size, stride)`` pairs, outermost first, enumerated row-major (the
first pair varies slowest). A root mesh of shape ``(2, 4)`` has the layouts
``((2, 4),)`` and ``((4, 1),)``; flattening both gives ``((8, 1),)``; a dimension over
positions 0, 1, 4, 5 is ``((2, 4), (2, 1))``. This is the representation torch's
DeviceMesh uses (CuTe-style layouts), so slicing and flattening rules match its own.

Layouts here are always *coalesced*: size-1 pairs dropped, neighbours that continue
each other merged, so two layouts over the same positions in the same order are equal.
"""
from __future__ import annotations

import math
from itertools import product
from typing import Iterable, List, Optional, Sequence, Tuple

Pair = Tuple[int, int]
Layout = Tuple[Pair, ...]


def coalesce(pairs: Iterable[Pair]) -> Layout:
    """The canonical form: no size-1 pairs, neighbours merged where ``d1 == s2 * d2``."""
    out: List[Pair] = []
    for size, stride in pairs:
        size, stride = int(size), int(stride)
        if size == 1:
            continue
        if out and out[-1][1] == size * stride:
            out[-1] = (out[-1][0] * size, stride)
        else:
            out.append((size, stride))
    return tuple(out)


def row_major(shape: Sequence[int]) -> Tuple[Layout, ...]:
    """One layout per dimension of a contiguous row-major array of ``shape``."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    return tuple(coalesce([(size, stride)]) for size, stride in zip(shape, strides))


def concat(layouts: Iterable[Layout]) -> Layout:
    """Several dimensions as one (row-major over them in order), coalesced."""
    return coalesce(pair for layout in layouts for pair in layout)


def numel(layout: Layout) -> int:
    return math.prod(size for size, _ in layout)


def cosize(layout: Layout) -> int:
    """One past the largest position the layout reaches (from base 0)."""
    return 1 + sum((size - 1) * stride for size, stride in layout)


def offsets(layout: Layout) -> List[int]:
    """Every position the layout reaches from base 0, in row-major order."""
    return [sum(c * stride for c, (_, stride) in zip(coord, layout))
            for coord in product(*(range(size) for size, _ in layout))]


def is_sorted(layout: Layout) -> bool:
    """Strides never increase: the dimensions are in the root mesh's own order."""
    strides = [stride for _, stride in layout]
    return strides == sorted(strides, reverse=True)


def is_orthogonal(layout: Layout) -> bool:
    """No two coordinates reach the same position (the dimensions do not overlap)."""
    ordered = sorted(layout, key=lambda pair: pair[1], reverse=True)
    return all(ordered[i][1] % (ordered[i + 1][1] * ordered[i + 1][0]) == 0
               for i in range(len(ordered) - 1))


def complement(layout: Layout, total: int) -> Layout:
    """The layout of the bases: ``layout`` repeated over it covers ``0..total-1`` once.

    Its strides decrease, so its offsets (the first position of every group along
    ``layout``) come out in increasing order. Raises ``ValueError`` when ``layout`` does
    not tile ``total`` positions.
    """
    missing: List[Pair] = []
    reached = 1
    for size, stride in sorted(layout, key=lambda pair: pair[1]):
        if stride % reached:
            raise ValueError(f"layout {layout} does not tile {total} positions")
        if stride > reached:
            missing.append((stride // reached, reached))
        reached = size * stride
    if total % reached:
        raise ValueError(f"layout {layout} does not tile {total} positions")
    if total > reached:
        missing.append((total // reached, reached))
    return coalesce(sorted(missing, key=lambda pair: pair[1], reverse=True))


def lines(layout: Layout, total: int) -> List[List[int]]:
    """Every group of positions along ``layout``, ordered by their first position."""
    inner = offsets(layout)
    return [[base + x for x in inner] for base in offsets(complement(layout, total))]


def line_of(layout: Layout, total: int, position: int) -> List[int]:
    """The group of positions along ``layout`` that holds ``position``."""
    base = sum(((position // stride) % size) * stride
               for size, stride in complement(layout, total))
    return [base + x for x in offsets(layout)]


def compose(layout: Layout, sizes: Sequence[int]) -> Tuple[Layout, ...]:
    """Split one dimension into ``sizes`` (row-major): one layout per new dimension.

    The new dimension ``t`` steps through ``layout``'s positions ``prod(sizes[t+1:])``
    at a time (sizes holding fewer positions than ``layout`` pick its first ones).
    Raises ``ValueError`` when the sizes do not divide the layout's pairs.
    """
    result = []
    for t, want in enumerate(sizes):
        skip = math.prod(sizes[t + 1:])
        taken: List[Pair] = []
        for size, stride in reversed(layout):  # innermost pair first
            if want == 1:
                break
            if skip >= size:
                if skip % size:
                    raise ValueError(f"cannot split {layout} into {tuple(sizes)}")
                skip //= size
                continue
            if size % skip:
                raise ValueError(f"cannot split {layout} into {tuple(sizes)}")
            available = size // skip
            take = min(want, available)
            if want % take or available % take:
                raise ValueError(f"cannot split {layout} into {tuple(sizes)}")
            taken.append((take, stride * skip))
            want //= take
            skip = 1
        if want != 1:
            raise ValueError(f"cannot split {layout} into {tuple(sizes)}")
        result.append(coalesce(reversed(taken)))
    return tuple(result)


def cartesian_dims(layout: Layout, shape: Sequence[int]) -> Optional[List[int]]:
    """The root dimensions whose ``MPI_Cart_sub`` gives ``layout``'s groups, or ``None``.

    ``layout`` qualifies when it is whole dimensions of the root (of ``shape``) in their
    own order: then the sub-communicator's row-major rank order is the layout's order.
    Size-1 root dimensions never matter and are left out.
    """
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    by_stride = {strides[d]: d for d in range(len(shape)) if shape[d] > 1}
    kept: List[int] = []
    for size, stride in layout:
        d = by_stride.get(stride)
        if d is None:
            return None
        spanned, covered = [], 1
        while covered < size and d >= 0:
            if shape[d] > 1:
                if strides[d] != stride * covered:
                    return None
                spanned.append(d)
                covered *= shape[d]
            d -= 1
        if covered != size:
            return None
        kept.extend(sorted(spanned))
    if kept != sorted(set(kept)):
        return None
    return kept
