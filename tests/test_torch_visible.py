"""What torch's own tools see of an hpccomm group, on torch 2.13, 2.14 and 2.15.

torch's code asks a group for the backend of a device (batched point-to-point calls,
object collectives, ``get_backend_impl``), records every operation in its profiler as
``"<backend>:<op>"``, and on 2.14 fires pre/post hooks around operations, abort hooks
before a group gives up, and reads ``get_error()``. Each of these is checked here on
groups made under both names the backend answers to. Runs in the MPI sessions of the
suite (2 and 4 ranks); the abort hooks after a real timeout are in
``tests/test_torch_launch.py`` (a timed-out group is unusable, so its own job).
"""
import datetime

import pytest

from torch_cases import TIMEOUT, assert_close, dist, torch
from torch_cases import torch_world  # noqa: F401 (fixture)

import hpccomm.torch as hpccomm_torch  # after torch_cases: it skips the module without torch
from hpccomm.torch import versions

pytestmark = pytest.mark.mpi(min_size=2)

CPU = torch.device("cpu")
needs_214 = pytest.mark.skipif(not versions.collective_hooks(),
                               reason="torch 2.14 feature (this is torch "
                                      f"{torch.__version__})")


def group():
    return dist.distributed_c10d._get_default_group()


# -- the backend of a device --------------------------------------------------------------------
def test_group_reports_its_cpu_backend(torch_world):
    pg = group()
    backend = pg._get_backend(CPU)
    assert isinstance(backend, hpccomm_torch.BackendHPC)
    assert backend.name() == torch_world and pg.name() == torch_world
    assert backend.rank() == dist.get_rank() and backend.size() == dist.get_world_size()
    assert backend.supports_coalescing is False and backend.supports_splitting is True
    assert pg._device_types == [CPU]
    if versions.python_backends():  # torch itself holds it: C++ callers find it too
        assert isinstance(backend, torch._C._distributed_c10d.Backend)
        assert dist.get_backend_impl() is backend
    with pytest.raises(RuntimeError, match="No backend type associated with device type "
                                           "cuda"):
        pg._get_backend(torch.device("cuda"))


