"""Build hook: the metadata lives in setup.cfg. The C extensions are optional: without a
C compiler hpccomm installs and runs on its pure-Python paths."""
from setuptools import Extension, setup

setup(ext_modules=[Extension(f"hpccomm.backends.{name}", [f"hpccomm/backends/{name}.c"],
                             depends=["hpccomm/backends/_spin.h"], optional=True)
                   for name in ("_mpi_direct", "_shm_pair")])
