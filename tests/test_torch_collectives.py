"""torch.distributed on backend "hpccomm": every c10d operation, dtype and ReduceOp.

Runs in the MPI sessions of the suite (2 and 4 ranks) with torch's default group made by
``init_process_group("hpccomm", init_method="mpi://")`` for this module and destroyed
after it, so later tests see no torch group. Inputs are built from the rank, so every
rank computes the expected result locally.
"""
import datetime
import time

import pytest

from helpers import skip_below_thread_multiple
from torch_cases import TIMEOUT, assert_close, dist, torch
from torch_cases import rank, size  # noqa: F401 (fixtures)

pytestmark = pytest.mark.mpi(min_size=2)

R = dist.ReduceOp

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
          torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
          torch.complex128]
FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
COMPLEX = {torch.complex64, torch.complex128}


@pytest.fixture(scope="module")
def torch_world():
    """torch's default group on "hpccomm" for this module (2 or 4 ranks)."""
    dist.init_process_group("hpccomm", init_method="mpi://", timeout=TIMEOUT)
    yield dist.group.WORLD
    dist.destroy_process_group()


def value(rank, dtype, n=6):
    """Rank ``rank``'s input: small numbers, exact in every dtype (bool: rank parity)."""
    base = torch.arange(n, dtype=torch.float64) % 3 + rank + 1
    if dtype is torch.bool:
        return (torch.arange(n) + rank) % 2 == 0
    if dtype in COMPLEX:
        return (base + 1j * (rank + 1)).to(dtype)
    return base.to(dtype)


# -- identity ---------------------------------------------------------------------------------
def test_backend_and_group(torch_world, rank, size):
    from mpi4py import MPI

    assert dist.get_backend() == "hpccomm"
    assert dist.is_initialized()
    assert (rank, size) == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
    assert torch_world.name() == "hpccomm"
    assert torch_world.group_name == dist.distributed_c10d._get_default_group().group_name
    assert [d.type for d in torch_world._device_types] == ["cpu"]
    assert type(torch_world).__name__ == "ProcessGroupHPC"


# -- all_reduce -------------------------------------------------------------------------------
def _reference(op, inputs, dtype):
    stacked = torch.stack([x.to(torch.complex128 if dtype in COMPLEX else torch.float64)
                           if dtype is not torch.bool else x for x in inputs])
    if dtype is torch.bool:
        return {R.SUM: stacked.any(0), R.MAX: stacked.any(0), R.BOR: stacked.any(0),
                R.PRODUCT: stacked.all(0), R.MIN: stacked.all(0), R.BAND: stacked.all(0),
                R.BXOR: stacked.sum(0) % 2 == 1}[op]
    if op in (R.BAND, R.BOR, R.BXOR):
        combine = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or,
                   R.BXOR: torch.bitwise_xor}[op]
        ints = stacked.to(torch.int64)
        out = ints[0]
        for other in ints[1:]:
            out = combine(out, other)
        return out
    return {R.SUM: stacked.sum(0), R.AVG: stacked.mean(0), R.PRODUCT: stacked.prod(0),
            R.MIN: stacked.amin(0) if dtype not in COMPLEX else None,
            R.MAX: stacked.amax(0) if dtype not in COMPLEX else None}[op]


def _defined(op, dtype):
    """Whether torch's CPU backends reduce ``dtype`` with ``op`` (via dist.all_reduce)."""
    if dtype in COMPLEX:
        return op in (R.SUM, R.AVG, "PREMUL")
    if op in (R.BAND, R.BOR, R.BXOR):
        return dtype not in FLOATS
    if op in (R.AVG, "PREMUL"):
        return dtype in FLOATS
    return True


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_reduce_every_op(torch_world, rank, size, dtype):
    for op in (R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR, "PREMUL"):
        if not _defined(op, dtype):
            continue
        x = value(rank, dtype)
        if op == "PREMUL":
            dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
            expected = _reference(R.SUM, [value(r, dtype) for r in range(size)], dtype) * 0.5
        else:
            dist.all_reduce(x, op=op)
            expected = _reference(op, [value(r, dtype) for r in range(size)], dtype)
        assert x.dtype is dtype
        assert_close(x, expected)


def test_all_reduce_undefined_op_is_a_clear_error(torch_world, rank):
    x = torch.ones(3, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"all_reduce on rank \d+/\d+ of group .*AVG"):
        dist.all_reduce(x, op=R.AVG)
    with pytest.raises(ValueError, match="bitwise op BAND"):
        dist.all_reduce(torch.ones(2), op=R.BAND)


