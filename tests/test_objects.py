"""Object collectives and object point-to-point, with non-zero roots."""
import pytest

import hpccomm


@pytest.mark.mpi(min_size=2)
def test_broadcast_object_list_from_last_rank(dist, rank, size):
    objects = [None, None, None]
    if rank == size - 1:
        objects = [{"lr": 0.1}, "text", list(range(5))]
    dist.broadcast_object_list(objects, src=size - 1)
    assert objects == [{"lr": 0.1}, "text", [0, 1, 2, 3, 4]]


@pytest.mark.mpi(min_size=2)
def test_all_gather_object_with_uneven_sizes(dist, rank, size):
    gathered = [None] * size
    dist.all_gather_object(gathered, {"rank": rank, "payload": "x" * (rank * 100)})
    assert [item["rank"] for item in gathered] == list(range(size))
    assert [len(item["payload"]) for item in gathered] == [r * 100 for r in range(size)]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("big", ["none", "one", "all"])
def test_objects_larger_than_the_first_round_slot(dist, rank, size, big):
    """Pickles that do not fit hpccomm.objects.SLOT take a second round; all ranks agree."""
    from hpccomm.objects import SLOT

    length = 4 * SLOT if big == "all" or (big == "one" and rank == size - 1) else 3
    gathered = [None] * size
    dist.all_gather_object(gathered, ("r", rank, "y" * length))
    expected = [("r", r, "y" * (4 * SLOT if big == "all" or (big == "one" and r == size - 1)
                              else 3)) for r in range(size)]
    assert gathered == expected
    objects = [None, None]
    if rank == 0:
        objects = [big, "z" * (4 * SLOT if big != "none" else 3)]
    dist.broadcast_object_list(objects, src=0)
    assert objects == [big, "z" * (4 * SLOT if big != "none" else 3)]


@pytest.mark.mpi(min_size=2)
def test_gather_object_to_non_zero_rank(dist, rank, size):
    dst = size - 1
    out = [None] * size if rank == dst else None
    dist.gather_object(("rank", rank), out, dst=dst)
    if rank == dst:
        assert out == [("rank", r) for r in range(size)]


@pytest.mark.mpi(min_size=2)
def test_scatter_object_list(dist, rank, size):
    out = [None]
    inputs = [{"for": r} for r in range(size)] if rank == 1 else None
    dist.scatter_object_list(out, inputs, src=1)
    assert out[0] == {"for": rank}


@pytest.mark.mpi(min_size=2)
def test_send_recv_object_list(dist, rank, size):
    if rank == 0:
        dist.send_object_list([1, "two", {3: 4}], dst=1)
    elif rank == 1:
        received = [None, None, None]
        assert dist.recv_object_list(received) == 0
        assert received == [1, "two", {3: 4}]
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_object_list_length_mismatch_is_an_error(dist, rank, size):
    with pytest.raises(hpccomm.DistValueError, match="one per rank"):
        dist.all_gather_object([None] * (size + 1), rank)
