"""A script written for PyTorch's own MPI backend, ``init_process_group("mpi")``.

PyTorch's wheels are built without MPI, so on them this script stops with "Distributed
package doesn't have MPI built in". hpccomm serves the backend name, unchanged:

    hpccomm run --torch -n 4 examples/torch_mpi_backend.py     # no edit at all
    mpiexec -n 4 python -c "import hpccomm.torch, runpy; runpy.run_path('examples/torch_mpi_backend.py', run_name='__main__')"

(or add ``import hpccomm.torch`` to the script and start it with ``mpiexec``/``srun``).
Rank and world size come from MPI, as torch documents for "mpi". The script checks its
own results: all_reduce, bfloat16, reduce_scatter_single, a new_group, and DDP training
against the same training in one process.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def train(model, x, y, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def main():
    dist.init_process_group("mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "mpi"

    x = torch.full((4,), rank + 1.0, dtype=torch.bfloat16)
    dist.all_reduce(x)
    assert x.tolist() == [size * (size + 1) / 2] * 4, x

    out = torch.empty(2)
    dist.reduce_scatter_single(out, torch.arange(2.0 * size))
    assert out.tolist() == [size * 2.0 * rank, size * (2.0 * rank + 1)], out

    evens = dist.new_group(list(range(0, size, 2)))
    if rank % 2 == 0:
        y = torch.ones(1)
        dist.all_reduce(y, group=evens)
        assert y.item() == len(range(0, size, 2)), y

    torch.manual_seed(0)
    data, target = torch.randn(8 * size, 6), torch.randn(8 * size, 1)
    torch.manual_seed(1)
    ddp = DistributedDataParallel(nn.Linear(6, 1))
    train(ddp, data.chunk(size)[rank], target.chunk(size)[rank])
    torch.manual_seed(1)
    alone = train(nn.Linear(6, 1), data, target)
    for mine, expected in zip(ddp.module.parameters(), alone.parameters()):
        torch.testing.assert_close(mine, expected, rtol=1e-5, atol=1e-6)
    if rank == 0:
        print(f"backend 'mpi' on {size} ranks: collectives and DDP match one process")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
