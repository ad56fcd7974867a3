"""Distributed checkpoints in one HDF5 file, in the spirit of ``torch.distributed.checkpoint``.

``save(state, path)`` writes a state dict (nested dicts of NumPy arrays) collectively:
plain arrays are replicated, ``Shard(local, axis)`` marks this rank's slice of a global
array. ``load(state, path)`` fills the given arrays in place on any number of ranks and
any placement, reading only the needed slices. ``hand_over(state)`` gives one rank's state to the
ranks that just joined (``grow_group``), in memory. Needs h5py
(``pip install 'hpccomm[ckpt]'``); ``import hpccomm`` does not import this package. See
``docs/checkpoint.md``.
"""
from .handover import hand_over
from .layout import FORMAT, FORMAT_VERSION, CheckpointError
from .reader import load
from .state import Shard
from .writer import save

__all__ = ["save", "load", "hand_over", "Shard", "CheckpointError", "FORMAT", "FORMAT_VERSION"]
