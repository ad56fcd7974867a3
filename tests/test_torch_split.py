"""torch 2.15's groups without an accelerator: ``dist.split_group`` on CPU (one
``MPI_Comm_split`` of the parent's communicator), a default group bound to
``device_id=cpu:0``, and ``DeviceMesh(preserve_rank_order=True)``, on both names of the
backend. (torch 2.13 and 2.14 offer ``split_group`` only to a group bound to an
accelerator.) Runs in the MPI sessions of the suite (2 and 4 ranks); pipelining's
per-edge groups, made with ``split_group``, are trained in tests/test_torch_training.py.
"""
import datetime

import pytest

from torch_cases import TIMEOUT, assert_close, dist, torch
from torch_cases import rank, size  # noqa: F401 (fixtures)

import hpccomm.torch as hpccomm_torch
from hpccomm.torch import versions

pytestmark = [pytest.mark.mpi(min_size=2),
              pytest.mark.skipif(not versions.splits_on_cpu(),
                                 reason=f"torch 2.15 feature (this is torch {torch.__version__})")]

CPU0 = torch.device("cpu", 0)


@pytest.fixture(scope="module", params=["hpccomm", "mpi", "hpccomm, device_id=cpu:0"])
def torch_world(request):
    name, _, bound = request.param.partition(", ")
    device_id = CPU0 if bound else None
    if name == "mpi":
        dist.init_process_group("mpi", timeout=TIMEOUT, device_id=device_id)
    else:
        dist.init_process_group("hpccomm", init_method="mpi://", timeout=TIMEOUT,
                                device_id=device_id)
    yield name
    dist.destroy_process_group()


def members(group):
    return dist.get_process_group_ranks(group)


def test_split_group_keeps_each_splits_order(torch_world, rank, size):
    half = size // 2
    splits = [list(range(size - 1, half - 1, -1)), list(range(half - 1, -1, -1))]
    group = dist.split_group(split_ranks=splits, group_desc="halves")
    mine = next(s for s in splits if rank in s)
    assert isinstance(group, hpccomm_torch.ProcessGroupHPC)
    assert members(group) == mine and dist.get_rank(group) == mine.index(rank)
    assert dist.get_backend(group) == torch_world and group.group_desc == "halves"
    x = torch.full((3,), float(rank))
    dist.all_reduce(x, group=group)
    assert_close(x, torch.full((3,), float(sum(mine))))
    dist.broadcast(x, group_src=0, group=group)  # group rank 0: the split's first rank
    dist.all_reduce(x, group=group)
    assert_close(x, torch.full((3,), float(sum(mine) * len(mine))))
    inner = dist.split_group(group, split_ranks=[[0]])  # a split of a split
    if dist.get_rank(group) == 0:
        assert members(inner) == [mine[0]]
    else:
        assert inner is dist.GroupMember.NON_GROUP_MEMBER
    for made in (inner, group):
        if made is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(made)


def test_ranks_outside_every_split_get_no_group(torch_world, rank, size):
    group = dist.split_group(split_ranks=[[size - 1]])
    if rank == size - 1:
        assert members(group) == [rank] and group.size() == 1
        dist.all_reduce(torch.ones(1), group=group)
        dist.destroy_process_group(group)
    else:
        assert group is dist.GroupMember.NON_GROUP_MEMBER


def test_a_rank_that_never_splits_is_named_within_the_timeout(torch_world, rank, size):
    parent = dist.new_group(list(range(size)))
    if rank < size - 1:
        with pytest.raises(dist.DistBackendError,
                           match=rf"global rank {size - 1} never came within 1.0 s"):
            dist.split_group(parent, split_ranks=[list(range(size))],
                             timeout=datetime.timedelta(seconds=1))
    dist.destroy_process_group(parent)
    dist.barrier()


def test_device_bound_default_group(torch_world, rank, size):
    """device_id=cpu:0 (torch 2.15) binds the default group; new_group then offers the
    ranks outside a group torch's no-color split, which hpccomm's members-only groups
    need not take part in; the backend torch finds for the bound device is hpccomm's."""
    world = dist.group.WORLD
    if "cpu:0" not in str(world.bound_device_id):
        pytest.skip("the default group is not bound to a device in this world")
    assert world.bound_device_id == CPU0
    assert isinstance(dist.get_backend_impl(), hpccomm_torch.BackendHPC)
    pair = dist.new_group([0, 1])
    if rank < 2:
        x = torch.ones(2)
        dist.all_reduce(x, group=pair)
        assert_close(x, torch.full((2,), 2.0))
        dist.destroy_process_group(pair)
    else:
        assert pair is dist.GroupMember.NON_GROUP_MEMBER
    subgroup, _ = dist.new_subgroups(group_size=1)
    assert members(subgroup) == [rank]


def test_device_mesh_keeps_the_rank_order_it_is_given(torch_world, rank, size):
    """DeviceMesh(preserve_rank_order=True) (torch 2.15): each dimension's group numbers
    its ranks in the mesh's order; without it, sorted, as before."""
    from torch.distributed.device_mesh import DeviceMesh

    order = list(range(size - 1, -1, -1))
    layout = torch.tensor(order).reshape(2, size // 2)
    kept = DeviceMesh("cpu", layout, mesh_dim_names=("a", "b"), preserve_rank_order=True)
    sorted_mesh = DeviceMesh("cpu", layout, mesh_dim_names=("a", "b"))
    row = next(r.tolist() for r in layout if rank in r.tolist())
    column = next(c.tolist() for c in layout.t() if rank in c.tolist())
    assert members(kept.get_group("b")) == row, members(kept.get_group("b"))
    assert members(kept.get_group("a")) == column
    assert members(sorted_mesh.get_group("b")) == sorted(row)
    x = torch.full((1,), float(rank))
    dist.all_reduce(x, group=kept.get_group("b"))
    assert x.item() == sum(row)
