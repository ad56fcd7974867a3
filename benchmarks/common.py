"""What the benchmark scripts share: where results go and how tables are written.

Every script of the suite (``benchmarks/run_all.sh``) and every study in
``benchmarks/studies/`` writes its generated files under ``docs/results/`` (or
``$BENCH_RESULTS``, to keep a trial run away from the committed numbers), through
:func:`result` and :func:`write_csv`; :func:`median_and_best` is the one summary of
timing samples the tables report.
"""
import csv
import gc
import os
import statistics
import time
from typing import Any, Callable, Dict, Iterable, List, Sequence, Tuple

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


def interleaved(variants: Dict[str, Callable[[], Any]], sync: Callable[[], Any], block: int,
                rounds: int, barrier: Callable[[], Any] = lambda: None,
                warmup: int = 50) -> Dict[str, List[int]]:
    """Nanoseconds of every call of every variant, each call timed alone
    (``perf_counter_ns``): ``warmup`` untimed calls of each, ``sync()``, then ``rounds``
    rounds in which each variant in turn runs ``block`` timed calls after ``barrier()``,
    with the garbage collector off, and ``sync()`` (untimed) after its block."""
    clock = time.perf_counter_ns
    samples: Dict[str, List[int]] = {name: [] for name in variants}
    for run in variants.values():
        for _ in range(warmup):
            run()
    sync()
    for _ in range(rounds):
        for name, run in variants.items():
            barrier()
            times = samples[name]
            gc.disable()
            try:
                for _ in range(block):
                    start = clock()
                    run()
                    times.append(clock() - start)
            finally:
                gc.enable()
            sync()
    return samples
