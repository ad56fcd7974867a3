"""``hpccomm bench --explain`` (backends/shm/plan.py) says what a live group does.

For a group of this node's ranks, every all_reduce size around the channel's limit and
its split size, and one of several pieces, is run, and the path the plan names is checked against what the group
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
    sizes = {8, limit, limit + 8, 3 * limit + 8} | ({split - 8, split} if split else set())
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
        elif said.name == "channel, in pieces" and "each whole" in said.why:
            assert read == (n + 1) * nbytes, (nbytes, said, read)
        elif said.name in ("channel, split", "channel, in pieces"):
            # its input, its part of n slots, the rest (a line per part and piece at most)
            pieces = -(-nbytes // limit)
            assert read <= 3 * nbytes + 2 * 64 * n * pieces and read < (n + 1) * nbytes, \
                (nbytes, said, read)


def test_the_plan_names_the_path_each_reduce_scatter_takes(dist, small_group):
    """Around the channel's block size, and a block of several pieces: the path the plan
    names is the one taken, and in pieces a rank reads the blocks of its input that the
    others reduce and its own block of every rank's input, 2 S - S / n."""
    from mpi4py import MPI

    from hpccomm.backends.base import REDUCE_SCATTER
    from hpccomm.backends.mpi import placement
    from hpccomm.backends.shm import pair, plan

    channel, n, me = small_group.cpu.small, small_group.size(), small_group.rank()
    limit = channel.sizes[REDUCE_SCATTER] // 8 * 8
    crowded = placement.crowded(MPI.COMM_WORLD)
    for block in (8, limit, limit + 8, 3 * limit + 16):  # one rank's block, float64
        said = plan.path("reduce_scatter_tensor", n * block, n, MPI.get_vendor()[0],
                         crowded, pair.available())
        started, (read, written) = channel.kernel.started, channel.traffic
        x = np.arange(n * block // 8, dtype=np.float64) + me
        out = np.empty(block // 8)
        dist.reduce_scatter_tensor(out, x, group=small_group)
        mine = np.arange(me * block // 8, (me + 1) * block // 8, dtype=np.float64)
        assert (out == n * mine + n * (n - 1) / 2).all(), (block, said)
        took = channel.kernel.started - started
        read, written = channel.traffic[0] - read, channel.traffic[1] - written
        assert (took > 0) == said.name.startswith("channel"), (block, said)
        if said.name.startswith("channel"):
            assert took == -(-block // limit), (block, said, took)
            # its input but its own block copied in, every block reduced (its own in place)
            assert read == (2 * n - 1) * block and written == n * block, (block, read)


def test_the_plan_names_the_path_each_broadcast_takes(dist, small_group):
    from mpi4py import MPI

    from hpccomm.backends.base import BROADCAST
    from hpccomm.backends.mpi import placement
    from hpccomm.backends.shm import pair, plan

    channel, n, me = small_group.cpu.small, small_group.size(), small_group.rank()
    limit = channel.sizes[BROADCAST]
    crowded = placement.crowded(MPI.COMM_WORLD)
    for nbytes in (8, limit, limit + 8):
        said = plan.path("broadcast", nbytes, n, MPI.get_vendor()[0], crowded,
                         pair.available())
        started = channel.kernel.started
        x = np.full(nbytes // 8, 5.0 if me == 0 else 0.0)
        dist.broadcast(x, group_src=0, group=small_group)
        assert (x == 5.0).all()
        took = channel.kernel.started > started
        assert took == said.name.startswith("channel"), (nbytes, said)


@pytest.mark.parametrize("vendor", ["MPICH", "Open MPI", "Intel MPI"])
def test_many_ranks_broadcast_through_the_channel_up_to_its_slot(vendor, monkeypatch):
    """From 3 ranks on, MPICH's and Open MPI's broadcast takes at least two copies one
    after another, the channel's two in parallel: the channel goes up to its slot."""
    from hpccomm.backends.base import BROADCAST
    from hpccomm.backends.shm import small

    monkeypatch.delenv("HPCCOMM_SHM_SMALL", raising=False)
    two, many = small.limits(2, vendor)[BROADCAST], small.limits(16, vendor)[BROADCAST]
    assert two == small.DEFAULT_LIMITS[{"MPICH": "mpich", "Open MPI": "openmpi",
                                        "Intel MPI": "intel"}[vendor]][BROADCAST]
    assert many == (small.BUDGET // small.SLOTS if vendor != "Intel MPI" else two)


def test_the_ring_reduce_scatter_starts_later_from_three_ranks():
    from hpccomm.backends.shm import communicator as shm

    MiB = 1 << 20
    assert shm.ring_thresholds(2, False, True)["reduce_scatter"] == MiB // 4
    assert shm.ring_thresholds(2, False, False)["reduce_scatter"] == MiB // 4
    for n in (3, 8, 16, 128):
        assert shm.ring_thresholds(n, False, True)["reduce_scatter"] == 16 * MiB
    assert shm.ring_thresholds(16, True, True)["reduce_scatter"] == 8 * MiB


def test_all_reduce_goes_in_pieces_from_three_ranks_crowded_or_not(monkeypatch):
    """In pieces below the ring where the channel takes a whole slot (MPICH, Open MPI);
    with Intel MPI, whose own all_reduce wins from 4 KiB, the ring keeps its 8 MiB."""
    from hpccomm.backends.shm import communicator as shm, small

    if not small.available():
        pytest.skip("the C helper _small is not built: no channel, no pieces")
    monkeypatch.delenv("HPCCOMM_SHM_SMALL", raising=False)
    for crowded in (False, True):
        for vendor in ("MPICH", "Open MPI", "Intel MPI"):
            assert shm.ring_thresholds(2, crowded, False, vendor)["all_reduce"] == 8 << 20
            for n in (3, 16):
                pieces = vendor != "Intel MPI"
                assert shm.ring_thresholds(n, crowded, True, vendor)["all_reduce"] == (
                    shm.PIECES_TO if pieces else 8 << 20), (vendor, n, crowded)
    assert shm.ring_thresholds(2, False, True)["all_reduce"] == 256 << 10
    monkeypatch.setenv("HPCCOMM_SHM_SMALL", "0")  # no channel: the ring as before
    assert shm.ring_thresholds(16, False, True, "MPICH")["all_reduce"] == 8 << 20


def test_pieces_only_where_the_channel_takes_a_whole_slot():
    from hpccomm.backends.base import ALL_REDUCE
    from hpccomm.backends.shm import small

    slot = small.BUDGET // small.SLOTS
    assert small.in_pieces(3, slot) and small.in_pieces(128, slot)
    assert not small.in_pieces(2, slot)
    intel = small.limits(16, "Intel MPI")[ALL_REDUCE]  # its own all_reduce wins from 4 KiB
    assert intel < slot and not small.in_pieces(16, intel)
    assert small.in_pieces(16, small.limits(16, "MPICH")[ALL_REDUCE])
