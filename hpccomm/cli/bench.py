"""``hpccomm bench``: hpccomm against raw mpi4py (and torch gloo) on this machine's MPI.

Run under a launcher (``hpccomm bench -n 2`` does it), one process per rank::

    mpiexec -n 2 python -m hpccomm.cli.bench --ops all_reduce --sizes 8,1M

For each operation and size the variants run interleaved in ONE job, on the same NumPy
buffers: rounds of one batch per variant, in a random order drawn afresh each round (the
same on every rank), each batch after a barrier. A sample is the batch time / batch length, the maximum over ranks (an
operation is done when the slowest rank has it); the result is the median over rounds
and the best round. Variants:

* ``hpccomm``       ``dist.all_reduce(a)``: synchronous, never-hang timeout on
* ``hpccomm_async`` ``dist.all_reduce(a, async_op=True).wait()``
* ``mpi4py``        mpi4py's uppercase blocking call (``comm.Allreduce``): the floor at
  the job's MPI thread level (mpi4py's default, MPI_THREAD_MULTIPLE, as hpccomm needs)
* ``mpi4py_nb``     the same nonblocking call + ``Wait`` (``comm.Iallreduce(...).Wait()``)
* ``gloo``          ``torch.distributed`` with the gloo backend (``--gloo``; needs torch)

and, printed after those (:data:`SHM_VARIANTS`):

* ``hpccomm_noshm``  ``dist.all_reduce(a, group=plain)`` on a group of every rank made with
  ``HPCCOMM_SHM=0``: what hpccomm does through MPI alone
* ``hpccomm_window`` the same operation on arrays from ``hpccomm.shm.empty`` (read in
  place by the peers: no copy into shared memory); shared-memory operations only
* ``ceiling``        the memory traffic a zero-copy algorithm cannot avoid, done by NumPy on
  private arrays with every rank busy and no synchronization (:func:`ceiling`): the
  physical bound of the shared-memory path, measured in the same run

Sizes follow nccl-tests: all_gather's is the whole output, reduce_scatter's the whole
input, all_to_all's the whole per-rank buffer, with element counts rounded up to a
multiple of the group size. ``busbw = size / time * factor`` (:data:`BUS_FACTOR`).
send/recv is a ping-pong in pairs (0,1), (2,3)...; its time is half the round trip.
``benchmarks/collectives.py`` drives this module for the committed report.

The thread level. Some MPI libraries (MPICH) choose slower small-message algorithms when
MPI runs at MPI_THREAD_MULTIPLE, and a process has one level for good, so raw mpi4py at
both levels needs two jobs: ``hpccomm bench`` (:func:`drive`) runs ``--repeats`` pairs
of jobs one after the other, a job of every variant above at the level hpccomm starts MPI
at (:mod:`hpccomm.mpi_level`), then a job of the ``mpi4py`` variant alone at the other
of MPI_THREAD_MULTIPLE and MPI_THREAD_SERIALIZED (``--raw-only --thread-level other``),
on buffers of the same sizes and with the batch lengths of the first job. Each job
measures for ``budget / repeats`` and writes its rounds' samples (``--samples-out``);
:func:`merge` pools the rounds of all jobs, so the median and the best round are taken
as in one job. Raw mpi4py's samples go by their job's level:

* ``mpi4py``            mpi4py's blocking call at MPI_THREAD_MULTIPLE (mpi4py's default)
* ``mpi4py_serialized`` the same call below it (MPI_THREAD_SERIALIZED)

with the ratios ``hpccomm_over_mpi4py_serialized_bw`` and
``mpi4py_over_mpi4py_serialized_bw`` (its time over hpccomm's, over mpi4py's at
MPI_THREAD_MULTIPLE). ``--no-serialized`` runs the single job alone, as does a launcher
started by hand (``mpiexec ... python -m hpccomm.cli.bench``).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import mpi_level, settings
from .bench_cases import (BUS_FACTOR, DEFAULT_SIZES, OPS, SHM_OPS, SHM_VARIANTS, VARIANTS, KiB,
                          MiB, init_gloo, make_case)


def batch_time(comm: Any, fn: Callable[[], Any], inner: int) -> float:
    """Seconds per operation of ``inner`` back-to-back calls, after a barrier."""
    comm.Barrier()
    t0 = time.perf_counter_ns()
    for _ in range(inner):
        fn()
    return (time.perf_counter_ns() - t0) / inner * 1e-9


def measure(comm: Any, fns: Dict[str, Callable[[], Any]], nbytes: int, budget: float = 0.5,
            batch: float = 5e-4, min_rounds: int = 7, max_rounds: int = 100,
            preset: Optional[Dict[str, int]] = None,
            samples_out: Optional[Dict[str, List[float]]] = None
            ) -> Tuple[Dict[str, int], int, Dict[str, float], Dict[str, float]]:
    """``(batch length per variant, rounds, median s, best s)``, maximum over ranks.

    The MPI variants share one batch length (set by the raw blocking call, so each pays
    the same barrier skew), gloo gets its own; batches last ``batch`` seconds, and at
    least 20 operations up to 1 MiB so a disturbed calibration cannot leave barrier skew
    unamortized. As many rounds as fit ``budget`` seconds, within the bounds.
    ``preset`` gives batch lengths decided elsewhere (another job of the same
    comparison: :func:`alternate`); ``samples_out`` receives every round's sample per
    variant (seconds, maximum over ranks), to be merged with other jobs'.
    """
    from mpi4py import MPI

    for fn in fns.values():  # warm-up: registration, first touch, caches
        for _ in range(3):
            fn()
    inner: Dict[str, int] = {v: int(n) for v, n in (preset or {}).items() if v in fns}
    for v in ("mpi4py", "gloo"):
        if v not in fns or v in inner:
            continue
        one = comm.allreduce(min(batch_time(comm, fns[v], 10) for _ in range(3)), op=MPI.MAX)
        inner[v] = max(1, min(5000, int(batch / max(one, 1e-9))))
        if nbytes <= MiB:
            inner[v] = max(inner[v], 10 if v == "gloo" else 20)
    for v in fns:
        inner.setdefault(v, inner.get("mpi4py", 20))
    per_round = sum(comm.allreduce(batch_time(comm, fn, inner[v]), op=MPI.MAX) * inner[v]
                    for v, fn in fns.items())
    rounds = int(min(max_rounds, max(min_rounds, budget / max(per_round, 1e-9))))
    names = list(fns)
    samples = {v: np.empty(rounds) for v in names}
    order = np.random.default_rng(seed=8)  # the same sequence on every rank
    for r in range(rounds):
        # a fresh random order each round: a rotation would keep every variant behind the
        # same neighbour (behind gloo, whose threads still run as it returns, every time)
        for index in order.permutation(len(names)):
            v = names[index]
            samples[v][r] = batch_time(comm, fns[v], inner[v])
    median, best = {}, {}
    for v in names:
        worst = np.empty_like(samples[v])
        comm.Allreduce(samples[v], worst, op=MPI.MAX)
        median[v], best[v] = float(np.median(worst)), float(np.min(worst))
        if samples_out is not None:
            samples_out[v] = worst.tolist()
    return inner, rounds, median, best


def size_text(n: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def size_plot(path: str, sizes: Sequence[int], series: Dict[str, Sequence[float]],
              ylabel: str, title: str, dashed: Callable[[str], bool],
              log_y: bool = False, reference: Optional[float] = None) -> None:
    """Save a plot of one line per series over message sizes (ticks named by
    :func:`size_text`); ``dashed(name)`` picks a series' style, ``reference`` draws a
    horizontal dotted line. Needs matplotlib (imported here, not at module import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, values in series.items():
        ax.plot(sizes, values, "--" if dashed(name) else "-o", label=name, markersize=4)
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    if reference is not None:
        ax.axhline(reference, color="grey", linestyle=":")
    ax.set_xticks(list(sizes), [size_text(s) for s in sizes])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("all_reduce size")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_size(text: str) -> int:
    """``"8"``, ``"4K"``, ``"2M"`` / ``"2MiB"``, ``"1G"`` -> bytes."""
    try:
        value = settings.parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8, 4K, 2M)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    return value


