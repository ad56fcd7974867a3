"""The NCCL communicators' life cycle on the simulated device: split from the parent,
the bootstrap fallback, a rank missing from a split, a DeviceMesh's and new_group's
communicators after init with a device (jobs of their own: they make the default
group's, which no later test may meet).

Each test runs through the real backend code with ``tests/gpu_sim`` standing in for
CuPy and NCCL (see ``tests/test_gpu_collectives.py``), whose ``cupy.cuda.nccl.made``
counts the communicators made by a unique-id bootstrap and by a split. They skip where
a real CuPy is installed: ``gpu/run_gpu_check.sh`` checks the real NCCL there.
"""
import time

import numpy as np
import pytest

from helpers import result_lines, run_case
from test_gpu_collectives import GPU_SKIP, REAL_CUPY, install_sim, uninstall_sim

GPU = "cpu:mpi,cuda:nccl"
SIMULATED = pytest.mark.skipif(REAL_CUPY, reason="a real CuPy is installed: the GPU's "
                                                 "own test below runs instead")


@pytest.fixture(scope="module")
def sim(world):
    """The simulated ``cupy`` (on the path for this module's tests)."""
    if REAL_CUPY:
        pytest.skip("a real CuPy is installed: the simulated device is not used")
    cupy = install_sim()
    yield cupy
    uninstall_sim()


@pytest.fixture
def nccl(sim):
    """The simulated NCCL module, back at its default version after each test."""
    import importlib

    module = importlib.import_module("cupy.cuda.nccl")
    version = module.VERSION
    yield module
    module.VERSION = version


def summed(cupy, dist, group, value):
    """``value`` all-reduced over ``group`` on the (simulated) GPU, as a float."""
    x = cupy.asarray(np.full(3, value, np.float32))
    dist.all_reduce(x, group=group)
    return float(cupy.asnumpy(x)[0])


def made_by(nccl, step):
    """How many communicators ``step()`` made, by bootstrap and by split."""
    before = dict(nccl.made)
    step()
    return {how: nccl.made[how] - before[how] for how in before}


def split_and_use(dist, sim, nccl, parent, rank):
    """``split_group(parent, parts(...))``, then one GPU all_reduce on this rank's part
    (checked): ``(part or None, communicators the split made, those the all_reduce
    made or None)``. The parent is the whole world: its group ranks are global ranks."""
    out = {}
    at_split = made_by(nccl, lambda: out.setdefault(
        "part", dist.split_group(parent, parts(parent.size()))))
    part, at_use = out["part"], None
    if part is not None:
        at_use = made_by(nccl, lambda: out.setdefault("sum",
                                                      summed(sim, dist, part, rank + 1)))
        assert out["sum"] == sum(r + 1 for r in part.ranks), (out, part)
        dist.destroy_process_group(part)
    dist.barrier(group=parent)
    return part, at_split, at_use


def parts(size):
    """Two splits of the even and the odd ranks below the last; the last is in none."""
    return [p for p in ([r for r in range(size - 1) if r % 2 == 0],
                        [r for r in range(size - 1) if r % 2 == 1]) if p]


@pytest.mark.mpi(min_size=2)
def test_split_group_splits_the_parents_nccl_communicator(dist, sim, nccl, rank, size):
    """The parent has its NCCL communicator: ``split_group`` makes each part's by
    ``ncclCommSplit`` (the last rank, in no part, takes part in the split with no
    color), and the parts' collectives need no bootstrap."""
    parent = dist.new_group(list(range(size)), backend=GPU)
    try:
        assert summed(sim, dist, parent, 1) == size
        part, at_split, at_use = split_and_use(dist, sim, nccl, parent, rank)
        if rank == size - 1:
            assert part is None and at_split == {"bootstrap": 0, "split": 0}, at_split
        else:
            assert list(part.ranks) == next(p for p in parts(size) if rank in p)
            assert at_split == {"bootstrap": 0, "split": 1}, at_split
            assert at_use == {"bootstrap": 0, "split": 0}, at_use
    finally:
        dist.destroy_process_group(parent)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("why", ["NCCL before 2.18", "the parent never used the GPU"])
