"""Mistakes named on every path and at every rank count: the mistakes harness
(tests/mistakes.py) at 2, 3, 4 (also as 2 nodes) and 8 ranks, each job running its
configurations at debug level OFF and DETAIL; and, as jobs of their own at 2, 3, 4 and
8 ranks, a few group creations (differing members or constructors, a rank missing or
late, each followed by a retry).

Each job is its own ``mpiexec`` (serial tests start their jobs): a case's mistake leaves
its group unusable, and the harness makes fresh groups, on settings of its own (a short
roll call). A failure prints the harness's finding and the command that runs that
sequence alone.
"""
import os
import re
import sys

import pytest

from helpers import SCRIPTS, result_lines, run_case, run_job

HARNESS = os.path.join(os.path.dirname(SCRIPTS), "mistakes.py")
#: (ranks, nodes, configurations, cases per configuration and level, seed): every path a
#: call can take somewhere: the channel whole and split (small), in pieces (default from
#: 3 ranks), the pair kernel (ring at 2), the ring, the hierarchical path (2 nodes), MPI.
PLAN = [
    (2, 1, ["small", "ring", "mpi"], 3, 11),
    (3, 1, ["default", "small"], 3, 12),
    (4, 1, ["default", "ring", "mpi"], 3, 13),
    (4, 2, ["hier", "default"], 3, 14),
    (8, 1, ["default", "mpi"], 2, 15),
]
#: The configurations the collectives' jobs keep (comma-separated; all if unset): a run
#: under another MPI library keeps "mpi", the one path whose messages that library
#: carries (the shared-memory paths' mistakes are found in hpccomm's own code).
ONLY = [c for c in os.environ.get("HPCCOMM_TEST_MISTAKES_CONFIGS", "").split(",") if c]
#: (ranks, group creations, seed): every mistake of a group creation, on each
#: constructor. A job of its own per rank count: creation meets over MPI whatever the
#: collectives' paths, so every library runs these at every rank count.
CREATION_PLAN = [(2, 4, 11), (3, 4, 12), (4, 4, 13), (8, 4, 15)]


def _harness(args, ranks, nodes, limit):
    """Run tests/mistakes.py with ``args`` on ``ranks`` ranks; the job and the command
    that runs that sequence alone."""
    env = {"HPCCOMM_ROLLCALL_GRACE": "0.5"}
    if nodes > 1:
        env["HPCCOMM_NODES"] = nodes
    job = run_job([sys.executable, HARNESS] + args, ranks, limit=limit, env=env,
                  clean=["HPCCOMM_DISTRIBUTED_DEBUG", "TORCH_DISTRIBUTED_DEBUG"])
    alone = (f"{'HPCCOMM_NODES=2 ' if nodes > 1 else ''}mpiexec -n {ranks} python "
             f"tests/mistakes.py {' '.join(args)}")
    assert job.code == 0, f"{job.output[-12000:]}\nrun it alone: {alone}"
    return job, alone


@pytest.mark.parametrize("ranks,nodes,configs,cases,seed", PLAN,
                         ids=[f"{p[0]}-ranks{'-2-nodes' if p[1] > 1 else ''}" for p in PLAN])
def test_every_rank_names_the_mistake(ranks, nodes, configs, cases, seed):
    if ONLY:
        configs = [config for config in configs if config in ONLY]
        if not configs:
            pytest.skip(f"none of this job's paths is in HPCCOMM_TEST_MISTAKES_CONFIGS "
                        f"({','.join(ONLY)})")
    args = ["--seed", str(seed), "--cases", str(cases)]
    for config in configs:
        args += ["--config", config]
    job, alone = _harness(args, ranks, nodes, 60 + 12 * ranks * len(configs) * cases)
    oks = re.findall(r"rank \d+: \w+, DETAIL \w+: ok", job.stdout)
    assert len(oks) == ranks * len(configs) * 2, f"{job.output[-6000:]}\n{alone}"


@pytest.mark.parametrize("ranks,creations,seed", CREATION_PLAN,
                         ids=[f"{p[0]}-ranks" for p in CREATION_PLAN])
def test_every_rank_names_the_creation_mistake(ranks, creations, seed):
    """Differing members or constructors, a rank missing or late, each followed by a
    retry that must make the group on every rank."""
    args = ["--seed", str(seed), "--config", "none", "--creation", str(creations)]
    job, alone = _harness(args, ranks, 1, 60 + 15 * creations)
    made = re.findall(r"rank \d+: creation: ok", job.stdout)
    assert len(made) == ranks, f"{job.output[-6000:]}\n{alone}"


def test_sizes_that_differ_in_the_channel_s_pieces_are_named_at_once():
    """4 ranks, rank 0's all_reduce 1 MiB and the others' 1.5 MiB: both go through the
    small channel in pieces, each piece naming its whole call, so every rank raises at
    the first piece (not after the timeout) and says what each called."""
    job = run_case("never_hang_case.py", "sizes_differ_in_pieces", 4, CASE_TIMEOUT=10,
                   clean=["HPCCOMM_DISTRIBUTED_DEBUG", "TORCH_DISTRIBUTED_DEBUG"])
    found = dict(result_lines(job.output))
    assert sorted(found) == [0, 1, 2, 3], job.output
    for rank, fields in found.items():
        assert fields.get("type") == "DistDesyncError", job.output
        assert float(fields["elapsed"]) < 5, fields  # not the 10 s timeout
        error = fields["error"]
        assert f"hpccomm.all_reduce with shape ({131072 if rank == 0 else 196608},) " \
               f"float64 on rank {rank}/4 of group 'WORLD'" in error, error
        mine, theirs = (1048576, 1572864) if rank == 0 else (1572864, 1048576)
        assert f"called all_reduce of {theirs} bytes (float64, SUM)" in error, error
        assert f"(group rank {rank}) called all_reduce of {mine} bytes" in error, error


def test_the_plan_draws_every_mistake_and_operation():
    """Across the plan's seeds, sizes and configurations, the cases hold every kind of
    mistake and every operation (drawn as the jobs draw them, without MPI)."""
    import numpy as np

    import mistakes

    kinds, ops = set(), set()
    sizes = {"tiny": 8, "small": 1024, "edge": 262144, "pieces": 786456, "large": 1 << 20}
    for ranks, _, configs, cases, seed in PLAN:
        for config in configs:
            rng = np.random.default_rng([seed, sum(map(ord, config)), ranks])
            for index in range(cases):  # the same cases at both levels
                case = mistakes.draw(rng, index, ranks, sizes)
                kinds.add(case.mistake)
                ops.update(call.op for call in case.calls)
    assert kinds == set(mistakes.MISTAKES), kinds
    assert set(mistakes.OPS) <= ops, ops


def test_the_plan_draws_every_creation_mistake_on_every_constructor():
    """Across the plan's jobs, the group creations hold every mistake, and every
    constructor both made alike and made differently (drawn as the jobs draw them)."""
    import numpy as np

    import mistakes

    drawn, kinds, differ = set(), set(), set()
    for ranks, creations, seed in CREATION_PLAN:
        rng = np.random.default_rng([seed, ranks, 7])
        for index in range(creations):
            mistake, _, calls = mistakes.draw_creation(rng, index, ranks)
            rng.random(ranks)  # the delays, drawn between two cases as the jobs draw them
            drawn.add(mistake)
            made = {call.kind for call in calls if call.kind != "skip"}
            kinds |= made
            if mistake == "kind":
                differ |= made
    assert drawn == set(mistakes.CREATION_MISTAKES), drawn
    assert kinds == set(mistakes.CREATION_KINDS) == differ, (kinds, differ)
