"""The programs in examples/ run under mpiexec and check their own results, and none is
named like a module it could shadow."""
import glob
import importlib.util
import os
import sys

import pytest

from helpers import run_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EXPECTED = {
    "ring_allreduce.py": "matches all_reduce",
    "data_parallel.py": "matches full-batch training",
    "shard_roundtrip.py": "equals all_reduce",
    # no rank dies without ULFM; tests/test_failures.py kills one under ULFM
    "elastic_data_parallel.py": "the weights match the single-process training",
}


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_example_runs_under_mpiexec(example, n):
    result = run_job([sys.executable, os.path.join(ROOT, "examples", example)], n, limit=120)
    assert result.code == 0, result.output
    assert EXPECTED[example] in result.stdout
    assert f"over {n} ranks" in result.stdout or f"on {n} ranks" in result.stdout


def test_no_example_is_named_like_a_module():
    """A script's folder comes first on ``sys.path``, so an example named like a package
    (``lightning_fabric.py``) would be imported in that package's place by everything
    run from that folder, the frameworks themselves included."""
    stems = sorted({os.path.splitext(os.path.basename(path))[0] for path in
                    glob.glob(os.path.join(ROOT, "examples", "**", "*.py"), recursive=True)})
    assert "recipe_fabric" in stems, stems
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    clashes = [stem for stem in stems
               if stem in stdlib or importlib.util.find_spec(stem) is not None]
    assert clashes == [], f"examples named like importable modules: {clashes}"
