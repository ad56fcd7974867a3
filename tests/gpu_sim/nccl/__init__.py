"""Simulated NVIDIA nccl4py (only its low-level ``nccl.bindings.nccl``)."""
