"""The NCCL communicators' life cycle on the simulated device: creation, and what every
rank is told when it fails (two ranks on one GPU, a rank that never comes, ranks that
come for different communicators); split from the parent, the bootstrap fallback, a rank
missing from a split, a DeviceMesh's and new_group's communicators after init with a
device (jobs of their own: they make the default group's, which no later test may meet).

Each test runs through the real backend code with ``tests/gpu_sim`` standing in for
CuPy and NCCL (see ``tests/gpu_cases.py``), whose ``cupy.cuda.nccl.made`` counts the
communicators made by a unique-id bootstrap and by a split. They skip where a real CuPy
is installed: ``gpu/run_gpu_check.sh`` checks the real NCCL there.
"""
import socket
import time

import numpy as np
import pytest

from gpu_cases import GPU, GPU_SKIP, REAL_CUPY, parts, sim_uuids, summed
from gpu_cases import sim  # noqa: F401 (a fixture)
from helpers import result_lines, run_case

SIMULATED = pytest.mark.skipif(REAL_CUPY, reason="a real CuPy is installed: the GPU's "
                                                 "own test below runs instead")


@pytest.fixture
def nccl(sim):  # noqa: F811 (the fixture imported above)
    """The simulated NCCL module, back at its default version after each test."""
    import importlib

    module = importlib.import_module("cupy.cuda.nccl")
    version = module.VERSION
    yield module
    module.VERSION = version


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


