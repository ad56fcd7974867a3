"""torch's hooks on hpccomm groups: pre/post collective hooks, abort hooks, the error state.

torch 2.14 lets code watch a process group: ``register_pre_hook(hook_id, hook)`` and
``register_post_hook`` run around every operation the group issues (torch fires them in
its C++ dispatcher, which hpccomm's Python groups do not go through, so hpccomm fires
them itself, with the same ``PreHookArgs``/``PostHookArgs``); ``register_abort_hook``
runs before the group gives up after a timeout or a failed operation; a backend's
``get_error()`` says what went wrong last. :class:`GroupState` keeps all of it for one
group, shared by the group and the c10d backend registered on it.

Hooks are registered at set-up, not while operations run (as torch asks). With none
registered an operation pays one attribute test.
"""
from __future__ import annotations

import itertools
import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch._C._distributed_c10d as _c10d

from .. import errors
from . import flight_recorder

logger = logging.getLogger("hpccomm")

_NAMES = getattr(_c10d, "HookOpName", None)

#: torch's hook name of each of hpccomm's operations: the name torch's own dispatch gives
#: it, then the name of an older torch that lacks that one (torch 2.15 names the
#: tensor-into-tensor and coalesced forms apart: all_gather_into_tensor is ALLGATHER_BASE,
#: which torch 2.14 reports as ALLGATHER).
HOOK_OPS: Dict[str, Tuple[str, ...]] = {
    "all_reduce": ("ALLREDUCE",), "all_reduce_coalesced": ("ALLREDUCE_COALESCED", "ALLREDUCE"),
    "broadcast": ("BROADCAST",), "reduce": ("REDUCE",),
    "all_gather": ("ALLGATHER",), "all_gather_coalesced": ("ALLGATHER_COALESCED", "ALLGATHER"),
    "all_gather_into_tensor": ("ALLGATHER_BASE", "ALLGATHER"),
    "all_gather_into_tensor_coalesced": ("ALLGATHER_INTO_TENSOR_COALESCED", "ALLGATHER"),
    "gather": ("GATHER",), "gather_single": ("GATHER",), "scatter": ("SCATTER",),
    "reduce_scatter": ("REDUCE_SCATTER",),
    "reduce_scatter_tensor": ("REDUCE_SCATTER_BASE", "REDUCE_SCATTER"),
    "reduce_scatter_tensor_coalesced": ("REDUCE_SCATTER_TENSOR_COALESCED", "REDUCE_SCATTER"),
    "all_to_all": ("ALLTOALL",), "all_to_all_single": ("ALLTOALL_BASE", "ALLTOALL"),
    "barrier": ("BARRIER",), "send": ("SEND",), "recv": ("RECV",), "recv_anysource": ("RECV",)}


def _resolve(op: str) -> Any:
    for name in HOOK_OPS.get(op, ()):
        found = getattr(_NAMES, name, None)
        if found is not None:
            return found
    return getattr(_NAMES, "UNKNOWN", None)


_RESOLVED: Dict[str, Any] = {op: _resolve(op) for op in HOOK_OPS} if _NAMES is not None else {}


def hook_name(op: str) -> Any:
    """torch's ``HookOpName`` of operation ``op`` on this torch (``UNKNOWN`` if none;
    ``None`` on a torch without hooks)."""
    found = _RESOLVED.get(op)
    return found if found is not None else getattr(_NAMES, "UNKNOWN", None)


#: ``get_error()``'s answer after each kind of failure (torch's ``ErrorType`` names).
SUCCESS, TIMEOUT, COMM_ERROR, REMOTE_ERROR = "SUCCESS", "TIMEOUT", "COMM_ERROR", "REMOTE_ERROR"


def error_kind(exc: BaseException) -> Optional[str]:
    """The ``ErrorType`` name an operation's error leaves on its group; ``None`` for a
    mistake in the call itself (bad arguments leave the group as it was)."""
    if isinstance(exc, errors.ProcessFailedError):
        return REMOTE_ERROR
    if isinstance(exc, errors.DistTimeoutError):
        return TIMEOUT
    if isinstance(exc, errors.DistBackendError):
        return COMM_ERROR
    return None


