"""``MPITorchStore``: torch's Store interface over an hpccomm store, reached from C++.

The store under test wraps an hpccomm ``HashStore`` (one process, same API as the
``MPIStore`` that ``mpi://`` uses); torch's C++ ``PrefixStore`` around it goes through
torch's store trampoline, as every process group's store does.
"""
import datetime

import pytest

dist = pytest.importorskip("torch.distributed", reason="torch is not installed (pip install "
                                                       "'hpccomm[torch]')")
from hpccomm.stores import HashStore  # noqa: E402
from hpccomm.torch.store import DistStoreError, MPITorchStore  # noqa: E402


@pytest.fixture
def stores():
    inner = HashStore()
    mine = MPITorchStore(inner, "rdzv/", datetime.timedelta(seconds=5))
    return inner, mine, dist.PrefixStore("group", mine)  # torch adds the "/"


def test_operations_through_torchs_prefix_store(stores):
    inner, mine, prefixed = stores
    prefixed.set("k", b"v")
    assert prefixed.get("k") == b"v"
    assert inner.get("rdzv/group/k") == b"v"  # both prefixes, in order
    assert prefixed.add("n", 2) == 2 and prefixed.add("n", 3) == 5
    assert prefixed.compare_set("k", b"v", b"w") == b"w"
    assert prefixed.check(["k", "n"]) and not prefixed.check(["missing"])
    prefixed.wait(["k"])
    prefixed.wait(["k"], datetime.timedelta(seconds=1))
    assert prefixed.delete_key("k") and not prefixed.check(["k"])
    assert mine.num_keys() == prefixed.num_keys() == 1
    prefixed.append("log", b"a")
    prefixed.append("log", b"b")
    assert prefixed.get("log") == b"ab"
    prefixed.multi_set(["x", "y"], [b"1", b"2"])
    assert prefixed.multi_get(["x", "y"]) == [b"1", b"2"]


def test_clone_keeps_the_python_store_alive(stores):
    _, mine, prefixed = stores
    twin = prefixed.clone()  # torch clones for other threads; C++ must keep our methods
    twin.set("c", b"1")
    assert mine.get("group/c") == b"1"


def test_timeouts_follow_torch_and_raise_both_error_types(stores):
    _, mine, prefixed = stores
    mine.set_timeout(datetime.timedelta(seconds=0.2))
    with pytest.raises(dist.DistStoreError) as caught:
        mine.get("never")
    assert isinstance(caught.value, DistStoreError)
    with pytest.raises(dist.DistStoreError):
        prefixed.wait(["never"], datetime.timedelta(seconds=0.1))
