"""Point to point: the argument rules of torch's test_c10d_common.py
(PythonProcessGroupExtensionTest.test_send_recv) with real messages instead of a dummy
process group, and torch 2.13's P2POp / batch_isend_irecv checks.
"""
import numpy as np
import pytest

pytestmark = pytest.mark.mpi(min_size=2)


def test_send_recv(dist, rank, size):
    """PythonProcessGroupExtensionTest.test_send_recv: a ring of send/recv, then the
    argument errors (self as peer, both or neither of dst/group_dst, src with
    group_src), all raised before anything is sent."""
    right, left = (rank + 1) % size, (rank - 1) % size
    if rank % 2 == 0:
        dist.send(np.full((2, 2), float(rank)), right)
        got = np.zeros((2, 2))
        assert dist.recv(got, left) == left
    else:
        got = np.zeros((2, 2))
        assert dist.recv(got, left) == left
        dist.send(np.full((2, 2), float(rank)), right)
    assert (got == left).all()
    tensor = np.zeros((2, 2))
    with pytest.raises(ValueError):
        dist.send(tensor, dist.get_rank())
    with pytest.raises(ValueError):
        dist.send(tensor, group_dst=dist.get_rank())
    with pytest.raises(ValueError):
        dist.send(tensor, dist.get_rank(), group_dst=dist.get_rank())
    with pytest.raises(ValueError):
        dist.send(tensor)
    with pytest.raises(ValueError):
        dist.recv(tensor, src=0, group_src=0)
    dist.barrier()


def test_isend_irecv_to_self(dist, rank, size):
    """torch's isend/irecv docstrings: "Unlike send, which is blocking, isend allows
    src == dst rank, i.e. send to self"."""
    sent = np.arange(4.0) + rank
    got = np.zeros(4)
    recv_work = dist.irecv(got, src=rank)
    send_work = dist.isend(sent, dst=rank)
    send_work.wait()
    recv_work.wait()
    np.testing.assert_array_equal(got, sent)


def test_recv_returns_the_global_rank(dist, rank, size):
    """torch's recv returns the sender's global rank, also when group_src named it."""
    group = dist.new_group(list(reversed(range(size))), sort_ranks=False)
    if rank == size - 1:  # group rank 0
        dist.send(np.ones(1), group_dst=1, group=group)
    elif rank == size - 2:
        assert dist.recv(np.zeros(1), group_src=0, group=group) == size - 1
    dist.barrier()


def test_p2pop_checks(dist, rank, size):
    """P2POp.__new__/__init__ in torch 2.13: op must be isend or irecv; peer and
    group_peer are both filled in; both or neither is a ValueError."""
    buf = np.zeros(1)
    for op in (dist.send, dist.recv, dist.all_reduce):
        with pytest.raises(ValueError, match="isend"):
            dist.P2POp(op, buf, 0)
    with pytest.raises(ValueError):
        dist.P2POp(dist.isend, buf, 0, group_peer=0)
    with pytest.raises(ValueError):
        dist.P2POp(dist.isend, buf)
    group = dist.new_group(list(reversed(range(size))), sort_ranks=False)
    op = dist.P2POp(dist.isend, buf, group_peer=0, group=group)
    assert (op.peer, op.group_peer, op.group) == (size - 1, 0, group)
    op = dist.P2POp(dist.irecv, buf, peer=0)
    assert (op.peer, op.group_peer, op.group) == (0, 0, dist.group.WORLD)


def test_batch_isend_irecv_checks(dist, rank, size):
    """_check_p2p_op_list: a list of P2POp, all on one group."""
    with pytest.raises(ValueError):
        dist.batch_isend_irecv([np.ones(1)])
    with pytest.raises(ValueError):
        dist.batch_isend_irecv((dist.P2POp(dist.isend, np.ones(1), 0),))
    other = dist.new_group()
    ops = [dist.P2POp(dist.isend, np.ones(1), (rank + 1) % size),
           dist.P2POp(dist.irecv, np.ones(1), (rank - 1) % size, group=other)]
    with pytest.raises(ValueError, match="same group"):
        dist.batch_isend_irecv(ops)


def test_batch_isend_irecv_ring(dist, rank, size):
    """batch_isend_irecv's docstring example."""
    send_tensor = np.arange(2, dtype=np.float32) + 2 * rank
    recv_tensor = np.zeros(2, dtype=np.float32)
    send_op = dist.P2POp(dist.isend, send_tensor, (rank + 1) % size)
    recv_op = dist.P2POp(dist.irecv, recv_tensor, (rank - 1 + size) % size)
    for req in dist.batch_isend_irecv([send_op, recv_op]):
        req.wait()
    np.testing.assert_array_equal(recv_tensor, np.arange(2) + 2 * ((rank - 1) % size))
