"""Where a communicator's ranks run: one answer for every decision that depends on it.

:func:`placement` says, for a communicator, which of its ranks share this rank's node,
how many nodes it spans, how many CPUs the node's ranks may run on together (the union
of their affinity masks) and whether the launcher bound them to CPUs. The poll loop's
yielding (``init_process_group``) and the shared-memory path's thresholds both read it,
so that they cannot disagree: ranks bound one per core (``srun --cpu-bind=cores``,
``mpiexec -bind-to core``) each see one CPU in their own mask, yet the node's ranks
together have one CPU each, and the node is not crowded.

``HPCCOMM_NODES=k`` is a testing aid: hpccomm then treats the job's ranks as ``k``
nodes of consecutive world ranks for its own decisions (shared memory, local ranks),
whatever MPI says; it simulates a multi-node job on one machine under any MPI library.
(MPICH can simulate nodes inside MPI itself: ``MPIR_CVAR_NUM_CLIQUES=k
MPIR_CVAR_CLIQUES_BY_BLOCK=1``.) ``HPCCOMM_OVERSUBSCRIBED=1``/``0`` overrides the
crowded test.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Optional, Tuple

from mpi4py import MPI

from ... import settings


def simulated_nodes() -> int:
    """The node count ``HPCCOMM_NODES`` asks for, or 0 (read at each call)."""
    return settings.NODES.get()


def forced_crowding() -> Optional[bool]:
    """What ``HPCCOMM_OVERSUBSCRIBED`` says, or ``None`` to measure."""
    return settings.OVERSUBSCRIBED.get()


def node_comm(comm: Any) -> Any:
    """The communicator of ``comm``'s ranks on this rank's node, in ``comm``'s order;
    collective over ``comm``. Honours ``HPCCOMM_NODES``."""
    nodes = simulated_nodes()
    if nodes > 0:
        world = MPI.COMM_WORLD
        color = world.Get_rank() * min(nodes, world.Get_size()) // world.Get_size()
        return comm.Split(color, comm.Get_rank())
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


def _affinity() -> Tuple[int, ...]:
    getaffinity = getattr(os, "sched_getaffinity", None)
    return tuple(sorted(getaffinity(0))) if getaffinity else tuple(range(os.cpu_count() or 1))


class Placement:
    """The answer of :func:`placement` for one communicator and this rank."""

    __slots__ = ("local_rank", "local_size", "nodes", "host_ranks", "cpus", "bound")

    def __init__(self, local_rank: int, local_size: int, nodes: int, host_ranks: int,
                 cpus: int, bound: bool):
        #: This rank's index among the communicator's ranks on its node, and their number
        #: (nodes as MPI sees them, or as ``HPCCOMM_NODES`` simulates them).
        self.local_rank, self.local_size = local_rank, local_size
        #: Nodes the communicator spans.
        self.nodes = nodes
        #: The communicator's ranks on this machine (its host name), which share its CPUs
        #: even where nodes are simulated.
        self.host_ranks = host_ranks
        #: CPUs those ranks may run on together (the union of their affinity masks).
        self.cpus = cpus
        #: Whether the launcher bound them (each mask smaller than the union).
        self.bound = bound

    @property
    def crowded(self) -> bool:
        """Whether this machine runs more of these ranks than they have CPUs together
        (``HPCCOMM_OVERSUBSCRIBED`` decides instead when set)."""
        forced = forced_crowding()
        return forced if forced is not None else self.host_ranks > self.cpus

    def describe(self) -> str:
        """``"2 ranks on 2 CPUs of this host, bound; 1 node"``, for logs and reports."""
        text = (f"{self.host_ranks} rank{'s' if self.host_ranks != 1 else ''} on "
                f"{self.cpus} CPUs of this host, {'bound' if self.bound else 'unbound'}; "
                f"{self.nodes} node{'s' if self.nodes != 1 else ''}")
        nodes = simulated_nodes()
        if nodes:
            text += f" ({settings.NODES.name}={nodes}: {self.local_size} ranks per node)"
        forced = forced_crowding()
        if forced is not None:
            text += f", {settings.OVERSUBSCRIBED.name}={int(forced)}"
        return text

    def __repr__(self) -> str:
        return f"<Placement {self.describe()}>"


def placement(comm: Any) -> Placement:
    """Where ``comm``'s ranks run, seen from this rank; collective over ``comm``."""
    node = node_comm(comm)
    try:
        local_rank, local_size = node.Get_rank(), node.Get_size()
        leads = 1 if local_rank == 0 else 0
        host = socket.gethostname()
        facts = comm.allgather((host, leads, _affinity()))
    finally:
        node.Free()
    masks = [set(mask) for name, _, mask in facts if name == host]
    union = set().union(*masks)
    if len(masks) > 1:
        bound = all(len(mask) < len(union) for mask in masks)
    else:
        bound = len(union) < (os.cpu_count() or 1)
    return Placement(local_rank, local_size, sum(lead for _, lead, _ in facts), len(masks),
                     len(union), bound)


#: The default group's placement, found by ``init_process_group``: what the shared-memory
#: path asks whether the machine is crowded (every rank of a job has the same answer).
world: Optional[Placement] = None


def crowded(comm: Any) -> bool:
    """Whether this machine is crowded: the default group's answer, or ``comm``'s own
    (collective over it) before any default group was made."""
    return (world if world is not None else placement(comm)).crowded