def run(ops: Sequence[str], sizes: Sequence[int], td: Any = None, budget: float = 0.5,
        report: Optional[Callable[[Dict[str, Any]], None]] = None, raw_only: bool = False,
        preset: Optional[Dict[str, Dict[str, int]]] = None,
        cells_out: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """Measure every (op, size); one row per cell (times in µs, bandwidths in GB/s).

    Collective over ``MPI.COMM_WORLD``; initializes hpccomm if needed. ``td`` is an
    initialized ``torch.distributed`` (gloo) to compare with, or ``None``. ``report(row)``
    is called on every rank as each row is done. ``raw_only``: mpi4py's blocking call
    alone, without initializing hpccomm (the job at another thread level). ``preset``
    (:func:`cell_key` -> batch lengths) and ``cells_out`` (one :func:`cell_record` per
    cell appended) serve :func:`alternate`.
    """
    from mpi4py import MPI

    from ..init import init_process_group, is_initialized

    if not raw_only and not is_initialized():
        init_process_group()
    comm = MPI.COMM_WORLD.Dup()
    gloo = td is not None
    plain, arena = (None, None) if raw_only else shm_setup(comm, ops, sizes)
    rows = []
    for op in ops:
        for nbytes in sizes:
            actual, fns, keep = make_case(op, nbytes, comm, td, plain, arena)
            variants = ["mpi4py"] if raw_only else [
                v for v in VARIANTS + SHM_VARIANTS if v in fns and (gloo or v != "gloo")]
            samples: Dict[str, List[float]] = {}
            inner, rounds, median, best = measure(
                comm, {v: fns[v] for v in variants}, nbytes, budget,
                preset=(preset or {}).get(cell_key(op, nbytes)), samples_out=samples)
            del keep
            if cells_out is not None:
                cells_out.append(dict(op=op, requested=nbytes, bytes=actual, inner=inner,
                                      samples=samples, loadavg=os.getloadavg()[0]))
            row = make_row(op, comm.size, actual, rounds, variants, inner, median, best)
            rows.append(row)
            if report is not None:
                report(row)
    comm.Free()
    return rows


def cell_key(op: str, nbytes: int) -> str:
    """How a job's file names one (operation, requested size) cell."""
    return f"{op}/{nbytes}"


def make_row(op: str, ranks: int, nbytes: int, rounds: int, variants: Sequence[str],
             inner: Dict[str, int], median: Dict[str, float], best: Dict[str, float]
             ) -> Dict[str, Any]:
    """One row of results (times in µs, bandwidths in GB/s, ratios) from the median and
    best seconds per variant; the ratios of variants not measured are left out."""
    row: Dict[str, Any] = dict(op=op, ranks=ranks, bytes=nbytes, rounds=rounds,
                               inner="/".join(str(inner[v]) for v in variants))
    for v in variants:
        row[f"{v}_us"] = median[v] * 1e6
    for v in variants:
        row[f"{v}_min_us"] = best[v] * 1e6
    for v in variants:
        algbw = nbytes / median[v] / 1e9
        row[f"{v}_algbw_GBs"] = algbw
        row[f"{v}_busbw_GBs"] = algbw * BUS_FACTOR[op](ranks)
    ratios = (("hpccomm_over_mpi4py_bw", "mpi4py", "hpccomm"),
              ("hpccomm_async_over_mpi4py_bw", "mpi4py", "hpccomm_async"),
              ("gloo_over_hpccomm_time", "gloo", "hpccomm"),
              ("noshm_over_mpi4py_bw", "mpi4py", "hpccomm_noshm"),
              ("window_over_mpi4py_bw", "mpi4py", "hpccomm_window"),
              ("window_of_ceiling", "ceiling", "hpccomm_window"),
              ("hpccomm_of_ceiling", "ceiling", "hpccomm"),
              (f"hpccomm_over_{SERIALIZED}_bw", SERIALIZED, "hpccomm"),
              (f"mpi4py_over_{SERIALIZED}_bw", SERIALIZED, "mpi4py"))
    for key, top, bottom in ratios:
        if top in median and bottom in median:
            row[key] = median[top] / median[bottom]
    return row


# -- two thread levels: jobs alternated by a driver that never initializes MPI -------------
#: The variant measured by the second job: mpi4py's blocking call at MPI_THREAD_SERIALIZED.
SERIALIZED = "mpi4py_serialized"
#: mpi4py's names of the MPI thread levels, lowest first (``mpi4py.rc.thread_level``).
THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")


def thread_level_name() -> str:
    """The thread level MPI was initialized with, by mpi4py's name."""
    from mpi4py import MPI

    level = MPI.Query_thread()
    return THREAD_LEVELS[level] if 0 <= level < len(THREAD_LEVELS) else str(level)


def write_job(path: str, comm: Any, cells: List[Dict[str, Any]], raw_only: bool) -> None:
    """Rank 0 writes one job's raw samples (JSON) for :func:`merge`."""
    from mpi4py import MPI

    from .._version import __version__

    if comm.rank != 0:
        return
    vendor, version = MPI.get_vendor()
    job = dict(ranks=comm.size, vendor=vendor, version=".".join(map(str, version)),
               hpccomm=__version__, thread_level=thread_level_name(), raw_only=raw_only,
               cells=cells)
    with open(path, "w") as f:
        json.dump(job, f)


def read_job(path: str) -> Dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def batch_lengths(job: Dict[str, Any]) -> Dict[str, Dict[str, int]]:
    """A job's batch lengths per cell, the ``preset`` of the jobs after it."""
    return {cell_key(c["op"], c["requested"]): c["inner"] for c in job["cells"]}


def merge(jobs: Sequence[Dict[str, Any]], raw: Sequence[Dict[str, Any]] = ()
          ) -> List[Dict[str, Any]]:
    """Rows (:func:`make_row`) from several jobs' samples: ``jobs`` of every variant and
    ``raw`` jobs of mpi4py alone at another thread level. Raw mpi4py's samples go by the
    level of their job: at MPI_THREAD_MULTIPLE to ``mpi4py``, below it to
    :data:`SERIALIZED`. Per variant, the median and the best over the rounds of all
    jobs together; ``rounds`` counts the first kind's rounds, ``loadavg`` is their jobs'
    mean."""
    rows = []
    for cell in jobs[0]["cells"]:
        key = cell_key(cell["op"], cell["requested"])
        pooled: Dict[str, List[float]] = {}
        inner: Dict[str, int] = {}
        loads = []
        for job in [*jobs, *raw]:
            same = next(c for c in job["cells"] if cell_key(c["op"], c["requested"]) == key)
            if not job["raw_only"]:
                loads.append(same["loadavg"])
            for v, values in same["samples"].items():
                name = (SERIALIZED if v == "mpi4py" and job["thread_level"] != "multiple"
                        else v)
                pooled.setdefault(name, []).extend(values)
                inner[name] = same["inner"][v]
        rounds = sum(len(next(c for c in job["cells"] if cell_key(
            c["op"], c["requested"]) == key)["samples"]["hpccomm"]) for job in jobs)
        median = {v: float(np.median(s)) for v, s in pooled.items()}
        best = {v: float(np.min(s)) for v, s in pooled.items()}
        variants = [v for v in VARIANTS + SHM_VARIANTS + [SERIALIZED] if v in pooled]
        row = make_row(cell["op"], jobs[0]["ranks"], cell["bytes"], rounds, variants, inner,
                       median, best)
        if SERIALIZED in pooled:
            row[f"{SERIALIZED}_rounds"] = len(pooled[SERIALIZED])
        row["loadavg"] = round(sum(loads) / len(loads), 2)
        rows.append(row)
    return rows


Words = Union[Sequence[str], Callable[[int], Sequence[str]]]


def pairs(first: Words, second: Words, repeats: int) -> List[Tuple[str, Sequence[str]]]:
    """``repeats`` pairs of jobs: ``("a", first)`` (every variant at the default thread
    level), then ``("b", second)`` (mpi4py alone at MPI_THREAD_SERIALIZED). Each is an
    argument list, or a function of the pair's index that returns one."""
    return [(kind, job(r) if callable(job) else job)
            for r in range(repeats) for kind, job in (("a", first), ("b", second))]


def job_commands(jobs: Sequence[Tuple[str, Sequence[str]]], folder: str,
                 launch_command: Callable[[List[str]], List[str]]
                 ) -> List[Tuple[str, List[str], str]]:
    """``(label, command, samples file)`` of each ``(label, words)`` job, in order:
    ``words`` is a job that takes ``--samples-out`` and ``--inner-from`` (``-m
    hpccomm.cli.bench ...``); every job after the first reuses the first's batch lengths, so
    all jobs pay the same barrier skew."""
    out = []
    calibrated = os.path.join(folder, "job0.json")
    for index, (label, words) in enumerate(jobs):
        path = os.path.join(folder, f"job{index}.json")
        extra = ["--samples-out", path] + (["--inner-from", calibrated] if index else [])
        out.append((label, launch_command([*words, *extra]), path))
    return out


def run_jobs(jobs: Sequence[Tuple[str, Sequence[str]]],
             launch_command: Callable[[List[str]], List[str]],
             timeout: Optional[float] = None) -> List[Tuple[str, Dict[str, Any]]]:
    """Run the jobs of :func:`job_commands` one after another (never two at once: they
    would share the cores); ``(label, job as read by read_job)`` for each. Raises
    ``RuntimeError`` when a job fails. Never initializes MPI."""
    found = []
    with tempfile.TemporaryDirectory(prefix="hpccomm-bench-") as folder:
        commands = job_commands(jobs, folder, launch_command)
        for index, (label, command, path) in enumerate(commands, 1):
            t0 = time.perf_counter()
            done = subprocess.run(command, timeout=timeout, preexec_fn=_die_with_parent)
            if done.returncode != 0 or not os.path.exists(path):
                raise RuntimeError(f"job {index} of {len(commands)} failed (exit status "
                                   f"{done.returncode}): {shlex.join(command)}")
            job = read_job(path)
            found.append((label, job))
            print(f"# job {index}/{len(commands)} ({label}: thread level "
                  f"{job['thread_level']}{', mpi4py alone' if job['raw_only'] else ''}) took "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return found


def _die_with_parent() -> None:
    """In a job's launcher, before it starts (Linux): SIGTERM when the process that
    alternates the jobs dies, so that killing it (a timeout, a lost terminal) cannot leave
    a job running on the cores the next measurement needs."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def alternate(first: Words, second: Words, repeats: int,
              launch_command: Callable[[List[str]], List[str]], timeout: Optional[float] = None
              ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """``(first's jobs, second's jobs)`` of :func:`pairs` run by :func:`run_jobs`. A
    process has one MPI thread level, so comparing two needs two jobs; alternating them
    in rounds spreads a change of the machine's load over both."""
    done = run_jobs(pairs(first, second, repeats), launch_command, timeout)
    return [job for kind, job in done if kind == "a"], [job for kind, job in done if kind == "b"]


def shm_setup(comm: Any, ops: Sequence[str], sizes: Sequence[int]
              ) -> Tuple[Any, Optional[np.ndarray]]:
    """``(group of every rank with HPCCOMM_SHM=0, float32 array in shared memory)``; the
    array is ``None`` when the default group does not use shared memory (several nodes,
    or ``HPCCOMM_SHM=0``). One array serves every case, so it is allocated once."""
    from .. import shm
    from ..group import new_group

    with settings.SHM.overridden("0"):
        plain = new_group(list(range(comm.size)))
    arena = None
    if any(op in SHM_OPS for op in ops):
        count = max(1, max(sizes) // 4)
        count = -(-count // comm.size) * comm.size
        arena = shm.empty(2 * count + comm.size, np.float32)
        if not shm.is_shared(arena):
            arena = None
    return plain, arena


def format_row(row: Dict[str, Any]) -> str:
    """One line of the table ``hpccomm bench`` prints."""
    cells = [f"{row['op']:22s}", f"{size_text(row['bytes']):>8s}"]
    for v in VARIANTS:
        if f"{v}_us" in row:
            cells.append(f"{row[f'{v}_us']:10.2f}")
    cells.append(f"{row['hpccomm_over_mpi4py_bw']:8.3f}")
    if "gloo_over_hpccomm_time" in row:
        cells.append(f"{row['gloo_over_hpccomm_time']:8.1f}x")
    for v in SHM_VARIANTS:
        cells.append(f"{row[f'{v}_us']:10.2f}" if f"{v}_us" in row else f"{'-':>10s}")
    for key in ("noshm_over_mpi4py_bw", "window_of_ceiling"):
        cells.append(f"{row[key]:8.3f}" if key in row else f"{'-':>8s}")
    key = f"{SERIALIZED}_us"
    cells.append(f"{row[key]:10.2f}" if key in row else f"{'-':>10s}")
    for key in (f"hpccomm_over_{SERIALIZED}_bw", f"mpi4py_over_{SERIALIZED}_bw"):
        cells.append(f"{row[key]:8.3f}" if key in row else f"{'-':>8s}")
    return " ".join(cells)


def header(gloo: bool) -> str:
    names = ["hpccomm", "async", "mpi4py", "mpi4py nb"] + (["gloo"] if gloo else [])
    tail = ["hp/mpi bw"] + (["gloo/hp"] if gloo else [])
    shm = ["SHM=0", "window", "ceiling"]
    shm_tail = ["=0/mpi bw", "win/ceil"]
    return " ".join([f"{'operation':22s}", f"{'size':>8s}"] + [f"{n:>10s}" for n in names] +
                    [f"{t:>8s}" for t in tail] + [f"{n:>10s}" for n in shm] +
                    [f"{t:>8s}" for t in shm_tail] + [f"{'mpi4py ser':>10s}"] +
                    [f"{t:>8s}" for t in ("hp/ser bw", "mpi/ser bw")]) + "\n" + " " * 32 + \
        "(median µs per operation; mpi4py: blocking call at MPI_THREAD_MULTIPLE; " \
        "mpi4py nb: nonblocking call + Wait at hpccomm's level; SHM=0: hpccomm through " \
        "MPI alone; window: arrays from hpccomm.shm.empty; ceiling: the memory traffic " \
        "alone; mpi4py ser: blocking call at MPI_THREAD_SERIALIZED; the level hpccomm " \
        "does not run at is a second job's)"


def parser() -> argparse.ArgumentParser:
    """The options of ``hpccomm bench`` / ``python -m hpccomm.cli.bench``."""
    p = argparse.ArgumentParser(
        prog="hpccomm bench", description="hpccomm against raw mpi4py (and torch gloo) on "
                                          "the same buffers, interleaved in one job.")
    p.add_argument("--ops", default="all_reduce",
                   help=f"comma-separated, or 'all' ({', '.join(OPS)}); default all_reduce")
    p.add_argument("--sizes", default="8,4K,256K,2M",
                   help="comma-separated byte sizes (8, 4K, 2M...), or 'all' (8 B to 64 MiB "
                        "in powers of 8, plus 1, 4 and 64 MiB); default 8,4K,256K,2M")
    p.add_argument("--budget", type=float, default=0.5,
                   help="seconds of measuring per (operation, size); default 0.5")
    p.add_argument("--gloo", action="store_true",
                   help="also measure torch.distributed's gloo backend (needs torch)")
    p.add_argument("--repeats", type=int, default=3,
                   help="hpccomm bench: pairs of jobs, one at mpi4py's default thread level "
                        "(every variant), one of mpi4py alone at MPI_THREAD_SERIALIZED, "
                        "alternated; each gets BUDGET/REPEATS; default 3")
    p.add_argument("--no-serialized", action="store_true",
                   help="hpccomm bench: one job, without the MPI_THREAD_SERIALIZED column")
    # what one job of the alternation is told (alternate() passes them)
    p.add_argument("--explain", action="store_true",
                   help="print which path each operation and size takes at -n ranks on one "
                        "node, and why, without running anything")
    p.add_argument("--raw-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--thread-level", choices=THREAD_LEVELS + ("other",), default=None,
                   help=argparse.SUPPRESS)
    p.add_argument("--samples-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--inner-from", default=None, help=argparse.SUPPRESS)
    return p


def options(args: argparse.Namespace) -> Tuple[List[str], List[int]]:
    """The operations and sizes that parsed arguments ask for (a clear error otherwise)."""
    ops = OPS if args.ops == "all" else [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown operation(s) {', '.join(unknown)}; "
                                         f"choose from {', '.join(OPS)}")
    sizes = DEFAULT_SIZES if args.sizes == "all" else [parse_size(s) for s in
                                                       args.sizes.split(",") if s.strip()]
    return ops, sizes


def job_words(args: argparse.Namespace, raw_only: bool = False) -> List[str]:
    """``-m hpccomm.cli.bench`` and the options of one job of the alternation (each job
    measures for ``budget / repeats``)."""
    budget = args.budget / max(1, args.repeats)
    words = ["-m", "hpccomm.cli.bench", "--ops", args.ops, "--sizes", args.sizes,
             "--budget", f"{budget:g}"]
    if raw_only:
        return words + ["--raw-only", "--thread-level", "other"]
    return words + (["--gloo"] if args.gloo else [])


def drive(args: argparse.Namespace, launch_command: Callable[[List[str]], List[str]]) -> int:
    """``hpccomm bench``: alternate the two jobs (:func:`alternate`), print the merged
    table. Runs in the launching process, which never initializes MPI."""
    try:
        first, second = alternate(job_words(args), job_words(args, raw_only=True),
                                  max(1, args.repeats), launch_command)
    except RuntimeError as exc:
        print(f"hpccomm bench: {exc}", file=sys.stderr)
        return 1
    job = first[0]
    print(f"# {job['ranks']} ranks; {job['vendor']} {job['version']}; hpccomm "
          f"{job['hpccomm']}; thread level {job['thread_level']}, raw mpi4py also at "
          f"{second[0]['thread_level']}; {len(first)} + {len(second)} jobs alternated "
          f"(mpi4py: at multiple; mpi4py ser: below it)", flush=True)
    print(header(args.gloo), flush=True)
    for row in merge(first, second):
        print(format_row(row), flush=True)
    return 0


def explain(args: argparse.Namespace, n: int, crowded: bool) -> str:
    """``--explain``: the path of each operation and size of ``args`` at ``n`` ranks on
    one node, and why (:mod:`hpccomm.backends.shm.plan`)."""
    from mpi4py import MPI

    from ..backends.shm import pair, plan
    from .bench_cases import case_count

    ops, sizes = options(args)
    cases = [(op, case_count(op, size, n) * 4) for op in ops for size in sizes]
    return plan.explain(cases, n, MPI.get_vendor()[0], crowded, pair.available())


def main(argv: Optional[List[str]] = None) -> int:
    """Run on every rank (under a launcher); rank 0 prints the table (or, with
    ``--samples-out``, writes the job's samples for :func:`merge` instead)."""
    p = parser()
    args = p.parse_args(argv)
    try:
        ops, sizes = options(args)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.thread_level == "other":  # mpi4py where hpccomm would not run MPI
        import mpi4py

        mpi4py.rc.thread_level = ("serialized" if mpi_level.chosen() == "multiple"
                                  else "multiple")
    elif args.thread_level is not None:
        import mpi4py

        mpi4py.rc.thread_level = args.thread_level  # before MPI starts
    else:
        mpi_level.prepare()  # the level hpccomm starts MPI at
    from mpi4py import MPI

    from .._version import __version__
    from ..init import destroy_process_group, init_process_group

    rank = MPI.COMM_WORLD.rank
    if MPI.COMM_WORLD.size < 2:
        if rank == 0:
            print("hpccomm bench: needs at least 2 ranks (hpccomm bench -n 2)", file=sys.stderr)
        return 2
    quiet = args.samples_out is not None
    if args.explain:  # in a job: the paths at its own size, on rank 0
        from ..backends.mpi import placement

        crowded = placement.crowded(MPI.COMM_WORLD)  # collective
        if rank == 0:
            print(explain(args, MPI.COMM_WORLD.size, crowded))
        return 0

    def show(row: Dict[str, Any]) -> None:
        if rank == 0 and not quiet:
            print(format_row(row), flush=True)
    if rank == 0 and not quiet:
        vendor, version = MPI.get_vendor()
        print(f"# {MPI.COMM_WORLD.size} ranks; {vendor} {'.'.join(map(str, version))}; "
              f"hpccomm {__version__}; thread level {thread_level_name()}", flush=True)
        print(header(args.gloo), flush=True)
    preset = batch_lengths(read_job(args.inner_from)) if args.inner_from else None
    cells: List[Dict[str, Any]] = []
    if args.raw_only:
        run(ops, sizes, budget=args.budget, report=show, raw_only=True, preset=preset,
            cells_out=cells)
    else:
        init_process_group()
        td = init_gloo(MPI.COMM_WORLD) if args.gloo else None
        run(ops, sizes, td=td, budget=args.budget, report=show, preset=preset,
            cells_out=cells)
        if td is not None:
            td.destroy_process_group()
        destroy_process_group()
    if args.samples_out:
        write_job(args.samples_out, MPI.COMM_WORLD, cells, args.raw_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
