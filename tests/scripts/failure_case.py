"""Programs that fail on purpose, for tests/test_failures.py: ``mpiexec -n N python this.py CASE``.

Each case makes one rank fail while the others wait in a collective, the way real
programs fail: an uncaught exception (plain hpccomm, a thread, torch with its own
excepthook on top of hpccomm's), or a rank that dies without a word (SIGKILL,
``os._exit``) in the middle of a loop of collectives. The test checks that the
traceback reaches the launcher's output and that no rank outlives the bound.
"""
import os
import signal
import sys
import threading
import time

import numpy as np

CASE = sys.argv[1]
#: The group timeout of every case: long, so that only the abort can end the job fast.
TIMEOUT = float(os.environ.get("CASE_TIMEOUT", "120"))
#: The rank that fails.
VICTIM = int(os.environ.get("CASE_VICTIM", "1"))


T0 = time.monotonic()


def say(rank, *parts):
    """One ``RESULT`` line, written with one system call (``t=``: seconds since start)."""
    sys.stdout.flush()
    os.write(1, (" ".join(["RESULT", f"rank={rank}", f"t={time.monotonic() - T0:.2f}",
                           *parts]) + "\n").encode())


def plain():
    import hpccomm as dist

    dist.init_process_group(timeout=TIMEOUT)
    return dist, dist.get_rank(), lambda: dist.all_reduce(np.ones(4))


def torch_group(init_method):
    import torch
    import torch.distributed as tdist

    import hpccomm.torch  # noqa: F401 (registers backend "hpccomm")

    if init_method == "env://":
        from mpi4py import MPI

        os.environ.update(RANK=str(MPI.COMM_WORLD.Get_rank()),
                          WORLD_SIZE=str(MPI.COMM_WORLD.Get_size()), MASTER_ADDR="127.0.0.1")
    import datetime

    tdist.init_process_group("hpccomm", init_method=init_method,
                             timeout=datetime.timedelta(seconds=TIMEOUT))
    assert torch  # noqa
    return tdist, tdist.get_rank(), lambda: tdist.all_reduce(torch.ones(4))


def exception(setup):
    """The victim raises; the others wait in an all_reduce with a long timeout."""
    _, rank, collective = setup()
    collective()
    if rank == VICTIM:
        raise ValueError(f"boom on purpose in rank {rank}")
    say(rank, "waiting")
    collective()
    say(rank, "not reached")


def thread_exception():
    """A thread of the victim raises while its main thread, like the others', waits."""
    dist, rank, collective = plain()
    collective()
    if rank == VICTIM:
        def work():
            raise ValueError(f"boom on purpose in a thread of rank {rank}")

        threading.Thread(target=work, name="loader").start()
        time.sleep(TIMEOUT)  # the abort must end this
    say(rank, "waiting")
    collective()
    say(rank, "not reached")


def dies(how):
    """The victim dies without a word in the middle of a loop of collectives."""
    dist, rank, _ = plain()
    x = np.ones(1024)
    for step in range(1 << 30):
        if rank == VICTIM and step == 20:
            say(rank, "event=dying", f"how={how}", f"pid={os.getpid()}")
            if how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        dist.all_reduce(x)
        x[:] = 1


def until_the_victim_dies(rank, at, step):
    """``step()`` in a loop, until it raises; the victim dies (SIGKILL) at loop ``at``."""
    for count in range(1 << 30):
        if rank == VICTIM and count == at:
            os.kill(os.getpid(), signal.SIGKILL)
        step()


