"""``DeviceMesh`` and ``init_device_mesh``: the mesh itself, its dimensions and groups.

The layouts it keeps per dimension are :mod:`.layout`'s; the groups it makes on first
use are :mod:`.groups`'. What follows for users is the package's docstring.
"""
from __future__ import annotations

import math
import threading
import warnings
from itertools import zip_longest
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import layout as layouts
from .. import settings
from .groups import DEFAULT as _DEFAULT
from .groups import BackendSpec, MeshGroups
from .layout import Layout
from ..errors import DistError, DistValueError
from ..group import ProcessGroup, backend_map, registry, resolve

__all__ = ["init_device_mesh", "DeviceMesh", "mesh_resources"]

MeshDim = Union[int, str, None]


class _MeshKeyError(DistError, KeyError):
    """A ``KeyError``, as torch raises for unknown dimension names, with a plain message."""

    __str__ = Exception.__str__


class _MeshIndexError(DistError, IndexError):
    """A dimension index out of range (torch: ``IndexError``)."""


class _MeshTypeError(DistError, TypeError):
    """A missing or wrongly typed argument (torch: ``TypeError``)."""


def _world(op: str) -> ProcessGroup:
    """The default group, initialized as torch does when a mesh is made first."""
    if registry.world is None:
        from ..init import init_process_group

        init_process_group()
    return resolve(None, op)


def _rank_array(mesh: Any, op: str) -> np.ndarray:
    """The mesh argument (list, NumPy/CuPy array, torch tensor) as an int64 array."""
    ranks = np.array(mesh.tolist() if hasattr(mesh, "tolist") else mesh)
    if ranks.dtype.kind == "f" and ranks.size and np.all(ranks == np.round(ranks)):
        ranks = ranks.astype(np.int64)  # torch converts with dtype=int too
    if ranks.ndim == 0 or ranks.size == 0 or ranks.dtype.kind not in "iu":
        raise DistValueError(f"hpccomm.{op}: mesh must be a non-empty n-D array of integer "
                             f"global ranks, got {mesh!r}")
    return ranks.astype(np.int64)


def _backend_spec(value: Any, op: str) -> BackendSpec:
    """An override entry (name, options, ``(name, options)`` or None) as a BackendSpec.

    Options objects are torch's ``Backend.Options``: their ``_timeout`` (or ``timeout``)
    becomes the group's timeout, as torch passes it on; the rest does not apply to MPI.
    """
    if value is None:
        return _DEFAULT
    name, options = (value if isinstance(value, tuple) else
                     (value, None) if isinstance(value, str) else (None, value))
    if name is not None:
        backend_map(name, op)  # an unknown backend fails now, not at first use
    timeout = getattr(options, "_timeout", getattr(options, "timeout", None))
    if timeout is not None and hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    return (name, timeout)


def _normalize_backend_override(overrides: Dict[Any, Any], ndim: int,
                                names: Optional[Tuple[str, ...]], op: str
                                ) -> Tuple[Any, ...]:
    """One override entry per dimension (None: default), from a dict keyed as torch's:
    dimension indices or names, never both for one dimension."""
    left = dict(overrides)
    specs: List[Any] = []
    for index, name in zip_longest(range(ndim), names or ()):
        if name is not None and name in left:
            if index in left:
                raise DistValueError(f"hpccomm.{op}: Found redundant dim index {index} and "
                                     f"name {name} in backend_override")
            specs.append(left.pop(name))
        elif index in left:
            specs.append(left.pop(index))
        else:
            specs.append(None)
    if left:
        raise DistValueError(f"hpccomm.{op}: Found invalid keys in backend_override: got "
                             f"{list(left)}, expected integers in range [0, {ndim}) or one "
                             f"of {names or ()}")
    return tuple(specs)


