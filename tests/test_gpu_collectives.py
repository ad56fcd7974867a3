"""Collectives written once, run over array libraries and backends.

Cases (the ``case`` fixture):

* ``numpy-mpi``: NumPy arrays on the MPI backend, runs everywhere.
* ``cupy-nccl`` / ``cupy-mpi``: CuPy arrays on NCCL, and on MPI (CUDA-aware or staged
  through pinned memory). Marked ``gpu``; they skip with a reason unless CuPy, a CUDA
  device and NCCL are present (``gpu/run_gpu_check.sh`` runs them on a GPU machine).
* ``sim-nccl`` / ``sim-mpi``: the same tests through the real backend code with
  ``tests/gpu_sim`` standing in for CuPy and NCCL (host memory, NCCL calls done with
  MPI). They check the backend's logic where there is no GPU; they prove nothing about
  CUDA streams or the real NCCL, and skip where a real CuPy is installed.
"""
import importlib.util
import os
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.mpi(min_size=1)

SIM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_sim")


def _gpu_skip_reason():
    if importlib.util.find_spec("cupy") is None:
        return "no CUDA device/CuPy/NCCL here: CuPy is not installed"
    from hpccomm.backends.cuda import nccl

    if not nccl.available():
        return "no CUDA device/CuPy/NCCL here: hpccomm.is_nccl_available() is False"
    return None


GPU_SKIP = _gpu_skip_reason()
NCCL_AVAILABLE_AT_IMPORT = __import__("hpccomm").is_nccl_available()  # before any simulation
REAL_CUPY = importlib.util.find_spec("cupy") is not None
_gpu = [pytest.mark.gpu, pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))]
_sim = [pytest.mark.skipif(REAL_CUPY, reason="a real CuPy is installed: the cupy-* cases "
                                             "run the backend for real")]
CASES = [
    pytest.param(("numpy", "mpi"), id="numpy-mpi"),
    pytest.param(("cupy", "nccl"), id="cupy-nccl", marks=_gpu),
    pytest.param(("cupy", "mpi"), id="cupy-mpi", marks=_gpu),
    pytest.param(("sim", "nccl"), id="sim-nccl", marks=_sim),
    pytest.param(("sim", "mpi"), id="sim-mpi", marks=_sim),
]


def _reset_backend_caches():
    from hpccomm.backends.cuda import device as _cuda, nccl, nccl4py_binding

    nccl._available = None
    nccl4py_binding._lib = None
    _cuda._cupy = None
    _cuda.binding.device = None


#: Whether :func:`install_sim` put the simulation on the path (and so takes it off): not
#: when it was there already, as when ``gpu/run_gpu_check.sh --offline`` runs these tests
#: with the simulation standing in for a real CuPy.
_installed = []


def install_sim():
    """Put the simulated CuPy on the path (once per module)."""
    if SIM_PATH not in sys.path:
        sys.path.insert(0, SIM_PATH)
        _installed.append(SIM_PATH)
        _reset_backend_caches()
    import cupy

    assert getattr(cupy, "SIMULATED", False)
    return cupy


def uninstall_sim():
    if _installed:
        _installed.clear()
        sys.path.remove(SIM_PATH)
        for name in [n for n in sys.modules if n.split(".")[0] in ("cupy", "nccl")]:
            del sys.modules[name]
        _reset_backend_caches()


@pytest.fixture(scope="module")
def _groups(world):
    groups = {}
    yield groups
    import hpccomm

    for pg in groups.values():
        if hpccomm.is_initialized() and pg.live:
            hpccomm.destroy_process_group(pg)
    uninstall_sim()


class Case:
    """One (array library, backend) combination and its group."""

    def __init__(self, lib, backend, xp, group):
        self.lib, self.backend, self.xp, self.group = lib, backend, xp, group
        self.gpu = lib != "numpy"

    def arr(self, values, dtype=None):
        host = np.asarray(values, dtype=dtype)
        return self.xp.asarray(host) if self.gpu else host.copy()

    def host(self, x):
        return self.xp.asnumpy(x) if self.gpu else np.asarray(x)

    def __repr__(self):
        return f"{self.lib}-{self.backend}"


@pytest.fixture(params=CASES)
def case(request, dist, _groups):
    lib, backend = request.param
    xp = np
    if lib == "sim":
        xp = install_sim()
    elif lib == "cupy":
        import cupy as xp
    key = (lib, backend)
    pg = _groups.get(key)
    if pg is None or not pg.live:
        spec = "mpi" if backend == "mpi" else "cpu:mpi,cuda:nccl"
        pg = _groups[key] = dist.new_group(list(range(dist.get_world_size())), backend=spec)
    return Case(lib, backend, xp, pg)


def done(dist, work, async_op):
    """Complete an op the way a caller would; for GPU work, also wait for the device."""
    if async_op:
        assert work is not None
        assert work.wait() is True
        assert work.is_completed()
    else:
        assert work is None


def local(rank, n=6, dtype=np.float32):
    return (np.arange(n) + rank + 1).astype(dtype)


