"""DeviceMesh on MPI Cartesian topologies: 2x2 at 4 ranks, 2x2x2 at 8 ranks (subprocess).

Run as a script (``mpiexec -n 8 python tests/test_device_mesh.py``) it checks the 3-D mesh,
counts the communicators made and prints one ``MESH8 {json}`` line from rank 0.
"""
import json
import os
import sys
import time

import numpy as np
import pytest

from helpers import run_job

import hpccomm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _data(rank, n=5):
    """What global rank ``rank`` contributes (every rank can recompute anyone's)."""
    return np.random.default_rng(rank).standard_normal(n)


def _sum_over(ranks, n=5):
    return sum(_data(r, n) for r in ranks)


class Counter:
    """Counts the communicators made through the MPI plumbing (wraps the real calls)."""

    NAMES = ("cart_create", "cart_sub", "split", "create_subcomm", "dup")

    def __init__(self):
        from hpccomm.backends.mpi import plumbing as mpi
        self.mpi, self.calls, self.saved = mpi, {n: 0 for n in self.NAMES}, {}
        for name in self.NAMES:
            real = getattr(mpi, name)
            self.saved[name] = real
            setattr(mpi, name, self._wrap(name, real))

    def _wrap(self, name, real):
        def counted(*args, **kwargs):
            self.calls[name] += 1
            return real(*args, **kwargs)
        return counted

    def total(self):
        return sum(self.calls.values())

    def restore(self):
        for name, real in self.saved.items():
            setattr(self.mpi, name, real)


# -- any size: 1-D meshes and degenerate dimensions ------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_1d_world_mesh_is_the_default_group(dist, rank, size):
    from hpccomm.device_mesh import DeviceMesh, init_device_mesh
    counter = Counter()
    try:
        mesh = init_device_mesh("cpu", (size,))
        assert mesh.mesh.tolist() == list(range(size)) and mesh.mesh_dim_names is None
        assert mesh.get_group() is dist.group.WORLD  # as torch: no new communicator
        assert counter.total() == 0
    finally:
        counter.restore()
    assert mesh.get_local_rank() == rank and mesh.get_coordinate() == (rank,)
    x = _data(rank)
    dist.all_reduce(x, group=mesh)
    np.testing.assert_allclose(x, _sum_over(range(size)))
    wide = init_device_mesh("cpu", (1, size), mesh_dim_names=("a", "b"))
    assert list(wide.get_group("a").ranks) == [rank] and wide.get_group("a").size() == 1
    assert wide["b"].get_group() is dist.group.WORLD
    # another order is another group: the Cartesian communicator, in mesh order
    backwards = DeviceMesh("cpu", list(range(size))[::-1])
    group = backwards.get_group()
    assert list(group.ranks) == list(range(size))[::-1]
    assert group is (backwards._cart if size > 1 else dist.group.WORLD)
    assert backwards.get_local_rank() == size - 1 - rank == group.rank()
    # the device type is a label, as in torch: a mesh for a device with no backend is made
    assert init_device_mesh("xpu", (size,)).device_type == "xpu"


# -- 4 ranks: a 2x2 mesh -------------------------------------------------------------------
@pytest.fixture
def mesh2(dist):
    from hpccomm.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))