class _MeshEnv(threading.local):
    """torch's ``_mesh_resources``: the stack of meshes entered with ``with mesh:``."""

    def __init__(self) -> None:
        self.mesh_stack: List["DeviceMesh"] = []

    def get_current_mesh(self) -> "DeviceMesh":
        if not self.mesh_stack:
            raise DistError("hpccomm.DeviceMesh: No device mesh is currently active! "
                            "(enter one with `with mesh:`)")
        return self.mesh_stack[-1]

    def get_root_mesh(self, device_mesh: "DeviceMesh") -> "DeviceMesh":
        warnings.warn("This get_root_mesh API will be deprecated soon. Please use "
                      "`_get_root_mesh` inside DeviceMesh instead.", stacklevel=2)
        return device_mesh._get_root_mesh() if device_mesh else device_mesh

    def _get_all_submeshes(self, device_mesh: "DeviceMesh",
                           mesh_dim_name: str) -> List["DeviceMesh"]:
        warnings.warn("This _get_all_submeshes API will be deprecated soon. Please use "
                      "`_get_all_submeshes` inside DeviceMesh instead.", stacklevel=2)
        return device_mesh._get_all_submeshes(mesh_dim_name)


#: torch's ``_mesh_resources`` (the package exports it under that name).
mesh_resources = _MeshEnv()


