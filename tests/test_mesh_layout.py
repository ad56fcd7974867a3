"""The layout arithmetic behind DeviceMesh slicing, flattening and unflattening.

Serial tests (no MPI). The vectors are those torch checks for its own CuTe layouts
(CuTeLayoutTest in test/distributed/test_device_mesh.py), restated for hpccomm's
``(size, stride)`` tuples, plus the mapping onto MPI Cartesian dimensions.
"""
import numpy as np
import pytest

from hpccomm.device_mesh import layout as L


def test_coalesce_merges_continuing_pairs_and_drops_size_one():
    assert L.coalesce([(3, 2), (2, 1)]) == ((6, 1),)
    assert L.coalesce([(2, 12), (3, 4), (4, 1)]) == ((24, 1),)
    assert L.coalesce([(3, 4), (2, 1)]) == ((3, 4), (2, 1))  # 4 != 2 * 1: kept apart
    assert L.coalesce([(1, 0), (3, 10), (1, 17), (5, 2), (1, 1)]) == ((15, 2),)
    assert L.coalesce([(1, 1), (1, 42), (1, 0)]) == ()
    assert L.coalesce([(7, 900), (5, 36), (3, 4), (2, 1)]) == ((7, 900), (5, 36), (3, 4),
                                                                 (2, 1))
    assert L.coalesce([(7, 30), (5, 6), (3, 2), (2, 1)]) == ((210, 1),)


def test_row_major_and_concat():
    assert L.row_major((2, 4)) == (((2, 4),), ((4, 1),))
    assert L.row_major((2, 1, 3)) == (((2, 3),), (), ((3, 1),))
    assert L.concat(L.row_major((2, 2, 2))) == ((8, 1),)
    assert L.concat([((2, 4),), ((2, 1),)]) == ((2, 4), (2, 1))


def test_complement_and_lines():
    assert L.complement(((4, 2),), 8) == ((2, 1),)
    assert L.offsets(((4, 2),)) == [0, 2, 4, 6]
    assert L.lines(((4, 2),), 8) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert L.complement(((4, 2),), 16) == ((2, 8), (2, 1))
    assert L.offsets(L.complement(((4, 2),), 16)) == [0, 1, 8, 9]
    assert L.lines(((4, 2),), 16) == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14],
                                      [9, 11, 13, 15]]
    layout = ((2, 4), (2, 1))
    assert L.offsets(layout) == [0, 1, 4, 5]
    assert L.complement(layout, 16) == ((2, 8), (2, 2))
    assert L.lines(layout, 16) == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13],
                                   [10, 11, 14, 15]]
    # strides not in decreasing order: the same complement, the layout's own order kept
    unsorted = ((2, 2), (2, 4))
    assert L.complement(unsorted, 16) == ((2, 8), (2, 1))
    assert L.lines(unsorted, 16) == [[0, 4, 2, 6], [1, 5, 3, 7], [8, 12, 10, 14],
                                     [9, 13, 11, 15]]
    for position in range(16):  # line_of agrees with lines for every position
        (expected,) = [line for line in L.lines(layout, 16) if position in line]
        assert L.line_of(layout, 16, position) == expected
    with pytest.raises(ValueError, match="does not tile"):
        L.complement(((3, 1),), 8)


def test_compose_splits_a_dimension_row_major():
    assert L.compose(((8, 1),), (2,)) == (((2, 1),),)  # the first positions only
    assert L.compose(((4, 2),), (2,)) == (((2, 2),),)
    assert L.compose(((4, 2),), (2, 2)) == (((2, 4),), ((2, 2),))
    assert L.compose(((8, 1),), (2, 2, 2)) == (((2, 4),), ((2, 2),), ((2, 1),))
    # a flattened non-contiguous dimension (positions 0, 1, 4, 5, ...) split in two
    assert L.compose(((2, 4), (2, 1)), (2, 2)) == (((2, 4),), ((2, 1),))
    assert L.compose(((2, 4), (4, 1)), (4, 2)) == (((4, 2),), ((2, 1),))
    with pytest.raises(ValueError, match="cannot split"):
        L.compose(((4, 4), (2, 1)), (3,))


def test_orthogonal_and_sorted():
    assert L.is_orthogonal(((2, 6), (3, 1)))
    assert not L.is_orthogonal(((2, 2), (3, 1)))  # stride 2 < span 3: overlap
    assert not L.is_orthogonal(((2, 1), (3, 1)))  # same stride twice
    assert L.is_orthogonal(((4, 1),))
    assert L.is_orthogonal(((2, 3), (3, 1)))  # exactly adjacent
    assert L.is_orthogonal(((2, 8), (2, 4), (2, 1)))
    assert L.is_orthogonal(((2, 4), (2, 1), (2, 2)))  # any order
    assert not L.is_orthogonal(((3, 2), (2, 3)))  # neither stacks above the other
    assert L.is_orthogonal(((2, 1), (11, 210), (3, 2), (7, 30)))
    assert L.is_sorted(((4, 2), (2, 1))) and not L.is_sorted(((2, 1), (4, 2)))


def test_cartesian_dims_maps_whole_dimensions_only():
    shape = (2, 2, 2)
    assert L.cartesian_dims(((2, 4),), shape) == [0]
    assert L.cartesian_dims(((2, 4), (2, 1)), shape) == [0, 2]
    assert L.cartesian_dims(((4, 2),), shape) == [0, 1]
    assert L.cartesian_dims(((8, 1),), shape) == [0, 1, 2]
    assert L.cartesian_dims((), shape) == []
    assert L.cartesian_dims(((2, 2), (2, 4)), shape) is None  # not the root's order
    assert L.cartesian_dims(((2, 4),), (4, 2)) is None  # half of a dimension
    assert L.cartesian_dims(((2, 2),), (2, 1, 2)) == [0]  # size-1 dimensions skipped


@pytest.mark.parametrize("shape", [(2, 3), (2, 2, 2), (3, 1, 4), (4,)])
def test_cartesian_groups_equal_numpy_slices(shape):
    """Every dimension subset's lines are NumPy's slices of arange(shape)."""
    full = np.arange(int(np.prod(shape))).reshape(shape)
    dims = L.row_major(shape)
    for keep in range(1, 2 ** len(shape)):
        kept = [d for d in range(len(shape)) if keep >> d & 1]
        layout = L.concat(dims[d] for d in kept)
        moved = np.moveaxis(full, kept, list(range(len(kept))))
        expected = sorted(moved.reshape(int(np.prod([shape[d] for d in kept])), -1).T.tolist())
        assert sorted(L.lines(layout, full.size)) == expected
        assert L.cartesian_dims(layout, shape) == [d for d in kept if shape[d] > 1]
