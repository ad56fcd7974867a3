"""torch's own backend name ``"mpi"`` served by hpccomm (``hpccomm.torch.mpi_backend``).

The serial tests pin each piece of torch's internals the module relies on, so that a
torch upgrade that moves one fails here rather than for users; the MPI tests (2 and 4
ranks) start torch's default group with ``init_process_group("mpi")`` as torch documents
it, with no store, address or init_method. DDP, FSDP2, DTensor, tensor and pipeline
parallelism and DCP run on ``"mpi"`` in test_torch_training.py (its groups are made on
both names).
"""
import datetime
import importlib
import inspect
import logging
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install "
                                            "'hpccomm[torch]'); the torch backend is untested")
dist = pytest.importorskip("torch.distributed")
hpccomm_torch = pytest.importorskip("hpccomm.torch")
from hpccomm.torch import mpi_backend, versions  # noqa: E402

c10d = importlib.import_module("torch.distributed.distributed_c10d")  # what it patches
TIMEOUT = datetime.timedelta(seconds=60)


# -- the internals, one by one -----------------------------------------------------------------
def test_this_torch_is_one_the_module_was_tested_on():
    assert versions.tested(), (
        f"torch {torch.__version__}: check each of mpi_backend.INTERNALS against its "
        f"distributed_c10d.py, then add the release to hpccomm._version.TESTED_TORCH")
    assert mpi_backend.TESTED_TORCH == versions.TESTED


def test_the_torch_extra_installs_exactly_the_tested_releases():
    """setup.cfg's torch requirement admits each tested release and nothing newer, and
    an untested torch is named at import (a warning) and by ``hpccomm info``."""
    import configparser
    import os

    config = configparser.ConfigParser()
    config.read(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "setup.cfg"))
    extras = config["options.extras_require"]
    for extra in ("torch", "frameworks", "bench"):
        assert versions.REQUIREMENT in extras[extra].split("\n"), extra
    low, high = versions.TESTED[0], versions.TESTED[-1]
    major, minor = map(int, high.split("."))
    assert versions.REQUIREMENT == f"torch>={low},<{major}.{minor + 1}"
    assert versions.untested_note() is None
    note = versions.untested_note("2.99.0+cpu")
    assert "2.99.0" in note and all(release in note for release in versions.TESTED)


@pytest.mark.parametrize("name", sorted(mpi_backend.INTERNALS))
def test_each_internal_exists(name):
    assert hasattr(c10d, name), f"distributed_c10d.{name}: {mpi_backend.INTERNALS[name]}"


@pytest.mark.parametrize("parameter", mpi_backend.HELPER_PARAMETERS)
def test_group_helper_takes_each_parameter(parameter):
    helper = getattr(c10d._new_process_group_helper, "__wrapped__",
                     c10d._new_process_group_helper)
    assert parameter in inspect.signature(helper).parameters


def test_world_records_backend_and_config_per_group():
    assert isinstance(c10d._world.pg_map, dict)
    assert isinstance(c10d._world.pg_backend_config, dict)


def test_torch_names_mpi_and_has_none_of_its_own():
    assert c10d.Backend.MPI == "mpi" and c10d.Backend("MPI") == "mpi"
    assert not hasattr(c10d, "ProcessGroupMPI"), "this torch has MPI built in"


def test_is_mpi_available_reads_the_flag_we_set():
    assert mpi_backend.installed() and dist.is_mpi_available()
    mpi_backend.uninstall()
    try:
        assert not dist.is_mpi_available()
    finally:
        assert mpi_backend.install()
    assert dist.is_mpi_available() and c10d.is_mpi_available()


def test_problems_finds_nothing_on_this_torch():
    assert mpi_backend.problems() == []


# -- what install() does where torch differs -----------------------------------------------------
@pytest.fixture
def uninstalled():
    mpi_backend.uninstall()
    yield
    mpi_backend.uninstall()
    assert mpi_backend.install()


def test_a_torch_with_its_own_mpi_is_left_alone(uninstalled, monkeypatch, caplog):
    monkeypatch.setattr(c10d, "_MPI_AVAILABLE", True)
    with caplog.at_level(logging.INFO, logger="hpccomm"):
        assert mpi_backend.install() is False
    assert not mpi_backend.installed()
    assert "built with MPI" in caplog.text


def test_a_torch_whose_helper_changed_keeps_its_own_behaviour(uninstalled, monkeypatch):
    def changed(size, rank, ranks, backend, store, name):  # no timeout parameter
        raise AssertionError("not called")

    monkeypatch.setattr(c10d, "_new_process_group_helper", changed)
    with pytest.warns(RuntimeWarning, match=r"no parameter\(s\) \['group_size', "
                                            r"'group_rank', 'global_ranks_in_group', "
                                            r"'group_name', 'timeout'\]"):
        assert mpi_backend.install() is False
    assert not dist.is_mpi_available()
    assert c10d._new_process_group_helper is changed


