"""What a GPU call makes on the simulated device, and what a CUDA graph capture allows:
countable, not timed. The simulation (``tests/gpu_sim``) counts the CUDA events, streams
and arrays made and the event records and stream waits (``cupy.cuda.counts``), and fails
loudly on what CUDA refuses during a stream capture (``cupy.cuda.violations``). Also the
watchdog, which aborts NCCL under a call that never finishes.
``benchmarks/studies/gpu_call_cost.py`` times a call; ``gpu/capture_check.py`` replays
captured graphs on a real GPU.
"""
import time

import numpy as np
import pytest

from gpu_cases import GPU, SIM_CASES, case_fixture
from gpu_cases import case_groups  # noqa: F401 (a fixture)

pytestmark = pytest.mark.mpi(min_size=1)

case = case_fixture(SIM_CASES)


def _sim_nccl(case):
    if case.backend != "nccl":
        pytest.skip("counts and capture are the simulated device's (NCCL backend)")
    import cupy

    return cupy


# -- the watchdog ------------------------------------------------------------------------------
def test_nccl_timeout_aborts_communicator(dist, case, rank, size):
    """A GPU op that never finishes: the watchdog aborts NCCL, wait() raises the timeout."""
    cupy = _sim_nccl(case)
    pg = dist.new_group(list(range(size)), backend=GPU, timeout=0.5)
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
        comm.watchdog.check(time.monotonic() + 10)
        assert all(m.aborted for m in made)
        with pytest.raises(dist.DistTimeoutError, match="ncclCommAbort"):
            work.wait()
        with pytest.raises(dist.DistTimeoutError):
            dist.all_reduce(x, group=pg)
    finally:
        dist.destroy_process_group(pg)


def test_a_stuck_synchronous_call_is_timed_out_by_the_watchdog(dist, case, rank, size):
    """The stream channel builds no Work, yet its event is watched: a synchronous call
    that never finishes aborts NCCL, and the next call raises the timeout."""
    cupy = _sim_nccl(case)
    pg = dist.new_group(list(range(size)), backend=GPU, timeout=0.5)
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
        comm.watchdog.check(time.monotonic() + 10)
        assert all(m.aborted for m in made)
        with pytest.raises(dist.DistTimeoutError, match="synchronous all_reduce"):
            dist.all_reduce(x, group=pg)
    finally:
        dist.destroy_process_group(pg)


# -- per-call cost ----------------------------------------------------------------------------
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



# -- CUDA graph capture -------------------------------------------------------------------------
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
    fresh = dist.new_group(list(range(size)), backend=GPU)
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