# -- creation: what every rank is told when it fails -----------------------------------------
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("first", ["collective", "send"])
def test_two_ranks_on_one_gpu_are_named_on_every_rank(dist, sim, rank, size, first):
    """Ranks 0 and 1 report one device UUID: each rank that would create the NCCL
    communicator raises the same clear error before NCCL is asked (which would say only
    NCCL_ERROR_INVALID_USAGE)."""
    sim_uuids(bytes(range(16)) if rank < 2 else bytes([rank]) * 16)
    pg = dist.new_group(list(range(size)), backend=GPU)
    try:
        x = sim.asarray(np.ones(3, np.float32))
        text = None
        if first == "collective" or rank < 2:  # send: a pair communicator of ranks 0, 1
            with pytest.raises(dist.DistBackendError) as caught:
                if first == "collective":
                    dist.all_reduce(x, group=pg)
                elif rank == 0:
                    dist.send(x, 1, group=pg)
                else:
                    dist.recv(x, 0, group=pg)
            text = str(caught.value)
            for needle in ("ranks 0 and 1 of the group share one GPU",
                           f"host {socket.gethostname()}", "cuda:0", "UUID GPU-00010203-0405-0607-0809-0a0b0c0d0e0f",
                           "NCCL_ERROR_INVALID_USAGE", "ranks per node",
                           "CUDA_VISIBLE_DEVICES", 'backend="mpi"'):
                assert needle in text, (needle, text)
        texts = [None] * size
        dist.all_gather_object(texts, text)
        assert len({t for t in texts if t is not None}) == 1, texts
        assert texts[0] is not None and texts[1] is not None, texts
        dist.barrier(group=pg)  # the group's CPU side still works
    finally:
        sim_uuids(None)
        dist.destroy_process_group(pg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("first", ["collective", "send"])
def test_a_rank_missing_from_nccl_creation_is_named_on_every_rank(dist, sim, rank, size,
                                                                 first):
    """The last rank never makes the GPU call that creates a communicator (the group's,
    or the pair of ranks 0 and the last): every rank that came raises a timeout within
    the group's timeout naming it, instead of waiting in NCCL's creation, and the group's
    CPU side stays usable."""
    import time

    last = size - 1
    pg = dist.new_group(list(range(size)), backend=GPU, timeout=1.5)
    try:
        x = sim.asarray(np.ones(3, np.float32))
        text = None
        comes = rank != last and (first == "collective" or rank == 0)
        if comes:
            start = time.monotonic()
            with pytest.raises(dist.DistTimeoutError) as caught:
                if first == "collective":
                    dist.all_reduce(x, group=pg)
                else:
                    dist.send(x, last, group=pg)
            assert time.monotonic() - start < 1.5 + 1.5  # the timeout and the verdict's way
            text = str(caught.value)
            op = "all_reduce" if first == "collective" else "send"
            made = ("the group's communicator" if first == "collective" or size == 2
                    else f"the pair communicator of ranks 0 and {last}")
            for needle in (f"hpccomm.{op}", f"on rank {rank}/{size}", "NCCL communicator "
                           f"creation ({made})", f"rank {last} of the group (global rank "
                           f"{last}) never came within 1.5 s", "usable for CPU arrays"):
                assert needle in text, (needle, text)
        texts = [None] * size
        dist.all_gather_object(texts, text)
        assert texts[0] is not None, texts
        dist.barrier(group=pg)  # the group's CPU side still works
    finally:
        dist.destroy_process_group(pg)


@pytest.mark.mpi(min_size=1)
def test_the_unique_id_reaches_every_rank_in_the_form_cupy_gave_it(dist, sim, rank, size):
    """CuPy 13 and later give and take the id as bytes, earlier releases as a tuple of
    signed chars: the meeting hands each rank the form the first rank's CuPy made."""
    from mpi4py import MPI

    from hpccomm.backends.cuda import shared_gpu

    comm = MPI.COMM_WORLD.Dup()
    try:
        for made in (bytes(range(128)), tuple(range(-64, 64))):
            got = shared_gpu.meet(comm, list(range(size)), "group", sim, 0, 10.0,
                                  lambda: made)
            assert type(got) is type(made) and got == made, (type(got), got)
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_first_rank_missing_from_nccl_creation_is_named_on_every_rank(dist, sim, rank,
                                                                        size):
    """Rank 0, which answers the others' meeting, does not make the call in time: the
    others raise a timeout naming it, after the group's timeout and the answer's grace.
    When rank 0 makes it later, it does not take their old arrivals for a meeting (and
    go on into NCCL's creation alone): it raises a timeout naming them."""
    pg = dist.new_group(list(range(size)), backend=GPU, timeout=1.5)
    try:
        text = None
        if rank != 0:
            with pytest.raises(dist.DistTimeoutError) as caught:
                dist.all_reduce(sim.asarray(np.ones(3, np.float32)), group=pg)
            text = str(caught.value)
            for needle in ("hpccomm.all_reduce", f"on rank {rank}/{size}",
                           "rank 0 of the group (global rank 0), the communicator's first, "
                           "did not answer within 1.5 s", "usable for CPU arrays"):
                assert needle in text, (needle, text)
        texts = [None] * size
        dist.all_gather_object(texts, text)
        assert all(t is not None for t in texts[1:]), texts
        if rank == 0:  # late: the others have given up
            with pytest.raises(dist.DistTimeoutError) as caught:
                dist.all_reduce(sim.asarray(np.ones(3, np.float32)), group=pg)
            others = "rank 1 of the group" if size == 2 else "ranks 1"
            assert others in str(caught.value) and "never came" in str(caught.value), \
                str(caught.value)
        dist.barrier()  # (on WORLD: the group's timeout is shorter than rank 0's wait)
    finally:
        dist.destroy_process_group(pg)


@pytest.mark.mpi(min_size=3)
def test_ranks_calling_for_different_nccl_communicators_are_named(dist, sim, rank, size):
    """Rank 2 sends to rank 0 (their pair communicator) while the others all_reduce (the
    group's): rank 0, first of both, takes rank 2's coming for the group's meeting and
    refuses it, and every rank raises the same error naming what each came to make;
    nothing waits in NCCL."""
    pg = dist.new_group(list(range(size)), backend=GPU, timeout=5)
    try:
        x = sim.asarray(np.ones(3, np.float32))
        with pytest.raises(dist.DistError) as caught:
            if rank == 2:
                dist.send(x, 0, group=pg)
            else:
                dist.all_reduce(x, group=pg)
        text = str(caught.value)
        for needle in ("rank 2 of the group comes to make the pair communicator of ranks 0 "
                       "and 2", "come to make the group's communicator", "Nothing was "
                       "created"):
            assert needle in text, (needle, text)
        texts = [None] * size
        dist.all_gather_object(texts, text)
        assert len(set(texts)) == 1, texts  # the same words on every rank
        dist.barrier(group=pg)
    finally:
        dist.destroy_process_group(pg)


@pytest.mark.mpi(min_size=2)
def test_ranks_on_distinct_gpus_pass_the_check(dist, sim, rank, size):
    sim_uuids(bytes([rank + 1]) * 16)
    pg = dist.new_group(list(range(size)), backend=GPU)
    try:
        x = sim.asarray(np.ones(3, np.float32))
        dist.all_reduce(x, group=pg)
        np.testing.assert_array_equal(sim.asnumpy(x), np.full(3, size))
    finally:
        sim_uuids(None)
        dist.destroy_process_group(pg)


# -- split from the parent --------------------------------------------------------------------
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
