"""torch.distributed on backend "hpccomm" vs "gloo" vs raw mpi4py, side by side in ONE run.

Run under an MPI launcher; rank 0 writes the results into docs/results/::

    mpiexec -n 2 python benchmarks/torch_backend.py          # ~2 minutes on 2 idle cores

Every process makes torch's default group on "hpccomm" (``mpi://``), a gloo group over
the same ranks (``new_group(backend="gloo")``) and hpccomm's own NumPy world, so all
variants run in the same processes on the same buffers (a NumPy array and the tensor
``torch.from_numpy`` makes of it):

* ``mpi4py``         ``comm.Allreduce(IN_PLACE, a)``: the floor
* ``hpccomm_numpy``  ``hpccomm.all_reduce(a)``: hpccomm's NumPy path
* ``torch_hpccomm``  ``torch.distributed.all_reduce(t)`` on the "hpccomm" group
* ``torch_hpccomm_async``  the same with ``async_op=True`` and ``wait()``
* ``gloo``           ``torch.distributed.all_reduce(t, group=gloo)``

Sizes 8 B to 64 MiB (float32). The measurement is :func:`hpccomm.cli.bench.measure`: rounds
of one batch per variant in a random order drawn afresh each round (the same on every
rank), each batch after a barrier; a sample is batch time / batch length, the maximum
over ranks; reported are the median and the best round. gloo is measured the same way
right after the MPI variants, in rounds of its own on the same buffers: its worker
threads keep running for a while after each call returns, and with as many ranks as
cores they would slow whichever variant followed it in a shared round.

Then a DDP training step (forward, backward with DDP's bucketed all-reduces, SGD) of the
same MLP on "hpccomm" and on "gloo", and the same step with the gradients all-reduced by
one ``comm.Allreduce`` of a flat buffer (no overlap: the floor of the communication),
measured the same way.

Outputs: ``docs/results/bench_torch_n{N}.csv`` (one row per size), ``docs/results/bench_torch_n{N}.json``
(metadata: load average before and after, versions), ``docs/results/bench_torch_n{N}.md`` (the
tables and the goals checked) and ``docs/results/bench_torch_n{N}.png`` (the plot), or the
same names in ``--out DIR``. It needs torch and, for the plot, matplotlib (the ``bench``
extra: ``pip install 'hpccomm[bench]'``); without matplotlib it says so before it
measures, and writes everything but the plot.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import os
import platform
import warnings
from typing import Any, Dict, List

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from mpi4py import MPI

import hpccomm.torch  # noqa: F401  (registers "hpccomm" and mpi://)
from hpccomm import collectives as hpccomm_collectives
from hpccomm import init as hpccomm_init
from hpccomm.cli.bench import DEFAULT_SIZES, measure, size_text

from common import RESULTS, write_csv

warnings.filterwarnings("ignore", category=FutureWarning)

VARIANTS = ["mpi4py", "hpccomm_numpy", "torch_hpccomm", "torch_hpccomm_async", "gloo"]
DDP_VARIANTS = ["mpi4py", "torch_hpccomm", "gloo"]
KiB = 1024


def all_reduce_rows(comm: Any, gloo: Any, sizes: List[int], budget: float) -> List[Dict]:
    rows = []
    for nbytes in sizes:
        a = np.zeros(max(1, nbytes // 4), np.float32)
        t = torch.from_numpy(a)
        fns = {
            "mpi4py": lambda: comm.Allreduce(MPI.IN_PLACE, a),
            "hpccomm_numpy": lambda: hpccomm_collectives.all_reduce(a),
            "torch_hpccomm": lambda: dist.all_reduce(t),
            "torch_hpccomm_async": lambda: dist.all_reduce(t, async_op=True).wait(),
        }
        inner, rounds, median, best = measure(comm, fns, a.nbytes, budget)
        gloo_rounds = _measure_alone(comm, "gloo", lambda: dist.all_reduce(t, group=gloo),
                                     a.nbytes, budget, median, best)
        row: Dict[str, Any] = {"bytes": a.nbytes, "rounds": rounds, "gloo_rounds": gloo_rounds}
        for v in VARIANTS:
            row[f"{v}_us"] = median[v] * 1e6
        for v in VARIANTS:
            row[f"{v}_min_us"] = best[v] * 1e6
        row["torch_hpccomm_over_mpi4py_time"] = median["torch_hpccomm"] / median["mpi4py"]
        row["torch_hpccomm_minus_numpy_us"] = (median["torch_hpccomm"] -
                                               median["hpccomm_numpy"]) * 1e6
        row["gloo_over_torch_hpccomm_time"] = median["gloo"] / median["torch_hpccomm"]
        rows.append(row)
        if comm.rank == 0:
            print(f"all_reduce {size_text(a.nbytes):>8s}: " +
                  " ".join(f"{v}={row[f'{v}_us']:.1f}" for v in VARIANTS) + " us",
                  flush=True)
    return rows


def _measure_alone(comm: Any, name: str, fn: Any, nbytes: int, budget: float,
                   median: Dict[str, float], best: Dict[str, float], **kwargs: Any) -> int:
    """Measure gloo in rounds of its own, right after the MPI variants, on the same
    buffers: its worker threads keep running after each call returns and, with as many
    ranks as cores, would slow whichever variant ran next in an interleaved round."""
    _, rounds, alone_median, alone_best = measure(comm, {name: fn}, nbytes, budget, **kwargs)
    median.update(alone_median)
    best.update(alone_best)
    return rounds


def make_mlp(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers: List[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def ddp_row(comm: Any, gloo: Any, width: int, depth: int, batch: int,
            budget: float) -> Dict[str, Any]:
    """One training step per variant: DDP on hpccomm, DDP on gloo, and a flat all-reduce."""
    x, y = torch.randn(batch, width), torch.randn(batch, 1)
    models = {
        "torch_hpccomm": nn.parallel.DistributedDataParallel(make_mlp(width, depth)),
        "gloo": nn.parallel.DistributedDataParallel(make_mlp(width, depth),
                                                    process_group=gloo),
    }
    raw = make_mlp(width, depth)
    flat = np.zeros(sum(p.numel() for p in raw.parameters()), np.float32)
    grads = torch.from_numpy(flat)
    opts = {name: torch.optim.SGD(m.parameters(), lr=1e-4) for name, m in models.items()}
    raw_opt = torch.optim.SGD(raw.parameters(), lr=1e-4)

    def ddp_step(name: str) -> None:
        opts[name].zero_grad()
        nn.functional.mse_loss(models[name](x), y).backward()
        opts[name].step()

    def raw_step() -> None:
        raw_opt.zero_grad()
        nn.functional.mse_loss(raw(x), y).backward()
        offset = 0
        for p in raw.parameters():
            grads[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
            offset += p.numel()
        comm.Allreduce(MPI.IN_PLACE, flat)
        offset = 0
        for p in raw.parameters():
            p.grad.copy_(grads[offset:offset + p.numel()].view_as(p)).div_(comm.size)
            offset += p.numel()
        raw_opt.step()

    fns = {"mpi4py": raw_step, "torch_hpccomm": lambda: ddp_step("torch_hpccomm")}
    inner, rounds, median, best = measure(comm, fns, flat.nbytes, budget, batch=0.05,
                                          min_rounds=5)
    gloo_rounds = _measure_alone(comm, "gloo", lambda: ddp_step("gloo"), flat.nbytes,
                                 budget, median, best, batch=0.05, min_rounds=5)
    row: Dict[str, Any] = {"params": flat.size, "grad_bytes": flat.nbytes, "width": width,
                           "depth": depth, "batch": batch, "rounds": rounds,
                           "gloo_rounds": gloo_rounds}
    for v in DDP_VARIANTS:
        row[f"{v}_ms"] = median[v] * 1e3
        row[f"{v}_min_ms"] = best[v] * 1e3
    if comm.rank == 0:
        print("DDP step: " + " ".join(f"{v}={row[f'{v}_ms']:.2f}" for v in DDP_VARIANTS) +
              " ms", flush=True)
    return row


# -- the report ---------------------------------------------------------------------------
def goals(rows: List[Dict]) -> List[str]:
    """The performance goals, each with the measured verdict."""
    big = [r for r in rows if r["bytes"] >= 256 * KiB]
    worst_big = max(r["torch_hpccomm_over_mpi4py_time"] for r in big) if big else float("nan")
    small = rows[0]
    slower_than_gloo = [size_text(r["bytes"]) for r in rows
                        if r["gloo_over_torch_hpccomm_time"] <= 1.0]
    return [
        f"- within 10% of raw mpi4py from 256 KiB up: worst torch/mpi4py time ratio "
        f"{worst_big:.3f} ({'met' if worst_big <= 1.10 else 'NOT met'})",
        f"- at {size_text(small['bytes'])}, no worse than hpccomm's NumPy path + 5 us: "
        f"{small['torch_hpccomm_minus_numpy_us']:+.2f} us "
        f"({'met' if small['torch_hpccomm_minus_numpy_us'] <= 5 else 'NOT met'})",
        "- faster than gloo at every size: "
        + ("met" if not slower_than_gloo else f"NOT met at {', '.join(slower_than_gloo)}")
        + f" (gloo/hpccomm time ratio {min(r['gloo_over_torch_hpccomm_time'] for r in rows):.1f}"
          f"x to {max(r['gloo_over_torch_hpccomm_time'] for r in rows):.1f}x)",
    ]


def markdown(rows: List[Dict], ddp: Dict, meta: Dict) -> str:
    lines = [f"# torch.distributed on hpccomm: {meta['ranks']} ranks", "",
             f"Generated by `{meta['command']}` on {meta['date']}: {meta['host']}, "
             f"{meta['cpus']} CPUs, load average {meta['load_before']:.2f} before and "
             f"{meta['load_after']:.2f} after; {meta['mpi']}; torch {meta['torch']}. "
             "Median of rounds, maximum over ranks: the MPI variants interleaved in "
             "each round; gloo measured right after in rounds of its own on the same "
             "buffers (its worker threads keep running after each call and would slow "
             "the variant after it).", "",
             "## all_reduce (float32, µs per call)", "",
             "| size | mpi4py | hpccomm NumPy | torch hpccomm | torch hpccomm async | "
             "torch gloo | torch hpccomm / mpi4py | torch hpccomm - NumPy | gloo / torch "
             "hpccomm |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {size_text(r['bytes'])} | " +
                     " | ".join(f"{r[f'{v}_us']:.1f}" for v in VARIANTS) +
                     f" | {r['torch_hpccomm_over_mpi4py_time']:.2f} | "
                     f"{r['torch_hpccomm_minus_numpy_us']:+.1f} µs | "
                     f"{r['gloo_over_torch_hpccomm_time']:.1f}x |")
    lines += ["", "Goals:", ""] + goals(rows) + [
        "", f"## DDP training step (ms; MLP {ddp['depth']}x{ddp['width']}, "
            f"{ddp['params'] / 1e6:.1f} M parameters, batch {ddp['batch']} per rank)", "",
        "| flat mpi4py Allreduce (no overlap) | DDP on hpccomm | DDP on gloo |",
        "|---:|---:|---:|",
        "| " + " | ".join(f"{ddp[f'{v}_ms']:.2f}" for v in DDP_VARIANTS) + " |", ""]
    return "\n".join(lines)


def plot(rows: List[Dict], ddp: Dict, meta: Dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["bytes"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for v, style in zip(VARIANTS, ["k-", "b--", "r-o", "m:", "g-s"]):
        left.loglog(sizes, [r[f"{v}_us"] for r in rows], style, label=v, markersize=3)
    left.set_xlabel("bytes")
    left.set_ylabel("µs per all_reduce (median)")
    left.set_title(f"all_reduce, {meta['ranks']} ranks (load {meta['load_before']:.1f})")
    left.legend(fontsize=8)
    left.grid(True, which="both", alpha=0.3)
    for v, style in zip(VARIANTS[1:], ["b--", "r-o", "m:", "g-s"]):
        right.semilogx(sizes, [r[f"{v}_us"] / r["mpi4py_us"] for r in rows], style,
                       label=v, markersize=3)
    right.axhline(1.10, color="grey", linestyle=":", label="mpi4py + 10%")
    right.set_yscale("log")
    right.set_xlabel("bytes")
    right.set_ylabel("time / mpi4py time")
    right.set_title(f"relative to mpi4py; DDP step: hpccomm {ddp['torch_hpccomm_ms']:.1f} ms, "
                    f"gloo {ddp['gloo_ms']:.1f} ms")
    right.legend(fontsize=8)
    right.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


#: What a run without matplotlib says before it measures, and ``--render`` instead of
#: drawing (neither fails: the table and the numbers are what the run is for).
NO_MATPLOTLIB = ("benchmarks/torch_backend.py: matplotlib is not installed, so no plot "
                 "(.png) is drawn; the table (.md) and the numbers (.csv, .json) are written. "
                 "pip install 'hpccomm[bench]' (or matplotlib), then redraw with --render N")


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def render(stem: str) -> bool:
    """The markdown table and the plot of a finished run, from its CSV and JSON; whether
    the plot was drawn (it needs matplotlib)."""
    with open(stem + ".csv", newline="") as f:
        rows = [{k: (int(v) if k in ("bytes", "rounds", "gloo_rounds") else float(v)) for k, v in r.items()}
                for r in csv.DictReader(f)]
    with open(stem + ".json") as f:
        meta = json.load(f)
    with open(stem + ".md", "w") as f:
        f.write(markdown(rows, meta["ddp"], meta))
    if not has_matplotlib():
        return False
    plot(rows, meta["ddp"], meta, stem + ".png")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="all",
                        help="comma-separated byte counts, or 'all' (8 B to 64 MiB)")
    parser.add_argument("--budget", type=float, default=1.0,
                        help="seconds of measuring per size (default 1.0)")
    parser.add_argument("--ddp", default="1024x4x32",
                        help="DDP model WIDTHxDEPTHxBATCH, or 'none' (default 1024x4x32)")
    parser.add_argument("--out", default=RESULTS,
                        help="directory for the outputs, made if missing (default "
                             "docs/results/, or $BENCH_RESULTS)")
    parser.add_argument("--render", type=int, metavar="N",
                        help="measure nothing: rewrite the table and plot of an N-rank run "
                             "from its CSV and JSON in --out (no launcher needed)")
    args = parser.parse_args()
    if args.render:
        stem = os.path.join(args.out, f"bench_torch_n{args.render}")
        drawn = render(stem)
        print(f"wrote {stem}.md" + (" and .png" if drawn else ""), flush=True)
        if not drawn:
            print(NO_MATPLOTLIB, flush=True)
        return
    if not has_matplotlib() and MPI.COMM_WORLD.rank == 0:
        print(NO_MATPLOTLIB, flush=True)
    sizes = DEFAULT_SIZES if args.sizes == "all" else [int(s) for s in args.sizes.split(",")]
    load_before = os.getloadavg()[0]
    torch.set_num_threads(1)  # one core per rank, as the ranks share the node
    dist.init_process_group("hpccomm", init_method="mpi://")
    gloo = dist.new_group(backend="gloo")
    hpccomm_init.init_process_group()
    comm = MPI.COMM_WORLD.Dup()
    rows = all_reduce_rows(comm, gloo, sizes, args.budget)
    ddp = {}
    if args.ddp != "none":
        width, depth, batch = (int(v) for v in args.ddp.split("x"))
        ddp = ddp_row(comm, gloo, width, depth, batch, args.budget * 10)
    if comm.rank == 0:
        meta = {"ranks": comm.size, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                "host": platform.node(), "cpus": os.cpu_count(),
                "load_before": load_before, "load_after": os.getloadavg()[0],
                "mpi": " ".join(MPI.Get_library_version().split()[:3]),
                "torch": torch.__version__,
                "command": f"mpiexec -n {comm.size} python benchmarks/torch_backend.py",
                "ddp": ddp}
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"bench_torch_n{comm.size}")
        write_csv(stem + ".csv", rows)
        with open(stem + ".json", "w") as f:
            json.dump(meta, f, indent=1)
        drawn = ddp and render(stem)
        print("\n".join(goals(rows)), flush=True)
        print(f"wrote {stem}.csv/.json{'/.md' if ddp else ''}{'/.png' if drawn else ''} "
              f"(load {load_before:.2f} -> {meta['load_after']:.2f})", flush=True)
    comm.Free()
    hpccomm_init.destroy_process_group()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
