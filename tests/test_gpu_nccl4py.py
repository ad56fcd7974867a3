"""NCCL communicators made and called through NVIDIA's nccl4py (``HPCCOMM_NCCL_BINDING``,
``HPCCOMM_NCCL_NONBLOCKING``), on the simulated device: nonblocking creation and split
polled under the group's timeout, creation from several roots, and what a creation or
split that never ends does (a DistTimeoutError on every rank; the CPU side goes on).

``tests/gpu_sim/nccl`` stands in for nccl4py as ``tests/gpu_sim/cupy`` does for CuPy: a
nonblocking creation reports ``ncclInProgress`` until every rank has come, and a call on
a communicator that is not ready raises (NCCL's rule), so these tests also show that
hpccomm never calls one. They skip where a real CuPy is installed:
``gpu/run_gpu_check.sh`` checks the real nccl4py there.
"""
import re
import sys
import time

import numpy as np
import pytest

from gpu_cases import GPU, GPU_SKIP, REAL_CUPY, parts, summed
from gpu_cases import sim  # noqa: F401 (a fixture)
from helpers import run_job

from hpccomm.backends.cuda.nccl4py_binding import root_index, roots_for


def _on_nccl4py(kind, monkeypatch):
    """hpccomm on the simulated nccl4py: ``"nonblocking"`` communicators, or
    ``"blocking"`` ones (the binding alone), each group of 2 or more ranks made from one
    id per rank; yields the simulated module, and lets every rank come again after."""
    import importlib

    if kind == "nonblocking":
        monkeypatch.setenv("HPCCOMM_NCCL_NONBLOCKING", "1")
    else:
        monkeypatch.setenv("HPCCOMM_NCCL_BINDING", "nccl4py")
    monkeypatch.setenv("HPCCOMM_NCCL_RANKS_PER_ROOT", "1")
    module = importlib.import_module("nccl.bindings.nccl")
    stall = importlib.import_module("cupy.cuda.nccl")
    yield module
    stall.STALL = ""


@pytest.fixture(params=["nonblocking", "blocking"])
def nccl4py(request, sim, monkeypatch):  # noqa: F811 (the fixture imported above)
    """Nonblocking and blocking communicators, the test once with each."""
    yield from _on_nccl4py(request.param, monkeypatch)


@pytest.fixture
def nonblocking(sim, monkeypatch):  # noqa: F811 (the fixture imported above)
    """Nonblocking communicators only (what a deadline can end)."""
    yield from _on_nccl4py("nonblocking", monkeypatch)


