"""``hpccomm.device_mesh``: torch's ``torch.distributed.device_mesh``, on MPI topologies.

A ``DeviceMesh`` is an n-dimensional arrangement of ranks with one group per dimension.

A root mesh keeps its global ranks as one flat *rank map*; each mesh dimension (sliced,
flattened or unflattened) is a layout over positions in it (see :mod:`.layout`),
as in torch, so slicing and flattening follow torch's rules. Making a mesh communicates
nothing; its groups are made on first use, as sub-communicators of one MPI Cartesian
communicator of the mesh (see :mod:`.groups`).

So the first ``get_group`` of a dimension is *collective over the mesh's ranks*: every
rank of the mesh asks for it, in the same order. Call ``get_all_groups()`` right after
creating the mesh when later code asks for groups on some ranks only. A rank outside
the mesh gets ``GroupMember.NON_GROUP_MEMBER`` and communicates nothing.

The package:

* :mod:`.mesh`: ``DeviceMesh`` and ``init_device_mesh``;
* :mod:`.layout`: a dimension's layout over the rank map, in torch's arithmetic
  (sizes and strides: coalesce, flatten, complement, compose), nothing else;
* :mod:`.groups`: the MPI Cartesian communicator of a root mesh and the groups of its
  dimensions, made on first use.
"""
from .mesh import DeviceMesh, init_device_mesh
from .mesh import mesh_resources as _mesh_resources

__all__ = ["init_device_mesh", "DeviceMesh"]
