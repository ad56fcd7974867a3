"""torch's documented ``"mpi"`` backend name, served by hpccomm on a torch without MPI.

PyTorch documents ``init_process_group("mpi")`` under ``mpirun`` (rank and size from MPI,
no store), but its wheels are built without MPI and raise "Distributed package doesn't
have MPI built in". On such a torch, ``import hpccomm.torch`` calls :func:`install`:

* ``torch.distributed.is_mpi_available()`` returns ``True``;
* every group whose backend names ``"mpi"`` (``"mpi"``, ``"cpu:mpi,cuda:nccl"``, a
  ``new_group(backend="mpi")``, a DeviceMesh after ``init_process_group("mpi")``) is made
  by hpccomm's own creator, exactly as for ``"hpccomm"``;
* the default group takes rank and size from MPI (a rank or world size given is ignored
  with torch's own warning) and gets a real store served over MPI where torch hands its
  MPI path a placeholder, so whatever needs the group's store (NCCL's bootstrap, a
  gloo ``new_group``, DCP) has one;
* ``get_backend()`` and the group's ``name()`` say ``"mpi"``.

A torch built with its own MPI is left alone (logged once). This reaches into torch's
``distributed_c10d`` module; everything it relies on is listed in :data:`INTERNALS`,
checked before anything is changed (a torch whose internals differ keeps its own
behaviour, with a warning), and tested one by one in ``tests/test_torch_mpi_backend.py``.
"""
from __future__ import annotations

import functools
import inspect
import logging
import warnings
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed.distributed_c10d as c10d

from . import versions

logger = logging.getLogger("hpccomm")

#: torch releases whose internals this module was written against and is tested on.
TESTED_TORCH = versions.TESTED

#: The parameters of ``_new_process_group_helper`` this module reads, by name.
HELPER_PARAMETERS = ("group_size", "group_rank", "global_ranks_in_group", "backend",
                     "store", "group_name", "timeout")

#: What of torch's ``distributed_c10d`` this module relies on, and why.
INTERNALS: Dict[str, str] = {
    "_MPI_AVAILABLE": "the flag is_mpi_available() returns",
    "_new_process_group_helper": "where every group is made (looked up at call time by "
                                 "init_process_group and new_group); its parameters "
                                 + ", ".join(HELPER_PARAMETERS),
    "_world": "pg_map (backend name, store) and pg_backend_config of each group",
    "Backend": "Backend.MPI is 'mpi' and Backend('mpi') is accepted",
    "PrefixStore": "the default group's store is PrefixStore('default_pg', store)",
}

#: The name hpccomm registers its own backend under (the creator both names share).
_OWN = "hpccomm"


def problems() -> List[str]:
    """What of :data:`INTERNALS` this torch lacks or has in another shape (empty: all
    there)."""
    absent = [name for name in INTERNALS if not hasattr(c10d, name)]
    if absent:
        return [f"torch.distributed.distributed_c10d has no {name}" for name in absent]
    found: List[str] = []
    helper = _original_helper()
    params = inspect.signature(helper).parameters
    missing = [p for p in HELPER_PARAMETERS if p not in params]
    if missing:
        found.append(f"_new_process_group_helper has no parameter(s) {missing}")
    for attr in ("pg_map", "pg_backend_config"):
        if not hasattr(c10d._world, attr):
            found.append(f"distributedc10d._world has no {attr}")
    if getattr(c10d.Backend, "MPI", None) != "mpi":
        found.append("Backend.MPI is not 'mpi'")
    return found


def _original_helper() -> Callable[..., Any]:
    """torch's own ``_new_process_group_helper``, also while ours replaces it."""
    helper = c10d._new_process_group_helper
    return getattr(helper, "__wrapped__", helper)


def installed() -> bool:
    """Whether ``"mpi"`` currently means hpccomm in this process."""
    return getattr(c10d._new_process_group_helper, "hpccomm_mpi", False)


