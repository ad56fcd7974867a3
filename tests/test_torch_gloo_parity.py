"""hpccomm's torch backend against torch's gloo, bit for bit, on the same random calls.

Each rank makes torch's default group on ``"hpccomm"`` and a gloo group of the same
ranks beside it (over the default group's store), then runs a seeded random sequence of
torch calls twice, once per group, on identical inputs, and compares every output
tensor bit for bit. The calls are the forms where layouts are easy to get wrong: the
deprecated coalesced calls (``all_reduce_coalesced``, ``all_gather_coalesced``, whose
output lists are indexed ``[rank][input]``), the coalescing manager's fast paths, the
list and tensor forms of all_gather, gather, scatter and reduce_scatter, and
all_to_all_single with uneven splits. Inputs are small integers (in float and integer
dtypes), so a sum is exact in whatever order a backend reduces. Runs at 2 and 4 ranks.
"""
import random
import warnings

import pytest

from torch_cases import TIMEOUT, dist, torch

# after torch_cases, which skips the module without torch
from torch.distributed.distributed_c10d import _coalescing_manager

pytestmark = pytest.mark.mpi(min_size=2)

SEEDS = [0, 1, 2, 3]
STEPS = 12
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN]


@pytest.fixture(scope="module")
def groups():
    """(hpccomm group, gloo group) over the same ranks."""
    if not dist.is_gloo_available():
        pytest.skip("this torch has no gloo")
    dist.init_process_group("hpccomm", init_method="mpi://", timeout=TIMEOUT)
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    yield dist.group.WORLD, gloo
    dist.destroy_process_group()


def draw(gen, shape, dtype, rank, salt):
    """Rank ``rank``'s input: small integers from the seed, the rank and ``salt``."""
    g = torch.Generator().manual_seed(gen * 1000 + rank * 17 + salt)
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


def same(a, b, where):
    assert a.dtype == b.dtype and a.shape == b.shape, (where, a, b)
    assert torch.equal(a.view(-1).view(torch.uint8) if a.dtype.is_floating_point else a,
                       b.view(-1).view(torch.uint8) if b.dtype.is_floating_point else b), \
        f"{where}: hpccomm {a.tolist()} gloo {b.tolist()}"


def calls(rng, seed, rank, size):
    """The sequence: (name, run) pairs; ``run(group)`` makes fresh inputs and outputs,
    runs the call on ``group`` and returns every tensor it wrote."""
    for step in range(STEPS):
        kind = rng.choice(["all_reduce_coalesced", "all_gather_coalesced", "cm_all_reduce",
                           "cm_all_gather", "cm_reduce_scatter", "all_gather",
                           "gather", "scatter", "reduce_scatter", "all_to_all_single",
                           "all_gather_into_tensor", "reduce_scatter_tensor"])
        dtype = rng.choice(DTYPES)
        op = rng.choice(OPS)
        root = rng.randrange(size)
        shapes = [(rng.randint(1, 5),) for _ in range(rng.randint(1, 3))]
        salt = step * 100

        def inputs():
            return [draw(seed, shape, dtype, rank, salt + i) for i, shape in enumerate(shapes)]

        def run(group, kind=kind, dtype=dtype, op=op, root=root, shapes=shapes,
                inputs=inputs):
            xs = inputs()
            if kind == "all_reduce_coalesced":
                dist.all_reduce_coalesced(xs, op=op, group=group)
                return xs
            if kind == "all_gather_coalesced":
                outs = [[torch.zeros(s, dtype=dtype) for s in shapes] for _ in range(size)]
                dist.all_gather_coalesced(outs, xs, group=group)
                return [t for per_rank in outs for t in per_rank]
            if kind == "cm_all_reduce":
                with _coalescing_manager(group):
                    for x in xs:
                        dist.all_reduce(x, op=op, group=group)
                return xs
            if kind == "cm_all_gather":
                outs = [torch.zeros(size * x.numel(), dtype=dtype) for x in xs]
                with _coalescing_manager(group):
                    for out, x in zip(outs, xs):
                        dist.all_gather_into_tensor(out, x, group=group)
                return outs
            if kind == "cm_reduce_scatter":
                big = [draw(seed, (size * s[0],), dtype, rank, salt + 50 + i)
                       for i, s in enumerate(shapes)]
                outs = [torch.zeros(s, dtype=dtype) for s in shapes]
                with _coalescing_manager(group):
                    for out, x in zip(outs, big):
                        dist.reduce_scatter_tensor(out, x, op=op, group=group)
                return outs
            x = xs[0]
            if kind == "all_gather":
                outs = [torch.zeros_like(x) for _ in range(size)]
                dist.all_gather(outs, x, group=group)
                return outs
            if kind == "all_gather_into_tensor":
                out = torch.zeros(size * x.numel(), dtype=dtype)  # gloo takes no stacked form
                dist.all_gather_into_tensor(out, x, group=group)
                return [out]
            if kind == "gather":
                outs = [torch.zeros_like(x) for _ in range(size)] if rank == root else None
                dist.gather(x, outs, dst=root, group=group)
                return outs or [x]
            if kind == "scatter":
                ins = ([draw(seed, x.shape, dtype, r, salt + 7) for r in range(size)]
                       if rank == root else None)
                out = torch.zeros_like(x)
                dist.scatter(out, ins, src=root, group=group)
                return [out]
            if kind == "reduce_scatter":
                ins = [draw(seed, x.shape, dtype, rank, salt + 9 + r) for r in range(size)]
                out = torch.zeros_like(x)
                dist.reduce_scatter(out, ins, op=op, group=group)
                return [out]
            if kind == "reduce_scatter_tensor":
                big = draw(seed, (size * x.numel(),), dtype, rank, salt + 11)
                out = torch.zeros_like(x)
                dist.reduce_scatter_tensor(out, big, op=op, group=group)
                return [out]
            # all_to_all_single with uneven splits, the same on every rank's view
            splits = [(r + rank + step) % 3 + 1 for r in range(size)]
            recv = [(rank + r + step) % 3 + 1 for r in range(size)]
            src = draw(seed, (sum(splits),), dtype, rank, salt + 13)
            out = torch.zeros(sum(recv), dtype=dtype)
            dist.all_to_all_single(out, src, recv, splits, group=group)
            return [out]
        yield f"step {step}: {kind} {dtype} {op} root {root} shapes {shapes}", run


@pytest.mark.parametrize("seed", SEEDS)
def test_same_calls_same_bits_as_gloo(groups, seed):
    hpc, gloo = groups
    rank, size = dist.get_rank(), dist.get_world_size()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecated forms are the point here
        for where, run in calls(random.Random(seed), seed, rank, size):
            ours, theirs = run(hpc), run(gloo)
            assert len(ours) == len(theirs), where
            for i, (a, b) in enumerate(zip(ours, theirs)):
                same(a, b, f"seed {seed}, {where}, output {i}")
