"""The CUDA family: NCCL communicators (:mod:`.nccl`, plans in :mod:`.nccl_plan`),
CUDA-aware MPI (:mod:`.mpi_aware`) and the device helpers both use (:mod:`.device`:
CuPy, streams, events, this rank's GPU)."""
