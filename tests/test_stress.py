"""Concurrency under load: many asynchronous operations in flight on several groups at
once (each path of tests/differential.py's groups), threads that issue on groups of
their own, and groups destroyed while operations are pending. Every result is checked;
the suite runs this at 8 ranks too."""
import threading

import numpy as np
import pytest

import differential
from helpers import skip_below_thread_multiple

pytestmark = pytest.mark.mpi(min_size=2)

#: Configs of tests/differential.py whose groups hold every rank.
WHOLE = [name for name, (_, members) in differential.CONFIGS.items() if members == "all"]


def make_groups(dist, names):
    return [differential.make_group(dist, name) for name in names]


def destroy(dist, groups):
    for group in groups:
        if group.me >= 0:
            dist.destroy_process_group(group.pg)


@pytest.fixture
def groups(world):
    import hpccomm as dist

    made = make_groups(dist, list(differential.CONFIGS))
    yield made
    destroy(dist, made)


def test_hundreds_of_operations_in_flight_on_every_group(dist, groups, rank, size):
    """Operations started back to back, round robin over the groups, and waited for in
    an order of each rank's own: each gives its own result."""
    local = np.random.default_rng(rank)
    pending = []
    for i in range(240):
        group = groups[i % len(groups)]
        n, me = len(group.ranks), group.me
        if me < 0:
            continue
        count = (1, 7, 1000, 5000)[i % 4]
        kind = i // len(groups) % 3
        if kind == 0:
            x = np.full(count, me + i, np.int64)
            work = dist.all_reduce(x, group=group.pg, async_op=True)
            want = np.full(count, sum(r + i for r in range(n)), np.int64)
        elif kind == 1:
            out = np.zeros(count * n, np.int32)
            work = dist.all_gather_into_tensor(out, np.full(count, me * 1000 + i, np.int32),
                                               group=group.pg, async_op=True)
            x, want = out, np.repeat(np.arange(n, dtype=np.int32) * 1000 + i, count)
        else:
            root = i % n
            x = np.full(count, float(me if me != root else i))
            work = dist.broadcast(x, group_src=root, group=group.pg, async_op=True)
            want = np.full(count, float(i))
        pending.append((work, x, want, f"operation {i} on group '{group.name}'"))
    order = local.permutation(len(pending))
    for index in order:
        work, x, want, what = pending[index]
        work.wait()
        assert np.array_equal(x, want), what
    for group in groups:  # every group is still in step
        if group.me >= 0:
            x = np.ones(3)
            dist.all_reduce(x, group=group.pg)
            assert (x == len(group.ranks)).all(), group.name


def test_sequences_on_several_groups_interleaved(dist, groups):
    """The differential sequences of every group, a step of each in turn, so that each
    group's operations are in flight while the others' run."""
    seqs = [(group, differential.Steps(dist, group, 99).steps(20)) for group in groups]
    checked = 0
    for index in range(20):
        works = []
        for group, steps in seqs:
            step = steps[index]
            if group.me < 0 or step.error is not None:
                continue
            if step.sync_only:
                step.start(False)
                step.verify()
                checked += 1
            else:
                works.append((step.start(True), step, group.name))
        for work, step, name in reversed(works):
            work.wait()
            step.verify()
            checked += 1
    assert checked == sum(step.error is None for group, steps in seqs if group.me >= 0
                          for step in steps)


def test_threads_issue_on_groups_of_their_own(dist, rank, size):
    """Each thread owns one group (its own path) and runs a sequence on it while the
    others run theirs; each result is checked."""
    skip_below_thread_multiple("operations from several threads at once")
    groups = make_groups(dist, WHOLE)
    failures = []

    def work(group, seed):
        try:
            ran = differential.run(dist, group, seed, 25)
            differential.same_errors_everywhere(dist, group, ran.errors)
            assert ran.checked == 25
        except BaseException as exc:  # reported by the main thread
            failures.append(f"{group.name}: {exc}")
    try:
        threads = [threading.Thread(target=work, args=(group, 50 + i))
                   for i, group in enumerate(groups)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=4 * differential.GROUP_TIMEOUT_S)
        assert not any(thread.is_alive() for thread in threads), "a thread never finished"
        assert not failures, failures
    finally:
        destroy(dist, groups)


@pytest.mark.parametrize("name", WHOLE)
def test_a_group_destroyed_with_operations_pending(dist, rank, size, name):
    """Operations that every rank started and that are still pending when their group
    is destroyed end at once, with their result or an error naming the destruction,
    never a timeout; one that only rank 0 started may wait its time out, as on MPI. The
    other groups go on."""
    group = differential.make_group(dist, name)
    works = [dist.all_reduce(np.full(n, 1.0), group=group.pg, async_op=True)
             for n in (1, 100, 3000, 70000)]
    alone = dist.all_reduce(np.ones(5), group=group.pg, async_op=True) if rank == 0 else None
    dist.destroy_process_group(group.pg)
    for work in works:
        try:
            work.wait(timeout=differential.GROUP_TIMEOUT_S)
        except dist.DistTimeoutError:
            raise
        except dist.DistError as exc:
            assert "destroyed" in str(exc) or "closed" in str(exc), exc
    if alone is not None:
        with pytest.raises(dist.DistError):  # nobody else joined it
            alone.wait(timeout=1)
    x = np.ones(4)
    dist.all_reduce(x)  # the default group is unaffected
    assert (x == size).all()
