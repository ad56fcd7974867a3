"""The examples of PyTorch's tutorial "Writing Distributed Applications with PyTorch"
(intermediate_source/dist_tuto.rst), written for hpccomm with NumPy arrays.

Run as ``mpiexec -n N python tutorial_examples.py EXAMPLE``; the tutorial forks its
processes with ``torch.multiprocessing`` instead, which hpccomm replaces by the MPI
launcher (see ``launch``). Each example keeps the tutorial's function names and
statements; where the tutorial only prints, the example also checks the value and
prints a ``RESULT`` line for tests/torch_port/test_port_tutorial.py. The datasets and
the torch model of the training example become NumPy ones (NOT_PORTED.md says why).
"""
import os
import sys
from math import ceil
from random import Random

import numpy as np

import hpccomm as dist


def report(*parts):
    """One ``RESULT`` line, written with one system call so ranks never interleave."""
    sys.stdout.flush()
    os.write(1, (" ".join(["RESULT", f"rank={dist.get_rank()}", *map(str, parts)]) + "\n")
             .encode())


# -- Setup: the template -----------------------------------------------------------------
def run_nothing(rank, size):
    """Distributed function to be implemented later."""
    report("template", f"size={size}")


def init_process(rank, size, fn, backend="gloo"):
    """Initialize the distributed environment."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)


# -- Point-to-point communication ----------------------------------------------------------
def run_blocking(rank, size):
    """Blocking point-to-point communication."""
    tensor = np.zeros(1)
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        dist.send(tensor=tensor, dst=1)
    else:
        # Receive tensor from process 0
        dist.recv(tensor=tensor, src=0)
    print("Rank ", rank, " has data ", tensor[0])
    assert tensor[0] == 1.0
    report("blocking", f"data={tensor[0]}")


def run_nonblocking(rank, size):
    """Non-blocking point-to-point communication."""
    tensor = np.zeros(1)
    req = None
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        req = dist.isend(tensor=tensor, dst=1)
        print("Rank 0 started sending")
    else:
        # Receive tensor from process 0
        req = dist.irecv(tensor=tensor, src=0)
        print("Rank 1 started receiving")
    req.wait()
    print("Rank ", rank, " has data ", tensor[0])
    assert tensor[0] == 1.0
    report("nonblocking", f"data={tensor[0]}")


# -- Collective communication --------------------------------------------------------------
def run_all_reduce(rank, size):
    """All-Reduce example: a group of ranks 0 and 1, called by every rank."""
    group = dist.new_group([0, 1])
    tensor = np.ones(1)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    print("Rank ", rank, " has data ", tensor[0])
    # checked with MPI's rank and size: the MPI section passes rank 0, size 0 to every run
    me, everybody = dist.get_rank(), dist.get_world_size()
    assert tensor[0] == (2.0 if me in (0, 1) else 1.0)  # outside the group: unchanged
    dist.barrier()  # every rank goes on: nobody is left waiting
    everyone = np.ones(1)
    dist.all_reduce(everyone)
    assert everyone[0] == everybody
    report("all_reduce", f"data={tensor[0]}", f"world={everyone[0]}")


def run_all_reduce_legacy(rank, size):
    """The tutorial's older All-Reduce example, with the deprecated ``dist.reduce_op``."""
    group = dist.new_group([0, 1])
    tensor = np.ones(1)
    dist.all_reduce(tensor, op=dist.reduce_op.SUM, group=group)
    assert tensor[0] == (2.0 if rank in (0, 1) else 1.0)
    dist.barrier()
    report("all_reduce_legacy", f"data={tensor[0]}")