def survive():
    """ULFM: the victim dies in a loop of all_reduces; the survivors must each raise
    ProcessFailedError naming it, shrink, agree and go on (planned exclusion too)."""
    dist, rank, _ = plain()
    size = dist.get_world_size()
    x = np.ones(1024)
    try:
        for step in range(1 << 30):
            if rank == VICTIM and step == 20:
                os.kill(os.getpid(), signal.SIGKILL)
            start = time.monotonic()
            dist.all_reduce(x)
            x[:] = 1
    except dist.ProcessFailedError as exc:
        say(rank, f"elapsed={time.monotonic() - start:.3f}", f"failed={exc.failed_ranks}",
            "error=" + str(exc).replace("\n", " "))
    world = dist.shrink_group()
    assert world is dist.group.WORLD and world.size() == size - 1, world
    assert dist.get_rank() == [r for r in range(size) if r != VICTIM].index(rank)
    y = np.full(3, float(rank))
    dist.all_reduce(y)
    both = dist.agree(True), dist.agree(dist.get_rank() != 0), dist.agree(0b110 | (rank & 1))
    mesh = dist.init_device_mesh("cpu", (world.size(),), mesh_dim_names=("dp",))
    z = np.ones(2)
    dist.all_reduce(z, group=mesh.get_group("dp"))
    last = world.size() - 1
    if dist.get_rank() != last:  # planned exclusion: the excluded rank does not call it
        smaller = dist.shrink_group([last])
        w = np.ones(1)
        dist.all_reduce(w)
        say(rank, f"new_rank={dist.get_rank()}", f"sum={y[0]:g}", f"agree={list(both)}",
            f"mesh={z[0]:g}", f"planned={smaller.size()},{w[0]:g}")
        dist.destroy_process_group()
    else:  # excluded: end the process (normally: MPI_Finalize), as torch tells them to
        say(rank, "event=excluded")


def gpu_survive():
    """ULFM with the simulated GPU: the default group has its NCCL communicator when the
    victim dies; the survivors shrink, which aborts the old NCCL communicators (never
    waiting for the dead), and their next GPU collective makes the survivors' own; or,
    through nccl4py on NCCL 2.27 (``HPCCOMM_NCCL_BINDING=nccl4py``,
    ``SIM_NCCL_VERSION=22703``), the shrink makes it (``ncclCommShrink``) before the old
    one is aborted."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "gpu_sim"))
    import cupy

    dist, rank, _ = plain()
    size = dist.get_world_size()
    g = cupy.asarray(np.ones(4, np.float32))
    dist.all_reduce(g)
    old = list(dist.group.WORLD.communicator("cuda")._created)
    x = np.ones(16)
    try:
        until_the_victim_dies(rank, 20, lambda: dist.all_reduce(x))
    except dist.ProcessFailedError as exc:
        say(rank, f"failed={exc.failed_ranks}")
    made = made_so_far()
    dist.shrink_group()
    y = cupy.asarray(np.full(2, float(rank), np.float32))
    dist.all_reduce(y)
    now = made_so_far()
    say(rank, f"aborted={all(m.aborted for m in old)}", f"gpu_sum={float(y[0]):g}",
        f"bootstraps={now[0] - made[0]}", f"shrinks={now[1][len(made[1]):]}")
    dist.destroy_process_group()


def made_so_far():
    """(NCCL communicators made from unique ids, the flags of each ``ncclCommShrink``) on
    the simulated GPU so far, through CuPy or, with ``HPCCOMM_NCCL_BINDING=nccl4py``,
    through nccl4py."""
    if os.environ.get("HPCCOMM_NCCL_BINDING") == "nccl4py":
        from nccl.bindings import nccl as nccl4py

        return nccl4py.made["blocking"], list(nccl4py.made["shrink"])
    from cupy.cuda import nccl

    return nccl.made["bootstrap"], []


def gpu_stall():
    """The simulated GPU (``SIM_NCCL_STALL=init:1`` or ``split:1``): every rank comes to
    make an NCCL communicator (the default group's at its first GPU collective, or a
    split of it), then the victim never returns from NCCL's creation. The others wait in
    theirs until the group's timeout (``CASE_STALL_TIMEOUT``, set after a barrier: a slow
    start-up is not what is tested) ends the job; no rank gets past it."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "gpu_sim"))
    import cupy
    import hpccomm as dist

    dist.init_process_group(backend="cpu:mpi,cuda:nccl", timeout=TIMEOUT)
    rank = dist.get_rank()
    dist.barrier()
    dist.set_timeout(float(os.environ["CASE_STALL_TIMEOUT"]))
    dist.all_reduce(cupy.asarray(np.ones(4, np.float32)))
    say(rank, "made=group")
    dist.split_group(split_ranks=[list(range(dist.get_world_size()))])
    say(rank, "made=split not reached")