def test_all_reduce_premul_sum_with_tensor_factor(torch_world, rank, size):
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(torch.tensor([0.25])))
    assert_close(x, torch.full((3,), 0.25 * sum(range(1, size + 1))))


def test_complex_reaches_the_group_unsplit(torch_world, rank, size):
    """C++ callers hand complex tensors to the group as they are (not as real views)."""
    x = value(rank, torch.complex64)
    opts = dist.AllreduceOptions()
    torch_world.allreduce([x], opts).wait()
    assert_close(x, sum(value(r, torch.complex64) for r in range(size)))


@pytest.mark.parametrize("view", ["conj", "neg"])
def test_lazy_conjugate_and_negative_views_are_refused(torch_world, rank, size, view):
    """A blocking sum of a view whose values are not its memory (a lazy conjugate or
    negative bit) is refused on every path: summing the memory as is would be wrong
    wherever the ranks' bits differ."""
    x = value(rank, torch.complex64) if view == "conj" else torch.ones(3)
    lazy = x.conj() if view == "conj" else x._neg_view()
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    with pytest.raises(ValueError, match=r"all_reduce on rank \d+/\d+ .*resolve_conj"):
        torch_world.allreduce([lazy], opts)
    torch_world.allreduce([lazy.resolve_conj().resolve_neg()], opts)  # the group goes on


def test_non_contiguous_tensor_is_reduced_in_place(torch_world, rank, size):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank
    x = base.t()  # a non-contiguous view: staged, then copied back into base
    dist.all_reduce(x)
    expected = sum(torch.arange(12, dtype=torch.float32).reshape(3, 4) + r for r in range(size))
    assert_close(base, expected)


def test_requires_grad_and_zero_dim_tensors(torch_world, rank, size):
    w = torch.full((2,), float(rank), requires_grad=True)
    with torch.no_grad():
        dist.all_reduce(w)
    assert_close(w.detach(), torch.full((2,), float(sum(range(size)))))
    s = torch.tensor(float(rank))
    dist.all_reduce(s, op=R.MAX)
    assert s.item() == size - 1


# SUM goes the direct form (buffer address per call), MAX through a reused NumPy view.
REUSE_OPS = {"sum": (dist.ReduceOp.SUM, lambda size: float(sum(range(size)))),
             "max": (dist.ReduceOp.MAX, lambda size: float(size - 1))}


@pytest.mark.parametrize("op_name", sorted(REUSE_OPS))
def test_a_tensor_reduced_again_follows_its_memory(torch_world, rank, size, op_name):
    """A tensor reduced repeatedly; changing its memory, size or dtype in place must send
    the next reduction to the new memory."""
    op, expected = REUSE_OPS[op_name]
    total = expected(size)
    x = torch.full((4,), float(rank))
    for _ in range(3):  # the second and third calls reuse what the first found
        x.fill_(float(rank))
        dist.all_reduce(x, op=op)
        assert_close(x, torch.full((4,), total))
    x.set_(torch.full((6,), float(rank)))  # new storage, new size
    dist.all_reduce(x, op=op)
    assert_close(x, torch.full((6,), total))
    x.resize_(3)  # same memory, fewer elements
    x.fill_(float(rank))
    dist.all_reduce(x, op=op)
    assert_close(x, torch.full((3,), total))
    x.data = torch.full((5,), rank, dtype=torch.int64)  # another dtype, same Python object
    dist.all_reduce(x, op=op)
    assert x.dtype is torch.int64
    assert_close(x, torch.full((5,), total))


@pytest.mark.parametrize("op_name", sorted(REUSE_OPS))
def test_reducing_a_tensor_does_not_keep_it_alive(torch_world, rank, size, op_name):
    import gc
    import weakref

    from hpccomm.torch import _tensors

    x = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(x, op=REUSE_OPS[op_name][0])
    key, ref = id(x), weakref.ref(x)
    if op_name == "max":
        assert key in _tensors._SEEN
    del x
    gc.collect()
    assert ref() is None, "the reduction kept the tensor alive"
    assert key not in _tensors._SEEN


def _direct_form():
    from hpccomm.backends.mpi import direct as mpi_direct

    return mpi_direct.available()


