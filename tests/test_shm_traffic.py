"""What one rank reads, writes and waits on in the small channel as the group grows.

The channel counts the bytes each rank reads and writes (its own slot and buffers
included, the peers' slots read in place). An all_reduce of S bytes split among the
ranks (3 or more) costs a rank about 3 S read and 2 S written at any group size: its
input copied into its slot (S, S), its part reduced from every slot (S read), published
(S / n) and the other parts copied out (S). Whole, it read S + n S. reduce_scatter copies
in the blocks of its input that the others reduce (S - S / n) and reduces its own block
from every rank (S), whole or in pieces (from 3 ranks on, a block larger than the
channel's goes as pieces of every rank's block).

It also counts its hand-off's cache lines (``Channel.handoff``: counter lines waited on,
each once per operation, and counter lines raised). Flat, a rank polls one line per rank
for each wait; on the combining tree (``_handoff.h``; the default from 32 ranks, and a
group of radix 2 here at every size from 3) it polls the root's one line per wait and
writes at most one line per level per signal: O(log n).

The jobs run from a serial pytest at 2 to 64 ranks (oversubscribed on a small machine:
this counts bytes and lines, not time).
"""
import math

import numpy as np
import pytest

from helpers import environment, every_channel_operation, tree_group

#: Bytes of the operations: above where the channel's all_reduce splits at 3+ ranks.
NBYTES = 64 * 1024


@pytest.mark.parallel(nprocs=[2, 3, 8, 16, 64])
def test_what_a_rank_reads_writes_and_polls_does_not_grow_with_the_group(hpccomm_dist):
    from hpccomm.backends.shm import small

    dist = hpccomm_dist
    if not small.available():
        pytest.skip("the C helper _small is not built (no C compiler at install) or "
                    "HPCCOMM_SHM_SMALL=0")
    n, rank = dist.get_world_size(), dist.get_rank()
    channel = dist.group.WORLD.cpu.small
    if channel is None:
        pytest.skip("the ranks are not on one node: no shared memory to share")
    # the default hand-off: flat below TREE_FROM ranks, a tree of radix 8 from there
    expected = 0 if n < small.TREE_FROM else math.ceil(math.log(n, 8) - 1e-9)
    assert channel.levels == expected, (n, channel.levels)
    bytes_moved(dist, channel, n, rank)
    lines_polled_and_written(dist, n, rank)


def bytes_moved(dist, channel, n, rank):
    assert n <= 2 or 0 < channel.split_from <= NBYTES, channel.split_from
    x = np.full(NBYTES // 8, float(rank + 1))
    before = channel.traffic
    dist.all_reduce(x)
    after = channel.traffic
    assert (x == n * (n + 1) / 2).all()
    read, written = after[0] - before[0], after[1] - before[1]
    assert read <= 3 * NBYTES + 64 * n and written <= 2.5 * NBYTES, (n, read / NBYTES,
                                                                   written / NBYTES)
    if n > 2:  # the whole reduction would have read S + n S
        assert read < (1 + n) * NBYTES

    block = NBYTES // n // 8 * 8
    out = np.empty(block // 8)
    before = channel.traffic
    dist.reduce_scatter_tensor(out, np.ones(block // 8 * n))
    after = channel.traffic
    assert (out == n).all()
    read, written = after[0] - before[0], after[1] - before[1]
    assert read <= 2 * block * n and written <= block * n, (n, read, written)

    cpu = dist.group.WORLD.cpu
    if n > 2:  # in pieces: the channel takes a strided piece of every rank's block
        assert cpu.scatter_pieces_to > 0
        from hpccomm.backends.base import REDUCE_SCATTER

        block = 3 * channel.sizes[REDUCE_SCATTER] // 8 * 8 + 8
        out = np.empty(block // 8)
        started, before = channel.kernel.started, channel.traffic
        dist.reduce_scatter_tensor(out, np.ones(block // 8 * n))
        after = channel.traffic
        assert (out == n).all() and channel.kernel.started - started == 4
        read, written = after[0] - before[0], after[1] - before[1]
        assert read == (2 * n - 1) * block and written == n * block, (n, read, written)


def lines_polled_and_written(dist, n, rank):
    deep = tree_group(dist, list(range(n)))
    with environment(HPCCOMM_SHM="1", HPCCOMM_SHM_TREE="0"):
        flat = dist.new_group(list(range(n)), timeout=60)
    assert deep.cpu.small.levels == (math.ceil(math.log2(n)) if n >= 3 else 0)
    assert flat.cpu.small.levels == 0
    for group in (deep, flat):
        lines = group.cpu.small
        polled, written = lines.handoff
        ops = every_channel_operation(dist, group, n, rank, 3)
        polled, written = lines.handoff[0] - polled, lines.handoff[1] - written
        if lines.levels:  # a root line per wait (3 at most: its slot, arrivals, parts);
            # per signal a line per level at most, and the posted line
            assert polled <= 3 * ops, (n, polled / ops)
            assert written <= ops * (1 + 3 * lines.levels), (n, written / ops)
        elif n > 2:  # flat: a line per rank for each wait
            assert polled >= (n - 1) * ops, (n, polled / ops)
    dist.destroy_process_group(deep)
    dist.destroy_process_group(flat)
