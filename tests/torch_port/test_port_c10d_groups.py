"""Groups: torch's test_c10d_common.py (AbstractCommTest, AbstractLargeCommTest,
MultiProcContinuousSkipTest) as test_c10d_gloo.py runs them, ported to NumPy arrays.

Each torch test is named in its docstring. torch builds a fresh world per test from a
FileStore; here the session's world (one MPI job) is used, so the ported tests only add
groups.
"""
import numpy as np
import pytest

import hpccomm


@pytest.mark.mpi(min_size=2)
def test_worker_continues_after_skip(dist, rank, size):
    """MultiProcContinuousSkipTest.test_2_worker_continues_after_skip."""
    if size != 2:
        pytest.skip("needs exactly 2 ranks")
    tensor = np.array(rank + 1)
    dist.all_reduce(tensor)
    assert tensor == 3


@pytest.mark.mpi(min_size=2)
def test_warn_not_in_group(dist, rank, size):
    """CommTest.test_gloo_warn_not_in_group (_test_warn_not_in_group)."""
    in_group_ranks = [r for r in range(size) if r % 2 == 0]
    group = dist.new_group(in_group_ranks)
    x = np.zeros((2, 2))
    xs = [np.zeros((2, 2)) for _ in in_group_ranks]
    if rank not in in_group_ranks:
        for op, call in [("all_gather", lambda: dist.all_gather(xs, x, group=group)),
                         ("all_reduce", lambda: dist.all_reduce(x, group=group)),
                         ("barrier", lambda: dist.barrier(group=group)),
                         ("broadcast", lambda: dist.broadcast(x, src=0, group=group))]:
            with pytest.warns(UserWarning, match=f".*{op}.*does not belong to.*") as caught:
                call()
            assert len([w for w in caught if "does not belong" in str(w.message)]) == 1
    else:
        dist.all_gather(xs, x, group=group)
        dist.all_reduce(x, group=group)
        dist.barrier(group=group)
        dist.broadcast(x, src=0, group=group)
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_rank_membership(dist, rank, size):
    """CommTest.test_gloo_rank_membership (_test_rank_membership). The DummyProcessGroup
    ("not registered") part is in NOT_PORTED.md."""
    group = dist.new_group(ranks=[1])
    if rank == 1:
        assert dist.get_group_rank(group, 1) == 0
        with pytest.raises(ValueError, match="not part of group"):
            dist.get_group_rank(group, 0)
        assert dist.get_global_rank(group, 0) == 1
        with pytest.raises(ValueError, match="not part of group"):
            dist.get_global_rank(group, 1)
        assert dist.get_process_group_ranks(group) == [1]
    else:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
        with pytest.raises(ValueError, match="not a member"):
            dist.get_group_rank(group, 1)


@pytest.mark.mpi(min_size=4)
def test_new_group_local_sync(dist, rank, size):
    """LargeCommTest.test_new_group_local_sync (_test_new_group_local_sync).

    torch's test expects ``NON_GROUP_MEMBER`` for the ranks outside, but torch 2.13
    itself returns ``None`` there (``_new_group_with_tag``); hpccomm returns what
    torch 2.13 returns.
    """
    if size != 4:
        pytest.skip("needs exactly 4 ranks")
    ranks_in = [rank, (rank + 2) % size]
    ranks_out = [i for i in range(size) if i not in ranks_in]
    assert dist.new_group(ranks=ranks_out, use_local_synchronization=True) is None
    new_pg = dist.new_group(ranks=ranks_in, use_local_synchronization=True)
    assert isinstance(new_pg, dist.ProcessGroup)
    ranks_in.sort()  # groups sort their ranks
    assert dist.get_group_rank(new_pg, rank) == ranks_in.index(rank)
    assert dist.get_process_group_ranks(new_pg) == ranks_in


@pytest.mark.mpi(min_size=4)
def test_new_group_local_sync_sanity_check(dist, rank, size):
    """LargeCommTest.test_new_group_local_sync_sanity_check."""
    if size != 4:
        pytest.skip("needs exactly 4 ranks")
    pg_idx = rank // 2
    ranks_in = [pg_idx * 2, pg_idx * 2 + 1]
    new_pg = dist.new_group(ranks=ranks_in, use_local_synchronization=True)
    input_tensor = np.array([pg_idx, rank])
    output_tensor_list = [np.array([-1, -1]) for _ in range(new_pg.size())]
    dist.all_gather(output_tensor_list, input_tensor, group=new_pg)
    expected = [[pg_idx, ranks_in[0]], [pg_idx, ranks_in[1]]]
    assert [out.tolist() for out in output_tensor_list] == expected