@pytest.mark.skipif(not _direct_form(), reason="the C helper backends/mpi/_direct.c is not built "
                    "(no C compiler at install) or HPCCOMM_MPI_DIRECT=0")
def test_blocking_sums_take_the_direct_form(torch_world, rank, size, monkeypatch):
    """A blocking SUM of a contiguous float32 tensor starts through the C helper; a
    non-contiguous one, an async one and another op do not, and all agree."""
    from hpccomm import _call

    from helpers import record_returns

    calls = record_returns(monkeypatch, "hpccomm.torch.operations._sum_in_place",
                           _call.sum_in_place)
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)
    assert calls == [True]
    assert_close(x, torch.full((5,), float(size * (size + 1) // 2)))
    strided = torch.full((4, 2), float(rank + 1))[:, 0]
    dist.all_reduce(strided)
    dist.all_reduce(x, async_op=True).wait()
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    assert calls == [True], "only the first call fits the direct form"
    assert_close(strided, torch.full((4,), float(size * (size + 1) // 2)))


def test_a_direct_sum_outlasting_its_spin_completes(torch_world, rank, size):
    """Rank 0 joins late, past the C helper's spin: the others' sums go on waiting the
    general way and complete with the right values."""
    from hpccomm.backends.mpi import direct as mpi_direct

    if rank == 0:
        time.sleep(3 * mpi_direct.SLICE_S)
    x = torch.arange(1000, dtype=torch.float64) + rank
    dist.all_reduce(x)
    assert_close(x, torch.arange(1000, dtype=torch.float64) * size + sum(range(size)))


# -- broadcast, reduce ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_broadcast_every_dtype_and_root(torch_world, rank, size, dtype):
    for src in range(size):
        x = value(rank, dtype)
        dist.broadcast(x, src=src)
        assert_close(x, value(src, dtype))


def test_reduce_to_every_root(torch_world, rank, size):
    for dst in range(size):
        for op in (R.SUM, R.MAX, R.AVG):
            x = value(rank, torch.float32)
            dist.reduce(x, dst=dst, op=op)
            if rank == dst:
                assert_close(x, _reference(op, [value(r, torch.float32) for r in range(size)],
                                           torch.float32))
            else:
                assert_close(x, value(rank, torch.float32))  # untouched elsewhere
    y = value(rank, torch.bfloat16)
    dist.reduce(y, dst=0, op=dist._make_nccl_premul_sum(2.0))
    if rank == 0:
        assert_close(y, 2 * _reference(R.SUM, [value(r, torch.bfloat16) for r in range(size)],
                                       torch.bfloat16))


# -- gathers and scatters ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_gather_variants(torch_world, rank, size, dtype):
    parts = [torch.empty(6, dtype=dtype) for _ in range(size)]
    dist.all_gather(parts, value(rank, dtype))
    for r, part in enumerate(parts):
        assert_close(part, value(r, dtype))
    out = torch.empty(6 * size, dtype=dtype)
    dist.all_gather_into_tensor(out, value(rank, dtype))
    assert_close(out, torch.cat([value(r, dtype) for r in range(size)]))
    out2 = torch.empty(size, 6, dtype=dtype)
    dist.all_gather_single(out2, value(rank, dtype))
    assert_close(out2.reshape(-1), torch.cat([value(r, dtype) for r in range(size)]))


def test_all_gather_in_place_slice_of_output(torch_world, rank, size):
    """FSDP2's pattern: the input is this rank's slice of the output (MPI_IN_PLACE)."""
    out = torch.zeros(size * 5)
    mine = out[rank * 5:(rank + 1) * 5]
    mine.copy_(torch.full((5,), float(rank)))
    dist.all_gather_into_tensor(out, mine)
    assert_close(out, torch.cat([torch.full((5,), float(r)) for r in range(size)]))


def test_all_gather_uneven_sizes(torch_world, rank, size):
    parts = [torch.empty(r + 1) for r in range(size)]
    dist.all_gather(parts, torch.full((rank + 1,), float(rank)))
    for r, part in enumerate(parts):
        assert_close(part, torch.full((r + 1,), float(r)))


def test_gather_and_scatter_every_root(torch_world, rank, size):
    for root in range(size):
        gathered = [torch.empty(6) for _ in range(size)] if rank == root else None
        dist.gather(value(rank, torch.float32), gathered, dst=root)
        if rank == root:
            for r, part in enumerate(gathered):
                assert_close(part, value(r, torch.float32))
        out = torch.empty(6, dtype=torch.int64)
        chunks = [value(r, torch.int64) * 10 for r in range(size)] if rank == root else None
        dist.scatter(out, chunks, src=root)
        assert_close(out, value(rank, torch.int64) * 10)


@pytest.mark.parametrize("op", [R.SUM, R.AVG, R.MAX, "PREMUL"], ids=str)
def test_reduce_scatter_variants(torch_world, rank, size, op):
    red = dist._make_nccl_premul_sum(0.5) if op == "PREMUL" else op
    base = R.SUM if op == "PREMUL" else op
    scale = 0.5 if op == "PREMUL" else 1.0
    inputs = [value(rank, torch.float32) + i for i in range(size)]
    out = torch.empty(6)
    dist.reduce_scatter(out, inputs, op=red)
    rows = [value(r, torch.float32) + rank for r in range(size)]
    assert_close(out, scale * _reference(base, rows, torch.float32))
    whole = torch.cat(inputs)
    out2 = torch.empty(6)
    dist.reduce_scatter_tensor(out2, whole, op=red)
    assert_close(out2, out)
    out3 = torch.empty(6)
    dist.reduce_scatter_single(out3, whole, op=red)
    assert_close(out3, out)


def test_reduce_scatter_bfloat16_avg(torch_world, rank, size):
    whole = torch.cat([torch.full((4,), float(rank + i)) for i in range(size)]).bfloat16()
    out = torch.empty(4, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(out, whole, op=R.AVG)
    assert_close(out, torch.full((4,), sum(r + rank for r in range(size)) / size))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_moving_ops_every_dtype(torch_world, rank, size, dtype):
    """scatter, gather, all_to_all_single and send/recv carry every dtype unchanged."""
    root = size - 1
    out = torch.empty(6, dtype=dtype)
    dist.scatter(out, [value(r, dtype) for r in range(size)] if rank == root else None,
                 src=root)
    assert_close(out, value(rank, dtype))
    parts = [torch.empty(6, dtype=dtype) for _ in range(size)] if rank == root else None
    dist.gather(value(rank, dtype), parts, dst=root)
    if rank == root:
        for r, part in enumerate(parts):
            assert_close(part, value(r, dtype))
    send = torch.cat([value(rank, dtype)[:2] for _ in range(size)])
    recv = torch.empty(2 * size, dtype=dtype)
    dist.all_to_all_single(recv, send)
    assert_close(recv, torch.cat([value(r, dtype)[:2] for r in range(size)]))
    right, left = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(6, dtype=dtype)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, value(rank, dtype), right),
                                    dist.P2POp(dist.irecv, got, left)])
    for work in works:
        work.wait()
    assert_close(got, value(left, dtype))


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d is not torch.bool], ids=str)
def test_reducing_ops_every_dtype(torch_world, rank, size, dtype):
    """reduce and reduce_scatter_tensor with SUM on every numeric dtype."""
    inputs = [value(r, dtype) for r in range(size)]
    total = _reference(R.SUM, inputs, dtype)
    x = value(rank, dtype)
    dist.reduce(x, dst=0)
    if rank == 0:
        assert_close(x, total)
    whole = torch.cat([value(rank, dtype)] * size)
    out = torch.empty(6, dtype=dtype)
    dist.reduce_scatter_tensor(out, whole)
    assert_close(out, total)


def test_all_to_all_variants(torch_world, rank, size):
    inputs = [torch.full((2,), float(rank * 10 + j)) for j in range(size)]
    outputs = [torch.empty(2) for _ in range(size)]
    dist.all_to_all(outputs, inputs)
    for j, out in enumerate(outputs):
        assert_close(out, torch.full((2,), float(j * 10 + rank)))
    single_in = torch.cat(inputs)
    single_out = torch.empty(2 * size)
    dist.all_to_all_single(single_out, single_in)
    assert_close(single_out, torch.cat(outputs))
    # uneven splits: rank r sends j + 1 rows to rank j
    send = torch.cat([torch.full((j + 1, 3), float(rank)) for j in range(size)])
    recv = torch.empty(size * (rank + 1), 3)
    dist.all_to_all_single(recv, send, output_split_sizes=[rank + 1] * size,
                           input_split_sizes=[j + 1 for j in range(size)])
    assert_close(recv, torch.cat([torch.full((rank + 1, 3), float(r)) for r in range(size)]))


def test_barrier_and_monitored_barrier(torch_world, rank, size):
    import hpccomm.torch

    dist.barrier()
    assert dist.barrier(async_op=True).wait()
    # torch's own dist.monitored_barrier accepts only gloo groups; ours runs on hpccomm's
    hpccomm.torch.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    torch_world.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=True)


# -- point to point ---------------------------------------------------------------------------
def test_send_recv_ring(torch_world, rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(4, dtype=torch.float64)
    if rank % 2 == 0:
        dist.send(value(rank, torch.float64)[:4], dst=right)
        dist.recv(got, src=left)
    else:
        dist.recv(got, src=left)
        dist.send(value(rank, torch.float64)[:4], dst=right)
    assert_close(got, value(left, torch.float64)[:4])


def test_isend_irecv_and_source_rank(torch_world, rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(3, dtype=torch.bfloat16)
    recv = dist.irecv(got, src=left, tag=7)
    send = dist.isend(torch.full((3,), float(rank), dtype=torch.bfloat16), dst=right, tag=7)
    assert send.wait() and recv.wait()
    assert_close(got, torch.full((3,), float(left)))
    assert recv.source_rank() == left


def test_recv_from_any_source(torch_world, rank, size):
    if rank == 0:
        got = torch.empty(1)
        senders = {dist.recv(got, tag=3) for _ in range(size - 1)}
        assert senders == set(range(1, size))
    else:
        dist.send(torch.tensor([float(rank)]), dst=0, tag=3)


def test_batch_isend_irecv_both_directions(torch_world, rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    from_left, from_right = torch.empty(8), torch.empty(8)
    ops = [dist.P2POp(dist.isend, torch.full((8,), float(rank)), right),
           dist.P2POp(dist.isend, torch.full((8,), float(-rank)), left),
           dist.P2POp(dist.irecv, from_left, left),
           dist.P2POp(dist.irecv, from_right, right)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert_close(from_left, torch.full((8,), float(left)))
    assert_close(from_right, torch.full((8,), float(-right)))


def test_large_messages_do_not_deadlock_one_by_one(torch_world, rank, size):
    """batch_isend_irecv on a Python group issues its ops one by one: none may block."""
    right, left = (rank + 1) % size, (rank - 1) % size
    big = torch.full((1 << 20,), float(rank))  # 4 MiB: a rendezvous-protocol send
    got = torch.empty(1 << 20)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, big, right),
                                    dist.P2POp(dist.irecv, got, left)])
    for work in works:
        work.wait()
    assert float(got[0]) == left and float(got[-1]) == left


# -- objects ---------------------------------------------------------------------------------
def test_object_collectives(torch_world, rank, size):
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank, "data": list(range(rank))})
    assert objs == [{"rank": r, "data": list(range(r))} for r in range(size)]
    lst = [rank, "x" * 1000] if rank == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1)
    assert lst == [1, "x" * 1000]
    gathered = [None] * size if rank == 0 else None
    dist.gather_object(("r", rank), gathered, dst=0)
    if rank == 0:
        assert gathered == [("r", r) for r in range(size)]
    out = [None]
    dist.scatter_object_list(out, [f"to {r}" for r in range(size)] if rank == 0 else None,
                             src=0)
    assert out == [f"to {rank}"]
    if rank == 0:
        dist.send_object_list([{"hello": 1}], dst=1)
    elif rank == 1:
        got = [None]
        dist.recv_object_list(got, src=0)
        assert got == [{"hello": 1}]


