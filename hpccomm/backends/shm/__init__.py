"""The shared-memory family, for ranks on one node: the communicator that routes large
collectives through shared memory and the rest to MPI (:mod:`.communicator`), the
segment and its rendezvous (:mod:`.segment`), the algorithms (:mod:`.algorithms`,
:mod:`.reduce`), cross-memory attach (:mod:`.cma`), the two-rank C kernel
(:mod:`.pair`, C helper ``_pair``) and the hierarchical all_reduce for groups that span
nodes (:mod:`.hier`)."""
