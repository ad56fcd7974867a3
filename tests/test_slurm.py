"""The job scripts and ``hpccomm run`` under a real single-node Slurm (``tests/slurm_cluster.py``
starts it, or the tests skip and say why). The CPU job script is submitted with
``sbatch`` and polled until done; ``hpccomm run`` is used with ``srun -n 4`` inside an
allocation.
"""
import re
import sys
import time

import pytest

from helpers import run_job
from slurm_cluster import NTASKS, ROOT, slurm, wait_job  # noqa: F401 (slurm: a fixture)


def test_sbatch_cpu_job_script(slurm, tmp_path):
    """jobscripts/slurm_cpu.sbatch runs the hello program on 4 ranks with srun and the
    --mpi plugin of the MPI in use (pmi2 for MPICH and Intel MPI, pmix for Open MPI)."""
    out = tmp_path / "job.out"
    env = dict(slurm.env, HPCCOMM_PYTHON=sys.executable, HPCCOMM_CPU_BIND="none",
               HPCCOMM_PROGRAM=str(ROOT / "jobscripts" / "hello.py"))  # 4 ranks, 2 cores
    submitted = slurm.run(["sbatch", "--parsable", f"--ntasks={NTASKS}", "--time=2",
                           f"--output={out}",
                           f"--chdir={ROOT}", str(ROOT / "jobscripts" / "slurm_cpu.sbatch")],
                          env=env)
    job_id = submitted.stdout.strip().split(";")[0]
    assert job_id.isdigit(), submitted
    state = wait_job(slurm, job_id)
    text = out.read_text(errors="replace") if out.exists() else "(no output file)"
    assert state == "COMPLETED", f"job {job_id} ended {state}:\n{text}\n{slurm.logs()}"
    lines = [line for line in text.splitlines() if line.startswith("hello from rank")]
    assert len(lines) == NTASKS, text
    assert {line.split()[3] for line in lines} == {str(r) for r in range(NTASKS)}, text
    assert f"world size {NTASKS}" in lines[0] and "allreduce sum 6" in text, text


def test_sbatch_gpu_job_script_without_gpus(slurm, tmp_path):
    """jobscripts/slurm_gpu.sbatch's srun line (task layout, binding flags) on a GPU-less node."""
    out = tmp_path / "gpu.out"
    env = dict(slurm.env, HPCCOMM_PYTHON=sys.executable,
               HPCCOMM_PROGRAM=str(ROOT / "jobscripts" / "hello.py"))
    submitted = slurm.run(["sbatch", "--parsable", "--time=2", "--nodes=1", "--ntasks-per-node=2",
                           "--gpus-per-node=0", "--cpus-per-task=1", f"--output={out}",
                           f"--chdir={ROOT}", str(ROOT / "jobscripts" / "slurm_gpu.sbatch")],
                          env=env)
    job_id = submitted.stdout.strip().split(";")[0]
    state = wait_job(slurm, job_id)
    text = out.read_text(errors="replace") if out.exists() else "(no output file)"
    assert state == "COMPLETED", f"job {job_id} ended {state}:\n{text}\n{slurm.logs()}"
    assert sorted(line.split()[3] for line in text.splitlines()
                  if line.startswith("hello from rank")) == ["0", "1"], text
    assert "(local rank 1 of 2)" in text, text


def test_hpccomm_run_under_srun(slurm, tmp_path):
    """Inside an allocation, ``hpccomm run -n 4`` picks srun; ranks get torchrun variables."""
    script = tmp_path / "ranks.py"
    script.write_text(
        "import os\nimport hpccomm as dist\nimport numpy as np\n"
        "dist.init_process_group()\n"
        "x = np.array([dist.get_rank()], dtype=np.int64)\ndist.all_reduce(x)\n"
        "import sys\nwords = ['rank', os.environ['RANK'], os.environ['WORLD_SIZE'],"
        " os.environ['LOCAL_RANK'], os.environ['LOCAL_WORLD_SIZE'], dist.get_rank(), int(x[0])]\n"
        "sys.stdout.write(' '.join(map(str, words)) + '\\n')\nsys.stdout.flush()\n"
        "dist.destroy_process_group()\n")
    cmd = ["salloc", f"--ntasks={NTASKS}", "--time=2", "--", sys.executable, "-m", "hpccomm", "run",
           "-n", str(NTASKS), str(script)]
    result = slurm.run(cmd, check=False, timeout=180, cwd=str(tmp_path))
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{slurm.logs()}"
    rows = sorted(line.split()[1:] for line in result.stdout.splitlines()
                  if line.startswith("rank "))
    assert rows == [[str(r), str(NTASKS), str(r), str(NTASKS), str(r), "6"]
                    for r in range(NTASKS)], result.stdout + result.stderr


def test_exception_aborts_srun_job(slurm, tmp_path):
    """An exception on one rank ends the whole srun step quickly, with its traceback."""
    script = tmp_path / "fail.py"
    script.write_text(
        "import time\nimport hpccomm as dist\ndist.init_process_group()\n"
        "if dist.get_rank() == 2:\n    raise KeyError('rank two fails')\n"
        "dist.barrier()\ntime.sleep(120)\n")
    start = time.monotonic()
    result = slurm.run(["salloc", f"--ntasks={NTASKS}", "--time=2", "--", sys.executable,
                        "-m", "hpccomm", "run", str(script)],
                       check=False, timeout=150, cwd=str(tmp_path))
    assert result.returncode != 0
    assert time.monotonic() - start < 90, "the job was not aborted"
    assert "uncaught exception on rank 2" in result.stderr, result.stderr
    assert "KeyError: 'rank two fails'" in result.stderr, result.stderr


def test_sbatch_elastic_job_script_replaces_a_rank_that_leaves(slurm, tmp_path):
    """jobscripts/elastic_grow.sbatch under srun (the venv's MPI; Open MPI's ULFM path
    runs in tests/test_recovery.py): 3 ranks train, rank 1 leaves at step 13, and the
    replacement, a job step of its own waiting in a directory, joins in its place; the
    weights are those of a run at 3 ranks in which nobody left."""
    from launcher_env import mpi_vendor

    if mpi_vendor() == "Open MPI":
        pytest.skip("the srun path is MPICH's and Intel MPI's (Open MPI's jobs cannot "
                    "connect; its path spawns under mpirun, tested in test_recovery.py)")
    out = tmp_path / "elastic.out"
    env = dict(slurm.env, HPCCOMM_PYTHON=sys.executable, HPCCOMM_JOIN_PARENT=str(tmp_path))
    submitted = slurm.run(["sbatch", "--parsable", f"--ntasks={NTASKS}", "--time=3",
                           f"--output={out}", f"--chdir={ROOT}",
                           str(ROOT / "jobscripts" / "elastic_grow.sbatch"), "--leave"],
                          env=env)
    job_id = submitted.stdout.strip().split(";")[0]
    state = wait_job(slurm, job_id)
    text = out.read_text(errors="replace") if out.exists() else "(no output file)"
    assert state == "COMPLETED", f"job {job_id} ended {state}:\n{text}\n{slurm.logs()}"
    assert "rank 1: leaving at step 13" in text and "rank 1: joined" in text, text
    alone = run_job([sys.executable, str(ROOT / "examples" / "elastic_grow.py"),
                     "--kill-rank", "-1"], NTASKS - 1, clean=("HPCCOMM_*",), limit=120)
    digest = re.search(r"weights sha256 (\w+)", alone.output)
    assert alone.code == 0 and digest, alone.output
    assert f"weights sha256 {digest.group(1)}" in text, (text, alone.output)
