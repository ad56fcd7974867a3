"""Data-parallel training of a small NumPy model, checked against full-batch training.

Each rank computes the gradient of a least-squares linear model on its shard of the
data; ``all_reduce(op=AVG)`` of the gradients gives exactly the full-batch gradient
(the shards are equal in size), so every step matches a single process training on all
the data. Rank 0 replays that single-process training and compares the weights.

Run: mpiexec -n 4 python examples/data_parallel.py
"""
import numpy as np

import hpccomm as dist

SAMPLES_PER_RANK, FEATURES, STEPS, LEARNING_RATE = 64, 8, 50, 0.1


def make_data(size: int):
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((SAMPLES_PER_RANK * size, FEATURES))
    true_w = rng.standard_normal(FEATURES)
    y = x @ true_w + 0.01 * rng.standard_normal(len(x))
    return x, y


def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of the mean squared error 0.5 * mean((x w - y)^2)."""
    return x.T @ (x @ w - y) / len(x)


def main() -> None:
    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    x, y = make_data(size)
    shard = slice(rank * SAMPLES_PER_RANK, (rank + 1) * SAMPLES_PER_RANK)
    w = np.zeros(FEATURES)
    dist.broadcast(w, src=0)  # same initial weights everywhere
    for _ in range(STEPS):
        grad = gradient(w, x[shard], y[shard])
        dist.all_reduce(grad, op=dist.ReduceOp.AVG)
        w -= LEARNING_RATE * grad
    if rank == 0:
        w_single = np.zeros(FEATURES)
        for _ in range(STEPS):
            w_single -= LEARNING_RATE * gradient(w_single, x, y)
        difference = np.abs(w - w_single).max()
        assert difference < 1e-12, f"data-parallel weights differ by {difference}"
        loss = 0.5 * np.mean((x @ w - y) ** 2)
        print(f"data-parallel training on {size} ranks matches full-batch training "
              f"(max |dw| = {difference:.1e}, loss {loss:.4f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
