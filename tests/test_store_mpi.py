"""MPIStore, and JobTCPStore (the job's store below MPI_THREAD_MULTIPLE), under mpiexec
(run at 2 and 4 ranks with ``--with-mpi``)."""
import datetime
import time

import pytest

from hpccomm.errors import DistStoreError

from helpers import skip_below_thread_multiple


def _made(kind):
    from hpccomm.stores import mpi

    if kind == "MPIStore":
        skip_below_thread_multiple("MPIStore (its server is a thread of rank 0)")
    return getattr(mpi, kind)(timeout=datetime.timedelta(seconds=20))


@pytest.fixture(params=["MPIStore", "JobTCPStore"])
def mpi_store(request):
    """Each store over the job's communicator, through the same contract."""
    store = _made(request.param)
    yield store
    store.close()


@pytest.fixture
def only_mpi_store():
    """An MPIStore, for what is its own: its server thread, clones closed with it (a
    JobTCPStore's clones keep the TCP server alive, as TCPStore's do)."""
    store = _made("MPIStore")
    yield store
    store.close()


@pytest.mark.mpi(min_size=2)
def test_every_rank_sees_every_key(mpi_store):
    rank, size = mpi_store.rank, mpi_store.world_size
    mpi_store.set(f"rank/{rank}", f"hello from {rank}")
    values = mpi_store.multi_get([f"rank/{r}" for r in range(size)])
    assert values == [f"hello from {r}".encode() for r in range(size)]
    mpi_store.barrier("listed", size)
    listed = sorted(k for k in mpi_store.list_keys() if k.startswith("rank/"))
    assert listed == sorted(f"rank/{r}" for r in range(size))
    assert mpi_store.num_keys() == len(mpi_store.list_keys()) >= size


@pytest.mark.mpi(min_size=2)
def test_concurrent_add_is_exact(mpi_store):
    size = mpi_store.world_size
    for _ in range(200):
        mpi_store.add("counter", 1)
    mpi_store.barrier("added", size)
    assert mpi_store.add("counter", 0) == 200 * size


@pytest.mark.mpi(min_size=2)
def test_get_blocks_until_rank0_sets(mpi_store):
    if mpi_store.rank == 0:
        time.sleep(0.2)
        mpi_store.set("late", "now")
    else:
        t0 = time.monotonic()
        assert mpi_store.get("late") == b"now"
        assert time.monotonic() - t0 >= 0.1
    mpi_store.barrier("late-done", mpi_store.world_size)


@pytest.mark.mpi(min_size=2)
def test_compare_set_elects_exactly_one_rank(mpi_store):
    won = mpi_store.compare_set("leader", "", str(mpi_store.rank)) == str(mpi_store.rank).encode()
    mpi_store.barrier("elected", mpi_store.world_size)
    winners = mpi_store.add("winners", int(won))
    mpi_store.barrier("counted", mpi_store.world_size)
    assert mpi_store.add("winners", 0) == 1
    assert winners <= 1


@pytest.mark.mpi(min_size=2)
def test_queues_and_timeouts(mpi_store):
    rank, size = mpi_store.rank, mpi_store.world_size
    if rank != 0:
        mpi_store.queue_push("work", f"item {rank}")
    else:
        items = sorted(mpi_store.queue_pop("work") for _ in range(size - 1))
        assert items == sorted(f"item {r}".encode() for r in range(1, size))
    t0 = time.monotonic()
    with pytest.raises(DistStoreError, match=f"never/{rank}"):
        mpi_store.wait([f"never/{rank}"], datetime.timedelta(milliseconds=200))
    assert time.monotonic() - t0 >= 0.19
    mpi_store.barrier("q-done", size)
    assert mpi_store.queue_len("work") == 0


@pytest.mark.mpi(min_size=2)
def test_clone_append_delete_and_close_is_idempotent(only_mpi_store):
    mpi_store = only_mpi_store
    twin = mpi_store.clone()
    twin.append("log", f"[{mpi_store.rank}]")
    mpi_store.barrier("appended", mpi_store.world_size)
    log = mpi_store.get("log")
    assert all(f"[{r}]".encode() in log for r in range(mpi_store.world_size))
    assert mpi_store.has_extended_api()
    mpi_store.close()
    mpi_store.close()
    with pytest.raises(DistStoreError, match="closed"):
        twin.get("log")