class DeviceMesh:
    """An n-D array of global ranks with one process group per dimension, as torch's.

    ``mesh`` gives the ranks (any order; it is kept; a subset of the world is allowed).
    Making a mesh communicates nothing; groups are made on first use (see the module
    docstring). On a rank outside the mesh ``get_coordinate()`` is ``None`` and its
    groups are ``GroupMember.NON_GROUP_MEMBER``.
    """

    def __init__(self, device_type: str, mesh: Any = None, *,
                 mesh_dim_names: Optional[Tuple[str, ...]] = None,
                 backend_override: Optional[Sequence[Any]] = None,
                 _init_backend: bool = True, _rank: Optional[int] = None,
                 _layout: Optional[Sequence[Layout]] = None, _rank_map: Any = None,
                 _root_mesh: Optional["DeviceMesh"] = None) -> None:
        op = "DeviceMesh"
        if mesh is not None:
            if _layout is not None or _rank_map is not None:
                raise _MeshTypeError(f"hpccomm.{op}: Cannot provide _layout and/or _rank_map "
                                     f"if passing explicit mesh")
            ranks = _rank_array(mesh, op)
            dims = layouts.row_major(ranks.shape)
            rank_map = ranks.ravel()
        else:
            if _layout is None or _rank_map is None:
                raise _MeshTypeError(f"hpccomm.{op}: The mesh argument is required except "
                                     f"for PRIVATE USAGE ONLY! (pass the array of global "
                                     f"ranks as mesh=)")
            dims = tuple(layouts.coalesce(dim) for dim in _layout)
            rank_map = np.asarray(_rank_map, dtype=np.int64).ravel()
        if not layouts.is_orthogonal(layouts.concat(dims)) or (
                layouts.cosize(layouts.concat(dims)) > rank_map.size):
            raise DistValueError(f"hpccomm.{op}: the dimensions {dims} overlap or reach past "
                                 f"the {rank_map.size} ranks of the mesh")
        self._device_type = device_type
        self._dims: Tuple[Layout, ...] = dims
        self._shape = tuple(int(s) for s in (ranks.shape if mesh is not None else
                                             (layouts.numel(d) for d in dims)))
        self._rank_map = rank_map
        self._flatten_rank_map = (_root_mesh._flatten_rank_map if _root_mesh is not None
                                  else tuple(int(r) for r in rank_map))
        self._mesh_dim_names = self._check_names(mesh_dim_names, op)
        self._root_mesh = _root_mesh
        self._backends = self._check_overrides(backend_override, op)
        self._flatten_mapping: Dict[str, DeviceMesh] = {}
        self._hash: Optional[int] = None
        if _root_mesh is None:
            self._setup_root(_init_backend, _rank, op)
        self._rank = self._root._rank
        self._coordinate_on_dim = self._compute_coordinate()

    def _check_names(self, names: Any, op: str) -> Optional[Tuple[str, ...]]:
        if not names:
            return None
        names = tuple(names)
        if not all(isinstance(name, str) for name in names):
            raise DistValueError(f"hpccomm.{op}: mesh_dim_names must be strings, got {names}")
        if len(set(names)) != len(names):
            raise DistValueError(f"hpccomm.{op}: Each mesh_dim_name must be unique. Found "
                                 f"repeated mesh_dim_name in mesh_dim_names {names}")
        if len(names) != len(self._dims):
            raise DistValueError(f"hpccomm.{op}: mesh_shape and mesh_dim_names should have "
                                 f"same length! Found len(mesh_dim_names): {len(names)} and "
                                 f"len(mesh_shape):{len(self._dims)}.")
        return names

    def _check_overrides(self, overrides: Optional[Sequence[Any]], op: str
                         ) -> Tuple[BackendSpec, ...]:
        if overrides is None:
            return (_DEFAULT,) * len(self._dims)
        if len(overrides) != len(self._dims):
            raise DistValueError(f"hpccomm.{op}: backend_override should have the same length "
                                 f"as the number of mesh dimensions, but got {len(overrides)} "
                                 f"and {len(self._dims)}.")
        return tuple(_backend_spec(entry, op) for entry in overrides)

    def _setup_root(self, init_backend: bool, rank: Optional[int], op: str) -> None:
        """Root-only state: this rank's position, the group cache, the Cartesian parent."""
        ranks = self._rank_map
        if init_backend:
            world = _world(op)
            size = world.size()
            if ranks.size > size:
                raise world.error(op, f"Mesh should not be bigger than default world size "
                                      f"{size}, but found {ranks.size} ranks!")
            bad = [int(r) for r in ranks if not 0 <= r < size]
            if bad:
                raise world.error(op, f"mesh ranks {bad} are not global ranks (world size "
                                      f"{size})")
        if len(np.unique(ranks)) != ranks.size:
            raise DistValueError(f"hpccomm.{op}: mesh {ranks.tolist()} lists a rank more "
                                 f"than once")
        self._rank = resolve(None, op).rank() if rank is None else int(rank)
        found = np.flatnonzero(ranks == self._rank)
        self._position: Optional[int] = int(found[0]) if found.size else None
        self._groups = MeshGroups(ranks, self._shape, self._position, self._describe)
        self._ready = init_backend  # False: no groups until given (from_group)

    @property
    def _root(self) -> "DeviceMesh":
        return self._root_mesh if self._root_mesh is not None else self

    @property
    def _cart(self) -> Optional[ProcessGroup]:
        """The root's Cartesian communicator, once a group has needed it."""
        return self._root._groups.cart

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
        return len(self._dims)

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def _layout(self) -> Tuple[Layout, ...]:
        """Per dimension, its (size, stride) pairs over the root's rank map."""
        return self._dims

    def size(self, mesh_dim: MeshDim = None) -> int:
        """The number of ranks in the mesh, or along dimension ``mesh_dim``."""
        if mesh_dim is None:
            return math.prod(self._shape)
        return self._shape[self._dim_index(mesh_dim, "size")]

    @property
    def mesh(self) -> np.ndarray:
        """The global ranks of this mesh; of a slice, the slice holding this rank."""
        root = self._root
        whole = layouts.concat(self._dims)
        total = root._rank_map.size
        if root._position is not None:
            line = layouts.line_of(whole, total, root._position)
        elif total == layouts.numel(whole):
            line = layouts.offsets(whole)
        else:
            raise DistError(f"hpccomm.DeviceMesh.mesh on global rank {self._rank}: In order "
                            f"to get the mesh Tensor of a DeviceMesh it needs to either have "
                            f"all its original dimensions (e.g., no slicing) or it needs to "
                            f"contain the local rank")
        return root._rank_map[np.array(line, dtype=np.int64)].reshape(self._shape)

    def __repr__(self) -> str:
        sizes = (f"({', '.join(f'{n}={s}' for n, s in zip(self._mesh_dim_names, self._shape))})"
                 if self._mesh_dim_names else f"{self._shape}")
        strides = tuple(dim[0][1] if len(dim) == 1 else tuple(s for _, s in dim)
                        for dim in self._dims)
        text = f"DeviceMesh({sizes}, '{self._device_type}', stride={strides}"
        try:
            detail = settings.DISTRIBUTED_DEBUG.get() == "DETAIL"
        except ValueError:  # a malformed level is reported where it is applied
            detail = False
        if detail:
            text += f", Mesh: {self._full_tolist()}"
        return text + ")"

    def _full_tolist(self) -> Any:
        try:
            return self.mesh.tolist()
        except DistError:
            return "(this rank is not in it)"

    def _hash_key(self) -> Tuple[Any, ...]:
        return (self._flatten_rank_map, self._dims, self._device_type, self._mesh_dim_names)

    def __eq__(self, other: object) -> bool:
        """Same root ranks, dimension layouts, device type and names, as torch compares."""
        if self is other:
            return True
        return isinstance(other, DeviceMesh) and self._hash_key() == other._hash_key()

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._hash_key())
        return self._hash

    def __enter__(self) -> "DeviceMesh":
        mesh_resources.mesh_stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        mesh_resources.mesh_stack.pop()

    # -- this rank --------------------------------------------------------------------------
    def get_rank(self) -> int:
        """This process's global rank."""
        return self._rank

    def _compute_coordinate(self) -> Optional[Tuple[int, ...]]:
        if self._root._position is None:
            return None
        where = np.argwhere(self.mesh == self._rank)
        return tuple(int(c) for c in where[0]) if len(where) else None

    def get_coordinate(self) -> Optional[Tuple[int, ...]]:
        """This rank's index along every dimension, or ``None`` if it is not in the mesh."""
        return self._coordinate_on_dim

    def _is_current_rank_part_of_mesh(self) -> bool:
        return self._coordinate_on_dim is not None

    def get_local_rank(self, mesh_dim: MeshDim = None) -> int:
        """This rank's rank in the group of ``mesh_dim`` (-1 if it is not in the mesh).

        Communicates nothing: a group not made yet is not made for this.
        """
        if self.ndim > 1 and mesh_dim is None:
            raise DistValueError(f"hpccomm.DeviceMesh.get_local_rank: Found the DeviceMesh "
                                 f"have {self.ndim} dimensions. Optional kwarg `mesh_dim` "
                                 f"needs to be specified when device_mesh.ndim > 1.")
        self._root._require_groups()
        dim, spec, _ = self._dim_of(mesh_dim, "get_local_rank")
        return self._root._groups.local_rank(dim, spec)

    # -- groups -------------------------------------------------------------------------------
    def get_group(self, mesh_dim: MeshDim = None) -> Any:
        """The group of dimension ``mesh_dim`` (name or index; optional for a 1-D mesh).

        Made on first use, which every rank of the mesh must call: the first
        ``get_group`` of a dimension is collective over the mesh. A rank outside the mesh
        gets ``GroupMember.NON_GROUP_MEMBER`` at once.
        """
        self._root._require_groups()
        if self.ndim > 1 and mesh_dim is None:
            raise DistValueError(f"hpccomm.DeviceMesh.get_group: Found the DeviceMesh have "
                                 f"{self.ndim} dimensions. Optional kwarg `mesh_dim` needs to "
                                 f"be specified when device_mesh.ndim > 1. If you want to get "
                                 f"the list of all the ProcessGroups in the DeviceMesh, please "
                                 f"use `get_all_groups()` instead.")
        dim, spec, label = self._dim_of(mesh_dim, "get_group")
        root = self._root
        return root._groups.get(dim, spec, label, layouts.concat(root._dims))

    def get_all_groups(self) -> List[Any]:
        """The groups of all dimensions, in order (makes those not made yet)."""
        return [self.get_group(i) for i in range(self.ndim)]

    def as_process_group(self) -> Any:
        """The group a 1-D mesh stands for where it is passed as ``group=`` (its only
        one); a mesh of more dimensions raises."""
        if self.ndim != 1:
            raise self._error("group", f"a {self.ndim}-D mesh is not one group; pass "
                                       f"mesh.get_group(dim) for the dimension meant")
        return self.get_group()

    def _require_groups(self) -> None:
        if not self._ready:
            raise DistError(f"hpccomm.DeviceMesh.get_group on global rank {self._rank}: "
                            f"DeviceMesh process groups not initialized! (the mesh was made "
                            f"with _init_backend=False)")

    # -- choosing dimensions ----------------------------------------------------------------
    def _get_mesh_dim_by_name(self, mesh_dim_name: str) -> int:
        if not self._mesh_dim_names:
            raise _MeshKeyError(f"hpccomm.DeviceMesh: No `mesh_dim_names` found. (dimension "
                                f"'{mesh_dim_name}' was asked for)")
        if mesh_dim_name not in self._mesh_dim_names:
            raise _MeshKeyError(f"hpccomm.DeviceMesh: Mesh dimension '{mesh_dim_name}' does "
                                f"not exist. Available mesh dimensions are: "
                                f"mesh_dim_names={self._mesh_dim_names}")
        return self._mesh_dim_names.index(mesh_dim_name)

    def _dim_index(self, mesh_dim: Union[int, str], op: str) -> int:
        if isinstance(mesh_dim, str):
            return self._get_mesh_dim_by_name(mesh_dim)
        if isinstance(mesh_dim, bool) or not isinstance(mesh_dim, (int, np.integer)):
            raise _MeshTypeError(f"hpccomm.DeviceMesh.{op}: mesh_dim must be an int or a "
                                 f"dimension name, got {mesh_dim!r}")
        if not -self.ndim <= mesh_dim < self.ndim:
            raise _MeshIndexError(f"hpccomm.DeviceMesh.{op}: mesh_dim {mesh_dim} is out of "
                                  f"range for a {self.ndim}-D mesh")
        return int(mesh_dim) % self.ndim

    def _dim_of(self, mesh_dim: MeshDim, op: str) -> Tuple[Layout, BackendSpec, str]:
        """The layout, backend and label of ``mesh_dim`` (flattened names allowed)."""
        if mesh_dim is None:
            mesh_dim = 0
        if isinstance(mesh_dim, str):
            flat = self._root._flatten_mapping.get(mesh_dim)
            if flat is not None:
                return flat._dims[0], flat._backends[0], mesh_dim
        index = self._dim_index(mesh_dim, op)
        label = self._mesh_dim_names[index] if self._mesh_dim_names else f"dim_{index}"
        return self._dims[index], self._backends[index], label

    def __getitem__(self, mesh_dim_names: Union[str, Sequence[str]]) -> "DeviceMesh":
        """The submesh of the named dimensions (in the mesh's order), sharing its groups."""
        if not self._mesh_dim_names:
            raise DistError("hpccomm.DeviceMesh: Cannot slice a DeviceMesh without "
                            "mesh_dim_names!")
        names = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else mesh_dim_names
        if names == self._mesh_dim_names:
            return self
        names = tuple(names)
        root = self._root
        flattened = root._flatten_mapping if self == root else {}
        valid = [*self._mesh_dim_names, *flattened]
        if not all(name in valid for name in names):
            raise _MeshKeyError(f"hpccomm.DeviceMesh: Invalid mesh_dim_names {names} "
                                f"specified. Valid mesh_dim_names are {valid}.")
        dims, specs = [], []
        for name in names:
            if name in self._mesh_dim_names:
                index = self._mesh_dim_names.index(name)
                dims.append(self._dims[index])
                specs.append(self._backends[index])
            else:
                warnings.warn("Slicing a flattened dim from root mesh will be deprecated in "
                              "PT 2.11. Users need to bookkeep the flattened mesh directly. ",
                              stacklevel=2)
                dims.append(flattened[name]._dims[0])
                specs.append(flattened[name]._backends[0])
        whole = layouts.concat(dims)
        if not layouts.is_sorted(whole):
            raise _MeshKeyError(f"hpccomm.DeviceMesh: Invalid mesh_dim_names {names} "
                                f"specified. Mesh dim indices should be in ascending order.")
        if not layouts.is_orthogonal(whole):
            raise DistError(f"hpccomm.DeviceMesh: Slicing overlapping dim_names {names} is "
                            f"not allowed.")
        return self._derived(tuple(dims), names, tuple(specs))

    def _derived(self, dims: Tuple[Layout, ...], names: Tuple[str, ...],
                 specs: Tuple[BackendSpec, ...]) -> "DeviceMesh":
        """A mesh of other dimensions of the same root, sharing the root's groups."""
        root = self._root
        made = DeviceMesh(root._device_type, _layout=dims, _rank_map=root._rank_map,
                          mesh_dim_names=names, _root_mesh=root)
        made._backends = specs
        return made

    def _get_root_mesh(self) -> "DeviceMesh":
        return self._root

    def _get_root_mesh_dim(self) -> Optional[int]:
        """The index in the root of this 1-D slice's dimension (None for an unnamed mesh)."""
        if not self._mesh_dim_names:
            return None
        if len(self._mesh_dim_names) != 1:
            raise DistValueError("hpccomm.DeviceMesh._get_root_mesh_dim: The submesh can "
                                 "only be a 1D mesh.")
        return self._root._get_mesh_dim_by_name(self._mesh_dim_names[0])

    def _get_all_submeshes(self, mesh_dim_name: str) -> List["DeviceMesh"]:
        """Every 1-D mesh along ``mesh_dim_name`` (this rank's holds its group)."""
        index = self._get_mesh_dim_by_name(mesh_dim_name)
        root = self._root
        made = []
        for positions in layouts.lines(self._dims[index], root._rank_map.size):
            ranks = root._rank_map[np.array(positions, dtype=np.int64)]
            sub = DeviceMesh(self._device_type, ranks, mesh_dim_names=(mesh_dim_name,),
                             _init_backend=False, _rank=self._rank)
            if sub._position is not None and root._ready:
                sub._groups.give(sub._dims[0], self.get_group(index))
            sub._ready = root._ready
            made.append(sub)
        return made

    def _describe(self) -> str:
        """This rank and the mesh, for error messages."""
        return (f"global rank {self._rank} (mesh {self._root._rank_map.tolist()}, dims "
                f"{self._mesh_dim_names or self._shape})")

    def _error(self, op: str, message: str) -> DistValueError:
        return DistValueError(f"hpccomm.DeviceMesh.{op} on {self._describe()}: {message}")

    # -- flatten, unflatten, concatenate ------------------------------------------------------
    def _flatten(self, mesh_dim_name: Optional[str] = None,
                 backend_override: Any = None) -> "DeviceMesh":
        """A 1-D mesh of all this mesh's dimensions, named ``mesh_dim_name``.

        Default name: the dimension names joined by ``_``. The root mesh can then be
        sliced and asked for a group by that name. The group is made on first use.
        """
        if not self._mesh_dim_names:
            raise DistError("hpccomm.DeviceMesh._flatten: Cannot flatten a DeviceMesh "
                            "without mesh_dim_names!")
        name = mesh_dim_name or "_".join(self._mesh_dim_names)
        if self.ndim == 1 and name in self._mesh_dim_names:
            return self
        spec = _backend_spec(backend_override, "DeviceMesh._flatten")
        root = self._root
        if name in (root._mesh_dim_names or ()):
            raise DistValueError(f"hpccomm.DeviceMesh._flatten: {name} already exists for "
                                 f"submesh of the {root!r}. The mesh_dim_names of submesh and "
                                 f"flattened mesh are {root._mesh_dim_names}. Please specify "
                                 f"another valid mesh_dim_name.")
        dim = layouts.concat(self._dims)
        existing = root._flatten_mapping.get(name)
        if existing is not None:
            if existing._dims == (dim,):
                return existing
            raise DistValueError(f"hpccomm.DeviceMesh._flatten: Flatten mesh with "
                                 f"mesh_dim_name {name} has been created before, Please "
                                 f"specify another valid mesh_dim_name.")
        flat = self._derived((dim,), (name,), (spec,))
        root._flatten_mapping[name] = flat
        return flat

    flatten = _flatten

    def _unflatten(self, dim: Union[int, str], mesh_sizes: Tuple[int, ...],
                   mesh_dim_names: Tuple[str, ...],
                   backend_override: Optional[Dict[Any, Any]] = None) -> "DeviceMesh":
        """This mesh with dimension ``dim`` split into ``mesh_sizes`` named dimensions.

        The result shares this mesh's root (and the groups of the other dimensions); the
        new dimensions' groups are made on first use.
        """
        op = "DeviceMesh._unflatten"
        if isinstance(dim, int) and dim >= self.ndim:
            raise DistValueError(f"hpccomm.{op}: dim {dim} specified in `_unflatten` is out "
                                 f"of range {self.ndim}")
        if isinstance(dim, str) and dim not in (self._mesh_dim_names or ()):
            raise DistValueError(f"hpccomm.{op}: dim {dim} specified in `_unflatten` is not "
                                 f"in {self._mesh_dim_names}")
        if len(mesh_sizes) != len(mesh_dim_names):
            raise DistValueError(f"hpccomm.{op}: mesh_dim_names must have same length as "
                                 f"mesh_sizes in _unflatten!")
        if not self._mesh_dim_names:
            raise DistValueError(f"hpccomm.{op}: cannot unflatten a DeviceMesh without "
                                 f"mesh_dim_names")
        index = self._dim_index(dim, "_unflatten")
        sizes = tuple(int(s) for s in mesh_sizes)
        if math.prod(sizes) != self._shape[index]:
            raise DistValueError(f"hpccomm.{op}: The product of mesh_sizes={sizes} is "
                                 f"{math.prod(sizes)}, but the original dimension at "
                                 f"dim={index} has size {self._shape[index]}. These must be "
                                 f"equal for unflatten to work correctly.")
        try:
            parts = layouts.compose(self._dims[index], sizes)
        except ValueError as exc:
            raise DistValueError(f"hpccomm.{op}: {exc}") from exc
        entries = (_normalize_backend_override(backend_override, len(sizes),
                                               tuple(mesh_dim_names), op)
                   if backend_override is not None else (None,) * len(sizes))
        specs = tuple(_backend_spec(entry, op) for entry in entries)
        splice = slice(index, index + 1)
        dims, names, backends = list(self._dims), list(self._mesh_dim_names), list(self._backends)
        dims[splice], names[splice], backends[splice] = parts, mesh_dim_names, specs
        return self._derived(tuple(dims), tuple(names), tuple(backends))

    @staticmethod
    def _concatenate(device_mesh_list: List["DeviceMesh"]) -> "DeviceMesh":
        """One mesh of the dimensions of several meshes sliced from the same root."""
        first = device_mesh_list[0]
        dims: List[Layout] = []
        names: List[str] = []
        specs: List[BackendSpec] = []
        for each in device_mesh_list:
            if each._flatten_rank_map != first._flatten_rank_map:
                raise DistError("hpccomm.DeviceMesh._concatenate: Cannot concatenate "
                                "DeviceMeshes derived from different device meshs")
            if not each._mesh_dim_names:
                raise DistValueError("hpccomm.DeviceMesh._concatenate: every mesh needs "
                                     "mesh_dim_names")
            dims.extend(each._dims)
            names.extend(each._mesh_dim_names)
            specs.extend(each._backends)
        if not layouts.is_orthogonal(layouts.concat(dims)):
            raise DistError(f"hpccomm.DeviceMesh._concatenate: Cannot concatenate "
                            f"overlapping meshes: {device_mesh_list}")
        return first._derived(tuple(dims), tuple(names), tuple(specs))

    # -- from existing groups -------------------------------------------------------------
    @staticmethod
    def from_group(group: Union[Any, List[Any]], device_type: str, mesh: Any = None, *,
                   mesh_dim_names: Optional[Tuple[str, ...]] = None) -> "DeviceMesh":
        """A mesh whose dimension groups are existing groups (one per dimension).

        One group: a 1-D mesh of its ranks. Several: ``mesh`` and ``mesh_dim_names`` are
        required, and group ``i`` holds this rank's line along dimension ``i``.
        No communicator is made.
        """
        op = "DeviceMesh.from_group"
        if not isinstance(group, (list, tuple)):
            pg = resolve(group, op)
            ranks = list(pg.ranks)
            if mesh is not None and np.asarray(
                    mesh.tolist() if hasattr(mesh, "tolist") else mesh).tolist() != ranks:
                raise pg.error(op, f"Invalid mesh {str(mesh)} for ProcessGroup with ranks "
                                   f"{ranks}")
            groups, mesh = [pg], ranks
        else:
            groups = [resolve(g, op) for g in group]
            if not groups:
                raise DistValueError(f"hpccomm.{op}: Expects at least one ProcessGroup to be "
                                     f"passed")
            if mesh is None:
                raise DistValueError(f"hpccomm.{op}: Must pass mesh if passing multiple "
                                     f"ProcessGroups")
            if mesh_dim_names is None:
                raise DistValueError(f"hpccomm.{op}: Must pass mesh_dim_names if passing "
                                     f"multiple ProcessGroups")
            ranks_nd = _rank_array(mesh, op)
            if ranks_nd.ndim != len(groups):
                raise DistValueError(f"hpccomm.{op}: Expects mesh with ndim equal to number "
                                     f"of ProcessGroups but got mesh {ranks_nd.tolist()} and "
                                     f"{len(groups)} ProcessGroups")
            mesh = ranks_nd
        made = DeviceMesh(device_type, mesh, mesh_dim_names=mesh_dim_names,
                          _init_backend=False)
        if made._position is not None:
            for d, pg in enumerate(groups):
                line = sorted(int(made._rank_map[p]) for p in made._groups.line(made._dims[d]))
                if sorted(pg.ranks) != line:
                    raise made._error("from_group", f"group {d} has ranks {list(pg.ranks)} "
                                                    f"but this rank's line along dimension "
                                                    f"{d} of the mesh is {line}")
                made._groups.give(made._dims[d], pg)
        made._ready = True
        return made


