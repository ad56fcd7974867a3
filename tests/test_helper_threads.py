"""hpccomm's helper threads keep the rules of docs/never-hang.md: every MPI call they
make follows ``helper_lock``, the user's code never runs while they hold it, abort
hooks run once, and no wait of theirs lacks a deadline. Serial: each helper is driven
here with stand-ins for what it watches (the thread that completes futures, under MPI,
is checked in tests/test_torch_collectives.py)."""
import threading
import time

import pytest

from hpccomm.mpi_level import helper_lock


class _Owner:
    """A backend communicator as the NCCL watchdog sees it: no failure, and a query
    that records whether the round holds the lock."""

    failure = None

    def __init__(self):
        self.rounds = []

    def async_error(self):
        self.rounds.append(helper_lock._is_owned())
        return None


def test_the_nccl_watchdog_checks_under_the_helper_lock():
    """A watchdog round may time an operation out, whose hooks (the roll call) call
    MPI: each round holds ``helper_lock``, and none runs while another thread does."""
    from hpccomm.backends.cuda.device import Watchdog

    owner = _Owner()
    watchdog = Watchdog(owner, device=0, timeout=0.2)  # a round every 10 ms
    try:
        with helper_lock:
            watchdog.track(type("Event", (), {"done": True})(), "all_reduce")
            time.sleep(0.2)
            assert owner.rounds == [], "a round ran while another thread held the lock"
        deadline = time.monotonic() + 10
        while not owner.rounds and time.monotonic() < deadline:
            time.sleep(0.01)
        assert owner.rounds and all(owner.rounds), owner.rounds
    finally:
        watchdog.close()


def test_abort_hooks_run_once_whoever_reports_the_failure():
    """Failures reported by several threads at once (the progress thread and the
    caller's), then an abort: the group's abort hooks run once."""
    pytest.importorskip("torch", reason="the torch face's hooks need torch")
    from hpccomm.errors import DistTimeoutError
    from hpccomm.torch.hooks import GroupState

    state = GroupState()
    runs = []
    state.abort_hooks[1] = lambda: runs.append(time.sleep(0.01))
    start = threading.Barrier(8)

    def report():
        start.wait()
        state.failed(DistTimeoutError("timed out"))
    threads = [threading.Thread(target=report) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    state.run_abort_hooks()  # an abort after the failure
    assert len(runs) == 1 and state.error == "TIMEOUT", runs


def test_a_profiler_event_s_close_waits_with_a_deadline(monkeypatch):
    """Ending an operation's profiler event on the closing thread waits for that thread
    at most ``CLOSE_WAIT_S``: a stuck closing thread never holds the caller for ever."""
    pytest.importorskip("torch", reason="the torch face's profiler events need torch")
    from hpccomm.torch import profiling

    release = threading.Event()
    monkeypatch.setattr(profiling, "_exit", lambda handle: release.wait(30))
    monkeypatch.setattr(profiling, "CLOSE_WAIT_S", 0.2)
    closer = profiling._Closer()
    began = time.monotonic()
    closer.close(object())
    waited = time.monotonic() - began
    release.set()
    assert 0.15 < waited < 5, waited