# -- all_reduce ------------------------------------------------------------------------------
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64,
                                   np.uint8, np.int16, np.complex64])
def test_all_reduce_sum(dist, case, rank, size, dtype, async_op):
    x = case.arr(local(rank, dtype=dtype))
    work = dist.all_reduce(x, group=case.group, async_op=async_op)
    done(dist, work, async_op)
    expected = sum(local(r, dtype=np.float64) for r in range(size)).astype(dtype)
    got = case.host(x)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, expected, rtol=1e-3)


@pytest.mark.parametrize("op,ref", [("PRODUCT", np.prod), ("MIN", np.min), ("MAX", np.max),
                                    ("BAND", np.bitwise_and.reduce),
                                    ("BOR", np.bitwise_or.reduce),
                                    ("BXOR", np.bitwise_xor.reduce)])
@pytest.mark.parametrize("dtype", [np.int32, np.int16])
def test_all_reduce_int_ops(dist, case, rank, size, op, ref, dtype):
    rows = [np.array([r + 1, 7 - r, 1 << r, 0x5A], dtype) for r in range(size)]
    x = case.arr(rows[rank])
    dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=case.group)
    expected = ref(np.stack(rows), axis=0).astype(dtype)  # int16 products wrap
    np.testing.assert_array_equal(case.host(x), expected)


@pytest.mark.parametrize("op,ref", [("SUM", np.any), ("MAX", np.any), ("BOR", np.any),
                                    ("PRODUCT", np.all), ("MIN", np.all), ("BAND", np.all),
                                    ("BXOR", lambda s, axis: np.logical_xor.reduce(s, axis))])
def test_all_reduce_bool_is_logical(dist, case, rank, size, op, ref):
    rows = [np.array([True, r == 0, r % 2 == 1, False]) for r in range(size)]
    x = case.arr(rows[rank])
    dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=case.group)
    np.testing.assert_array_equal(case.host(x), ref(np.stack(rows), axis=0))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.complex64])
def test_all_reduce_avg_and_premul_sum(dist, case, rank, size, dtype):
    x = case.arr(local(rank, dtype=dtype))
    dist.all_reduce(x, op=dist.ReduceOp.AVG, group=case.group)
    mean = np.mean([local(r, dtype=np.float64) for r in range(size)], axis=0)
    np.testing.assert_allclose(case.host(x).astype(np.complex128), mean, rtol=1e-3)
    y = case.arr(local(rank, dtype=dtype))
    dist.all_reduce(y, op=dist._make_nccl_premul_sum(0.5), group=case.group)
    np.testing.assert_allclose(case.host(y).astype(np.complex128),
                               0.5 * sum(local(r, dtype=np.float64) for r in range(size)),
                               rtol=1e-3)


def test_all_reduce_complex_product_is_refused_as_in_torch(dist, case, rank, size):
    x = case.arr(np.array([1 + 1j, 2 - 1j], np.complex128))
    with pytest.raises(ValueError, match="not supported on complex"):
        dist.all_reduce(x, op=dist.ReduceOp.PRODUCT, group=case.group)


def test_bfloat16_sum_avg_premul(dist, case, rank, size):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    base = [np.array([1.0, 2.0, 0.5 * (r + 1), -3.0]) for r in range(size)]
    total = np.sum(base, axis=0)
    for op, expected in [(dist.ReduceOp.SUM, total), (dist.ReduceOp.AVG, total / size),
                         (dist._make_nccl_premul_sum(2.0), 2 * total)]:
        x = case.arr(base[rank].astype(bf16))
        dist.all_reduce(x, op=op, group=case.group)
        got = case.host(x)
        assert got.dtype == np.dtype(bf16)
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=1e-2)


# -- rooted collectives ------------------------------------------------------------------------
@pytest.mark.parametrize("root_last", [False, True])
def test_broadcast_and_reduce(dist, case, rank, size, root_last):
    root = size - 1 if root_last else 0
    x = case.arr(local(rank, dtype=np.float64))
    dist.broadcast(x, src=root, group=case.group)
    np.testing.assert_array_equal(case.host(x), local(root, dtype=np.float64))
    y = case.arr(local(rank, dtype=np.int64))
    work = dist.reduce(y, dst=root, op=dist.ReduceOp.MAX, group=case.group, async_op=True)
    done(dist, work, True)
    expected = local(size - 1, dtype=np.int64) if rank == root else local(rank, dtype=np.int64)
    np.testing.assert_array_equal(case.host(y), expected)


def test_reduce_premul_leaves_non_root_input(dist, case, rank, size):
    x = case.arr(local(rank))
    dist.reduce(x, dst=0, op=dist._make_nccl_premul_sum(3.0), group=case.group)
    if rank == 0:
        np.testing.assert_allclose(case.host(x), 3 * sum(local(r) for r in range(size)))
    else:
        np.testing.assert_array_equal(case.host(x), local(rank))