@pytest.mark.mpi(min_size=4)
def test_2x2_shape_and_coordinates(dist, rank, size, mesh2):
    if size != 4:
        pytest.skip("2x2 needs exactly 4 ranks")
    from hpccomm.backends.mpi import plumbing as mpi
    assert mesh2.ndim == 2 and mesh2.shape == (2, 2)
    assert mesh2.size() == 4 and mesh2.size(0) == 2 and mesh2.size(1) == 2
    assert mesh2.mesh_dim_names == ("dp", "tp") and mesh2.device_type == "cpu"
    assert mesh2.mesh.tolist() == [[0, 1], [2, 3]]
    assert mesh2.get_rank() == rank
    assert mesh2.get_coordinate() == divmod(rank, 2)
    assert mesh2.get_local_rank("dp") == rank // 2 and mesh2.get_local_rank(1) == rank % 2
    assert mesh2._cart is None  # nothing made until a group is asked for
    mesh2.get_group("tp")
    # The mesh is an MPI Cartesian communicator that agrees with the coordinates.
    cart = mesh2._cart.comm
    assert mpi.cart_dims(cart) == (2, 2)
    assert mpi.cart_coords(cart) == mesh2.get_coordinate()
    assert repr(mesh2) == "DeviceMesh((dp=2, tp=2), 'cpu', stride=(2, 1))"


@pytest.mark.mpi(min_size=4)
def test_2x2_groups_per_dim_made_once(dist, rank, size, mesh2):
    if size != 4:
        pytest.skip("2x2 needs exactly 4 ranks")
    dp, tp = mesh2.get_group("dp"), mesh2.get_group("tp")
    assert isinstance(dp, hpccomm.ProcessGroup)
    assert dist.get_process_group_ranks(dp) == [rank % 2, rank % 2 + 2]
    assert dist.get_process_group_ranks(tp) == [rank - rank % 2, rank - rank % 2 + 1]
    assert mesh2.get_group(0) is dp and mesh2.get_group("tp") is tp
    assert mesh2.get_group(-1) is tp
    assert mesh2.get_all_groups() == [dp, tp]
    assert dist.get_rank(dp) == mesh2.get_local_rank("dp")
    assert dist.get_rank(tp) == mesh2.get_local_rank("tp")
    assert dp.group_desc == "mesh_dp" and tp.group_desc == "mesh_tp"
    with pytest.raises(RuntimeError, match="`mesh_dim` needs to be specified"):
        mesh2.get_group()
    with pytest.raises(KeyError, match="Mesh dimension 'pp' does not exist"):
        mesh2.get_group("pp")
    with pytest.raises(IndexError, match="out of range"):
        mesh2.get_group(2)


