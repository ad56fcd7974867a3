"""Hugging Face Accelerate on CPUs under mpiexec, on torch's "mpi" backend served by hpccomm.

    mpiexec -n 2 python examples/frameworks/recipe_accelerate.py

``Accelerator(cpu=True)`` picks backend "mpi" when ``torch.distributed.is_mpi_available()``,
which ``import hpccomm.torch`` makes true: no MASTER_ADDR, no ``accelerate launch``.
``--backend gloo`` trains the same on torch's gloo for comparison (gloo needs
MASTER_ADDR and MASTER_PORT: start it with ``hpccomm run --torch``).
"""
import argparse

import torch
import hpccomm.torch  # torch.distributed.is_mpi_available() is now True
from accelerate import Accelerator
from accelerate.state import PartialState

from recipe_common import dataset, model as make_model, report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None, help="default: Accelerate's choice, mpi")
    parser.add_argument("--out", help="write each rank's final weights to OUT/rank<R>.json")
    args = parser.parse_args()
    if args.backend:
        PartialState(cpu=True, backend=args.backend)
    model, loss_fn = make_model(), torch.nn.functional.mse_loss
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=8)
    accelerator = Accelerator(cpu=True)  # chooses backend "mpi"
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(loss_fn(model(x), y))
        optimizer.step()
    predictions = torch.tensor([accelerator.process_index])
    gathered = accelerator.gather(predictions)
    assert gathered.tolist() == list(range(accelerator.num_processes)), gathered
    report(args.out, accelerator.process_index, accelerator.state.backend, model)
    accelerator.wait_for_everyone()  # every rank done before the group is torn down
    accelerator.end_training()


if __name__ == "__main__":
    main()
