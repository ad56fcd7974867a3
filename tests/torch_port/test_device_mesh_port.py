"""torch's test/distributed/test_device_mesh.py (2.13), ported to hpccomm and NumPy.

One test here per torch test, under the same name, checking what torch checks about
DeviceMesh on CPU. torch runs most of them at 4 or 8 ranks with fixed shapes; here a
mesh shape follows the world size (the ``mesh_shape`` fixture: a (2, 2, 2) mesh at 8
ranks is (2, 2, 1) at 4 and (2, 1, 1) at 2) and expected ranks come from NumPy, so each
test runs at 1, 2 and 4 ranks and, through ``test_device_mesh_port_at_8_ranks``, at
torch's 8. Tests whose shape needs more ranks skip (pytest-mpi's min_size). torch's
collective tests are in ``test_device_mesh_collectives_port.py``; what cannot apply is
in ``NOT_PORTED.md``.
"""
import os
import re
import sys
from datetime import timedelta

import numpy as np
import pytest

from helpers import run_job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: A job here imports this checkout's hpccomm.
PYTHONPATH = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)


def _line(full, rank, dims):
    """The ranks of ``full`` sharing ``rank``'s coordinates off ``dims`` (kept in order)."""
    coord = np.argwhere(full == rank)[0]
    index = tuple(slice(None) if d in dims else int(c) for d, c in enumerate(coord))
    rest = full[index]
    return rest  # NumPy keeps the sliced dimensions in their original order


def _groups_along(full, dim):
    """Every group of dimension ``dim`` of ``full``, as lists (torch's swapdims recipe)."""
    return np.swapaxes(full, -1, dim).reshape(-1, full.shape[dim]).tolist()


@pytest.fixture
def mesh_mod(dist):
    from hpccomm import device_mesh
    return device_mesh


# -- DeviceMeshTestGlooBackend -----------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_device_mesh_reuse_default_group(dist, size, mesh_mod):
    mesh = mesh_mod.init_device_mesh("cpu", (size,))
    mesh_group = mesh.get_group()
    assert mesh_group is dist.group.WORLD  # torch on CPU: the default group itself
    assert dist.get_world_size(mesh_group) == dist.get_world_size()


# -- DeviceMeshTest ----------------------------------------------------------------------
def test_init_process_group():
    """DeviceMesh initializes the default group when nothing did (own job: fresh state)."""
    out = _run_case("init", 2)
    assert out.count("RESULT init ok") == 2, out


@pytest.mark.mpi(min_size=1)
def test_2d_mesh_non_eager_init_subgroup(dist, size, mesh_mod, mesh_shape):
    mesh_2d = mesh_mod.init_device_mesh("cpu", mesh_shape(2))
    assert mesh_2d.get_group(0).bound_device_id is None
    assert mesh_2d.get_group(1).bound_device_id is None


@pytest.mark.mpi(min_size=1)
def test_get_group_and_get_all_groups(dist, size, mesh_mod, mesh_shape):
    mesh_2d = mesh_mod.init_device_mesh("cpu", mesh_shape(2), mesh_dim_names=("dp", "tp"))
    tp_mesh, dp_mesh = mesh_2d["tp"], mesh_2d["dp"]
    assert mesh_2d.get_group(0) == mesh_2d.get_group("dp")
    assert mesh_2d.get_group(1) == mesh_2d.get_group("tp")
    assert mesh_2d.get_group("dp") == dp_mesh.get_group()
    assert mesh_2d.get_group("tp") == tp_mesh.get_group()
    groups = mesh_2d.get_all_groups()
    assert len(groups) == 2
    assert tp_mesh.get_group() in groups and dp_mesh.get_group() in groups


@pytest.mark.mpi(min_size=1)
def test_get_local_rank_raises_exception(dist, size, mesh_mod, mesh_shape):
    mesh_2d = mesh_mod.init_device_mesh("cpu", mesh_shape(2), mesh_dim_names=("dp", "tp"))
    with pytest.raises(RuntimeError, match=re.escape(
            "Optional kwarg `mesh_dim` needs to be specified when device_mesh.ndim > 1.")):
        mesh_2d.get_local_rank()


@pytest.mark.mpi(min_size=1)
def test_get_local_rank(dist, rank, size, mesh_mod, mesh_shape):
    mesh_2d = mesh_mod.init_device_mesh("cpu", mesh_shape(2), mesh_dim_names=("dp", "tp"))
    assert mesh_2d.get_local_rank("dp") == mesh_2d.get_local_rank(0)
    assert mesh_2d.get_local_rank("tp") == mesh_2d.get_local_rank(1)
    dp_mesh, tp_mesh = mesh_2d["dp"], mesh_2d["tp"]
    assert dp_mesh.get_local_rank() == mesh_2d.get_local_rank("dp")
    assert tp_mesh.get_local_rank() == mesh_2d.get_local_rank("tp")
    flattened_mesh = mesh_2d["dp", "tp"]._flatten()
    assert flattened_mesh.get_local_rank() == rank