def test_gather_scatter_uneven(dist, case, rank, size):
    root = size - 1
    mine = case.arr(np.full(rank + 1, rank, np.int32))
    out = [case.arr(np.zeros(r + 1, np.int32)) for r in range(size)] if rank == root else None
    dist.gather(mine, out, dst=root, group=case.group)
    if rank == root:
        for r in range(size):
            np.testing.assert_array_equal(case.host(out[r]), np.full(r + 1, r))
    pieces = ([case.arr(np.arange(r + 2, dtype=np.float32) * 10 + r) for r in range(size)]
              if rank == root else None)
    recv = case.arr(np.zeros(rank + 2, np.float32))
    dist.scatter(recv, pieces, src=root, group=case.group)
    np.testing.assert_array_equal(case.host(recv), np.arange(rank + 2) * 10 + rank)


# -- gathers and reduce_scatter ---------------------------------------------------------------
def test_all_gather_even_uneven_and_in_place(dist, case, rank, size):
    outs = [case.arr(np.zeros(r + 1, np.float16)) for r in range(size)]
    dist.all_gather(outs, case.arr(np.full(rank + 1, rank, np.float16)), group=case.group)
    for r in range(size):
        np.testing.assert_array_equal(case.host(outs[r]), np.full(r + 1, r))
    full = case.arr(np.zeros(3 * size, np.int64))
    dist.all_gather_into_tensor(full, case.arr(local(rank, 3, np.int64)), group=case.group)
    np.testing.assert_array_equal(case.host(full),
                                  np.concatenate([local(r, 3, np.int64) for r in range(size)]))
    inplace = case.arr(np.zeros(2 * size, np.float32))
    inplace[2 * rank:2 * rank + 2] = case.arr(np.full(2, rank + 0.5, np.float32))
    dist.all_gather_into_tensor(inplace, inplace[2 * rank:2 * rank + 2], group=case.group)
    np.testing.assert_array_equal(case.host(inplace), np.repeat(np.arange(size) + 0.5, 2))


@pytest.mark.parametrize("op", ["SUM", "AVG", "BXOR"])
def test_reduce_scatter(dist, case, rank, size, op):
    dtype = np.int32 if op == "BXOR" else np.float32
    rows = [np.arange(2 * size, dtype=dtype) * (r + 1) for r in range(size)]
    reduced = (np.bitwise_xor.reduce(np.stack(rows), axis=0) if op == "BXOR" else
               np.mean(rows, axis=0) if op == "AVG" else np.sum(rows, axis=0))
    out = case.arr(np.zeros(2, dtype))
    dist.reduce_scatter_tensor(out, case.arr(rows[rank]), op=getattr(dist.ReduceOp, op),
                               group=case.group)
    np.testing.assert_allclose(case.host(out), reduced[2 * rank:2 * rank + 2], rtol=1e-5)
    # uneven blocks: rank r gets r + 1 elements
    inputs = [case.arr(np.full(r + 1, rank + 1, dtype)) for r in range(size)]
    out2 = case.arr(np.zeros(rank + 1, dtype))
    dist.reduce_scatter(out2, inputs, op=getattr(dist.ReduceOp, op), group=case.group)
    column = np.array([r + 1 for r in range(size)], dtype)
    expected = (np.bitwise_xor.reduce(column) if op == "BXOR" else
                column.mean() if op == "AVG" else column.sum())
    np.testing.assert_allclose(case.host(out2), np.full(rank + 1, expected), rtol=1e-5)


# -- all_to_all --------------------------------------------------------------------------------
def test_all_to_all_single_and_list(dist, case, rank, size):
    send = case.arr(np.arange(2 * size, dtype=np.int64) + 100 * rank)
    recv = case.arr(np.zeros(2 * size, np.int64))
    dist.all_to_all_single(recv, send, group=case.group)
    expected = np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r for r in range(size)])
    np.testing.assert_array_equal(case.host(recv), expected)
    # uneven: rank r sends j + 1 rows to rank j
    in_splits = [j + 1 for j in range(size)]
    out_splits = [rank + 1] * size
    send = case.arr(np.concatenate([np.full(j + 1, 10 * rank + j) for j in range(size)]))
    recv = case.arr(np.zeros(sum(out_splits), send.dtype))
    dist.all_to_all_single(recv, send, out_splits, in_splits, group=case.group)
    np.testing.assert_array_equal(case.host(recv),
                                  np.concatenate([np.full(rank + 1, 10 * r + rank)
                                                  for r in range(size)]))
    outs = [case.arr(np.zeros(3, np.float32)) for _ in range(size)]
    ins = [case.arr(np.full(3, 10 * rank + j, np.float32)) for j in range(size)]
    dist.all_to_all(outs, ins, group=case.group)
    for r in range(size):
        np.testing.assert_array_equal(case.host(outs[r]), np.full(3, 10 * r + rank))


