"""The differential harness: random sequences of operations on every path of a group,
each result checked against NumPy.

hpccomm runs a CPU collective one of several ways (the small shared-memory channel in C,
the shared-memory ring and its two-rank C kernel, MPI through mpi4py with its native
waits, the hierarchical path across nodes) and picks one per call from the operation,
its size and the group. Here one sequence, drawn from a seed, runs on groups made under
settings that force each path (:data:`CONFIGS`), fast paths off included
(``HPCCOMM_SHM=0``, ``HPCCOMM_SHM_SMALL=0``), so the paths are compared with each other
through one reference:

* every rank draws the same sequence (operation, dtype, size, reduction, root, sync or
  async, valid or invalid) from the seed, and every rank's input from the seed and that
  rank, so each rank computes the expected result of the whole group with NumPy alone;
* inputs are chosen so that the exact result does not depend on the order of the
  reduction (small integers in floats, products of powers of two, wrapping integer
  sums), so every result must equal the reference bit for bit, whatever order a path
  reduces in; only AVG over a group whose size is not a power of two is compared to
  rounding; MIN and MAX inputs hold NaNs now and then, which must win;
* sizes: 0, 1, odd, around every threshold of the group's paths (the channel's limits
  and where its all_reduce splits,
  the ring's thresholds and slot, the MPI gate), and large;
* an invalid call (a size not divisible by the group, mismatched dtypes, a read-only or
  non-contiguous output, a reduction the dtype does not have, a bad root) must raise
  ``DistValueError`` on every rank, naming the operation, the rank and the group, with
  the same message on every rank, and leave the group usable: the sequence goes on;
* non-members of a group call its operations too: they get torch's warning and nothing
  is written.

A failure names its seed, group and step; run that sequence alone with

    mpiexec -n 4 python tests/differential.py --seed 17 --config ring

``tests/test_differential.py`` runs a few seeds under pytest at every world size; the
inputs and their references are in ``tests/differential_values.py``.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import traceback
import warnings
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from differential_values import (DTYPES, LARGE, PREMUL_FACTOR, REDUCTIONS,  # noqa: E402
                                 UNDEFINED, Failure, check, exact, family, reference,
                                 values)
from helpers import environment, numpy_dtype  # noqa: E402

#: Groups a sequence runs on: name -> (settings while the group is made, members):
#: "all" is every rank in order; "tail" every rank but 0, in reverse order (group ranks
#: differ from global ones; rank 0 is a non-member; one rank at a world of 2).
CONFIGS = {
    "default": ({}, "all"),                                  # what hpccomm picks
    # the C channel, its all_reduce split among 3 or more ranks from 64 bytes on
    "small": ({"HPCCOMM_SHM": "1", "HPCCOMM_SHM_SMALL": "64K", "HPCCOMM_SHM_SPLIT": "64"},
              "all"),
    "ring": ({"HPCCOMM_SHM": "1", "HPCCOMM_SHM_SMALL": "0", "HPCCOMM_SHM_MIN_BYTES": "1",
              "HPCCOMM_SHM_CHUNK": "4K"}, "all"),            # the shared-memory ring
    "mpi": ({"HPCCOMM_SHM": "0", "HPCCOMM_SHM_SMALL": "0"}, "all"),  # fast paths off
    "tail": ({}, "tail"),                                    # a reordered sub-group
    "tail-mpi": ({"HPCCOMM_SHM": "0", "HPCCOMM_SHM_SMALL": "0"}, "tail"),
}

#: Timeout of the groups under test: a rank that stopped at a failure leaves the others
#: waiting in their next operation, which then fails within this time.
GROUP_TIMEOUT_S = 30


# -- the group under test ----------------------------------------------------------------------
class Group(NamedTuple):
    name: str
    pg: Any                 # the group, or NON_GROUP_MEMBER on a non-member
    ranks: List[int]        # global ranks in group-rank order
    me: int                 # this rank's group rank (-1: not a member)
    thresholds: Dict[str, List[int]]  # operation -> sizes (bytes) where paths change


def make_group(dist: Any, name: str) -> Group:
    """The group of config ``name`` (collective over the world)."""
    env, members = CONFIGS[name]
    world = dist.get_world_size()
    ranks = list(range(world)) if members == "all" else list(range(world - 1, 0, -1))
    if not ranks:  # a world of one has no tail: its "tail" is the whole world
        ranks = [0]
    with environment(**env) if env else contextlib.nullcontext():
        pg = dist.new_group(ranks, timeout=GROUP_TIMEOUT_S, sort_ranks=False)
    me = ranks.index(dist.get_rank()) if dist.get_rank() in ranks else -1
    return Group(name, pg, ranks, me, thresholds(pg) if me >= 0 else {})


def thresholds(pg: Any) -> Dict[str, List[int]]:
    """Per operation code name, the sizes in bytes (as the operation counts them: the
    whole buffer, or one rank's block) where this group's choice of path changes."""
    from hpccomm.backends import base

    cpu, n = pg.cpu, pg.size()
    found: Dict[str, List[int]] = {op: [] for op in ("all_reduce", "broadcast", "all_gather",
                                                     "reduce_scatter", "all_to_all")}
    small = getattr(cpu, "small", None)
    if small is not None:
        for op, code in (("all_reduce", base.ALL_REDUCE), ("broadcast", base.BROADCAST),
                         ("all_gather", base.ALL_GATHER),
                         ("reduce_scatter", base.REDUCE_SCATTER),
                         ("all_to_all", base.ALL_TO_ALL)):
            found[op].append(small.sizes[code])
        if small.split_from:
            found["all_reduce"].append(small.split_from)
    for op, attr, per_rank in (("all_reduce", "min_reduce", False),
                               ("reduce_scatter", "min_scatter", True),
                               ("all_gather", "min_gather", True),
                               ("broadcast", "min_bcast", False),
                               ("all_reduce", "min_hier", False)):
        limit = getattr(cpu, attr, None)
        if limit is not None and limit < (1 << 40):
            found[op].append(limit // n if per_rank else limit)
    slot = getattr(cpu, "slot_bytes", None)
    if slot:
        for op in found:
            found[op].append(slot)
    for call, limit in (getattr(cpu, "gated_from", None) or {}).items():
        op = {"Iallreduce": "all_reduce", "Ibcast": "broadcast", "Iallgather": "all_gather",
              "Ireduce_scatter_block": "reduce_scatter", "Ialltoall": "all_to_all"}.get(call)
        if op is not None and limit < (1 << 40):
            found[op].append(limit)
    direct = getattr(cpu, "direct_below", 0)
    if direct and direct < (1 << 40):
        found["all_reduce"].append(direct)
    return {op: sorted({s for s in sizes if 0 < s <= LARGE}) for op, sizes in found.items()}


# -- the sequence ------------------------------------------------------------------------------
class Step(NamedTuple):
    what: str                          # the call, for messages
    start: Callable[[bool], Any]       # start(async_op) -> Work or None
    verify: Callable[[], None]         # compares this rank's outputs with the reference
    error: Optional[str] = None        # an invalid call: what its message must contain
    sync_only: bool = False            # no async_op (object collectives, blocking p2p)


class Steps:
    """The steps drawn from one seed for one group; every rank draws the same."""

    def __init__(self, dist: Any, group: Group, seed: int):
        self.dist = dist
        self.group = group
        self.n = len(group.ranks)
        self.me = group.me
        self.rng = np.random.default_rng([seed, sum(map(ord, group.name))])
        self.dtypes = [d for d in DTYPES if d != "bfloat16" or _has_ml_dtypes()]

    # draws shared by every rank
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.rng.choice(self.dtypes))

    def reduction(self, dtype: np.dtype) -> str:
        return str(self.rng.choice(REDUCTIONS[family(dtype)]))

    def count(self, op: str, itemsize: int, blocks: int = 1) -> int:
        """Elements of the operation (of one rank's block when the output holds
        ``blocks`` of them): 0, 1, odd, around a threshold of the group's paths (in
        elements, so some cross it by one), or large."""
        roll = self.rng.random()
        limits = self.group.thresholds.get(op, [])
        if roll < 0.06:
            count = 0
        elif roll < 0.12:
            count = 1
        elif roll < 0.5:
            count = int(self.rng.integers(2, 300)) | 1
        elif roll < 0.85 and limits:
            edge = int(self.rng.choice(limits)) // itemsize
            count = max(1, edge + int(self.rng.integers(-1, 2)))
        elif roll < 0.96:
            count = int(self.rng.integers(300, 40000))
        else:
            count = int(self.rng.integers(LARGE // 4, LARGE)) // itemsize
        return min(count, LARGE // itemsize // blocks)

    def root(self) -> int:
        return int(self.rng.integers(self.n))

    def op(self, red: str) -> Any:
        R = self.dist.ReduceOp
        return self.dist._make_nccl_premul_sum(PREMUL_FACTOR) if red == "PREMUL_SUM" \
            else getattr(R, red)

    def inputs(self, dtype, count, red=None) -> List[np.ndarray]:
        seed = int(self.rng.integers(1 << 31))
        return [values(dtype, count, seed, r, red, self.n) for r in range(self.n)]

    # the steps
    def steps(self, count: int) -> List[Step]:
        makers = [self.all_reduce, self.all_reduce, self.reduce, self.broadcast,
                  self.all_gather_into_tensor, self.all_gather, self.gather, self.scatter,
                  self.reduce_scatter_tensor, self.reduce_scatter, self.all_to_all_single,
                  self.all_to_all_single, self.all_to_all, self.barrier, self.send_recv,
                  self.shift, self.objects, self.invalid, self.invalid]
        order: List[int] = []  # every kind of step in each round, in a random order
        while len(order) < count:
            order += [int(i) for i in self.rng.permutation(len(makers))]
        return [makers[i]() for i in order[:count]]

    def all_reduce(self) -> Step:
        dtype = self.dtype()
        red = self.reduction(dtype)
        count = self.count("all_reduce", dtype.itemsize)
        data = self.inputs(dtype, count, red)
        shape = (count // 3, 3) if count % 3 == 0 and count else (count,)
        if count == 1 and self.rng.integers(2):
            shape = ()  # a 0-d array, as torch's scalars
        buf = data[self.me].copy().reshape(shape) if self.me >= 0 else None
        want = reference(data, red).reshape(shape)
        what = f"all_reduce {dtype}{list(shape)} {red}"
        return Step(what, lambda a: self.dist.all_reduce(buf, op=self.op(red),
                                                         group=self.group.pg, async_op=a),
                    lambda: check(buf, want, exact(dtype, red, self.n), what))

    def reduce(self) -> Step:
        dtype = self.dtype()
        red = self.reduction(dtype)
        count = self.count("all_reduce", dtype.itemsize)
        data = self.inputs(dtype, count, red)
        root = self.root()
        buf = data[self.me].copy() if self.me >= 0 else None
        want = reference(data, red)
        what = f"reduce {dtype}[{count}] {red} to group rank {root}"
        return Step(what, lambda a: self.dist.reduce(buf, group_dst=root, op=self.op(red),
                                                     group=self.group.pg, async_op=a),
                    lambda: check(buf, want, exact(dtype, red, self.n), what)
                    if self.me == root else None)

    def broadcast(self) -> Step:
        dtype = self.dtype()
        count = self.count("broadcast", dtype.itemsize)
        data = self.inputs(dtype, count)
        root = self.root()
        buf = data[self.me].copy() if self.me >= 0 else None
        src = self.group.ranks[root]  # a global rank, as torch's src
        what = f"broadcast {dtype}[{count}] from global rank {src}"
        return Step(what, lambda a: self.dist.broadcast(buf, src=src, group=self.group.pg,
                                                        async_op=a),
                    lambda: check(buf, data[root], True, what))

    def all_gather_into_tensor(self) -> Step:
        dtype = self.dtype()
        count = self.count("all_gather", dtype.itemsize, self.n)
        data = self.inputs(dtype, count)
        want = np.concatenate(data) if data else np.empty(0, dtype)
        in_place = bool(self.rng.integers(2))
        out = np.zeros(count * self.n, dtype)
        if self.me >= 0 and in_place:  # the input is this rank's block of the output
            out[self.me * count:(self.me + 1) * count] = data[self.me]
            arg = out[self.me * count:(self.me + 1) * count]
        else:
            arg = data[self.me] if self.me >= 0 else None
        what = f"all_gather_into_tensor {dtype}[{count}]{' in place' if in_place else ''}"
        return Step(what, lambda a: self.dist.all_gather_into_tensor(
            out, arg, group=self.group.pg, async_op=a), lambda: check(out, want, True, what))

    def all_gather(self) -> Step:
        dtype = self.dtype()
        counts = [self.count("all_gather", dtype.itemsize, self.n) if self.rng.random() < 0.3
                  else int(self.rng.integers(0, 50)) for _ in range(self.n)]
        seed = int(self.rng.integers(1 << 31))
        data = [values(dtype, c, seed, r, None, self.n) for r, c in enumerate(counts)]
        outs = [np.zeros(c, dtype) for c in counts]
        mine = data[self.me] if self.me >= 0 else None
        what = f"all_gather {dtype} counts {counts}"

        def verify():
            for r, out in enumerate(outs):
                check(out, data[r], True, f"{what}, block {r}")
        return Step(what, lambda a: self.dist.all_gather(outs, mine, group=self.group.pg,
                                                         async_op=a), verify)

    def gather(self) -> Step:
        dtype = self.dtype()
        count = self.count("all_gather", dtype.itemsize, self.n)
        data = self.inputs(dtype, count)
        root = self.root()
        outs = [np.zeros(count, dtype) for _ in range(self.n)] if self.me == root else None
        mine = data[self.me] if self.me >= 0 else None
        what = f"gather {dtype}[{count}] to group rank {root}"

        def verify():
            if self.me == root:
                for r, out in enumerate(outs):
                    check(out, data[r], True, f"{what}, block {r}")
        return Step(what, lambda a: self.dist.gather(mine, outs, group_dst=root,
                                                     group=self.group.pg, async_op=a), verify)

    def scatter(self) -> Step:
        dtype = self.dtype()
        count = self.count("all_gather", dtype.itemsize, self.n)
        data = self.inputs(dtype, count)
        root = self.root()
        out = np.zeros(count, dtype)
        ins = data if self.me == root else None
        what = f"scatter {dtype}[{count}] from group rank {root}"
        return Step(what, lambda a: self.dist.scatter(out, ins, group_src=root,
                                                      group=self.group.pg, async_op=a),
                    lambda: check(out, data[self.me], True, what))

    def reduce_scatter_tensor(self) -> Step:
        dtype = self.dtype()
        red = self.reduction(dtype)
        block = self.count("reduce_scatter", dtype.itemsize, self.n)
        data = self.inputs(dtype, block * self.n, red)
        want = reference(data, red)
        in_place = bool(self.rng.integers(2))
        mine = data[self.me].copy() if self.me >= 0 else None
        if in_place and mine is not None:  # the output is this rank's block of the input
            out = mine[self.me * block:(self.me + 1) * block]
        else:
            out = np.zeros(block, dtype)
        what = (f"reduce_scatter_tensor {dtype}[{block} per rank] {red}"
                f"{' in place' if in_place else ''}")
        return Step(what, lambda a: self.dist.reduce_scatter_tensor(
            out, mine, op=self.op(red), group=self.group.pg, async_op=a),
            lambda: check(out, want[self.me * block:(self.me + 1) * block],
                          exact(dtype, red, self.n), what))

    def reduce_scatter(self) -> Step:
        dtype = self.dtype()
        red = self.reduction(dtype)
        counts = [int(self.rng.integers(0, 2000)) for _ in range(self.n)]
        data = self.inputs(dtype, sum(counts), red)
        edges = np.cumsum([0] + counts)
        want = reference(data, red)
        out = np.zeros(counts[self.me] if self.me >= 0 else 0, dtype)
        mine = ([data[self.me][edges[r]:edges[r + 1]] for r in range(self.n)]
                if self.me >= 0 else None)
        what = f"reduce_scatter {dtype} counts {counts} {red}"
        return Step(what, lambda a: self.dist.reduce_scatter(
            out, mine, op=self.op(red), group=self.group.pg, async_op=a),
            lambda: check(out, want[edges[self.me]:edges[self.me + 1]],
                          exact(dtype, red, self.n), what))

    def all_to_all_single(self) -> Step:
        dtype = self.dtype()
        n = self.n
        if self.rng.random() < 0.3:  # split sizes along dim 0 (rows of 2)
            splits = self.rng.integers(0, 40, (n, n))  # splits[src][dst] rows
            seed = int(self.rng.integers(1 << 31))
            data = [values(dtype, int(splits[r].sum()) * 2, seed, r, None, n).reshape(-1, 2)
                    for r in range(n)]
            if self.me < 0:
                return Step("all_to_all_single (non-member)", lambda a: self.dist.
                            all_to_all_single(np.zeros(0), np.zeros(0), group=self.group.pg,
                                              async_op=a), lambda: None)
            parts = [np.split(d, np.cumsum(splits[r])[:-1]) for r, d in enumerate(data)]
            want = np.concatenate([parts[r][self.me] for r in range(n)])
            out = np.zeros_like(want)
            ins = [int(s) for s in splits[self.me]]
            outs = [int(splits[r][self.me]) for r in range(n)]
            what = f"all_to_all_single {dtype} rows {ins} -> {outs}"
            return Step(what, lambda a: self.dist.all_to_all_single(
                out, data[self.me], outs, ins, group=self.group.pg, async_op=a),
                lambda: check(out, want, True, what))
        block = self.count("all_to_all", dtype.itemsize, self.n)
        data = self.inputs(dtype, block * n)
        in_place = bool(self.rng.integers(2))
        if self.me >= 0:
            want = np.concatenate([d[self.me * block:(self.me + 1) * block] for d in data])
            out = data[self.me].copy() if in_place else np.zeros(block * n, dtype)
            src = out if in_place else data[self.me]
        else:
            want = out = src = None
        what = f"all_to_all_single {dtype}[{block} per rank]{' in place' if in_place else ''}"
        return Step(what, lambda a: self.dist.all_to_all_single(out, src, group=self.group.pg,
                                                                async_op=a),
                    lambda: check(out, want, True, what))

    def all_to_all(self) -> Step:
        dtype = self.dtype()
        n = self.n
        sizes = self.rng.integers(0, 30, (n, n))  # sizes[src][dst]
        seed = int(self.rng.integers(1 << 31))
        data = [[values(dtype, int(sizes[s][d]), seed + d, s, None, n) for d in range(n)]
                for s in range(n)]
        me = self.me
        outs = [np.zeros(int(sizes[s][me]), dtype) for s in range(n)] if me >= 0 else []
        ins = data[me] if me >= 0 else []
        what = f"all_to_all {dtype} list"

        def verify():
            for s, out in enumerate(outs):
                check(out, data[s][me], True, f"{what}, from group rank {s}")
        return Step(what, lambda a: self.dist.all_to_all(outs, ins, group=self.group.pg,
                                                         async_op=a), verify)

    def barrier(self) -> Step:
        return Step("barrier", lambda a: self.dist.barrier(group=self.group.pg, async_op=a),
                    lambda: None)

    def send_recv(self) -> Step:
        """One blocking send and receive between two group ranks (the receive from any
        source half the time); with one rank, nothing to pair: a barrier."""
        if self.n < 2:
            return self.barrier()
        src, dst = (int(r) for r in self.rng.choice(self.n, 2, replace=False))
        dtype = self.dtype()
        count = int(self.rng.integers(0, 5000))
        data = self.inputs(dtype, count)
        tag = int(self.rng.integers(0, 1000))
        any_source = bool(self.rng.integers(2))
        out = np.zeros(count, dtype)
        pg, ranks = self.group.pg, self.group.ranks
        what = f"send/recv {dtype}[{count}] group rank {src} -> {dst} tag {tag}"
        got = []

        def start(_):
            if self.me == src:
                self.dist.send(data[src], group_dst=dst, group=pg, tag=tag)
            elif self.me == dst:
                got.append(self.dist.recv(out, group=pg, tag=tag,
                                          group_src=None if any_source else src))

        def verify():
            if self.me == dst:
                if got[0] != ranks[src]:
                    raise Failure(f"{what}: recv returned {got[0]}, want global {ranks[src]}")
                check(out, data[src], True, what)
        return Step(what, start, verify, sync_only=True)

    def shift(self) -> Step:
        """Every rank sends to the rank ``k`` after it and receives from the one ``k``
        before: isend/irecv, or batch_isend_irecv."""
        n, me, pg = self.n, self.me, self.group.pg
        k = int(self.rng.integers(1, max(n, 2)))
        dtype = self.dtype()
        count = int(self.rng.integers(0, 3000))
        data = self.inputs(dtype, count)
        batch = bool(self.rng.integers(2))
        out = np.zeros(count, dtype)
        what = f"{'batch_isend_irecv' if batch else 'isend/irecv'} shift by {k} " \
               f"{dtype}[{count}]"

        def start(_):
            if me < 0:
                return None
            to, frm = (me + k) % n, (me - k) % n
            if batch:
                ops = [self.dist.P2POp(self.dist.irecv, out, group_peer=frm, group=pg),
                       self.dist.P2POp(self.dist.isend, data[me], group_peer=to, group=pg)]
                works = self.dist.batch_isend_irecv(ops)
            else:
                works = [self.dist.irecv(out, group_src=frm, group=pg),
                         self.dist.isend(data[me], group_dst=to, group=pg)]
            for work in works:
                work.wait()
        return Step(what, start, lambda: check(out, data[(me - k) % n], True, what),
                    sync_only=True)

    def objects(self) -> Step:
        """An object collective, with payloads around the inline slot's size."""
        kind = str(self.rng.choice(["broadcast", "all_gather", "gather", "scatter"]))
        seed = int(self.rng.integers(1 << 31))
        sizes = [int(self.rng.choice([0, 10, 200, 1000, 5000, 70000])) for _ in range(self.n)]
        objs = [{"rank": r, "text": "x" * sizes[r],
                 "array": values(np.dtype("float32"), sizes[r] % 97, seed, r, None, self.n)}
                for r in range(self.n)]
        root = self.root()
        me, pg, d = self.me, self.group.pg, self.dist
        got: List[Any] = []
        what = f"{kind}_object sizes {sizes} root {root}"

        def start(_):
            if kind == "broadcast":
                box = [objs[me] if me == root else None]
                d.broadcast_object_list(box, group_src=root, group=pg)
                got.append(box[0])
            elif kind == "all_gather":
                box = [None] * self.n
                d.all_gather_object(box, objs[me] if me >= 0 else None, group=pg)
                got.append(box)
            elif kind == "gather":
                box = [None] * self.n if me == root else None
                d.gather_object(objs[me] if me >= 0 else None, box, group_dst=root, group=pg)
                got.append(box)
            else:
                box = [None]
                d.scatter_object_list(box, objs if me == root else None, group_src=root,
                                      group=pg)
                got.append(box[0])

        def same(a, b, where):
            if a["rank"] != b["rank"] or a["text"] != b["text"]:
                raise Failure(f"{what}: {where} differs")
            check(a["array"], b["array"], True, f"{what}: {where}")

        def verify():
            if kind == "broadcast":
                same(got[0], objs[root], "the object")
            elif kind == "all_gather" or (kind == "gather" and me == root):
                for r in range(self.n):
                    same(got[0][r], objs[r], f"object {r}")
            elif kind == "scatter":
                same(got[0], objs[me], "this rank's object")
        return Step(what, start, verify, sync_only=True)

    # invalid calls: the same on every rank
    def invalid(self) -> Step:
        d, pg, n = self.dist, self.group.pg, self.n
        dtype = self.dtype()
        fam = family(dtype)
        choice = int(self.rng.integers(10))
        x = np.ones(7, dtype)
        if choice == 0 and n > 1:  # elements not divisible by the group (bytes may be)
            count = n * int(self.rng.integers(1, 40)) + 1
            return self._bad("all_to_all_single", lambda: d.all_to_all_single(
                np.zeros(count, dtype), np.ones(count, dtype), group=pg),
                "divisible by the group size")
        if choice == 1:
            return self._bad("all_gather_into_tensor", lambda: d.all_gather_into_tensor(
                np.zeros(7 * n + 1, dtype), x, group=pg), "group size x input size")
        if choice == 2:
            return self._bad("reduce_scatter_tensor", lambda: d.reduce_scatter_tensor(
                np.zeros(7, dtype), np.ones(7 * n + 1, dtype), group=pg),
                "group size x output size")
        if choice == 3:  # another dtype of the same bytes
            other = {1: "int8", 2: "int16", 4: "float32", 8: "float64", 16: "complex128"}
            twin = np.dtype(other[dtype.itemsize])
            if twin == dtype:
                twin = np.dtype({1: "uint8", 2: "float16", 4: "int32", 8: "int64",
                                 16: "complex128"}[dtype.itemsize])
            if twin == dtype:
                return self.barrier()
            return self._bad("all_gather_into_tensor", lambda: d.all_gather_into_tensor(
                np.zeros(7 * n, twin), x, group=pg), "dtype")
        if choice == 4:  # a read-only output, on every rank (the root's included)
            frozen = np.ones(7, dtype)
            frozen.flags.writeable = False
            if self.rng.integers(2):
                return self._bad("broadcast", lambda: d.broadcast(
                    frozen, group_src=self.root(), group=pg), "read-only")
            return self._bad("all_reduce", lambda: d.all_reduce(frozen, group=pg),
                             "read-only")
        if choice == 5:
            strided = np.ones(14, dtype)[::2]
            return self._bad("all_reduce", lambda: d.all_reduce(strided, group=pg),
                             "not C-contiguous")
        if choice == 6:  # a reduction the dtype does not have
            red, words = UNDEFINED[fam]
            name = "reduce_scatter_tensor" if self.rng.integers(2) else "all_reduce"
            if name == "all_reduce":
                return self._bad(name, lambda: d.all_reduce(
                    x, op=getattr(d.ReduceOp, red), group=pg), words)
            return self._bad(name, lambda: d.reduce_scatter_tensor(
                np.zeros(2, dtype), np.ones(2 * n, dtype), op=getattr(d.ReduceOp, red),
                group=pg), words)
        if choice == 7:  # an op that is no ReduceOp (a bool is an int to C)
            return self._bad("all_reduce", lambda: d.all_reduce(x, op=False, group=pg),
                             "ReduceOp")
        if choice == 8:  # a root outside the group
            return self._bad("broadcast", lambda: d.broadcast(x, group_src=n, group=pg),
                             "group_src")
        return self._bad("all_reduce", lambda: d.all_reduce(x.tolist(), group=pg),
                         "NumPy or CuPy array")

    def _bad(self, op: str, call: Callable[[], Any], words: str) -> Step:
        return Step(f"invalid {op} ({words})", lambda a: call(), lambda: None,
                    error=words, sync_only=True)


