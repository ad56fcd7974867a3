"""The Store API on every store, ported from torch's store tests (test_store.py).

Each test runs against HashStore, FileStore, TCPStore and PrefixStore (over a
HashStore and over a TCPStore). Safe under ``mpiexec``: every rank uses its own
temporary files and a free port.
"""
import datetime
import threading
import time

import pytest

from hpccomm.errors import DistStoreError
from hpccomm.stores import FileStore, HashStore, PrefixStore, QueueEmptyError, Store, TCPStore

KINDS = ["hash", "file", "tcp", "prefix-hash", "prefix-tcp"]


def make_store(kind, tmp_path):
    if kind == "hash":
        return HashStore()
    if kind == "file":
        return FileStore(str(tmp_path / "store"), 1)
    if kind == "tcp":
        return TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    if kind == "prefix-hash":
        return PrefixStore("pfx", HashStore())
    return PrefixStore("pfx", TCPStore("127.0.0.1", 0, 1, True, timeout=10))


@pytest.fixture(params=KINDS)
def store(request, tmp_path):
    s = make_store(request.param, tmp_path)
    s.set_timeout(datetime.timedelta(seconds=10))
    yield s
    inner = s.underlying_store if isinstance(s, PrefixStore) else s
    if hasattr(inner, "close"):
        inner.close()


def test_set_get_overwrite_and_bytes(store):
    store.set("key", "value")
    assert store.get("key") == b"value"
    store.set("key", b"\x00\xffbin")
    assert store.get("key") == b"\x00\xffbin"
    store.set("", "empty key works")
    assert store.get("") == b"empty key works"
    store.set("uni", "é")
    assert store.get("uni") == "é".encode()


def test_add_counts_and_parses_like_torch(store):
    assert store.add("ctr", 5) == 5
    assert store.add("ctr", -7) == -2
    assert store.get("ctr") == b"-2"
    store.set("made_by_set", "41")
    assert store.add("made_by_set", 1) == 42
    store.set("lead", " 7x")  # stoll: leading integer, rest ignored
    assert store.add("lead", 1) == 8
    store.set("emptyval", "")
    assert store.add("emptyval", 3) == 3
    store.set("word", "abc")
    with pytest.raises(DistStoreError, match="not an integer"):
        store.add("word", 1)
    assert store.get("word") == b"abc"  # untouched, and the store still answers
    assert store.add("ctr", 0) == -2


def test_compare_set_torch_rules(store):
    # missing key, empty expected: sets it
    assert store.compare_set("k", "", "v1") == b"v1"
    assert store.get("k") == b"v1"
    # mismatch: returns the current value, no change
    assert store.compare_set("k", "nope", "v2") == b"v1"
    assert store.compare_set("k", "", "v2") == b"v1"
    # match: swaps
    assert store.compare_set("k", "v1", "v2") == b"v2"
    assert store.get("k") == b"v2"
    # missing key, non-empty expected: returns expected, sets nothing
    assert store.compare_set("absent", "exp", "des") == b"exp"
    assert not store.check(["absent"])


def test_check_wait_and_timeouts_name_the_keys_in_torchs_words(store):
    store.set("here", "1")
    assert store.check(["here"])
    assert not store.check(["here", "gone"])
    assert store.check([])
    store.wait(["here"])
    store.wait([])
    t0 = time.monotonic()
    with pytest.raises(DistStoreError, match=r"wait timeout after 200ms, keys: .*gone") as info:
        store.wait(["here", "gone"], datetime.timedelta(milliseconds=200))
    assert time.monotonic() - t0 >= 0.19
    assert "here" not in str(info.value).split("keys:")[1]
    store.set_timeout(0.2)
    with pytest.raises(DistStoreError, match="missing_key"):
        store.get("missing_key")
    with pytest.raises(DistStoreError, match="also_missing"):
        store.multi_get(["here", "also_missing"])


def test_blocking_get_and_wait_are_woken_by_another_handle(store):
    other = store.clone()
    got = {}

    def waiter():
        got["value"] = store.clone().get("late")
        store.clone().wait(["late2"])
        got["waited"] = True

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.1)
    other.set("late", "now")
    other.set("late2", "x")
    thread.join(10)
    assert got == {"value": b"now", "waited": True}


def test_delete_num_keys_list_keys(store):
    assert store.num_keys() == 0
    store.multi_set(["a", "b", "c"], ["1", "2", "3"])
    store.queue_push("q", "item")  # queues are not keys for num_keys/list_keys
    assert store.num_keys() == 3
    assert sorted(store.list_keys()) == ["a", "b", "c"]
    assert store.delete_key("b") is True
    assert store.delete_key("b") is False
    assert sorted(store.list_keys()) == ["a", "c"]
    assert store.num_keys() == 2