# -- coalesced ---------------------------------------------------------------------------------
def test_coalescing_manager_fast_paths(torch_world, rank, size):
    from torch.distributed.distributed_c10d import _coalescing_manager

    xs = [torch.full((3,), float(rank + i)) for i in range(3)]
    with _coalescing_manager():
        for x in xs:
            dist.all_reduce(x)
    for i, x in enumerate(xs):
        assert_close(x, torch.full((3,), float(sum(r + i for r in range(size)))))
    outs = [torch.empty(2 * size) for _ in range(2)]
    with _coalescing_manager(async_ops=True) as cm:
        for i, out in enumerate(outs):
            dist.all_gather_into_tensor(out, torch.full((2,), float(rank * 10 + i)))
    cm.wait()
    for i, out in enumerate(outs):
        assert_close(out, torch.cat([torch.full((2,), float(r * 10 + i)) for r in range(size)]))
    reduced = [torch.empty(2) for _ in range(2)]
    with _coalescing_manager():
        for i, out in enumerate(reduced):
            dist.reduce_scatter_tensor(out, torch.full((2 * size,), float(rank + i)))
    for i, out in enumerate(reduced):
        assert_close(out, torch.full((2,), float(sum(r + i for r in range(size)))))


def test_deprecated_coalesced_calls(torch_world, rank, size):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xs = [torch.full((2,), float(rank)), torch.full((5,), 1.0)]
        dist.all_reduce_coalesced(xs)
        assert_close(xs[0], torch.full((2,), float(sum(range(size)))))
        assert_close(xs[1], torch.full((5,), float(size)))
        outs = [[torch.empty(2), torch.empty(1)] for _ in range(size)]  # [rank][input]
        dist.all_gather_coalesced(outs, [torch.full((2,), float(rank)),
                                         torch.full((1,), -float(rank))])
        for r in range(size):
            assert_close(outs[r][0], torch.full((2,), float(r)))
            assert_close(outs[r][1], torch.full((1,), -float(r)))