@pytest.mark.mpi(min_size=4)
def test_2x2_collectives_and_p2p_on_dim_groups(dist, rank, size, mesh2):
    if size != 4:
        pytest.skip("2x2 needs exactly 4 ranks")
    dp, tp = mesh2.get_all_groups()
    for group in (dp, tp):
        x = _data(rank)
        dist.all_reduce(x, group=group)
        np.testing.assert_allclose(x, _sum_over(dist.get_process_group_ranks(group)))
    # async, broadcast by group rank, gather into a tensor, P2P inside a tp pair
    x = _data(rank)
    work = dist.all_reduce(x, op=dist.ReduceOp.MAX, group=dp, async_op=True)
    work.wait()
    np.testing.assert_allclose(x, np.maximum(*[_data(r) for r in dp.ranks]))
    y = np.full(3, float(rank))
    dist.broadcast(y, group_src=1, group=tp)
    assert (y == tp.ranks[1]).all()
    out = np.empty(2 * 3)
    dist.all_gather_into_tensor(out, np.full(3, float(rank)), group=dp)
    assert out.tolist() == [float(dp.ranks[0])] * 3 + [float(dp.ranks[1])] * 3
    peer = tp.ranks[1 - mesh2.get_local_rank("tp")]
    got = np.empty(4)
    if mesh2.get_local_rank("tp") == 0:
        dist.send(np.full(4, float(rank)), dst=peer, group=tp)
        dist.recv(got, src=peer, group=tp)
    else:
        dist.recv(got, src=peer, group=tp)
        dist.send(np.full(4, float(rank)), dst=peer, group=tp)
    assert (got == peer).all()
    ops = [dist.P2POp(dist.isend, np.full(2, float(rank)), peer, tp),
           dist.P2POp(dist.irecv, got[:2], peer, tp)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert (got[:2] == peer).all()
    objects = [None, None]
    dist.all_gather_object(objects, {"rank": rank}, group=mesh2["dp"])
    assert objects == [{"rank": r} for r in dp.ranks]
    part = np.empty(1)
    dist.reduce_scatter_tensor(part, np.arange(2.0) + rank, group=tp)
    assert part[0] == sum(tp.ranks) + 2 * tp.rank()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("ndim", [2, 3])
def test_collectives_along_every_mesh_dim(dist, rank, size, ndim, mesh_shape):
    """all_reduce, all_gather, reduce_scatter, broadcast and all_to_all on each dim group
    of a 2-D and a 3-D mesh, checked against NumPy slices of the rank array."""
    from hpccomm.device_mesh import init_device_mesh
    shape = mesh_shape(ndim)
    full = np.arange(size).reshape(shape)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("a", "b", "c")[:ndim])
    coord = mesh.get_coordinate()
    for dim in range(ndim):
        index = tuple(slice(None) if d == dim else c for d, c in enumerate(coord))
        line = full[index].tolist()
        group, n, me = mesh.get_group(dim), len(line), coord[dim]
        assert list(group.ranks) == line and group.rank() == me
        x = _data(rank)
        dist.all_reduce(x, group=group)
        np.testing.assert_allclose(x, _sum_over(line))
        gathered = [np.empty(5) for _ in range(n)]
        dist.all_gather(gathered, _data(rank), group=group)
        np.testing.assert_array_equal(np.stack(gathered), np.stack([_data(r) for r in line]))
        out = np.empty(2)
        sliced = mesh[mesh.mesh_dim_names[dim]]  # a 1-D submesh as the group
        dist.reduce_scatter_tensor(out, np.arange(2.0 * n) + rank, group=sliced)
        np.testing.assert_allclose(out, sum(np.arange(2.0 * n)[2 * me:2 * me + 2] + r
                                            for r in line))
        b = np.full(3, float(rank))
        dist.broadcast(b, group_src=n - 1, group=group)
        assert (b == line[-1]).all()
        sent = np.array([100.0 * rank + j for j in range(n)])
        received = np.empty(n)
        dist.all_to_all_single(received, sent, group=group)
        assert received.tolist() == [100.0 * r + me for r in line]
        outs = [np.empty(2) for _ in range(n)]
        dist.all_to_all(outs, [np.full(2, 10.0 * rank + j) for j in range(n)], group=group)
        assert [o[0] for o in outs] == [10.0 * r + me for r in line]


