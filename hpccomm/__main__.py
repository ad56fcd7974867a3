"""``python -m hpccomm``: the same as the ``hpccomm`` command."""
import sys

from .cli import main

sys.exit(main())
