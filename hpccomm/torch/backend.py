"""``BackendHPC``: the c10d backend torch finds on an hpccomm group for CPU tensors.

torch's own code asks a group for the backend of a device (``group._get_backend(device)``,
``dist.get_backend_impl``) to learn what it supports (``supports_coalescing``,
``supports_splitting``...), to set its timeout, to register abort hooks and to read its
last error. For an hpccomm group the answer is this class, over the same hpccomm group
and with the same operations (:class:`~.operations.TensorOperations`) as the group
itself. On torch 2.14 it is a real ``torch._C._distributed_c10d.Backend``, registered
with torch on the group, so C++ code reaches it as well; on torch 2.13, which cannot
make a c10d backend of a Python class, it is a Python object with the same methods,
returned by the group's own ``_get_backend``.

It splits (``supports_splitting``): torch 2.15's ``split_group`` works on CPU, through
the group's own ``split_group`` (one ``MPI_Comm_split``). What it does not offer it says
so (``supports_*`` false) and torch takes its general paths: batched point-to-point
calls go one by one (each is nonblocking over MPI anyway), ``shrink`` refuses, and no
one-sided windows (torch defines its ``Window`` in C++ only, with no constructor a Python
backend could call). hpccomm's own ``shrink_group`` (:mod:`hpccomm.torch.fault`) goes on
after a failure.
"""
from __future__ import annotations

import datetime
from typing import Any

import torch

from ..diagnostics.monitored_barrier import run_on as _monitored_barrier_on
from ..errors import DistBackendError
from ..types import timeout_seconds
from . import versions
from ._tensors import timeout_of
from .errors import for_torch
from .hooks import GroupState
from .operations import TensorOperations

_BASE: Any = torch._C._distributed_c10d.Backend if versions.python_backends() else object
#: The timeout of a group that has none, as torch spells it.
_NO_TIMEOUT = getattr(torch._C._distributed_c10d, "_DEFAULT_NO_TIMEOUT",
                      datetime.timedelta(days=365))


class BackendHPC(TensorOperations, _BASE):  # type: ignore[misc, valid-type]
    """The CPU backend of one hpccomm torch group (shares its hpccomm group and state)."""

    # What torch asks before taking a special path. Splitting: the group splits its MPI
    # communicator (ProcessGroupHPC.split_group); the rest take torch's general paths.
    supports_coalescing = False
    supports_splitting = True
    supports_shrinking = False
    supports_time_estimate = False   # torch 2.14's name
    _supports_time_estimate = False  # torch 2.15's
    supports_reconfigure = True  # the group's own, hpccomm/torch/reconfigure.py
    supports_window = False
    # torch 2.15 asks before registering hooks: abort hooks run at the group's first
    # failure (torch 2.14 and later); completion hooks are not offered.
    supports_abort_hooks = True
    supports_completion_hooks = False

    def __init__(self, host: Any, state: GroupState, direct: Any):
        if _BASE is not object:
            _BASE.__init__(self, host.rank(), host.size())
        self._host = host
        self._state = state
        self._direct = direct

    def rank(self) -> int:  # in Python: the C++ base's goes through C++ and back
        return self._host.rank()

    def size(self) -> int:
        return self._host.size()

    if _BASE is object:  # torch 2.13: what the C++ base would answer
        def name(self) -> str:
            return self._state.backend_name

    def getBackendName(self) -> str:
        return self._state.backend_name

    def __repr__(self) -> str:
        return (f"<hpccomm.torch.BackendHPC '{self._state.backend_name}' of group "
                f"'{self._host.group_name}' rank {self._host.rank()}/{self._host.size()}>")

    def _cuda(self, op: str, tensor: torch.Tensor) -> Any:
        raise self._host.error(op, f"a tensor on {tensor.device} reached hpccomm's CPU "
                                   f"backend; the group sends CUDA tensors to its NCCL "
                                   f"backend (backend 'cpu:hpccomm,cuda:nccl')")

    # -- what torch asks of a backend ---------------------------------------------------
    def set_timeout(self, timeout: Any) -> None:
        """The timeout of the group's operations from now on."""
        self._host.set_timeout(timeout_seconds(timeout))

    def get_error(self) -> Any:
        """torch's ``ErrorType`` of the group's last failure (``SUCCESS`` if none)."""
        return self._state.error_type()

    def registerAbortHook(self, hook_id: int, hook: Any) -> None:
        self._state.abort_hooks[int(hook_id)] = hook

    def unregisterAbortHook(self, hook_id: int) -> None:
        self._state.abort_hooks.pop(int(hook_id), None)

    register_abort_hook = registerAbortHook
    unregister_abort_hook = unregisterAbortHook

    def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> None:
        """A barrier naming the ranks that did not arrive within the options' timeout."""
        if self._host.size() == 1:
            return
        limit = None if opts is None else timeout_of(opts)
        try:
            _monitored_barrier_on(self._host, limit or self._host.timeout, wait_all_ranks)
        except DistBackendError as exc:
            self._state.failed(exc)
            raise for_torch(exc) from None

    def abort(self) -> None:
        """Run the abort hooks, then abort the job (MPI offers no local abort of one
        communicator)."""
        self._state.run_abort_hooks()
        self._host.cpu.abort()

    def shutdown(self) -> None:
        """The group frees the communicator; nothing of the backend's own to free."""

    # -- splitting (torch 2.15 on CPU) -----------------------------------------------------
    @property
    def options(self) -> Any:
        """torch's ``Backend.Options`` of this backend (its name and the group's timeout:
        pipelining's per-edge groups keep the parent's timeout through it)."""
        seconds = self._host.timeout
        options = torch._C._distributed_c10d.Backend.Options(
            self._state.backend_name,
            datetime.timedelta(seconds=seconds) if seconds is not None else _NO_TIMEOUT)
        options.global_ranks_in_group = list(self._host.ranks)
        options.group_name = self._host.group_name
        return options

    def eager_connect_single_device(self, device: Any) -> None:
        """Nothing to connect: the group's communicator exists from its creation (torch
        2.15 asks a splitting backend bound to a device, ``device_id="cpu:0"``)."""

    def perform_nocolor_split(self, device: Any) -> None:
        """torch's ``new_group`` asks the ranks outside a new group to take part in the
        split of a device-bound default group's backend; hpccomm makes new groups from
        their members alone, so there is nothing to take part in."""
