"""The small channel's hand-off on its combining tree (``_handoff.h``): every operation
gives the reference bytes on a deep tree, and differing calls are still named.

A group made with ``HPCCOMM_SHM_TREE=3`` and radix 2 has a tree of log2(n) levels from 3
ranks, so the tree's propagation is exercised at the suite's rank counts (8 included),
where the default (radix 8 from 32 ranks) would be flat. What a rank polls and writes
per operation, at 2 to 64 ranks, is counted by tests/test_shm_traffic.py.
"""
import math

import numpy as np
import pytest

from helpers import every_channel_operation, tree_group


@pytest.mark.mpi(min_size=2)
def test_every_operation_on_a_deep_tree(dist, members):
    """A group of this node's ranks whose hand-off is a tree of radix 2 (log2 n levels,
    where the default would be flat below 32 ranks): every operation, sync and async,
    round the slots several times, gives the reference values."""
    from hpccomm.backends.shm import small

    if len(members) < 2 or not small.available():
        pytest.skip("no channel: one rank on this node, or no C helper")
    n, me = len(members), members.index(dist.get_rank())
    group = tree_group(dist, members)
    assert group.cpu.small.levels == (math.ceil(math.log2(n)) if n >= 3 else 0)
    assert every_channel_operation(dist, group, n, me, 6) >= 6 * 6
    dist.destroy_process_group(group)


@pytest.mark.mpi(min_size=3)
def test_on_the_tree_differing_calls_are_named_on_every_rank(dist, members):
    """The tree carries arrivals only; every rank still reads the headers of the ranks
    it reads, so a rank calling another size is named on every rank."""
    from hpccomm.backends.shm import small

    if len(members) < 3 or not small.available():
        pytest.skip("a tree needs 3 or more ranks on this node and the C helper")
    group = tree_group(dist, members)
    assert group.cpu.small.levels >= 2
    x = np.ones(5 if dist.get_rank() == members[-1] else 4)
    with pytest.raises(dist.DistDesyncError, match="all_reduce of 40 bytes"):
        dist.all_reduce(x, group=group)
    dist.destroy_process_group(group)