@pytest.mark.mpi(min_size=4)
def test_device_mesh_2d(dist, rank, size, mesh_mod):
    mesh = mesh_mod.DeviceMesh("cpu", np.arange(4).reshape(2, 2))  # ranks >= 4: not in it
    dim_to_subgroups = mesh.get_all_groups()
    expected_ranks_by_dim = [[[0, 2], [1, 3]], [[0, 1], [2, 3]]]
    for dim, dim_group in enumerate(dim_to_subgroups):
        assert dim < 2
        if rank >= 4:
            assert dim_group is dist.GroupMember.NON_GROUP_MEMBER
            continue
        dim_ranks = expected_ranks_by_dim[dim]
        dim_group_size = dist.get_world_size(dim_group)
        assert isinstance(dim_group, dist.ProcessGroup) and dim_group_size == 2
        global_ranks = [dist.get_global_rank(dim_group, i) for i in range(dim_group_size)]
        assert global_ranks == (dim_ranks[0] if rank in dim_ranks[0] else dim_ranks[1])


@pytest.mark.mpi(min_size=1)
def test_device_mesh_init_backend(dist, mesh_mod):
    mesh = mesh_mod.DeviceMesh("cpu", np.arange(10), _init_backend=False, _rank=5)
    with pytest.raises(RuntimeError, match="process groups not initialized!"):
        mesh.get_group()
    assert mesh.get_coordinate() == (5,)


@pytest.mark.mpi(min_size=1)
def test_fake_pg_device_mesh(dist, rank, size, mesh_mod):
    """torch gathers over (mesh, 0) with a fake group; here over the real dim-0 group."""
    mesh = mesh_mod.DeviceMesh("cpu", np.arange(size))
    local_tensor = np.random.default_rng(rank).standard_normal((2, 8))
    global_tensor = np.empty((size * 2, 8))
    dist.all_gather_into_tensor(global_tensor, local_tensor, group=mesh.get_group(0))
    assert global_tensor.shape == (size * 2, 8)
    expected = [np.random.default_rng(r).standard_normal((2, 8)) for r in range(size)]
    np.testing.assert_array_equal(global_tensor, np.concatenate(expected))


@pytest.mark.mpi(min_size=1)
def test_fake_pg_device_mesh_cuda_on_cpu(dist, rank, size, mesh_mod):
    """A "cuda" mesh is made on a machine without GPU (the NCCL backend starts lazily)."""
    device_mesh = mesh_mod.init_device_mesh("cuda", (size,), mesh_dim_names=("dp",))
    assert device_mesh.ndim == 1 and device_mesh.size() == size
    assert device_mesh.mesh_dim_names == ("dp",)
    group = device_mesh.get_all_groups()[0]
    assert "cuda" in group.backend_names
    x = np.full(3, float(rank))
    dist.all_reduce(x, group=group)  # NumPy arrays still go over MPI
    assert (x == sum(range(size))).all()


@pytest.mark.mpi(min_size=1)
def test_from_group_with_global_pg(dist, size, mesh_mod):
    ref_global_mesh = mesh_mod.init_device_mesh("cpu", (size,))
    mesh_pg = ref_global_mesh.get_group()
    global_mesh = mesh_mod.DeviceMesh.from_group(mesh_pg, "cpu")
    assert ref_global_mesh == global_mesh
    assert global_mesh.get_group() is ref_global_mesh.get_group()
    assert ref_global_mesh.get_coordinate() == global_mesh.get_coordinate()
    global_mesh = mesh_mod.DeviceMesh.from_group(mesh_pg, "cpu", mesh=np.arange(size))
    assert ref_global_mesh == global_mesh
    assert global_mesh.get_group() is ref_global_mesh.get_group()
    assert ref_global_mesh.get_coordinate() == global_mesh.get_coordinate()


