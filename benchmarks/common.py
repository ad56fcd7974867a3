"""What the benchmark scripts share: where results go and how tables are written.

Every script of the suite (``benchmarks/run_all.sh``) and every study in
``benchmarks/studies/`` writes its generated files under ``docs/results/`` (or
``$BENCH_RESULTS``, to keep a trial run away from the committed numbers), through
:func:`result` and :func:`write_csv`; :func:`median_and_best` is the one summary of
timing samples the tables report.
"""
import csv
import os
import statistics
from typing import Dict, Iterable, List, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.environ.get("BENCH_RESULTS") or os.path.join(ROOT, "docs", "results")


def result(name: str) -> str:
    """The path of generated file ``name`` (``bench_init.csv``, a stem...), its
    directory created."""
    os.makedirs(RESULTS, exist_ok=True)
    return os.path.join(RESULTS, name)


def write_csv(path: str, rows: Sequence[Dict], fields: Iterable[str] = ()) -> None:
    """``rows`` as a CSV table: the columns are ``fields`` then every other key in the
    order first seen; a row without a column leaves it empty."""
    columns = list(dict.fromkeys([*fields, *(key for row in rows for key in row)]))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: str) -> List[Dict[str, str]]:
    """The rows of a CSV table written by :func:`write_csv`."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def median_and_best(samples: Sequence[float]) -> Tuple[float, float]:
    """The median and the smallest of timing samples."""
    return statistics.median(samples), min(samples)