def run_collectives(rank, size):
    """The collectives the tutorial lists, called as it writes them:
    ``broadcast(tensor, src, group)``, ``reduce(tensor, dst, op, group)``,
    ``all_reduce(tensor, op, group)``, ``scatter(tensor, scatter_list, src, group)``,
    ``gather(tensor, gather_list, dst, group)``, ``all_gather(tensor_list, tensor, group)``
    and ``barrier(group)``."""
    group = dist.new_group(list(range(size)))
    tensor = np.array([float(rank)])
    dist.broadcast(tensor, 0, group)
    assert tensor[0] == 0.0
    tensor = np.array([float(rank + 1)])
    dist.reduce(tensor, 0, dist.ReduceOp.SUM, group)
    if rank == 0:
        assert tensor[0] == size * (size + 1) / 2
    for op, expected in [(dist.ReduceOp.SUM, size * (size + 1) / 2),
                         (dist.ReduceOp.PRODUCT, float(np.prod(np.arange(1, size + 1)))),
                         (dist.ReduceOp.MAX, float(size)), (dist.ReduceOp.MIN, 1.0)]:
        tensor = np.array([float(rank + 1)])
        dist.all_reduce(tensor, op, group)
        assert tensor[0] == expected, (op, tensor)
    tensor = np.zeros(1)
    scatter_list = [np.array([float(i)]) for i in range(size)] if rank == 0 else None
    dist.scatter(tensor, scatter_list, 0, group)
    assert tensor[0] == rank
    gather_list = [np.zeros(1) for _ in range(size)] if rank == 0 else None
    dist.gather(np.array([float(rank)]), gather_list, 0, group)
    if rank == 0:
        assert [g[0] for g in gather_list] == list(range(size))
    tensor_list = [np.zeros(1) for _ in range(size)]
    dist.all_gather(tensor_list, np.array([float(rank)]), group)
    assert [t[0] for t in tensor_list] == list(range(size))
    dist.barrier(group)
    report("collectives", "ok")


# -- Distributed training ------------------------------------------------------------------
class Partition(object):
    """Dataset partitioning helper."""

    def __init__(self, data, index):
        self.data = data
        self.index = index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, index):
        data_idx = self.index[index]
        return self.data[data_idx]


class DataPartitioner(object):

    def __init__(self, data, sizes=[0.7, 0.2, 0.1], seed=1234):
        self.data = data
        self.partitions = []
        rng = Random()
        rng.seed(seed)
        data_len = len(data)
        indexes = [x for x in range(0, data_len)]
        rng.shuffle(indexes)

        for frac in sizes:
            part_len = int(frac * data_len)
            self.partitions.append(indexes[0:part_len])
            indexes = indexes[part_len:]

    def use(self, partition):
        return Partition(self.data, self.partitions[partition])


