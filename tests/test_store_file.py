"""FileStore across processes: exact counters, stale-file detection, cleanup."""
import multiprocessing
import os
import signal
import time

import pytest

from hpccomm.errors import DistStoreError
from hpccomm.stores import FileStore

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


def test_file_whose_job_fully_joined_is_stale(tmp_path):
    path = str(tmp_path / "fs")
    a, b = FileStore(path, 2), FileStore(path, 2)
    with pytest.raises(DistStoreError, match="already joined"):
        FileStore(path, 2)
    with pytest.raises(DistStoreError, match="world_size=2"):
        FileStore(path, 3)
    a.set("k", "v")
    assert b.get("k") == b"v"
    a.close()
    assert os.path.exists(path)  # b still uses it
    b.close()
    assert not os.path.exists(path)


def test_unknown_world_size_and_clone(tmp_path):
    path = str(tmp_path / "fs")
    store = FileStore(path)
    twin = store.clone()
    twin.set("k", "v")
    store.close()
    assert twin.get("k") == b"v"  # the process stays attached while a handle is open
    twin.close()
    assert not os.path.exists(path)


def test_corrupt_file_is_reported(tmp_path):
    path = tmp_path / "fs"
    path.write_bytes(b"this is not a store")
    with pytest.raises(DistStoreError, match="not a FileStore file"):
        FileStore(str(path), 1)
