"""Every path of a CPU collective agrees with NumPy, and so with each other: seeded random
sequences of operations (tests/differential.py) on groups that force each path, the
fast paths off among them. A failure names its seed, group and step, and the command
that runs that sequence alone."""
import pytest

import differential

pytestmark = pytest.mark.mpi(min_size=1)

#: Seeds run by the suite (fixed: the same sequences every run).
SEEDS = [1, 2]
#: Steps per sequence.
STEPS = 40


@pytest.fixture(scope="module")
def groups(world):
    import hpccomm as dist

    made = {name: differential.make_group(dist, name) for name in differential.CONFIGS}
    yield made
    for group in made.values():
        if group.me >= 0:
            dist.destroy_process_group(group.pg)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("config", list(differential.CONFIGS))
def test_random_sequence_matches_numpy(dist, groups, config, seed):
    group = groups[config]
    try:
        ran = differential.run(dist, group, seed, STEPS)
        differential.same_errors_everywhere(dist, group, ran.errors)
    except differential.Failure as exc:
        pytest.fail(f"{exc}\nrun it alone: mpiexec -n {dist.get_world_size()} python "
                    f"tests/differential.py --seed {seed} --steps {STEPS} --config {config}",
                    pytrace=False)
    assert ran.checked == (STEPS if group.me >= 0 else 0)
    assert ran.errors or group.me < 0, "the sequence made no invalid call"


def test_each_sequence_draws_every_kind_of_step(dist, groups):
    """Each sequence holds every operation, valid and invalid, in every group."""
    every = {"all_reduce", "reduce", "broadcast", "all_gather_into_tensor", "all_gather",
             "gather", "scatter", "reduce_scatter_tensor", "reduce_scatter",
             "all_to_all_single", "all_to_all", "barrier", "invalid"}
    for name, group in groups.items():
        for seed in SEEDS:
            steps = differential.Steps(dist, group, seed).steps(STEPS)
            kinds = {step.what.split(" ")[0] for step in steps}
            assert every <= kinds, f"group '{name}', seed {seed}: no {every - kinds}"
