"""PyTorch Lightning's Trainer on hpccomm, under mpiexec (or ``hpccomm run``).

    mpiexec -n 2 python examples/frameworks/recipe_lightning.py

trains a small regression model with DDP over MPI. ``--backend gloo`` trains the same on
torch's gloo for comparison. It imports ``pytorch_lightning``, which both
``pip install pytorch-lightning`` and ``pip install lightning`` (the ``frameworks``
extra) install; the file's name is no package's, so running it from this folder
shadows nothing.
"""
import argparse

import torch
import hpccomm.torch  # registers backend "hpccomm" with torch
import pytorch_lightning as pl
from pytorch_lightning.plugins.environments import MPIEnvironment
from pytorch_lightning.strategies import DDPStrategy

from recipe_common import dataset, model as make_model, report


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = make_model()

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
    quiet = dict(max_steps=4, logger=False, enable_checkpointing=False,
                 enable_progress_bar=False, enable_model_summary=False)
    environment = MPIEnvironment()  # rank, world size and rank 0's address from MPI
    trainer = pl.Trainer(accelerator="cpu", devices=environment.world_size(), num_nodes=1,
                         strategy=DDPStrategy(process_group_backend=args.backend,
                                              cluster_environment=environment), **quiet)
    model = Regression()
    train_loader = torch.utils.data.DataLoader(dataset(), batch_size=8)
    trainer.fit(model, train_loader)
    report(args.out, trainer.global_rank, torch.distributed.get_backend(), model)


if __name__ == "__main__":
    main()