def init_device_mesh(device_type: str, mesh_shape: Tuple[int, ...], *,
                     mesh_dim_names: Optional[Tuple[str, ...]] = None,
                     backend_override: Optional[Dict[Union[int, str], Any]] = None
                     ) -> DeviceMesh:
    """A mesh of ``mesh_shape`` over global ranks ``0..prod(mesh_shape)-1``, row-major.

    Communicates nothing (groups are made on first use). ``backend_override`` maps a
    dimension (index or name) to a backend name, torch ``Backend.Options`` or both.
    """
    op = "init_device_mesh"
    shape = tuple(mesh_shape) if isinstance(mesh_shape, (tuple, list)) else (mesh_shape,)
    if mesh_dim_names is not None:
        if len(set(mesh_dim_names)) != len(mesh_dim_names):
            raise DistValueError(f"hpccomm.{op}: Each mesh_dim_name must be unique. Found "
                                 f"repeated mesh_dim_name in mesh_dim_names {mesh_dim_names}")
        if len(shape) != len(mesh_dim_names):
            raise DistValueError(f"hpccomm.{op}: mesh_shape and mesh_dim_names should have "
                                 f"same length! Found len(mesh_dim_names): "
                                 f"{len(mesh_dim_names)} and len(mesh_shape):{len(shape)}.")
    overrides = (_normalize_backend_override(backend_override, len(shape),
                                             tuple(mesh_dim_names or ()) or None, op)
                 if backend_override is not None else None)
    if device_type and not device_type.isalpha():
        raise DistValueError(f"hpccomm.{op}: Device type with index is not supported but got "
                             f"{device_type}. If you maintained a 'torch.device' object, it's "
                             f"recommended to pass in 'device.type'.")
    if not shape or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                            and s > 0 for s in shape):
        raise DistValueError(f"hpccomm.{op}: mesh_shape must be positive ints, got "
                             f"{mesh_shape!r}")
    total = math.prod(int(s) for s in shape)
    return DeviceMesh(device_type, np.arange(total).reshape(shape),
                      mesh_dim_names=mesh_dim_names, backend_override=overrides)
