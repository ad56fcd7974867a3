"""Start-up and failure scenarios of backend "hpccomm", each its own ``mpiexec`` job.

Run as ``mpiexec -n N python tests/scripts/torch_case.py CASE`` by
tests/test_torch_launch.py: the cases start torch's default group in other ways than the
test sessions do, or break groups on purpose. Lines starting with ``RESULT`` are what
the test checks; any unexpected failure raises (non-zero exit, traceback in the output).
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import hpccomm.torch

TIMEOUT = datetime.timedelta(seconds=60)


def say(rank, *parts):
    line = " ".join(["RESULT", f"rank={rank}", *parts]) + "\n"
    sys.stdout.flush()
    os.write(1, line.encode())


def one_line(exc):
    return f"type={type(exc).__name__} error={str(exc).splitlines()[0]}"


def timeouts():
    """Rank 1 stops taking part; rank 0 must get a timeout error from every kind of wait,
    each on its own group (a timed-out group is unusable), naming operation, rank and
    group, well before the world's 60 s timeout."""
    dist.init_process_group("hpccomm", init_method="mpi://", timeout=TIMEOUT)
    rank = dist.get_rank()
    short = datetime.timedelta(seconds=1)
    groups = [dist.new_group([0, 1], timeout=short) for _ in range(5)]
    if rank == 1:
        time.sleep(5)
        dist.destroy_process_group()
        return

    def sync_all_reduce(group):
        dist.all_reduce(torch.ones(4), group=group)

    def future_wait(group):  # what C++ waiters (DDP) block on
        dist.all_reduce(torch.ones(4), group=group, async_op=True).get_future().wait()

    def work_wait_timeout(group):
        dist.irecv(torch.empty(2), src=1, group=group).wait(datetime.timedelta(seconds=0.5))

    def barrier_opts_timeout(group):
        opts = dist.BarrierOptions()
        opts.timeout = datetime.timedelta(seconds=0.5)
        opts.asyncOp = False
        group.barrier(opts)

    def monitored(group):
        hpccomm.torch.monitored_barrier(group, timeout=datetime.timedelta(seconds=0.5))

    hooks = hasattr(dist.ProcessGroup, "register_abort_hook")  # torch 2.14
    for group, case in zip(groups, (sync_all_reduce, future_wait, work_wait_timeout,
                                    barrier_opts_timeout, monitored)):
        aborted = []
        if hooks:
            group.register_abort_hook(7, lambda: aborted.append(1))
        started = time.monotonic()
        try:
            case(group)
        except Exception as exc:  # noqa: BLE001 - the type is what the test checks
            state = (f"aborted={len(aborted)} "
                     f"state={group._get_backend(torch.device('cpu')).get_error().name} "
                     if hooks else "")
            say(rank, f"case={case.__name__}", f"elapsed={time.monotonic() - started:.2f}",
                f"backend_error={isinstance(exc, dist.DistBackendError)}", state + one_line(exc))
        else:
            say(rank, f"case={case.__name__}", "no error")
    dist.destroy_process_group()


