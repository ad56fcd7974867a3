"""Ranks in lockstep: one verdict per test across the ranks of ``mpiexec -n N pytest``.

For each test, on every rank:

1. While the test's setup, call and teardown run, a watchdog thread watches two things
   and, when one happens, interrupts the main thread (a signal whose handler raises
   :class:`TestInterrupted` there: out of an hpccomm wait, a ``time.sleep``, any Python
   code):

   * another rank's notice that the test failed there (during setup and call only): a
     rank that raised before a collective does not leave the others waiting in it;
   * the test's deadline (``--hpccomm-test-timeout``): the main thread's Python stack is
     taken first, and sent to rank 0 at once, so that it is known even if the rank
     never gets out.

2. After teardown, each rank sends its outcome to rank 0 (point-to-point on a private
   communicator, nonblocking, polled under a deadline). Rank 0 decides: failed if any
   rank failed or never reported, and sends the verdict, with the text that says which
   ranks failed and why, back to every rank. Each rank reports that verdict.

3. After a failed verdict, the default group goes on with a fresh communicator
   (``MPI_Comm_idup`` of a private one that only ever serves for this), so that
   operations given up on the old one never pair with a later test's.

A rank that never reports (stuck in C code that Python cannot interrupt: a blocking
mpi4py call, a native deadlock) makes the session stop after that test: the others
report it with its stack, and the job is aborted at the end so that its ``mpiexec``
ends. Everything else (a failed assertion on one rank, a hang in an hpccomm collective,
in ``time.sleep`` or in a Python loop) costs that one test.

Needs MPI_THREAD_MULTIPLE (mpi4py's default): the watchdog receives notices while the
main thread communicates.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional

import pytest

from .outcomes import skip_reason

#: Tags on the private communicator.
TAG_FAILED, TAG_OUTCOME, TAG_VERDICT, TAG_STACK = 11, 12, 13, 14
#: How often the watchdog looks at the clock and for notices.
WATCH_S = 0.02
#: How often a pending interrupt is signalled again while the phase goes on (a test
#: that caught it and went on is interrupted again).
RESIGNAL_S = 0.5
#: The signal that carries an interrupt to the main thread.
INTERRUPT_SIGNAL = getattr(signal, "SIGUSR2", None)
#: Characters of one rank's failure text kept in a report.
MAX_TEXT = 20000
#: Frames whose file names hold one of these (pytest's, pluggy's, this plugin's, runpy's)
#: are left out of a stack taken at a timeout.
_HARNESS = (f"{os.sep}_pytest{os.sep}", f"{os.sep}pluggy{os.sep}",
            f"{os.sep}pytest{os.sep}__main__.py", "<frozen runpy>", f"{os.sep}runpy.py",
            os.path.dirname(os.path.abspath(__file__)) + os.sep,
            os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "pytest_plugin.py"))


class LockstepError(RuntimeError):
    """The ranks could not keep in step (they collected different tests, a rank never
    came to the start)."""


class TestInterrupted(pytest.fail.Exception):  # type: ignore[misc,name-defined]
    """Raised in a test's main thread to stop it: it outlived its timeout, or another
    rank failed it."""

    __test__ = False  # not a test class, whatever pytest's collection patterns say


def ranks_text(ranks: List[int]) -> str:
    """``"rank 1"``, ``"ranks 0, 2 and 3"``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def hpccomm_call(frame: Any) -> Optional[str]:
    """``"hpccomm.barrier"`` if the frame's stack is inside an hpccomm call (the
    outermost one: the call the test made), else ``None``."""
    for entry in traceback.extract_stack(frame) if frame is not None else ():
        if entry.filename.startswith(_PACKAGE) and not any(
                part in entry.filename for part in _HARNESS):
            return f"hpccomm.{entry.name}"
    return None


def stack_of(frame: Any) -> str:
    """A frame's stack, innermost last, without pytest's and this plugin's frames."""
    if frame is None:
        return "(no Python frame: the main thread is outside Python)"
    entries = [e for e in traceback.extract_stack(frame)
               if not any(part in e.filename for part in _HARNESS)]
    return "".join(traceback.format_list(entries)).rstrip() or "(only pytest's own frames)"


