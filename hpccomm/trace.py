"""``python -m hpccomm.trace DIR``: the flight recorder dumps of a job, on one screen.

The tool itself is :mod:`hpccomm.diagnostics.trace`; this module keeps the command short.
"""
import sys

from .diagnostics.trace import main

if __name__ == "__main__":
    sys.exit(main())
