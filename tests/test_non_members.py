"""Ranks outside a group: every operation returns at once, as in torch 2.13.

A rank where ``new_group`` returned ``NON_GROUP_MEMBER`` that calls a collective, an
object collective, a barrier, a P2P call or ``batch_isend_irecv`` with that group gets
torch's warning, communicates nothing, and the members carry on. Expected values were
checked against torch 2.13 with gloo at 4 ranks.
"""
import warnings

import numpy as np
import pytest

import hpccomm

pytestmark = pytest.mark.mpi(min_size=2)


def non_member_calls(dist, group, size):
    """``(operation, call, expected result)`` for every operation torch makes a no-op."""
    t = np.full(2, 7.0)
    out = np.full(2 * size, 7.0)
    return [
        ("broadcast", lambda: dist.broadcast(t, src=0, group=group), None),
        ("broadcast", lambda: dist.broadcast(t, group_src=0, group=group), None),
        ("all_reduce", lambda: dist.all_reduce(t, group=group), None),
        ("all_reduce", lambda: dist.all_reduce(t, group=group, async_op=True), None),
        ("reduce", lambda: dist.reduce(t, dst=0, group=group), None),
        ("all_gather", lambda: dist.all_gather([t, t], t, group=group), None),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(out, t, group=group),
         None),
        ("gather", lambda: dist.gather(t, group=group), None),
        ("scatter", lambda: dist.scatter(t, group=group), None),
        ("reduce_scatter", lambda: dist.reduce_scatter(t, [t, t], group=group), None),
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(t, out, group=group),
         None),
        ("all_to_all_single", lambda: dist.all_to_all_single(t, t, group=group), None),
        ("all_to_all", lambda: dist.all_to_all([t, t], [t, t], group=group), None),
        ("barrier", lambda: dist.barrier(group=group), None),
        ("monitored_barrier", lambda: dist.monitored_barrier(group=group), None),
        ("send", lambda: dist.send(t, group_dst=0, group=group), None),
        ("isend", lambda: dist.isend(t, dst=0, group=group), None),
        ("recv", lambda: dist.recv(t, src=0, group=group), -1),
        ("recv", lambda: dist.recv(t, group=group), -1),
        ("irecv", lambda: dist.irecv(t, group=group), None),
        ("broadcast_object_list", lambda: dist.broadcast_object_list([1], group=group), None),
        ("all_gather_object", lambda: dist.all_gather_object([1, 2], 3, group=group), None),
        ("gather_object", lambda: dist.gather_object(3, group=group), None),
        ("scatter_object_list", lambda: dist.scatter_object_list([1], group=group), None),
        ("send_object_list", lambda: dist.send_object_list([1], dst=0, group=group), None),
        ("recv_object_list", lambda: dist.recv_object_list([1], src=0, group=group), -1),
        ("isend", lambda: dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, t, group_peer=0, group=group)]), []),
    ], t, out


def test_every_operation_is_a_no_op_outside_the_group(dist, rank, size):
    members = list(range(size // 2))
    group = dist.new_group(members)
    if rank in members:
        x = np.array([float(rank + 1)])
        dist.all_reduce(x, group=group)
        assert x[0] == sum(m + 1 for m in members)
    else:
        calls, t, out = non_member_calls(dist, group, size)
        for op, call, expected in calls:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert call() == expected, op
            messages = [str(w.message) for w in caught]
            assert messages == [f"Running {op} on global rank {rank} which does not belong "
                                f"to the given group."], (op, messages)
            # the warning points at the call here, not inside hpccomm
            assert [w.filename for w in caught] == [__file__], (op, caught[0].filename)
        assert (t == 7.0).all() and (out == 7.0).all()  # nothing was written
        assert dist.get_rank(group) == -1 and dist.get_world_size(group) == -1
    dist.barrier()  # nobody is left behind
    y = np.ones(1)
    dist.all_reduce(y)
    assert y[0] == size


def test_arguments_are_still_checked_outside_the_group(dist, rank, size):
    """What torch checks before it looks at membership still raises (on every rank)."""
    group = dist.new_group([0])
    t = np.ones(1)
    with pytest.raises(ValueError):
        dist.broadcast(t, group=group)  # src or group_src is required
    with pytest.raises(ValueError):
        dist.reduce(t, group=group)
    with pytest.raises(ValueError):
        dist.broadcast(t, src=0, group_src=0, group=group)
    with pytest.raises(ValueError):
        dist.scatter(t, src=0, group_src=0, group=group)
    with pytest.raises(ValueError):
        dist.send(t, group=group)


def test_plain_minus_100_counts_as_non_member(dist, rank, size):
    """torch's ``_rank_not_in_group`` compares with ``==``: the bare value works too."""
    assert dist.GroupMember.NON_GROUP_MEMBER == -100
    with pytest.warns(UserWarning, match="does not belong"):
        assert dist.all_reduce(np.ones(1), group=-100) is None
    assert dist.get_rank(-100) == -1
    dist.destroy_process_group(dist.GroupMember.NON_GROUP_MEMBER)  # ignored, as torch
    with pytest.raises(ValueError, match="not a member"):
        dist.get_process_group_ranks(dist.GroupMember.NON_GROUP_MEMBER)


@pytest.mark.mpi(min_size=4)
def test_subgroups_of_a_subgroup_leave_non_members_out(dist, rank, size):
    """new_subgroups over a parent group: only the parent's ranks take part; each rank
    outside a subgroup gets NON_GROUP_MEMBER for it, and no-ops on it."""
    parent = dist.new_group([1, 2, 3])
    if rank not in (1, 2, 3):  # rank 0, and ranks 4 and up at 8 ranks
        with pytest.raises(ValueError, match="not a member"):
            dist.new_subgroups(1, group=parent)
    else:
        mine, subgroups = dist.new_subgroups(1, group=parent)
        assert len(subgroups) == 3
        assert subgroups[rank - 1] is mine
        assert dist.get_process_group_ranks(mine) == [rank]
        other = subgroups[rank % 3]
        assert other == dist.GroupMember.NON_GROUP_MEMBER
        with pytest.warns(UserWarning):
            assert dist.all_reduce(np.ones(1), group=other) is None
    dist.barrier()
    assert hpccomm.is_initialized()