class Lockstep:
    """The ranks' agreement on each test, their watchdogs and the interrupts."""

    def __init__(self, timeout: float, grace: float, start_limit: float):
        from .. import mpi_level

        mpi_level.prepare()
        from mpi4py import MPI

        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise LockstepError(
                "--hpccomm-lockstep needs MPI initialized with MPI_THREAD_MULTIPLE (its "
                "watchdog thread receives the other ranks' notices while a test "
                "communicates); leave mpi4py.rc.thread_level at its default, 'multiple', "
                "and HPCCOMM_MPI_THREAD_LEVEL unset")
        self.MPI = MPI
        world = MPI.COMM_WORLD
        self.rank, self.size = world.Get_rank(), world.Get_size()
        self.timeout, self.grace = timeout, grace
        # Made with a blocking Dup would wait for ever for a rank that never starts.
        self.ctl = self._idup(world, start_limit, "the start of the session")
        self.base = self._idup(world, start_limit, "the start of the session")
        self.lock = threading.Lock()
        self.seq = 0
        self.nodeid = ""
        self.phase: Optional[str] = None  # the phase running (armed), else None
        self.started = self.deadline = 0.0
        self.interrupt: Optional[str] = None
        self.kind: Optional[str] = None  # "timeout" or "interrupted", for the outcome
        self.delivered = False
        self.signalled_at = 0.0
        self.stack: Optional[str] = None
        self.inside: Optional[str] = None  # the hpccomm call it was in at the timeout
        self.notices: Dict[int, dict] = {}  # seq -> the first failure notice received
        self.noticed = False  # this test's notice became an interrupt already
        self.notified = False  # this rank sent its failure notice for this test
        self.sends: List[Any] = []
        self.broken: Optional[str] = None
        self.lost: List[int] = []  # ranks that never reported: the session stops
        self.main = threading.main_thread().ident
        self._previous = signal.signal(INTERRUPT_SIGNAL, self._on_signal)
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="hpccomm-lockstep",
                                          daemon=True)
        self._watchdog.start()

    # -- MPI helpers ------------------------------------------------------------------
    def _wait(self, request: Any, until: float) -> bool:
        """Poll ``request`` until it completes (True) or ``until`` passes (False)."""
        while not request.Test():
            if time.monotonic() > until:
                return False
            time.sleep(0.0005)
        return True

    def _idup(self, comm: Any, limit: float, what: str) -> Any:
        new, request = comm.Idup()
        if not self._wait(request, time.monotonic() + limit):
            raise LockstepError(f"rank {self.rank}/{self.size}: not every rank came to "
                                f"{what} within {limit:.0f} s")
        new.Set_errhandler(self.MPI.ERRORS_RETURN)
        return new

    def _send(self, obj: Any, dest: int, tag: int) -> None:
        self.sends.append(self.ctl.isend(obj, dest=dest, tag=tag))
        self.sends = [r for r in self.sends if not r.Test()]

    def _receive(self, source: int, tag: int, until: float) -> Optional[Any]:
        """The next message with ``tag`` from ``source``, or ``None`` after ``until``."""
        while True:
            message = self.ctl.improbe(source=source, tag=tag)
            if message is not None:
                return message.recv()
            if time.monotonic() > until:
                return None
            time.sleep(0.0005)

    def check_collection(self, nodeids: List[str], errors: int) -> None:
        """Every rank collected the same tests, or :class:`LockstepError` on all of them."""
        import zlib

        import numpy as np

        mine = np.array([zlib.crc32("\n".join(nodeids).encode()), len(nodeids), errors],
                        dtype=np.int64)
        every = np.empty((self.size, 3), dtype=np.int64)
        request = self.ctl.Iallgather(mine, every)
        if not self._wait(request, time.monotonic() + self.timeout):
            raise LockstepError(f"rank {self.rank}/{self.size}: not every rank finished "
                                f"collecting within {self.timeout:.0f} s")
        if all((row == every[0]).all() for row in every):
            return  # the same tests, or the same collection errors that pytest reports
        lines = [f"rank {r}: {n} tests, {e} collection errors" for r, (_, n, e)
                 in enumerate(every.tolist())]
        raise LockstepError("the ranks collected different tests or failed to collect, "
                            "so they cannot run them in step (each rank's own errors: "
                            "--hpccomm-rank-log-dir=DIR):\n  " + "\n  ".join(lines))

    # -- one test, main thread ----------------------------------------------------------
    def start_test(self, nodeid: str) -> None:
        with self.lock:
            self.seq += 1
            self.nodeid = nodeid
            self.started = time.monotonic()
            self.deadline = self.started + self.timeout
            self.interrupt = self.kind = self.stack = self.inside = None
            self.delivered = self.noticed = self.notified = False
            self.notices.pop(self.seq - 1, None)

    def arm(self, phase: str) -> None:
        """The main thread enters ``phase`` (setup, call, teardown): interruptible now.
        An interrupt already due in setup or call is raised here; teardown always runs
        (pytest must tear the test's fixtures down), interrupted only by a timeout."""
        with self.lock:
            self.phase = phase
            self._check(time.monotonic())
            due = phase != "teardown" and self.interrupt is not None and not self.delivered
            if due:
                self.delivered = True
        if due:
            raise TestInterrupted(self.interrupt)

    def disarm(self) -> None:
        """The phase ended, and with it any interrupt of that phase: after a timeout the
        rest of the test (teardown) gets ``grace`` seconds more."""
        with self.lock:
            self.phase = None
            if self.interrupt is not None and self.kind == "timeout":
                self.deadline = time.monotonic() + self.grace
            elif self.interrupt is not None and not self.delivered:
                self.kind = None  # a notice that came as the phase ended: moot
            self.interrupt, self.delivered = None, False

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Main thread, between two bytecodes: no lock (the main thread may hold it).
        # Never inside pytest's or pluggy's own code (its state would be left half
        # changed): the watchdog signals again soon, when the test's code runs.
        __tracebackhide__ = True
        if self.phase is None or self.interrupt is None:
            return
        if frame is not None and any(p in frame.f_code.co_filename for p in _HARNESS[:2]):
            return
        self.delivered = True
        raise TestInterrupted(self.interrupt)

    def notify_failed(self, report: Any, excinfo: Any) -> None:
        """This rank's test failed (not by an interrupt): stop the other ranks' test."""
        if self.notified or self.kind is not None or self.size == 1:  # not for interrupts
            return
        self.notified = True
        what = excinfo.exconly() if excinfo is not None else report.longreprtext
        what = (what.strip().splitlines() or ["?"])[0][:300]
        notice = {"seq": self.seq, "rank": self.rank, "when": report.when, "what": what}
        for rank in range(self.size):
            if rank != self.rank:
                self._send(notice, rank, TAG_FAILED)

    # -- the watchdog thread ------------------------------------------------------------
    def _watch(self) -> None:
        warned = False
        from ..mpi_level import helper_lock

        while not self._stop.wait(WATCH_S):
            try:
                with helper_lock:  # never inside MPI while an agreement progresses
                    self._take_notices()
                with self.lock:
                    self._check(time.monotonic(), signal_main=True)
            except Exception as exc:  # a watchdog must not die silently, nor kill the job
                if not warned:
                    warned = True
                    sys.__stderr__.write(f"hpccomm lockstep: rank {self.rank}: the watchdog "
                                         f"failed ({type(exc).__name__}: {exc}); "
                                         f"interrupts may not arrive\n")

    def _take_notices(self) -> None:
        status = self.MPI.Status()
        while self.ctl.iprobe(source=self.MPI.ANY_SOURCE, tag=TAG_FAILED, status=status):
            notice = self.ctl.recv(source=status.Get_source(), tag=TAG_FAILED)
            with self.lock:
                if notice["seq"] >= self.seq:
                    self.notices.setdefault(notice["seq"], notice)

    def _check(self, now: float, signal_main: bool = False) -> None:
        """With the lock held: make an interrupt due if a notice or the deadline says so;
        from the watchdog, signal the main thread while one is due."""
        if self.phase is None:
            return
        if self.interrupt is None:
            notice = self.notices.get(self.seq)
            if notice is not None and not self.noticed and self.phase != "teardown":
                self.noticed, self.kind = True, "interrupted"
                self.interrupt = (f"stopped on rank {self.rank}: rank {notice['rank']} "
                                  f"failed this test ({notice['what']})")
            elif now > self.deadline:
                self._timed_out()
        if signal_main and self.interrupt is not None and (
                now - self.signalled_at >= RESIGNAL_S):
            self.signalled_at = now
            signal.pthread_kill(self.main, INTERRUPT_SIGNAL)

    def _timed_out(self) -> None:
        frame = sys._current_frames().get(self.main)
        where = stack_of(frame)
        if self.stack is None:
            self.stack, self.inside = where, hpccomm_call(frame)
            if self.rank != 0:  # now: rank 0 has it even if this rank never gets out
                self._send({"seq": self.seq, "rank": self.rank, "stack": where}, 0,
                           TAG_STACK)
        self.kind = "timeout"
        self.interrupt = (f"rank {self.rank} did not finish the test's {self.phase} within "
                          f"its timeout ({self.timeout:g} s, --hpccomm-test-timeout)")

    # -- the agreement --------------------------------------------------------------------
    def outcome(self, reports: List[Any]) -> dict:
        """This rank's outcome of the test from its reports."""
        mine = {"seq": self.seq, "rank": self.rank, "outcome": "passed", "when": "call",
                "text": "", "what": "", "kind": self.kind, "stack": self.stack,
                "inside": self.inside, "skip": None}
        failed = next((r for r in reports if r.failed), None)
        if failed is not None:
            crash = getattr(failed.longrepr, "reprcrash", None)
            what = crash.message if crash is not None else failed.longreprtext
            mine.update(outcome="failed", when=failed.when,
                        text=failed.longreprtext[-MAX_TEXT:],
                        what=(what.strip().splitlines() or [""])[0][:200])
            if self.kind is None:
                mine["kind"] = "failed"
        elif reports and all(r.skipped or r.when != "call" for r in reports) and any(
                r.skipped for r in reports):
            skipped = next(r for r in reports if r.skipped)
            longrepr = skipped.longrepr
            mine.update(outcome="skipped",
                        skip=longrepr[2] if isinstance(longrepr, tuple) else str(longrepr))
        return mine

    def agree(self, mine: dict) -> dict:
        """Every rank's outcome to rank 0, the verdict back; returns the verdict."""
        latest = self.started + self.timeout + 2 * self.grace  # a late rank's report
        if self.rank != 0:
            self._send(mine, 0, TAG_OUTCOME)
            verdict = self._receive(0, TAG_VERDICT, latest + 2 * self.grace)
            if verdict is None:
                verdict = self._verdict({self.rank: mine}, {}, [0])
            return self._after(verdict)
        outcomes = {0: mine}
        while len(outcomes) < self.size:
            got = self._receive(self.MPI.ANY_SOURCE, TAG_OUTCOME, latest + self.grace)
            if got is None:
                break
            if got["seq"] == self.seq:
                outcomes[got["rank"]] = got
        stacks = {}
        while True:  # stacks sent at a timeout: what a rank that never came was doing
            message = self.ctl.improbe(source=self.MPI.ANY_SOURCE, tag=TAG_STACK)
            if message is None:
                break
            got = message.recv()
            if got["seq"] == self.seq:
                stacks[got["rank"]] = got["stack"]
        lost = [r for r in range(self.size) if r not in outcomes]
        verdict = self._verdict(outcomes, stacks, lost)
        for rank in range(1, self.size):
            if rank not in lost:
                self._send(verdict, rank, TAG_VERDICT)
        return self._after(verdict)

    def _verdict(self, outcomes: Dict[int, dict], stacks: Dict[int, str],
                 lost: List[int]) -> dict:
        failing = sorted(r for r, o in outcomes.items() if o["outcome"] == "failed")
        causes = [r for r in failing if outcomes[r]["kind"] != "interrupted"] or failing
        stopped = [r for r in failing if r not in causes]
        verdict = {"seq": self.seq, "failed": bool(failing or lost), "lost": lost,
                   "when": outcomes[causes[0]]["when"] if causes else "call", "text": ""}
        if not verdict["failed"]:
            return verdict
        late = sorted([r for r in causes if outcomes[r]["kind"] == "timeout"] + lost)
        # Ranks that timed out inside an hpccomm call while others were stuck elsewhere
        # were waiting for those: named apart, without their stacks.
        waiting = [r for r in late if r not in lost and outcomes[r]["inside"]]
        if len(waiting) == len(late):
            waiting = []
        late = [r for r in late if r not in waiting]
        of = f"of {self.size}"
        parts = []
        if late:
            parts.append(f"{ranks_text(late)} {of} did not finish within the test's "
                         f"timeout ({self.timeout:g} s)")
        if waiting:
            calls = sorted({outcomes[r]["inside"] for r in waiting})
            parts[-1] += (f"; {ranks_text(waiting)} waited for "
                          f"{'it' if len(late) == 1 else 'them'} in {', '.join(calls)}")
        errors = [r for r in causes if r not in late and r not in waiting]
        if errors:
            first = outcomes[errors[0]]
            parts.append(f"failed on {ranks_text(errors)} {of}"
                         + (f" in {first['when']}" if first["when"] != "call" else "")
                         + (f": {first['what']}" if first["what"] else ""))
        head = "; ".join(parts)
        if stopped:
            head += f" ({ranks_text(stopped)} stopped when it failed there)"
        sections = [head]
        for rank in late + errors:
            where = outcomes.get(rank, {}).get("stack") or stacks.get(rank)
            if rank in lost:
                sections.append(
                    f"----- rank {rank}: never reported, {self.grace * 3:g} s past the "
                    f"timeout: stuck where Python cannot interrupt it (C code: a blocking "
                    f"MPI call, a native deadlock). The session stops after this test. "
                    f"Where it was at the timeout -----\n"
                    f"{where or '(unknown: its stack never arrived)'}")
                continue
            if where:
                sections.append(f"----- rank {rank}: where it was at the timeout -----\n"
                                f"{where}")
            found = outcomes[rank]
            sections.append(f"----- rank {rank}, {found['when']} -----\n{found['text']}")
        if 0 in lost and self.rank != 0:
            sections.append(f"(verdict of rank {self.rank}: rank 0 sent none)")
        verdict["text"] = "\n".join(sections)
        return verdict

    def _after(self, verdict: dict) -> dict:
        """After a failed verdict: a fresh communicator for the default group, or, with a
        rank lost, the end of the session."""
        if verdict["lost"]:
            self.lost = verdict["lost"]
            self.broken = (f"{ranks_text(verdict['lost'])} never reported the outcome of "
                           f"{self.nodeid}: the ranks cannot go on in step")
        elif verdict["failed"]:
            self._renew_world()
        return verdict

    def _renew_world(self) -> None:
        from ..group import registry

        comm = self._idup(self.base, self.timeout, f"renewing the default group after "
                                                   f"{self.nodeid}")
        world = registry.world
        if world is not None and world.live:
            world.renew(comm)
        else:
            comm.Free()

    # -- the end --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the watchdog, restore the signal handler, free the communicators."""
        self._stop.set()
        self._watchdog.join(timeout=5)
        signal.signal(INTERRUPT_SIGNAL, self._previous)
        if self.broken:
            return  # a stuck rank would never complete the frees: abort() ends the job
        until = time.monotonic() + self.grace
        for request in self.sends:
            if not self._wait(request, until):
                break
        for comm in (self.ctl, self.base):
            comm.Free()

    def abort(self) -> None:
        """End the job (a stuck rank would hold its mpiexec for ever)."""
        sys.stdout.flush()
        sys.stderr.flush()
        self.MPI.COMM_WORLD.Abort(1)