# -- point to point ----------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_send_recv_ring_and_batch(dist, case, rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    if rank % 2 == 0:
        dist.send(case.arr(local(rank)), dst=right, group=case.group)
        got = case.arr(np.zeros(6, np.float32))
        assert dist.recv(got, src=left, group=case.group) == left
    else:
        got = case.arr(np.zeros(6, np.float32))
        assert dist.recv(got, src=left, group=case.group) == left
        dist.send(case.arr(local(rank)), dst=right, group=case.group)
    np.testing.assert_array_equal(case.host(got), local(left))
    out = case.arr(np.zeros(4, np.int16))
    ops = [dist.P2POp(dist.irecv, out, left, case.group),
           dist.P2POp(dist.isend, case.arr(np.full(4, rank, np.int16)), right, case.group)]
    works = dist.batch_isend_irecv(ops)
    for work in works:
        work.wait()
    np.testing.assert_array_equal(case.host(out), np.full(4, left))


@pytest.mark.mpi(min_size=2)
def test_p2p_before_any_collective(dist, case, rank, size):
    """A fresh group whose first GPU call is a send/recv between one pair."""
    backend = "mpi" if case.backend == "mpi" else "cpu:mpi,cuda:nccl"
    pg = dist.new_group(list(range(size)), backend=backend)
    try:
        pairs = size - size % 2
        if rank < pairs:
            peer = rank + 1 if rank % 2 == 0 else rank - 1
            buf = case.arr(np.full(5, rank, np.float64))
            if rank % 2 == 0:
                dist.send(buf, dst=peer, group=pg)
            else:
                dist.recv(buf, src=peer, group=pg)
                np.testing.assert_array_equal(case.host(buf), np.full(5, peer))
        x = case.arr(np.ones(3, np.float32))
        dist.all_reduce(x, group=pg)
        np.testing.assert_array_equal(case.host(x), np.full(3, size))
    finally:
        dist.destroy_process_group(pg)


# -- Work and futures --------------------------------------------------------------------------
def test_work_future_and_result(dist, case, rank, size):
    x = case.arr(np.full(4, rank + 1, np.float32))
    work = dist.all_reduce(x, group=case.group, async_op=True)
    fut = work.get_future()
    value = fut.wait()
    assert len(value) == 1 and value[0] is x
    assert work.is_completed() and work.is_success()
    np.testing.assert_array_equal(case.host(x), np.full(4, size * (size + 1) / 2))


# -- NCCL-backend specifics (simulated device) ------------------------------------------------
def test_nccl_timeout_aborts_communicator(dist, case, rank, size):
    """A GPU op that never finishes: the watchdog aborts NCCL, wait() raises the timeout."""
    if case.lib != "sim" or case.backend != "nccl":
        pytest.skip("needs the simulated device to hold an event pending forever")
    pg = dist.new_group(list(range(size)), backend="cpu:mpi,cuda:nccl", timeout=0.5)
    import cupy

    try:
        x = cupy.asarray(np.ones(2, np.float32))
        dist.all_reduce(x, group=pg)  # makes the NCCL communicator
        comm = pg.communicator("cuda")
        made = list(comm._created)
        cupy.cuda.Event.stuck = True
        try:
            work = dist.all_reduce(x, group=pg, async_op=True)
        finally:
            cupy.cuda.Event.stuck = False
        assert not work.is_completed()
        import time

        comm.watchdog.check(time.monotonic() + 10)
        assert all(m.aborted for m in made)
        with pytest.raises(dist.DistTimeoutError, match="ncclCommAbort"):
            work.wait()
        with pytest.raises(dist.DistTimeoutError):
            dist.all_reduce(x, group=pg)
    finally:
        dist.destroy_process_group(pg)


def test_nccl_recv_needs_a_source(dist, case, rank, size):
    if case.backend != "nccl":
        pytest.skip("NCCL-only restriction")
    with pytest.raises(dist.DistError, match="any source"):
        dist.recv(case.arr(np.zeros(1, np.float32)), group=case.group)



def _sim_uuids(uuid=None):
    """Give this rank's simulated device 0 the UUID ``uuid`` (``None``: no UUID)."""
    import cupy

    cupy.cuda.uuids.clear()
    if uuid is not None:
        cupy.cuda.uuids[0] = uuid


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("first", ["collective", "send"])
def test_two_ranks_on_one_gpu_are_named_on_every_rank(dist, case, rank, size, first):
    """Ranks 0 and 1 report one device UUID: each rank that would create the NCCL
    communicator raises the same clear error before NCCL is asked (which would say only
    NCCL_ERROR_INVALID_USAGE)."""
    if case.lib != "sim" or case.backend != "nccl":
        pytest.skip("needs the simulated device to report chosen UUIDs")
    import socket

    _sim_uuids(bytes(range(16)) if rank < 2 else bytes([rank]) * 16)
    pg = dist.new_group(list(range(size)), backend="cpu:mpi,cuda:nccl")
    try:
        x = case.arr(np.ones(3, np.float32))
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
        _sim_uuids(None)
        dist.destroy_process_group(pg)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("first", ["collective", "send"])
