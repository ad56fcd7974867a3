"""The operations of hpccomm's torch groups on CPU tensors, one method each.

torch calls these methods on a group (``allreduce``, ``all_gather_single``,
``reduce_scatter_single_coalesced``...) from its Python wrappers and, through its
``ProcessGroup`` and ``Backend`` trampolines, from C++ (functional collectives, DDP).
:class:`TensorOperations` holds them once for the two classes that answer torch:
:class:`~hpccomm.torch.process_group.ProcessGroupHPC`, the group torch's Python code
calls directly, and :class:`~hpccomm.torch.backend.BackendHPC`, the c10d backend
registered on it for the CPU.

Each method turns the tensors into NumPy views of their memory (:mod:`._tensors`),
validates them with hpccomm's shared helpers (:mod:`hpccomm._call`) and starts one
nonblocking operation on the group's MPI communicator through hpccomm's MPI backend,
the same path as ``hpccomm.all_reduce`` on NumPy arrays. A synchronous call
(``opts.asyncOp`` false, what torch's wrappers pass for ``async_op=False``) polls the
request on the calling thread and returns a completed Work; an asynchronous one returns
a :class:`~hpccomm.torch.work.PendingWork`.

Around every method, :func:`_operation` sends tensors on another device to the group's
CUDA backend, turns a tensor MPI cannot take into an error naming the operation, and,
while torch's profiler runs or hooks are registered, records the operation's profiler
event (:mod:`.profiling`) and fires the group's pre/post hooks (:mod:`.hooks`).

Group ranks are torch's group ranks; the group's communicator numbers its ranks the
same way.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.autograd.profiler as _profiler
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from .. import _call
from ..diagnostics.monitored_barrier import run_on as _monitored_barrier_on
from ..errors import DistBackendError
from ..types import MAX_USER_TAG, timeout_seconds
from ..work import chain
from . import _tensors
from .errors import for_torch
from .flight_recorder import FINISHED as _FINISHED
from .profiling import Record, title
from .work import DONE, PendingWork

_reduce_op = _tensors.reduce_op
_timeout_of = _tensors.timeout_of
_view = _tensors.view
_lasting_view = _tensors.lasting_view
_REDUCIBLE = _tensors.REDUCIBLE
_launch = _call.launch
_sum_in_place = _call.sum_in_place
_TORCH_SUM = dist.ReduceOp.SUM
_time_ns = time.time_ns


def _output(t: torch.Tensor) -> Tuple[Any, Optional[Callable[[], None]]]:
    """The common case inline: a contiguous tensor is its own buffer."""
    if t.is_contiguous():
        return _view(t), None
    return _tensors.output(t)


# -- what an operation shows its watchers: (inputs, outputs, root, async_op) ----------------
Shown = Tuple[Sequence[torch.Tensor], Sequence[torch.Tensor], int, bool]


def _opts(args: tuple, index: int) -> Any:
    return args[index] if len(args) > index else None


def _async(opts: Any) -> bool:
    return bool(opts is not None and opts.asyncOp)


def _flat(lists: Sequence[Sequence[torch.Tensor]]) -> List[torch.Tensor]:
    return [t for tensors in lists for t in tensors]


def _in_place(args: tuple) -> Shown:  # (tensors, opts)
    return args[0], args[0], -1, _async(_opts(args, 1))


def _rooted(args: tuple) -> Shown:  # (tensors, opts) with opts.rootRank
    opts = _opts(args, 1)
    return args[0], args[0], (opts.rootRank if opts is not None else 0), _async(opts)


def _gathered(args: tuple) -> Shown:  # (output lists, inputs, opts)
    return args[1], _flat(args[0]), -1, _async(_opts(args, 2))


def _gathered_at_root(args: tuple) -> Shown:
    opts = _opts(args, 2)
    return args[1], _flat(args[0]), (opts.rootRank if opts is not None else 0), _async(opts)


def _scattered(args: tuple) -> Shown:  # (outputs, input lists, opts)
    opts = _opts(args, 2)
    return (_flat(args[1]), args[0], getattr(opts, "rootRank", -1) if opts is not None
            else -1, _async(opts))


def _lists(args: tuple) -> Shown:  # (outputs, inputs, opts)
    return args[1], args[0], -1, _async(_opts(args, 2))


def _single(args: tuple) -> Shown:  # (output, input, [splits, splits,] opts)
    return [args[1]], [args[0]], -1, _async(args[-1] if len(args) in (3, 5) else None)


def _single_at_root(args: tuple) -> Shown:  # (output, input, opts)
    opts = _opts(args, 2)
    return [args[1]], [args[0]], (opts.rootRank if opts is not None else 0), _async(opts)


def _nothing(args: tuple) -> Shown:  # (opts)
    return [], [], -1, _async(_opts(args, 0))


def _sent(args: tuple) -> Shown:  # (tensors, peer, tag)
    return args[0], [], -1, True


def _received(args: tuple) -> Shown:  # (tensors, [peer,] tag)
    return [], args[0], -1, True


def _first(args: tuple) -> Any:
    """The first tensor of the first argument (a list of tensors)."""
    return args[0][0]


def _first_of_second(args: tuple) -> Any:
    """The first tensor of the second argument (the inputs after the outputs)."""
    return args[1][0]


def _tensor_arg(args: tuple) -> Any:
    """The first argument, itself a tensor."""
    return args[0]


def _no_tensor(args: tuple) -> Any:
    return None


def _operation(op: str, first: Callable[[tuple], Any], nccl: Optional[str] = None,
               spec: Callable[[tuple], Shown] = _in_place, event: Optional[str] = None
               ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """What every operation method shares, around its CPU body: tensors on another device
    go to the group's CUDA backend (its method ``nccl``, default the same name), found
    by ``first(args)`` (the first tensor, ``None`` for empty lists); a tensor MPI cannot
    take becomes an error naming ``op``, this rank and this group, raised before
    anything is communicated; while a profiler runs or hooks are registered, the call is
    shown to them as ``spec(args)`` describes it (its profiler event named after
    ``event``, default ``op``)."""
    shown_as = event or op

    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        name = nccl or method.__name__

        @functools.wraps(method)
        def run(self: "TensorOperations", *args: Any, **kwargs: Any) -> Any:
            try:
                tensor = first(args)
            except (IndexError, TypeError):
                tensor = None
            if tensor is not None and not tensor.is_cpu:
                return getattr(self._cuda(op, tensor), name)(*args, **kwargs)
            trace = self._state.trace
            if trace is not None:
                try:
                    shown = spec(args)
                except (IndexError, TypeError, AttributeError):  # arguments by keyword, or
                    shown = None  # missing: the method itself says what is wrong
                if shown is not None:
                    return self._traced(trace, op, shown_as, shown, method, args, kwargs)
            if _profiler._is_profiler_enabled or self._state.watch is not None:
                return self._watched(op, shown_as, spec(args), method, args, kwargs)
            try:
                return method(self, *args, **kwargs)
            except _tensors.Unsupported as exc:
                raise self._host.error(op, str(exc)) from None
        return run
    return decorate


def _issued(entry: list, work: Any) -> None:
    """The call recorded as ``entry`` returned ``work``: stamped complete now, or when
    its Work completes."""
    if isinstance(work, PendingWork):
        work.trace(entry)
    else:
        entry[_FINISHED] = True


def _combine(parts: Sequence[Any]) -> Any:
    """Several started operations as one ``(test, finish, keep)``."""
    tests = [part[0] for part in parts]
    finish = None
    for part in parts:
        finish = chain(finish, part[1])

    def test() -> bool:
        while tests:
            if not tests[-1]():
                return False
            tests.pop()
        return True
    return test, finish, [part[2] for part in parts]


class TensorOperations:
    """torch's operations on CPU tensors over one hpccomm group.

    A class using it sets ``_host`` (the hpccomm group), ``_state`` (its
    :class:`~hpccomm.torch.hooks.GroupState`), ``_direct`` (torch dtype -> (MPI
    datatype, itemsize), what all_reduce's direct form takes) and defines ``rank()``,
    ``size()`` and ``_cuda(op, tensor)`` (the backend for a tensor on another device).
    """

    _host: Any
    _state: Any
    _direct: Any
    _cuda: Callable[[str, torch.Tensor], Any]

    def use_host(self, host: Any) -> None:
        """Run the operations on ``host`` (an hpccomm group) from now on: the group was
        reconfigured over other processes (:mod:`hpccomm.torch.reconfigure`)."""
        self._host = host

    # -- dispatch --------------------------------------------------------------------------
    def _run(self, op: str, start: Callable[..., Any], args: tuple, arr: Any, opts: Any,
             outputs: List[Any], after: Optional[Callable[[], None]] = None,
             keep: Any = None) -> dist.Work:
        async_op = opts.asyncOp
        try:  # the tensors stay alive while MPI may use them (views need not hold them)
            outcome = _launch(self._host, op, start, args, arr, async_op, None,
                              _timeout_of(opts), (), after,
                              outputs if keep is None else (outputs, keep))
        except DistBackendError as exc:
            self._state.failed(exc)
            raise for_torch(exc) from None
        if async_op:
            return PendingWork(outcome, outputs, self._state.failed).share()
        return DONE

    def _run_all(self, op: str, starts: List[Tuple[Callable[..., Any], tuple]], arr: Any,
                 opts: Any, outputs: List[Any], after: Optional[Callable[[], None]] = None,
                 keep: Any = None) -> dist.Work:
        """Several operations started together, completed as one Work (coalesced calls)."""
        def start_all() -> Any:
            return _combine([start(*args) for start, args in starts])
        return self._run(op, start_all, (), arr, opts, outputs, after, keep)

    def _watched(self, op: str, event: str, shown: Shown, method: Callable[..., Any],
                 args: tuple, kwargs: dict) -> Any:
        """``method`` (operation ``op``) run with its profiler event (named after
        ``event``) and the group's hooks around it."""
        inputs, outputs, root, async_op = shown
        record = None
        if _profiler._is_profiler_enabled:  # a receive's event shows its buffer
            record = Record(title(self._state.backend_name, event), inputs or outputs)
        watch = self._state.watch
        op_id = watch.before(op, async_op, root, inputs, outputs) if watch is not None else 0
        try:
            work = method(self, *args, **kwargs)
        except _tensors.Unsupported as exc:
            if record is not None:
                record.end()
            raise self._host.error(op, str(exc)) from None
        except BaseException:
            if record is not None:
                record.end()
            raise
        if record is not None:
            if isinstance(work, PendingWork):
                work.end_with(record)
            else:
                record.end()
        if watch is not None:
            watch.after(op, async_op, op_id, work)
        return work

    def _traced(self, trace: Any, op: str, event: str, shown: Shown,
                method: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``method`` (operation ``op``) recorded in the flight recorder: an entry when it
        is issued, stamped when it completes; the call itself as :func:`_operation` runs
        it. A call refused before anything was communicated leaves no entry."""
        inputs, outputs, _, _ = shown
        peer = args[1] if op in ("send", "recv") and event != "recv_anysource" else None
        entry = trace.record(op, inputs, outputs, peer, op == "recv")
        try:
            if _profiler._is_profiler_enabled or self._state.watch is not None:
                work = self._watched(op, event, shown, method, args, kwargs)
            else:
                try:
                    work = method(self, *args, **kwargs)
                except _tensors.Unsupported as exc:
                    raise self._host.error(op, str(exc)) from None
        except (ValueError, TypeError):  # a mistake in the call: no peer waits for it
            trace.drop(entry)
            raise
        _issued(entry, work)
        return work

    def _one(self, op: str, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(tensors) != 1:
            raise self._host.error(op, f"expected a list of one tensor, got {len(tensors)} "
                                       f"(one tensor per process, as torch's CPU backends)")
        return tensors[0]

    # -- collectives -------------------------------------------------------------------------
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        """The hottest call, inline for one contiguous CPU tensor while nothing watches
        (a blocking SUM in the MPI backend's direct form where it fits); anything else
        takes :meth:`_allreduce`."""
        state = self._state
        if (opts is None or len(tensors) != 1 or _profiler._is_profiler_enabled
                or state.watch is not None):
            return self._allreduce(tensors, opts)
        t = tensors[0]
        op = opts.reduceOp  # read once: each pybind11 read builds a copy
        trace = state.trace
        entry = None  # its flight recorder entry, made just before it starts
        if not opts.asyncOp:
            dtype = t.dtype
            direct = self._direct.get(dtype)
            try:
                fits = (direct is not None and t.is_cpu and t.is_contiguous()
                        and not t.is_neg() and op == _TORCH_SUM)
            except RuntimeError:  # a sparse or other non-strided tensor: the general way
                fits = False
            if fits:
                count = t.numel()
                if trace is not None:  # trace.one("all_reduce", ...), inline: every ns counts
                    trace.ops = n = trace.ops + 1
                    entry = [n, "all_reduce", trace.p2p, t.shape, dtype, _time_ns(), None]
                    trace.ring[n % trace.size] = entry
                try:
                    if _sum_in_place(self._host, "all_reduce", t.data_ptr(), count,
                                     count * direct[1], direct[0], _timeout_of(opts), t,
                                     tensors):
                        if entry is not None:
                            entry[_FINISHED] = True
                        return DONE
                except DistBackendError as exc:
                    state.failed(exc)
                    raise for_torch(exc) from None
        try:  # a contiguous CPU tensor, viewed once (kept by _run)
            arr = _lasting_view(t) if t.is_contiguous() and t.dtype in _REDUCIBLE else None
        except (RuntimeError, TypeError):  # CUDA, an unviewable dtype: the general way
            arr = None
        if arr is None:
            if entry is not None:  # the general way records it itself
                trace.drop(entry)
            return self._allreduce(tensors, opts)
        comm, arr, kind, factor = _call.reduce_operand(self._host, "all_reduce", arr,
                                                       _reduce_op(op))
        if trace is None:
            return self._run("all_reduce", comm.all_reduce, (arr, kind, factor), arr, opts,
                             tensors)
        if entry is None:
            entry = trace.one("all_reduce", t.shape, t.dtype)
        work = self._run("all_reduce", comm.all_reduce, (arr, kind, factor), arr, opts,
                         tensors)
        _issued(entry, work)
        return work

    @_operation("all_reduce", _first, "allreduce", _in_place)
    def _allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or _c10d.AllreduceOptions()
        t = tensors[0] if len(tensors) == 1 else self._one("all_reduce", tensors)
        arr, back = _output(_tensors.reducible(t))
        comm, arr, kind, factor = _call.reduce_operand(self._host, "all_reduce", arr,
                                                       _reduce_op(opts.reduceOp))
        return self._run("all_reduce", comm.all_reduce, (arr, kind, factor), arr, opts,
                         tensors, back)

    @_operation("all_reduce_coalesced", _first, spec=_in_place)
    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or _c10d.AllreduceCoalescedOptions()
        op, starts, backs = _reduce_op(opts.reduceOp), [], []
        for t in tensors:
            arr, back = _output(_tensors.reducible(t))
            comm, arr, kind, factor = _call.reduce_operand(self._host, "all_reduce_coalesced",
                                                           arr, op)
            starts.append((comm.all_reduce, (arr, kind, factor)))
            backs.append(back)
        return self._run_all("all_reduce_coalesced", starts, None, opts, tensors,
                             _steps(backs))

    @_operation("broadcast", _first, spec=_rooted)
    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or _c10d.BroadcastOptions()
        t = self._one("broadcast", tensors)
        root = self._root("broadcast", opts.rootRank)
        arr, back = _output(t)
        comm, arr = _call.array(self._host, "broadcast", arr)
        return self._run("broadcast", comm.broadcast, (arr, root), arr, opts, tensors, back)

    @_operation("reduce", _first, spec=_rooted)
    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or _c10d.ReduceOptions()
        t = self._one("reduce", tensors)
        root = self._root("reduce", opts.rootRank)
        arr, back = _output(_tensors.reducible(t))
        comm, arr, kind, factor = _call.reduce_operand(self._host, "reduce", arr,
                                                       _reduce_op(opts.reduceOp))
        return self._run("reduce", comm.reduce, (arr, kind, factor, root), arr, opts,
                         tensors, back)

    @_operation("all_gather", _first_of_second, spec=_gathered)
    def allgather(self, output_tensors: List[List[torch.Tensor]],
                  input_tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or _c10d.AllgatherOptions()
        op = "all_gather"
        t = self._one(op, input_tensors)
        outputs = self._one(op, output_tensors)
        comm, arr = _call.array(self._host, op, _tensors.inputs(t), output=False)
        outs = self._arrays(op, comm, arr.dtype, outputs, "output_tensors")
        counts = [out.size for out in outs]
        if counts[self.rank()] != arr.size:
            raise self._host.error(op, f"input has {arr.size} elements but output "
                                       f"{self.rank()} has {counts[self.rank()]}")
        staging = _call.empty(arr, sum(counts))
        return self._run(op, comm.all_gather, (arr.reshape(-1), staging,
                                               _call.uneven_counts(counts)), arr, opts,
                         output_tensors, _call.scatter_into(staging, outs), staging)

    @_operation("all_gather_coalesced", _first_of_second, spec=_gathered)
    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]],
                            input_tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        """``output_lists[r][i]`` receives input ``i`` of rank ``r``: one list per rank, as
        torch documents it and gloo fills it."""
        opts = opts or _c10d.AllgatherOptions()
        op = "all_gather_coalesced"
        lists = _call.count_list(self._host, op, output_lists, "output_tensor_lists")
        for r, outputs in enumerate(lists):
            if len(outputs) != len(input_tensors):
                raise self._host.error(op, f"output_tensor_lists[{r}] has {len(outputs)} "
                                           f"tensors for {len(input_tensors)} inputs (one "
                                           f"list per rank, one tensor per input)")
        starts, steps, keep = [], [], []
        for i, t in enumerate(input_tensors):
            comm, arr = _call.array(self._host, op, _tensors.inputs(t), output=False)
            outs = self._arrays(op, comm, arr.dtype, [outputs[i] for outputs in lists],
                                f"output_tensor_lists[r][{i}] for r")
            counts = [out.size for out in outs]
            if counts[self.rank()] != arr.size:
                raise self._host.error(op, f"input {i} has {arr.size} elements but "
                                           f"output_tensor_lists[{self.rank()}][{i}] has "
                                           f"{counts[self.rank()]}")
            staging = _call.empty(arr, sum(counts))
            starts.append((comm.all_gather, (arr.reshape(-1), staging,
                                             _call.uneven_counts(counts))))
            steps.append(_call.scatter_into(staging, outs))
            keep.append(staging)
        return self._run_all(op, starts, None, opts, output_lists, _steps(steps), keep)

    def _gather_into(self, op: str, output: torch.Tensor, input: torch.Tensor
                     ) -> Tuple[Any, Tuple[Any, Any, None], Optional[Callable[[], None]]]:
        """``(communicator, all_gather args, copy-back)`` for one tensor-into-tensor gather;
        an input that is this rank's block of the output gathers in place."""
        out, back = _output(output)
        comm, out, arr = _call.pair(self._host, op, out, _tensors.inputs(input),
                                    "output_tensor", "input_tensor")
        if out.size != arr.size * self.size():
            raise self._host.error(op, f"output_tensor has {out.size} elements, expected "
                                       f"{self.size()} x {arr.size} (group size x input)")
        return comm, (_call.apart(arr, out, block=self.rank()), out, None), back

    @_operation("all_gather_into_tensor", _tensor_arg, "_allgather_base", _single)
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> dist.Work:
        opts = opts or _c10d.AllgatherOptions()
        op = "all_gather_into_tensor"
        comm, args, back = self._gather_into(op, output, input)
        return self._run(op, comm.all_gather, args, args[1], opts, [output], back)

    _allgather_base = all_gather_single

    @_operation("all_gather_into_tensor_coalesced", _first,
                "allgather_into_tensor_coalesced", _lists)
    def all_gather_single_coalesced(self, outputs: List[torch.Tensor],
                                    inputs: List[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or _c10d.AllgatherOptions()
        op = "all_gather_into_tensor_coalesced"
        starts, backs = [], []
        for output, input in zip(outputs, inputs):
            comm, args, back = self._gather_into(op, output, input)
            starts.append((comm.all_gather, args))
            backs.append(back)
        return self._run_all(op, starts, None, opts, list(outputs), _steps(backs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    @_operation("gather", _first_of_second, spec=_gathered_at_root)
    def gather(self, output_tensors: List[List[torch.Tensor]],
               input_tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or _c10d.GatherOptions()
        op = "gather"
        t = self._one(op, input_tensors)
        root = self._root(op, opts.rootRank)
        comm, arr = _call.array(self._host, op, _tensors.inputs(t), output=False)
        if self.rank() != root:
            if output_tensors and any(output_tensors):
                raise self._host.error(op, "gather_list must be empty on ranks other than "
                                           "the destination")
            return self._run(op, comm.gather, (arr.reshape(-1), None, root, []), arr, opts,
                             [])
        outs = self._arrays(op, comm, arr.dtype, self._one(op, output_tensors), "gather_list")
        counts = [out.size for out in outs]
        if counts[root] != arr.size:
            raise self._host.error(op, f"tensor has {arr.size} elements but gather_list"
                                       f"[{root}] has {counts[root]}")
        staging = _call.empty(arr, sum(counts))
        return self._run(op, comm.gather, (arr.reshape(-1), staging, root, counts), arr, opts,
                         output_tensors, _call.scatter_into(staging, outs), staging)

    @_operation("gather_single", _tensor_arg, "gather_single", _single_at_root)
    def gather_single(self, output: torch.Tensor, input: torch.Tensor,
                      opts: Any = None) -> dist.Work:
        """torch 2.14's ``gather_single``: the inputs of every rank, in rank order, into
        one tensor on the root (of group size x input elements; unused elsewhere)."""
        opts = opts or _c10d.GatherOptions()
        op = "gather_single"
        root = self._root(op, opts.rootRank)
        comm, arr = _call.array(self._host, op, _tensors.inputs(input), output=False)
        if self.rank() != root:
            return self._run(op, comm.gather, (arr.reshape(-1), None, root, None), arr, opts,
                             [])
        out, back = _output(output)
        comm, out, arr = _call.pair(self._host, op, out, arr, "gather_tensor", "tensor")
        if out.size != arr.size * self.size():
            raise self._host.error(op, f"gather_tensor has {out.size} elements, expected "
                                       f"{self.size()} x {arr.size} (group size x tensor)")
        return self._run(op, comm.gather, (_call.apart(arr, out).reshape(-1), out.reshape(-1),
                                           root, None), arr, opts, [output], back)

    gather_into_tensor = gather_single

    @_operation("scatter", _first, spec=_scattered)
    def scatter(self, output_tensors: List[torch.Tensor],
                input_tensors: List[List[torch.Tensor]], opts: Any = None) -> dist.Work:
        opts = opts or _c10d.ScatterOptions()
        op = "scatter"
        t = self._one(op, output_tensors)
        root = self._root(op, opts.rootRank)
        out, back = _output(t)
        comm, out = _call.array(self._host, op, out)
        if self.rank() != root:
            if input_tensors and any(input_tensors):
                raise self._host.error(op, "scatter_list must be empty on ranks other than "
                                           "the source")
            return self._run(op, comm.scatter, (None, out.reshape(-1), root, []), out, opts,
                             output_tensors, back)
        ins = self._arrays(op, comm, out.dtype, self._one(op, input_tensors), "scatter_list",
                           output=False)
        counts = [arr.size for arr in ins]
        if counts[root] != out.size:
            raise self._host.error(op, f"tensor has {out.size} elements but scatter_list"
                                       f"[{root}] has {counts[root]}")
        staging = _call.concatenate(ins, out)
        return self._run(op, comm.scatter, (staging, out.reshape(-1), root, counts), out, opts,
                         output_tensors, back, staging)

    @_operation("reduce_scatter", _first, spec=_scattered)
    def reduce_scatter(self, output_tensors: List[torch.Tensor],
                       input_tensors: List[List[torch.Tensor]], opts: Any = None) -> dist.Work:
        opts = opts or _c10d.ReduceScatterOptions()
        op = "reduce_scatter"
        t = self._one(op, output_tensors)
        out, back = _output(_tensors.reducible(t))
        comm, out = _call.array(self._host, op, out, "output")
        ins = self._arrays(op, comm, out.dtype, self._one(op, input_tensors), "input_list",
                           output=False)
        counts = [arr.size for arr in ins]
        if counts[self.rank()] != out.size:
            raise self._host.error(op, f"output has {out.size} elements but input_list"
                                       f"[{self.rank()}] has {counts[self.rank()]}")
        kind, factor = _call.reduction(self._host, op, _reduce_op(opts.reduceOp), out.dtype)
        staging = _call.concatenate(ins, out)
        return self._run(op, comm.reduce_scatter, (staging, out.reshape(-1), kind, factor,
                                                   _call.uneven_counts(counts)), out, opts,
                         output_tensors, back, staging)

    def _scatter_reduced(self, op: str, output: torch.Tensor, input: torch.Tensor, red: Any
                         ) -> Tuple[Any, tuple, Optional[Callable[[], None]]]:
        """``(communicator, reduce_scatter args, copy-back)`` for a tensor-into-tensor
        reduce-scatter."""
        out, back = _output(_tensors.reducible(output))
        comm, out, arr = _call.pair(self._host, op, out, _tensors.inputs(input), "output",
                                    "input")
        if arr.size != out.size * self.size():
            raise self._host.error(op, f"input has {arr.size} elements, expected "
                                       f"{self.size()} x {out.size} (group size x output)")
        kind, factor = _call.reduction(self._host, op, red, out.dtype)
        return comm, (_call.apart(arr, out), out, kind, factor, None), back

    @_operation("reduce_scatter_tensor", _tensor_arg, "_reduce_scatter_base", _single)
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> dist.Work:
        opts = opts or _c10d.ReduceScatterOptions()
        op = "reduce_scatter_tensor"
        comm, args, back = self._scatter_reduced(op, output, input, _reduce_op(opts.reduceOp))
        return self._run(op, comm.reduce_scatter, args, args[1], opts, [output], back)

    _reduce_scatter_base = reduce_scatter_single

    @_operation("reduce_scatter_tensor_coalesced", _first,
                "reduce_scatter_tensor_coalesced", _lists)
    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor],
                                        inputs: List[torch.Tensor], opts: Any = None
                                        ) -> dist.Work:
        opts = opts or _c10d.ReduceScatterOptions()
        op = "reduce_scatter_tensor_coalesced"
        red, starts, backs = _reduce_op(opts.reduceOp), [], []
        for output, input in zip(outputs, inputs):
            comm, args, back = self._scatter_reduced(op, output, input, red)
            starts.append((comm.reduce_scatter, args))
            backs.append(back)
        return self._run_all(op, starts, None, opts, list(outputs), _steps(backs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @_operation("all_to_all", _first_of_second, spec=_lists)
    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> dist.Work:
        opts = opts or _c10d.AllToAllOptions()
        op = "all_to_all"
        first = _tensors.inputs(_call.count_list(self._host, op, input_tensors,
                                                 "input_tensor_list")[0])
        comm, first = _call.array(self._host, op, first, output=False)
        ins = self._arrays(op, comm, first.dtype, input_tensors, "input_tensor_list",
                           output=False)
        outs = self._arrays(op, comm, first.dtype, output_tensors, "output_tensor_list")
        staging_in = _call.concatenate(ins, first)
        staging_out = _call.empty(first, sum(out.size for out in outs))
        return self._run(op, comm.all_to_all, (staging_in, staging_out, [a.size for a in ins],
                                               [o.size for o in outs]), first, opts,
                         output_tensors, _call.scatter_into(staging_out, outs),
                         (staging_in, staging_out))

    @_operation("all_to_all_single", _tensor_arg, "alltoall_base", _single)
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: List[int], input_split_sizes: List[int],
                          opts: Any = None) -> dist.Work:
        opts = opts or _c10d.AllToAllOptions()
        op = "all_to_all_single"
        out, back = _output(output)
        comm, out, arr = _call.pair(self._host, op, out, _tensors.inputs(input), "output",
                                    "input")
        arr = _call.apart(arr, out)
        if not output_split_sizes and not input_split_sizes:
            if arr.size != out.size or arr.size % self.size():
                raise self._host.error(op, f"input ({arr.size} elements) and output "
                                           f"({out.size}) must have equal sizes divisible by "
                                           f"the group size {self.size()}")
            args = (arr, out, None, None)
        else:
            split = _call.split_counts
            args = (arr, out, split(self._host, op, arr, input_split_sizes or None, "input"),
                    split(self._host, op, out, output_split_sizes or None, "output"))
        return self._run(op, comm.all_to_all, args, arr, opts, [output], back)

    alltoall_base = all_to_all_single

    @_operation("barrier", _no_tensor, spec=_nothing)
    def barrier(self, opts: Any = None) -> dist.Work:
        opts = opts or _c10d.BarrierOptions()
        return self._run("barrier", self._host.cpu.barrier, (), None, opts, [])

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not arrive within ``timeout``."""
        if self.size() == 1:
            return
        limit = timeout_seconds(timeout) or self._host.timeout
        try:
            _monitored_barrier_on(self._host, limit, wait_all_ranks)
        except DistBackendError as exc:
            self._state.failed(exc)
            raise for_torch(exc) from None

    # -- point to point --------------------------------------------------------------------
    @_operation("send", _first, spec=_sent)
    def send(self, tensors: List[torch.Tensor], dstRank: int, tag: int) -> dist.Work:
        t = self._one("send", tensors)
        peer = self._peer("send", dstRank)
        self._tag("send", tag)
        comm, arr = _call.array(self._host, "send", _tensors.inputs(t), output=False)
        return self._p2p("send", comm.send, (arr, peer, tag), arr, peer, tensors)

    @_operation("recv", _first, spec=_received)
    def recv(self, tensors: List[torch.Tensor], srcRank: int, tag: int) -> dist.Work:
        t = self._one("recv", tensors)
        peer = self._peer("recv", srcRank)
        self._tag("recv", tag)
        arr, back = _output(t)
        comm, arr = _call.array(self._host, "recv", arr)
        return self._p2p("recv", comm.recv, (arr, peer, tag), arr, peer, tensors, back)

    @_operation("recv", _first, spec=_received, event="recv_anysource")
    def recv_anysource(self, tensors: List[torch.Tensor], tag: int) -> dist.Work:
        t = self._one("recv", tensors)
        self._tag("recv", tag)
        arr, back = _output(t)
        comm, arr = _call.array(self._host, "recv", arr)
        return self._p2p("recv", comm.recv, (arr, None, tag), arr, None, tensors, back)

    def _p2p(self, op: str, start: Callable[..., Any], args: tuple, arr: Any,
             peer: Optional[int], tensors: List[torch.Tensor],
             after: Optional[Callable[[], None]] = None) -> dist.Work:
        """Point-to-point calls have no async flag in torch (``send`` is ``isend`` plus
        ``wait``), so they always return a PendingWork; one that does not complete at once
        (a large or unmatched message) is also driven by the progress thread, so that
        ``batch_isend_irecv``'s one-by-one calls and ``isend`` overlap with compute."""
        global_peer = None if peer is None else self._host.ranks[peer]
        try:
            work = _launch(self._host, op, start, args, arr, True, global_peer, None, (),
                           after)
        except DistBackendError as exc:
            self._state.failed(exc)
            raise for_torch(exc) from None
        if peer is not None and work.value is None:
            work.value = peer  # what source_rank() reports
        pending = PendingWork(work, tensors, self._state.failed)
        if not pending.advance():
            pending.share()
        return pending

    # -- helpers ---------------------------------------------------------------------------
    def _root(self, op: str, rank: int) -> int:
        if not 0 <= rank < self.size():
            raise self._host.error(op, f"root rank {rank} is out of range for a group of "
                                       f"size {self.size()}")
        return rank

    def _tag(self, op: str, tag: int) -> None:
        """A point-to-point tag is one MPI takes on every library, as ``hpccomm.send``'s:
        MPI guarantees tags up to 32767 only (and hpccomm's own messages use the few
        above :data:`~hpccomm.types.MAX_USER_TAG` where a group has no channel)."""
        if type(tag) is not int or not 0 <= tag <= MAX_USER_TAG:
            raise self._host.error(op, f"tag {tag!r} must be an int in [0, {MAX_USER_TAG}] "
                                       f"(MPI's guaranteed range, less hpccomm's reserved "
                                       f"tags)")

    def _peer(self, op: str, rank: int) -> int:
        self._root(op, rank)
        if rank == self.rank():
            raise self._host.error(op, f"peer {rank} is this rank itself; a process cannot "
                                       f"send to or receive from itself")
        return rank

    def _arrays(self, op: str, comm: Any, dtype: Any, tensors: Sequence[torch.Tensor],
                what: str, output: bool = True) -> List[Any]:
        """One array per rank, same dtype, all on the CPU communicator."""
        arrays = []
        for index, t in enumerate(_call.count_list(self._host, op, tensors, what)):
            raw = _view(t.contiguous()) if not output else _output_only(self._host, op, t,
                                                                      what, index)
            item_comm, arr = _call.array(self._host, op, raw, f"{what}[{index}]",
                                         output=output)
            _call.same_device(self._host, op, comm, item_comm, f"{what}[{index}]")
            _call.same_dtype(self._host, op, dtype, arr, f"{what}[{index}]")
            arrays.append(arr)
        return arrays


def _output_only(host: Any, op: str, t: torch.Tensor, what: str, index: int) -> Any:
    """A list entry the operation writes: must be its own contiguous memory (results are
    copied into it after the operation)."""
    if t.is_contiguous():
        return _view(t)
    raise host.error(op, f"{what}[{index}] is not contiguous; pass contiguous tensors")


def _steps(steps: Sequence[Optional[Callable[[], None]]]) -> Optional[Callable[[], None]]:
    """One step running ``steps`` (``None`` entries skipped) in order."""
    combined = None
    for step in steps:
        combined = chain(combined, step)
    return combined
