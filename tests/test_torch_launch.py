"""Backend "hpccomm" started as users start it, and broken on purpose: each scenario is
its own ``mpiexec`` job (tests/scripts/torch_case.py), run from a serial test with a
hard time limit. Also the packaging promises: ``import hpccomm`` never imports torch,
and ``hpccomm.torch`` says what is missing when torch is.
"""
import os
import re
import subprocess
import sys

import pytest

import doc_recipes
from helpers import TORCH_LAUNCH, result_lines, run_job

pytest.importorskip("torch", reason="torch is not installed (pip install 'hpccomm[torch]'); "
                                    "the torch backend is untested")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASE = os.path.join(ROOT, "tests", "scripts", "torch_case.py")


def run(args, n=None, limit=120, **env):
    """``python args`` (under ``mpiexec -n n`` if ``n``): its exit status and output.
    torch's launch variables reach it only when ``env`` sets them."""
    job = run_job([sys.executable, *args], n, env=env, clean=TORCH_LAUNCH, limit=limit)
    return job.code, job.output


# -- packaging -------------------------------------------------------------------------------
def test_import_hpccomm_never_imports_torch():
    code, output = run(["-c", "import sys, hpccomm; hpccomm.ReduceOp.SUM; "
                              "print(sorted(m for m in sys.modules if m.split('.')[0] == "
                              "'torch'))"])
    assert code == 0, output
    assert output.strip().endswith("[]"), output


def test_hpccomm_torch_without_torch_names_the_extra():
    code, output = run(["-c", "import sys; sys.modules['torch'] = None; import hpccomm.torch"])
    assert code != 0
    assert "pip install 'hpccomm[torch]'" in output, output


def test_import_registers_backend_and_rendezvous():
    code, output = run(["-c", "import torch.distributed as d, importlib; import hpccomm.torch; "
                              "import hpccomm.torch; r = importlib.import_module("
                              "'torch.distributed.rendezvous'); "
                              "print('HPCCOMM' in d.Backend._plugins, "
                              "'mpi' in r._rendezvous_handlers, d.Backend.HPCCOMM)"])
    assert code == 0, output
    assert output.strip().endswith("True True hpccomm"), output


# -- starting ------------------------------------------------------------------------------------
def test_env_init_with_renumbered_ranks():
    code, output = run([CASE, "env_init"], n=2, MASTER_PORT=free_port())
    assert code == 0, output
    found = result_lines(output)
    assert sorted(rank for rank, _ in found) == [0, 1], output
    assert sorted(fields["mpi_rank"] for _, fields in found) == ["0", "1"], output


def test_reinit_after_destroy():
    code, output = run([CASE, "reinit"], n=2)
    assert code == 0, output
    assert len(result_lines(output)) == 2, output


def test_mixed_cpu_hpccomm_cuda_nccl():
    code, output = run([CASE, "mixed_backend"], n=2)
    assert code == 0, output
    assert len(result_lines(output)) == 2, output


def test_world_that_is_not_the_mpi_job_is_refused():
    code, output = run([CASE, "wrong_world_size"])
    found = result_lines(output)
    assert found, output
    error = found[0][1]["error"]
    assert "torch's world has 2 processes but MPI's has 1" in error, output
    assert "mpiexec" in error


def test_below_thread_multiple_warns_and_still_completes_futures():
    code, output = run([CASE, "thread_serialized"], n=2, HPCCOMM_MPI_THREAD_LEVEL="serialized")
    assert code == 0, output
    found = result_lines(output)
    assert len(found) == 2, output
    for _, fields in found:
        assert fields["warned"] == "True" and fields["level"] == "2", output  # SERIALIZED


def test_torch_debug_detail_on_every_name():
    """TORCH_DISTRIBUTED_DEBUG=DETAIL, where torch wraps the backends it knows for extra
    checks: hpccomm's groups work under it, by each name."""
    code, output = run([CASE, "debug_detail"], n=2, TORCH_DISTRIBUTED_DEBUG="DETAIL")
    assert code == 0, output
    found = result_lines(output)
    assert sorted(fields["backend"] for _, fields in found) == sorted(
        ["mpi", "hpccomm", "cpu:hpccomm,cuda:nccl"] * 2), output