@pytest.mark.mpi(min_size=2)
def test_store_on_a_subcommunicator_is_separate():
    from mpi4py import MPI

    from hpccomm.stores import MPIStore

    skip_below_thread_multiple("MPIStore (its server is a thread of rank 0)")
    world = MPIStore(timeout=20)
    sub_comm = MPI.COMM_WORLD.Split(MPI.COMM_WORLD.Get_rank() % 2, 0)
    sub = MPIStore(sub_comm, timeout=20)
    color = MPI.COMM_WORLD.Get_rank() % 2
    sub.set("color", str(color))
    assert sub.get("color") == str(color).encode()
    assert not world.check(["color"])
    sub.close()
    world.close()
    sub_comm.Free()


@pytest.mark.mpi(min_size=2)
def test_needs_thread_multiple(monkeypatch):
    from mpi4py import MPI

    from hpccomm.stores import MPIStore

    monkeypatch.setattr(MPI, "Query_thread", lambda: MPI.THREAD_SERIALIZED)
    with pytest.raises(DistStoreError, match="MPI_THREAD_MULTIPLE"):
        MPIStore()


@pytest.mark.mpi(min_size=2)
def test_rank0_waits_in_process_for_a_remote_set(mpi_store):
    """Rank 0's own requests never cross MPI: a get parked there is answered when a
    remote rank's set reaches the server thread."""
    rank = mpi_store.rank
    if rank == 0:
        t0 = time.monotonic()
        assert mpi_store.get("from/1") == b"late"
        assert time.monotonic() - t0 >= 0.1
        with pytest.raises(DistStoreError, match="wait timeout after 100ms, keys: /never"):
            mpi_store.wait(["never"], datetime.timedelta(milliseconds=100))
    elif rank == 1:
        time.sleep(0.2)
        mpi_store.set("from/1", "late")
    mpi_store.barrier("rank0-done", mpi_store.world_size)


@pytest.mark.mpi(min_size=1)
def test_clones_wait_independently_on_every_rank(mpi_store):
    """Each handle has its own reply channel: one blocked in queue_pop does not hold up
    another handle of the same process (torch's clone() semantics)."""
    import threading

    me = f"r{mpi_store.rank}"
    waiter, pusher = mpi_store.clone(), mpi_store.clone()
    got = []
    thread = threading.Thread(target=lambda: got.append(waiter.queue_pop(f"{me}/q")))
    thread.start()
    time.sleep(0.1)  # the waiter is parked on the server now
    pusher.set(f"{me}/k", "v")  # would time out if it queued behind the waiter
    assert pusher.get(f"{me}/k") == b"v"
    pusher.queue_push(f"{me}/q", "item")
    thread.join(10)
    assert got == [b"item"]
    mpi_store.barrier("clones-done", mpi_store.world_size)


def _thread_cpu_seconds(thread):
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


@pytest.mark.mpi(min_size=1)
@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/task"), reason="Linux /proc")
def test_idle_server_thread_sleeps_instead_of_spinning(only_mpi_store):
    from mpi4py import MPI

    mpi_store = only_mpi_store
    for i in range(200):  # a burst: the server spins for a while after it
        mpi_store.add("burst", 1)
    MPI.COMM_WORLD.Barrier()
    if mpi_store.rank == 0:
        thread = mpi_store._shared.server.thread
        time.sleep(0.1)  # past the spin window
        before = _thread_cpu_seconds(thread)
        time.sleep(1.0)
        assert _thread_cpu_seconds(thread) - before < 0.1  # ~100 short wake-ups, no spin
    MPI.COMM_WORLD.Barrier()


@pytest.mark.mpi(min_size=1)
def test_server_stays_out_of_mpi_while_the_helper_lock_is_held(only_mpi_store):
    """The server's rounds of MPI calls take ``mpi_level.helper_lock``, as a ULFM
    agreement needs (docs/never-hang.md): none runs while another thread holds it, and
    serving goes on once it is free."""
    from mpi4py import MPI

    from hpccomm import mpi_level

    mpi_store = only_mpi_store
    if mpi_store.rank == 0:
        server = mpi_store._shared.server
        rounds, real = [], server._round
        server._round = lambda status: rounds.append(1) or real(status)
        deadline = time.monotonic() + 10
        while not rounds and time.monotonic() < deadline:  # the wrapper is in use
            time.sleep(0.01)
        assert rounds, "the server made no round in 10 s"
        with mpi_level.helper_lock:
            before = len(rounds)
            time.sleep(0.2)  # about 20 of its idle rounds, were it not waiting
            during = len(rounds) - before
        deadline = time.monotonic() + 10
        while len(rounds) == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert during == 0 and len(rounds) > before, (during, len(rounds) - before)
    MPI.COMM_WORLD.Barrier()
    mpi_store.add("after", 1)  # every rank is still served
    mpi_store.barrier("served", mpi_store.world_size)
