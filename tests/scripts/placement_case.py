"""What hpccomm decided about where the ranks run, one JSON line per rank, for
tests/test_placement.py: ``mpiexec [binding] -n N python this.py``."""
import json
import os

import hpccomm as dist
from hpccomm import init, work
from hpccomm.backends.mpi import placement
from hpccomm.backends.shm import communicator as shm

dist.init_process_group()
where = placement.world
cpu = dist.group.WORLD.cpu
fields = {"rank": dist.get_rank(), "mask": sorted(os.sched_getaffinity(0)),
          "nodes": where.nodes, "local_size": where.local_size,
          "host_ranks": where.host_ranks, "cpus": where.cpus, "bound": where.bound,
          "crowded": where.crowded, "polls": work._polls_per_check,
          "shared_memory": isinstance(cpu, shm.SharedMemoryCommunicator),
          "min_reduce": getattr(cpu, "min_reduce", None),
          "local": list(init.local_rank_and_size())}
os.write(1, (json.dumps(fields) + "\n").encode())
dist.destroy_process_group()