def apply(reports: List[Any], verdict: dict) -> None:
    """Make this rank's reports of a test say the verdict: one failed report carrying the
    verdict's text (the phase where this rank failed first, else the phase where the
    test failed), and no other failure, so that each rank counts the test once."""
    if not verdict["failed"] or not reports:
        return
    failed = [r for r in reports if r.failed]
    target = (failed[0] if failed else
              next((r for r in reports if r.when == verdict["when"]), reports[-1]))
    for report in failed:
        if report is not target:
            report.outcome, report.longrepr = "passed", None
    target.outcome, target.longrepr = "failed", verdict["text"]


def result_record(nodeid: str, reports: List[Any], size: int) -> str:
    """One JSON line of a test's agreed outcome (``--hpccomm-results``)."""
    import json

    failed = next((r for r in reports if r.failed), None)
    skipped = next((r for r in reports if r.skipped), None)
    record = {"nodeid": nodeid, "size": size, "outcome": "passed", "when": "call",
              "text": "", "skip": None, "duration": sum(r.duration for r in reports)}
    if failed is not None:
        record.update(outcome="failed", when=failed.when, text=failed.longreprtext)
    elif skipped is not None and not any(r.passed and r.when == "call" for r in reports):
        longrepr = skipped.longrepr
        message = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        record.update(outcome="skipped", when=skipped.when, skip=message,
                      reason=skip_reason(message))
    return json.dumps(record)