# -- asynchronous work ---------------------------------------------------------------------------
def test_async_work_semantics(torch_world, rank, size):
    x = torch.full((1000,), float(rank))
    work = dist.all_reduce(x, async_op=True)
    assert isinstance(work, dist.Work)
    assert work.wait() is True
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert_close(x, torch.full((1000,), float(sum(range(size)))))
    assert work.result()[0] is x
    y = torch.ones(4)
    future = dist.all_reduce(y, async_op=True).get_future()
    doubled = future.then(lambda f: f.value()[0] * 2)
    assert doubled.wait().tolist() == [2.0 * size] * 4
    assert future.value()[0] is y


def test_async_ops_in_flight_together(torch_world, rank, size):
    xs = [torch.full((256,), float(rank + i)) for i in range(8)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    bcast = torch.full((3,), float(rank))
    works.append(dist.broadcast(bcast, src=size - 1, async_op=True))
    for work in reversed(works):
        work.wait()
    for i, x in enumerate(xs):
        assert_close(x, torch.full((256,), float(sum(r + i for r in range(size)))))
    assert_close(bcast, torch.full((3,), float(size - 1)))


def test_async_work_progresses_without_wait(torch_world, rank, size):
    """A large async all_reduce completes while the caller computes (GIL released) and
    never calls wait(): the progress thread drives it."""
    skip_below_thread_multiple("the progress thread (MPI calls from a second thread)")
    x = torch.ones(4 << 20)  # 16 MiB
    a = torch.randn(512, 512)
    work = dist.all_reduce(x, async_op=True)
    deadline = time.monotonic() + 20
    while not work.done and time.monotonic() < deadline:
        a = torch.tanh(a @ a)  # releases the GIL
    assert work.done, "the async all_reduce made no progress while the caller computed"
    assert float(x[0]) == size and float(x[-1]) == size
    work.wait()


def test_async_works_waited_at_once_are_not_kept(torch_world, rank, size):
    """Works their callers wait for at once leave the progress thread's queue within a
    few operations, not at its next round: hundreds kept alive between rounds outlive
    the garbage collector's young generations and make its full collections frequent."""
    import weakref

    from hpccomm.torch import progress

    x = torch.full((8,), float(rank))
    refs = []
    for _ in range(2000):  # tens of ms: many of the thread's pauses (2 ms at most)
        work = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
        work.wait()
        refs.append(weakref.ref(work))
        del work
    alive = sum(ref() is not None for ref in refs)  # at once, before the thread's round
    assert_close(x, torch.full((8,), float(size - 1)))
    # the queue is pruned past PRUNE_AT; the thread holds at most one queue's worth
    assert alive <= 2 * progress.PRUNE_AT + 2, f"{alive} finished works still referenced"


def test_one_async_work_waited_from_two_threads(torch_world, rank, size):
    """Two threads waiting on the same Work: one polls MPI, the other waits for it to
    finish, both see it complete (only one thread may test an MPI request at a time)."""
    import threading

    x = torch.full((1 << 18,), float(rank))
    work = dist.all_reduce(x, async_op=True)
    results = []
    waiter = threading.Thread(target=lambda: results.append(work.wait()))
    waiter.start()
    results.append(work.wait())
    waiter.join(timeout=60)
    assert not waiter.is_alive() and results == [True, True]
    assert_close(x, torch.full((1 << 18,), float(sum(range(size)))))


def test_a_future_s_callback_runs_outside_the_helper_lock(torch_world, rank, size):
    """A future completed by the progress thread runs its callbacks (the user's code)
    after the thread has left ``helper_lock``: a callback that waits for another thread
    which needs the lock (a ULFM agreement takes it) must not wait on hpccomm."""
    import threading

    from hpccomm.mpi_level import helper_lock

    skip_below_thread_multiple("the progress thread (MPI calls from a second thread)")
    x = torch.ones(4)
    seen = []
    if rank == 0:  # the others come later: the thread completes rank 0's future
        future = dist.all_reduce(x, async_op=True).get_future()
        future.then(lambda f: seen.append((threading.current_thread().name,
                                           helper_lock._is_owned())))
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == [("hpccomm-progress", False)], seen
    else:
        time.sleep(0.3)
        dist.all_reduce(x, async_op=True).wait()
    assert_close(x, torch.full((4,), float(size)))


# -- groups -----------------------------------------------------------------------------------
def test_new_group_and_non_members(torch_world, rank, size):
    evens = dist.new_group([r for r in range(size) if r % 2 == 0])
    if rank % 2 == 0:
        assert dist.get_process_group_ranks(evens) == list(range(0, size, 2))
        x = torch.ones(2)
        dist.all_reduce(x, group=evens)
        assert_close(x, torch.full((2,), float(len(range(0, size, 2)))))
        assert dist.get_group_rank(evens, rank) == rank // 2
    else:
        assert evens == dist.GroupMember.NON_GROUP_MEMBER
    pair = dist.new_group([size - 1, 0])  # sorted: group rank 0 is global 0
    if rank in (0, size - 1):
        y = torch.tensor([float(rank)])
        dist.broadcast(y, group_src=1, group=pair)
        assert y.item() == size - 1
    if rank % 2 == 0:
        dist.destroy_process_group(evens)


def test_new_subgroups(torch_world, rank, size):
    if size % 2:  # torch refuses a world its groups do not tile
        with pytest.raises(ValueError, match="divisible"):
            dist.new_subgroups(group_size=2)
        return
    mine, groups = dist.new_subgroups(group_size=2)
    assert len(groups) == size // 2
    assert dist.get_process_group_ranks(mine) == [rank - rank % 2, rank - rank % 2 + 1]
    x = torch.tensor([float(rank)])
    dist.all_reduce(x, group=mine)
    assert x.item() == 2 * (rank - rank % 2) + 1


def test_subgroup_timeout_is_its_own(torch_world, rank, size):
    group = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=5))
    assert group.host_group.timeout == 5.0
    x = torch.ones(1)
    dist.all_reduce(x, group=group)
    assert x.item() == size


