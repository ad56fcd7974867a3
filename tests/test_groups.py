"""Groups: new_group (members only, sorted or not), subgroups, split_group, rank maps."""
import numpy as np
import pytest

import hpccomm


@pytest.mark.mpi(min_size=2)
def test_new_group_members_and_non_members(dist, rank, size):
    members = [0, size - 1]
    group = dist.new_group(members)
    if rank in members:
        assert dist.get_process_group_ranks(group) == members
        assert dist.get_world_size(group) == 2
        assert dist.get_rank(group) == members.index(rank)
        x = np.array([rank], dtype=np.int64)
        dist.all_reduce(x, group=group)
        assert x[0] == sum(members)
        dist.broadcast(x, src=size - 1, group=group)
        assert x[0] == sum(members)
    else:
        assert group is dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_rank(group) == -1
        x = np.ones(1)
        with pytest.warns(UserWarning, match="does not belong to the given group"):
            assert dist.all_reduce(x, group=group) is None
        assert x[0] == 1  # nothing was communicated
    dist.barrier()


@pytest.mark.mpi(min_size=4)
def test_new_group_created_by_members_only(dist, rank, size):
    # Ranks 2 and 3 never call new_group: members-only creation must not wait for them.
    if rank in (0, 1):
        group = dist.new_group([0, 1], use_local_synchronization=True)
        x = np.ones(2)
        dist.all_reduce(x, group=group)
        assert (x == 2).all()
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_new_group_sort_ranks_false_keeps_order(dist, rank, size):
    order = list(reversed(range(size)))
    group = dist.new_group(order, sort_ranks=False)
    assert dist.get_process_group_ranks(group) == order
    assert dist.get_group_rank(group, rank) == size - 1 - rank
    assert dist.get_global_rank(group, 0) == size - 1
    x = np.zeros(1)
    if dist.get_rank(group) == 0:
        x[:] = 42
    dist.broadcast(x, group_src=0, group=group)
    assert x[0] == 42


@pytest.mark.mpi(min_size=4)
def test_new_subgroups(dist, rank, size):
    mine, subgroups = dist.new_subgroups(group_size=2)
    assert len(subgroups) == size // 2
    assert dist.get_process_group_ranks(mine) == [rank - rank % 2, rank - rank % 2 + 1]
    x = np.array([float(rank)])
    dist.all_reduce(x, group=mine)
    assert x[0] == 2 * (rank - rank % 2) + 1
    others = [g for g in subgroups if g is not mine]
    assert all(g is dist.GroupMember.NON_GROUP_MEMBER for g in others)


@pytest.mark.mpi(min_size=4)
def test_new_subgroups_by_enumeration_and_split_group(dist, rank, size):
    evens, odds = list(range(0, size, 2)), list(range(1, size, 2))
    mine, groups = dist.new_subgroups_by_enumeration([evens, odds])
    assert dist.get_process_group_ranks(mine) == (evens if rank % 2 == 0 else odds)
    x = np.array([rank], dtype=np.int32)
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=mine)
    assert x[0] == (evens if rank % 2 == 0 else odds)[-1]
    split = dist.split_group(split_ranks=[[0, 1]])
    if rank in (0, 1):
        assert dist.get_process_group_ranks(split) == [0, 1]
        y = np.ones(1)
        dist.all_reduce(y, group=split)
        assert y[0] == 2
    else:
        assert split is None


@pytest.mark.mpi(min_size=2)
def test_subgroup_async_and_p2p_with_group_ranks(dist, rank, size):
    group = dist.new_group(list(range(1, size)) + [0], sort_ranks=False)
    g_rank = dist.get_rank(group)
    x = np.full(3, float(g_rank))
    work = dist.all_reduce(x, group=group, async_op=True)
    work.wait()
    assert (x == sum(range(size))).all()
    if g_rank == 0:
        dist.send(np.array([7.0]), group_dst=1, group=group)
    elif g_rank == 1:
        buf = np.zeros(1)
        assert dist.recv(buf, group_src=0, group=group) == 1  # the sender's global rank
        assert buf[0] == 7.0


@pytest.mark.mpi(min_size=2)
def test_group_world_and_backend(dist, rank, size):
    assert dist.group.WORLD is dist.GroupMember.WORLD
    assert dist.get_process_group_ranks(dist.group.WORLD) == list(range(size))
    assert "mpi" in dist.get_backend()
    group = dist.new_group(backend="gloo")
    assert dist.get_backend(group) == "mpi"