@pytest.mark.mpi(min_size=4)
def test_new_group_local_sync_duplicate_pg(dist, rank, size):
    """LargeCommTest.test_new_group_local_sync_duplicate_pg: several groups with the
    same members do not conflict."""
    if size != 4:
        pytest.skip("needs exactly 4 ranks")
    pg_idx = rank // 2
    ranks_in = [pg_idx * 2, pg_idx * 2 + 1]
    new_pgs = [dist.new_group(ranks=ranks_in, use_local_synchronization=True)
               for _ in range(2)]
    assert new_pgs[0] is not new_pgs[1]
    input_tensor = np.array([pg_idx, rank])
    for new_pg in new_pgs:
        output_tensor_list = [np.array([-1, -1]) for _ in range(new_pg.size())]
        dist.all_gather(output_tensor_list, input_tensor, group=new_pg)
        assert [out.tolist() for out in output_tensor_list] == [[pg_idx, ranks_in[0]],
                                                                [pg_idx, ranks_in[1]]]


@pytest.mark.mpi(min_size=2)
def test_new_group_ordered(dist, rank, size):
    """AbstractLargeCommTest._test_new_group_ordered: sort_ranks=False keeps the order."""
    reversed_ranks = list(range(size - 1, -1, -1))
    new_pg = dist.new_group(ranks=reversed_ranks, sort_ranks=False)
    assert dist.get_group_rank(new_pg, rank) == reversed_ranks.index(rank)
    assert dist.get_process_group_ranks(new_pg) == reversed_ranks
    output_tensor_list = [np.array([-1]) for _ in range(size)]
    dist.all_gather(output_tensor_list, np.array([rank]), group=new_pg)
    assert [int(out[0]) for out in output_tensor_list] == reversed_ranks


@pytest.mark.mpi(min_size=2)
def test_new_group_rank_checks(dist, rank, size):
    """new_group's argument checks in _new_group_with_tag: duplicates and ranks out of
    range are ValueErrors on every rank."""
    with pytest.raises(ValueError):
        dist.new_group([0, 0])
    with pytest.raises(ValueError):
        dist.new_group([0, size])
    with pytest.raises(ValueError):
        dist.new_group([-1, 0])


@pytest.mark.mpi(min_size=4)
def test_subgroups_return_values_for_non_members(dist, rank, size):
    """new_subgroups / new_subgroups_by_enumeration / split_group return what torch
    2.13 returns to ranks outside a subgroup (checked against torch with gloo)."""
    if size != 4:
        pytest.skip("needs exactly 4 ranks")
    mine, subgroups = dist.new_subgroups(2)
    assert subgroups[rank // 2] is mine
    assert subgroups[1 - rank // 2] == dist.GroupMember.NON_GROUP_MEMBER
    mine, subgroups = dist.new_subgroups_by_enumeration([[0, 1]])
    if rank < 2:
        assert subgroups == [mine] and dist.get_process_group_ranks(mine) == [0, 1]
    else:
        assert mine is None and subgroups == [dist.GroupMember.NON_GROUP_MEMBER]
    split = dist.split_group(split_ranks=[[1, 0]])
    if rank < 2:
        assert dist.get_process_group_ranks(split) == [0, 1]  # each split is sorted
    else:
        assert split is None


@pytest.mark.mpi(min_size=4)
def test_split_group_takes_parent_group_ranks(dist, rank, size):
    """split_group's split_ranks are group ranks of the parent (torch's docstring)."""
    if size != 4:
        pytest.skip("needs exactly 4 ranks")
    parent = dist.new_group([3, 2, 1, 0], sort_ranks=False)  # group rank g = global 3-g
    child = dist.split_group(parent, [[0, 1], [2, 3]])
    expected = [3, 2] if rank >= 2 else [1, 0]
    assert dist.get_process_group_ranks(child) == expected
    x = np.array([float(rank)])
    dist.all_reduce(x, group=child)
    assert x[0] == sum(expected)
    with pytest.raises(ValueError):
        dist.split_group(parent, [[0, 4]])  # group rank 4 is out of range
    assert hpccomm.get_world_size(child) == 2
