"""PyTorch DistributedDataParallel training on MPI, checked against one process.

An ordinary torch DDP script (DataLoader with a DistributedSampler, DDP, SGD), with the
only edits a CPU user makes to run it on hpccomm: ``import hpccomm.torch``, backend
``"hpccomm"`` and ``init_method="mpi://"``. No MASTER_ADDR, port or torchrun: the MPI
launcher starts the ranks. At the end rank 0 replays the training in one process on the
whole data set and checks that the weights agree to float32 round-off.

Run:  mpiexec -n 4 python examples/torch_ddp.py
      hpccomm run -n 4 examples/torch_ddp.py
      srun --mpi=pmi2 -n 4 python examples/torch_ddp.py     (see jobscripts/torch_ddp.sbatch)
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hpccomm.torch  # noqa: F401  registers backend "hpccomm" and init_method "mpi://"

EPOCHS, BATCH_PER_RANK, SAMPLES_PER_RANK = 3, 8, 64


def make_model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 1))


def make_data(world_size: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES_PER_RANK * world_size, 16, generator=gen)
    y = (x[:, :4].sum(1, keepdim=True) + 0.1 * torch.randn(len(x), 1, generator=gen))
    return TensorDataset(x, y)


def train(model: nn.Module, loader: DataLoader, sampler, epochs: int) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss = torch.tensor(0.0)
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
    return loss.item()


def main() -> None:
    torch.set_num_threads(1)  # one core per rank
    dist.init_process_group("hpccomm", init_method="mpi://")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    data = make_data(world_size)
    sampler = DistributedSampler(data, shuffle=False)  # rank r gets samples r, r+n, ...
    loader = DataLoader(data, batch_size=BATCH_PER_RANK, sampler=sampler)
    model = DistributedDataParallel(make_model())
    loss = train(model, loader, sampler, EPOCHS)

    if rank == 0:
        # One process, whole batches: global batch b holds the same samples as the ranks'
        # batches b together, and DDP averages their gradients, so the steps are equal.
        order = torch.arange(len(data)).reshape(-1, world_size).t().reshape(-1)
        single = make_model()
        x, y = data.tensors
        batches = [(x[idx], y[idx]) for idx in
                   order.reshape(world_size, -1, BATCH_PER_RANK).permute(1, 0, 2)
                   .reshape(-1, BATCH_PER_RANK * world_size)]
        train(single, batches, None, EPOCHS)
        difference = max((a - b).abs().max().item() for a, b in
                         zip(model.module.parameters(), single.parameters()))
        assert difference < 1e-5, f"DDP weights differ from one process by {difference}"
        print(f"DDP training on {world_size} ranks matches single-process training "
              f"(max |dw| = {difference:.1e}, last loss {loss:.4f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
