"""The torch releases ``hpccomm.torch`` is tested on, and what the running torch offers.

hpccomm's PyTorch backend is tested on each release in :data:`TESTED` (CI runs the torch
tests, torch's own ``_DistTestBase`` included, on each). Another release is used as it
is, with one warning at ``import hpccomm.torch`` naming the tested ones (``hpccomm
info`` names them too). What differs between the tested releases is asked of torch
itself, not of its version number:

* :func:`python_backends`: torch 2.14 lets a Python class be a c10d ``Backend``, so
  hpccomm registers one on each of its groups and torch's own code that asks a group for
  its backend (``_get_backend``, ``get_backend_impl``, ``set_timeout``, abort hooks,
  ``get_error``) reaches hpccomm; torch 2.13 has no such class, and the group answers
  those questions in Python.
* :func:`collective_hooks`: torch 2.14's pre/post collective hooks
  (``ProcessGroup.register_pre_hook``...).
* :func:`splits_on_cpu`: torch 2.15's ``split_group`` needs no accelerator, so the
  backend's split serves CPU groups.
"""
from __future__ import annotations

import functools
import warnings
from typing import Optional

import torch

from .._version import TESTED_TORCH, tested_torch_text, torch_tested

#: The torch releases (major.minor) the backend is tested on.
TESTED = TESTED_TORCH

#: What ``hpccomm[torch]`` installs: every tested release, no other.
REQUIREMENT = "torch>=2.13,<2.16"


def tested(version: Optional[str] = None) -> bool:
    """Whether ``version`` (default: the running torch) is a tested release."""
    return torch_tested(torch.__version__ if version is None else version)


def untested_note(version: Optional[str] = None) -> Optional[str]:
    """One sentence for an untested torch (``None`` for a tested one)."""
    if tested(version):
        return None
    text = torch.__version__ if version is None else version
    return (f"hpccomm.torch is tested on torch {tested_torch_text()}; this is torch "
            f"{text}. It is used as it is: report what fails, or install a tested "
            f"release (pip install '{REQUIREMENT}')")


def warn_if_untested() -> None:
    """The one warning an untested torch gets, at ``import hpccomm.torch``."""
    note = untested_note()
    if note is not None:
        warnings.warn(note, RuntimeWarning, stacklevel=3)


@functools.lru_cache(maxsize=None)
def python_backends() -> bool:
    """Whether a Python class can be a c10d ``Backend`` that torch calls (torch 2.14's
    trampoline; torch 2.13 defines no constructor for it)."""
    base = torch._C._distributed_c10d.Backend

    class Probe(base):  # type: ignore[misc, valid-type]
        pass
    try:
        Probe(0, 1)
    except TypeError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def collective_hooks() -> bool:
    """Whether torch has pre/post collective hooks on process groups (2.14)."""
    return hasattr(torch._C._distributed_c10d, "PreHookArgs")


@functools.lru_cache(maxsize=None)
def splits_on_cpu() -> bool:
    """Whether torch's ``split_group`` splits a group's CPU backend, with no accelerator
    bound (2.15: it dropped the check ``_is_safe_to_split`` that required one)."""
    import torch.distributed.distributed_c10d as c10d

    return hasattr(c10d, "split_group") and not hasattr(c10d, "_is_safe_to_split")