_ML = []


def _has_ml_dtypes() -> bool:
    if not _ML:
        try:
            import ml_dtypes  # noqa: F401
            _ML.append(True)
        except ImportError:
            _ML.append(False)
    return _ML[0]


# -- running a sequence ----------------------------------------------------------------------
class Ran(NamedTuple):
    errors: List[str]   # the invalid calls' messages, rank numbers aside (see run)
    checked: int        # steps whose outcome this rank checked (0 on a non-member)


def run(dist: Any, group: Group, seed: int, count: int) -> Ran:
    """Run ``count`` steps drawn from ``seed`` on ``group``: what was checked, and the
    messages of the invalid calls (to compare across ranks). Raises :class:`Failure` at
    the first step that differs, naming the seed, the group and the step."""
    seq = Steps(dist, group, seed)
    steps = seq.steps(count)
    local = np.random.default_rng([seed, dist.get_rank(), 7])  # this rank's own choices
    member = group.me >= 0
    errors: List[str] = []
    pending: List[tuple] = []
    checked = 0
    for index, step in enumerate(steps):
        where = (f"differential seed {seed}, group '{group.name}' (global ranks "
                 f"{group.ranks}), step {index}: {step.what}")
        try:
            if not member:
                _non_member(step, where)
                continue
            checked += 1
            if step.error is not None:
                errors.append(_expect_error(dist, group, step, where))
                continue
            async_op = not step.sync_only and bool(local.integers(3) == 0)
            work = step.start(async_op)
            if async_op:
                pending.append((work, step, where))
                if len(pending) >= int(local.integers(1, 5)):
                    _finish(pending, local)
            else:
                if work is not None and not async_op:
                    raise Failure(f"{where}: a synchronous call returned {work!r}")
                step.verify()
        except Failure as exc:
            raise Failure(f"{where}: {exc}") from None
        except Exception as exc:
            raise Failure(f"{where}: raised {type(exc).__name__}: {exc}\n"
                          f"{traceback.format_exc()}") from None
    _finish(pending, local)
    return Ran(errors, checked)