def test_without_a_split_the_parts_bootstrap_on_first_use(dist, sim, nccl, rank, size, why):
    """No split (an NCCL without ``ncclCommSplit``, or a parent without a communicator
    of its own yet): each part makes its communicator from a unique id, on its first
    GPU collective, as before."""
    parent = dist.new_group(list(range(size)), backend=GPU)
    try:
        if why == "NCCL before 2.18":
            nccl.VERSION = 21705
            assert summed(sim, dist, parent, 1) == size
        part, at_split, at_use = split_and_use(dist, sim, nccl, parent, rank)
        assert at_split == {"bootstrap": 0, "split": 0}, at_split
        assert (part is None) == (rank == size - 1)
        if part is not None:
            assert at_use == {"bootstrap": 1, "split": 0}, at_use
    finally:
        dist.destroy_process_group(parent)


@pytest.mark.mpi(min_size=2)
def test_a_rank_missing_from_a_split_is_named_on_every_rank_that_came(dist, sim, nccl, rank,
                                                                     size):
    """The last rank's NCCL communicator of the parent was aborted, so it does not
    split: every other rank raises a timeout naming it within the group's timeout,
    instead of waiting in ncclCommSplit, and the parent's CPU side stays usable."""
    last = size - 1
    parent = dist.new_group(list(range(size)), backend=GPU, timeout=1.5)
    halves = [list(range(size))]
    try:
        assert summed(sim, dist, parent, 1) == size
        if rank == last:
            parent.communicator("cuda").abort()
            child = dist.split_group(parent, halves)
            dist.destroy_process_group(child)
            text = None
        else:
            start = time.monotonic()
            with pytest.raises(dist.DistTimeoutError) as caught:
                dist.split_group(parent, halves)
            assert time.monotonic() - start < 1.5 + 1.5  # the timeout and the verdict's way
            text = str(caught.value)
            for needle in (f"hpccomm.split_group on rank {rank}/{size}",
                           "NCCL communicator creation (a communicator split from the "
                           "group's, its 1st (ncclCommSplit))",
                           f"rank {last} of the group (global rank {last}) never came "
                           f"within 1.5 s"):
                assert needle in text, (needle, text)
        texts = [None] * size
        dist.all_gather_object(texts, text)
        assert all(t is not None for t in texts[:last]) and texts[last] is None, texts
        dist.barrier(group=parent)  # the CPU side still works
    finally:
        dist.destroy_process_group(parent)


@SIMULATED
@pytest.mark.parametrize("version", ["22105", "21705"], ids=["split", "no-split"])
def test_init_with_a_device_makes_the_nccl_communicators_of_a_mesh_by_split(version):
    """8 ranks: ``init_process_group(device_id=0)`` makes the default group's NCCL
    communicator (one bootstrap) before it returns, as torch does; a 2 x 2 x 2 mesh made
    after it splits its communicators from it (the Cartesian group's and one per
    dimension), or, with an NCCL before 2.18, bootstraps one per dimension. These are
    the counts docs/gpu.md gives."""
    job = run_case("device_mesh_case.py", "gpu_sim", 8, limit=90, SIM_NCCL_VERSION=version)
    found = dict(result_lines(job.output))
    assert sorted(found) == list(range(8)), job.output
    split = version == "22105"
    for rank, fields in found.items():
        assert fields["init"] == "1,0", (rank, fields)
        assert fields["mesh"] == ("1,4" if split else "4,0"), (rank, fields)
        # dimension d of the row-major 2 x 2 x 2 mesh pairs rank r with r ^ (4 >> d)
        sums = ",".join(f"{(rank + 1) + (rank ^ (4 >> d)) + 1:g}" for d in range(3))
        assert fields["sums"] == sums, (rank, fields)
        # new_group(ranks 0-3), called by every rank: its members split (the others join
        # the split with no color, which makes nothing), or bootstrap on first use
        member = rank < 4
        assert fields["group"] == {(True, True): "1,5", (True, False): "1,4",
                                   (False, True): "5,0", (False, False): "4,0"}[
                                       split, member], (rank, fields)
        assert fields["half"] == ("10" if member else "-"), (rank, fields)
        # a 2 x 4 mesh of the ranks in reverse order: its Cartesian group and dimension
        # 1 split (rows [7, 6, 5, 4] and [3, 2, 1, 0], NCCL ranks in the mesh's order:
        # the broadcast from the row's group rank 0 gives its first rank + 1)
        before = [int(c) for c in fields["group"].split(",")]
        after = [int(c) for c in fields["backwards"].split(",")]
        assert [a - b for a, b in zip(after, before)] == ([0, 2] if split else [1, 0]), \
            (rank, fields)
        assert fields["row"] == ("26" if rank >= 4 else "10"), (rank, fields)
        assert fields["first"] == ("8" if rank >= 4 else "4"), (rank, fields)
    assert job.code == 0, job.output


