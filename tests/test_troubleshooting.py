"""docs/troubleshooting.md stays true: every message it shows is made to happen here
(``tests/scripts/troubleshooting_case.py``) and must be printed as the page shows it
(``...`` for what varies; tests/doc_recipes.py matches the lines)."""
import functools
import os
import sys

import pytest

import doc_recipes
from helpers import SCRIPTS, TORCH_LAUNCH, run_job

PAGE = "docs/troubleshooting.md"
SCRIPT = os.path.join(SCRIPTS, "troubleshooting_case.py")
#: case -> world size (None: a plain process, no launcher)
CASES = {"first_steps": None, "torch_without_import": None, "mistakes": 2,
         "store_never_closed": 2, "run_typo": None}
ENTRIES = [block for block in doc_recipes.blocks(PAGE) if block.kind == "text"]


@functools.lru_cache(maxsize=None)
def output_of(case, folder):
    """What ``case`` printed (each case runs once per session)."""
    os.makedirs(folder, exist_ok=True)
    clean = doc_recipes.CLEAN
    if case == "run_typo":
        done = run_job([sys.executable, "-m", "hpccomm", "run", "-n", "2", "trian.py"],
                       cwd=folder, clean=clean, limit=60)
        assert done.code == 2, done.output
        return done.output
    argv = [sys.executable, SCRIPT, case]
    if case == "torch_without_import":
        pytest.importorskip("torch", reason="torch is not installed (pip install "
                                            "'hpccomm[torch]')")
        trial = os.path.join(folder, "trial")
        os.makedirs(trial, exist_ok=True)
        for name, text in (("bench_torch_n2.csv", BENCH_CSV), ("bench_torch_n2.json", BENCH_JSON)):
            with open(os.path.join(trial, name), "w") as f:
                f.write(text)
        argv.append(trial)
    done = run_job(argv, CASES[case], cwd=folder, clean=clean + TORCH_LAUNCH, limit=120)
    return done.output


def test_every_entry_is_made_to_happen():
    """Each message block names the case that makes it happen (so a new entry cannot go
    unchecked), and each case is shown somewhere."""
    assert len(ENTRIES) >= 10, [block.id for block in ENTRIES]
    unnamed = [block.id for block in ENTRIES if "produced-by" not in block.marker]
    assert unnamed == [], f"entries without produced-by: {unnamed}"
    assert {block.marker["produced-by"] for block in ENTRIES} == set(CASES)


@pytest.mark.parametrize("block", ENTRIES, ids=[block.id for block in ENTRIES])
def test_the_message_shown_is_the_one_printed(block, tmp_path_factory):
    case = block.marker["produced-by"]
    output = output_of(case, str(tmp_path_factory.getbasetemp() / case))
    missing = doc_recipes.output_matches(block.text.rstrip("\n").split("\n"), output)
    assert missing is None, (f"{block.id}: case {case} did not print {missing!r}; it "
                             f"printed:\n{output[-6000:]}")


#: A 2-rank run's numbers, for --render (the benchmark's own columns).
BENCH_CSV = (
    "bytes,rounds,gloo_rounds,mpi4py_us,mpi4py_min_us,hpccomm_numpy_us,hpccomm_numpy_min_us,"
    "torch_hpccomm_us,torch_hpccomm_min_us,torch_hpccomm_async_us,torch_hpccomm_async_min_us,"
    "gloo_us,gloo_min_us,torch_hpccomm_over_mpi4py_time,torch_hpccomm_minus_numpy_us,"
    "gloo_over_torch_hpccomm_time\n"
    "8,10,10,6.5,6.0,3.5,3.0,6.0,5.5,15.0,14.0,600.0,550.0,0.92,2.5,100.0\n")
BENCH_JSON = (
    '{"ranks": 2, "date": "2026-01-01T00:00:00", "host": "vm", "cpus": 2, '
    '"load_before": 0.5, "load_after": 0.6, "mpi": "MPICH Version: 5.0.2", '
    '"torch": "2.13.0", "command": "mpiexec -n 2 python benchmarks/torch_backend.py", '
    '"ddp": {"width": 64, "depth": 2, "batch": 8, "params": 8000, "mpi4py_ms": 1.0, '
    '"mpi4py_min_ms": 0.9, "torch_hpccomm_ms": 1.2, "torch_hpccomm_min_ms": 1.1, '
    '"gloo_ms": 2.0, "gloo_min_ms": 1.9}}\n')