@pytest.mark.mpi(min_size=4)
def test_2x2_slicing_and_mesh_as_group(dist, rank, size, mesh2):
    if size != 4:
        pytest.skip("2x2 needs exactly 4 ranks")
    dp_mesh, tp_mesh = mesh2["dp"], mesh2["tp"]
    assert dp_mesh.mesh.tolist() == [rank % 2, rank % 2 + 2]
    assert tp_mesh.mesh.tolist() == [rank - rank % 2, rank - rank % 2 + 1]
    assert dp_mesh.ndim == 1 and dp_mesh.mesh_dim_names == ("dp",)
    assert dp_mesh.get_coordinate() == (rank // 2,)
    assert mesh2["dp", "tp"] is mesh2
    assert mesh2["dp", "tp"]["tp"] == tp_mesh  # slicing a slice
    assert tp_mesh.get_group() is mesh2.get_group("tp")  # shared, made once
    # a 1-D mesh is accepted wherever a group is
    x = _data(rank)
    dist.all_reduce(x, group=tp_mesh)
    np.testing.assert_allclose(x, _sum_over(tp_mesh.mesh.tolist()))
    assert dist.get_world_size(dp_mesh) == 2 and dist.get_rank(dp_mesh) == rank // 2
    with pytest.raises(hpccomm.DistValueError, match="not one group"):
        dist.all_reduce(x, group=mesh2)
    with pytest.raises(KeyError, match="ascending order"):
        mesh2["tp", "dp"]
    with pytest.raises(KeyError, match="Invalid mesh_dim_names"):
        mesh2["pp"]


@pytest.mark.mpi(min_size=4)
def test_2x2_flatten(dist, rank, size, mesh2):
    if size != 4:
        pytest.skip("2x2 needs exactly 4 ranks")
    flat = mesh2._flatten()
    assert flat.mesh_dim_names == ("dp_tp",) and flat.mesh.tolist() == [0, 1, 2, 3]
    assert flat.get_local_rank() == rank and flat.get_coordinate() == (rank,)
    with pytest.warns(UserWarning, match="flattened dim"):
        assert mesh2["dp_tp"] == flat
    assert mesh2.flatten("dp_tp") is flat
    group = flat.get_group()
    assert mesh2.get_group("dp_tp") is group is dist.group.WORLD  # spans the world in order
    x = _data(rank)
    dist.all_reduce(x, group=flat)
    np.testing.assert_allclose(x, _sum_over(range(4)))
    assert mesh2["tp"]._flatten() == mesh2["tp"] and mesh2["tp"]._flatten("tp") == mesh2["tp"]
    with pytest.raises(ValueError, match="has been created before"):
        mesh2["dp"]._flatten("dp_tp")
    with pytest.raises(ValueError, match="dp already exists"):
        mesh2["tp"]._flatten("dp")
    with pytest.raises(RuntimeError, match="without mesh_dim_names"):
        hpccomm.DeviceMesh("cpu", [[0, 1], [2, 3]])._flatten()


@pytest.mark.mpi(min_size=4)
def test_unflattened_dims_are_split_from_the_cartesian_communicator(dist, rank, size):
    if size != 4:
        pytest.skip("needs exactly 4 ranks")
    from hpccomm.device_mesh import init_device_mesh
    world_mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("world",))
    counter = Counter()
    try:
        mesh = world_mesh._unflatten("world", (2, 2), ("dp", "tp"))
        assert mesh.mesh.tolist() == [[0, 1], [2, 3]] and counter.total() == 0
        assert mesh._get_root_mesh() is world_mesh
        dp, tp = mesh.get_all_groups()
        assert list(dp.ranks) == [rank % 2, rank % 2 + 2]
        assert list(tp.ranks) == [rank - rank % 2, rank - rank % 2 + 1]
        # half-dimensions of a 1-D Cartesian communicator: one Cart_create, two splits
        assert counter.calls["cart_create"] == 1 and counter.calls["split"] == 2
        assert counter.total() == 3
        again = world_mesh._unflatten(0, (2, 2), ("x", "y"))
        assert again.get_group("x") is dp  # same ranks, same backend: the same group
    finally:
        counter.restore()
    x = _data(rank)
    dist.all_reduce(x, group=mesh["tp"])
    np.testing.assert_allclose(x, _sum_over(tp.ranks))
    with pytest.raises(ValueError, match="The product of mesh_sizes"):
        world_mesh._unflatten(0, (3, 2), ("a", "b"))
    with pytest.raises(ValueError, match="out of range"):
        world_mesh._unflatten(1, (2, 2), ("a", "b"))
    with pytest.raises(RuntimeError, match="same length as mesh_sizes"):
        world_mesh._unflatten(0, (2, 2), ("a",))


