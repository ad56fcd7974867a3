"""Hugging Face Accelerate on CPUs under mpiexec, on torch's "mpi" backend served by hpccomm.

    mpiexec -n 2 python examples/frameworks/accelerate_cpu.py

``Accelerator(cpu=True)`` picks backend "mpi" when ``torch.distributed.is_mpi_available()``,
which ``import hpccomm.torch`` makes true: no MASTER_ADDR, no ``accelerate launch``.
``--backend gloo`` trains the same on torch's gloo for comparison (gloo needs
MASTER_ADDR and MASTER_PORT: start it with ``hpccomm run --torch``).
"""
import argparse

import torch
import hpccomm.torch  # noqa: F401  torch.distributed.is_mpi_available() is now True
from accelerate import Accelerator, PartialState

from common import dataset, model, report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None, help="default: Accelerate's choice, mpi")
    parser.add_argument("--out", help="write each rank's final weights to OUT/rank<R>.json")
    args = parser.parse_args()
    if args.backend:
        PartialState(cpu=True, backend=args.backend)
    accelerator = Accelerator(cpu=True)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(dataset(), batch_size=8)
    net, optimizer, data = accelerator.prepare(net, optimizer, data)
    for x, y in data:
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(net(x), y))
        optimizer.step()
    seen = accelerator.gather(torch.tensor([accelerator.process_index]))
    assert seen.tolist() == list(range(accelerator.num_processes)), seen
    report(args.out, accelerator.process_index, accelerator.state.backend, net)
    accelerator.wait_for_everyone()  # every rank done before the group is torn down
    accelerator.end_training()


if __name__ == "__main__":
    main()
