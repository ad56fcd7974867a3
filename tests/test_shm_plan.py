"""``hpccomm bench --explain`` (backends/shm/plan.py) says what a live group does.

For a group of this node's ranks, every all_reduce size around the channel's limit and
its split size is run, and the path the plan names is checked against what the group
did: whether the channel took it (its count of operations) and, when split, that the
rank read about 3 S rather than (n + 1) S (its traffic counters).
"""
import numpy as np
import pytest

from helpers import environment

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture
def node_group(dist, members):
    from hpccomm.backends.shm import small

    if len(members) < 2:
        pytest.skip("one rank on this node: no shared memory to share")
    if not small.available():
        pytest.skip("the C helper _small is not built (no C compiler at install) or "
                    "HPCCOMM_SHM_SMALL=0")
    with environment(HPCCOMM_SHM="1"):
        group = dist.new_group(members, timeout=20)
    yield group
    dist.destroy_process_group(group)


def test_the_plan_names_the_path_each_all_reduce_takes(dist, node_group):
    from mpi4py import MPI

    from hpccomm.backends.base import ALL_REDUCE
    from hpccomm.backends.mpi import placement
    from hpccomm.backends.shm import pair, plan

    channel, n = node_group.cpu.small, node_group.size()
    limit, split = channel.sizes[ALL_REDUCE], channel.split_from
    sizes = {8, limit, limit + 8} | ({split - 8, split} if split else set())
    crowded = placement.crowded(MPI.COMM_WORLD)
    for nbytes in sorted({size // 8 * 8 for size in sizes}):  # float64 arrays
        said = plan.path("all_reduce", nbytes, n, MPI.get_vendor()[0], crowded,
                         pair.available())
        started, (read, _) = channel.kernel.started, channel.traffic
        x = np.ones(nbytes // 8)
        dist.all_reduce(x, group=node_group)
        assert (x == n).all()
        took = channel.kernel.started > started
        read = channel.traffic[0] - read
        assert took == said.name.startswith("channel"), (nbytes, said)
        if said.name == "channel":  # whole: its input, then every slot
            assert read == (n + 1) * nbytes, (nbytes, said, read)
        elif said.name == "channel, split":  # its input, its part of n slots, the rest
            assert read <= 3 * nbytes + 2 * 64 * n and read < (n + 1) * nbytes, \
                (nbytes, said, read)