@pytest.mark.mpi(min_size=4)
def test_user_ordered_mesh_keeps_order(dist, rank, size):
    if size != 4:
        pytest.skip("needs exactly 4 ranks")
    from hpccomm.device_mesh import DeviceMesh
    ranks = [[3, 1], [0, 2]]
    mesh = DeviceMesh("cpu", ranks, mesh_dim_names=("a", "b"))
    assert mesh.mesh.tolist() == ranks
    row, col = [(i, j) for i in range(2) for j in range(2) if ranks[i][j] == rank][0]
    assert mesh.get_coordinate() == (row, col)
    a, b = mesh.get_group("a"), mesh.get_group("b")
    assert list(a.ranks) == [ranks[0][col], ranks[1][col]]  # mesh order, not sorted
    assert list(b.ranks) == ranks[row]
    assert a.rank() == row and b.rank() == col
    assert list(mesh._cart.ranks) == [3, 1, 0, 2]
    flat = mesh._flatten()
    assert flat.get_group() is mesh._cart  # all of the mesh, in its order: not the world
    x = _data(rank)
    dist.all_reduce(x, group=b)
    np.testing.assert_allclose(x, _sum_over(ranks[row]))


@pytest.mark.mpi(min_size=2)
def test_rank_not_in_mesh(dist, rank, size):
    """A mesh over part of the world: non-members get torch's answers, communicate
    nothing, and everyone meets afterwards."""
    from hpccomm.device_mesh import DeviceMesh
    members = list(range(size // 2))[::-1]
    mesh = DeviceMesh("cpu", members, mesh_dim_names=("x",))
    grid = DeviceMesh("cpu", np.array(members).reshape(-1, 1), mesh_dim_names=("p", "q"))
    non_member = dist.GroupMember.NON_GROUP_MEMBER
    try:
        _check_membership(dist, rank, members, mesh, grid, non_member)
    finally:
        dist.barrier()  # members and non-members alike get here: nothing hangs


def _check_membership(dist, rank, members, mesh, grid, non_member):
    if rank in members:
        assert mesh.get_coordinate() == (members.index(rank),)
        x = _data(rank)
        dist.all_reduce(x, group=mesh)
        np.testing.assert_allclose(x, _sum_over(members))
        assert grid.get_local_rank("q") == 0 and grid["p"].mesh.tolist() == members
    else:
        counter = Counter()
        try:
            assert mesh.get_coordinate() is None and grid.get_coordinate() is None
            assert mesh.get_group() is non_member and grid.get_all_groups() == [non_member] * 2
            assert mesh.get_local_rank() == -1 and grid.get_local_rank("p") == -1
            assert dist.get_rank(mesh.get_group()) == -1
            assert dist.get_world_size(mesh.get_group()) == -1
            assert mesh.mesh.tolist() == members  # a root mesh has one array of ranks
            assert grid.shape == (len(members), 1) and grid.size() == len(members)
            assert grid["p"].get_coordinate() is None
            assert grid._flatten().get_group() is non_member
            if len(members) > 1:  # one array per member: none holds this rank
                with pytest.raises(RuntimeError, match="needs to contain the local rank"):
                    grid["q"].mesh
            assert counter.total() == 0  # nothing above communicated
        finally:
            counter.restore()
        assert dist.all_reduce(np.ones(1), group=mesh.get_group()) is None
        assert dist.all_reduce(np.ones(1), group=mesh) is None


def test_non_members_carry_on_at_4_ranks():
    """The same across a whole program, in its own job with short timeouts."""
    proc = _run([sys.executable, os.path.join(ROOT, "tests", "scripts", "device_mesh_case.py"),
                 "nonmember"], 4, limit=120)
    assert proc.code == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("RESULT nonmember ok") == 4, proc.stdout[-3000:]


@pytest.mark.mpi(min_size=4)
def test_bad_meshes_are_clear_errors(dist, rank, size):
    from hpccomm.device_mesh import DeviceMesh, init_device_mesh
    with pytest.raises(RuntimeError, match=f"Mesh should not be bigger than default world "
                                           f"size {size}, but found {2 * size} ranks"):
        init_device_mesh("cpu", (2, size))
    with pytest.raises(RuntimeError, match="Mesh should not be bigger than default world"):
        DeviceMesh("cpu", np.arange(size + 1))
    with pytest.raises(hpccomm.DistValueError, match="more than once"):
        DeviceMesh("cpu", [0, 0])
    with pytest.raises(ValueError, match="not global ranks"):
        DeviceMesh("cpu", [0, size + 3])
    with pytest.raises(RuntimeError, match="Device type with index is not supported"):
        init_device_mesh("cuda:0", (size,))
    with pytest.raises(RuntimeError, match="unique"):
        init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("a", "a"))
    with pytest.raises(RuntimeError, match="should have same length"):
        init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("a",))
    with pytest.raises(RuntimeError, match="should have same length"):
        DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("a",))
    with pytest.raises(TypeError, match="mesh argument is required"):
        DeviceMesh("cpu")
    with pytest.raises(ValueError, match="integer global ranks"):
        DeviceMesh("cpu", [[0.5, 1]])
    with pytest.raises(ValueError, match="backend_override should have the same length"):
        DeviceMesh("cpu", [0, 1], backend_override=(None, None, None))
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        init_device_mesh("cpu", (size,), backend_override={0: "nope"})
    # a smaller mesh than the world is fine (torch allows it): ranks past it are outside
    small = init_device_mesh("cpu", (1,))
    assert small.get_coordinate() == ((0,) if rank == 0 else None)


