"""DeviceMesh: torch's n-dimensional arrangement of ranks, on MPI Cartesian topologies.

A root mesh owns one MPI Cartesian communicator (``MPI_Cart_create``, ``reorder=False``,
so the user's rank order is kept), made when the mesh is made. A mesh dimension's group
is a ``MPI_Cart_sub`` of it, made the first time it is asked for and then kept, so a
mesh makes no communicator that is never used. The first ``get_group`` of a dimension
(or of a flattened dimension) is therefore *collective over the whole mesh*: every rank
of the mesh must ask for it, in the same order; call ``get_all_groups()`` right after
creating the mesh when later code asks for groups on some ranks only.

Meshes sliced (``mesh["dp"]``) or flattened (``mesh["dp", "cp"]._flatten()``) from a root
share its communicators. A mesh dimension is stored as the tuple of root dimensions it
spans (several once flattened), which is also the key of its group.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import rendezvous
from .errors import DistError, DistValueError
from .group import ProcessGroup, _mpi, from_communicator, new_group, registry, resolve

Axis = Tuple[int, ...]  # the root dimensions one mesh dimension spans, ascending
MeshDim = Union[int, str, None]


def _world(op: str) -> ProcessGroup:
    """The default group, initialized as torch does when the mesh is made first."""
    if registry.world is None:
        from .init import init_process_group

        init_process_group()
    return resolve(None, op)


def _check_device(device_type: Any, op: str) -> str:
    if not isinstance(device_type, str) or not device_type.isalpha():
        raise DistValueError(f"hpccomm.{op}: device_type must be a device type such as "
                             f"'cpu' or 'cuda' without an index, got {device_type!r}")
    return device_type


def _check_names(names: Any, ndim: int, op: str) -> Optional[Tuple[str, ...]]:
    if not names:
        return None
    names = tuple(names)
    if not all(isinstance(name, str) for name in names):
        raise DistValueError(f"hpccomm.{op}: mesh_dim_names must be strings, got {names}")
    if len(set(names)) != len(names):
        raise DistValueError(f"hpccomm.{op}: each mesh_dim_name must be unique, got {names}")
    if len(names) != ndim:
        raise DistValueError(f"hpccomm.{op}: {len(names)} mesh_dim_names {names} for a "
                             f"{ndim}-D mesh")
    return names


def _backend_name(spec: Any) -> Optional[str]:
    """The backend of an override entry: a name, ``(name, options)`` or options only."""
    if isinstance(spec, tuple):
        spec = spec[0] if spec else None
    return spec if isinstance(spec, str) or spec is None else None


class DeviceMesh:
    """An n-D array of global ranks with one process group per dimension, as torch's.

    ``mesh`` gives the ranks (any order; it is kept). Every rank of the world makes the
    mesh (it is collective over the world); ranks absent from ``mesh`` get a mesh whose
    ``get_coordinate()`` is ``None`` and whose groups raise a clear error.
    """

    def __init__(self, device_type: str, mesh: Any = None, *,
                 mesh_dim_names: Optional[Tuple[str, ...]] = None,
                 backend_override: Optional[Sequence[Any]] = None,
                 _init_backend: bool = True) -> None:
        op = "DeviceMesh"
        _check_device(device_type, op)
        if mesh is None:
            raise DistValueError(f"hpccomm.{op}: mesh (an array of global ranks) is required")
        world = _world(op)
        ranks = np.array(mesh.tolist() if hasattr(mesh, "tolist") else mesh)
        if ranks.ndim == 0 or ranks.size == 0 or ranks.dtype.kind not in "iu":
            raise world.error(op, f"mesh must be a non-empty array of integer global ranks, "
                                  f"got {mesh!r}")
        ranks = ranks.astype(np.int64)
        size = world.size()
        if ranks.size > size:
            raise world.error(op, f"mesh of shape {ranks.shape} has {ranks.size} ranks, more "
                                  f"than the world's {size}: a mesh is not bigger than the world")
        bad = [int(r) for r in ranks.flat if not 0 <= r < size]
        if bad:
            raise world.error(op, f"mesh ranks {bad} are not global ranks (world size {size})")
        if len(np.unique(ranks)) != ranks.size:
            raise world.error(op, f"mesh {ranks.tolist()} lists a rank more than once")
        names = _check_names(mesh_dim_names, ranks.ndim, op)
        overrides = tuple(backend_override or (None,) * ranks.ndim)
        if len(overrides) != ranks.ndim:
            raise world.error(op, f"backend_override has {len(overrides)} entries for a "
                                  f"{ranks.ndim}-D mesh")
        self._setup(device_type, (), names, None)
        self._root = self
        self._axes = tuple((d,) for d in range(ranks.ndim))
        self._ranks = ranks
        self._rank = world.rank()
        found = np.argwhere(ranks == self._rank)
        self._root_coord = tuple(int(c) for c in found[0]) if len(found) else None
        self._cart: Optional[ProcessGroup] = None
        self._cart_backend: Optional[str] = None
        self._groups: Dict[Axis, ProcessGroup] = {}
        self._backends: Dict[Axis, Optional[str]] = {
            (d,): _backend_name(spec) for d, spec in enumerate(overrides)}
        self._flatten_mapping: Dict[str, DeviceMesh] = {}
        self._key = (tuple(int(r) for r in ranks.flat), self._layout(), device_type, names)
        if device_type not in world.backend_names and not any(self._backends.values()):
            raise world.error(op, f"no backend for device type '{device_type}' (backends: "
                                  f"{world.backend_string()})")
        if _init_backend:
            self._cart = self._make_cart(world)

    def _setup(self, device_type: str, axes: Tuple[Axis, ...],
               names: Optional[Tuple[str, ...]], root: Optional["DeviceMesh"]) -> None:
        self._device_type = device_type
        self._mesh_dim_names = names
        if root is not None:
            self._root, self._axes = root, axes
            self._key = (root._key[0], self._layout(), device_type, names)

    @classmethod
    def _sub(cls, root: "DeviceMesh", axes: Tuple[Axis, ...],
             names: Optional[Tuple[str, ...]]) -> "DeviceMesh":
        """A mesh of some (possibly flattened) dimensions of ``root``, sharing its groups."""
        sub = cls.__new__(cls)
        sub._setup(root._device_type, axes, names, root)
        return sub

    def _make_cart(self, world: ProcessGroup) -> Optional[ProcessGroup]:
        """The root's Cartesian communicator as a group (collective over the world)."""
        mpi = _mpi()
        flat = self._ranks.ravel()
        shape = self._ranks.shape
        name = registry.unique_name(flat.tolist(), prefix="mesh")
        try:
            if np.array_equal(flat, np.arange(flat.size)):  # row-major prefix of the world
                cart = mpi.cart_create(world.comm, shape)
            else:  # user order: a Split puts the ranks in mesh order first
                member = self._root_coord is not None
                key = int(np.ravel_multi_index(self._root_coord, shape)) if member else 0
                ordered = mpi.split(world.comm, 0 if member else None, key)
                cart = mpi.cart_create(ordered, shape) if ordered is not None else None
                mpi.free(ordered)
        except Exception as exc:
            raise world.error("DeviceMesh", f"creating the Cartesian communicator of mesh "
                                            f"{self._ranks.tolist()} failed: {exc}") from exc
        if cart is None:
            return None
        self._cart_backend = self._backends.get(self._all_axis())  # None: world's
        return from_communicator(cart, name, backend=self._cart_backend, desc="mesh")

    # -- what the mesh is -----------------------------------------------------------------
    @property
    def device_type(self) -> str:
        """The device type of the mesh ("cpu", "cuda")."""
        return self._device_type

    @property
    def mesh_dim_names(self) -> Optional[Tuple[str, ...]]:
        return self._mesh_dim_names

    @property
    def ndim(self) -> int:
        return len(self._axes)

    @property
    def shape(self) -> Tuple[int, ...]:
        root_shape = self._root._ranks.shape
        return tuple(int(np.prod([root_shape[d] for d in axis])) for axis in self._axes)

    def size(self, mesh_dim: MeshDim = None) -> int:
        """The number of ranks in the mesh, or along dimension ``mesh_dim``."""
        if mesh_dim is None:
            return int(np.prod(self.shape))
        return self.shape[self._dim_index(mesh_dim, "size")]

    @property
    def mesh(self) -> np.ndarray:
        """The global ranks of this mesh; of a slice, the slice holding this rank."""
        full = self._full()
        if full.shape[0] == 1:
            return full[0]
        rows = np.argwhere(full.reshape(full.shape[0], -1) == self._root._rank)
        if len(rows):
            return full[rows[0, 0]]
        raise self._error("mesh", "this rank is not in the mesh, and a sliced mesh has one "
                                  "array of ranks per slice")

    def _full(self) -> np.ndarray:
        """Every slice of the root along the dimensions not kept: (slices, *shape)."""
        ranks = self._root._ranks
        kept = [d for axis in self._axes for d in axis]
        rest = [d for d in range(ranks.ndim) if d not in kept]
        moved = np.transpose(ranks, rest + kept)
        return moved.reshape((-1,) + self.shape)

    def _layout(self) -> Tuple[Tuple[Tuple[int, int], ...], ...]:
        """Per dimension, its (size, stride) pairs in the root's rank map, collapsed."""
        shape = self._root._ranks.shape
        strides = [int(np.prod(shape[d + 1:])) for d in range(len(shape))]
        layout = []
        for axis in self._axes:
            pairs: List[Tuple[int, int]] = []
            for d in axis:
                if pairs and pairs[-1][1] == shape[d] * strides[d]:
                    pairs[-1] = (pairs[-1][0] * shape[d], strides[d])
                else:
                    pairs.append((shape[d], strides[d]))
            layout.append(tuple(pairs))
        return tuple(layout)

    def _all_axis(self) -> Axis:
        return tuple(d for axis in self._axes for d in axis)

    def __repr__(self) -> str:
        names = self._mesh_dim_names or tuple(f"dim_{i}" for i in range(self.ndim))
        dims = ", ".join(f"{n}={s}" for n, s in zip(names, self.shape))
        full = self._full()
        shown = full[0] if full.shape[0] == 1 else full
        return f"DeviceMesh(({dims}), '{self._device_type}', ranks={shown.tolist()})"

    def __eq__(self, other: object) -> bool:
        """Same ranks, layout, device type and names, as torch compares meshes."""
        if self is other:
            return True
        return isinstance(other, DeviceMesh) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    # -- this rank --------------------------------------------------------------------------
    def get_rank(self) -> int:
        """This process's global rank."""
        return self._root._rank

    def get_coordinate(self) -> Optional[Tuple[int, ...]]:
        """This rank's index along every dimension, or ``None`` if it is not in the mesh."""
        coord = self._root._root_coord
        if coord is None:
            return None
        return tuple(self._index_on(axis, coord) for axis in self._axes)

    def _index_on(self, axis: Axis, coord: Tuple[int, ...]) -> int:
        """Row-major position of ``coord`` along ``axis`` (the rank in that dim's group)."""
        shape = self._root._ranks.shape
        index = 0
        for d in axis:
            index = index * shape[d] + coord[d]
        return index

    def get_local_rank(self, mesh_dim: MeshDim = None) -> int:
        """This rank's rank in the group of ``mesh_dim`` (no communication)."""
        axis, _ = self._axis(mesh_dim, "get_local_rank")
        root = self._root
        if root._root_coord is None:
            raise self._error("get_local_rank", "this rank is not in the mesh")
        given = root._groups.get(axis)
        if given is not None and root._cart is None:  # from_group: the group decides
            return given.rank()
        return self._index_on(axis, root._root_coord)

    # -- groups -------------------------------------------------------------------------------
    def get_group(self, mesh_dim: MeshDim = None) -> ProcessGroup:
        """The group of dimension ``mesh_dim`` (name or index; optional for a 1-D mesh).

        Made on first use by ``MPI_Cart_sub``, which every rank of the mesh must call:
        the first ``get_group`` of a dimension is collective over the mesh.
        """
        axis, label = self._axis(mesh_dim, "get_group")
        return self._root._group(axis, label)

    def get_all_groups(self) -> List[ProcessGroup]:
        """The groups of all dimensions, in order (makes those not made yet)."""
        return [self.get_group(i) for i in range(self.ndim)]

    def _as_process_group(self) -> ProcessGroup:
        """A 1-D mesh passed as ``group=`` means its only group."""
        if self.ndim != 1:
            raise self._error("group", f"a {self.ndim}-D mesh is not one group; pass "
                                       f"mesh.get_group(dim) for the dimension meant")
        return self.get_group()

    def _group(self, axis: Axis, label: str) -> ProcessGroup:
        """The group along ``axis`` of this root mesh, made once."""
        if self._root_coord is None:
            raise self._error("get_group", f"this rank is not in the mesh, so it has no "
                                           f"'{label}' group")
        found = self._groups.get(axis)
        if found is not None:
            if not found.live:
                raise self._error("get_group", f"the '{label}' group was destroyed")
            return found
        line = self._line(axis)
        backend = self._backends.get(axis)  # None: the world's backends
        cart = self._cart
        if cart is not None and axis == tuple(range(self._ranks.ndim)) and (
                backend == self._cart_backend):
            pg = cart  # the whole mesh: the Cartesian communicator itself
        elif cart is not None:
            if not cart.live:
                raise self._error("get_group", "the mesh's communicator was destroyed "
                                               "(destroy_process_group)")
            remain = [d in axis for d in range(self._ranks.ndim)]
            rendezvous.meet_all(cart, f"DeviceMesh.get_group('{label}')", None)
            try:
                comm = _mpi().cart_sub(cart.comm, remain)
            except Exception as exc:
                raise self._error("get_group", f"MPI_Cart_sub for '{label}' failed: "
                                               f"{exc}") from exc
            name = registry.unique_name(line, prefix=f"mesh_{label}")
            pg = from_communicator(comm, name, backend=backend, desc=f"mesh_{label}")
        else:  # a mesh from groups: only this line's members make its group
            pg = new_group(line, backend=backend, group_desc=f"mesh_{label}",
                           sort_ranks=False)
        if list(pg.ranks) != line:
            raise DistError(f"hpccomm.DeviceMesh.get_group on global rank {self._rank}: the "
                            f"'{label}' group has ranks {list(pg.ranks)}, expected {line}")
        self._groups[axis] = pg
        return pg

    def _line(self, axis: Axis) -> List[int]:
        """The global ranks sharing this rank's coordinates off ``axis``, in group order."""
        ranks, coord = self._ranks, self._root_coord
        index = tuple(slice(None) if d in axis else coord[d] for d in range(ranks.ndim))
        return [int(r) for r in ranks[index].ravel()]

    # -- choosing dimensions ----------------------------------------------------------------
    def _dim_index(self, mesh_dim: Union[int, str], op: str) -> int:
        if isinstance(mesh_dim, str):
            names = self._mesh_dim_names or ()
            if mesh_dim not in names:
                raise KeyError(f"hpccomm.DeviceMesh.{op}: mesh dimension '{mesh_dim}' does "
                               f"not exist; mesh_dim_names={self._mesh_dim_names}")
            return names.index(mesh_dim)
        if isinstance(mesh_dim, bool) or not isinstance(mesh_dim, int) or not (
                -self.ndim <= mesh_dim < self.ndim):
            raise self._error(op, f"mesh_dim {mesh_dim!r} is not a dimension of a "
                                  f"{self.ndim}-D mesh")
        return mesh_dim % self.ndim

    def _axis(self, mesh_dim: MeshDim, op: str) -> Tuple[Axis, str]:
        """The root axis and a label for ``mesh_dim`` (flattened names allowed)."""
        if mesh_dim is None:
            if self.ndim != 1:
                raise self._error(op, f"the mesh has {self.ndim} dimensions: give mesh_dim "
                                      f"(or use get_all_groups())")
            mesh_dim = 0
        flat = self._root._flatten_mapping.get(mesh_dim) if isinstance(mesh_dim, str) else None
        if flat is not None and mesh_dim not in (self._mesh_dim_names or ()):
            return flat._axes[0], mesh_dim
        index = self._dim_index(mesh_dim, op)
        label = self._mesh_dim_names[index] if self._mesh_dim_names else f"dim_{index}"
        return self._axes[index], label

    def __getitem__(self, mesh_dim_names: Union[str, Tuple[str, ...]]) -> "DeviceMesh":
        """The submesh of the named dimensions (in the mesh's order), sharing its groups."""
        if not self._mesh_dim_names:
            raise self._error("__getitem__", "cannot slice a DeviceMesh without "
                                             "mesh_dim_names")
        names = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else tuple(mesh_dim_names)
        if names == self._mesh_dim_names:
            return self
        root = self._root
        flattened = root._flatten_mapping if self is root else {}
        axes = []
        for name in names:
            if name in self._mesh_dim_names:
                axes.append(self._axes[self._mesh_dim_names.index(name)])
            elif name in flattened:
                axes.append(flattened[name]._axes[0])
            else:
                raise KeyError(f"hpccomm.DeviceMesh: invalid mesh_dim_names {names}; valid "
                               f"names are {list(self._mesh_dim_names) + list(flattened)}")
        spanned = [d for axis in axes for d in axis]
        if any(a >= b for a, b in zip(spanned, spanned[1:])):
            raise KeyError(f"hpccomm.DeviceMesh: invalid mesh_dim_names {names}: dimensions "
                           f"must be named in the mesh's order {self._mesh_dim_names}, "
                           f"without overlap")
        if len(names) == 1 and names[0] in flattened:
            return flattened[names[0]]
        return DeviceMesh._sub(root, tuple(axes), names)

    def _flatten(self, mesh_dim_name: Optional[str] = None,
                 backend_override: Any = None) -> "DeviceMesh":
        """A 1-D mesh of all this mesh's dimensions, named ``mesh_dim_name``.

        Default name: the dimension names joined by ``_``. The root mesh can then be
        sliced by that name. The flattened group is made on first ``get_group``.
        """
        if not self._mesh_dim_names:
            raise self._error("_flatten", "cannot flatten a DeviceMesh without "
                                          "mesh_dim_names")
        name = mesh_dim_name or "_".join(self._mesh_dim_names)
        if self.ndim == 1 and name in self._mesh_dim_names:
            return self
        root = self._root
        if name in (root._mesh_dim_names or ()):
            raise DistValueError(f"hpccomm.DeviceMesh._flatten: '{name}' already names a "
                                 f"dimension of the root mesh {root._mesh_dim_names}")
        axis = self._all_axis()
        existing = root._flatten_mapping.get(name)
        if existing is not None:
            if existing._axes == (axis,):
                return existing
            raise DistValueError(f"hpccomm.DeviceMesh._flatten: '{name}' already names "
                                 f"another flattened dimension; choose another name")
        override = _backend_name(backend_override)
        if override is not None:
            root._backends[axis] = override
        flat = DeviceMesh._sub(root, (axis,), (name,))
        root._flatten_mapping[name] = flat
        return flat

    flatten = _flatten

    def _get_root_mesh(self) -> "DeviceMesh":
        return self._root

    def _error(self, op: str, message: str) -> DistValueError:
        return DistValueError(f"hpccomm.DeviceMesh.{op} on global rank {self._root._rank} "
                              f"(mesh {self._root._ranks.tolist()}, dims "
                              f"{self._mesh_dim_names or self.shape}): {message}")

    # -- from existing groups -------------------------------------------------------------
    @staticmethod
    def from_group(group: Union[Any, List[Any]], device_type: str, mesh: Any = None, *,
                   mesh_dim_names: Optional[Tuple[str, ...]] = None) -> "DeviceMesh":
        """A mesh whose dimension groups are existing groups (one per dimension).

        One group: a 1-D mesh of its ranks. Several: ``mesh`` and ``mesh_dim_names`` are
        required and group ``i`` must be this rank's line along dimension ``i``.
        No communicator is made.
        """
        op = "DeviceMesh.from_group"
        if not isinstance(group, (list, tuple)):
            pg = resolve(group, op)
            ranks = list(pg.ranks)
            if mesh is not None and np.asarray(mesh).tolist() != ranks:
                raise pg.error(op, f"mesh {np.asarray(mesh).tolist()} differs from the "
                                   f"group's ranks {ranks}")
            groups, mesh = [pg], ranks
        else:
            groups = [resolve(g, op) for g in group]
            if not groups:
                raise DistValueError(f"hpccomm.{op}: expects at least one group")
            if mesh is None or not mesh_dim_names:
                raise DistValueError(f"hpccomm.{op}: mesh and mesh_dim_names are required "
                                     f"with several groups")
            if np.asarray(mesh).ndim != len(groups):
                raise DistValueError(f"hpccomm.{op}: mesh {np.asarray(mesh).tolist()} has "
                                     f"{np.asarray(mesh).ndim} dimensions for {len(groups)} "
                                     f"groups")
        made = DeviceMesh(device_type, mesh, mesh_dim_names=mesh_dim_names,
                          _init_backend=False)
        for d, pg in enumerate(groups):
            if made._root_coord is not None:
                line = made._line((d,))
                if list(pg.ranks) != line:
                    raise made._error("from_group", f"group {d} has ranks {list(pg.ranks)} "
                                                    f"but this rank's line along dimension "
                                                    f"{d} is {line}")
            made._groups[(d,)] = pg
        return made


