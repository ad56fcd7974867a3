"""Observers of operations (hpccomm.observe): the events the dispatch path reports, and
which diagnostics are registered at each debug level."""
import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest

import hpccomm
from hpccomm import observe


class Diary(observe.Observer):
    """Writes down every event it sees."""

    def __init__(self, note=None):
        self.events = []
        self.note = note

    def before_start(self, pg, op, args, arr, peer, timeout):
        self.events.append(("before_start", op, pg.seq))

    def on_start(self, work):
        self.events.append(("start", work.op, work.seq))

    def on_complete(self, work):
        self.events.append(("complete", work.op, work.seq))

    def on_timeout(self, work, waited):
        self.events.append(("timeout", work.op, work.seq))
        return self.note

    def on_failure(self, work, error):
        self.events.append(("failure", work.op, type(error).__name__))


@contextlib.contextmanager
def watching(*observers):
    """The observers registered for the ``with`` block."""
    for o in observers:
        observe.register(o)
    try:
        yield
    finally:
        for o in observers:
            observe.unregister(o)


def test_registering_switches_the_dispatch_flags():
    class TimeoutsOnly(observe.Observer):
        def on_timeout(self, work, waited):
            return None

    class CheckOnly(observe.Observer):
        def before_start(self, pg, op, args, arr, peer, timeout):
            pass

    before = observe.registered()
    for o in before:  # start from an empty registry, whatever the environment turned on
        observe.unregister(o)
    try:
        assert observe.registered() == () and not observe.active and not observe.tracks_work
        quiet, check, diary = TimeoutsOnly(), CheckOnly(), Diary()
        observe.register(quiet)
        assert observe.active is False  # timeouts are not per-operation events
        observe.register(check)
        assert observe.active is True and observe.tracks_work is False
        observe.unregister(check)
        observe.register(diary)
        observe.register(diary)  # once only
        assert observe.active is True and observe.tracks_work is True
        assert observe.registered() == (quiet, diary)
        first = Diary()
        observe.register(first, first=True)
        assert observe.registered() == (first, quiet, diary)
        for o in (first, quiet, diary):
            observe.unregister(o)
        assert not observe.active and not observe.tracks_work
    finally:
        for o in observe.registered():
            observe.unregister(o)
        for o in before:
            observe.register(o)
    assert observe.registered() == before


def _registered(env):
    code = ("import hpccomm as d; from hpccomm import observe; d.init_process_group(); "
            "print(observe.active, sorted(type(o).__name__ for o in observe.registered())); "
            "d.destroy_process_group()")
    full = {k: v for k, v in os.environ.items()
            if not k.endswith("DISTRIBUTED_DEBUG") and not k.startswith("HPCCOMM_TRACE")}
    done = subprocess.run([sys.executable, "-c", code], env=dict(full, **env),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_at_debug_level_off_nothing_watches_operations():
    assert _registered({}) == "False ['DumpOnTimeout', 'RollCall', 'Startup']"
    assert _registered({"HPCCOMM_DISTRIBUTED_DEBUG": "INFO"}) == \
        "True ['DumpOnTimeout', 'Recorder', 'RollCall', 'Startup']"
    assert _registered({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}) == \
        "True ['DesyncCheck', 'DumpOnTimeout', 'Recorder', 'RollCall', 'Startup']"


@pytest.mark.mpi(min_size=1)
def test_observers_see_each_operation_start_and_complete(dist):
    pg = hpccomm.group.WORLD
    x = np.ones(4)
    diary = Diary()
    with watching(diary):
        seq = pg.seq
        dist.all_reduce(x)
        work = dist.broadcast(x, src=0, async_op=True)
        assert diary.events[-1] == ("start", "broadcast", seq + 2)  # not complete yet
        work.wait()
    assert diary.events == [("before_start", "all_reduce", seq),
                            ("start", "all_reduce", seq + 1),
                            ("complete", "all_reduce", seq + 1),
                            ("before_start", "broadcast", seq + 1),
                            ("start", "broadcast", seq + 2),
                            ("complete", "broadcast", seq + 2)]
    assert x.tolist() == [dist.get_world_size()] * 4


@pytest.mark.mpi(min_size=1)
def test_a_check_before_the_start_stops_the_operation(dist):
    class Refuse(observe.Observer):
        def before_start(self, pg, op, args, arr, peer, timeout):
            raise hpccomm.DistError(f"refused {op}")

    pg = hpccomm.group.WORLD
    x = np.ones(3)
    with watching(Refuse()):
        seq = pg.seq
        with pytest.raises(hpccomm.DistError, match="refused all_reduce"):
            dist.all_reduce(x)
        assert pg.seq == seq and x.tolist() == [1.0] * 3  # never started
    dist.all_reduce(x)
    assert x.tolist() == [dist.get_world_size()] * 3


@pytest.mark.mpi(min_size=1)
def test_observers_hear_of_timeouts_and_failures(dist, rank):
    from hpccomm import _call
    from hpccomm.group import resolve

    class Broken(observe.Observer):
        def on_timeout(self, work, waited):
            raise RuntimeError("observer bug")

        def on_failure(self, work, error):
            raise RuntimeError("observer bug")

    x = np.zeros(2)
    diary, broken = Diary(note="Diary was here."), Broken()
    alone, _ = dist.new_subgroups(group_size=1)  # no roll call traffic between ranks

    def broken_test():
        raise OSError("link down")

    try:
        with watching(broken, diary):
            with pytest.raises(hpccomm.DistTimeoutError, match="Diary was here.") as info:
                _call.launch(alone, "broadcast", lambda: (lambda: False, None, None), (), x,
                             False, peer=rank, timeout=0.05)
            assert "timed out" in str(info.value)  # a failing observer hides nothing
            pg = resolve(None, "test")
            with pytest.raises(hpccomm.DistBackendError, match="link down"):
                _call.launch(pg, "all_reduce", lambda: (broken_test, None, None), (), x,
                             False)
    finally:
        dist.destroy_process_group(alone)
    assert ("timeout", "broadcast", alone.seq) in diary.events
    assert diary.events[-1] == ("failure", "all_reduce", "DistBackendError")