@pytest.mark.mpi(min_size=2)
def test_from_group_with_invalid_mesh(dist, size, mesh_mod):
    global_pg = dist.group.WORLD
    invalid_mesh = np.arange(size).reshape(2, -1).tolist()  # 2D mesh when we need 1D
    regex = re.escape(f"Invalid mesh {invalid_mesh} for ProcessGroup with ranks "
                      f"{list(range(size))}")
    with pytest.raises(ValueError, match=regex):
        mesh_mod.DeviceMesh.from_group(global_pg, "cpu", invalid_mesh,
                                       mesh_dim_names=("dim0", "dim1"))
    device_mesh = mesh_mod.init_device_mesh("cpu", (2, size // 2))
    groups = device_mesh.get_all_groups()
    invalid_mesh = tuple(range(size))  # 1D mesh when we need 2D
    regex = re.escape(f"Expects mesh with ndim equal to number of ProcessGroups but got mesh "
                      f"{list(range(size))} and 2 ProcessGroups")
    with pytest.raises(ValueError, match=regex):
        mesh_mod.DeviceMesh.from_group(groups, "cpu", invalid_mesh,
                                       mesh_dim_names=("dim0", "dim1"))


@pytest.mark.mpi(min_size=1)
def test_raises_invalid_device_type(dist, size, mesh_mod, mesh_shape):
    for device_type in ("cpu:0", "cuda:0"):
        with pytest.raises(RuntimeError, match="Device type with index is not supported"):
            mesh_mod.init_device_mesh(device_type, mesh_shape=mesh_shape(2),
                                      mesh_dim_names=("dp", "tp"))


@pytest.mark.mpi(min_size=4)
def test_get_root_mesh_multiple_independent_meshes(dist, mesh_mod):
    mesh1 = mesh_mod.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    mesh1_dp, mesh1_tp = mesh1["dp"], mesh1["tp"]
    mesh2 = mesh_mod.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dim1", "dim2"))
    mesh2_dim1, mesh2_dim2 = mesh2["dim1"], mesh2["dim2"]
    resources = mesh_mod._mesh_resources
    with pytest.warns(UserWarning, match="get_root_mesh API will be deprecated"):
        assert resources.get_root_mesh(mesh1_dp) == mesh1
    with pytest.warns(UserWarning):
        assert resources.get_root_mesh(mesh1_tp) == mesh1
        assert resources.get_root_mesh(mesh2_dim1) == mesh2
        assert resources.get_root_mesh(mesh2_dim2) == mesh2
        assert resources.get_root_mesh(mesh1_dp) != mesh2
        assert resources.get_root_mesh(mesh1_tp) != mesh2


# -- DeviceMeshTestNDim --------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_device_mesh_nd(dist, rank, size, mesh_mod, mesh_shape):
    mesh_tensor = np.arange(size).reshape(mesh_shape(3))
    mesh = mesh_mod.DeviceMesh("cpu", mesh_tensor)
    for dim, dim_group in enumerate(mesh.get_all_groups()):
        assert dim < mesh_tensor.ndim
        dim_group_size = dist.get_world_size(dim_group)
        assert isinstance(dim_group, dist.ProcessGroup)
        assert dim_group_size == mesh_tensor.shape[dim]
        global_ranks = [dist.get_global_rank(dim_group, i) for i in range(dim_group_size)]
        mine = [ranks for ranks in _groups_along(mesh_tensor, dim) if rank in ranks]
        assert mine == [global_ranks]


@pytest.mark.mpi(min_size=4)
def test_device_mesh_hash(dist, size, mesh_mod):
    mesh_tensor_2d = np.arange(size).reshape(size // 2, 2)
    mesh = mesh_mod.DeviceMesh("cpu", mesh_tensor_2d)
    mesh2 = mesh_mod.DeviceMesh("cpu", mesh_tensor_2d)
    assert hash(mesh) == hash(mesh2)
    mesh3 = mesh_mod.DeviceMesh("cpu", np.arange(size).reshape(2, size // 4, 2))
    assert hash(mesh) != hash(mesh3) and hash(mesh2) != hash(mesh3)


@pytest.mark.mpi(min_size=1)
def test_get_local_rank_3d(dist, rank, size, mesh_mod, mesh_shape):
    shape = mesh_shape(3)
    mesh_3d = mesh_mod.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "pp", "tp"))
    dp, pp, tp = np.unravel_index(rank, shape)
    assert mesh_3d.get_local_rank("tp") == tp
    assert mesh_3d.get_local_rank("pp") == pp
    assert mesh_3d.get_local_rank("dp") == dp


@pytest.mark.mpi(min_size=2)
def test_device_mesh_parent_child_hash(dist, rank, size, mesh_mod):
    mesh_2d = mesh_mod.init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("DP", "TP"))
    mesh_group_1, mesh_group_2 = np.arange(0, size // 2), np.arange(size // 2, size)
    ep_mesh_1 = mesh_mod.DeviceMesh("cpu", mesh_group_1)
    ep_mesh_2 = mesh_mod.DeviceMesh("cpu", mesh_group_2)
    ep_mesh = ep_mesh_1 if rank < size // 2 else ep_mesh_2
    # ep_mesh is considered different from mesh_2d["TP"]
    assert mesh_2d["TP"].mesh.flatten().tolist() == ep_mesh.mesh.flatten().tolist()
    assert mesh_2d["TP"]._layout == ep_mesh._layout
    assert mesh_2d["TP"].mesh.shape == ep_mesh.mesh.shape
    assert mesh_2d["TP"].device_type == ep_mesh.device_type
    assert mesh_2d["TP"].mesh_dim_names != ep_mesh.mesh_dim_names
    assert hash(mesh_2d["TP"]) != hash(ep_mesh)
    assert mesh_2d["TP"] != ep_mesh
    another_mesh_1 = mesh_mod.DeviceMesh("cpu", mesh_group_1)
    another_mesh_2 = mesh_mod.DeviceMesh("cpu", mesh_group_2)
    another_mesh = another_mesh_1 if rank < size // 2 else another_mesh_2
    # another_mesh is considered the same as ep_mesh
    assert ep_mesh._flatten_rank_map == another_mesh._flatten_rank_map
    assert ep_mesh._layout == another_mesh._layout
    assert ep_mesh.mesh.shape == another_mesh.mesh.shape
    assert ep_mesh.device_type == another_mesh.device_type
    assert ep_mesh.mesh_dim_names == another_mesh.mesh_dim_names
    assert hash(ep_mesh) == hash(another_mesh)
    assert ep_mesh == another_mesh


@pytest.mark.mpi(min_size=1)
def test_from_group_with_mesh_shape_3d(dist, size, mesh_mod, mesh_shape):
    mesh_dim_names = ("dp_replicate", "dp_shard", "tp")
    ref_mesh = mesh_mod.init_device_mesh("cpu", mesh_shape(3), mesh_dim_names=mesh_dim_names)
    dp_shard_group = ref_mesh["dp_shard"].get_group()
    dp_replicate_group = ref_mesh["dp_replicate"].get_group()
    dp_mesh = mesh_mod.DeviceMesh.from_group(
        [dp_replicate_group, dp_shard_group], "cpu",
        mesh=ref_mesh.mesh[:, :, ref_mesh.get_local_rank(mesh_dim="tp")],
        mesh_dim_names=("dp_replicate", "dp_shard"))
    assert dp_mesh.get_all_groups() == ref_mesh.get_all_groups()[:2]
    for name in ("dp_replicate", "dp_shard"):
        assert dp_mesh[name].mesh.tolist() == ref_mesh[name].mesh.tolist()
        assert dp_mesh[name].get_group() is ref_mesh[name].get_group()


@pytest.mark.mpi(min_size=2)
def test_from_group_with_mesh_shape_2d(dist, rank, size, mesh_mod):
    ref_mesh = mesh_mod.init_device_mesh("cpu", (2, size // 2),
                                         mesh_dim_names=("dp_replicate", "dp_shard"))
    shard_rank_lists = list(range(size // 2)), list(range(size // 2, size))
    shard_groups = dist.new_group(shard_rank_lists[0]), dist.new_group(shard_rank_lists[1])
    current_shard_group = shard_groups[0] if rank in shard_rank_lists[0] else shard_groups[1]
    current_replicate_group = None
    shard_factor = len(shard_rank_lists[0])
    for i in range(size // 2):
        replicate_group_ranks = list(range(i, size, shard_factor))
        replicate_group = dist.new_group(replicate_group_ranks)
        if rank in replicate_group_ranks:
            current_replicate_group = replicate_group
    dp_mesh = mesh_mod.DeviceMesh.from_group(
        [current_replicate_group, current_shard_group], "cpu", mesh=ref_mesh.mesh,
        mesh_dim_names=("dp_replicate", "dp_shard"))
    for mesh_dim_group, ref_mesh_dim_group in zip(dp_mesh.get_all_groups(),
                                                  ref_mesh.get_all_groups()):
        assert (dist.get_process_group_ranks(mesh_dim_group)
                == dist.get_process_group_ranks(ref_mesh_dim_group))
    assert dp_mesh == ref_mesh
    assert dp_mesh["dp_replicate"] == ref_mesh["dp_replicate"]
    assert dp_mesh["dp_shard"] == ref_mesh["dp_shard"]


# -- InitDeviceMeshTest ----------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_init_device_mesh(dist, size, mesh_mod, mesh_shape):
    shape, mesh_dim_names = mesh_shape(2), ("DP", "TP")
    ref_mesh = mesh_mod.DeviceMesh("cpu", np.arange(size).reshape(shape),
                                   mesh_dim_names=mesh_dim_names)
    mesh_2d = mesh_mod.init_device_mesh("cpu", shape, mesh_dim_names=mesh_dim_names)
    assert mesh_2d == ref_mesh
    assert mesh_2d.mesh_dim_names == mesh_dim_names


@pytest.mark.mpi(min_size=1)
def test_raises_duplicate_mesh_dim_names(dist, mesh_mod):
    with pytest.raises(RuntimeError, match="Each mesh_dim_name must be unique."):
        mesh_mod.init_device_mesh("cpu", (2, 4), mesh_dim_names=["dp", "dp"])


@pytest.mark.mpi(min_size=1)
def test_raises_mesh_shape_mesh_dim_names_mismatch(dist, mesh_mod):
    with pytest.raises(RuntimeError,
                       match="mesh_shape and mesh_dim_names should have same length!"):
        mesh_mod.init_device_mesh("cpu", (8,), mesh_dim_names=["dp", "tp"])


class _Options:
    """Stands in for torch's ``Backend.Options``: hpccomm takes its ``_timeout``."""

    def __init__(self, seconds):
        self._timeout = timedelta(seconds=seconds)


@pytest.mark.mpi(min_size=1)
def test_backend_override_argument_dict_with_idx_and_backend_lazy(dist, size, mesh_mod,
                                                                  mesh_shape):
    """torch overrides with its test-only "fake" backend; here with the MPI backend."""
    opts = _Options(42)
    shape = mesh_shape(3)
    mesh = mesh_mod.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp", "cp"),
                                     backend_override={0: "mpi", 2: ("mpi", opts)})
    default = dist.group.WORLD.backend_string()
    assert mesh.get_group(0).backend_string() == "mpi" != default
    assert mesh.get_group(1).backend_string() == default
    assert mesh.get_group(2).backend_string() == "mpi"
    assert mesh.get_group(0).timeout == dist.group.WORLD.timeout
    assert mesh.get_group(2).timeout == 42
    dp_tp_mesh = mesh["dp", "tp"]._flatten()
    dp_cp_mesh = mesh["dp", "cp"]._flatten(backend_override="mpi")
    tp_cp_mesh = mesh["tp", "cp"]._flatten(backend_override=("mpi", opts))
    assert dp_tp_mesh.get_group(0).backend_string() == default
    assert dp_cp_mesh.get_group(0).backend_string() == "mpi"
    assert tp_cp_mesh.get_group(0).backend_string() == "mpi"
    assert dp_cp_mesh.get_group(0).timeout == dist.group.WORLD.timeout
    assert tp_cp_mesh.get_group(0).timeout == 42


@pytest.mark.mpi(min_size=1)
def test_backend_override_argument_dict_with_name_and_options(dist, size, mesh_mod,
                                                              mesh_shape):
    opts = _Options(42)
    mesh = mesh_mod.init_device_mesh("cpu", mesh_shape(3), mesh_dim_names=("dp", "tp", "cp"),
                                     backend_override={"tp": opts})
    world_timeout = dist.group.WORLD.timeout
    assert mesh.get_group(0).timeout == world_timeout
    assert mesh.get_group(1).timeout == 42
    assert mesh.get_group(2).timeout == world_timeout
    dp_tp_mesh = mesh["dp", "tp"]._flatten()
    dp_cp_mesh = mesh["dp", "cp"]._flatten(backend_override=opts)
    assert dp_tp_mesh.get_group(0).timeout == world_timeout
    assert dp_cp_mesh.get_group(0).timeout == 42


@pytest.mark.mpi(min_size=1)
def test_backend_override_argument_errors(dist, mesh_mod):
    with pytest.raises(RuntimeError,
                       match="Found redundant dim index 0 and name dp in backend_override"):
        mesh_mod.init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"),
                                  backend_override={"dp": "mpi", 0: "mpi"})
    with pytest.raises(RuntimeError,
                       match=r"Found invalid keys in backend_override: got \['cp'\]"):
        mesh_mod.init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"),
                                  backend_override={"cp": "mpi"})
    with pytest.raises(RuntimeError, match=r"Found invalid keys in backend_override: got \[42\]"):
        mesh_mod.init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"),
                                  backend_override={42: "mpi"})


# -- TestDeviceMeshGetItem ------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_raises_no_mesh_dim_found(dist, size, mesh_mod, mesh_shape):
    with pytest.raises(RuntimeError, match="Cannot slice a DeviceMesh without mesh_dim_names!"):
        mesh = mesh_mod.init_device_mesh("cpu", mesh_shape(2))
        mesh["DP"]


@pytest.mark.mpi(min_size=1)
def test_raises_invalid_mesh_dim_name(dist, size, mesh_mod, mesh_shape):
    with pytest.raises(KeyError, match="Invalid mesh_dim_name"):
        mesh = mesh_mod.init_device_mesh("cpu", mesh_shape(2), mesh_dim_names=("DP", "TP"))
        mesh[("PP",)]


@pytest.mark.mpi(min_size=1)
def test_get_item_2d(dist, rank, size, mesh_mod, mesh_shape):
    mesh_2d = mesh_mod.init_device_mesh("cpu", mesh_shape(2), mesh_dim_names=("DP", "TP"))
    full = np.arange(size).reshape(mesh_2d.shape)
    assert mesh_2d["TP"].mesh.tolist() == _line(full, rank, [1]).tolist()
    assert mesh_2d["DP"].mesh.tolist() == _line(full, rank, [0]).tolist()
    assert mesh_2d.mesh.tolist() == full.tolist()


@pytest.mark.mpi(min_size=1)
def test_get_item_1d(dist, size, mesh_mod):
    mesh = mesh_mod.init_device_mesh("cpu", (size,), mesh_dim_names=("dp",))
    dp_mesh = mesh["dp"]
    assert dp_mesh == mesh
    with pytest.raises(KeyError, match="Invalid mesh_dim_name"):
        mesh["dim0"]


@pytest.mark.mpi(min_size=1)
def test_get_item_3d(dist, rank, size, mesh_mod, mesh_shape):
    shape = mesh_shape(3)
    mesh_3d = mesh_mod.init_device_mesh("cpu", shape, mesh_dim_names=("Replicate", "Shard", "TP"))
    full = np.arange(size).reshape(shape)
    assert mesh_3d["TP"].mesh.tolist() == _line(full, rank, [2]).tolist()
    assert mesh_3d["Shard"].mesh.tolist() == _line(full, rank, [1]).tolist()
    assert mesh_3d["Replicate"].mesh.tolist() == _line(full, rank, [0]).tolist()
    # both spellings of an n-D slice: a list and a tuple of names
    hsdp_mesh_1 = mesh_3d[["Replicate", "Shard"]]
    hsdp_mesh_2 = mesh_3d["Replicate", "Shard"]
    hsdp_group = _line(full, rank, [0, 1]).tolist()
    assert hsdp_mesh_1.mesh.tolist() == hsdp_group == hsdp_mesh_2.mesh.tolist()
    assert hsdp_mesh_1 == hsdp_mesh_2
    # 1-D slices of a 2-D slice
    assert hsdp_mesh_2["Shard"].mesh.tolist() == _line(full, rank, [1]).tolist()
    assert hsdp_mesh_2["Replicate"].mesh.tolist() == _line(full, rank, [0]).tolist()


@pytest.mark.mpi(min_size=1)
def test_cache_and_reuse_submesh_slice_result(dist, size, mesh_mod, mesh_shape):
    from hpccomm.group import registry
    mesh = mesh_mod.init_device_mesh("cpu", mesh_shape(2), mesh_dim_names=("dp", "tp"))
    ref_pg_count = len(registry.groups)
    mesh["dp"]
    mesh["dp"]
    mesh["tp"]
    assert len(registry.groups) == ref_pg_count  # slicing makes no group


@pytest.mark.mpi(min_size=1)
def test_get_item_3d_noncontiguous_slicing(dist, rank, size, mesh_mod, mesh_shape):
    shape = mesh_shape(3)
    mesh_3d = mesh_mod.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "pp", "cp"))
    full = np.arange(size).reshape(shape)
    dp_cp_mesh = mesh_3d["dp", "cp"]
    assert dp_cp_mesh.mesh.tolist() == _line(full, rank, [0, 2]).tolist()
    dp_local_rank = dp_cp_mesh.get_local_rank("dp")
    cp_mesh = mesh_3d["cp"]
    assert dp_cp_mesh.mesh[dp_local_rank].tolist() == cp_mesh.mesh.tolist()
    if shape[0] > 1 and shape[2] > 1:  # a size-1 dimension has no order to violate
        with pytest.raises(KeyError, match="Invalid mesh_dim_names"):
            mesh_3d["cp", "dp"]


@pytest.mark.mpi(min_size=1)
def test_flatten_mesh_1d(dist, size, mesh_mod):
    mesh_1d = mesh_mod.init_device_mesh("cpu", (size,), mesh_dim_names=("default",))
    assert mesh_1d._flatten() is mesh_1d


@pytest.mark.mpi(min_size=1)
@pytest.mark.filterwarnings("ignore:Slicing a flattened dim")  # torch warns here too
def test_flatten_mesh_3d(dist, rank, size, mesh_mod, mesh_shape):
    from hpccomm.device_mesh import layout as _mesh_layout
    from hpccomm.group import registry
    shape = mesh_shape(3)
    mesh_3d = mesh_mod.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "cp", "tp"))
    full = np.arange(size).reshape(shape)
    with pytest.raises(ValueError, match="already exists for submesh of the DeviceMesh"):
        mesh_3d._flatten("dp")
    # flatten contiguous dims
    dp_cp_mesh = mesh_3d["dp", "cp"]
    flattened_dp_cp_mesh = dp_cp_mesh._flatten()
    assert dp_cp_mesh.mesh.flatten().tolist() == flattened_dp_cp_mesh.mesh.tolist()
    assert flattened_dp_cp_mesh.mesh_dim_names[0] == "dp_cp"
    group = flattened_dp_cp_mesh.get_group()
    if group is not dist.group.WORLD:  # torch reuses the default group too when it spans it
        assert group.group_desc == "mesh_dp_cp"
    root_mesh = dp_cp_mesh._get_root_mesh()
    assert root_mesh == mesh_3d
    assert root_mesh._flatten_mapping["dp_cp"]._layout == flattened_dp_cp_mesh._layout
    assert (_mesh_layout.lines(flattened_dp_cp_mesh._layout[0], size)
            == np.moveaxis(full, 2, 0).reshape(shape[2], -1).tolist())
    mesh_3d["dp_cp", "tp"]  # well separated: no error
    ref_pg_count = len(registry.groups)
    flattened_dp_cp_mesh_2 = dp_cp_mesh._flatten()  # again: no new group
    assert flattened_dp_cp_mesh == flattened_dp_cp_mesh_2
    assert ref_pg_count == len(registry.groups)
    # flatten non-contiguous dims
    dp_tp_mesh = mesh_3d["dp", "tp"]
    flattened_dp_tp_mesh = dp_tp_mesh._flatten()
    assert dp_tp_mesh.mesh.flatten().tolist() == flattened_dp_tp_mesh.mesh.tolist()
    assert flattened_dp_tp_mesh.mesh_dim_names[0] == "dp_tp"
    assert dp_tp_mesh._get_root_mesh() == mesh_3d
    assert mesh_3d._flatten_mapping["dp_tp"]._layout == flattened_dp_tp_mesh._layout
    assert (_mesh_layout.lines(flattened_dp_tp_mesh._layout[0], size)
            == np.moveaxis(full, 1, 0).reshape(shape[1], -1).tolist())
    if shape[1] > 1 and shape[2] > 1:  # dp_tp is partly "above" and partly "below" cp
        with pytest.raises(KeyError, match="Mesh dim indices should be in ascending order"):
            mesh_3d["dp_tp", "cp"]
    # flatten under another name; flattening into an existing name
    mesh_3d["cp", "tp"]._flatten("dummy")
    assert mesh_3d["dummy"].mesh_dim_names[0] == "dummy"
    with pytest.raises(ValueError, match="dp already exists for submesh of the DeviceMesh"):
        mesh_3d._flatten("dp")
    if shape[0] > 1 or shape[1] > 1:  # else cp_tp and dp_tp are the same positions
        with pytest.raises(ValueError, match="Flatten mesh with mesh_dim_name dp_tp has been "
                                             "created before"):
            mesh_3d["cp", "tp"]._flatten("dp_tp")