def install() -> bool:
    """Serve backend ``"mpi"`` with hpccomm if this torch has no MPI of its own
    (idempotent); returns whether hpccomm now serves it."""
    if installed():
        return True
    if c10d.is_mpi_available():
        logger.info("hpccomm.torch: this torch was built with MPI; backend 'mpi' stays "
                    "torch's own ProcessGroupMPI (use 'hpccomm' for hpccomm's)")
        return False
    found = problems()
    if found:
        warnings.warn(f"hpccomm.torch: torch {torch.__version__} differs from what backend "
                      f"'mpi' on hpccomm was built for ({'; '.join(found)}); 'mpi' stays "
                      f"unavailable, use backend 'hpccomm'", RuntimeWarning, stacklevel=2)
        return False
    helper = _original_helper()
    wrapper = functools.wraps(helper)(functools.partial(_make_group, helper,
                                                        inspect.signature(helper)))
    wrapper.hpccomm_mpi = True  # type: ignore[attr-defined]
    c10d._new_process_group_helper = wrapper
    c10d._MPI_AVAILABLE = True
    return True


def uninstall() -> None:
    """Give ``"mpi"`` back to torch (for tests; groups already made keep working)."""
    if installed():
        c10d._new_process_group_helper = _original_helper()
        c10d._MPI_AVAILABLE = False


def mentions_mpi(backend: Any) -> bool:
    """Whether a backend string (``"mpi"``, ``"cpu:mpi,cuda:nccl"``...) names MPI."""
    text = str(backend).lower()
    return text == "mpi" or any(item.partition(":")[2].strip() == "mpi"
                                for item in text.split(",") if ":" in item)


def translate(backend: Any, name: str = "mpi", to: str = _OWN) -> str:
    """The same backend string with ``to`` where it names backend ``name``: by default
    ``"mpi"`` -> ``"hpccomm"``, ``"cpu:mpi,cuda:nccl"`` -> ``"cpu:hpccomm,cuda:nccl"``;
    ``translate(config, _OWN, "mpi")`` turns a group's config back."""
    text = str(backend).lower()
    if ":" not in text:
        return to if text == name else text
    parts = []
    for item in text.split(","):
        device, _, given = item.partition(":")
        parts.append(f"{device}:{to if given.strip() == name else given}")
    return ",".join(parts)


def _make_group(helper: Callable[..., Any], signature: inspect.Signature,
                *args: Any, **kwargs: Any) -> Any:
    """torch's ``_new_process_group_helper`` with ``"mpi"`` made by hpccomm's creator."""
    bound = signature.bind(*args, **kwargs)
    backend = bound.arguments["backend"]
    if not mentions_mpi(backend):
        return helper(*args, **kwargs)
    arguments = bound.arguments
    if not arguments["global_ranks_in_group"] and arguments["group_size"] == -1:
        _default_group_store(arguments)
    arguments["backend"] = c10d.Backend(translate(backend))
    pg, store = helper(*bound.args, **bound.kwargs)
    if pg is not c10d.GroupMember.NON_GROUP_MEMBER:
        c10d._world.pg_map[pg] = (c10d.Backend(str(backend)), store)
        config = c10d._world.pg_backend_config.get(pg)
        if config is not None:
            c10d._world.pg_backend_config[pg] = translate(config, _OWN, "mpi")
        if hasattr(pg, "backend_name"):
            pg.backend_name = "mpi"
    return pg, store


def _default_group_store(arguments: Dict[str, Any]) -> None:
    """torch's MPI path makes the default group with rank and size -1 and a placeholder
    store: take rank and size from MPI and a store served over MPI instead, as
    ``init_method='mpi://'`` would."""
    from .bootstrap import mpi_rendezvous

    timeout: Optional[Any] = arguments.get("timeout")
    store, rank, size = next(mpi_rendezvous("mpi://", timeout) if timeout is not None
                             else mpi_rendezvous("mpi://"))
    if timeout is not None:
        store.set_timeout(timeout)
    arguments["store"] = c10d.PrefixStore("default_pg", store)
    arguments["group_rank"], arguments["group_size"] = rank, size
