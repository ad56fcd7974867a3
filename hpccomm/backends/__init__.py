"""Backends behind the narrow interface of :mod:`hpccomm.backends.base`.

Backends are found by name through ``hpccomm.Backend._plugins``; the built-in ones
(``mpi``, ``nccl``) are imported only when a group first needs them.
"""