@pytest.mark.mpi(min_size=1)
@pytest.mark.filterwarnings("ignore:Slicing a flattened dim")  # torch warns here too
def test_flatten_mesh_4d(dist, rank, size, mesh_mod, mesh_shape):
    shape = mesh_shape(3) + (1,)
    mesh_dim_names = ("dp_replicate", "dp_shard", "cp", "tp")
    mesh_4d = mesh_mod.init_device_mesh("cpu", shape, mesh_dim_names=mesh_dim_names)
    # flatten HSDP and CP into one mesh
    dp_cp_mesh = mesh_4d[mesh_dim_names[:3]]._flatten("dp_cp")
    assert mesh_4d["dp_cp"].mesh.flatten().tolist() == dp_cp_mesh.mesh.tolist()
    assert dp_cp_mesh.mesh_dim_names == ("dp_cp",)
    assert dp_cp_mesh._get_root_mesh() == mesh_4d
    mesh_4d[mesh_dim_names[1:3]]._flatten("dp_shard_cp")
    mesh_4d["dp_replicate", "dp_shard_cp"]._flatten("dp")
    assert mesh_4d["dp", "tp"].mesh.shape == (size, 1)
    # a mesh smaller than the world: ranks past it are not in it, and nothing fails
    mesh_4d = mesh_mod.init_device_mesh("cpu", mesh_shape=(1, 1, 1, 1),
                                        mesh_dim_names=mesh_dim_names)
    mesh_4d["dp_shard", "cp"]._flatten("dp_cp")
    assert mesh_4d["dp_replicate", "dp_cp", "tp"].mesh.shape == (1, 1, 1)


