"""Build hook: the metadata lives in setup.cfg. The one C extension is optional: without
a C compiler hpccomm installs and runs on its pure-Python paths."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("hpccomm.backends._mpi_direct",
                             ["hpccomm/backends/_mpi_direct.c"], optional=True)])