def test_a_rank_missing_from_nccl_creation_is_named_on_every_rank(dist, case, rank, size,
                                                                 first):
    """The last rank never makes the GPU call that creates a communicator (the group's,
    or the pair of ranks 0 and the last): every rank that came raises a timeout within
    the group's timeout naming it, instead of waiting in NCCL's creation, and the group's
    CPU side stays usable."""
    if case.lib != "sim" or case.backend != "nccl":
        pytest.skip("needs the simulated device (a communicator creation that can hang)")
    import time

    last = size - 1
    pg = dist.new_group(list(range(size)), backend="cpu:mpi,cuda:nccl", timeout=1.5)
    try:
        x = case.arr(np.ones(3, np.float32))
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


def test_the_unique_id_reaches_every_rank_in_the_form_cupy_gave_it(dist, case, rank, size):
    """CuPy 13 and later give and take the id as bytes, earlier releases as a tuple of
    signed chars: the meeting hands each rank the form the first rank's CuPy made."""
    if case.lib != "sim" or case.backend != "nccl":
        pytest.skip("needs the simulated device")
    import cupy
    from mpi4py import MPI

    from hpccomm.backends.cuda import shared_gpu

    comm = MPI.COMM_WORLD.Dup()
    try:
        for made in (bytes(range(128)), tuple(range(-64, 64))):
            got = shared_gpu.meet(comm, list(range(size)), "group", cupy, 0, 10.0,
                                  lambda: made)
            assert type(got) is type(made) and got == made, (type(got), got)
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_first_rank_missing_from_nccl_creation_is_named_on_every_rank(dist, case, rank,
                                                                        size):
    """Rank 0, which answers the others' meeting, does not make the call in time: the
    others raise a timeout naming it, after the group's timeout and the answer's grace.
    When rank 0 makes it later, it does not take their old arrivals for a meeting (and
    go on into NCCL's creation alone): it raises a timeout naming them."""
    if case.lib != "sim" or case.backend != "nccl":
        pytest.skip("needs the simulated device (a communicator creation that can hang)")
    pg = dist.new_group(list(range(size)), backend="cpu:mpi,cuda:nccl", timeout=1.5)
    try:
        text = None
        if rank != 0:
            with pytest.raises(dist.DistTimeoutError) as caught:
                dist.all_reduce(case.arr(np.ones(3, np.float32)), group=pg)
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
                dist.all_reduce(case.arr(np.ones(3, np.float32)), group=pg)
            others = "rank 1 of the group" if size == 2 else "ranks 1"
            assert others in str(caught.value) and "never came" in str(caught.value), \
                str(caught.value)
        dist.barrier()  # (on WORLD: the group's timeout is shorter than rank 0's wait)
    finally:
        dist.destroy_process_group(pg)


@pytest.mark.mpi(min_size=3)
def test_ranks_calling_for_different_nccl_communicators_are_named(dist, case, rank, size):
    """Rank 2 sends to rank 0 (their pair communicator) while the others all_reduce (the
    group's): rank 0, first of both, takes rank 2's coming for the group's meeting and
    refuses it, and every rank raises the same error naming what each came to make;
    nothing waits in NCCL."""
    if case.lib != "sim" or case.backend != "nccl":
        pytest.skip("needs the simulated device")
    pg = dist.new_group(list(range(size)), backend="cpu:mpi,cuda:nccl", timeout=5)
    try:
        x = case.arr(np.ones(3, np.float32))
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
def test_ranks_on_distinct_gpus_pass_the_check(dist, case, rank, size):
    if case.lib != "sim" or case.backend != "nccl":
        pytest.skip("needs the simulated device to report chosen UUIDs")
    _sim_uuids(bytes([rank + 1]) * 16)
    pg = dist.new_group(list(range(size)), backend="cpu:mpi,cuda:nccl")
    try:
        x = case.arr(np.ones(3, np.float32))
        dist.all_reduce(x, group=pg)
        np.testing.assert_array_equal(case.host(x), np.full(3, size))
    finally:
        _sim_uuids(None)
        dist.destroy_process_group(pg)


# -- per-call cost and CUDA graph capture (simulated device) ----------------------------------
# Countable, not timed: the simulation counts the events, streams and arrays made and the
# event records and stream waits (cupy.cuda.counts), and fails loudly on what CUDA refuses
# during a stream capture (cupy.cuda.violations). benchmarks/studies/gpu_call_cost.py times.

def _sim_nccl(case):
    if case.lib != "sim" or case.backend != "nccl":
        pytest.skip("counts and capture are the simulated device's (NCCL backend)")
    import cupy

    return cupy


def _buffers(case, size):
    return {"x": case.arr(np.zeros(4, np.float32)), "y": case.arr(np.zeros(4, np.float32)),
            "full": case.arr(np.zeros(4 * size, np.float32)),
            "full2": case.arr(np.zeros(4 * size, np.float32))}