@pytest.mark.parametrize("given, expected", [
    ("mpi", "hpccomm"), ("MPI", "hpccomm"), ("cpu:mpi,cuda:nccl", "cpu:hpccomm,cuda:nccl"),
    ("cuda:nccl,cpu:mpi", "cuda:nccl,cpu:hpccomm"), ("gloo", "gloo"),
    ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl")])
def test_translate(given, expected):
    assert mpi_backend.translate(given) == expected
    assert mpi_backend.mentions_mpi(given) == (expected != given.lower())
    assert mpi_backend.translate(expected, "hpccomm", "mpi") == given.lower()  # and back


def test_other_backends_pass_through_unchanged():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert dist.get_backend() == "gloo"
        x = torch.ones(3)
        dist.all_reduce(x)
        assert x.tolist() == [1.0] * 3
    finally:
        dist.destroy_process_group()


# -- the backend under mpiexec ---------------------------------------------------------------------
@pytest.fixture
def mpi_world():
    """torch's default group as its docs start the MPI backend: a name, nothing else."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("mpi", rank=7, world_size=99, timeout=TIMEOUT)
    yield [str(w.message) for w in caught]
    dist.destroy_process_group()


@pytest.mark.mpi(min_size=2)
def test_rank_and_size_come_from_mpi(mpi_world):
    from mpi4py import MPI

    assert (dist.get_rank(), dist.get_world_size()) == (MPI.COMM_WORLD.Get_rank(),
                                                        MPI.COMM_WORLD.Get_size())
    assert any("world_size (99) and rank (7) are ignored" in m for m in mpi_world), mpi_world
    pg = c10d._get_default_group()
    assert dist.get_backend() == "mpi" and pg.name() == "mpi"
    assert dist.get_backend_config() == "cpu:mpi"
    assert pg.host_group.timeout == TIMEOUT.total_seconds()


@pytest.mark.mpi(min_size=2)
def test_collectives_torch_s_mpi_lacks(mpi_world):
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.full((5,), float(rank + 1), dtype=torch.bfloat16)
    dist.all_reduce(x)
    assert x.tolist() == [float(sum(range(1, size + 1)))] * 5
    half = torch.full((3,), 0.5, dtype=torch.float16)
    dist.all_reduce(half, op=dist.ReduceOp.AVG)
    assert half.tolist() == [0.5] * 3
    out = torch.empty(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.reduce_scatter_tensor(out, torch.arange(2.0 * size))
    assert out.tolist() == [size * 2.0 * rank, size * (2.0 * rank + 1)]
    gathered = [None] * size
    dist.all_gather_object(gathered, {"rank": rank})
    assert gathered == [{"rank": r} for r in range(size)]
    hpccomm_torch.monitored_barrier(timeout=datetime.timedelta(seconds=30))


@pytest.mark.mpi(min_size=2)
def test_default_store_is_real(mpi_world):
    rank, size = dist.get_rank(), dist.get_world_size()
    store = c10d._get_default_store()
    store.set(f"from-{rank}", str(rank))
    store.wait([f"from-{(rank + 1) % size}"], datetime.timedelta(seconds=30))
    assert store.get(f"from-{(rank + 1) % size}") == str((rank + 1) % size).encode()
    # gloo's groups need the default store: the placeholder torch hands MPI had none
    gloo = dist.new_group(backend="gloo")
    x = torch.ones(2)
    dist.all_reduce(x, group=gloo)
    assert x.tolist() == [float(size)] * 2
    assert dist.get_backend(gloo) == "gloo"


@pytest.mark.mpi(min_size=2)
def test_new_group_members_only(mpi_world):
    rank, size = dist.get_rank(), dist.get_world_size()
    first = dist.new_group([0, 1], backend="mpi", timeout=datetime.timedelta(seconds=9))
    if rank > 1:  # never entered the creator: nothing to wait for
        assert first == dist.GroupMember.NON_GROUP_MEMBER
    else:
        assert dist.get_backend(first) == "mpi"
        assert first.host_group.timeout == 9.0
        y = torch.tensor([float(rank)])
        dist.all_reduce(y, group=first)
        assert y.item() == 1.0
    inherit = dist.new_group(list(range(size)))  # the default group's backend
    assert dist.get_backend(inherit) == "mpi"
    with pytest.raises(ValueError, match="use_local_synchronization"):  # as torch's MPI
        dist.new_group([0, 1], use_local_synchronization=True)


@pytest.mark.mpi(min_size=4)
def test_device_mesh_after_mpi(mpi_world):
    from torch.distributed.device_mesh import init_device_mesh

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        group = mesh.get_group(dim)
        assert dist.get_backend(group) == "mpi"
        x = torch.tensor([float(rank)])
        dist.all_reduce(x, group=group)
        members = dist.get_process_group_ranks(group)
        assert x.item() == float(sum(members)) and rank in members


@pytest.mark.mpi(min_size=2)
def test_cpu_mpi_cuda_nccl_with_mpi_rendezvous():
    dist.init_process_group("cpu:mpi,cuda:nccl", init_method="mpi://", timeout=TIMEOUT)
    try:
        assert dist.get_backend() == "cpu:mpi,cuda:nccl"
        assert dist.get_backend_config() == "cpu:mpi,cuda:nccl"
        x = torch.ones(2)
        dist.all_reduce(x)
        assert x.tolist() == [float(dist.get_world_size())] * 2
    finally:
        dist.destroy_process_group()


@pytest.mark.mpi(min_size=2)
def test_twice_after_destroy():
    for _ in range(2):
        dist.init_process_group("mpi")
        x = torch.ones(1)
        dist.all_reduce(x)
        assert x.item() == dist.get_world_size()
        dist.destroy_process_group()
