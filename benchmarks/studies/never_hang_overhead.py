"""Cost of the never-hang features on ``all_reduce`` (8 B and 1 MiB), 2 ranks.

``python benchmarks/studies/never_hang_overhead.py [--runs 3]`` runs itself under
``mpiexec -n 2`` and prints a Markdown table. Inside one run (``--worker``) four variants
are interleaved round by round, in a rotating order, so that a busy machine slows them
alike:

* ``no check``: ``_call.launch`` without its one test for observers
  (``observed = _observe.active``; the only hot-path cost of these features:
  ``Work.wait`` reports to observers only on its timeout and failure paths),
  compiled from the current source into the live module;
* ``OFF``: the current code at debug level OFF, flight recorder off (the default);
* ``recorder``: OFF with a 2000-entry flight recorder;
* ``DETAIL``: the desync check before each collective.

A sample is the time of ``inner`` back-to-back calls / ``inner`` on rank 0 after a
barrier; a run reports the median and the best sample per variant.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = {"8 B": 1, "1 MiB": 131072}  # float64 elements


def old_launch():
    """``_call.launch`` without observers, compiled into the live ``_call`` module.

    Built from the current source (so other hot-path work is in both variants):
    ``observed = _observe.active`` becomes ``observed = False`` and the
    ``if observed:`` statement that runs the checks before the start is removed.
    """
    import ast
    import inspect

    from hpccomm import _call

    tree = ast.parse(inspect.getsource(_call))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "launch")
    kept = []
    for stmt in node.body:
        if isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "observed":
            continue
        if ast.unparse(stmt) == "observed = _observe.active":
            stmt = ast.parse("observed = False").body[0]
        kept.append(stmt)
    assert len(kept) == len(node.body) - 1, "the observer test was not found in launch"
    node.body, node.name = kept, "_launch_unchecked"
    exec(compile(ast.Module([node], []), "launch-unchecked", "exec"), _call.__dict__)
    return _call._launch_unchecked


def worker(rounds: int, inner: int) -> None:
    import numpy as np

    import hpccomm as dist
    from hpccomm import _call, flight_recorder

    dist.init_process_group(timeout=60)
    variants = ["no check", "OFF", "recorder", "DETAIL"]
    launches = {"no check": old_launch(), "now": _call.launch}

    def setup(variant: str) -> None:
        _call.launch = launches["no check" if variant == "no check" else "now"]
        dist.set_debug_level("DETAIL" if variant == "DETAIL" else "OFF")
        flight_recorder.enable(2000 if variant == "recorder" else 0)

    out = {}
    for label, count in SIZES.items():
        x = np.ones(count)
        n = inner if count == 1 else max(inner // 100, 20)
        samples = {v: [] for v in variants}
        for r in range(rounds):
            for variant in variants[r % len(variants):] + variants[:r % len(variants)]:
                setup(variant)
                dist.barrier()
                start = time.perf_counter()
                for _ in range(n):
                    dist.all_reduce(x)
                samples[variant].append((time.perf_counter() - start) / n * 1e6)
        setup("OFF")
        out[label] = {v: [statistics.median(s), min(s)] for v, s in samples.items()}
    if dist.get_rank() == 0:
        print("JSON" + json.dumps(out), flush=True)
    dist.destroy_process_group()


def run(runs: int, rounds: int, inner: int) -> list:
    results = []
    env = dict(os.environ)
    for name in ("HPCCOMM_TRACE_BUFFER", "HPCCOMM_DISTRIBUTED_DEBUG", "TORCH_DISTRIBUTED_DEBUG"):
        env.pop(name, None)
    for _ in range(runs):
        cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", "2",
               sys.executable, os.path.abspath(__file__), "--worker",
               "--rounds", str(rounds), "--inner", str(inner)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                             cwd=ROOT)
        found = [l for l in out.stdout.splitlines() if l.startswith("JSON")]
        if not found:
            raise SystemExit(f"benchmark run failed:\n{out.stdout}\n{out.stderr[-3000:]}")
        results.append(json.loads(found[0][4:]))
    return results


def table(results: list) -> str:
    rows = ["| size | variant | median µs (median of runs) | best µs (min of runs) |",
            "|---|---|---|---|"]
    for label in SIZES:
        for variant in ("no check", "OFF", "recorder", "DETAIL"):
            meds = [r[label][variant][0] for r in results]
            bests = [r[label][variant][1] for r in results]
            rows.append(f"| {label} | {variant} | {statistics.median(meds):.2f} | "
                        f"{min(bests):.2f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--inner", type=int, default=2000)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.inner)
        return
    results = run(args.runs, args.rounds, args.inner)
    print(table(results))
    print("RAW" + json.dumps(results))


if __name__ == "__main__":
    main()
