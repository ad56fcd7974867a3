"""reduce_scatter then all_gather: the round trip gives back the all-reduced array.

This is the pattern of sharded optimizers (ZeRO/FSDP): reduce-scatter the gradients so
each rank owns one summed shard, update the shard, all-gather the parameters. Without
an update the round trip must equal ``all_reduce``. The all-gather runs in place: each
rank's input is its own block of the output.

Run: mpiexec -n 4 python examples/shard_roundtrip.py
"""
import numpy as np

import hpccomm as dist


def main() -> None:
    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    full = np.random.default_rng(rank).standard_normal(size * 1024).astype(np.float32)
    expected = full.copy()
    dist.all_reduce(expected)

    shard = np.empty(full.size // size, dtype=full.dtype)
    dist.reduce_scatter_single(shard, full)
    gathered = np.empty_like(full)
    mine = gathered[rank * shard.size:(rank + 1) * shard.size]
    mine[:] = shard
    dist.all_gather_single(gathered, mine)  # in place: no extra copy

    assert np.allclose(gathered, expected, rtol=1e-5, atol=1e-5), "round trip differs"
    if rank == 0:
        print(f"reduce_scatter + all_gather over {size} ranks equals all_reduce "
              f"({full.size} float32 values)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
