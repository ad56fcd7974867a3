"""Simulated ``nccl.bindings``."""