@pytest.mark.mpi(min_size=4)
def test_from_group(dist, rank, size, mesh2):
    if size != 4:
        pytest.skip("needs exactly 4 ranks")
    from hpccomm.device_mesh import DeviceMesh, init_device_mesh
    world_mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu", mesh_dim_names=("w",))
    assert world_mesh.mesh.tolist() == list(range(size))
    assert world_mesh.get_group() is dist.group.WORLD
    assert world_mesh == init_device_mesh("cpu", (size,), mesh_dim_names=("w",))
    dp, tp = mesh2.get_all_groups()
    made = DeviceMesh.from_group([dp, tp], "cpu", mesh=[[0, 1], [2, 3]],
                                 mesh_dim_names=("dp", "tp"))
    assert made.get_group("dp") is dp and made.get_group("tp") is tp
    assert made.get_coordinate() == divmod(rank, 2)
    assert made.get_local_rank("tp") == rank % 2
    assert made == mesh2 and hash(made) == hash(mesh2)
    flat = made._flatten()  # a layout no given group has: made among the mesh's ranks
    x = _data(rank)
    dist.all_reduce(x, group=flat)
    np.testing.assert_allclose(x, _sum_over(range(4)))
    with pytest.raises(hpccomm.DistValueError, match="line along dimension"):
        DeviceMesh.from_group([tp, dp], "cpu", mesh=[[0, 1], [2, 3]],
                              mesh_dim_names=("dp", "tp"))
    with pytest.raises(ValueError, match="Must pass mesh if passing multiple"):
        DeviceMesh.from_group([dp, tp], "cpu")
    with pytest.raises(ValueError, match="Must pass mesh_dim_names"):
        DeviceMesh.from_group([dp, tp], "cpu", mesh=[[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="Expects at least one ProcessGroup"):
        DeviceMesh.from_group([], "cpu", mesh=[0], mesh_dim_names=("a",))


@pytest.mark.mpi(min_size=4)
def test_equality_hash_and_cuda_mesh(dist, rank, size, mesh2):
    if size != 4:
        pytest.skip("needs exactly 4 ranks")
    from hpccomm.device_mesh import DeviceMesh, init_device_mesh
    explicit = DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))
    assert explicit == mesh2 and hash(explicit) == hash(mesh2)
    assert explicit["tp"] == mesh2["tp"] and len({explicit["dp"], mesh2["dp"]}) == 1
    assert explicit != DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("a", "b"))
    assert explicit != DeviceMesh("cpu", [[0, 2], [1, 3]], mesh_dim_names=("dp", "tp"))
    assert mesh2["dp"] != mesh2["tp"]
    # "cuda" needs no GPU until a CUDA array is communicated (the backend starts lazily)
    cuda = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
    assert cuda.device_type == "cuda" and cuda != mesh2
    tp = cuda.get_group("tp")
    assert tp.backend_names["cuda"] == dist.group.WORLD.backend_names["cuda"]
    x = _data(rank)
    dist.all_reduce(x, group=tp)  # NumPy arrays still go over MPI
    np.testing.assert_allclose(x, _sum_over(tp.ranks))