def test_the_backend_runs_operations_itself(torch_world):
    """What torch's code may call on the backend it got runs like the group's own."""
    rank, size = dist.get_rank(), dist.get_world_size()
    backend = group()._get_backend(CPU)
    x = torch.full((3,), float(rank + 1))
    backend.allreduce([x], dist.AllreduceOptions()).wait()
    assert_close(x, torch.full((3,), float(size * (size + 1) // 2)))
    out = torch.zeros(size * 2)
    backend._allgather_base(out, torch.full((2,), float(rank))).wait()  # no options: defaults
    assert_close(out, torch.arange(size).repeat_interleave(2).float())


def test_batched_p2p_and_object_p2p(torch_world):
    rank, size = dist.get_rank(), dist.get_world_size()
    send, recv = torch.full((4,), float(rank)), torch.zeros(4)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % size),
           dist.P2POp(dist.irecv, recv, (rank - 1) % size)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert_close(recv, torch.full((4,), float((rank - 1) % size)))
    objects = [None]
    if rank == 0:
        dist.send_object_list([{"from": 0, "world": torch_world}], dst=1)
    elif rank == 1:
        dist.recv_object_list(objects, src=0)
        assert objects == [{"from": 0, "world": torch_world}]


@needs_214
def test_gather_single_and_set_timeout(torch_world):
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.full((2,), float(rank))
    out = torch.zeros(size * 2) if rank == size - 1 else None
    dist.gather_single(x, out, dst=size - 1)
    if rank == size - 1:
        assert_close(out, torch.arange(size).repeat_interleave(2).float())
    host = group().host_group
    dist.set_timeout(datetime.timedelta(seconds=7))
    assert host.timeout == 7
    dist.set_timeout(TIMEOUT)
    assert host.timeout == TIMEOUT.total_seconds()


# -- the profiler ---------------------------------------------------------------------------------
def events(prof, backend):
    found = prof.events() if isinstance(prof, torch.profiler.profile) else prof.function_events
    return [e for e in found if e.name.startswith(f"{backend}:")]


@pytest.mark.parametrize("make", ["torch.profiler", "autograd"])
def test_every_operation_is_one_async_profiler_event(torch_world, make):
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.ones(3, 2)
    profiler = (torch.profiler.profile() if make == "torch.profiler"
                else torch.autograd.profiler.profile(record_shapes=True))
    with profiler as prof:
        dist.all_reduce(x)
        dist.all_reduce(x, async_op=True).wait()
        dist.broadcast(x, src=0)
        dist.all_gather_into_tensor(torch.zeros(size * 6), x.view(-1))
        dist.barrier()
        peer = rank ^ 1
        if peer < size:
            if rank % 2 == 0:
                dist.send(x, peer)
            else:
                dist.recv(x, peer)
    found = events(prof, torch_world)
    names = [e.name for e in found]
    assert names.count(f"{torch_world}:all_reduce") == 2, names
    for name in ("broadcast", "all_gather_into_tensor", "barrier"):
        assert names.count(f"{torch_world}:{name}") == 1, names
    if rank ^ 1 < size:
        assert names.count(f"{torch_world}:{'send' if rank % 2 == 0 else 'recv'}") == 1, names
    for event in found:
        assert event.is_async, event
        if make == "autograd" and event.name.endswith(("all_reduce", "broadcast", "send",
                                                        "recv")):
            assert event.input_shapes == [[3, 2]], (event.name, event.input_shapes)


def test_an_async_event_has_ended_when_wait_returns(torch_world, monkeypatch):
    """The progress thread may complete an asynchronous operation, and end its event,
    while the caller's wait() runs: wait() returns only once the event has ended (else
    a caller leaving its profiler at once loses the event, on that rank only). Made
    likely here by slowing the end of each event and giving the thread time to finish
    the operation first."""
    import time

    from hpccomm.torch import profiling

    ended = []
    end = profiling.Record.end

    def slow_end(record):
        time.sleep(0.02)
        end(record)
        ended.append(1)
    monkeypatch.setattr(profiling.Record, "end", slow_end)
    x = torch.ones(2)
    with torch.autograd.profiler.profile():
        for i in range(10):
            work = dist.all_reduce(x, async_op=True)
            time.sleep(0.005)  # the progress thread finds it finished meanwhile
            work.wait()
            assert len(ended) == i + 1, "wait() returned before its event ended"
    dist.barrier()


def test_nothing_is_recorded_without_a_profiler(torch_world, monkeypatch):
    from hpccomm.torch import profiling

    def refuse(*args):
        raise AssertionError("a profiler event was started with no profiler running")
    monkeypatch.setattr(profiling, "_enter", refuse)
    x = torch.ones(2)
    dist.all_reduce(x)
    dist.all_reduce(x, async_op=True).wait()
    dist.broadcast(x, src=0)


# -- hooks (torch 2.14) ---------------------------------------------------------------------------
@needs_214
def test_pre_and_post_hooks_fire_around_each_operation(torch_world):
    pg, seen = group(), []
    hook_op = torch._C._distributed_c10d.HookOpName
    pg.register_pre_hook(1, lambda args: seen.append(("pre", args.name, args.op_id,
                                                      args.async_op, args.root)))
    pg.register_post_hook(1, lambda args: seen.append(("post", args.name, args.op_id,
                                                       args.async_op)))
    try:
        x = torch.ones(2)
        dist.all_reduce(x)
        dist.broadcast(x, src=dist.get_world_size() - 1, async_op=True).wait()
    finally:
        pg.unregister_pre_hook(1)
        pg.unregister_post_hook(1)
    dist.all_reduce(x)  # none after unregistering
    assert [entry[:2] for entry in seen] == [
        ("pre", hook_op.ALLREDUCE), ("post", hook_op.ALLREDUCE),
        ("pre", hook_op.BROADCAST), ("post", hook_op.BROADCAST)], seen
    assert seen[0][2] == seen[1][2] and seen[2][2] == seen[3][2] != seen[0][2]
    assert seen[2][3] is True and seen[2][4] == dist.get_world_size() - 1


@needs_214
def test_error_state_starts_clean_and_abort_hooks_register(torch_world):
    backend = group()._get_backend(CPU)
    assert backend.get_error() == torch._C._distributed_c10d.ErrorType.SUCCESS
    group().register_abort_hook(5, lambda: None)
    group().unregister_abort_hook(5)


@needs_214
def test_hooks_name_each_operation_as_torch_names_gloos(torch_world):
    """The hook names of an hpccomm group's operations are those torch's own dispatch
    gives a gloo group's same calls (torch 2.15 names the tensor-into-tensor and
    coalesced forms apart: ALLGATHER_BASE, REDUCE_SCATTER_BASE, ALLTOALL_BASE...)."""
    import torch.distributed._functional_collectives as funcol

    size = dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    names = {}
    for label, pg in (("hpccomm", group()), ("gloo", gloo)):
        seen = names[label] = []
        pg.register_pre_hook(3, (lambda seen: lambda args: seen.append(args.name))(seen))
        x = torch.ones(4)
        dist.all_reduce(x, group=pg)
        dist.all_gather([torch.zeros(4) for _ in range(size)], x, group=pg)
        dist.all_gather_into_tensor(torch.zeros(4 * size), x, group=pg)
        dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * size), group=pg)
        dist.all_to_all_single(torch.zeros(size), torch.ones(size), group=pg)
        dist.all_reduce_coalesced([x, x.clone()], group=pg)
        dist.broadcast(x, group_src=0, group=pg)
        funcol.all_gather_tensor(x, 0, pg).wait()
        funcol.all_reduce(x, "sum", pg).wait()
        dist.barrier(group=pg)
        pg.unregister_pre_hook(3)
    assert names["hpccomm"] == names["gloo"], names
    dist.destroy_process_group(gloo)