# -- dtypes NumPy lacks ------------------------------------------------------------------------
MOVED_ONLY = [d for d in (getattr(torch, n, None) for n in (
    "float8_e4m3fn", "float8_e5m2", "complex32", "uint16", "uint32", "uint64")) if d]


@pytest.mark.parametrize("dtype", MOVED_ONLY, ids=str)
def test_other_dtypes_move_bit_exactly(torch_world, rank, size, dtype):
    src = (torch.arange(8, dtype=torch.float32) + rank).to(dtype)
    x = src.clone()
    dist.broadcast(x, src=size - 1)
    assert torch.equal(x.view(torch.uint8), (torch.arange(8, dtype=torch.float32) + size - 1)
                       .to(dtype).view(torch.uint8))
    out = torch.empty(8 * size, dtype=dtype)
    dist.all_gather_into_tensor(out, src)
    for r in range(size):
        expected = (torch.arange(8, dtype=torch.float32) + r).to(dtype)
        assert torch.equal(out[8 * r:8 * (r + 1)].view(torch.uint8), expected.view(torch.uint8))


def test_float8_cannot_be_reduced(torch_world, rank):
    x = torch.ones(4).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"all_reduce on rank \d+/\d+ of group .*float8"):
        dist.all_reduce(x)
    with pytest.raises(ValueError, match=r"reduce_scatter_tensor on rank .*float8"):
        dist.reduce_scatter_tensor(torch.empty(2).to(torch.float8_e4m3fn),
                                   torch.ones(2 * dist.get_world_size()).to(torch.float8_e4m3fn))
