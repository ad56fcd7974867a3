"""hpccomm.launcher_env: the one reader of the launchers' and torchrun's variables.

Serial, no MPI: each test sets the variables it needs on a clean environment. That no
other module reads these variables is checked by tests/test_architecture.py.
"""
import os
import warnings

import pytest

from hpccomm import launcher_env
from hpccomm.errors import DistValueError

HYDRA = {"PMI_RANK": "3", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}
OMPI = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}
PMIX = {"PMIX_RANK": "4", "PMIX_SIZE": "9"}
PALS = {"PALS_RANKID": "7", "PALS_SIZE": "10", "PALS_LOCAL_RANKID": "3",
        "PALS_LOCAL_SIZE": "5", "PALS_NODEID": "1"}
SLURM = {"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "2",
         "SLURM_STEP_TASKS_PER_NODE": "3(x2),1", "SLURM_JOB_ID": "4242"}
TORCHRUN = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
            "TORCHELASTIC_RUN_ID": "none"}


@pytest.fixture
def environ(monkeypatch):
    """A clean ``os.environ`` (no launcher of this test run leaks in); returns a setter."""
    for name in list(os.environ):
        if any(name.startswith(prefix) for prefix in ("PMI", "OMPI_", "PALS_", "SLURM_",
                                                       "MV2_", "MPI_LOCAL", "TORCHELASTIC_",
                                                       "MPICH_", "MASTER_", "PBS_", "LSB_",
                                                       "FLUX_")) or \
                name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "JOB_ID"):
            monkeypatch.delenv(name)

    def set_all(*envs):
        for env in envs:
            for name, value in env.items():
                monkeypatch.setenv(name, value)
    return set_all


def test_each_launcher_alone(environ):
    for env, rank, local in ((HYDRA, (3, 8), (1, 4)), (OMPI, (5, 6), (2, 3)),
                             (PMIX, (4, 9), None), (PALS, (7, 10), (3, 5)),
                             (SLURM, (6, 7), (0, 1))):
        assert launcher_env.launcher_rank(env) == rank, env
        assert launcher_env.launcher_local_rank(env) == local, env
    assert launcher_env.launcher_rank({}) is None
    assert launcher_env.launcher_local_rank({}) is None


def test_the_innermost_launcher_wins(environ):
    # mpiexec inside a Slurm allocation: SLURM_PROCID is the hydra proxy's
    environ(SLURM, HYDRA)
    assert launcher_env.launcher_rank() == (3, 8)
    assert launcher_env.launcher_local_rank() == (1, 4)
    assert launcher_env.launcher_pair()[:2] == ("PMI_RANK", "PMI_SIZE")
    # Open MPI's mpirun sets PMIx's variables too; its own come first
    both = {**PMIX, **OMPI, **SLURM}
    assert launcher_env.launcher_rank(both) == (5, 6)
    assert launcher_env.launcher_pair(both)[0] == "OMPI_COMM_WORLD_RANK"
    assert launcher_env.launcher_rank({**PALS, **SLURM}) == (7, 10)
    assert launcher_env.node_id({**PALS, **SLURM}) == 2  # Slurm numbers nodes first


def test_a_launcher_counts_only_with_rank_and_size():
    env = {"PMI_RANK": "1", **OMPI}  # no PMI_SIZE
    assert launcher_env.launcher_rank(env) == (5, 6)
    assert launcher_env.launcher_pair(env) == ("PMI_RANK", "PMI_SIZE", 1, None)  # for checks
    assert launcher_env.launcher_local_rank({"SLURM_LOCALID": "1"}) is None  # no tasks/node


def test_torchrun_comes_before_the_mpi_launchers(environ):
    environ(SLURM, TORCHRUN)  # torchrun's workers inside an srun step
    assert launcher_env.stated_rank() == 2
    assert launcher_env.torchrun_rank() == (2, 4)
    assert launcher_env.torchrun_local_rank() == (0, 2)
    assert launcher_env.launcher_rank() == (6, 7)  # the MPI launchers' part of the order
    assert launcher_env.torchelastic_launched()
    assert launcher_env.stated_rank(SLURM) == 6
    assert launcher_env.stated_rank({}) is None
    assert launcher_env.torchrun_rank({}) == (None, None)
    assert not launcher_env.torchelastic_launched({})
    assert launcher_env.torchelastic_launched({"TORCHELASTIC_RUN_ID": ""})  # as torch