# -- failing ----------------------------------------------------------------------------------
def test_every_kind_of_wait_times_out_naming_the_operation():
    code, output = run([CASE, "timeouts"], n=2)
    assert code == 0, output
    found = {fields["case"]: fields for rank, fields in result_lines(output)}
    assert set(found) == {"sync_all_reduce", "future_wait", "work_wait_timeout",
                          "barrier_opts_timeout", "monitored"}, output
    for case, fields in found.items():
        assert "error" in fields, f"{case} did not fail: {output}"
        assert float(fields["elapsed"]) < 4.0, fields  # the 1 s / 0.5 s limits, not 60 s
        if case == "future_wait":  # failed in C++ too (DDP's reducer reads it there), so
            # Python's wait() raises what torch's Future.then makes of any error: a
            # RuntimeError with the DistBackendError's class name and words
            assert fields["type"] == "RuntimeError", fields
            assert "DistTimeoutError" in fields["error"] or "DistBackendError" in fields["error"]
        else:
            assert fields["backend_error"] == "True", fields  # torch's DistBackendError too
        if "aborted" in fields:  # torch 2.14: abort hooks ran once, get_error() says why
            assert fields["aborted"] == "1" and fields["state"] == "TIMEOUT", fields
    assert found["sync_all_reduce"]["type"] == "DistTimeoutError"
    assert re.search(r"all_reduce .* on rank 0/2 of group '\d+' .*timed out",
                     found["sync_all_reduce"]["error"]), found["sync_all_reduce"]
    assert "all_reduce" in found["future_wait"]["error"]
    assert "recv" in found["work_wait_timeout"]["error"]
    assert "barrier" in found["barrier_opts_timeout"]["error"]
    assert "Rank 1 failed to pass monitoredBarrier" in found["monitored"]["error"]


def test_device_mesh_abort_runs_the_abort_hooks_then_ends_the_job():
    """DeviceMesh.abort() (torch 2.15) on one rank: its groups' abort hooks run, then the
    job ends at once (MPI offers no abort of one communicator), the waiting rank too."""
    from torch.distributed.device_mesh import DeviceMesh

    if not hasattr(DeviceMesh, "abort"):
        pytest.skip("torch 2.15 feature (this is torch "
                    f"{__import__('torch').__version__})")
    code, output = run([CASE, "mesh_abort"], n=2, limit=60)
    assert code != 0, output
    found = result_lines(output)
    assert (0, {"aborting": "1"}) in found and (0, {"abort_hook": "1"}) in found, output
    assert "still running" not in output, output


# -- the example -------------------------------------------------------------------------------
EXAMPLE = os.path.join(ROOT, "examples", "torch_ddp.py")
#: The README's command for it, run as written (its ``.venv/bin/python``: this Python)
SHOWN = [command for command in doc_recipes.page_commands("README.md")
         if "examples/torch_ddp.py" in command]


def test_the_readme_shows_the_command_run_here():
    assert SHOWN == ["mpiexec -n 2 .venv/bin/python examples/torch_ddp.py"], SHOWN


@pytest.mark.parametrize("launcher,n", [("mpiexec", 2), ("hpccomm run", 4)])
def test_ddp_example(launcher, n):
    if launcher == "mpiexec":  # the README's command
        words = SHOWN[0].split()
        assert words[:3] == ["mpiexec", "-n", str(n)], SHOWN
        code, output = run([os.path.join(ROOT, words[4])], n=n, limit=180)
    else:
        code, output = run(["-m", "hpccomm", "run", "-n", str(n), EXAMPLE], limit=180)
    assert code == 0, output
    assert f"DDP training on {n} ranks matches single-process training" in output, output


def test_ddp_job_script_is_valid_bash():
    script = os.path.join(ROOT, "jobscripts", "torch_ddp.sbatch")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    with open(script) as f:
        text = f.read()
    assert "examples/torch_ddp.py" in text and "hpccomm.cli.rank_env" in text


# -- under Slurm ---------------------------------------------------------------------------------
from slurm_cluster import slurm, wait_job  # noqa: E402,F401  (a real single-node Slurm)
from hpccomm.stores import free_port


def test_ddp_job_script_under_slurm(slurm, tmp_path):  # noqa: F811
    """jobscripts/torch_ddp.sbatch: srun, with the --mpi plugin of the installed MPI, starts
    the DDP example on 2 ranks."""
    out = tmp_path / "torch_ddp.out"
    env = dict(slurm.env, HPCCOMM_PYTHON=sys.executable, HPCCOMM_CPU_BIND="none",
               OMP_NUM_THREADS="1")
    submitted = slurm.run(["sbatch", "--parsable", "--ntasks=2", "--cpus-per-task=1",
                           "--time=3", f"--output={out}", f"--chdir={ROOT}",
                           os.path.join(ROOT, "jobscripts", "torch_ddp.sbatch")], env=env)
    job_id = submitted.stdout.strip().split(";")[0]
    assert job_id.isdigit(), submitted
    state = wait_job(slurm, job_id, timeout=240)
    text = out.read_text(errors="replace") if out.exists() else "(no output file)"
    assert state == "COMPLETED", f"job {job_id} ended {state}:\n{text}\n{slurm.logs()}"
    assert "DDP training on 2 ranks matches single-process training" in text, text
