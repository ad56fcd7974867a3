"""The pieces behind hpccomm's pytest plugin (:mod:`hpccomm.pytest_plugin`).

* :mod:`.outcomes`: one outcome per (test, world size) from every rank's, skip reasons
  grouped, the closing line. Pure Python; the project's own runner uses it too.
* :mod:`.lockstep`: under ``mpiexec -n N pytest --hpccomm-lockstep``, the ranks agree on
  each test's outcome under a deadline, stop each other's tests when one fails, and
  interrupt a test that outlives its timeout (naming the ranks and where they were).
* :mod:`.parallel`: ``@pytest.mark.parallel(nprocs=[1, 2, 4])``: from a serial
  ``pytest``, each size runs under its own ``mpiexec -n k``; under mpiexec, the variant
  of the job's size runs and the others are skipped.

Importing any of these modules does not initialize MPI: :mod:`.lockstep` does, when a
session starts with the option on.
"""