#: Each synchronous tensor collective on the buffers of _buffers.
SYNC_CALLS = {
    "all_reduce": lambda d, g, b: d.all_reduce(b["x"], group=g),
    "broadcast": lambda d, g, b: d.broadcast(b["x"], src=0, group=g),
    "reduce": lambda d, g, b: d.reduce(b["x"], dst=0, group=g),
    "all_gather_into_tensor": lambda d, g, b: d.all_gather_into_tensor(b["full"], b["x"],
                                                                       group=g),
    "reduce_scatter_tensor": lambda d, g, b: d.reduce_scatter_tensor(b["x"], b["full"],
                                                                     group=g),
    "all_to_all_single": lambda d, g, b: d.all_to_all_single(b["full2"], b["full"], group=g),
}


def _expected(op, rank, size):
    """(setup values, expected output name, expected values) of one call of SYNC_CALLS."""
    ranks = np.arange(size)
    if op == "all_reduce":
        return {"x": np.full(4, rank + 1.0)}, "x", np.full(4, (ranks + 1).sum())
    if op == "broadcast":
        return {"x": np.full(4, rank + 1.0)}, "x", np.full(4, 1.0)
    if op == "reduce":
        return ({"x": np.full(4, rank + 1.0)}, "x",
                np.full(4, (ranks + 1).sum() if rank == 0 else rank + 1.0))
    if op == "all_gather_into_tensor":
        return {"x": np.full(4, rank + 1.0)}, "full", np.repeat(ranks + 1.0, 4)
    full = np.arange(4.0 * size) + 100 * rank
    if op == "reduce_scatter_tensor":
        return ({"full": full}, "x",
                size * np.arange(4.0 * rank, 4 * rank + 4) + 100 * ranks.sum())
    return ({"full": full}, "full2",
            np.concatenate([np.arange(4.0 * rank, 4 * rank + 4) + 100 * r for r in ranks]))


@pytest.mark.parametrize("op", list(SYNC_CALLS))
def test_a_synchronous_gpu_call_makes_no_event_allocation_or_stream_wait(dist, case, rank,
                                                                          size, op):
    """After warm-up, a synchronous call is enqueued on the caller's stream: no CUDA event
    made (the done event comes from a pool), no array allocated, no cross-stream wait;
    one event record per call, which the watchdog times."""
    cupy = _sim_nccl(case)
    bufs, call = _buffers(case, size), SYNC_CALLS[op]
    for _ in range(3):  # the NCCL communicator, the reduction plan, the event pool
        call(dist, case.group, bufs)
    counts = cupy.cuda.counts
    before = dict(counts)
    for _ in range(50):
        call(dist, case.group, bufs)
    made = {key: counts[key] - before[key] for key in counts}
    assert (made["events"], made["streams"], made["allocations"]) == (0, 0, 0), made
    assert made["waits"] == 0, made
    assert made["records"] == 50, made
    values, out, expected = _expected(op, rank, size)  # and the fast path is right
    for name, host in values.items():
        bufs[name][...] = cupy.asarray(host.astype(np.float32))
    call(dist, case.group, bufs)
    np.testing.assert_array_equal(case.host(bufs[out]), expected)


def test_a_synchronous_call_is_ordered_after_an_earlier_async_one(dist, case, rank, size):
    """Async calls run on the backend's stream, synchronous ones on the caller's: the
    first synchronous call after an async one waits for it there (one stream wait), so
    this rank's calls reach the device in the order they were made."""
    cupy = _sim_nccl(case)
    x, y = case.arr(np.zeros(4, np.float32)), case.arr(np.zeros(4, np.float32))
    for _ in range(2):
        dist.all_reduce(x, group=case.group)
    work = dist.all_reduce(y, group=case.group, async_op=True)
    before = cupy.cuda.counts["waits"]
    for _ in range(3):
        dist.all_reduce(x, group=case.group)
    assert cupy.cuda.counts["waits"] - before == 1
    work.wait()


def test_async_gpu_calls_reuse_their_done_events(dist, case, rank, size):
    """An async call waited for before its event is reaped gives the event back: after
    warm-up, events are not made per call (at most one per watchdog round that finds a
    Work not yet waited for)."""
    cupy = _sim_nccl(case)
    x = case.arr(np.zeros(4, np.float32))
    for _ in range(3):
        dist.all_reduce(x, group=case.group, async_op=True).wait()
    before = dict(cupy.cuda.counts)
    for _ in range(50):
        dist.all_reduce(x, group=case.group, async_op=True).wait()
    made = {key: cupy.cuda.counts[key] - before[key] for key in before}
    assert made["events"] <= 2 and made["allocations"] == 0, made


def test_a_stuck_synchronous_call_is_timed_out_by_the_watchdog(dist, case, rank, size):
    """The stream channel builds no Work, yet its event is watched: a synchronous call
    that never finishes aborts NCCL, and the next call raises the timeout."""
    cupy = _sim_nccl(case)
    pg = dist.new_group(list(range(size)), backend="cpu:mpi,cuda:nccl", timeout=0.5)
    try:
        x = cupy.asarray(np.ones(2, np.float32))
        dist.all_reduce(x, group=pg)
        dist.all_reduce(x, group=pg)  # the stream channel from now on
        comm = pg.communicator("cuda")
        made = list(comm._created)
        cupy.cuda.Event.stuck = True
        try:
            assert dist.all_reduce(x, group=pg) is None
        finally:
            cupy.cuda.Event.stuck = False
        import time

        comm.watchdog.check(time.monotonic() + 10)
        assert all(m.aborted for m in made)
        with pytest.raises(dist.DistTimeoutError, match="synchronous all_reduce"):
            dist.all_reduce(x, group=pg)
    finally:
        dist.destroy_process_group(pg)


