"""The backend-neutral core on its own: ReduceOp, Backend registry, Work and Future."""
import datetime

import pytest

import hpccomm
from hpccomm.work import Work


def test_reduce_op_members_and_instances():
    assert hpccomm.ReduceOp.SUM == 0 and int(hpccomm.ReduceOp.PREMUL_SUM) == 8
    op = hpccomm.ReduceOp(hpccomm.ReduceOp.MAX)
    assert op == hpccomm.ReduceOp.MAX and op.op is hpccomm.RedOpType.MAX
    premul = hpccomm._make_nccl_premul_sum(0.25)
    assert premul.op == hpccomm.ReduceOp.PREMUL_SUM and premul.factor == 0.25
    with pytest.warns(FutureWarning):
        assert hpccomm.reduce_op.SUM == hpccomm.ReduceOp.SUM


def test_backend_names_and_registration():
    assert hpccomm.Backend("MPI") == "mpi" and hpccomm.Backend.GLOO == "gloo"
    with pytest.raises(ValueError):
        hpccomm.Backend("carrier-pigeon")

    def creator(comm, timeout):
        raise AssertionError("not created in this test")

    hpccomm.Backend.register_backend("my_backend", creator, devices="cpu")
    try:
        assert hpccomm.Backend("my_backend") == "my_backend"
        assert hpccomm.Backend.MY_BACKEND == "my_backend"
        with pytest.raises(ValueError, match="already registered"):
            hpccomm.Backend.register_backend("my_backend", creator)
    finally:
        hpccomm.Backend._plugins.pop("my_backend")


def test_work_times_out_with_a_description():
    work = Work(lambda: False)
    work.op, work.seq, work.timeout = "all_reduce", 7, 0.05
    with pytest.raises(hpccomm.DistTimeoutError, match=r"all_reduce \(seq 7\).*timed out"):
        work.wait()
    assert work.is_completed() and not work.is_success()
    assert isinstance(work.exception(), TimeoutError)


def test_work_wait_timeout_argument_overrides_group_timeout():
    work = Work(lambda: False)
    work.timeout = 3600
    with pytest.raises(hpccomm.DistTimeoutError):
        work.wait(timeout=datetime.timedelta(milliseconds=20))


def test_work_completion_runs_finish_once_and_settles_future():
    calls, polls = [], iter([False, False, True])
    work = Work(lambda: next(polls), finish=lambda: calls.append(1))
    work.set_result(("out",))
    future = work.get_future()
    chained = future.then(lambda fut: fut.value()[0] + "!")
    assert not future.done()
    assert work.wait() is True and work.wait() is True
    assert calls == [1]
    assert future.value() == ["out"] and chained.wait() == "out!"


def test_work_failure_becomes_a_backend_error():
    def broken():
        raise OSError("link down")

    work = Work(broken)
    with pytest.raises(hpccomm.DistBackendError, match="link down"):
        work.wait()
    assert not work.is_success()


def test_standalone_future():
    future = hpccomm.Future()
    seen = []
    future.then(lambda fut: seen.append(fut.value()))
    future.set_result(5)
    assert future.done() and future.wait() == 5 and seen == [5]


def test_poll_returns_zero_once_the_test_passes():
    from hpccomm.work import poll

    answers = iter([False] * 200 + [True])
    assert poll(lambda: next(answers), 5.0) == 0.0
    assert next(answers, "drained") == "drained"  # polled exactly until it passed


def test_poll_reports_the_seconds_waited_when_the_limit_passes():
    from hpccomm.work import poll

    waited = poll(lambda: False, 0.03)
    assert 0.03 <= waited < 5.0


def test_oversubscribed_ranks_check_and_yield_more_often():
    from hpccomm import work

    before = work._polls_per_check
    try:
        work.set_oversubscribed(True)
        assert work._polls_per_check == work.POLLS_SHARED
        work.set_oversubscribed(False)
        assert work._polls_per_check == work.POLLS_ALONE
        assert work.POLLS_SHARED < work.POLLS_ALONE
    finally:
        work._polls_per_check = before


def test_as_work_wraps_a_host_triple_and_keeps_a_work():
    from hpccomm.work import as_work

    done = []
    work = as_work((lambda: True, lambda: done.append(1) or 3, "kept"))
    assert isinstance(work, Work) and work.wait() and done == [1]
    assert work.source_rank() == 3  # a finishing step's value is a receive's source
    same = Work(lambda: True)
    assert as_work(same) is same
    with pytest.raises(hpccomm.DistError, match="completed receive"):
        Work(lambda: False).source_rank()


def test_works_internal_api_chains_holds_and_reports():
    """What the dispatch path and the diagnostics use: steps after the finishing step,
    buffers held until the end, the finishing step's value, the state, failing."""
    order = []
    work = Work(lambda: True, finish=lambda: order.append("finish") or 7, result=("a",))
    work.add_finish(lambda: order.append("after"))
    work.hold("buffer")
    assert work.state == "pending" and work.value is None
    assert work.wait() and order == ["finish", "after"]
    assert (work.state, work.value, work.result()) == ("completed", 7, ["a"])
    failed = Work(lambda: False)
    error = failed.fail(RuntimeError("boom"))
    assert failed.state == "failed" and failed.exception() is error
    assert isinstance(error, hpccomm.DistError) and "boom" in str(error)