@SIMULATED
def test_a_rank_missing_from_new_groups_split_is_named_and_local_groups_do_not_split():
    """3 ranks, the default group bound to a device: rank 2 never calls new_group([0, 1]),
    so ranks 0 and 1 wait for it in the split meeting and raise a timeout naming it
    within the 1.5 s given, with what to do; nothing is made and the job goes on. A
    group made with ``use_local_synchronization=True``, by its members only, makes its
    communicator by a bootstrap on first use."""
    job = run_case("device_mesh_case.py", "gpu_sim_absent", 3, limit=60)
    found = dict(result_lines(job.output))
    assert sorted(found) == [0, 1, 2], job.output
    for rank in (0, 1):
        fields = found[rank]
        assert fields["made"] == "1,0" and fields["local"] == "2,0", (rank, fields)
        assert fields["sum"] == "3", (rank, fields)
        for needle in (f"DistTimeoutError: hpccomm.new_group on rank {rank}/3 of group "
                       f"'WORLD'", "(ncclCommSplit)): rank 2 of the group (global rank 2) "
                       "never came within 1.5 s", "every rank of the job calls new_group",
                       "use_local_synchronization=True"):
            assert needle in fields["error"], (needle, fields)
    assert found[2] == {"made": "1,0", "local": "1,0", "sum": "-", "error": "-"}, found[2]
    assert job.code == 0, job.output


@pytest.mark.gpu
@pytest.mark.mpi(min_size=1)
@pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))
def test_a_group_splits_its_nccl_communicator_on_the_gpu(dist, rank, size):
    """On a real GPU (``gpu/run_gpu_check.sh``, from 1 rank): the group's NCCL
    communicator, then a split of it in which each rank is a part of its own; the part
    has its NCCL communicator before its first collective, and that collective is right."""
    import cupy

    from hpccomm.backends.cuda import nccl, nccl_life

    if not nccl_life.can_split(nccl.binding()):
        pytest.skip(f"this CuPy and NCCL {nccl.version()} cannot split (ncclCommSplit needs "
                    f"NCCL 2.18 and CuPy 14)")
    parent = dist.new_group(list(range(size)), backend=GPU)
    try:
        x = cupy.asarray(np.ones(3, np.float32))
        dist.all_reduce(x, group=parent)
        assert cupy.asnumpy(x)[0] == size
        child = dist.split_group(parent, [[r] for r in range(size)])
        assert child.communicator("cuda").splittable()  # made by the split, not used yet
        y = cupy.asarray(np.full(3, rank + 1.0, np.float32))
        dist.all_reduce(y, group=child)
        assert cupy.asnumpy(y)[0] == rank + 1
        dist.destroy_process_group(child)
    finally:
        dist.destroy_process_group(parent)