class Watch:
    """The pre/post hooks of one group (exists while at least one is registered)."""

    def __init__(self) -> None:
        self.pre: Dict[int, Callable[[Any], None]] = {}
        self.post: Dict[int, Callable[[Any], None]] = {}
        self._ids = itertools.count()

    def before(self, op: str, async_op: bool, root: int, inputs: Sequence[Any],
               outputs: Sequence[Any]) -> int:
        """Run the pre-hooks for ``op``; the id that pairs them with the post-hooks."""
        op_id = next(self._ids)
        if self.pre:
            args = _c10d.PreHookArgs()
            args.name = hook_name(op)
            args.async_op = async_op
            args.input_tensors = list(inputs)
            args.output_tensors = list(outputs)
            args.root = root
            args.op_id = op_id
            for hook in list(self.pre.values()):
                hook(args)
        return op_id

    def after(self, op: str, async_op: bool, op_id: int, work: Any) -> None:
        """Run the post-hooks of the operation ``before`` numbered ``op_id``."""
        if not self.post:
            return
        args = _c10d.PostHookArgs()
        args.name = hook_name(op)
        args.async_op = async_op
        args.op_id = op_id
        if work is not None:
            args.work = work
        for hook in list(self.post.values()):
            hook(args)


class GroupState:
    """What a group and its c10d backend share: the backend name torch reports, the
    hooks, and the last error."""

    def __init__(self, backend_name: str = "hpccomm") -> None:
        #: ``"mpi"`` when the group was asked for under torch's name for MPI.
        self.backend_name = backend_name
        #: The pre/post hooks, ``None`` while none is registered (the operations' test).
        self.watch: Optional[Watch] = None
        self.abort_hooks: Dict[int, Callable[[], None]] = {}
        self.error = SUCCESS
        #: Whether the abort hooks have run (they run once), and the lock under which a
        #: failure is recorded: the progress thread and the caller's may report at once.
        self._aborted = False
        self._lock = threading.Lock()
        #: The group's flight recorder trace (:mod:`.flight_recorder`), ``None`` while
        #: torch's recorder is off (``TORCH_FR_BUFFER_SIZE=0``).
        self.trace: Any = None

    # -- pre/post hooks -----------------------------------------------------------------
    def register(self, kind: str, hook_id: int, hook: Callable[[Any], None]) -> None:
        if self.watch is None:
            self.watch = Watch()
        getattr(self.watch, kind)[int(hook_id)] = hook

    def unregister(self, kind: str, hook_id: int) -> None:
        if self.watch is None:
            return
        getattr(self.watch, kind).pop(int(hook_id), None)
        if not self.watch.pre and not self.watch.post:
            self.watch = None

    # -- failures -------------------------------------------------------------------------
    def failed(self, exc: BaseException) -> None:
        """An operation of the group raised ``exc``: remember what kind of failure it was
        and, at the first one, run the abort hooks (the group is unusable from here)."""
        kind = error_kind(exc)
        if kind is None:
            return
        with self._lock:
            self.error = kind
        self.run_abort_hooks()

    def run_abort_hooks(self) -> None:
        """Run every abort hook, the first time only (a failure, or an abort); one that
        raises is logged, the others still run. The flight recorder's dump is written first
        (where torch's variable asks for one). Called outside hpccomm's locks: the
        hooks are the user's code."""
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
        flight_recorder.dump_on_failure()
        hooks: List[Callable[[], None]] = list(self.abort_hooks.values())
        for hook in hooks:
            try:
                hook()
            except Exception:  # the failure being reported matters more than the hook's
                logger.exception("hpccomm.torch: an abort hook raised")

    def error_type(self) -> Any:
        """torch's ``ErrorType`` for :attr:`error`."""
        return getattr(_c10d.ErrorType, self.error)