def test_multi_get_multi_set_append(store):
    store.multi_set(["x", "y"], ["1", b"2"])
    assert store.multi_get(["y", "x"]) == [b"2", b"1"]
    assert store.multi_get([]) == []
    with pytest.raises(DistStoreError, match="same size"):  # torch's TCPStore raises this
        store.multi_set(["x"], ["1", "2"])
    store.append("log", "ab")
    store.append("log", b"cd")
    assert store.get("log") == b"abcd"


def test_queues_fifo_nonblocking_and_blocking(store):
    assert store.queue_len("q") == 0
    store.queue_push("q", "first")
    store.queue_push("q", b"second")
    assert store.queue_len("q") == 2
    assert store.check(["q"])  # a non-empty queue counts as present
    assert store.queue_pop("q") == b"first"
    assert store.queue_pop("q", block=False) == b"second"
    assert not store.check(["q"])
    with pytest.raises(QueueEmptyError, match="queue is empty"):
        store.queue_pop("q", block=False)
    assert isinstance(QueueEmptyError("x"), DistStoreError)
    pusher = threading.Timer(0.1, lambda: store.clone().queue_push("q", "later"))
    pusher.start()
    assert store.queue_pop("q") == b"later"
    store.set_timeout(0.2)
    with pytest.raises(DistStoreError, match="q"):
        store.queue_pop("q")
    # a plain key and a queue of the same name are independent
    store.set("both", "plain")
    store.queue_push("both", "queued")
    assert store.get("both") == b"plain"
    assert store.delete_key("both")
    assert store.queue_len("both") == 1


def test_timeout_property_and_set_timeout(store):
    assert store.timeout == datetime.timedelta(seconds=10)
    store.set_timeout(datetime.timedelta(milliseconds=1500))
    assert store.timeout == datetime.timedelta(seconds=1.5)
    store.set_timeout(2)
    assert store.timeout == datetime.timedelta(seconds=2)


def test_clone_shares_keys_and_is_thread_safe(store):
    twin = store.clone()
    assert isinstance(twin, Store) and type(twin) is type(store)
    twin.set("shared", "yes")
    assert store.get("shared") == b"yes"

    def bump():
        handle = store.clone()
        for _ in range(50):
            handle.add("threads", 1)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert store.add("threads", 0) == 200


def test_barrier_and_extended_api(store):
    assert store.has_extended_api() is True
    done = []

    def member():
        store.clone().barrier("bar", 3, timeout=datetime.timedelta(seconds=10))
        done.append(1)

    threads = [threading.Thread(target=member) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    assert not done  # two of three arrived: nobody passes
    store.barrier("bar", 3)
    for t in threads:
        t.join(10)
    assert len(done) == 2
    with pytest.raises(DistStoreError, match="timeout"):
        store.barrier("bar2", 2, timeout=0.1)


def test_bad_arguments_are_type_errors(store):
    with pytest.raises(TypeError):
        store.set("k", 3)
    with pytest.raises(TypeError):
        store.set("k", None)
    with pytest.raises(TypeError):
        store.set(3, "v")
    with pytest.raises(TypeError):
        store.check("single-key-not-a-list")
    with pytest.raises(TypeError):
        store.wait("single-key-not-a-list")
    for amount in (1.5, "3", 1 << 63):
        with pytest.raises(TypeError):
            store.add("k", amount)
    assert not store.check(["k"])  # nothing was applied


def test_bytes_keys_and_integer_likes_are_accepted_as_torch_does(store):
    import numpy as np

    store.set(b"bk", bytearray(b"v"))
    assert store.get("bk") == b"v" and store.get(b"bk") == b"v"
    assert store.add("n", np.int64(3)) == 3
    assert store.add("n", True) == 4
    assert store.check(("bk", "n"))


def test_prefix_store_isolation():
    base = HashStore()
    a, b = PrefixStore("a", base), PrefixStore("b", base)
    a.set("k", "from a")
    b.set("k", "from b")
    base.set("k", "bare")
    assert a.get("k") == b"from a" and b.get("k") == b"from b"
    assert base.get("a/k") == b"from a"
    assert a.list_keys() == ["k"]
    assert a.num_keys() == base.num_keys() == 3  # torch: the wrapped store's count
    assert sorted(base.list_keys()) == ["a/k", "b/k", "k"]
    assert a.underlying_store is base
    assert not b.check(["only_a"]) and (a.set("only_a", "1") or a.check(["only_a"]))
    nested = PrefixStore("inner", a)
    nested.set("x", "1")
    assert base.get("a/inner/x") == b"1"
    a.set_timeout(0.1)
    assert base.timeout == datetime.timedelta(seconds=0.1)
    with pytest.raises(DistStoreError, match="a/missing"):
        a.get("missing")
    with pytest.raises(TypeError):
        PrefixStore("p", object())
    with pytest.raises(ValueError, match="cannot be None"):
        PrefixStore("p", None)
    assert PrefixStore(b"raw", base)._k("x") == "raw/x"