def _finish(pending: List[tuple], local: Optional[np.random.Generator] = None) -> None:
    """Wait for the started operations, in an order of this rank's own, then check them."""
    order = list(range(len(pending)))
    if local is not None:
        local.shuffle(order)
    for i in order:
        work, step, where = pending[i]
        try:
            work.wait()
            step.verify()
        except Failure as exc:
            raise Failure(f"{where} (async): {exc}") from None
    pending.clear()


def _expect_error(dist: Any, group: Group, step: Step, where: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            step.start(False)
        except dist.DistValueError as exc:
            message = str(exc)
        except Exception as exc:
            raise Failure(f"{where}: raised {type(exc).__name__} ({exc}), want "
                          f"DistValueError") from None
        else:
            raise Failure(f"{where}: no error; the call must raise DistValueError")
    want = f"on rank {group.me}/{len(group.ranks)} of group '{group.pg.group_name}'"
    if want not in message or step.error not in message or "hpccomm." not in message:
        raise Failure(f"{where}: the error {message!r} does not say {step.error!r} and "
                      f"{want!r}")
    return re.sub(r"on rank \d+/", "on rank R/", message)


def _non_member(step: Step, where: str) -> None:
    """A rank outside the group: torch's warning, no error, nothing communicated."""
    if step.error is not None and "group_src" in step.error:
        return  # a bad root is the members' error; outside it means nothing
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            result = step.start(False)
        except Exception as exc:
            if step.error is not None:
                return  # the arguments themselves may be wrong (a list for an array)
            raise Failure(f"{where}: a non-member got {type(exc).__name__}: {exc}") from None
    if result is not None:
        raise Failure(f"{where}: a non-member got {result!r}, want None")
    if not step.sync_only and not any("does not belong" in str(w.message) for w in seen):
        raise Failure(f"{where}: a non-member got no warning")


def same_errors_everywhere(dist: Any, group: Group, errors: List[str]) -> None:
    """Every member raised the same messages (their rank aside) for the invalid calls."""
    if group.me < 0:
        return
    every: List[Any] = [None] * len(group.ranks)
    dist.all_gather_object(every, errors, group=group.pg)
    for rank, theirs in enumerate(every):
        if theirs != errors:
            diff = next((i for i, (a, b) in enumerate(zip(theirs, errors)) if a != b),
                        min(len(theirs), len(errors)))
            raise Failure(f"group '{group.name}': group rank {rank} raised other errors than "
                          f"group rank {group.me} at invalid call {diff}: "
                          f"{theirs[diff:diff + 1]} vs {errors[diff:diff + 1]}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Run one differential sequence under "
                                                 "mpiexec (as a failing test names it).")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--config", action="append", choices=sorted(CONFIGS),
                        help="the group(s) to run on (default: all)")
    args = parser.parse_args(argv)
    import hpccomm as dist

    dist.init_process_group(timeout=60)
    status = 0
    for name in args.config or list(CONFIGS):
        group = make_group(dist, name)
        try:
            same_errors_everywhere(dist, group, run(dist, group, args.seed, args.steps).errors)
            print(f"rank {dist.get_rank()}: seed {args.seed} on '{name}': ok", flush=True)
        except Failure as exc:
            print(f"rank {dist.get_rank()}: {exc}", flush=True)
            status = 1
            break
        finally:
            if group.me >= 0:
                dist.destroy_process_group(group.pg)
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
