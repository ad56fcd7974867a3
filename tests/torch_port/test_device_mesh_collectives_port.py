"""torch's DeviceMeshCollectiveTest (test/distributed/test_device_mesh.py, 2.13), ported.

torch drives these through DTensor helpers (``mesh_broadcast``, ``mesh_scatter``,
``Shard._split_tensor``) and functional collectives over ``(mesh, dim)``. Here the same
data go through hpccomm's collectives on ``mesh.get_group(dim)``, with NumPy versions of
torch's chunk/pad/unpad steps, and the same results are checked. torch runs them at 8
ranks; they run here at any size (and at 8 from ``test_device_mesh_port_at_8_ranks``).
"""
import numpy as np
import pytest


def _chunks(a, n, dim):
    """``torch.chunk``: pieces of ceil(len/n) along ``dim``; fewer if they run out."""
    length = a.shape[dim]
    step = -(-length // n)
    return [np.take(a, range(i, min(i + step, length)), axis=dim) for i in range(0, length, step)]


def _chunks_filled(a, n, dim):
    """``torch.chunk``, then empty pieces up to ``n`` (as torch's tests append them)."""
    pieces = _chunks(a, n, dim)
    empty = list(a.shape)
    empty[dim] = 0
    return pieces + [np.empty(empty, dtype=a.dtype)] * (n - len(pieces))


def _split_padded(a, n, dim):
    """``Shard(dim)._split_tensor(a, n, with_padding=True)``: n equal pieces and their pads."""
    step = -(-a.shape[dim] // n)
    pieces = _chunks_filled(a, n, dim)
    pads = [step - piece.shape[dim] for piece in pieces]
    padded = []
    for piece, pad in zip(pieces, pads):
        shape = list(a.shape)
        shape[dim] = pad
        padded.append(np.ascontiguousarray(
            np.concatenate([piece, np.zeros(shape, dtype=a.dtype)], axis=dim)))
    return padded, pads


def _unpad(a, dim, pad):
    return np.take(a, range(a.shape[dim] - pad), axis=dim)


def _scatter_on(dist, out, pieces, group):
    """torch's ``mesh_scatter``: group rank 0 scatters ``pieces`` along the group."""
    mine = pieces if dist.get_rank(group) == 0 else None
    dist.scatter(out, mine, group_src=0, group=group)


@pytest.fixture
def DeviceMesh(dist):
    from hpccomm.device_mesh import DeviceMesh
    return DeviceMesh


@pytest.mark.mpi(min_size=1)
def test_broadcast_1d(dist, rank, size, DeviceMesh):
    mesh = DeviceMesh("cpu", np.arange(size))
    local_tensor = np.ones((3, 3)) * rank
    dist.broadcast(local_tensor, group_src=0, group=mesh.get_group(0))
    np.testing.assert_array_equal(local_tensor, np.zeros((3, 3)))


@pytest.mark.mpi(min_size=1)
def test_scatter_1d(dist, rank, size, DeviceMesh):
    mesh = DeviceMesh("cpu", np.arange(size))
    scatter_tensor_shape = [3, 3, 3]
    for scatter_dim in range(len(scatter_tensor_shape)):
        scatter_tensor_shape[scatter_dim] *= size
        global_tensor = np.random.default_rng(0).standard_normal(scatter_tensor_shape)
        splitted_list, _ = _split_padded(global_tensor, mesh.size(), scatter_dim)
        recv_tensor = np.empty_like(splitted_list[mesh.get_rank()])
        _scatter_on(dist, recv_tensor, splitted_list, mesh.get_group(0))
        np.testing.assert_array_equal(recv_tensor, splitted_list[mesh.get_rank()])


@pytest.mark.mpi(min_size=1)
def test_scatter_uneven(dist, rank, size, DeviceMesh):
    device_mesh = DeviceMesh("cpu", list(range(size)))
    my_rank = device_mesh.get_rank()
    tensor_to_split = np.random.default_rng(0).standard_normal((size + 3, size + 1))
    for shard_dim in range(tensor_to_split.ndim):
        tensor_splitted_list = _chunks_filled(tensor_to_split, size, shard_dim)
        padded_tensor_list, pad_sizes = _split_padded(tensor_to_split, device_mesh.size(),
                                                      shard_dim)
        scattered_tensor = np.empty_like(padded_tensor_list[my_rank])
        _scatter_on(dist, scattered_tensor, padded_tensor_list, device_mesh.get_group())
        if pad_sizes[my_rank] != 0:
            scattered_tensor = _unpad(scattered_tensor, shard_dim, pad_sizes[my_rank])
        if scattered_tensor.size == 0:
            assert tensor_splitted_list[my_rank].size == 0
        else:
            assert scattered_tensor.shape == tensor_splitted_list[my_rank].shape
            np.testing.assert_array_equal(scattered_tensor, tensor_splitted_list[my_rank])


@pytest.mark.mpi(min_size=1)
def test_all_gather_uneven(dist, rank, size, DeviceMesh):
    """torch: ``all_gather_single(gather_dim=d)``; here all_gather, then join along d."""
    device_mesh = DeviceMesh("cpu", list(range(size)))
    my_rank = device_mesh.get_rank()
    tensor_to_split = np.ones((size + 3, size + 1))
    for shard_dim in range(tensor_to_split.ndim):
        tensor_padded_list, pad_sizes = _split_padded(tensor_to_split, device_mesh.size(),
                                                      shard_dim)
        local_tensor = tensor_padded_list[my_rank]
        gathered = [np.empty_like(local_tensor) for _ in range(size)]
        dist.all_gather(gathered, local_tensor, group=(device_mesh.get_group(0)))
        big_tensor = np.concatenate(gathered, axis=shard_dim)
        big_tensor_chunks = _chunks(big_tensor, device_mesh.size(), shard_dim)
        unpadded_list = [_unpad(chunk, shard_dim, pad_sizes[i]) if pad_sizes[i] > 0 else chunk
                         for i, chunk in enumerate(big_tensor_chunks)]
        all_gathered_tensor = np.concatenate(unpadded_list, axis=shard_dim)
        assert all_gathered_tensor.shape == tensor_to_split.shape
        np.testing.assert_array_equal(all_gathered_tensor, tensor_to_split)


@pytest.mark.mpi(min_size=1)
def test_reduce_scatter_contiguous(dist, rank, size, DeviceMesh):
    """torch: a Partial DTensor redistributed to Shard(0); here reduce_scatter_tensor of a
    non-contiguous view and of its contiguous copy, which must agree."""
    device_mesh = DeviceMesh("cpu", list(range(size)))
    my_rank = device_mesh.get_rank()
    step = size * 2
    tensor = np.arange(step ** 2, dtype=np.int64).reshape(step, -1) * (my_rank + 1)
    tensor_to_reduce = tensor[::2, :2]  # a non-contiguous view
    tensor_contiguous = np.ascontiguousarray(tensor_to_reduce)
    assert size == 1 or not tensor_to_reduce.flags.c_contiguous
    new_tensor_local = np.empty((1, 2), dtype=np.int64)
    new_tensor_contiguous_local = np.empty((1, 2), dtype=np.int64)
    group = device_mesh.get_group()
    dist.reduce_scatter_tensor(new_tensor_local, tensor_to_reduce, group=group)
    dist.reduce_scatter_tensor(new_tensor_contiguous_local, tensor_contiguous, group=group)
    np.testing.assert_array_equal(new_tensor_local, new_tensor_contiguous_local)
    assert list(new_tensor_local.shape) == [1, 2]
    sum_base = (1 + size) * size // 2
    first_elem = my_rank * sum_base * step * 2
    np.testing.assert_array_equal(new_tensor_local, [[first_elem, first_elem + sum_base]])


@pytest.mark.mpi(min_size=1)
def test_reduce_scatter_uneven(dist, rank, size, DeviceMesh):
    """torch: ``reduce_scatter_single(scatter_dim=d)``; here the dimension is moved first."""
    device_mesh = DeviceMesh("cpu", list(range(size)))
    my_rank = device_mesh.get_rank()
    tensor_to_split = np.ones((size + 3, size + 1)) * rank
    for shard_dim in range(tensor_to_split.ndim):
        tensor_splitted_list = _chunks_filled(tensor_to_split, size, shard_dim)
        padded_tensor_list, pad_sizes = _split_padded(tensor_to_split, device_mesh.size(),
                                                      shard_dim)
        tensor_to_reduce = np.concatenate(padded_tensor_list, axis=shard_dim)
        res_num = ((0 + size - 1) * size) / 2
        moved = np.ascontiguousarray(np.moveaxis(tensor_to_reduce, shard_dim, 0))
        out = np.empty((moved.shape[0] // size, *moved.shape[1:]))
        dist.reduce_scatter_tensor(out, moved, group=device_mesh.get_group(0))
        scattered_tensor = np.moveaxis(out, 0, shard_dim)
        if pad_sizes[my_rank] > 0:
            scattered_tensor = _unpad(scattered_tensor, shard_dim, pad_sizes[my_rank])
        if scattered_tensor.size == 0:
            assert tensor_splitted_list[my_rank].size == 0
        else:
            assert scattered_tensor.shape == tensor_splitted_list[my_rank].shape
            np.testing.assert_array_equal(
                scattered_tensor, np.ones_like(tensor_splitted_list[my_rank]) * res_num)


@pytest.mark.mpi(min_size=1)
def test_broadcast_nd(dist, rank, size, DeviceMesh, mesh_shape):
    mesh = DeviceMesh("cpu", np.arange(size).reshape(mesh_shape(3)))
    local_tensor = np.ones((3, 3)) * rank
    for dim, dim_group in enumerate(mesh.get_all_groups()):
        dim_group_size = dist.get_world_size(dim_group)
        global_ranks = [dist.get_global_rank(dim_group, i) for i in range(dim_group_size)]
        cloned_local_tensor = local_tensor.copy()
        dist.broadcast(cloned_local_tensor, group_src=0, group=mesh.get_group(dim))
        np.testing.assert_array_equal(cloned_local_tensor, np.ones((3, 3)) * global_ranks[0])


@pytest.mark.mpi(min_size=1)
def test_scatter_nd(dist, rank, size, DeviceMesh, mesh_shape):
    mesh = DeviceMesh("cpu", np.arange(size).reshape(mesh_shape(3)))
    for dim, dim_group in enumerate(mesh.get_all_groups()):
        dim_group_size = dist.get_world_size(dim_group)
        global_ranks = [dist.get_global_rank(dim_group, i) for i in range(dim_group_size)]
        scattered_tensors = [np.ones((3, 3)) * global_rank for global_rank in global_ranks]
        received_tensor = np.empty_like(scattered_tensors[mesh.get_coordinate()[dim]])
        _scatter_on(dist, received_tensor, scattered_tensors, mesh.get_group(dim))
        np.testing.assert_array_equal(received_tensor, np.ones((3, 3)) * rank)
