"""DeepSpeed on CPUs under mpiexec, on torch's "mpi" backend served by hpccomm.

    mpiexec -n 2 python examples/frameworks/recipe_deepspeed.py

``--backend gloo`` trains the same on torch's gloo for comparison (start that one with
``hpccomm run --torch``, which sets MASTER_ADDR and MASTER_PORT). The first run on a
machine compiles DeepSpeed's CPU communication op (about a minute).
"""
import argparse

import torch
import hpccomm.torch  # serves torch's backend name "mpi"
import deepspeed

from recipe_common import dataset as make_dataset, model as make_model, report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="mpi", help="mpi, hpccomm or gloo")
    parser.add_argument("--out", help="write each rank's final weights to OUT/rank<R>.json")
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend=args.backend)
    size = torch.distributed.get_world_size()
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
              "train_batch_size": 8 * size, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    model, dataset = make_model(), make_dataset()
    engine, optimizer, loader, _ = deepspeed.initialize(model=model,
                                                        model_parameters=model.parameters(),
                                                        training_data=dataset, config=config)
    for x, y in loader:
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
    report(args.out, torch.distributed.get_rank(), torch.distributed.get_backend(), model)


if __name__ == "__main__":
    main()