def init_device_mesh(device_type: str, mesh_shape: Tuple[int, ...], *,
                     mesh_dim_names: Optional[Tuple[str, ...]] = None,
                     backend_override: Optional[Dict[Union[int, str], Any]] = None
                     ) -> DeviceMesh:
    """A mesh of ``mesh_shape`` over the whole world, ranks in row-major order.

    Collective over the world (one ``MPI_Cart_create``); dimension groups are made on
    first use. ``backend_override`` maps a dimension (index or name) to a backend.
    """
    op = "init_device_mesh"
    _check_device(device_type, op)
    shape = tuple(mesh_shape) if isinstance(mesh_shape, (tuple, list)) else (mesh_shape,)
    if not shape or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                            for s in shape):
        raise DistValueError(f"hpccomm.{op}: mesh_shape must be positive ints, got {mesh_shape!r}")
    names = _check_names(mesh_dim_names, len(shape), op)
    world = _world(op)
    total = int(np.prod(shape))
    if total != world.size():
        raise world.error(op, f"mesh_shape {shape} holds {total} ranks but the world has "
                              f"{world.size()} processes; their product must equal the world "
                              f"size (for a subset, use DeviceMesh(device_type, ranks))")
    overrides: List[Any] = [None] * len(shape)
    for key, spec in (backend_override or {}).items():
        index = (names.index(key) if names and key in names else key)
        if not isinstance(index, int) or not 0 <= index < len(shape):
            raise world.error(op, f"backend_override key {key!r} is not a dimension of "
                                  f"{names or shape}")
        overrides[index] = spec
    return DeviceMesh(device_type, np.arange(total).reshape(shape), mesh_dim_names=names,
                      backend_override=tuple(overrides))
