"""Point-to-point: send/recv, any-source receive, isend/irecv, batches, the ring."""
import numpy as np
import pytest

import hpccomm


@pytest.fixture(autouse=True)
def fence(request):
    """A barrier after each test, so a fast rank's next messages never meet this test's
    receives (an any-source receive would take them)."""
    yield
    if request.node.get_closest_marker("mpi") and hpccomm.is_initialized():
        hpccomm.barrier()


@pytest.mark.mpi(min_size=2)
def test_send_recv_between_first_and_last(dist, rank, size):
    last = size - 1
    if rank == 0:
        dist.send(np.arange(4, dtype=np.float32), dst=last, tag=3)
    elif rank == last:
        buf = np.zeros(4, dtype=np.float32)
        assert dist.recv(buf, src=0, tag=3) == 0
        np.testing.assert_array_equal(buf, np.arange(4))
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_recv_from_any_source_returns_sender(dist, rank, size):
    if rank == 0:
        senders = set()
        for _ in range(size - 1):
            buf = np.zeros(1, dtype=np.int64)
            sender = dist.recv(buf, tag=21)
            assert buf[0] == sender * 11
            senders.add(sender)
        assert senders == set(range(1, size))
    else:
        dist.send(np.array([rank * 11], dtype=np.int64), dst=0, tag=21)


@pytest.mark.mpi(min_size=2)
def test_recv_from_any_source_round_after_round(dist, rank, size):
    """Many rounds of receives from any source: across nodes (MPICH), a wildcard
    receive tested while rank 0's store thread probed was lost in most such jobs."""
    for round_ in range(30):
        if rank == 0:
            got = sorted(dist.recv(np.zeros(2), tag=22) for _ in range(size - 1))
            assert got == list(range(1, size)), (round_, got)
        else:
            dist.send(np.full(2, float(rank)), dst=0, tag=22)
        dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_receives_from_any_source_match_in_posting_order(dist, rank, size):
    """Two pending receives from any source take the messages in the order they were
    posted, whichever is waited for first (MPI's ordering of posted receives; one
    sender's messages never overtake each other)."""
    if rank == 0:
        first, second = np.zeros(1), np.zeros(1)
        works = dist.irecv(first, tag=23), dist.irecv(second, tag=23)
        dist.send(np.zeros(1), dst=1, tag=24)  # now rank 1 may send
        works[1].wait()
        works[0].wait()
        assert (first[0], second[0]) == (1.0, 2.0)
    elif rank == 1:
        dist.recv(np.zeros(1), src=0, tag=24)
        dist.send(np.ones(1), dst=0, tag=23)
        dist.send(np.full(1, 2.0), dst=0, tag=23)
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_isend_irecv_ring(dist, rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    out = np.full(3, float(rank))
    into = np.zeros(3)
    recv = dist.irecv(into, src=left)
    send = dist.isend(out, dst=right)
    send.wait()
    recv.wait()
    assert recv.source_rank() == left
    np.testing.assert_array_equal(into, left)


@pytest.mark.mpi(min_size=2)
def test_irecv_any_source_work_source_rank(dist, rank, size):
    if rank == 1:
        dist.send(np.ones(2), dst=0, tag=9)
    elif rank == 0:
        work = dist.irecv(np.zeros(2), tag=9)
        work.wait()
        assert work.source_rank() == 1


@pytest.mark.mpi(min_size=3)
def test_receive_sources_in_a_subgroup(dist, rank, size):
    """Group ranks differ from global ranks: recv reports whichever the caller used."""
    tail = dist.new_group(list(range(1, size)))  # group rank g is global rank g + 1
    if rank == 1:
        for tag in (4, 5, 6):
            dist.send(np.full(1, float(tag)), group=tail, group_dst=1, tag=tag)
    elif rank == 2:
        buf = np.zeros(1)
        assert dist.recv(buf, group=tail, group_src=0, tag=4) == 1 and buf[0] == 4  # global
        assert dist.recv(buf, src=1, group=tail, tag=5) == 1 and buf[0] == 5
        work = dist.irecv(buf, group=tail, group_src=0, tag=6)
        work.wait()
        assert work.source_rank() == 0 and buf[0] == 6  # a group rank, as torch's
    dist.barrier()
    if tail is not dist.GroupMember.NON_GROUP_MEMBER:
        dist.destroy_process_group(tail)


@pytest.mark.mpi(min_size=2)
def test_batch_isend_irecv_exchange(dist, rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    send_buf = np.full(5, rank, dtype=np.int32)
    recv_buf = np.zeros(5, dtype=np.int32)
    ops = [dist.P2POp(dist.isend, send_buf, right), dist.P2POp(dist.irecv, recv_buf, left)]
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 2
    for work in works:
        work.wait()
    np.testing.assert_array_equal(recv_buf, left)


@pytest.mark.mpi(min_size=2)
def test_tags_keep_messages_apart(dist, rank, size):
    if rank == 0:
        dist.send(np.array([1.0]), dst=1, tag=1)
        dist.send(np.array([2.0]), dst=1, tag=2)
    elif rank == 1:
        second, first = np.zeros(1), np.zeros(1)
        dist.recv(second, src=0, tag=2)
        dist.recv(first, src=0, tag=1)
        assert (first[0], second[0]) == (1.0, 2.0)


@pytest.mark.mpi(min_size=2)
def test_p2p_argument_errors(dist, rank, size):
    with pytest.raises(hpccomm.DistValueError, match="itself"):
        dist.send(np.ones(1), dst=rank)
    with pytest.raises(hpccomm.DistValueError, match="not part of group"):
        dist.send(np.ones(1), dst=size + 3)
    with pytest.raises(hpccomm.DistValueError, match="tag"):
        dist.isend(np.ones(1), dst=(rank + 1) % size, tag=-1)
    with pytest.raises(hpccomm.DistValueError, match="not both"):
        dist.send(np.ones(1), dst=0, group_dst=0)
    with pytest.raises(ValueError, match="isend or hpccomm.irecv"):
        dist.P2POp(dist.all_reduce, np.ones(1), 0)
    with pytest.raises(ValueError, match="P2POp"):
        dist.batch_isend_irecv([np.ones(1)])
