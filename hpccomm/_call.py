"""The one path every operation takes: resolve the group, validate once, dispatch.

``collectives``, ``p2p`` and ``objects`` call these helpers instead of repeating
checks: :func:`member` opens each operation with its group (or with torch's warning on
a rank outside it), :func:`rooted` does so for an operation with a root and resolves
``src``/``dst``/``group_src``/``group_dst`` (:func:`root`), :func:`array` turns an
argument into a contiguous array on a backend of the group, :func:`reduction` validates
an op for a dtype, and :func:`launch` starts the backend operation and waits for it
under the deadline, or hands back a ``Work`` (stamped with what it is, for errors and
observers) for ``async_op``.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from . import observe as _observe
from . import work as _waits
from .backends.base import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BARRIER,  # noqa: F401
                            BROADCAST, REDUCE, REDUCE_SCATTER)
from ._arrays import FAMILY, as_array, device_of, dtype_family, reduce_problem
from .errors import DistError, Undescribed
from .group import GroupLike, ProcessGroup, member_group, registry, skip
from .types import MAX_USER_TAG, RedOpType, split_op
from .work import Work, chain, failure_error, poll

ndarray = np.ndarray
_VALIDATED: dict = {}  # (plain op, dtype) -> (kind, None), once validated


def array(pg: ProcessGroup, op: str, x: Any, what: str = "tensor",
          output: bool = True) -> Tuple[Any, Any]:
    """``(backend communicator, array)`` for argument ``x`` of operation ``op``.

    Outputs must be C-contiguous and writable (results are written into them, as torch
    writes into tensors); non-contiguous inputs are copied to a contiguous array.
    """
    if type(x) is ndarray:
        flags = x.flags
        if flags.c_contiguous and (flags.writeable or not output) and x.dtype in FAMILY:
            return pg.cpu, x  # the common case, fully checked
        arr, comm = x, pg.cpu
    else:
        try:
            arr = as_array(x)
        except TypeError as exc:
            raise pg.error(op, f"{what}: {exc}") from None
        comm = pg.cpu if type(arr) is ndarray else pg.communicator(device_of(arr))
    if arr.dtype not in FAMILY and dtype_family(arr.dtype) is None:
        raise pg.error(op, f"{what} has dtype {arr.dtype}, which cannot be communicated "
                           f"(supported: bool, integers, float16/32/64, complex64/128, bfloat16)")
    flags = arr.flags
    if not flags.c_contiguous:
        if output:
            raise pg.error(op, f"{what} of shape {arr.shape} is not C-contiguous; results "
                               f"are written in place, so pass a contiguous array "
                               f"(e.g. x = np.ascontiguousarray(x)) and copy back if needed")
        arr = _library(arr).ascontiguousarray(arr)
    elif output and not getattr(flags, "writeable", True):
        raise pg.error(op, f"{what} is read-only, but results are written into it")
    return comm, arr


def _library(arr: Any) -> Any:
    """The array module (numpy or cupy) that made ``arr``."""
    if isinstance(arr, ndarray):
        return np
    return sys.modules[type(arr).__module__.split(".")[0]]


def empty(like: Any, count: int) -> Any:
    """A flat uninitialized array of ``count`` elements, same library and dtype as ``like``."""
    return _library(like).empty(count, dtype=like.dtype)


def same_device(pg: ProcessGroup, op: str, comm: Any, other: Any, what: str) -> None:
    if other is not comm:
        raise pg.error(op, f"{what} lives on a different device than the other arrays")


def same_dtype(pg: ProcessGroup, op: str, expected: Any, arr: Any, what: str) -> None:
    if arr.dtype != expected:
        raise pg.error(op, f"{what} has dtype {arr.dtype}, expected {expected} (all arrays "
                           f"of one operation share a dtype)")


def apart(arr: Any, out: Any, block: Optional[int] = None, comm: Any = None,
          pg: Optional[ProcessGroup] = None, op: str = "") -> Any:
    """``arr`` as a send buffer beside the receive buffer ``out``: itself, or a copy if the
    two overlap (MPI forbids aliased buffers). With ``block`` given, ``None`` when ``arr``
    is block ``block`` of ``out`` (``MPI_IN_PLACE``; in a group of one, ``out`` itself).

    Both are contiguous, so overlapping address ranges mean shared memory. Two NumPy
    arrays that own their memory never overlap, which settles the common case at once.
    Given ``comm`` (with ``pg`` and ``op``), a copy inside a CUDA graph capture raises
    (:func:`uncaptured`).
    """
    if arr is not out and (type(arr) is ndarray and arr.base is None and
                           type(out) is ndarray and out.base is None):
        return arr
    start, other = address(arr), address(out)
    if block is not None and (arr is out or (arr.size and
                                             start == other + block * arr.nbytes)):
        return None
    if arr.nbytes and out.nbytes and start < other + out.nbytes and other < start + arr.nbytes:
        if comm is not None:
            uncaptured(pg, op, comm, "arrays that do not overlap (or the in-place form)")
        return arr.copy()
    return arr


def address(arr: Any) -> int:
    """Address of the first element (NumPy or CuPy)."""
    if isinstance(arr, ndarray):
        return arr.ctypes.data
    return arr.data.ptr


def reduction(pg: ProcessGroup, op_name: str, op: Any, dtype: Any) -> Tuple[RedOpType, Any]:
    """``(kind, factor)`` of ``op``, after checking it is defined for ``dtype``.

    Plain ops (``ReduceOp.SUM``...) are validated once per dtype and then found in a cache.
    """
    if type(op) is RedOpType:
        found = _VALIDATED.get((op, dtype))
        if found is not None:
            return found
    try:
        kind, factor = split_op(op)
    except TypeError as exc:
        raise pg.error(op_name, str(exc)) from None
    problem = reduce_problem(kind, dtype)
    if problem is not None:
        raise pg.error(op_name, problem)
    if kind == RedOpType.PREMUL_SUM and factor is None:
        raise pg.error(op_name, "PREMUL_SUM needs a factor: use "
                                "hpccomm._make_nccl_premul_sum(factor)")
    if type(op) is RedOpType:
        _VALIDATED[(op, dtype)] = (kind, None)
    return kind, factor


def pair(pg: ProcessGroup, op: str, output: Any, input: Any, out_name: str, in_name: str
         ) -> Tuple[Any, Any, Any]:
    """``(backend communicator, output array, input array)`` on one device with one dtype;
    two contiguous NumPy arrays of a supported dtype pass with a handful of tests."""
    if type(output) is ndarray and type(input) is ndarray:
        flags, dtype = output.flags, output.dtype
        if (flags.c_contiguous and flags.writeable and input.flags.c_contiguous and
                input.dtype is dtype and dtype in FAMILY):
            return pg.cpu, output, input
    comm, out = array(pg, op, output, out_name)
    in_comm, arr = array(pg, op, input, in_name, output=False)
    same_device(pg, op, comm, in_comm, in_name)
    same_dtype(pg, op, out.dtype, arr, in_name)
    return comm, out, arr


def reduce_operand(pg: ProcessGroup, op_name: str, x: Any, op: Any, output: bool = True
                   ) -> Tuple[Any, Any, RedOpType, Any]:
    """``(backend communicator, array, kind, factor)``: :func:`array` and :func:`reduction`
    in one call, with the common case (a contiguous NumPy array, a plain op already
    validated for its dtype) answered by one cache lookup."""
    if type(x) is ndarray and type(op) is RedOpType:
        flags = x.flags
        if flags.c_contiguous and (flags.writeable or not output):
            found = _VALIDATED.get((op, x.dtype))
            if found is not None:
                return pg.cpu, x, found[0], None
    comm, arr = array(pg, op_name, x, output=output)
    kind, factor = reduction(pg, op_name, op, arr.dtype)
    return comm, arr, kind, factor


def root(pg: ProcessGroup, op: str, global_rank: Optional[int], group_rank: Optional[int],
         name: str) -> int:
    """The group rank meant by a ``src``/``dst`` pair, exactly one of which is given."""
    if group_rank is None and type(global_rank) is int:  # the common case
        found = pg.rank_of.get(global_rank)
        if found is not None:
            return found
    if group_rank is not None:
        if global_rank is not None:
            raise pg.error(op, f"give {name} or group_{name}, not both")
        pg.global_rank(group_rank, op, f"group_{name}")  # range check
        return group_rank
    if global_rank is None:
        raise pg.error(op, f"{name} (a global rank) or group_{name} (a group rank) is required")
    if not isinstance(global_rank, int) or isinstance(global_rank, bool):
        raise pg.error(op, f"{name} must be an int rank, got {global_rank!r}")
    return pg.group_rank(global_rank, op, name)


def member(group: GroupLike, op: str, peer: Optional[int] = None,
           group_peer: Optional[int] = None, name: Optional[str] = None,
           required: bool = False) -> Optional[ProcessGroup]:
    """The group of operation ``op``; ``None`` on a rank outside it, which the caller then
    returns from at once (with ``None``; ``-1`` for receives), as torch does.

    Such a rank is warned, as torch warns it, after the checks torch makes before it looks
    at membership: with ``name`` (``"src"``, ``"dst"``) given, ``peer`` and ``group_peer``
    not both, and one of them if ``required``. The warning points at the user's call.
    """
    if group is None:  # the default group, tested first: this runs on every operation
        world = registry.world
        if world is not None:
            return world
    pg = member_group(group, op)
    if pg is None:
        skip(op, peer, group_peer, name, required, stacklevel=4)
    return pg


def rooted(group: GroupLike, op: str, rank: Optional[int], group_rank: Optional[int],
           name: str, required: bool = False, default: Optional[int] = None,
           checked_outside: bool = True) -> Optional[Tuple[ProcessGroup, int]]:
    """``(group, root)`` of a rooted operation: its group and the group rank meant by
    ``rank``/``group_rank`` (:func:`root`; the global rank ``default`` when neither is
    given; ``required``: one of them must be). ``None`` on a rank outside the group, as
    from :func:`member`, after the same checks of ``rank`` and ``group_rank`` unless
    ``checked_outside`` is false (torch's ``gather`` resolves ``dst`` on members only).
    """
    if rank is None and group_rank is None:
        rank = default
    # member() and root() inlined for the common case: each call costs every operation
    pg = registry.world if group is None else None
    if pg is None:
        pg = member_group(group, op)
        if pg is None:
            skip(op, rank, group_rank, name if checked_outside else None, required,
                 stacklevel=4)
            return None
    at = pg.rank_of.get(rank) if group_rank is None and type(rank) is int else None
    if at is None:
        at = root(pg, op, rank, group_rank, name)
    return pg, at


def count_list(pg: ProcessGroup, op: str, arrays: Sequence[Any], what: str) -> list:
    """Check a per-rank list has one entry per rank; return it as a list."""
    if not isinstance(arrays, (list, tuple)):
        raise pg.error(op, f"{what} must be a list of arrays, got {type(arrays).__name__}")
    if len(arrays) != pg.size():
        raise pg.error(op, f"{what} has {len(arrays)} entries, expected one per rank "
                           f"({pg.size()})")
    return list(arrays)


# -- staging: operations on lists of arrays go through one contiguous buffer -------------
def uneven_counts(sizes: Sequence[int]) -> Optional[List[int]]:
    """``None`` when all blocks have one size (regular collective), else the counts."""
    first = sizes[0]
    return None if all(size == first for size in sizes) else list(sizes)


def scatter_into(staging: Any, outputs: Sequence[Any]):
    """A step that copies consecutive blocks of ``staging`` into ``outputs``."""
    def copy_out() -> None:
        offset = 0
        for out in outputs:
            out[...] = staging[offset:offset + out.size].reshape(out.shape)
            offset += out.size
    return copy_out


def concatenate(inputs: Sequence[Any], like: Any) -> Any:
    """The arrays ``inputs`` flattened one after the other into a new staging array of
    ``like``'s library and dtype."""
    staging = empty(like, sum(arr.size for arr in inputs))
    offset = 0
    for arr in inputs:
        staging[offset:offset + arr.size] = arr.reshape(-1)
        offset += arr.size
    return staging


def split_counts(pg: ProcessGroup, op: str, arr: Any, splits: Optional[Sequence[int]],
                 what: str) -> List[int]:
    """Element counts per rank from row splits along dim 0 (``None``: equal rows)."""
    rows = arr.shape[0] if arr.ndim else 1
    row_size = arr.size // rows if rows else 0
    if splits is None:
        if rows % pg.size():
            raise pg.error(op, f"{what} has {rows} rows, not divisible by the group size "
                               f"{pg.size()}; pass split sizes")
        return [rows // pg.size() * row_size] * pg.size()
    splits = [int(s) for s in splits]
    if len(splits) != pg.size() or any(s < 0 for s in splits) or sum(splits) != rows:
        raise pg.error(op, f"{what} split sizes {splits} must be {pg.size()} non-negative "
                           f"row counts summing to {rows}")
    return [s * row_size for s in splits]


def launch(pg: ProcessGroup, op: str, start: Callable[..., Any], args: tuple, arr: Any,
           async_op: bool, peer: Optional[int] = None, timeout: Optional[float] = None,
           result: Sequence[Any] = (), after: Optional[Callable[[], Any]] = None,
           keep: Any = None) -> Any:
    """Start ``start(*args)``; return its Work if ``async_op``, else wait for it.

    ``after`` runs once the backend's own finishing step is done (copy results out of a
    staging buffer); ``keep`` stays alive until completion (the staging buffers).
    A synchronous call polls the backend's ``test`` under the deadline and builds no
    :class:`Work` (a Work is made only to describe an error, or for observers); it
    returns what the finishing step returned: a receive's source (group rank), else
    ``None``. Observers of operations (:mod:`.observe`: the DETAIL checks, the flight
    recorder) run before the start, at the start and at completion; with none
    registered they cost one module-attribute test.
    """
    observed = _observe.active
    if observed:  # the checks due before the start; then: does each operation need a Work?
        _observe.before_start(pg, op, args, arr, peer, timeout)
        observed = _observe.tracks_work
    try:
        started = start(*args)
    except Undescribed as exc:  # found at the start: differing calls, absent ranks
        raise _start_failed(pg, op, exc, arr) from None
    except DistError:
        raise
    except Exception as exc:
        raise _start_failed(pg, op, exc) from exc
    seq = pg.seq = pg.seq + 1
    if async_op or observed or type(started) is not tuple:
        work = _work(started, pg, op, seq, arr, peer, timeout, result, after, keep)
        if observed:
            _watch(work)
        if async_op:
            pg.track(work)  # kept until finished; barrier() waits for collectives
            return work
        work.wait()
        return work.value
    test, finish, _ = started
    try:
        if not test():
            limit = pg.timeout if timeout is None else timeout
            waited = poll(test, limit)
            if waited:
                _work(started, pg, op, seq, arr, peer, timeout, result, after,
                      keep).timed_out(waited, limit)
        value = None if finish is None else finish()
        if after is not None:
            after()
        return value
    except Undescribed as exc:  # found as it ran: the ranks called different ones
        raise _start_failed(pg, op, exc, arr) from None
    except DistError:
        raise
    except BaseException as exc:  # MPI or copy-out failure: described like a Work's
        work = _work(started, pg, op, seq, arr, peer, timeout, result, after, keep)
        raise work.fail(exc) from exc


def sum_in_place(pg: ProcessGroup, op: str, address: int, count: int, nbytes: int,
                 datatype: int, timeout: Optional[float], arr: Any, keep: Any) -> bool:
    """A synchronous in-place SUM all-reduce of ``count`` elements at ``address`` in the
    backend's direct form
    (:meth:`~hpccomm.backends.mpi.communicator.MPICommunicator.sum_in_place_at`),
    the caller having checked the buffer (contiguous, on the CPU, ``datatype`` from the
    backend's ``direct_types``) and keeping it alive. ``True`` once done; ``False``, with
    nothing started, where only the general path (:func:`launch`) applies: ``nbytes``
    at or above the backend's ``direct_below``, observers registered, or other
    operations that a wait must advance. ``arr`` describes the operation in errors (it
    needs ``shape`` and ``dtype``); ``keep`` outlives the operation, even a timed-out one.
    """
    cpu = pg.cpu
    if nbytes >= cpu.direct_below or _observe.active or _waits.while_waiting is not None:
        return False
    limit = pg.timeout if timeout is None else timeout
    seq = pg.seq = pg.seq + 1
    try:
        running = cpu.sum_in_place_at(address, count, datatype, limit)
    except Undescribed as exc:
        raise _start_failed(pg, op, exc, arr) from None
    except Exception as exc:
        raise _start_failed(pg, op, exc) from exc
    if running is not None:  # still running after the spin: waited as any operation
        _work(running, pg, op, seq, arr, None, timeout, (), None, keep).wait()
    return True


def transfer(group: GroupLike, op: str, receive: bool, tensor: Any, rank: Any, tag: Any
             ) -> bool:
    """A blocking send (``receive`` false) or receive of ``tensor`` to or from global rank
    ``rank`` on ``group`` (``None``: the default group) with ``tag``, in the backend's
    direct form (:attr:`~hpccomm.backends.base.Communicator.transfer_now`). ``True``
    once done; ``False``, with nothing started and nothing checked, where only the
    general path (:func:`launch`), whose checks word every mistake, applies: another
    group form, a peer that is no other member, a tag outside the user's range, not a
    C-contiguous NumPy array of a predefined dtype (writable, to receive), no direct
    form, observers registered, or other operations that a wait must advance. One
    frame: at 8 bytes the direct form itself takes about a microsecond per message.
    """
    if group is None:
        pg = registry.world
        if pg is None:
            return False
    elif type(group) is ProcessGroup and group.live:
        pg = group
    else:
        return False
    if (type(tensor) is not np.ndarray or type(rank) is not int or type(tag) is not int
            or not 0 <= tag <= MAX_USER_TAG or _observe.active
            or _waits.while_waiting is not None):
        return False
    peer = pg.rank_of.get(rank)
    cpu = pg.cpu
    now = cpu.transfer_now
    if peer is None or now is None or peer == pg.rank():
        return False
    limit, spin = pg.timeout, cpu.transfer_slice
    try:  # the direct form finds the count and datatype from the array's buffer
        running = now(receive, tensor, peer, tag,
                      spin if limit is None or limit > spin else limit)
    except Exception as exc:
        failure = cpu.transfer_error(exc)
        raise _start_failed(pg, op, failure) from failure
    if running is None:
        pg.seq += 1
        return True
    if running is False:
        return False
    pg.seq += 1  # still running after the spin: waited as any operation
    _work(cpu.transfer_running(running), pg, op, pg.seq, tensor, rank, None, (), None,
          tensor).wait()
    return True


def small(pg: ProcessGroup, op: str, code: int, send: Any, recv: Any, redop: Any = 0,
          root: int = 0) -> bool:
    """A synchronous operation on the backend's small channel, whole in native code
    (:attr:`~hpccomm.backends.base.Communicator.small_run`): ``True`` once done;
    ``False``, with nothing started, where the general path (:func:`launch`) applies: no
    channel, observers registered, other operations that a wait must advance, or an
    operation the channel does not take from here (it may still take it from the general
    path: the choice of channel never depends on this rank's state). The channel checks
    the arguments it takes; everything else is checked by the general path.
    """
    run = pg.cpu.small_run
    if run is None or _observe.active or _waits.while_waiting is not None:
        return False
    try:
        running = run(code, send, recv, redop, root)
    except Undescribed as exc:  # the ranks called different collectives
        raise _start_failed(pg, op, exc, recv if recv is not None else send) from None
    if running < 0:
        return False
    seq = pg.seq = pg.seq + 1
    if running:  # still running after the spin: waited as any operation
        _work(pg.cpu.small.started(running), pg, op, seq, recv, None, None, (), None,
              None).wait()
    return True


def stream(pg: ProcessGroup, op: str, code: int, send: Any, recv: Any, redop: Any = 0,
           root: int = 0) -> bool:
    """A synchronous operation on GPU arrays enqueued whole on the caller's CUDA stream
    by the group's CUDA backend
    (:attr:`~hpccomm.backends.base.Communicator.stream_run`): ``True`` once enqueued,
    which is all a synchronous GPU call waits for (torch's semantics); ``False``, with
    nothing started, where the general path (:func:`launch`) applies: no such backend
    (yet), observers registered, or a call the backend leaves to the general path
    (which then also checks the arguments). Builds no Work.
    """
    run = pg.stream_run
    if run is None or _observe.active:
        return False
    try:
        if run(code, send, recv, redop, root):
            return False
    except DistError:
        raise
    except Exception as exc:
        raise _start_failed(pg, op, exc) from exc
    pg.seq += 1
    return True


def uncaptured(pg: ProcessGroup, op: str, comm: Any, instead: str) -> None:
    """Raise if ``comm``'s caller is capturing a CUDA graph: ``op`` stages through
    temporary buffers made per call, which a graph would go on using after they are
    freed (``instead`` says what to call)."""
    if comm.capturing():
        raise pg.error(op, f"cannot be captured in a CUDA graph: it stages through a "
                           f"temporary buffer made per call; use {instead}")


def _start_failed(pg: ProcessGroup, op: str, exc: BaseException, arr: Any = None
                  ) -> DistError:
    """The error of an operation that failed as it started (a failed peer, a revoked or
    broken communicator, ranks calling different collectives: then ``arr``, this rank's
    array, says what this rank called)."""
    shape = getattr(arr, "shape", None)
    called = f" with shape {tuple(shape)} {arr.dtype}" if shape is not None else ""
    return failure_error(pg.at(f"{op}{called}"), pg, exc)


def _watch(work: Work) -> None:
    """Report ``work``'s start to the observers now, and its completion when it completes.

    A function of its own: a closure over ``work`` inside :func:`launch` would make
    ``work`` a cell there, which costs every call, observed or not.
    """
    _observe.started(work)
    work.add_finish(lambda: _observe.completed(work))


def _work(started: Any, pg: ProcessGroup, op: str, seq: int, arr: Any, peer: Optional[int],
          timeout: Optional[float], result: Sequence[Any], after: Optional[Callable[[], Any]],
          keep: Any) -> Work:
    """The Work of a started operation, stamped with what it is (errors, observers)."""
    if type(started) is tuple:
        test, finish, held = started
        work = Work(test, chain(finish, after), held if keep is None else (held, keep),
                    result)
    else:  # a backend's own Work (NCCL: completion is ordered on a CUDA stream)
        work = started
        if after is not None:
            work.add_finish(after)
        if keep is not None:
            work.hold(keep)
        if result:
            work.set_result(result)
    work.seq = seq
    work.group = pg
    work.op = op
    work.arr = arr
    if peer is not None:
        work.peer = peer
    work.timeout = pg.timeout if timeout is None else timeout
    return work