@pytest.mark.mpi(min_size=4)
def test_unflatten_mesh_2d(dist, rank, size, mesh_mod):
    tp = 2 if size >= 8 else 1
    mesh_2d = mesh_mod.init_device_mesh("cpu", (size // tp, tp), mesh_dim_names=("dp", "tp"))
    unflatten_mesh = mesh_2d._unflatten(0, (2, size // tp // 2), ("dp_shard", "dp_replicate"))
    assert unflatten_mesh.mesh_dim_names == ("dp_shard", "dp_replicate", "tp")
    assert mesh_2d["tp"].mesh.tolist() == unflatten_mesh["tp"].mesh.tolist()
    assert mesh_2d["tp"].get_group() is unflatten_mesh["tp"].get_group()
    # unflattened names do not become names of the root mesh
    with pytest.raises(KeyError):
        mesh_2d["dp_shard"]


@pytest.mark.mpi(min_size=4)
def test_unflatten_mesh_3d(dist, rank, size, mesh_mod, mesh_shape):
    global_mesh = mesh_mod.init_device_mesh("cpu", (size,), mesh_dim_names=("world",))
    shape = mesh_shape(3)
    non_ep_mesh = global_mesh._unflatten(0, shape, ("dp", "cp", "tp"))
    ep_mesh = global_mesh._unflatten(0, shape, ("dp", "ep", "ep_tp"))
    assert non_ep_mesh["cp"].mesh.tolist() == ep_mesh["ep"].mesh.tolist()
    assert non_ep_mesh["tp"].mesh.tolist() == ep_mesh["ep_tp"].mesh.tolist()
    mesh_3d = global_mesh._unflatten(0, (size // 2, 2, 1), ("dp", "cp", "tp"))
    unflatten_mesh = mesh_3d._unflatten(0, (2, size // 4), ("dp_shard", "dp_replicate"))
    assert unflatten_mesh.mesh_dim_names == ("dp_shard", "dp_replicate", "cp", "tp")
    assert mesh_3d["tp"].mesh.tolist() == unflatten_mesh["tp"].mesh.tolist()
    assert mesh_3d["tp"].get_group() is unflatten_mesh["tp"].get_group()
    assert mesh_3d["cp"].mesh.tolist() == unflatten_mesh["cp"].mesh.tolist()
    assert mesh_3d["cp"].get_group() is unflatten_mesh["cp"].get_group()
    # with backend overrides (torch: NCCL with options; here MPI, options give timeouts)
    mesh_2d = global_mesh._unflatten(0, (1, size), ("pp", "spmd"),
                                     backend_override={"pp": "mpi",
                                                       "spmd": ("mpi", _Options(30))})
    mesh_4d = mesh_2d._unflatten(1, shape, ("dp", "cp", "tp"),
                                 backend_override={"dp": "mpi", "cp": "mpi",
                                                   "tp": ("mpi", _Options(60))})
    assert mesh_4d["pp"].get_group().backend_string() == "mpi"
    spmd_pg = mesh_2d["spmd"].get_group()
    assert spmd_pg.backend_string() == "mpi" and spmd_pg.timeout == 30
    x = np.ones(10)
    dist.all_reduce(x, group=spmd_pg)
    assert (x == size).all()
    tp_pg = mesh_4d["tp"].get_group()
    assert tp_pg.backend_string() == "mpi" and tp_pg.timeout == 60
    x = np.ones(10)
    dist.all_reduce(x, group=tp_pg)
    assert (x == shape[2]).all()


@pytest.mark.mpi(min_size=1)
def test_concatenate_2d(dist, size, mesh_mod, mesh_shape):
    mesh_2d = mesh_mod.init_device_mesh("cpu", mesh_shape(2), mesh_dim_names=("dp", "tp"))
    concatenated_mesh = mesh_mod.DeviceMesh._concatenate([mesh_2d["dp"], mesh_2d["tp"]])
    assert concatenated_mesh.mesh.tolist() == mesh_2d.mesh.tolist()
    assert concatenated_mesh.get_group("dp") is mesh_2d.get_group("dp")
    assert concatenated_mesh.get_group("tp") is mesh_2d.get_group("tp")


@pytest.mark.mpi(min_size=1)
def test_concatenate_3d(dist, size, mesh_mod, mesh_shape):
    mesh_3d = mesh_mod.init_device_mesh("cpu", mesh_shape(3), mesh_dim_names=("pp", "dp", "tp"))
    concatenated_mesh = mesh_mod.DeviceMesh._concatenate([mesh_3d["dp"], mesh_3d["tp"]])
    dp_tp_mesh = mesh_3d["dp", "tp"]
    assert concatenated_mesh.mesh.tolist() == dp_tp_mesh.mesh.tolist()
    assert concatenated_mesh.get_group("dp") is dp_tp_mesh.get_group("dp")
    assert concatenated_mesh.get_group("tp") is dp_tp_mesh.get_group("tp")
    assert mesh_3d == mesh_mod.DeviceMesh._concatenate([mesh_3d["pp", "dp"], mesh_3d["tp"]])


@pytest.mark.mpi(min_size=1)
def test_reconstruct_mesh_with_flatten_dim(dist, size, mesh_mod, mesh_shape):
    shape = mesh_shape(3)
    mesh_3d = mesh_mod.init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard", "cp"))
    shard_cp_mesh = mesh_3d["shard", "cp"]._flatten()
    with pytest.warns(UserWarning, match="Slicing a flattened dim from root mesh"):
        hsdp_mesh = mesh_3d["replicate", "shard_cp"]
    assert hsdp_mesh.mesh.tolist() == np.arange(size).reshape(shape[0], -1).tolist()
    with pytest.warns(UserWarning):
        assert shard_cp_mesh.get_group() is mesh_3d["shard_cp"].get_group()
    assert shard_cp_mesh.get_group() is mesh_3d.get_group(mesh_dim="shard_cp")
    mesh_3d = mesh_mod.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "cp", "tp"))
    dp_cp_mesh = mesh_3d["dp", "cp"]._flatten()
    with pytest.warns(UserWarning):
        spmd_mesh = mesh_3d["dp_cp", "tp"]
        assert dp_cp_mesh.get_group() is mesh_3d["dp_cp"].get_group()
    assert spmd_mesh.mesh.tolist() == np.arange(size).reshape(-1, shape[2]).tolist()
    assert dp_cp_mesh.get_group() is mesh_3d.get_group(mesh_dim="dp_cp")


# -- TestMeshEnv -------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_get_root_mesh(dist, size, mesh_mod, mesh_shape):
    mesh_3d = mesh_mod.init_device_mesh("cpu", mesh_shape(3), mesh_dim_names=("dp", "cp", "tp"))
    slices = [mesh_3d["dp", "cp"], mesh_3d["dp", "tp"], mesh_3d["cp", "tp"],
              mesh_3d["dp"], mesh_3d["cp"], mesh_3d["tp"]]
    with pytest.warns(UserWarning, match="get_root_mesh API will be deprecated"):
        for each in slices:  # the old spelling still works
            assert mesh_mod._mesh_resources.get_root_mesh(each) == mesh_3d
    for each in slices:
        assert each._get_root_mesh() == mesh_3d


@pytest.mark.mpi(min_size=1)
def test_get_root_mesh_dim_exist(dist, size, mesh_mod, mesh_shape):
    mesh_2d = mesh_mod.init_device_mesh("cpu", mesh_shape(2), mesh_dim_names=("DP", "TP"))
    assert mesh_2d["DP"]._get_root_mesh_dim() == 0
    assert mesh_2d["TP"]._get_root_mesh_dim() == 1


@pytest.mark.mpi(min_size=1)
def test_get_root_mesh_dim_not_exist(dist, size, mesh_mod):
    mesh = mesh_mod.init_device_mesh("cpu", (size,))
    assert mesh._get_root_mesh_dim() is None


@pytest.mark.mpi(min_size=1)
def test_get_mesh_dim_by_name(dist, size, mesh_mod, mesh_shape):
    mesh_2d = mesh_mod.init_device_mesh("cpu", mesh_shape(2), mesh_dim_names=("DP", "TP"))
    assert mesh_2d._get_mesh_dim_by_name("DP") == 0
    assert mesh_2d._get_mesh_dim_by_name("TP") == 1
    with pytest.raises(KeyError, match="Mesh dimension 'PP' does not exist."):
        mesh_2d._get_mesh_dim_by_name("PP")
    with pytest.raises(KeyError, match="No `mesh_dim_names` found."):
        mesh_mod.init_device_mesh("cpu", (size,))._get_mesh_dim_by_name("DP")


@pytest.mark.mpi(min_size=1)
def test_get_all_submeshes(dist, rank, size, mesh_mod, mesh_shape):
    shape = mesh_shape(2)
    mesh_2d = mesh_mod.init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
    all_submeshes = mesh_2d._get_all_submeshes("replicate")
    assert len(all_submeshes) == shape[1]
    assert all(submesh.mesh.size == shape[0] for submesh in all_submeshes)
    mine = [sub for sub in all_submeshes if sub.get_coordinate() is not None]
    assert len(mine) == 1 and mine[0].get_group() is mesh_2d.get_group("replicate")
    assert all(sub.get_group() is dist.GroupMember.NON_GROUP_MEMBER
               for sub in all_submeshes if sub is not mine[0])


# -- the same tests at torch's 8 ranks, in their own job -------------------------------------
def _run_case(case, ranks, timeout=120):
    """tests/scripts/device_mesh_case.py CASE as its own MPI job; its combined output."""
    script = os.path.join(ROOT, "tests", "scripts", "device_mesh_case.py")
    proc = run_job([sys.executable, script, case], ranks, env={"PYTHONPATH": PYTHONPATH},
                   limit=timeout)
    out = proc.output
    assert proc.code == 0, out[-4000:]
    return out


def test_device_mesh_port_at_8_ranks():
    """torch runs these at 8 ranks: run both port files there once, as their own job."""
    here = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(here, name) for name in
             ("test_device_mesh_port.py", "test_device_mesh_collectives_port.py")]
    proc = run_job([sys.executable, "-m", "pytest", "-q", "-x", "-m", "mpi", "--with-mpi", "-p",
                    "no:cacheprovider", *files], 8, limit=420,
                   env={"HPCCOMM_TEST_TIMEOUT": "20", "PYTHONPATH": PYTHONPATH})
    out = proc.output
    assert proc.code == 0, out[-6000:]
    assert re.search(r"\d+ passed", out), out[-3000:]