@pytest.mark.mpi(min_size=2)
def test_rank_translation_errors(dist, rank, size):
    group = dist.new_group([0, 1])
    if rank in (0, 1):
        with pytest.raises(hpccomm.DistValueError, match="not part of group"):
            dist.get_group_rank(group, size + 5)
        with pytest.raises(hpccomm.DistValueError, match="out of range"):
            dist.get_global_rank(group, 2)
    with pytest.raises(hpccomm.DistValueError, match="not a valid global rank"):
        dist.new_group([0, size])


@pytest.mark.mpi(min_size=2)
def test_destroy_one_group(dist, rank, size):
    group = dist.new_group()
    dist.destroy_process_group(group)
    with pytest.raises(hpccomm.DistValueError, match="destroyed"):
        dist.all_reduce(np.ones(1), group=group)
    x = np.ones(1)
    dist.all_reduce(x)
    assert x[0] == size


@pytest.mark.mpi(min_size=2)
def test_destroying_a_group_keeps_its_communicator_while_an_abandoned_operation_runs(
        dist, rank, size, monkeypatch):
    """The ranks but 0 give up an async all_reduce (a timeout), then destroy the group:
    MPI may still progress that all_reduce, so its communicator is freed only once it
    has ended (Open MPI crashed in a later MPI call otherwise). Rank 0 joins late."""
    import time

    from mpi4py import MPI

    from hpccomm import work
    from hpccomm.diagnostics import rollcall

    monkeypatch.setenv("HPCCOMM_SHM_SMALL", "0")  # small messages through MPI
    # No roll call: its report to rank 0 would stay unreceived, and MPICH below
    # MPI_THREAD_MULTIPLE refuses to free a communicator with unmatched messages.
    monkeypatch.setattr(rollcall, "GRACE_S", 0)
    group = dist.new_group()
    comm = group.comm
    x = np.ones(8)
    if rank != 0:
        started = dist.all_reduce(x, group=group, async_op=True)
        with pytest.raises(hpccomm.DistTimeoutError):
            started.wait(timeout=0.05)
        dist.destroy_process_group(group)
        assert comm != MPI.COMM_NULL, "freed under its running all_reduce"
    dist.barrier()
    if rank == 0:
        dist.all_reduce(x, group=group, async_op=True).wait()
        dist.destroy_process_group(group)
    deadline = time.monotonic() + 30
    while comm != MPI.COMM_NULL and time.monotonic() < deadline:
        work.after((), lambda: None)  # frees what waited for operations now ended
    assert comm == MPI.COMM_NULL, "never freed after its operation ended"
    np.testing.assert_array_equal(x, np.full(8, float(size)))  # kept alive, written
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_a_roll_call_leaves_no_receive_behind(dist, rank, size, monkeypatch):
    """Rank 0 times out on an all_reduce that the others join later; its roll call takes
    the others' reports by matched probe on the group's channel, so it leaves no receive
    from any source posted (one would take a later roll call's report). Once the group
    is destroyed, its communicator and its channel's are freed."""
    import time

    from mpi4py import MPI

    from hpccomm import work
    from hpccomm.backends.mpi.anysource import Receive

    monkeypatch.setenv("HPCCOMM_SHM_SMALL", "0")  # small messages through MPI
    group = dist.new_group()
    comm, channel = group.comm, group.hidden.comm
    assert channel != comm  # hpccomm's own messages on a communicator of their own
    x = np.ones(8)
    before = {id(entry[0]) for entry in work._abandoned}
    if rank == 0:
        with pytest.raises(hpccomm.DistTimeoutError, match="never joined"):
            dist.all_reduce(x, group=group, async_op=True).wait(timeout=0.05)
        assert not any(isinstance(entry[0], Receive) and id(entry[0]) not in before
                       for entry in work._abandoned), "the roll call left a receive posted"
    dist.barrier()
    if rank != 0:
        dist.all_reduce(x, group=group, async_op=True).wait()
    dist.destroy_process_group(group)
    if rank == 0:  # (MPICH below MPI_THREAD_MULTIPLE may refuse the others' frees: the
        # roll call's report to them stays unreceived)
        deadline = time.monotonic() + 30
        while (comm != MPI.COMM_NULL or channel != MPI.COMM_NULL) and \
                time.monotonic() < deadline:
            work.after((), lambda: None)  # frees what waited for operations now ended
        assert comm == MPI.COMM_NULL and channel == MPI.COMM_NULL
    dist.barrier()
