"""torch's parallelism stack on hpccomm: functional collectives, DeviceMesh, DTensor, DDP,
FSDP2, tensor and pipeline parallelism, DCP, each under both names the backend answers
to: ``"hpccomm"`` (with ``init_method="mpi://"``) and torch's own ``"mpi"``.

Each training test trains a small model distributed and, on every rank, the same model
in one process on the whole batch, and checks that the parameters agree to float32
round-off. Runs in the MPI sessions of the suite (2 and 4 ranks) with torch's default
group made once per backend name and destroyed after its tests.
"""
import warnings

import pytest

from torch_cases import TIMEOUT, dist, torch
from torch_cases import rank, size  # noqa: F401 (fixtures)

nn = torch.nn

pytestmark = pytest.mark.mpi(min_size=2)

STEPS = 3
IN, HIDDEN, OUT = 8, 16, 4
ROWS_PER_RANK = 4


@pytest.fixture(scope="module", params=["hpccomm", "mpi"])
def torch_world(request):
    """torch's default group for this module's tests, on each name of the backend."""
    if request.param == "mpi":  # as torch documents its MPI backend: no init_method
        dist.init_process_group("mpi", timeout=TIMEOUT)
    else:
        dist.init_process_group("hpccomm", init_method="mpi://", timeout=TIMEOUT)
    assert dist.get_backend() == request.param
    yield dist.group.WORLD
    dist.destroy_process_group()


def mlp(seed=0, depth=3):
    torch.manual_seed(seed)
    layers = [nn.Linear(IN, HIDDEN), nn.ReLU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.ReLU()]
    layers.append(nn.Linear(HIDDEN, OUT))
    return nn.Sequential(*layers)


def batch(world_size, step):
    gen = torch.Generator().manual_seed(100 + step)
    rows = ROWS_PER_RANK * world_size
    return torch.randn(rows, IN, generator=gen), torch.randn(rows, OUT, generator=gen)


def local(tensor, rank, world_size):
    return tensor.chunk(world_size)[rank]


