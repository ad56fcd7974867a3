"""What one rank reads and writes in the small channel stays flat as the group grows.

The channel counts the bytes each rank reads and writes (its own slot and buffers
included, the peers' slots read in place). An all_reduce of S bytes split among the
ranks (3 or more) costs a rank about 3 S read and 2 S written at any group size: its
input copied into its slot (S, S), its part reduced from every slot (S read), published
(S / n) and the other parts copied out (S). Whole, it read S + n S. reduce_scatter copies
in the blocks of its input that the others reduce (S - S / n) and reduces its own block
from every rank (S), whole or in pieces (a block larger than
the channel's, from 3 ranks on, goes as pieces of every rank's block). The jobs run from a serial pytest at 2, 4,
8 and 16 ranks (oversubscribed on a small machine: this counts bytes, not time).
"""
import numpy as np
import pytest

#: Bytes of the operations: above where the channel's all_reduce splits at 3+ ranks.
NBYTES = 64 * 1024


@pytest.mark.parallel(nprocs=[2, 4, 8, 16])
def test_what_a_rank_reads_and_writes_does_not_grow_with_the_group(hpccomm_dist):
    from hpccomm.backends.shm import small

    dist = hpccomm_dist
    if not small.available():
        pytest.skip("the C helper _small is not built (no C compiler at install) or "
                    "HPCCOMM_SHM_SMALL=0")
    n, rank = dist.get_world_size(), dist.get_rank()
    channel = dist.group.WORLD.cpu.small
    if channel is None:
        pytest.skip("the ranks are not on one node: no shared memory to share")
    assert n <= 2 or 0 < channel.split_from <= NBYTES, channel.split_from
    x = np.full(NBYTES // 8, float(rank + 1))
    before = channel.traffic
    dist.all_reduce(x)
    after = channel.traffic
    assert (x == n * (n + 1) / 2).all()
    read, written = after[0] - before[0], after[1] - before[1]
    assert read <= 3 * NBYTES + 64 and written <= 2.5 * NBYTES, (n, read / NBYTES,
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