def synthetic_dataset(samples=1200, features=16, classes=4, seed=0):
    """A stand-in for MNIST: ``(x, label)`` pairs of a linearly separable problem."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, features)) * 3
    labels = rng.integers(0, classes, samples)
    points = centers[labels] + rng.normal(size=(samples, features))
    return [(points[i].astype(np.float32), int(labels[i])) for i in range(samples)]


def batches(partition, bsz, seed):
    """A stand-in for ``torch.utils.data.DataLoader(partition, batch_size=bsz,
    shuffle=True)``."""
    order = np.random.default_rng(seed).permutation(len(partition))
    bsz = int(bsz)
    for start in range(0, len(order), bsz):
        items = [partition[i] for i in order[start:start + bsz]]
        yield np.stack([x for x, _ in items]), np.array([y for _, y in items])


def partition_dataset():
    """Partitioning the dataset."""
    dataset = synthetic_dataset()
    size = dist.get_world_size()
    bsz = 128 / float(size)
    partition_sizes = [1.0 / size for _ in range(size)]
    partition = DataPartitioner(dataset, partition_sizes)
    partition = partition.use(dist.get_rank())
    return partition, bsz


def run_partition(rank, size):
    """Each rank gets its own part; together the parts are disjoint."""
    partition, bsz = partition_dataset()
    indexes = [None] * size
    dist.all_gather_object(indexes, list(partition.index))
    flat = [i for part in indexes for i in part]
    assert len(flat) == len(set(flat)), "partitions overlap"
    assert len(partition) == int(len(synthetic_dataset()) / size)
    assert bsz == 128 / size
    report("partition", f"samples={len(partition)}")


class Net:
    """A softmax classifier with one weight matrix and bias: the training example's
    ``Net``, reduced to what NumPy can differentiate by hand."""

    def __init__(self, features=16, classes=4, seed=1234):
        rng = np.random.default_rng(seed)
        self.params = {"weight": rng.normal(scale=0.01, size=(features, classes)),
                       "bias": np.zeros(classes)}
        self.grads = {name: np.zeros_like(p) for name, p in self.params.items()}

    def parameters(self):
        return [(self.params[name], self.grads[name]) for name in sorted(self.params)]

    def loss_and_backward(self, data, target):
        """Negative log-likelihood; fills the gradients (``loss.backward()``)."""
        logits = data @ self.params["weight"] + self.params["bias"]
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        loss = -np.log(probs[np.arange(len(target)), target]).mean()
        dlogits = probs
        dlogits[np.arange(len(target)), target] -= 1
        dlogits /= len(target)
        self.grads["weight"][...] = data.T @ dlogits
        self.grads["bias"][...] = dlogits.sum(axis=0)
        return loss


def average_gradients(model):
    """Gradient averaging."""
    size = float(dist.get_world_size())
    for param, grad in model.parameters():
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        grad /= size


def run_sgd(rank, size):
    """Distributed Synchronous SGD Example."""
    train_set, bsz = partition_dataset()
    model = Net()
    lr = 0.5
    num_batches = ceil(len(train_set) / float(bsz))
    losses = []
    for epoch in range(5):
        epoch_loss = 0.0
        for data, target in batches(train_set, bsz, seed=epoch * 100 + rank):
            loss = model.loss_and_backward(data, target)
            epoch_loss += loss
            average_gradients(model)
            for param, grad in model.parameters():
                param -= lr * grad
        losses.append(epoch_loss / num_batches)
        print("Rank ", dist.get_rank(), ", epoch ", epoch, ": ", epoch_loss / num_batches)
    weights = [None] * size
    dist.all_gather_object(weights, model.params["weight"])
    assert all(np.array_equal(w, weights[0]) for w in weights), "replicas diverged"
    assert losses[-1] < losses[0] / 2, losses
    report("sgd", f"first={losses[0]:.3f}", f"last={losses[-1]:.3f}")


# -- Our own ring-allreduce ----------------------------------------------------------------
def allreduce(send, recv):
    """Implementation of a ring-reduce with addition."""
    rank = dist.get_rank()
    size = dist.get_world_size()
    send_buff = send.copy()
    recv_buff = send.copy()
    accum = send.copy()

    left = ((rank - 1) + size) % size
    right = (rank + 1) % size

    for i in range(size - 1):
        if i % 2 == 0:
            # Send send_buff
            send_req = dist.isend(send_buff, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            # Send recv_buff
            send_req = dist.isend(recv_buff, right)
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    recv[:] = accum[:]


def run_ring(rank, size):
    send = np.arange(6.0) * (rank + 1)
    recv = np.zeros(6)
    allreduce(send, recv)
    expected = send / (rank + 1) * size * (size + 1) / 2
    np.testing.assert_allclose(recv, expected)
    report("ring", f"sum={recv.sum()}")


# -- Initialization methods ----------------------------------------------------------------
def launcher_rank_and_size():
    """What ``torch.multiprocessing`` hands each process in the tutorial: here the MPI
    launcher's rank and size."""
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def init_with(method):
    """The tutorial's initialization methods: environment variables, a shared file,
    TCP (``CASE_PATH``/``CASE_PORT`` name the file and port)."""
    rank, size = launcher_rank_and_size()
    if method == "env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["CASE_PORT"],
                          WORLD_SIZE=str(size), RANK=str(rank))
        dist.init_process_group("gloo", init_method="env://")
    elif method == "file":
        dist.init_process_group(init_method="file://" + os.environ["CASE_PATH"],
                                rank=rank, world_size=size)
    else:
        dist.init_process_group(init_method=f"tcp://127.0.0.1:{os.environ['CASE_PORT']}",
                                rank=rank, world_size=size)
    store = dist.get_default_store()
    store.set(f"hello{rank}", "world")
    store.wait([f"hello{r}" for r in range(size)])
    run_ring(rank, size)
    report(f"init_{method}", f"store={type(store).__name__}")


EXAMPLES = {"template": run_nothing, "blocking": run_blocking,
            "nonblocking": run_nonblocking, "all_reduce": run_all_reduce,
            "all_reduce_legacy": run_all_reduce_legacy, "collectives": run_collectives,
            "partition": run_partition, "sgd": run_sgd, "ring": run_ring}


def launch(example):
    """The tutorial's ``__main__``: instead of forking ``size`` processes it runs in
    each process the MPI launcher started."""
    if example.startswith("init_"):
        init_with(example[len("init_"):])
    elif example.startswith("mpi_"):  # the tutorial's MPI section: init_process(0, 0, ...)
        init_process(0, 0, EXAMPLES[example[len("mpi_"):]], backend="mpi")
    else:
        rank, size = launcher_rank_and_size()
        init_process(rank, size, EXAMPLES[example])
    dist.destroy_process_group()


if __name__ == "__main__":
    launch(sys.argv[1])
