"""The MPI family: collectives and point-to-point as nonblocking MPI calls
(:mod:`.communicator`), the communicator plumbing the group layer needs
(:mod:`.plumbing`), where ranks run (:mod:`.placement`), receives from any source
(:mod:`.anysource`), native waits and in-place sums (:mod:`.direct`, C helper
``_direct``), gating of large blocking calls per library (:mod:`.gate`) and ULFM
fault tolerance (:mod:`.ft`)."""