def reference(world_size, steps=STEPS, model=None, optim=torch.optim.SGD, lr=0.1,
              scale=1.0):
    """The same training in one process on the whole batch; ``scale`` multiplies grads."""
    model = model or mlp()
    opt = optim(model.parameters(), lr=lr)
    for step in range(steps):
        x, y = batch(world_size, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        if scale != 1.0:
            for p in model.parameters():
                p.grad.mul_(scale)
        opt.step()
    return dict(model.named_parameters())


def assert_same(named_actual, expected, what):
    checked = 0
    for name, value in named_actual:
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        torch.testing.assert_close(full.detach(), expected[name].detach(), rtol=1e-5,
                                   atol=1e-6, msg=lambda m: f"{what}: {name}: {m}")
        checked += 1
    assert checked == len(expected), f"{what}: compared {checked} of {len(expected)}"


def train_data_parallel(model, rank, size, steps=STEPS, optim=torch.optim.SGD, lr=0.1,
                        first_step=0, opt=None):
    opt = opt or optim(model.parameters(), lr=lr)
    for step in range(first_step, first_step + steps):
        x, y = batch(size, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(local(x, rank, size)), local(y, rank, size)).backward()
        opt.step()
    return opt


# -- functional collectives, DeviceMesh, DTensor ------------------------------------------
def test_functional_collectives(torch_world, rank, size):
    import torch.distributed._functional_collectives as fc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        x = torch.full((4,), float(rank + 1))
        total = float(sum(range(1, size + 1)))
        assert fc.all_reduce(x, "sum", torch_world).tolist() == [total] * 4
        assert fc.all_reduce(x, "avg", torch_world).tolist() == [total / size] * 4
        gathered = fc.all_gather_tensor(x, 0, torch_world)
        assert gathered.tolist() == sum(([float(r + 1)] * 4 for r in range(size)), [])
        scattered = fc.reduce_scatter_tensor(torch.arange(2.0 * size), "sum", 0, torch_world)
        assert scattered.tolist() == [size * (2.0 * rank), size * (2.0 * rank + 1)]
        a2a = fc.all_to_all_single(torch.arange(float(size)) + 10 * rank, None, None, torch_world)
        assert a2a.tolist() == [10.0 * r + rank for r in range(size)]
        b = fc.broadcast(x, 1, torch_world)
        assert b.tolist() == [2.0] * 4
        pair = fc.all_reduce_coalesced([x, x * 2], "max", torch_world)
        assert pair[0].tolist() == [float(size)] * 4 and pair[1].tolist() == [2.0 * size] * 4


@pytest.mark.mpi(min_size=4)
def test_device_mesh_2x2(torch_world, rank, size):
    from torch.distributed.device_mesh import init_device_mesh

    if size != 4:
        pytest.skip("a 2x2 mesh needs exactly 4 ranks")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    row, col = divmod(rank, 2)
    assert mesh["dp"].mesh.tolist() == [col, 2 + col]
    assert mesh["tp"].mesh.tolist() == [2 * row, 2 * row + 1]
    for dim, expected in (("dp", [col, 2 + col]), ("tp", [2 * row, 2 * row + 1])):
        group = mesh.get_group(dim)
        assert dist.get_process_group_ranks(group) == expected
        x = torch.tensor([float(rank)])
        dist.all_reduce(x, group=group)
        assert x.item() == sum(expected)


@pytest.mark.mpi(min_size=4)
def test_dtensor_on_2x2_mesh(torch_world, rank, size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard,
                                          distribute_tensor)

    if size != 4:
        pytest.skip("a 2x2 mesh needs exactly 4 ranks")
    mesh = init_device_mesh("cpu", (2, 2))
    torch.manual_seed(3)
    full = torch.randn(8, 6)
    other = torch.randn(6, 4)
    d = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    assert d.to_local().shape == (4, 3)
    torch.testing.assert_close(d.full_tensor(), full)
    replicated = d.redistribute(mesh, [Replicate(), Replicate()])
    torch.testing.assert_close(replicated.to_local(), full)
    reshard = d.redistribute(mesh, [Shard(1), Shard(0)])
    torch.testing.assert_close(reshard.full_tensor(), full)
    o = distribute_tensor(other, mesh, [Replicate(), Shard(1)])
    product = d.redistribute(mesh, [Shard(0), Replicate()]) @ o
    torch.testing.assert_close(product.full_tensor(), full @ other, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((d * 2 + 1).sum().full_tensor(), (full * 2 + 1).sum(),
                               rtol=1e-5, atol=1e-5)
    row = rank // 2  # Partial over the first mesh dim: the two rows' pieces sum to full
    partial = DTensor.from_local(full * (row + 1) / 3, mesh, [Partial(), Replicate()])
    torch.testing.assert_close(partial.redistribute(mesh, [Replicate(), Replicate()])
                               .to_local(), full, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(partial.redistribute(mesh, [Shard(0), Replicate()])
                               .full_tensor(), full, rtol=1e-6, atol=1e-6)


# -- training -------------------------------------------------------------------------------
def test_ddp_matches_single_process(torch_world, rank, size):
    model = nn.parallel.DistributedDataParallel(mlp(), bucket_cap_mb=0.0001)  # 2+ buckets
    train_data_parallel(model, rank, size)
    assert_same(model.module.named_parameters(), reference(size), "DDP")


def test_ddp_comm_hook_through_work_future(torch_world, rank, size):
    model = nn.parallel.DistributedDataParallel(mlp())

    def hook(state, bucket):
        tensor = bucket.buffer().div_(size)
        future = dist.all_reduce(tensor, async_op=True).get_future()
        return future.then(lambda f: f.value()[0])
    model.register_comm_hook(None, hook)
    train_data_parallel(model, rank, size)
    assert_same(model.module.named_parameters(), reference(size), "DDP with a comm hook")


def fsdp2(model, **kwargs):
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kwargs)
    return fully_shard(model, **kwargs)


def test_fsdp2_matches_single_process(torch_world, rank, size):
    model = fsdp2(mlp())
    train_data_parallel(model, rank, size)
    assert_same(model.named_parameters(), reference(size), "FSDP2")


def test_fsdp2_gradient_divide_factor_uses_premul_sum(torch_world, rank, size):
    from torch.distributed.fsdp import FSDPModule

    model = fsdp2(mlp())
    for module in model.modules():  # each layer is its own FSDP unit
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(2.0 * size)  # reduce-scatter PREMUL_SUM(1/2n)
    train_data_parallel(model, rank, size)
    assert_same(model.named_parameters(), reference(size, scale=0.5), "FSDP2 PREMUL_SUM")


def test_tensor_parallel_matches_single_process(torch_world, rank, size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    mesh = init_device_mesh("cpu", (size,))
    model = parallelize_module(mlp(depth=2), mesh, {"0": ColwiseParallel(),
                                                   "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(size, step)  # every rank sees the whole batch
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert_same(model.named_parameters(), reference(size, model=mlp(depth=2)),
                "tensor parallel")


@pytest.mark.parametrize("schedule_name,per_edge", [("ScheduleGPipe", False),
                                                     ("Schedule1F1B", False),
                                                     ("Schedule1F1B", True)])
def test_pipeline_parallel_matches_single_process(torch_world, rank, size, schedule_name,
                                                  per_edge):
    """Also with torch 2.15's per-edge groups (``pipeline_per_edge_p2p``): one group per
    direction of each pair of neighbouring stages, made with ``split_group``."""
    import contextlib

    from torch.distributed import config, pipelining

    edges = contextlib.nullcontext()
    if per_edge:
        if not hasattr(config, "pipeline_per_edge_p2p"):
            pytest.skip(f"torch 2.15 feature (this is torch {torch.__version__})")
        edges = config.patch(pipeline_per_edge_p2p=True)
    with edges:
        train_pipeline(rank, size, schedule_name, per_edge)


def train_pipeline(rank, size, schedule_name, per_edge):
    from torch.distributed import pipelining

    full = mlp(depth=size + 1)  # size + 1 Linear layers; stage r holds layers 2r (and 2r+1)
    names = [str(i) for i in range(2 * rank, min(2 * rank + 2, len(full)))]
    if rank == size - 1:
        names = [str(i) for i in range(2 * rank, len(full))]
    stage_module = nn.Sequential()
    for name in names:
        stage_module.add_module(name, full[int(name)])
    stage = pipelining.PipelineStage(stage_module, rank, size, torch.device("cpu"))
    schedule = getattr(pipelining, schedule_name)(stage, n_microbatches=size,
                                                  loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(stage_module.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(size, step)
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == size - 1:
            losses = []
            schedule.step(target=y, losses=losses)
            assert len(losses) == size
        else:
            schedule.step()
        opt.step()
    if per_edge:  # each neighbour reached through a two-rank group of its own
        edges = stage._p2p_edge_groups
        assert edges and all(dist.get_world_size(g) == 2 for g in edges.values()), edges
        assert {frozenset(dist.get_process_group_ranks(g)) for g in edges.values()} == {
            frozenset((rank, peer)) for peer in (rank - 1, rank + 1) if 0 <= peer < size}
    expected = reference(size, model=mlp(depth=size + 1))
    assert_same(stage_module.named_parameters(),
                {k: v for k, v in expected.items() if k.split(".")[0] in names},
                f"pipeline parallel ({schedule_name})")


def test_dcp_saves_fsdp2_and_resumes(torch_world, rank, size, tmp_path_factory):
    """FSDP2 model and Adam saved with DCP mid-training and resumed in a fresh model via
    get_/set_model_state_dict train on exactly as if never interrupted."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    path = [str(tmp_path_factory.mktemp("dcp")) if rank == 0 else None]
    dist.broadcast_object_list(path, src=0)
    model = fsdp2(mlp())
    opt = train_data_parallel(model, rank, size, steps=2, optim=torch.optim.Adam, lr=0.01)
    dcp.save({"model": get_model_state_dict(model),
              "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=path[0])
    train_data_parallel(model, rank, size, steps=2, first_step=2, opt=opt)

    resumed = fsdp2(mlp(seed=1))  # different initial weights: all must come from the file
    resumed_opt = torch.optim.Adam(resumed.parameters(), lr=0.01)
    state = {"model": get_model_state_dict(resumed),
             "optim": get_optimizer_state_dict(resumed, resumed_opt)}
    dcp.load(state, checkpoint_id=path[0])
    set_model_state_dict(resumed, state["model"])
    set_optimizer_state_dict(resumed, resumed_opt, state["optim"])
    train_data_parallel(resumed, rank, size, steps=2, first_step=2, opt=resumed_opt)
    uninterrupted = {n: p.full_tensor() for n, p in model.named_parameters()}
    for name, p in resumed.named_parameters():
        torch.testing.assert_close(p.full_tensor(), uninterrupted[name], rtol=0, atol=0)
    assert_same(model.named_parameters(),
                reference(size, steps=4, optim=torch.optim.Adam, lr=0.01), "FSDP2 + Adam")
