"""``hpccomm bench --explain`` (backends/shm/plan.py) says what a live group does.

For a group of this node's ranks, every all_reduce size around the channel's limit and
its split size is run, and the path the plan names is checked against what the group
did: whether the channel took it (its count of operations) and, when split, that the
rank read about 3 S rather than (n + 1) S (its traffic counters).
"""
import numpy as np
import pytest

pytestmark = pytest.mark.mpi(min_size=2)


def test_the_plan_names_the_path_each_all_reduce_takes(dist, small_group):
    from mpi4py import MPI

    from hpccomm.backends.base import ALL_REDUCE
    from hpccomm.backends.mpi import placement
    from hpccomm.backends.shm import pair, plan

    channel, n = small_group.cpu.small, small_group.size()
    limit, split = channel.sizes[ALL_REDUCE], channel.split_from
    sizes = {8, limit, limit + 8} | ({split - 8, split} if split else set())
    crowded = placement.crowded(MPI.COMM_WORLD)
    for nbytes in sorted({size // 8 * 8 for size in sizes}):  # float64 arrays
        said = plan.path("all_reduce", nbytes, n, MPI.get_vendor()[0], crowded,
                         pair.available())
        started, (read, _) = channel.kernel.started, channel.traffic
        x = np.ones(nbytes // 8)
        dist.all_reduce(x, group=small_group)
        assert (x == n).all()
        took = channel.kernel.started > started
        read = channel.traffic[0] - read
        assert took == said.name.startswith("channel"), (nbytes, said)
        if said.name == "channel":  # whole: its input, then every slot
            assert read == (n + 1) * nbytes, (nbytes, said, read)
        elif said.name == "channel, split":  # its input, its part of n slots, the rest
            assert read <= 3 * nbytes + 2 * 64 * n and read < (n + 1) * nbytes, \
                (nbytes, said, read)
