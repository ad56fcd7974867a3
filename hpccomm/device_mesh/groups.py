"""The process groups of a root DeviceMesh: one per dimension layout, made on first use.

A root mesh owns one :class:`MeshGroups`. The first group it needs creates the mesh's
MPI Cartesian communicator (``MPI_Cart_create``, ``reorder=False``, so rank *i* of it is
the mesh's *i*-th rank in row-major order), among the mesh's ranks only. A dimension made
of whole root dimensions is an ``MPI_Cart_sub`` of it; any other layout (an unflattened
dimension, say) an ``MPI_Comm_split`` of it, one color per group. A dimension spanning
the whole world in rank order is the default group itself, as in torch. Every creation
is preceded by a meeting under the group timeout, so a missing rank is a
``DistTimeoutError``, never a hang. Groups are cached by (layout, backend).

Device communicators follow the same tree where their backend can split (NCCL): the
Cartesian group's is split from the default group's when the mesh holds every rank of
the world (in any order: the split keeps the mesh's), each dimension's from the
Cartesian group's, so a mesh whose parent already
has its NCCL communicator makes no new NCCL bootstrap
(:meth:`~hpccomm.group.ProcessGroup.split_devices`).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import layout as layouts
from .. import rendezvous
from .layout import Layout
from ..errors import DistError, DistValueError
from ..group import ProcessGroup, from_communicator, mpi_backend, registry, resolve
from ..types import NON_GROUP_MEMBER

#: A dimension's backend choice: (backend name or None, group timeout in seconds or None).
BackendSpec = Tuple[Optional[str], Optional[float]]
DEFAULT: BackendSpec = (None, None)


class MeshGroups:
    """The groups of one root mesh of ``rank_map`` (flat, row-major) and ``shape``.

    ``position`` is this rank's index in ``rank_map`` (None: not in the mesh);
    ``describe`` names the mesh in error messages.
    """

    def __init__(self, rank_map: np.ndarray, shape: Sequence[int], position: Optional[int],
                 describe: Callable[[], str]) -> None:
        self.rank_map = rank_map
        self.shape = tuple(shape)
        self.position = position
        self.describe = describe
        self.made: Dict[Tuple[Layout, BackendSpec], ProcessGroup] = {}
        self.cart: Optional[ProcessGroup] = None

    def __getstate__(self) -> Dict[str, Any]:
        """Pickled by group names; unpickling finds the live groups of those names."""
        state = self.__dict__.copy()
        state["made"] = {key: pg.group_name for key, pg in self.made.items()}
        state["cart"] = self.cart.group_name if self.cart is not None else None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.made = {key: pg for key, name in state["made"].items()
                     if (pg := _live_group(name)) is not None}
        self.cart = _live_group(state["cart"]) if state["cart"] else None

    def line(self, dim: Layout) -> List[int]:
        """The positions of this rank's group along ``dim``, in group order."""
        return layouts.line_of(dim, self.rank_map.size, self.position)

    def give(self, dim: Layout, pg: ProcessGroup) -> None:
        """Use an existing group for ``dim`` (``DeviceMesh.from_group``)."""
        self.made[(dim, DEFAULT)] = pg

    def local_rank(self, dim: Layout, spec: BackendSpec) -> int:
        """This rank's rank in the group along ``dim``, without making it (-1: outside)."""
        if self.position is None:
            return -1
        made = self.made.get((dim, spec))
        return made.rank() if made is not None else self.line(dim).index(self.position)

    def get(self, dim: Layout, spec: BackendSpec, label: str, root_dims: Layout) -> Any:
        """The group along ``dim``, made once (collective over the mesh's ranks).

        ``root_dims`` is all root dimensions as one layout: that group is the Cartesian
        communicator itself.
        """
        if self.position is None:
            return NON_GROUP_MEMBER
        found = self.made.get((dim, spec))
        if found is not None:
            if not found.live:
                raise self._error(f"the '{label}' group was destroyed (destroy_process_group)")
            return found
        positions = self.line(dim)
        line = [int(self.rank_map[p]) for p in positions]
        world = resolve(None, "DeviceMesh.get_group")
        if spec == DEFAULT and line == list(range(world.size())):
            pg = world  # torch reuses the default group for a dimension spanning the world
        elif spec == DEFAULT and dim == root_dims:
            pg = self._cartesian()
        else:
            pg = self._new_group(dim, spec, label, positions, line)
        self.made[(dim, spec)] = pg
        return pg

    def _new_group(self, dim: Layout, spec: BackendSpec, label: str,
                   positions: List[int], line: List[int]) -> ProcessGroup:
        """``MPI_Cart_sub`` (or ``MPI_Comm_split``) of the Cartesian communicator."""
        cart = self._cartesian()
        what = f"DeviceMesh.get_group('{label}')"
        # the same words on every rank of the mesh (each makes the group of its own line)
        rendezvous.meet_all(cart, what, None, f"{what} of a mesh of shape {self.shape}")
        kept = layouts.cartesian_dims(dim, self.shape)
        try:
            if kept is not None:
                keep = [d in kept for d in range(len(self.shape))]
                comm = mpi_backend().cart_sub(cart.comm, keep)
            else:  # e.g. an unflattened dimension: one color per group, keyed by position
                lines = layouts.lines(dim, self.rank_map.size)
                color = next(i for i, each in enumerate(lines) if self.position in each)
                comm = mpi_backend().split(cart.comm, color, positions.index(self.position))
        except Exception as exc:
            raise self._error(f"creating the '{label}' group of ranks {line} failed: "
                              f"{exc}") from exc
        name = registry.unique_name(line, prefix=f"mesh_{label}")  # once made
        pg = from_communicator(comm, name, timeout=spec[1], backend=spec[0],
                               desc=f"mesh_{label}")
        if list(pg.ranks) != line:
            raise DistError(f"hpccomm.{what} on {self.describe()}: the group has ranks "
                            f"{list(pg.ranks)}, expected {line}")
        cart.split_devices(pg, pg.backend_names, pg.timeout, what)
        return pg

    def _cartesian(self) -> ProcessGroup:
        """The Cartesian communicator, made once among the mesh's ranks only."""
        if self.cart is not None:
            if not self.cart.live:
                raise self._error("the mesh's communicator was destroyed "
                                  "(destroy_process_group)")
            return self.cart
        world = resolve(None, "DeviceMesh.get_group")
        members = [int(r) for r in self.rank_map]
        mpi = mpi_backend()
        what = "DeviceMesh.get_group (Cartesian communicator)"
        call = (f"DeviceMesh of shape {self.shape} over global ranks {members}, "
                f"making group '{registry.next_name(members, prefix='mesh')}'")
        try:
            if members == list(range(world.size())):
                rendezvous.meet_all(world, what, None, call)
                comm = mpi.cart_create(world.comm, self.shape)
            else:  # a subset or another order: the members alone, in mesh order
                rendezvous.meet_members(world, members, what, None, call)
                tag = (hash(tuple(members)) & 0x3FFF) + 1
                ordered = mpi.create_subcomm(world.comm, members, tag)
                try:
                    comm = mpi.cart_create(ordered, self.shape)
                finally:
                    mpi.free(ordered)
        except DistError:
            raise
        except Exception as exc:
            raise self._error(f"creating the Cartesian communicator of the mesh failed: "
                              f"{exc}") from exc
        self.cart = from_communicator(comm, registry.unique_name(members, prefix="mesh"),
                                      desc="mesh")
        if sorted(members) == list(range(world.size())):  # every rank of the world is here
            world.split_devices(self.cart, self.cart.backend_names, self.cart.timeout, what)
        return self.cart

    def _error(self, message: str) -> DistValueError:
        return DistValueError(f"hpccomm.DeviceMesh.get_group on {self.describe()}: {message}")


def _live_group(name: str) -> Optional[ProcessGroup]:
    """The live group registered under ``name`` in this process, if any."""
    found = registry.groups.get(name)
    return found if found is not None and found.live else None