@pytest.mark.mpi(min_size=2)
def test_pickle_copy_and_current_mesh(dist, rank, size):
    import copy
    import pickle

    from hpccomm.device_mesh import _mesh_resources, init_device_mesh
    mesh = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("dp", "tp"))
    dp = mesh.get_group("dp")
    back = pickle.loads(pickle.dumps(mesh["dp"]))
    assert back == mesh["dp"] and back.get_coordinate() == mesh["dp"].get_coordinate()
    assert back.get_group() is dp  # groups travel by name and are found again
    copied = copy.deepcopy(mesh)
    assert copied == mesh and copied.get_group("dp") is dp
    with pytest.raises(RuntimeError, match="No device mesh is currently active"):
        _mesh_resources.get_current_mesh()
    with mesh as entered:
        assert entered is mesh and _mesh_resources.get_current_mesh() is mesh
        with mesh["tp"]:
            assert _mesh_resources.get_current_mesh() == mesh["tp"]
        assert _mesh_resources.get_current_mesh() is mesh
    assert _mesh_resources.mesh_stack == []


@pytest.mark.mpi(min_size=4)
def test_2x2_makes_only_the_communicators_used(dist, rank, size):
    if size != 4:
        pytest.skip("needs exactly 4 ranks")
    from hpccomm.device_mesh import init_device_mesh
    counter = Counter()
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        mesh["dp"], mesh["tp"], mesh.get_coordinate(), mesh.get_local_rank("tp")
        assert counter.total() == 0  # making, slicing and queries communicate nothing
        mesh.get_group("tp")
        mesh.get_group("tp")
        assert counter.calls["cart_create"] == 1 and counter.calls["cart_sub"] == 1
        assert counter.total() == 2
        mesh._flatten().get_group()  # the whole world in order: the default group
        mesh.get_group("dp")
        assert counter.calls["cart_sub"] == 2 and counter.total() == 3
    finally:
        counter.restore()


