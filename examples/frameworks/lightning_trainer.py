"""PyTorch Lightning's Trainer on hpccomm, under mpiexec (or ``hpccomm run``).

    mpiexec -n 2 python examples/frameworks/lightning_trainer.py

trains a small regression model with DDP over MPI. ``--backend gloo`` trains the same on
torch's gloo for comparison.
"""
import argparse

import torch
import hpccomm.torch  # noqa: F401  registers backend "hpccomm" (and "mpi") with torch
import lightning as L
from lightning.pytorch.plugins.environments import MPIEnvironment
from lightning.pytorch.strategies import DDPStrategy

from common import dataset, model, report


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = model()

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="hpccomm", help="hpccomm, mpi or gloo")
    parser.add_argument("--out", help="write each rank's final weights to OUT/rank<R>.json")
    args = parser.parse_args()
    environment = MPIEnvironment()  # rank, size and rank 0's address from MPI
    trainer = L.Trainer(
        accelerator="cpu", devices=environment.world_size(), num_nodes=1, max_steps=4,
        strategy=DDPStrategy(process_group_backend=args.backend,
                             cluster_environment=environment),
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False)
    module = Regression()
    trainer.fit(module, torch.utils.data.DataLoader(dataset(), batch_size=8))
    report(args.out, trainer.global_rank, torch.distributed.get_backend(), module)


if __name__ == "__main__":
    main()
