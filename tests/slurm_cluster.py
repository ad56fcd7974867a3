"""A real single-node Slurm for the tests that submit jobs (``tests/test_slurm.py``,
``tests/test_torch_launch.py``): the ``slurm`` module fixture and :func:`wait_job`.

The fixture installs Debian's slurm-wlm, munge and libpmix-dev if they are missing
(apt-get), then starts munged, slurmctld and slurmd with a private configuration in a
temporary directory (free ports, ``MpiDefault=pmi2``, no cgroups and no CPU binding,
since the node claims 4 CPUs so that 4 ranks fit on a 2-core machine), as root. Daemons
are stopped by PID at teardown. Without root, apt or a working Slurm, the tests that use
it skip and say why.
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import apt_install_or_skip
from hpccomm.stores import free_port

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm",
            "munged": "munge"}
NTASKS = 4


def _which(name):
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def _pmix_installed():
    """Whether Slurm's mpi/pmix plugin finds its library (it opens pmix2/lib/libpmix.so,
    which Debian's libpmix-dev provides): srun --mpi=pmix starts Open MPI ranks."""
    return any(Path(d, "pmix2", "lib", "libpmix.so").exists()
               for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"))


def _install_or_skip():
    """Install what is missing with apt-get, or skip saying why."""
    missing = sorted({pkg for tool, pkg in PACKAGES.items() if _which(tool) is None})
    if not _pmix_installed():
        missing.append("libpmix-dev")
    if not missing:
        return
    apt_install_or_skip(missing, "the Slurm test")
    still = [tool for tool in PACKAGES if _which(tool) is None]
    if still:
        pytest.skip(f"apt-get installed {missing} but {still} are still missing")


class SlurmCluster:
    """munged + slurmctld + slurmd on this host, configured under ``base``."""

    def __init__(self, base: Path):
        self.base = base
        self.host = socket.gethostname().split(".")[0]
        self.procs = []
        self.conf = base / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        for var in [v for v in self.env if v.startswith("SLURM_") and v != "SLURM_CONF"]:
            del self.env[var]  # a test run inside a real Slurm job must not leak its job

    def _write_config(self):
        base = self.base
        for sub in ("state", "spool", "munge"):
            (base / sub).mkdir(mode=0o700)
        key = base / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        cpus = max(NTASKS, os.cpu_count() or 1)
        self.conf.write_text("\n".join([
            "ClusterName=hpccommtest",
            # Job ids unique across test clusters: MPICH names its shared-memory segments
            # after the PMI job id ("1.0"), so two clusters' job 1 (at once, or one killed
            # and leaving segments behind) would share memory and hang or fail MPI_Init.
            f"FirstJobId={random.randint(1000, 60_000_000)}",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={base}/munge/munge.socket",
            f"StateSaveLocation={base}/state", f"SlurmdSpoolDir={base}/spool",
            f"SlurmctldPidFile={base}/slurmctld.pid", f"SlurmdPidFile={base}/slurmd.pid",
            f"SlurmctldLogFile={base}/slurmctld.log", f"SlurmdLogFile={base}/slurmd.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SwitchType=switch/none", "MpiDefault=pmi2",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin", "ReturnToService=2", "SlurmdParameters=config_overrides",
            "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=YES",
            ""]))

    def _spawn(self, name, cmd):
        log = open(self.base / f"{name}.out", "wb")
        proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def start(self, timeout=60):
        self._write_config()
        munge = self.base / "munge"
        self._spawn("munged", [_which("munged"), "--foreground", "--force",
                               f"--socket={munge}/munge.socket", f"--key-file={munge}/munge.key",
                               f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                               f"--seed-file={munge}/munged.seed"])
        self._wait_for(lambda: (munge / "munge.socket").exists(), 15, "munged socket")
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf)])
        self._wait_for(self._node_idle, timeout, "the node to become idle")

    def _node_idle(self):
        out = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout
        return out.strip().startswith("idle")

    def _wait_for(self, ready, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead} exited while waiting for {what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout} s waiting for {what}:\n{self.logs()}")

    def run(self, cmd, check=True, timeout=120, **kwargs):
        return subprocess.run(cmd, env=kwargs.pop("env", self.env), capture_output=True,
                              text=True, timeout=timeout, check=check, **kwargs)

    def logs(self):
        parts = []
        for path in sorted(self.base.glob("*.log")) + sorted(self.base.glob("*.out")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def _leftovers(self):
        """PIDs of processes that run with our SLURM_CONF: steps, tasks, srun, salloc."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def stop(self):
        """Cancel jobs, stop the daemons, then kill whatever still runs with our config."""
        if all(proc.poll() is None for proc in self.procs):
            self.run(["scancel", "--full", "--user", "root"], check=False, timeout=30)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.run(
                    ["squeue", "-h"], check=False, timeout=30).stdout.strip():
                time.sleep(0.5)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        for pid in self._leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if sys.platform != "linux":
        pytest.skip("the Slurm test runs on Linux only")
    _install_or_skip()
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except RuntimeError as exc:
        cluster.stop()
        pytest.skip(f"Slurm did not start here: {str(exc)[:3000]}")
    yield cluster
    cluster.stop()


def wait_job(cluster, job_id, timeout=180):
    """Poll squeue/scontrol until the job leaves the queue; return its final state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = cluster.run(["scontrol", "-o", "show", "job", job_id], check=False).stdout
        state = next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")
        if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return state
        time.sleep(1)
    raise AssertionError(f"job {job_id} not done after {timeout} s:\n{cluster.logs()}")