def test_the_simulated_capture_refuses_what_cuda_refuses(case):
    """The check the capture tests rely on: each forbidden call fails loudly."""
    cupy = _sim_nccl(case)
    stream = cupy.cuda.Stream(non_blocking=True)
    event, made = cupy.cuda.Event(), cupy.zeros(3)
    del cupy.cuda.violations[:]
    with stream:
        stream.begin_capture()
        try:
            for forbidden in (lambda: cupy.empty(3), lambda: stream.synchronize(),
                              lambda: event.synchronize(), lambda: event.done,
                              lambda: cupy.asnumpy(made)):
                with pytest.raises(RuntimeError, match="during a stream capture"):
                    forbidden()
            assert stream.is_capturing()
            event.record(stream)
        finally:
            graph = stream.end_capture()
    assert len(cupy.cuda.violations) == 5
    assert graph.captured == ["record"]
    stream.begin_capture()  # an event recorded in a capture, queried from another thread
    try:
        event.record(stream)
        with pytest.raises(RuntimeError, match="during a stream capture"):
            threading_query(event)
    finally:
        stream.end_capture()
    del cupy.cuda.violations[:]


def threading_query(event):
    """Query ``event`` from another thread; re-raise what that raised."""
    import threading

    errors = []

    def query():
        try:
            event.done
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    thread = threading.Thread(target=query)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def test_collectives_captured_in_a_cuda_graph_make_no_forbidden_call(dist, case, rank,
                                                                      size):
    """In a capture, synchronous and async_op collectives are enqueued on the capturing
    stream and nothing else: no host synchronization, no event made, recorded, queried
    or waited for, no allocation; an async Work is complete at once."""
    cupy = _sim_nccl(case)
    bufs = _buffers(case, size)
    x, y, full = bufs["x"], bufs["y"], bufs["full"]
    calls = [lambda a: dist.all_reduce(x, group=case.group, async_op=a),
             lambda a: dist.broadcast(x, src=0, group=case.group, async_op=a),
             lambda a: dist.all_gather_into_tensor(full, y, group=case.group, async_op=a),
             lambda a: dist.reduce_scatter_tensor(y, full, group=case.group, async_op=a),
             lambda a: dist.all_reduce(y, op=dist.ReduceOp.MAX, group=case.group,
                                       async_op=a)]
    for call in calls:  # outside the capture first: the communicator, the plans
        call(False)
    stream = cupy.cuda.Stream(non_blocking=True)
    del cupy.cuda.violations[:]
    before = dict(cupy.cuda.counts)
    with stream:
        stream.begin_capture()
        try:
            for call in calls:
                assert call(False) is None
            for call in calls:
                work = call(True)
                assert work.is_completed()
                assert work.wait() is True
        finally:
            graph = stream.end_capture()
    assert cupy.cuda.violations == []  # an event query by this thread would be one
    # Queries are not counted here: the watchdog's thread may still be querying the events
    # of the calls made before the capture, which is allowed while another thread captures.
    made = {key: cupy.cuda.counts[key] - before[key] for key in before if key != "queries"}
    assert made == dict(made, events=0, allocations=0, records=0, waits=0), made
    names = ["allReduce", "broadcast", "allGather", "reduceScatter", "allReduce"]
    assert graph.captured == names * 2  # all on the capturing stream, nothing else


def test_what_cannot_be_captured_is_refused_before_anything_is_done(dist, case, rank, size):
    """Operations that would allocate per call (staged dtypes, reductions NCCL lacks,
    list forms), or make an NCCL communicator, raise inside a capture, having made
    no call CUDA refuses; MPI on CuPy arrays refuses every capture."""
    if case.lib != "sim":
        pytest.skip("the simulated device's capture")
    import cupy

    x = case.arr(np.ones(4, np.float32))
    dist.all_reduce(x, group=case.group)
    i16, i32 = case.arr(np.ones(4, np.int16)), case.arr(np.ones(4, np.int32))
    outs = [case.arr(np.ones(4, np.float32)) for _ in range(size)]
    full = case.arr(np.ones(4 * size, np.float32))
    made = [lambda: dist.all_reduce(i16, group=case.group),
            lambda: dist.all_reduce(i32, op=dist.ReduceOp.BXOR, group=case.group),
            lambda: dist.all_gather(outs, x, group=case.group),
            lambda: dist.reduce_scatter_tensor(x, full, op=dist._make_nccl_premul_sum(2.0),
                                               group=case.group),
            lambda: dist.all_to_all_single(full, full, group=case.group)]
    if case.backend == "mpi":
        made = made[:1] + [lambda: dist.all_reduce(x, group=case.group)]
    fresh = dist.new_group(list(range(size)), backend="cpu:mpi,cuda:nccl")
    if case.backend == "nccl":
        made.append(lambda: dist.all_reduce(x, group=fresh))
    stream = cupy.cuda.Stream(non_blocking=True)
    del cupy.cuda.violations[:]
    try:
        with stream:
            stream.begin_capture()
            try:
                for index, call in enumerate(made):
                    with pytest.raises(dist.DistError, match="CUDA graph") as info:
                        call()
                    assert "during a stream capture" not in str(info.value), index
            finally:
                stream.end_capture()
    finally:
        dist.destroy_process_group(fresh)
    assert cupy.cuda.violations == []