def survive_p2p():
    """ULFM: rank 0 waits to receive from the victim, which dies; the others wait in a
    barrier. Rank 0's recv names the victim and revokes the group: the others raise too."""
    dist, rank, _ = plain()
    dist.barrier()
    start = time.monotonic()
    try:
        if rank == VICTIM:
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        elif rank == 0:
            dist.recv(np.empty(4), src=VICTIM)
        else:
            dist.barrier()
        say(rank, "no error")
    except dist.ProcessFailedError as exc:
        say(rank, f"elapsed={time.monotonic() - start:.3f}", f"failed={exc.failed_ranks}",
            "error=" + str(exc).replace("\n", " "))


def agree_beside_a_thread():
    """ULFM, no failure: rounds of three agreements (True, "not rank 0", 6 or 7) while a
    second thread of every rank polls MPI the way hpccomm's helper threads do (under
    ``mpi_level.helper_lock``), beside rank 0's MPI store server. Open MPI's agreement
    returned a neighbouring agreement's value a few times in 2,000 rounds when the
    threads overlapped; each rank says how many rounds went wrong."""
    from mpi4py import MPI

    from hpccomm import mpi_level

    dist, rank, _ = plain()
    side, stop = MPI.COMM_SELF.Dup(), threading.Event()

    def poll_mpi():
        while not stop.is_set():
            with mpi_level.helper_lock:
                side.Iprobe()
            os.sched_yield()  # as a helper between rounds: the others may take the lock

    helper = threading.Thread(target=poll_mpi, name="helper")
    helper.start()
    wrong = []
    try:
        for i in range(int(os.environ.get("CASE_ROUNDS", "3000"))):
            got = (dist.agree(True), dist.agree(rank != 0), dist.agree(0b110 | (rank & 1)))
            if got != (True, False, 6):
                wrong.append((i, got))
    finally:
        stop.set()
        helper.join()
    say(rank, f"wrong={len(wrong)}", f"first={wrong[:3]}")
    side.Free()
    dist.destroy_process_group()


def torch_survive():
    """ULFM under torch: the survivors' all_reduce raises torch's DistBackendError (also
    hpccomm's ProcessFailedError); hpccomm.torch.shrink_group gives a new default group
    of the survivors, on which DDP trains."""
    import torch
    import torch.distributed as tdist

    import hpccomm.torch as ht

    tdist, rank, _ = torch_group("mpi://")
    size = tdist.get_world_size()
    x = torch.ones(256)
    try:
        until_the_victim_dies(rank, 10, lambda: tdist.all_reduce(x))
    except tdist.DistBackendError as exc:
        assert isinstance(exc, ht.ProcessFailedError), type(exc)
        say(rank, f"failed={exc.failed_ranks}", f"type={type(exc).__name__}")
    say(rank, "event=shrinking")
    world = ht.shrink_group()
    say(rank, "event=shrunk")
    assert world is tdist.group.WORLD and tdist.get_world_size() == size - 1
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.full((2, 4), float(tdist.get_rank()))).sum().backward()
    grads = [torch.empty_like(model.module.weight.grad) for _ in range(tdist.get_world_size())]
    tdist.all_gather(grads, model.module.weight.grad)
    same = all(torch.equal(g, grads[0]) for g in grads)
    say(rank, f"new_rank={tdist.get_rank()}", f"size={tdist.get_world_size()}",
        f"ddp_same_grads={same}", f"agree={ht.agree(True)}")
    tdist.destroy_process_group()


CASES = {
    "exception": lambda: exception(plain),
    "thread_exception": thread_exception,
    "torch_mpi_exception": lambda: exception(lambda: torch_group("mpi://")),
    "torch_env_exception": lambda: exception(lambda: torch_group("env://")),
    "sigkill": lambda: dies("sigkill"),
    "exit": lambda: dies("exit"),
    "survive": survive,
    "survive_p2p": survive_p2p,
    "gpu_survive": gpu_survive,
    "gpu_stall": gpu_stall,
    "torch_survive": torch_survive,
    "agree_beside_a_thread": agree_beside_a_thread,
}

if __name__ == "__main__":
    CASES[CASE]()
