"""The frameworks PyTorch users come through, on hpccomm, with the real packages.

Each recipe of docs/frameworks.md (examples/frameworks/), run with the command the page
shows for it (read from the page), trains a few steps under mpiexec on hpccomm ("hpccomm" for Lightning, torch's "mpi" for Accelerate and DeepSpeed)
and again on torch's gloo (started by ``hpccomm run --torch``, which sets MASTER_ADDR and
MASTER_PORT); the final weights must be identical on every rank and agree between the
two backends to float32 round-off. Also the scripts that need no edit at all under
``hpccomm run --torch``: one written for torch's MPI backend, one written for torchrun.
A framework that is not installed is skipped, naming the extra that installs it.
"""
import importlib.util
import json
import os
import shlex
import sys
import warnings

import pytest

import doc_recipes
from helpers import TORCH_LAUNCH, run_job

pytest.importorskip("torch", reason="torch is not installed (pip install 'hpccomm[torch]'); "
                                    "the torch backend is untested")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = 300  # DeepSpeed compiles its CPU communication op on its first run (about a minute)

#: recipe -> (package it needs, hpccomm's backend name for it, world sizes tested: the
#: one docs/frameworks.md shows among them)
CASES = {
    "recipe_lightning.py": ("pytorch_lightning", "hpccomm", (2,)),
    "recipe_fabric.py": ("lightning_fabric", "hpccomm", (2,)),
    "recipe_accelerate.py": ("accelerate", "mpi", (2, 4)),
    "recipe_deepspeed.py": ("deepspeed", "mpi", (2,)),
}
PAGE = "docs/frameworks.md"
SHOWN = doc_recipes.page_commands(PAGE)


def shown(prefix):
    """The page's commands that start with ``prefix``, as words."""
    return [shlex.split(command) for command in SHOWN if command.startswith(prefix)]


def test_the_page_shows_the_commands_run_here():
    """Each recipe's command on the page is the one these tests run (at one of their
    world sizes), and so are the scripts that run under hpccomm run --torch."""
    recipes = shown("mpiexec -n ")
    assert sorted(words[4] for words in recipes) == sorted(
        f"examples/frameworks/{recipe}" for recipe in CASES), SHOWN
    for words in recipes:
        assert words[:2] == ["mpiexec", "-n"] and words[3] == "python" and len(words) == 5, words
        assert int(words[2]) in CASES[os.path.basename(words[4])][2], words
    torch_runs = [" ".join(words) for words in shown("hpccomm run --torch ")]
    assert torch_runs == ["hpccomm run --torch -n 4 examples/torch_mpi_backend.py",
                          "hpccomm run --torch -n 4 train.py"], SHOWN


def recipe_argv(recipe):
    """The recipe's command line on the page, from ``python`` on (this Python)."""
    for words in shown("mpiexec -n "):
        if os.path.basename(words[4]) == recipe:
            return [sys.executable, os.path.join(ROOT, words[4])]
    raise AssertionError(f"{PAGE} shows no command for {recipe}")


#: How gloo's teardown sometimes ends a process that has finished its work: a C++
#: thread still running when its owner is destroyed at exit (torch's own issue).
GLOO_TEARDOWN = "terminate called without an active exception"


def launch(argv, n=None, finished=None, env=None):
    """Run ``argv`` (as ``n`` ranks under mpiexec, or alone); it must exit 0, unless
    ``finished()`` says that every rank wrote its results and the output shows gloo's
    teardown crash (the reference runs only)."""
    done = run_job(argv, n, clean=TORCH_LAUNCH, limit=LIMIT, env=env or {})
    output = done.output
    if done.code != 0 and finished is not None and finished() and (
            GLOO_TEARDOWN in output):
        warnings.warn(f"the gloo reference crashed at exit after its work: {GLOO_TEARDOWN}")
        return output
    assert done.code == 0, output[-6000:]
    return output


def weights(out_dir, n):
    found = {}
    for rank in range(n):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
            found[rank] = json.load(f)
    return found