# -- 8 ranks: a 2x2x2 mesh, in a subprocess ------------------------------------------------
def _run(argv, n, limit):
    """``argv`` as a job of ``n`` ranks that imports this checkout's hpccomm."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return run_job(argv, n, limit=limit, env={"PYTHONPATH": path})


def test_2x2x2_mesh_at_8_ranks():
    proc = _run([sys.executable, os.path.abspath(__file__)], 8, limit=150)
    assert proc.code == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("MESH8 ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    report = json.loads(lines[0][len("MESH8 "):])
    assert report["comms_at_creation"] == 0
    assert report["comms_after_all_dims"] == 4
    assert report["comms_total"] == report["comms_used"]
    print("MESH8", report)


def _main_8():
    """Checks of the 2x2x2 mesh at 8 ranks; rank 0 prints the measurements."""
    import hpccomm as dist
    from hpccomm.device_mesh import DeviceMesh, init_device_mesh

    dist.init_process_group(timeout=60)
    rank, size = dist.get_rank(), dist.get_world_size()
    assert size == 8, size
    names = ("dp", "pp", "tp")
    counter = Counter()
    from hpccomm.group import registry
    groups_before = len(registry.groups)
    dist.barrier()
    t0 = time.perf_counter()
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=names)
    t_create = time.perf_counter() - t0
    at_creation = counter.total()
    new_groups = len(registry.groups) - groups_before
    assert at_creation == 0 and new_groups == 0  # making a mesh communicates nothing
    coord = tuple(int(c) for c in np.unravel_index(rank, (2, 2, 2)))
    assert mesh.get_coordinate() == coord
    full = np.arange(8).reshape(2, 2, 2)
    # queries and slicing communicate nothing
    sub = mesh["dp", "tp"]
    assert sub.mesh.tolist() == full[:, coord[1], :].tolist()
    assert sub.get_coordinate() == (coord[0], coord[2])
    assert sub["tp"] == mesh["tp"]
    assert mesh["pp"].mesh.tolist() == full[coord[0], :, coord[2]].tolist()
    assert counter.total() == 0
    # one Cart_create for the first group, one Cart_sub per dimension, then kept
    used = set()
    t_dims = []
    for d, name in enumerate(names):
        t0 = time.perf_counter()
        group = mesh.get_group(name)
        t_dims.append(time.perf_counter() - t0)
        index = [slice(c, c + 1) for c in coord]
        index[d] = slice(None)
        line = full[tuple(index)].ravel().tolist()
        assert list(group.ranks) == line and group.rank() == coord[d]
        assert mesh.get_local_rank(name) == coord[d] and mesh.get_group(d) is group
        x = _data(rank)
        dist.all_reduce(x, group=group)
        np.testing.assert_allclose(x, _sum_over(line))
        used.add(group.group_name)
    after_dims = counter.total()
    assert sub.get_group("tp") is mesh.get_group("tp")
    # flatten dp x pp: one more Cart_sub when its group is first used
    flat = mesh["dp", "pp"]._flatten()
    assert counter.total() == after_dims
    line = full[:, :, coord[2]].ravel().tolist()
    assert flat.mesh.tolist() == line and mesh.get_group("dp_pp") is flat.get_group()
    x = _data(rank)
    dist.all_reduce(x, group=flat)
    np.testing.assert_allclose(x, _sum_over(line))
    used.add(flat.get_group().group_name)
    # from_group: a 2-D mesh from the pp and tp groups, no communicator made
    made = DeviceMesh.from_group([mesh.get_group("pp"), mesh.get_group("tp")], "cpu",
                                 mesh=full[coord[0]], mesh_dim_names=("pp", "tp"))
    assert made.get_coordinate() == coord[1:]
    assert made.mesh.tolist() == mesh["pp", "tp"].mesh.tolist()
    x = _data(rank)
    dist.all_reduce(x, group=made["tp"])
    np.testing.assert_allclose(x, _sum_over(full[coord[0], coord[1]].tolist()))
    # the Cartesian communicator is the parent of every Cart_sub above
    used.add(mesh._cart.group_name)
    total = counter.total()
    counter.restore()
    times = np.array([t_create] + t_dims)
    slowest = times.copy()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("MESH8 " + json.dumps({
            "comms_at_creation": at_creation, "comms_after_all_dims": after_dims,
            "comms_total": total, "comms_used": len(used), "calls": counter.calls,
            "create_ms": round(1e3 * slowest[0], 2),
            "first_get_group_ms": [round(1e3 * t, 2) for t in slowest[1:]]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    _main_8()


@pytest.mark.mpi(min_size=1)
def test_a_cartesian_slice_keeping_no_dimension_is_each_rank_alone(dist, rank, size):
    """MPI_Cart_sub keeping no dimension gives every rank a group of itself (the standard's
    rule; Intel MPI returns MPI_COMM_NULL on ranks other than 0, which hpccomm covers)."""
    from hpccomm.backends.mpi import plumbing as mpi
    cart = mpi.cart_create(dist.group.WORLD.comm, (1, size))
    try:
        for remain in ([False, False], [True, False]):
            sub = mpi.cart_sub(cart, remain)
            try:
                assert sub.Get_size() == 1 and sub.Get_rank() == 0
            finally:
                mpi.free(sub)
        whole = mpi.cart_sub(cart, [False, True])
        try:
            assert whole.Get_size() == size and whole.Get_rank() == rank
        finally:
            mpi.free(whole)
    finally:
        mpi.free(cart)