def same_everywhere(dist, value):
    """Every rank's ``value``, checked equal across ranks."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    assert all(v == values[0] for v in values), values
    return values[0]


@pytest.mark.mpi(min_size=2)
def test_nccl4py_communicators_are_made_split_and_called(dist, sim, nccl4py, rank, size,
                                                         request):
    """The group's communicator is made from one unique id per rank (each made by its
    rank, the same list on every rank), nonblocking or not; a split of it and the part's
    collective follow, and every result is right."""
    kind = request.node.callspec.params["nccl4py"]
    before = {k: (list(v) if isinstance(v, list) else v) for k, v in nccl4py.made.items()}
    parent = dist.new_group(list(range(size)), backend=GPU)
    try:
        assert summed(sim, dist, parent, 1) == size
        assert nccl4py.made[kind] == before[kind] + 1, (nccl4py.made, before)
        ids = same_everywhere(dist, nccl4py.made["scalable_ids"][-1])
        assert len(set(ids)) == size, ids
        part = dist.split_group(parent, parts(size))
        assert nccl4py.made["split"] == before["split"] + (part is not None)
        if part is not None:
            assert summed(sim, dist, part, rank + 1) == sum(r + 1 for r in part.ranks)
            dist.destroy_process_group(part)
        x = sim.asarray(np.arange(4, dtype=np.float32) if rank == 0 else
                        np.zeros(4, np.float32))
        dist.broadcast(x, src=0, group=parent)
        assert sim.asnumpy(x).tolist() == [0, 1, 2, 3]
    finally:
        dist.destroy_process_group(parent)


@pytest.mark.mpi(min_size=2)
def test_a_nonblocking_creation_that_never_ends_times_out_and_the_process_goes_on(
        dist, sim, nonblocking, rank, size):
    """NCCL's bootstrap never connects the last rank (every rank came to the meeting):
    each rank's first GPU collective raises a DistTimeoutError naming the communicator
    within the group's timeout, the creation aborted, and the group's CPU side works."""
    import cupy.cuda.nccl as simulated

    group = dist.new_group(list(range(size)), backend=GPU, timeout=1.5)
    try:
        dist.barrier(group=group)
        simulated.STALL = f"init:{size - 1}"
        start = time.monotonic()
        with pytest.raises(dist.DistTimeoutError) as caught:
            summed(sim, dist, group, 1)
        assert time.monotonic() - start < 1.5 + 1.5
        simulated.STALL = ""
        text = str(caught.value)
        for needle in (f"rank {rank}/{size} of its group", "NCCL communicator creation "
                       "(the group's communicator) did not finish within 1.5 s",
                       "aborted (ncclCommAbort)", "usable for CPU arrays",
                       "NCCL_SOCKET_IFNAME"):
            assert needle in text, (needle, text)
        cpu = np.full(2, rank + 1.0)
        dist.all_reduce(cpu, group=group)
        assert cpu.tolist() == [size * (size + 1) / 2] * 2
    finally:
        simulated.STALL = ""
        dist.destroy_process_group(group)


@pytest.mark.mpi(min_size=2)
def test_a_nonblocking_split_that_never_ends_times_out_and_the_parent_fails_on_the_gpu(
        dist, sim, nonblocking, rank, size):
    """The last rank never gets through NCCL's split: every rank's ``split_group`` raises
    a DistTimeoutError naming the split within the timeout; the parent, mid-split, has
    its NCCL communicators aborted (a later GPU collective on it says so) and its CPU
    side goes on."""
    import cupy.cuda.nccl as simulated

    parent = dist.new_group(list(range(size)), backend=GPU, timeout=1.5)
    try:
        assert summed(sim, dist, parent, 1) == size
        simulated.STALL = f"split:{size - 1}"
        start = time.monotonic()
        with pytest.raises(dist.DistTimeoutError) as caught:
            dist.split_group(parent, [list(range(size))])
        assert time.monotonic() - start < 1.5 + 1.5
        simulated.STALL = ""
        for needle in ("its 1st (ncclCommSplit)) did not finish within 1.5 s",
                       "the group it was split from, which were mid-split"):
            assert needle in str(caught.value), (needle, str(caught.value))
        with pytest.raises(dist.DistError, match="ncclCommAbort"):
            summed(sim, dist, parent, 1)
        dist.barrier(group=parent)
    finally:
        simulated.STALL = ""
        dist.destroy_process_group(parent)


@pytest.mark.mpi(min_size=2)
def test_a_planned_shrink_shrinks_the_nccl_communicator(dist, sim, nccl4py, rank, size):
    """NCCL 2.27 (simulated): ``shrink_group([last])`` makes the smaller group's NCCL
    communicator by ``ncclCommShrink`` of the old one (a planned shrink: the default
    flag), called by the ranks that stay; no unique id, no new creation, and its
    collective is right."""
    import cupy.cuda.nccl as simulated

    version, simulated.VERSION = simulated.VERSION, 22703
    last = size - 1
    parent = dist.new_group(list(range(size)), backend=GPU)
    try:
        assert summed(sim, dist, parent, 1) == size
        if rank == last:  # excluded: does not call shrink_group, as torch requires
            dist.destroy_process_group(parent)
        else:
            shrinks, created = list(nccl4py.made["shrink"]), dict(nccl4py.made)
            smaller = dist.shrink_group([last], group=parent)
            assert nccl4py.made["shrink"] == shrinks + [0], nccl4py.made  # SHRINK_DEFAULT
            assert summed(sim, dist, smaller, rank + 1) == sum(range(1, size))
            assert all(nccl4py.made[k] == created[k] for k in ("blocking", "nonblocking"))
            dist.destroy_process_group(smaller)
        dist.barrier()
    finally:
        simulated.VERSION = version
        if parent.live:
            dist.destroy_process_group(parent)


@pytest.mark.skipif(REAL_CUPY, reason="a real CuPy is installed: the simulation is not used")
def test_every_gpu_collective_runs_through_nonblocking_nccl4py_communicators():
    """The simulated NCCL cases of ``tests/test_gpu_collectives.py`` and
    ``tests/test_gpu_streams.py`` as a job of 3 ranks whose communicators are
    nonblocking nccl4py ones, the group's made from one id per rank (a pair's, for a
    first send, from one): every operation, batch, staged dtype and the
    watchdog's abort through the binding, each call followed by its state query."""
    files = ["tests/test_gpu_collectives.py", "tests/test_gpu_streams.py"]
    job = run_job([sys.executable, "-m", "pytest", "-q", "--color=no", "-p",
                   "no:cacheprovider", "--with-mpi", "-k", "sim-nccl", *files], 3, limit=150,
                  env={"HPCCOMM_NCCL_NONBLOCKING": "1", "HPCCOMM_NCCL_RANKS_PER_ROOT": "1",
                       "SIM_NCCL4PY_REPORT": "1"})
    assert job.code == 0 and " passed" in job.output, job.output[-5000:]
    assert "failed" not in job.output and " error" not in job.output, job.output[-5000:]
    made = re.findall(r"simulated nccl4py: (\d+) nonblocking, (\d+) from several roots",
                      job.output)
    counts = [(int(a), int(b)) for a, b in made]  # a pair's communicator has one id
    # one report per rank and module: each module puts the simulation on the path anew
    assert len(counts) == 3 * len(files), job.output[-3000:]
    assert all(a >= b > 0 for a, b in counts), job.output[-3000:]
    assert any(a > b for a, b in counts), counts