def test_unset_and_blank_are_none():
    assert launcher_env.integer("RANK", {}) is None
    assert launcher_env.integer("RANK", {"RANK": "  "}) is None
    assert launcher_env.integer("RANK", {"RANK": " 3\n"}) == 3
    assert launcher_env.text("MASTER_ADDR", {"MASTER_ADDR": ""}) is None
    assert launcher_env.master_address({"MASTER_ADDR": "n1", "MASTER_PORT": "29500"}) == (
        "n1", 29500)


@pytest.mark.parametrize("name,value", [("RANK", "one"), ("LOCAL_RANK", "-1"),
                                        ("PMI_RANK", "1.0"), ("MASTER_PORT", "80a"),
                                        ("SLURM_NTASKS", "2x")])
def test_a_malformed_integer_names_the_variable_and_value(name, value):
    with pytest.raises(DistValueError) as caught:
        launcher_env.integer(name, {name: value})
    message = str(caught.value)
    assert f"{name}={value!r}" in message and "whole number" in message
    assert launcher_env.set_by(name) in message


def test_every_reader_raises_on_a_malformed_integer():
    with pytest.raises(DistValueError, match="PMI_SIZE='eight'.*PMI launcher"):
        launcher_env.launcher_rank({"PMI_RANK": "1", "PMI_SIZE": "eight", **SLURM})
    with pytest.raises(DistValueError, match="LOCAL_RANK='x'.*torchrun"):
        launcher_env.torchrun_local_rank({"LOCAL_RANK": "x"})
    with pytest.raises(DistValueError, match="OMPI_COMM_WORLD_LOCAL_SIZE"):
        launcher_env.launcher_local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "0",
                                          "OMPI_COMM_WORLD_LOCAL_SIZE": "?"})
    with pytest.raises(DistValueError, match=r"SLURM_STEP_TASKS_PER_NODE='2\(x'"):
        launcher_env.slurm_tasks_on_node({"SLURM_STEP_TASKS_PER_NODE": "2(x",
                                          "SLURM_NODEID": "0"})
    with pytest.raises(DistValueError, match="MASTER_PORT"):
        launcher_env.master_address({"MASTER_ADDR": "n1", "MASTER_PORT": "http"})


def test_slurm_tasks_on_node():
    assert launcher_env.slurm_tasks_on_node({"SLURM_TASKS_PER_NODE": "2(x3)",
                                             "SLURM_NODEID": "1"}) == 2
    assert launcher_env.slurm_tasks_on_node(SLURM) == 1
    assert launcher_env.slurm_tasks_on_node({"SLURM_NODEID": "0"}) is None
    assert launcher_env.slurm_tasks_on_node({"SLURM_TASKS_PER_NODE": "2",
                                             "SLURM_NODEID": "5"}) is None


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("YES", True),
                                            (" on ", True), ("0", False), ("False", False),
                                            ("no", False), ("off", False), ("", None)])
def test_flags_use_the_settings_parser(value, expected):
    env = {"OMPI_MCA_mpi_ft_enable": value, "MPICH_GPU_SUPPORT_ENABLED": value,
           "TORCHELASTIC_USE_AGENT_STORE": value}
    assert launcher_env.flag("OMPI_MCA_mpi_ft_enable", env) is expected
    assert launcher_env.ompi_ft_enabled(env) is bool(expected)
    assert launcher_env.mpich_gpu_support(env) is bool(expected)
    assert launcher_env.torchelastic_agent_store(env) is bool(expected)


def test_a_malformed_flag_warns_once_and_counts_as_unset(monkeypatch):
    monkeypatch.setattr(launcher_env, "_warned", set())
    env = {"MPICH_GPU_SUPPORT_ENABLED": "maybe"}
    with pytest.warns(RuntimeWarning, match="MPICH_GPU_SUPPORT_ENABLED='maybe' is malformed"):
        assert launcher_env.flag("MPICH_GPU_SUPPORT_ENABLED", env) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert launcher_env.mpich_gpu_support(env) is False  # warned already


def test_job_id_batch_system_first(environ):
    assert launcher_env.job_id({}) is None
    assert launcher_env.job_id({"PMI_JOBID": "kvs_1", "PBS_JOBID": "77.pbs"}) == "77.pbs"
    environ(SLURM, {"PMIX_NAMESPACE": "prterun-x-1@1"})
    assert launcher_env.job_id() == "4242" == launcher_env.slurm_job_id()
    assert launcher_env.slurm_mpi_type() is None