def env_init():
    """init_method="env://" (a TCPStore) with torch's ranks numbered against MPI's."""
    from mpi4py import MPI

    mpi_rank, world = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    os.environ.update(RANK=str(world - 1 - mpi_rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1")
    dist.init_process_group("hpccomm", init_method="env://", timeout=TIMEOUT)
    rank = dist.get_rank()
    assert rank == world - 1 - mpi_rank, (rank, mpi_rank)
    x = torch.full((3,), float(rank))
    dist.broadcast(x, src=0)
    assert x.tolist() == [0.0] * 3, x
    parts = [torch.empty(1) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([float(rank)]))
    assert [p.item() for p in parts] == [float(r) for r in range(world)], parts
    sub = dist.new_group([0, world - 1])
    if rank in (0, world - 1):
        y = torch.tensor([float(rank)])
        dist.all_reduce(y, group=sub)
        assert y.item() == world - 1
    say(rank, "ok", f"mpi_rank={mpi_rank}")
    dist.destroy_process_group()


def mixed_backend():
    """"cpu:hpccomm,cuda:nccl": CPU tensors on hpccomm, CUDA tensors on torch's NCCL."""
    dist.init_process_group("cpu:hpccomm,cuda:nccl", init_method="mpi://", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "cpu:hpccomm,cuda:nccl", dist.get_backend()
    x = torch.ones(2)
    dist.all_reduce(x)
    assert x.tolist() == [float(world)] * 2
    assert {d.type for d in dist.group.WORLD._device_types} == {"cpu", "cuda"}
    if torch.cuda.is_available() and torch.cuda.device_count() >= world:
        torch.cuda.set_device(rank)
        y = torch.ones(2, device="cuda")
        dist.all_reduce(y)
        assert y.tolist() == [float(world)] * 2
        say(rank, "ok", "cuda=yes")
    else:
        say(rank, "ok", "cuda=no")
    dist.destroy_process_group()


def reinit():
    """destroy_process_group, then init_process_group again: a fresh rendezvous."""
    for attempt in range(3):
        dist.init_process_group("hpccomm", init_method="mpi://", timeout=TIMEOUT)
        x = torch.ones(1)
        dist.all_reduce(x)
        assert x.item() == dist.get_world_size()
        store = dist.distributed_c10d._get_default_store()
        store.set(f"attempt{attempt}", str(dist.get_rank()))
        assert not store.check([f"attempt{attempt - 1}"]) or attempt == 0
        dist.destroy_process_group()
    from mpi4py import MPI

    say(MPI.COMM_WORLD.Get_rank(), "ok")


def wrong_world_size():
    """A torch world that is not the MPI job is refused with a clear error."""
    try:
        dist.init_process_group("hpccomm", store=dist.HashStore(), rank=0, world_size=2,
                                timeout=TIMEOUT)
    except Exception as exc:  # noqa: BLE001
        say(0, one_line(exc))
    else:
        say(0, "no error")


def thread_serialized():
    """MPI below MPI_THREAD_MULTIPLE (the job sets HPCCOMM_MPI_THREAD_LEVEL=serialized):
    mpi:// serves its store over TCP, asynchronous work has no progress thread (a
    warning says so), futures and DDP still work."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("hpccomm", init_method="mpi://", timeout=TIMEOUT)
    from mpi4py import MPI

    rank, world = dist.get_rank(), dist.get_world_size()
    warned = any("MPI_THREAD_MULTIPLE" in str(w.message) for w in caught)
    future = dist.all_reduce(torch.ones(3), async_op=True).get_future()
    assert future.done() and future.value()[0].tolist() == [float(world)] * 3
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    model(torch.full((1, 2), float(rank))).sum().backward()
    grads = [torch.empty(2, 2) for _ in range(world)]
    dist.all_gather(grads, model.module.weight.grad)
    assert all(torch.equal(g, grads[0]) for g in grads)
    subgroup = dist.new_group([0, 1])  # through the store's keys
    dist.barrier(group=subgroup)
    say(rank, f"warned={warned}", f"level={MPI.Query_thread()}", "ok=1")
    dist.destroy_process_group()


def debug_detail():
    """torch's TORCH_DISTRIBUTED_DEBUG=DETAIL (the job sets it), on each name of the
    backend: groups are made, operate and are destroyed as at any level."""
    for name in ("mpi", "hpccomm", "cpu:hpccomm,cuda:nccl"):
        if name == "mpi":
            dist.init_process_group("mpi", timeout=TIMEOUT)
        else:
            dist.init_process_group(name, init_method="mpi://", timeout=TIMEOUT)
        rank, world = dist.get_rank(), dist.get_world_size()
        assert dist.get_debug_level() == dist.DebugLevel.DETAIL
        x = torch.ones(3)
        dist.all_reduce(x)
        assert x.tolist() == [float(world)] * 3
        pair = dist.new_group([0, 1])
        dist.all_reduce(x, group=pair)
        send, recv = torch.full((2,), float(rank)), torch.empty(2)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, (rank + 1) % world),
                                            dist.P2POp(dist.irecv, recv, (rank - 1) % world)]):
            work.wait()
        assert recv.tolist() == [float((rank - 1) % world)] * 2
        dist.destroy_process_group()
        say(rank, f"backend={name}", "ok=1")


def flight_recorder_hang():
    """Rank 1 skips the second all_reduce of a group; rank 0's times out (2 s) and, with
    TORCH_FR_DUMP_TEMP_FILE set, writes its flight recorder dump then; rank 1 writes its
    own on demand."""
    from hpccomm.torch import flight_recorder

    dist.init_process_group("hpccomm", init_method="mpi://", timeout=TIMEOUT)
    rank = dist.get_rank()
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2))
    x = torch.ones(2)
    dist.all_reduce(x, group=group)
    if rank == 0:
        try:
            dist.all_reduce(x, group=group)
            say(rank, "no error")
        except Exception as exc:
            say(rank, one_line(exc))
    else:
        flight_recorder.dump_file()
        say(rank, "ok=1")
    dist.barrier()
    dist.destroy_process_group()


def mesh_abort():
    """DeviceMesh.abort() (torch 2.15) on rank 0 runs the groups' abort hooks, then ends
    the job (MPI cannot abort one communicator); rank 1 waits in a barrier meanwhile."""
    dist.init_process_group("hpccomm", init_method="mpi://", timeout=TIMEOUT)
    rank = dist.get_rank()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    dist.all_reduce(torch.ones(1), group=mesh.get_group())
    if hasattr(dist.ProcessGroup, "register_abort_hook"):
        mesh.get_group().register_abort_hook(1, lambda: say(rank, "abort_hook=1"))
    if rank == 0:
        say(rank, "aborting=1")
        mesh.abort()
        say(rank, "still running after abort()")
    else:
        dist.barrier()


CASES = {f.__name__: f for f in (timeouts, env_init, mixed_backend, reinit,
                                  wrong_world_size, thread_serialized, debug_detail,
                                  flight_recorder_hang, mesh_abort)}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
