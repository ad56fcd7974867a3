"""FileStore across processes: exact counters, stale-file detection, cleanup."""
import multiprocessing
import os
import signal
import threading
import time

import pytest

from hpccomm.errors import DistStoreError
from hpccomm.stores import FileStore, file as file_store

CTX = multiprocessing.get_context("fork")


def _add_worker(path, n):
    store = FileStore(path, 9)
    for _ in range(n):
        store.add("counter", 1)
    store.close()


def _setter(path, ready):
    store = FileStore(path, 2)
    ready.wait(10)
    time.sleep(0.2)
    store.set("late", "from child")
    store.wait(["ack"], 10)
    store.close()


def _hang(path, ready):
    store = FileStore(path, 2)  # noqa: F841 (held open until the process is killed)
    ready.set()
    time.sleep(60)


def test_add_from_8_processes_is_exact_and_last_user_removes_file(tmp_path):
    path = str(tmp_path / "fs")
    master = FileStore(path, 9)
    procs = [CTX.Process(target=_add_worker, args=(path, 1000)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert master.add("counter", 0) == 8000
    assert os.path.exists(path) and master.path == path
    master.close()
    assert not os.path.exists(path)  # all 9 joined and left: the last one deleted it
    master.close()  # idempotent


def test_get_blocks_until_another_process_sets(tmp_path):
    path = str(tmp_path / "fs")
    store = FileStore(path, 2)
    ready = CTX.Event()
    proc = CTX.Process(target=_setter, args=(path, ready))
    proc.start()
    ready.set()
    t0 = time.monotonic()
    assert store.get("late") == b"from child"
    assert time.monotonic() - t0 >= 0.15
    store.set("ack", "1")
    proc.join(10)
    assert proc.exitcode == 0
    store.close()
    assert not os.path.exists(path)


def test_file_of_a_killed_job_is_reported_as_stale(tmp_path):
    path = str(tmp_path / "fs")
    ready = CTX.Event()
    proc = CTX.Process(target=_hang, args=(path, ready))
    proc.start()
    assert ready.wait(10)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    t0 = time.monotonic()
    with pytest.raises(DistStoreError, match=f"stale.*{proc.pid}|{proc.pid}.*no longer running"):
        FileStore(path, 2)
    assert time.monotonic() - t0 < 2  # reported at once, no deadlock


def _join(path, world_size, queue):
    try:
        FileStore(path, world_size).close()
        queue.put("joined")
    except DistStoreError as exc:
        queue.put(str(exc))


def _join_from_another_process(path, world_size):
    queue = CTX.Queue()
    proc = CTX.Process(target=_join, args=(path, world_size, queue))
    proc.start()
    proc.join(30)
    return queue.get(timeout=5)


def test_file_whose_job_fully_joined_is_stale(tmp_path):
    path = str(tmp_path / "fs")
    a = FileStore(path, 2)
    assert _join_from_another_process(path, 2) == "joined"  # user 2 of 2 came and went
    assert "already joined" in _join_from_another_process(path, 2)
    assert "world_size=2" in _join_from_another_process(path, 3)
    a.set("k", "v")
    a.close()
    assert not os.path.exists(path)


def test_one_process_may_open_a_file_many_times_as_in_torch(tmp_path):
    path = str(tmp_path / "fs")
    store, again = FileStore(path, 1), FileStore(path, 1)  # torch's refcount semantics
    again.set("k", "v")
    assert store.get("k") == b"v"
    with pytest.raises(DistStoreError, match="world_size=1, not 2"):
        FileStore(path, 2)
    del store
    assert os.path.exists(path)  # a handle is still open
    del again
    assert not os.path.exists(path)  # the last one left and the job was complete


def test_a_finalizer_never_waits_for_an_operation_in_progress(tmp_path):
    """The collector may finalize the last handle in a thread that is inside an
    operation on the same file: leaving must be deferred, not waited for."""
    path = str(tmp_path / "fs")
    store = FileStore(path, 1)
    store.set("k", "v")
    with store._member.thread_lock:  # as if an operation on the file were under way
        release = threading.Thread(target=store._finalizer)
        release.start()
        release.join(5)
        assert not release.is_alive()  # queued instead of blocking
        assert os.path.exists(path) and len(file_store._deferred) == 1
    file_store._deferred.run()  # what the next operation or store does
    assert not file_store._deferred
    assert not os.path.exists(path)  # the only user left: the file is gone
