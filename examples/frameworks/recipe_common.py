"""What the framework examples share: the model, the data, and the report of the result
(each rank's final weights, written to ``--out DIR`` for the tests to compare)."""
import json
import os

import torch


def model():
    """A small regression network, initialized the same on every rank."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def dataset(rows=64):
    """Inputs and their row sums, the same on every rank (samplers split it)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 8, generator=gen)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def report(out, rank, backend, module):
    """Print a one-line summary; with ``out``, write the weights to OUT/rank<R>.json."""
    weights = torch.cat([p.detach().flatten() for p in module.parameters()])
    print(f"rank {rank}: trained on backend {backend}, sum of weights "
          f"{weights.sum().item():.6f}", flush=True)
    if out:
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"backend": str(backend), "weights": weights.tolist()}, f)