def trained(recipe, n, backend, tmp_path):
    """Each rank's ``{"backend", "weights"}`` after the recipe ran on ``backend``."""
    out = tmp_path / backend
    out.mkdir()
    argv = recipe_argv(recipe)
    script = argv[1]
    # the ops DeepSpeed compiles go to this test's own folder: a build killed elsewhere
    # (its lock file left behind in ~/.cache) cannot make this one wait
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")}
    if backend == "gloo":  # gloo needs torchrun's variables: hpccomm run --torch sets them
        launch([sys.executable, "-m", "hpccomm", "run", "--torch", "-n", str(n), script,
                "--backend", "gloo", "--out", str(out)],
               finished=lambda: all((out / f"rank{r}.json").exists() for r in range(n)),
               env=env)
    else:  # as the recipe says: plain mpiexec, the backend's default choice
        launch(argv + ["--out", str(out)], n, env=env)
    return weights(out, n)


@pytest.mark.parametrize("recipe,n", [(recipe, n) for recipe, (_, _, sizes) in CASES.items()
                                      for n in sizes])
def test_recipe_trains_like_gloo(recipe, n, tmp_path):
    import torch

    package, backend, _ = CASES[recipe]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (pip install 'hpccomm[frameworks]')")
    ours = trained(recipe, n, backend, tmp_path)
    assert {r["backend"] for r in ours.values()} == {backend}, ours
    first = ours[0]["weights"]
    for rank, result in ours.items():
        assert result["weights"] == first, f"{recipe}: rank {rank}'s weights differ from rank 0's"
    reference = trained(recipe, n, "gloo", tmp_path)
    assert {r["backend"] for r in reference.values()} == {"gloo"}, reference
    torch.testing.assert_close(torch.tensor(first), torch.tensor(reference[0]["weights"]),
                               rtol=1e-5, atol=1e-6)


# -- no edit at all: hpccomm run --torch -----------------------------------------------------------
TORCHRUN_SCRIPT = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")  # env://, as under torchrun
x = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(x)
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.txt"), "w") as f:
    f.write(f"rank={os.environ['RANK']} local={os.environ['LOCAL_RANK']} "
            f"of={os.environ['LOCAL_WORLD_SIZE']} sum={x.item():.0f} "
            f"addr={os.environ['MASTER_ADDR']} port={os.environ['MASTER_PORT']}")
dist.destroy_process_group()
"""


@pytest.mark.parametrize("n", [2, 4])
def test_torchrun_script_runs_unchanged(n, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    output = launch([sys.executable, "-m", "hpccomm", "run", "--torch", "-n", str(n),
                     str(script), str(out)])
    # one file per rank: the launcher may interleave the ranks' printed lines
    found = [dict(item.split("=") for item in path.read_text().split())
             for path in sorted(out.iterdir())]
    assert sorted(int(f["rank"]) for f in found) == list(range(n)), output
    # one node: local ranks are 0..n-1 in the launcher's own order (Open MPI's may differ)
    assert sorted(int(f["local"]) for f in found) == list(range(n)), output
    assert {f["of"] for f in found} == {str(n)} and {f["sum"] for f in found} == {
        str(n * (n + 1) // 2)}, output
    assert len({(f["addr"], f["port"]) for f in found}) == 1, output


@pytest.mark.parametrize("n", [2, 4])
def test_torch_mpi_backend_script_runs_unchanged(n, tmp_path):
    script = os.path.join(ROOT, "examples", "torch_mpi_backend.py")
    output = launch([sys.executable, "-m", "hpccomm", "run", "--torch", "-n", str(n), script])
    assert f"backend 'mpi' on {n} ranks: collectives and DDP match one process" in output


def test_without_hpccomm_torch_the_script_gets_torch_s_own_error(tmp_path):
    script = os.path.join(ROOT, "examples", "torch_mpi_backend.py")
    done = run_job([sys.executable, script], 1, clean=TORCH_LAUNCH, limit=120)
    assert done.code != 0
    assert "Distributed package doesn't have MPI built in" in done.output