def test_what_the_backend_says_it_offers(torch_world):
    """torch 2.15 asks before estimating times and registering hooks: hpccomm estimates
    no times (torch's estimator refuses), runs abort hooks, has no completion hooks."""
    pg, backend = group(), group()._get_backend(CPU)
    for owner in (pg, backend):
        assert owner.supports_abort_hooks is True, owner
        assert owner.supports_completion_hooks is False, owner
    assert backend._supports_time_estimate is False
    assert backend.supports_splitting is True
    if hasattr(dist.distributed_c10d, "_time_estimator"):
        with pytest.raises(NotImplementedError, match="time estimator is not supported"):
            with dist.distributed_c10d._time_estimator():
                pass


@pytest.mark.skipif(not hasattr(dist.Backend, "_ensure_backend_registered"),
                    reason=f"torch 2.14 feature (this is torch {torch.__version__})")
def test_the_cuda_half_is_what_torch_makes_for_its_name(torch_world, monkeypatch):
    """torch 2.15 makes "nccl" ProcessGroupNCCL2 (ProcessGroupNCCL with
    TORCH_DIST_USE_NCCL2=0 or "nccl-legacy"), torch 2.14 ProcessGroupNCCL, each through
    the creator registered for the name: the CUDA backend of a group made as
    "cpu:hpccomm,cuda:<name>" is what torch's own creator for that name makes, with the
    group's name, ranks and timeout (a registered stand-in here: this machine may have no
    GPU)."""
    from hpccomm.torch.process_group import cuda_creator

    # torch's creator for "nccl" (2.15: _create_nccl2_process_group), whichever it is
    assert cuda_creator("nccl").function is dist.Backend._plugins["NCCL"].creator_fn
    made = []

    class StandIn(torch._C._distributed_c10d.Backend):
        pass

    def create(options, backend_options):
        made.append((options.group_id, list(options.global_ranks_in_group),
                     options.timeout, options.group_rank, options.group_size))
        return StandIn(options.group_rank, options.group_size)
    if "STANDIN" not in dist.Backend._plugins:
        dist.Backend.register_backend("standin", create, extended_api=True,
                                      devices=["cuda"])
    else:
        monkeypatch.setitem(dist.Backend._plugins, "STANDIN",
                            dist.Backend._plugins["STANDIN"]._replace(creator_fn=create))
    size = dist.get_world_size()
    pg = dist.new_group(list(range(size)), backend=f"cpu:{torch_world},cuda:standin",
                        timeout=TIMEOUT)
    backend = pg._get_backend(torch.device("cuda"))
    assert isinstance(backend, StandIn) and pg._get_backend(torch.device("cuda")) is backend
    assert made == [(pg.group_name, list(range(size)), TIMEOUT, dist.get_rank(), size)]
    assert {d.type for d in pg._device_types} == {"cpu", "cuda"}
    dist.destroy_process_group(pg)