@pytest.mark.parametrize("size,roots", [(1, 1), (5, 1), (5, 2), (7, 3), (8, 4), (300, 3),
                                        (257, 3), (16, 16)])
def test_each_block_of_ranks_has_its_root_first(size, roots):
    """``root_index`` as NCCL splits the ranks into ``roots`` blocks of consecutive ranks,
    sizes differing by at most one, the longer first: the first rank of each block makes
    that block's id, the others none."""
    sizes = [size // roots + (1 if b < size % roots else 0) for b in range(roots)]
    firsts = [sum(sizes[:b]) for b in range(roots)]
    assert [root_index(r, size, roots) for r in range(size)] == [
        firsts.index(r) if r in firsts else -1 for r in range(size)]


def test_one_id_per_so_many_ranks_above_that_many():
    """One unique id up to ``HPCCOMM_NCCL_RANKS_PER_ROOT`` ranks (128 by default, as
    torch's TORCH_NCCL_RANKS_PER_ROOT), one per that many ranks (rounded up) above; 0
    means one id always."""
    assert [roots_for(n, 128) for n in (1, 128, 129, 256, 257, 4096)] == [1, 1, 2, 2, 3, 32]
    assert roots_for(10 ** 6, 0) == 1 and roots_for(3, 1) == 3


@pytest.mark.skipif(REAL_CUPY, reason="a real CuPy is installed: the simulation is not used")
def test_without_nccl4py_the_setting_says_what_to_install(monkeypatch):
    """Asking for nccl4py where it is not installed fails at once, saying what to
    install."""
    import sys

    from hpccomm.backends.cuda import nccl4py_binding

    monkeypatch.setattr(nccl4py_binding, "_lib", None)
    for name in ("nccl", "nccl.bindings", "nccl.bindings.nccl"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    with pytest.raises(Exception, match="pip install nccl4py"):
        nccl4py_binding.lib()


def _nccl4py_skip():
    if GPU_SKIP is not None:
        return GPU_SKIP
    import importlib.util

    if importlib.util.find_spec("nccl") is None:
        return "nccl4py is not installed (pip install nccl4py)"
    return None


@pytest.mark.gpu
@pytest.mark.mpi(min_size=1)
@pytest.mark.skipif(_nccl4py_skip() is not None, reason=str(_nccl4py_skip()))
def test_a_nonblocking_communicator_on_the_gpu_is_made_split_and_aborted(dist, rank, size):
    """On a real GPU with nccl4py (``gpu/run_gpu_check.sh``, from 1 rank), on each rank
    alone: a nonblocking 1-rank communicator is ready once polled, reduces, splits (the
    child polled too) and aborts; and a 2-rank creation whose other rank never comes
    stays in progress until the deadline, then aborts at once (NCCL's own bootstrap
    waits on; hpccomm's poll does not)."""
    import cupy

    from hpccomm.backends.cuda import nccl4py_binding as binding

    with cupy.cuda.Device(cupy.cuda.runtime.getDevice()):
        alone = binding.NcclCommunicator(1, binding.get_unique_id(), 0, blocking=False)
        assert alone.settle(60)
        x = cupy.asarray(np.full(4, 3.0, np.float32))
        stream = cupy.cuda.get_current_stream()
        alone.allReduce(x.data.ptr, x.data.ptr, 4, binding.NCCL_FLOAT32, binding.NCCL_SUM,
                        stream.ptr)
        stream.synchronize()
        assert cupy.asnumpy(x).tolist() == [3.0] * 4
        child = alone.commSplit(0, 0)
        assert child is not None and child.settle(60) and child.size() == 1
        child.abort()
        alone.destroy()
        waiting = binding.NcclCommunicator(2, binding.get_unique_id(), 0, blocking=False)
        start = time.monotonic()
        assert not waiting.settle(2.0)  # the other rank never comes
        waiting.abort()
        assert waiting.aborted and time.monotonic() - start < 2.0 + 30
