"""Lightning Fabric on hpccomm: DDP training and Fabric's own collectives over MPI.

    mpiexec -n 2 python examples/frameworks/recipe_fabric.py

``--backend gloo`` trains the same on torch's gloo for comparison. It imports
``lightning_fabric``, which both ``pip install pytorch-lightning`` and
``pip install lightning`` install.
"""
import argparse

import torch
import hpccomm.torch  # noqa: F401  registers backend "hpccomm" (and "mpi") with torch
from lightning_fabric import Fabric
from lightning_fabric.plugins.environments import MPIEnvironment
from lightning_fabric.strategies import DDPStrategy

from recipe_common import dataset, model, report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="hpccomm", help="hpccomm, mpi or gloo")
    parser.add_argument("--out", help="write each rank's final weights to OUT/rank<R>.json")
    args = parser.parse_args()
    environment = MPIEnvironment()
    fabric = Fabric(accelerator="cpu", devices=environment.world_size(), num_nodes=1,
                    strategy=DDPStrategy(process_group_backend=args.backend,
                                         cluster_environment=environment))
    fabric.launch()
    net = model()
    net, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    data = fabric.setup_dataloaders(torch.utils.data.DataLoader(dataset(), batch_size=8))
    for x, y in data:
        optimizer.zero_grad()
        fabric.backward(torch.nn.functional.mse_loss(net(x), y))
        optimizer.step()
    total = fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum")
    ranks = fabric.all_gather(torch.tensor(fabric.global_rank))
    assert total.item() == sum(range(1, fabric.world_size + 1)), total
    assert ranks.tolist() == list(range(fabric.world_size)), ranks
    report(args.out, fabric.global_rank, torch.distributed.get_backend(), net)


if __name__ == "__main__":
    main()
