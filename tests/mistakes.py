"""The mistakes harness: seeded random calls where some ranks of a group diverge, on every
path a call can take, checked for what docs/never-hang.md promises.

Beside the differential harness (every path agrees with NumPy on correct calls), this one
makes the calls wrong on purpose. Each case draws, from a seed, one collective (all_reduce,
broadcast, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, barrier,
reduce, gather), its dtype, size and arguments, then one mistake made by some ranks (one
or more, never all): another size (pieces too: an all_reduce that goes through the
small channel in pieces differs from the first piece or only in the last), dtype,
reduction, root, operation, group, or the call skipped. Every rank makes its call on a
fresh group made under one of :data:`CONFIGS` (what hpccomm picks, the channel, the
shared-memory ring and pair kernel, MPI alone), at debug level DETAIL or OFF, then the
ranks compare what happened on a communicator of their own:

* no rank waits past the group's timeout plus the roll call's grace;
* whatever a rank raises is a :class:`hpccomm.DistError` of the public classes (never a
  backend's own), whose message names the operation, the rank and the group;
* at DETAIL every rank that called raises: the ranks' calls differ -> ``DistDesyncError``
  with the table of what each rank called (shape and dtype of every rank), a rank that
  skipped or called on another group -> ``DistTimeoutError`` naming it;
  ``DistDesyncError`` leaves the group usable (a correct all_reduce follows);
* at OFF, on the paths hpccomm runs itself (the small channel whole, split and in
  pieces; the ring; the pair kernel), every rank that reads its peers raises
  ``DistDesyncError`` naming both calls, or ``DistTimeoutError``; a broadcast on the
  channel compares each rank with its root only, so the ranks whose call is the root's
  may return. MPI's own collectives compare nothing (differing calls there are MPI's
  undefined behaviour, and may return wrong data, as in torch's backends), so the
  harness makes no such mistake on that path at OFF. A skipped call or another group is
  a ``DistTimeoutError`` naming the missing rank on every path, except for the ranks of
  a broadcast, gather or reduce that need nothing from it.

With ``--creation N`` it then draws N group creations (:func:`run_creation`): a call
(``new_group`` of some ranks, ``split_group`` of the world, a ``DeviceMesh``'s group) that
some ranks make differently (other members, another constructor), skip, or make late,
every rank after a random delay of its own; or a correct one. It checks what
docs/never-hang.md promises for them: no rank waits past the timeout plus the meeting's
grace; a rank whose call some of its members did not make alike raises a
``DistDesyncError`` (naming the calls) or a ``DistTimeoutError`` (naming who never came,
or that the first participant never answered), never returns; a group made is made on
all of its members, and works; and the same creation, retried by every rank at once,
then succeeds on every rank.

A failure names its seed, configuration and case; run one sequence alone with

    mpiexec -n 4 python tests/mistakes.py --seed 3 --config small --detail off
    mpiexec -n 4 python tests/mistakes.py --seed 3 --config none --creation 6

``tests/test_mistakes.py`` runs a few seeds at every world size of the suite.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import environment  # noqa: E402

#: Groups a case runs on: name -> settings while the group is made (as differential's).
CONFIGS = {
    "default": {},
    "small": {"HPCCOMM_SHM": "1", "HPCCOMM_SHM_SMALL": "64K", "HPCCOMM_SHM_SPLIT": "64"},
    "ring": {"HPCCOMM_SHM": "1", "HPCCOMM_SHM_SMALL": "0", "HPCCOMM_SHM_MIN_BYTES": "1",
             "HPCCOMM_SHM_CHUNK": "4K"},
    "mpi": {"HPCCOMM_SHM": "0", "HPCCOMM_SHM_SMALL": "0"},
    # across (simulated) nodes: the hierarchical all_reduce from one byte on
    "hier": {"HPCCOMM_SHM": "1", "HPCCOMM_SHM_MIN_BYTES": "1"},
}
#: Timeout of the calls under test (the groups are made under a longer one, so that a
#: rank late from the case before still meets them), and how late past it a rank may
#: still report (the roll call's grace, with room for a busy machine).
TIMEOUT_S = 1.0
MAKE_TIMEOUT_S = 60.0
LATE_S = 4.0
OPS = ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
       "all_to_all_single", "barrier", "reduce", "gather"]
#: Mistakes, and the operations each applies to.
MISTAKES = {
    "size": [op for op in OPS if op != "barrier"],
    "dtype": ["all_reduce", "reduce_scatter_tensor", "reduce"],  # reductions: the kind
    "reduction": ["all_reduce", "reduce_scatter_tensor", "reduce"],
    "root": ["broadcast", "reduce", "gather"],
    "operation": OPS,
    "group": OPS,
    "skip": OPS,
}
#: Mistakes where every rank calls, with other arguments.
VALUE_MISTAKES = ("size", "dtype", "reduction", "root", "operation")
#: Operations where a rank may finish without every other (a broadcast's root, the
#: other ranks of a gather or reduce).
ONE_SIDED = ("broadcast", "gather", "reduce")
#: The channel's operations (others always take MPI).
CHANNEL_OPS = {"all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_to_all_single", "barrier"}
PUBLIC = {"DistError", "DistBackendError", "DistTimeoutError", "DistDesyncError",
          "DistValueError", "ProcessFailedError"}


class Failure(AssertionError):
    """What happened differs from what docs/never-hang.md promises."""


class Call(NamedTuple):
    """One rank's call: what it does, and how to make it."""
    op: str                      # the operation, or "skip"
    dtype: str
    count: int                   # elements of the buffer (one rank's block for gathers)
    root: int
    red: str
    other_group: bool            # on another group of the same ranks instead

    def text(self) -> str:
        if self.op == "skip":
            return "no call"
        where = " on another group of the same ranks" if self.other_group else ""
        return f"{self.op} {self.dtype}[{self.count}] root {self.root} {self.red}{where}"


