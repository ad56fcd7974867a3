"""Build hook: the metadata lives in setup.cfg. The C extensions are optional: without a
C compiler hpccomm installs and runs on its pure-Python paths."""
from setuptools import Extension, setup

#: module -> source: native waits and in-place sums (MPI family), two-rank shared-memory
#: sums and small collectives (shared-memory family); all include the clock and spin of
#: backends/_spin.h.
HELPERS = {"hpccomm.backends.mpi._direct": "hpccomm/backends/mpi/_direct.c",
           "hpccomm.backends.shm._pair": "hpccomm/backends/shm/_pair.c",
           "hpccomm.backends.shm._small": "hpccomm/backends/shm/_small.c"}

#: headers beside a helper's source (the small channel's element kinds and reductions,
#: how it describes an operation from Python's arguments, its hand-off, and how it
#: compares the ranks' calls)
HEADERS = {"hpccomm.backends.shm._small": ["hpccomm/backends/shm/_reduce.h",
                                           "hpccomm/backends/shm/_small_args.h",
                                           "hpccomm/backends/shm/_handoff.h",
                                           "hpccomm/backends/shm/_mismatch.h"]}

setup(ext_modules=[Extension(name, [source],
                             depends=["hpccomm/backends/_spin.h", *HEADERS.get(name, [])],
                             optional=True)
                   for name, source in HELPERS.items()])
