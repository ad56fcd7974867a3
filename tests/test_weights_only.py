"""Weights-only unpickling of object collectives: off by default (torch's behaviour); when
on, only allowlisted types come back and anything else is refused before its code runs.
"""
import collections
import datetime
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from hpccomm import objects, unpickling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Point:
    """A user's class: refused until allowed."""

    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, Point) and other.x == self.x


class Exploit:
    """Unpickling it would call ``os.system``."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


@pytest.fixture
def weights_only():
    objects.set_weights_only(True)
    try:
        yield
    finally:
        objects.set_weights_only(False)
        objects.clear_safe_globals()


PLAIN = [1, 2.5, 3 + 4j, "text", b"bytes", bytearray(b"ba"), None, True, (1, 2), [3],
         {"a": {1, 2}}, frozenset({4}), slice(1, 5, 2), range(3),
         collections.OrderedDict(a=1), collections.deque([1, 2]), collections.Counter("aab"),
         datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
         datetime.timedelta(seconds=3), datetime.date(2024, 1, 1)]


def test_default_is_torchs_plain_pickle():
    assert not objects.weights_only()
    assert unpickling.loads(pickle.dumps(Point(3))) == Point(3)


def test_plain_data_and_numpy_pass(weights_only):
    for item in PLAIN:
        assert unpickling.loads(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)) == item
    arrays = [np.arange(6.0).reshape(2, 3), np.arange(4).reshape(2, 2).T, np.float32(2.5),
              np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),
              np.array([1, "x", None], dtype=object), np.dtype("complex64")]
    for item in arrays:
        back = unpickling.loads(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
        if isinstance(item, np.ndarray):
            np.testing.assert_array_equal(back, item)
            assert back.dtype == item.dtype
        else:
            assert back == item


def test_other_types_are_refused_before_running(weights_only, tmp_path):
    marker = tmp_path / "ran"

    class Touch:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    for evil, name in [(Exploit(), "system"), (Touch(), "open"), (Point(1), "Point")]:
        with pytest.raises(pickle.UnpicklingError, match=f"refused .*{name}"):
            unpickling.loads(pickle.dumps(evil), lambda: "where")
    assert not marker.exists()
    objects_with_inner_class = [1, {"k": Point(2)}]
    with pytest.raises(pickle.UnpicklingError, match="add_safe_globals"):
        unpickling.loads(pickle.dumps(objects_with_inner_class))


def test_allowing_a_class(weights_only):
    with objects.safe_globals([Point]):
        assert unpickling.loads(pickle.dumps(Point(5))) == Point(5)
    with pytest.raises(pickle.UnpicklingError):
        unpickling.loads(pickle.dumps(Point(5)))
    objects.add_safe_globals([Point])
    assert (Point.__module__, "Point") in objects.get_safe_globals()
    assert unpickling.loads(pickle.dumps(Point(6))) == Point(6)
    with pytest.raises(TypeError):
        objects.add_safe_globals([3])


def test_environment_variable_turns_it_on():
    env = dict(os.environ, HPCCOMM_OBJECTS_WEIGHTS_ONLY="1")
    code = ("import pickle, os, hpccomm.objects as o, hpccomm.unpickling as u\n"
            "assert o.weights_only()\n"
            "class E:\n"
            "    def __reduce__(self): return (os.getpid, ())\n"
            "try:\n"
            "    u.loads(pickle.dumps(E()))\n"
            "except pickle.UnpicklingError as e:\n"
            "    print('refused', 'getpid' in str(e))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "refused True" in done.stdout


@pytest.mark.mpi(min_size=2)
def test_object_collectives_in_weights_only_mode(dist, rank, size, weights_only):
    items = [None, None]
    if rank == 0:
        items = [np.arange(3.0), {"lr": 0.1, "steps": [1, 2]}]
    dist.broadcast_object_list(items, src=0)
    np.testing.assert_array_equal(items[0], np.arange(3.0))
    assert items[1] == {"lr": 0.1, "steps": [1, 2]}
    gathered = [None] * size
    with pytest.raises(pickle.UnpicklingError, match=f"all_gather_object on rank {rank}/"):
        dist.all_gather_object(gathered, Point(rank))  # every rank refuses the others'
    objects.add_safe_globals([Point])
    dist.all_gather_object(gathered, Point(rank))
    assert gathered == [Point(r) for r in range(size)]
    big = [None]
    if rank == 0:
        big = [Exploit()]
    if rank == 0:
        dist.broadcast_object_list(big, src=0)  # the root does not unpickle its own
    else:
        with pytest.raises(pickle.UnpicklingError, match="system"):
            dist.broadcast_object_list(big, src=0)
    dist.barrier()