class Case(NamedTuple):
    index: int
    mistake: str
    diverging: List[int]         # group ranks that make the mistake
    calls: List[Call]            # per group rank


class Outcome(NamedTuple):
    kind: str                    # "returned", "raised", "skipped"
    error: str                   # the class's name
    message: str
    seconds: float


def sizes_of(pg: Any) -> Dict[str, int]:
    """Byte sizes that land on this group's interesting paths: small, just above the
    channel (where all_reduce goes in pieces from 3 ranks on), and large."""
    cpu = pg.cpu
    small = getattr(cpu, "small", None)
    limit = small.sizes[1] if small is not None else 4096  # base.ALL_REDUCE
    return {"tiny": 8, "small": 1024, "edge": max(limit, 64), "pieces": limit * 3 + 8 * 3,
            "large": 1 << 20}


def draw(rng: np.random.Generator, index: int, n: int, sizes: Dict[str, int]) -> Case:
    """One case: the same on every rank that draws it."""
    mistake = str(rng.choice(list(MISTAKES)))
    op = str(rng.choice(MISTAKES[mistake]))
    dtype = str(rng.choice(["float64", "float32", "int64", "int32"]))
    nbytes = sizes[str(rng.choice(list(sizes)))]
    count = max(1, nbytes // np.dtype(dtype).itemsize)
    if op in ("reduce_scatter_tensor", "all_to_all_single", "all_gather_into_tensor",
              "gather"):
        count = max(1, count // n)  # one rank's block
    root = int(rng.integers(n))
    red = str(rng.choice(["SUM", "MAX"]))
    base = Call(op, dtype, count, root, red, False)
    k = int(rng.integers(1, n)) if n > 1 else 0
    diverging = sorted(int(r) for r in rng.choice(n, k, replace=False)) if k else []
    other_ops = [o for o in OPS if o != op]
    changed = {
        "size": base._replace(count=count + max(1, count // 2) if count > 64 else count + 1),
        "dtype": base._replace(dtype={"float64": "int64", "int64": "float64",
                                      "float32": "int32", "int32": "float32"}[dtype]),
        "reduction": base._replace(red="MAX" if red == "SUM" else "SUM"),
        "root": base._replace(root=(root + 1) % n),
        "operation": base._replace(op=str(rng.choice(other_ops))),
        "group": base._replace(other_group=True),
        "skip": base._replace(op="skip"),
    }[mistake]
    if mistake == "size" and op == "all_reduce" and nbytes == sizes["pieces"] and \
            rng.random() < 0.5:  # the same pieces but for the last one
        changed = base._replace(count=count + 1)
    return Case(index, mistake, diverging,
                [changed if r in diverging else base for r in range(n)])


def make(call: Call, me: int, n: int) -> Tuple[Callable[[Any, Any], None], str]:
    """``run(dist, group)`` making ``call`` on this rank, and its description."""
    dtype = np.dtype(call.dtype)
    count = call.count

    def run(dist: Any, group: Any) -> None:
        op = getattr(dist.ReduceOp, call.red)
        if call.op == "all_reduce":
            dist.all_reduce(np.ones(count, dtype), op=op, group=group)
        elif call.op == "broadcast":
            dist.broadcast(np.ones(count, dtype), group_src=call.root, group=group)
        elif call.op == "all_gather_into_tensor":
            dist.all_gather_into_tensor(np.zeros(count * n, dtype), np.ones(count, dtype),
                                        group=group)
        elif call.op == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(np.zeros(count, dtype), np.ones(count * n, dtype),
                                       op=op, group=group)
        elif call.op == "all_to_all_single":
            dist.all_to_all_single(np.zeros(count * n, dtype), np.ones(count * n, dtype),
                                   group=group)
        elif call.op == "barrier":
            dist.barrier(group=group)
        elif call.op == "reduce":
            dist.reduce(np.ones(count, dtype), group_dst=call.root, op=op, group=group)
        elif call.op == "gather":
            outs = [np.zeros(count, dtype) for _ in range(n)] if me == call.root else None
            dist.gather(np.ones(count, dtype), outs, group_dst=call.root, group=group)
    return run, call.text()


def checked(pg: Any, op: str, count: int, dtype: str) -> bool:
    """Whether ``op`` of ``count`` elements takes a path of hpccomm's own that compares
    the ranks' calls on this group (the channel, the ring, the pair kernel)."""
    cpu = pg.cpu
    if op not in CHANNEL_OPS or type(cpu).__name__ != "SharedMemoryCommunicator":
        return False
    n = pg.size()
    nbytes = count * np.dtype(dtype).itemsize
    block = {"all_gather_into_tensor": nbytes, "reduce_scatter_tensor": nbytes,
             "all_to_all_single": nbytes}.get(op, nbytes)
    small = getattr(cpu, "small", None)
    if small is not None:
        code = {"barrier": 0, "all_reduce": 1, "broadcast": 2, "all_gather_into_tensor": 3,
                "reduce_scatter_tensor": 4, "all_to_all_single": 5}[op]
        if op == "barrier" or 0 < block <= small.sizes[code]:
            return True
        if op == "all_reduce" and nbytes < getattr(cpu, "pieces_to", 0):
            return True
        if op == "reduce_scatter_tensor" and nbytes * n < getattr(cpu, "scatter_pieces_to", 0):
            return True
    ring = {"all_reduce": cpu.min_reduce, "broadcast": cpu.min_bcast,
            "all_gather_into_tensor": cpu.min_gather * n,
            "reduce_scatter_tensor": cpu.min_scatter * n}.get(op)
    whole = nbytes * (n if op in ("all_gather_into_tensor", "reduce_scatter_tensor") else 1)
    return ring is not None and whole >= ring


def needs_nothing(call: Call, r: int, calls: Sequence[Call]) -> bool:
    """Whether group rank ``r`` making ``call`` may finish though some rank never came:
    any rank of a broadcast whose root came (it reads the root alone), a reduce's or
    gather's other ranks (their sends may be eager)."""
    if call.op == "broadcast":
        return calls[call.root] == call
    return call.op in ("reduce", "gather") and call.root != r


def expectations(case: Case, outcomes: Sequence[Outcome], detail: bool,
                 checks: Sequence[bool], group: str, where: str) -> None:
    """Raise :class:`Failure` where the outcomes break what docs/never-hang.md promises."""
    problems = []
    n = len(outcomes)
    calls = case.calls
    value_mistake = case.mistake in VALUE_MISTAKES
    for r, got in enumerate(outcomes):
        call = calls[r]
        say = f"group rank {r} ({call.text()}): {got.kind} {got.error} {got.message[:300]!r}"
        if got.seconds > TIMEOUT_S + LATE_S:
            problems.append(f"{say}: after {got.seconds:.1f} s")
        if got.kind == "skipped":
            continue
        if got.kind == "raised":
            if got.error not in PUBLIC:
                problems.append(f"{say}: not one of hpccomm's public errors")
            elif f"/{n} of group '" not in got.message or ("on rank" not in got.message):
                problems.append(f"{say}: the message does not name the rank and group")
            elif call.op not in got.message and "desync check" not in got.message and \
                    "barrier" not in got.message:
                problems.append(f"{say}: the message does not name the operation")
        if detail and value_mistake:
            if got.kind != "raised" or got.error not in ("DistDesyncError",
                                                         "DistTimeoutError"):
                problems.append(f"{say}: at DETAIL every rank raises DistDesyncError")
            elif got.error == "DistDesyncError" and not all(
                    f"\n  {q}  " in got.message or f"\n  {q} " in got.message
                    for q in range(n)):
                problems.append(f"{say}: the table does not show every rank's call")
        elif case.mistake in ("skip", "group"):
            if got.kind == "returned" and not needs_nothing(call, r, calls):
                problems.append(f"{say}: returned while a rank never came")
            if got.kind == "raised" and (got.error != "DistTimeoutError" or not any(
                    words in got.message for words in ("never joined", "never came"))):
                problems.append(f"{say}: a rank that never came is a DistTimeoutError "
                                f"naming it")
        elif value_mistake and all(checks):
            # a broadcast on the channel compares each rank's call with its root's only
            with_root = call.op == "broadcast" and calls[call.root].text() == call.text()
            if got.kind == "returned" and not with_root:
                problems.append(f"{say}: returned from calls that differ, on a path that "
                                f"compares them")
            if got.kind == "raised" and got.error not in ("DistDesyncError",
                                                          "DistTimeoutError"):
                problems.append(f"{say}: differing calls raise DistDesyncError")
    if problems:
        raise Failure(f"{where}, group '{group}', case {case.index} ({case.mistake} by "
                      f"group ranks {case.diverging}):\n  " + "\n  ".join(problems))


def run(dist: Any, harness: Any, config: str, detail: bool, seed: int, cases: int
        ) -> int:
    """Run ``cases`` cases drawn from ``seed`` on fresh groups of ``config``; returns how
    many ran. Raises :class:`Failure` (on every rank) at the first broken promise."""
    rank, n = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng([seed, sum(map(ord, config)), n])
    where = (f"mistakes seed {seed}, config '{config}', DETAIL {'on' if detail else 'off'}, "
             f"{n} ranks")
    dist.set_debug_level(dist.DebugLevel.OFF)
    ran = 0
    for index in range(cases):
        with environment(**CONFIGS[config]) if CONFIGS[config] else contextlib.nullcontext():
            pg = dist.new_group(list(range(n)), timeout=MAKE_TIMEOUT_S)
        dist.set_timeout(TIMEOUT_S, group=pg)
        case = draw(rng, index, n, sizes_of(pg))
        other = None
        if case.mistake == "group":  # the other group: the same ranks, made alike
            with environment(**CONFIGS[config]) if CONFIGS[config] else \
                    contextlib.nullcontext():
                other = dist.new_group(list(range(n)), timeout=MAKE_TIMEOUT_S)
            dist.set_timeout(TIMEOUT_S, group=other)
        checks = [checked(pg, c.op, c.count, c.dtype) for c in case.calls if c.op != "skip"]
        if not detail and not all(checks) and case.mistake in VALUE_MISTAKES:
            # differing calls on MPI's own collectives are MPI's undefined behaviour: they
            # may leave messages in MPI's queues that pair with a later communicator's
            # operations, so the harness does not make them (nothing is promised there)
            case = case._replace(mistake="skip", calls=[
                c._replace(op="skip") if r in case.diverging else c
                for r, c in enumerate(case.calls)])
        base = next(c for r, c in enumerate(case.calls) if r not in case.diverging)
        if not detail and not all(checks) and base.op in ONE_SIDED:
            # a root, or its peers, may finish an MPI broadcast, gather or reduce alone
            # and leave its messages unread in MPI's queues after the others time out;
            # once every rank frees the communicator MPI may give its context to a later
            # one, whose operations then read them: the harness keeps to the operations
            # where every rank waits for every other
            case = case._replace(calls=[c._replace(op="all_reduce") if c.op != "skip"
                                        else c for c in case.calls])
            checks = [checked(pg, c.op, c.count, c.dtype) for c in case.calls
                      if c.op != "skip"]
        call = case.calls[rank]
        start, _ = make(call, rank, n)
        dist.set_debug_level(dist.DebugLevel.DETAIL if detail else dist.DebugLevel.OFF)
        began = time.monotonic()
        if call.op == "skip":
            outcome = Outcome("skipped", "", "", 0.0)
        else:
            try:
                start(dist, other if call.other_group else pg)
                outcome = Outcome("returned", "", "", time.monotonic() - began)
            except Exception as exc:  # noqa: BLE001 - the class is what is checked
                outcome = Outcome("raised", type(exc).__name__, str(exc),
                                  time.monotonic() - began)
        dist.set_debug_level(dist.DebugLevel.OFF)
        every = harness.allgather((outcome, all(checks)))
        verdict: Optional[str] = None
        try:
            expectations(case, [o for o, _ in every], detail, [c for _, c in every], config,
                         where)
        except Failure as exc:
            verdict = str(exc)
        usable = (detail and case.mistake not in ("skip", "group") and all(
            o.error == "DistDesyncError" for o, _ in every if o.kind == "raised"))
        if verdict is None and usable:  # a desync found before the start: still usable
            x = np.full(3, float(rank))
            try:
                dist.all_reduce(x, group=pg)
                if not np.array_equal(x, np.full(3, float(sum(range(n))))):
                    verdict = f"{where}, case {case.index}: the group gave {x} after the desync"
            except Exception as exc:  # noqa: BLE001
                verdict = (f"{where}, case {case.index}: the group is unusable after a "
                           f"desync found at DETAIL: {type(exc).__name__}: {exc}")
        verdicts = harness.allgather(verdict)
        dist.destroy_process_group(pg)
        if other is not None:
            dist.destroy_process_group(other)
        found = next((v for v in verdicts if v), None)
        if found:
            raise Failure(found)
        ran += 1
        harness.Barrier()  # every rank done with this case before the next group
    return ran


# -- group creation --------------------------------------------------------------------------
#: Timeout of the creations under test; how late a late rank comes past it (after the
#: others gave up: past the meeting's grace and the longest delay); the most a rank may
#: wait past the timeout (the meeting's grace, with room for a busy machine); the
#: longest random delay before a rank's call; the timeout of the calls that must succeed
#: (the correct ones, the retries: on a busy machine a rank may be slow to come).
CREATE_TIMEOUT_S = 1.0
LATE_BY_S = 1.5
CREATE_LATE_S = 3.0
JITTER_S = 0.3
SUCCEED_TIMEOUT_S = 20.0
#: Mistakes of a group creation: some ranks make another call (other members, another
#: constructor), make none, or make it late; "none": every rank makes the same call.
CREATION_MISTAKES = ("members", "kind", "absent", "late", "none")
CREATION_KINDS = ("new_group", "split_group", "mesh")


class Creation(NamedTuple):
    """One rank's group creation: the constructor and its ranks (members, splits, or the
    mesh's shape), or no call."""
    kind: str                    # "new_group", "split_group", "mesh" or "skip"
    ranks: Tuple[Any, ...]       # members; splits (tuples); the mesh's shape
    late: bool = False

    def text(self) -> str:
        if self.kind == "skip":
            return "no call"
        return f"{self.kind}{list(self.ranks)}{' (late)' if self.late else ''}"


def draw_creation(rng: np.random.Generator, index: int, n: int
                  ) -> Tuple[str, List[int], List[Creation]]:
    """One creation case: (mistake, diverging ranks, each rank's call)."""
    mistake = str(rng.choice(CREATION_MISTAKES))
    kind = str(rng.choice(CREATION_KINDS if mistake != "members" else ("new_group",)))
    if kind == "new_group":
        size = n if mistake == "kind" else int(rng.integers(2, n + 1))
        ranks: Tuple[Any, ...] = tuple(sorted(int(r) for r in rng.choice(n, size,
                                                                          replace=False)))
    elif kind == "split_group":
        cuts: List[int] = []  # between the splits
        if n > 2:
            parts = int(rng.integers(0, min(2, n - 1) + 1))
            cuts = sorted(int(c) for c in rng.choice(range(1, n), parts, replace=False))
        bounds = [0] + cuts + [n]
        ranks = tuple(tuple(range(a, b)) for a, b in zip(bounds, bounds[1:]))
    else:
        ranks = mesh_shape(n)
    base = Creation(kind, ranks)
    takers = participants(base, n)
    if mistake == "none":
        return mistake, [], [base if r in takers else Creation("skip", ()) for r in range(n)]
    k = int(rng.integers(1, len(takers))) if len(takers) > 1 else 1
    diverging = sorted(int(r) for r in rng.choice(takers, k, replace=False))
    calls = []
    for r in range(n):
        if r not in takers:
            calls.append(Creation("skip", ()))
        elif r not in diverging:
            calls.append(base)
        elif mistake == "absent":
            calls.append(Creation("skip", ()))
        elif mistake == "late":
            calls.append(base._replace(late=True))
        elif mistake == "kind":  # every rank of the world takes part in both
            other = str(rng.choice([k for k in CREATION_KINDS if k != kind]))
            calls.append(Creation(other, {"new_group": tuple(range(n)),
                                          "split_group": (tuple(range(n)),),
                                          "mesh": mesh_shape(n)}[other]))
        else:  # members: another set of ranks, this one among them (or itself alone)
            others = [q for q in range(n) if q != r]
            mine: Tuple[Any, ...] = (r,)
            for _ in range(4):
                extra = rng.choice(others, int(rng.integers(1, len(others) + 1)),
                                   replace=False)
                drawn = tuple(sorted({r, *(int(q) for q in extra)}))
                if drawn != base.ranks:
                    mine = drawn
                    break
            calls.append(Creation("new_group", mine))
    return mistake, diverging, calls


def mesh_shape(n: int) -> Tuple[int, int]:
    """A mesh of ``n`` ranks whose dimension 0 is not the world (whose group is the
    default group itself, made by no meeting)."""
    return (2, n // 2) if n % 2 == 0 and n >= 4 else (1, n)


def participants(call: Creation, n: int) -> List[int]:
    """The ranks that take part in ``call``: its members, or every rank."""
    return list(call.ranks) if call.kind == "new_group" else list(range(n))


def create(dist: Any, call: Creation, timeout: float) -> Any:
    """Make ``call``'s group on this rank under ``timeout``: the group (None outside it)."""
    if call.kind == "new_group":
        pg = dist.new_group(list(call.ranks), timeout=timeout)
        return None if pg is dist.GroupMember.NON_GROUP_MEMBER else pg
    if call.kind == "split_group":
        return dist.split_group(split_ranks=[list(s) for s in call.ranks], timeout=timeout)
    from hpccomm.device_mesh import init_device_mesh
    from hpccomm.group import registry

    before = registry.world.timeout  # a mesh's meetings take the default group's
    dist.set_timeout(timeout)
    try:
        return init_device_mesh("cpu", tuple(call.ranks)).get_group(0)
    finally:
        dist.set_timeout(before)


def creation_expectations(calls: Sequence[Creation], outcomes: Sequence[Outcome],
                          groups: Sequence[Optional[Tuple[int, ...]]], where: str) -> None:
    """Raise :class:`Failure` where a creation's outcomes break the promises."""
    n = len(calls)
    problems = []
    for r, (call, got) in enumerate(zip(calls, outcomes)):
        say = f"rank {r} ({call.text()}): {got.kind} {got.error} {got.message[:300]!r}"
        if got.kind == "skipped":
            continue
        if got.seconds > CREATE_TIMEOUT_S + CREATE_LATE_S:
            problems.append(f"{say}: after {got.seconds:.1f} s")
        alike = all(calls[q] == call for q in participants(call, n))
        if got.kind == "returned":
            if not alike:
                problems.append(f"{say}: returned though its members did not all make it "
                                f"alike")
            continue
        if got.error not in ("DistDesyncError", "DistTimeoutError"):
            problems.append(f"{say}: a creation's mistake is a DistDesyncError or a "
                            f"DistTimeoutError")
        elif "on rank" not in got.message or f"/{n} of group '" not in got.message:
            problems.append(f"{say}: the message does not name the rank and group")
        elif got.error == "DistDesyncError" and got.message.count(" came for ") < 2:
            problems.append(f"{say}: the message does not name the differing calls")
        elif got.error == "DistTimeoutError" and not any(
                words in got.message for words in ("never came", "did not answer")):
            problems.append(f"{say}: the message does not name who never came")
        elif alike and got.error != "DistDesyncError":
            problems.append(f"{say}: a call its members all made alike fails only if "
                            f"another call reached it (a DistDesyncError)")
    for r, ranks in enumerate(groups):  # a group made is made on all of its members
        if ranks is not None:
            for q in ranks:
                if groups[q] != ranks:
                    problems.append(f"rank {r} made a group of ranks {list(ranks)}, rank {q} "
                                    f"did not ({outcomes[q].kind} {outcomes[q].error})")
    if problems:
        raise Failure(f"{where}:\n  " + "\n  ".join(problems))


def run_creation(dist: Any, harness: Any, seed: int, cases: int) -> int:
    """Run ``cases`` group creations drawn from ``seed``, each followed by its retry;
    returns how many ran. Raises :class:`Failure` (on every rank) at the first broken
    promise."""
    from hpccomm.group import registry

    rank, n = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng([seed, n, 7])
    for index in range(cases):
        mistake, diverging, calls = draw_creation(rng, index, n)
        jitter = rng.random(n) * JITTER_S
        where = (f"mistakes seed {seed}, creation {index} ({mistake} by ranks "
                 f"{diverging}: {', '.join(c.text() for c in calls)}), {n} ranks")
        before = set(registry.groups)
        limit = SUCCEED_TIMEOUT_S if mistake == "none" else CREATE_TIMEOUT_S
        outcome, pg = _create_once(dist, calls[rank], float(jitter[rank]), limit)
        every = harness.allgather((outcome, _ranks(dist, pg)))
        verdict: Optional[str] = None
        try:
            creation_expectations(calls, [o for o, _ in every], [g for _, g in every],
                                  where)
        except Failure as exc:
            verdict = str(exc)
        if verdict is None:
            verdict = _usable(dist, pg, where)
        _destroy_new(dist, registry, before)
        verdict = _first(harness.allgather(verdict))
        if verdict is None:  # every rank retries the creation at once: it succeeds
            base = _base_call(calls, diverging)
            harness.Barrier()
            mine = base if rank in participants(base, n) else Creation("skip", ())
            outcome, pg = _create_once(dist, mine, float(jitter[rank]), SUCCEED_TIMEOUT_S)
            if outcome.kind == "raised":
                verdict = (f"{where}: the retry ({base.text()}) raised on rank {rank}: "
                           f"{outcome.error}: {outcome.message[:400]}")
            else:
                verdict = _usable(dist, pg, where + " (retry)")
            _destroy_new(dist, registry, before)
            verdict = _first(harness.allgather(verdict))
        if verdict:
            raise Failure(verdict)
        harness.Barrier()
    return cases


def _base_call(calls: Sequence[Creation], diverging: Sequence[int]) -> Creation:
    """The call of the ranks that made no mistake (some always take part)."""
    return next(call for r, call in enumerate(calls)
                if r not in diverging and call.kind != "skip")


def _create_once(dist: Any, call: Creation, delay: float, timeout: float
                 ) -> Tuple[Outcome, Any]:
    """Make ``call`` under ``timeout`` after ``delay`` seconds (and the lateness): the
    outcome, and the group made (``None`` if none)."""
    if call.kind == "skip":
        return Outcome("skipped", "", "", 0.0), None
    time.sleep(delay + (timeout + LATE_BY_S if call.late else 0.0))
    began = time.monotonic()
    try:
        pg = create(dist, call, timeout)
        return Outcome("returned", "", "", time.monotonic() - began), pg
    except Exception as exc:  # noqa: BLE001 - the class is what is checked
        return Outcome("raised", type(exc).__name__, str(exc), time.monotonic() - began), None


def _ranks(dist: Any, pg: Any) -> Optional[Tuple[int, ...]]:
    return None if pg is None else tuple(dist.get_process_group_ranks(pg))


def _usable(dist: Any, pg: Any, where: str) -> Optional[str]:
    """Whether the group ``pg`` this rank made sums right, in one all_reduce."""
    if pg is None:
        return None
    ranks = dist.get_process_group_ranks(pg)
    x = np.full(3, float(dist.get_rank()))
    try:
        dist.all_reduce(x, group=pg)
    except Exception as exc:  # noqa: BLE001
        return f"{where}: the group of ranks {ranks} is unusable: {exc}"
    if not np.array_equal(x, np.full(3, float(sum(ranks)))):
        return f"{where}: the group of ranks {ranks} gave {x}"
    return None


def _destroy_new(dist: Any, registry: Any, before: Any) -> None:
    for name in [name for name in registry.groups if name not in before]:
        dist.destroy_process_group(registry.groups[name])


def _first(verdicts: Sequence[Optional[str]]) -> Optional[str]:
    return next((v for v in verdicts if v), None)


def say(line: str) -> None:
    """One write per line, so ranks sharing the launcher's pipe never interleave."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


def world_harness() -> Any:
    """A communicator of the harness's own, for its reports (never the groups')."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Dup()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Run one mistakes sequence under mpiexec.")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--cases", type=int, default=12)
    parser.add_argument("--config", action="append", choices=sorted(CONFIGS) + ["none"])
    parser.add_argument("--detail", choices=["on", "off"], action="append")
    parser.add_argument("--creation", type=int, default=0,
                        help="group creations to draw after the collectives' cases")
    args = parser.parse_args(argv)
    import hpccomm as dist

    dist.init_process_group(timeout=60)
    harness = world_harness()
    status = 0
    configs = [] if args.config == ["none"] else args.config or list(CONFIGS)
    for config in configs:
        for detail in args.detail or ["off", "on"]:
            try:
                run(dist, harness, config, detail == "on", args.seed, args.cases)
                say(f"rank {dist.get_rank()}: {config}, DETAIL {detail}: ok")
            except Failure as exc:
                say(f"rank {dist.get_rank()}: {exc}")
                status = 1
    if args.creation:
        try:
            run_creation(dist, harness, args.seed, args.creation)
            say(f"rank {dist.get_rank()}: creation: ok")
        except Failure as exc:
            say(f"rank {dist.get_rank()}: {exc}")
            status = 1
    harness.Free()
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