def test_a_torch_capture_puts_the_collective_on_torchs_stream(dist, case, rank, size,
                                                              monkeypatch):
    """While torch captures on its current stream, CuPy's current stream is not the one
    capturing: the collective goes to torch's stream, into torch's graph."""
    cupy = _sim_nccl(case)
    torch = pytest.importorskip("torch")
    x = case.arr(np.ones(4, np.float32))
    dist.all_reduce(x, group=case.group)
    stream = cupy.cuda.Stream(non_blocking=True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", stream.is_capturing)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: type("S", (), {"cuda_stream": stream.ptr})())
    del cupy.cuda.violations[:]
    stream.begin_capture()  # torch's capture: not CuPy's current stream
    try:
        dist.all_reduce(x, group=case.group)
        dist.all_reduce(x, group=case.group, async_op=True).wait()
    finally:
        graph = stream.end_capture()
    assert cupy.cuda.violations == []
    assert graph.captured == ["allReduce", "allReduce"]


# -- pure helpers (no device needed) ------------------------------------------------------------
def test_reduction_plans_cover_what_nccl_lacks():
    import types

    from hpccomm.backends.cuda.nccl_plan import make_plan

    nccl = types.SimpleNamespace(
        NCCL_SUM=0, NCCL_PROD=1, NCCL_MAX=2, NCCL_MIN=3, NCCL_AVG=4, NCCL_INT8=0,
        NCCL_UINT8=1, NCCL_INT32=2, NCCL_UINT32=3, NCCL_INT64=4, NCCL_UINT64=5,
        NCCL_FLOAT16=6, NCCL_FLOAT32=7, NCCL_FLOAT64=8, NCCL_BFLOAT16=9)
    op = __import__("hpccomm").ReduceOp
    plan = make_plan(nccl, np.dtype(np.complex64), op.SUM, True)
    assert (plan.mode, plan.nccl_type, plan.unit) == ("native", 7, np.dtype(np.float32))
    assert make_plan(nccl, np.dtype(np.complex64), op.PRODUCT, True).mode == "gather"
    assert make_plan(nccl, np.dtype(np.int32), op.BXOR, True).mode == "gather"
    assert make_plan(nccl, np.dtype(bool), op.SUM, True).nccl_op == nccl.NCCL_MAX
    assert make_plan(nccl, np.dtype(bool), op.BAND, True).nccl_op == nccl.NCCL_MIN
    staged = make_plan(nccl, np.dtype(np.int16), op.SUM, True)
    assert staged.mode == "stage" and staged.stage == np.dtype(np.int32)
    assert make_plan(nccl, np.dtype(np.float32), op.AVG, True)[2:] == (4, np.dtype("f4"), None,
                                                                        False)
    old = make_plan(nccl, np.dtype(np.float32), op.AVG, False)  # NCCL < 2.10: sum, divide
    assert old.nccl_op == nccl.NCCL_SUM and old.divide


def test_bfloat16_bit_conversions_round_to_nearest_even():
    from hpccomm.backends.cuda import device as _cuda

    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.array([1.0, -2.5, 3.14159, 1e-3, 65504.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8],
                      np.float32)
    bits = _cuda.float32_to_bf16_bits(np, values)
    np.testing.assert_array_equal(bits, values.astype(ml_dtypes.bfloat16).view(np.uint16))
    back = _cuda.bf16_bits_to_float32(np, bits)
    np.testing.assert_array_equal(back, values.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert _cuda.float32_to_bf16_bits(np, np.array([np.nan], np.float32))[0] == 0x7FC0


def test_device_choice_is_fixed_by_device_id_or_local_rank():
    from hpccomm.backends.cuda import device as _cuda

    assert _cuda.choose_device(None, 5, 4) == 1
    assert _cuda.choose_device(2, 0, 4) == 2
    with pytest.raises(Exception, match="out of range"):
        _cuda.choose_device(4, 0, 4)
    with pytest.raises(Exception, match="no CUDA device"):
        _cuda.choose_device(None, 0, 0)


def test_nccl_available_matches_the_machine():
    """True only with CuPy, a visible device and NCCL; False here without them."""
    assert NCCL_AVAILABLE_AT_IMPORT is (GPU_SKIP is None)
