"""Starting a world: torch's test_c10d_gloo.py (RendezvousEnvTest, TimeoutTest) and
test_c10d_common.py (ProcessGroupWithDispatchedCollectivesTests, CommTest.test_debug_level,
PythonProcessGroupExtensionTest.test_backend_class_attr), each in a fresh process of its
own, as torch runs them (a world of one started without a launcher).
"""
import sys
import textwrap

import pytest
from helpers import run_job
from hpccomm.stores import free_port


def run_alone(code, env=None, timeout=60):
    """Run ``code`` in a fresh Python process, outside any MPI job."""
    done = run_job([sys.executable, "-c", textwrap.dedent(code)], env=env, limit=timeout,
                   clean=("SLURM_*", "HYDI_*", "MPIR_*", "RANK", "WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT", "LOCAL_RANK", "HPCCOMM_DISTRIBUTED_DEBUG",
                          "TORCH_DISTRIBUTED_DEBUG"))
    assert done.code == 0, done.output
    return done.stdout


@pytest.mark.parametrize("kind", ["file", "tcp"])
def test_default_store_timeout(tmp_path, kind):
    """TimeoutTest.test_default_store_timeout_gloo: with timeout=1 s, a get of a missing
    key on the default store raises a timeout error within 3 s."""
    init_method = (f"file://{tmp_path / 'store'}" if kind == "file"
                   else f"tcp://127.0.0.1:{free_port()}")
    out = run_alone(f"""
        import time
        from datetime import timedelta
        import re
        import hpccomm as dist
        dist.init_process_group(backend="gloo", init_method={init_method!r}, world_size=1,
                                rank=0, timeout=timedelta(seconds=1))
        store = dist._get_default_store()
        start = time.time()
        try:
            store.get("nonexistent key")
        except RuntimeError as exc:
            assert re.search("(?i)timeout", str(exc)), str(exc)
        else:
            raise SystemExit("no error")
        elapsed = time.time() - start
        dist.destroy_process_group()
        print("elapsed", elapsed)
    """)
    assert float(out.split()[-1]) < 3


def test_logging_init():
    """RendezvousEnvTest.test_logging_init: init_process_group("gloo", "env://") leaves
    the root logger's handlers alone."""
    out = run_alone("""
        import logging
        import hpccomm as dist
        previous = list(logging.root.handlers)
        dist.init_process_group(backend="gloo", init_method="env://")
        assert list(logging.root.handlers) == previous, logging.root.handlers
        dist.destroy_process_group()
        print("ok")
    """, env={"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(free_port())})
    assert "ok" in out


def test_init_process_group_for_all_backends(tmp_path):
    """ProcessGroupWithDispatchedCollectivesTests.test_init_process_group_for_all_backends:
    each available backend, with a FileStore; pg.rank(), pg.size() and pg.name(). gloo
    names hpccomm's MPI backend, so its group reports "mpi"."""
    out = run_alone(f"""
        import hpccomm as dist
        backends = ["gloo", "mpi"] + (["nccl"] if dist.is_nccl_available() else [])
        for backend in backends:
            store = dist.FileStore({str(tmp_path / 'store')!r}, 1)
            dist.init_process_group(backend=backend, rank=0, world_size=1, store=store)
            pg = dist.group.WORLD
            assert (pg.rank(), pg.size()) == (0, 1)
            assert pg.name() == ("nccl" if backend == "nccl" else "mpi"), pg.name()
            dist.destroy_process_group()
        print("ok", backends)
    """)
    assert "ok" in out


def test_init_process_group_optional_backend(tmp_path):
    """ProcessGroupWithDispatchedCollectivesTests.test_init_process_group_optional_backend:
    no backend named: CPU and (where available) CUDA backends."""
    out = run_alone(f"""
        import hpccomm as dist
        store = dist.FileStore({str(tmp_path / 'store')!r}, 1)
        dist.init_process_group(store=store, rank=0, world_size=1)
        assert dist.get_backend() == "cpu:mpi,cuda:nccl", dist.get_backend()
        dist.destroy_process_group()
        print("ok")
    """)
    assert "ok" in out


def test_default_process_group():
    """ProcessGroupWithDispatchedCollectivesTests.test_default_process_group: with every
    GPU hidden, init on a HashStore works on CPU."""
    out = run_alone("""
        import os
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        import hpccomm as dist
        dist.init_process_group(rank=0, world_size=1, store=dist.HashStore())
        import numpy as np
        x = np.ones(2)
        dist.all_reduce(x)
        assert (x == 1).all()
        print("ok")
    """, timeout=20)
    assert "ok" in out


def test_debug_level():
    """CommTest.test_debug_level: TORCH_DISTRIBUTED_DEBUG, any case; other values raise
    ValueError."""
    out = run_alone("""
        import os
        import hpccomm as dist
        dist.set_debug_level_from_env()
        assert dist.get_debug_level() == dist.DebugLevel.OFF
        mapping = {"OFF": dist.DebugLevel.OFF, "off": dist.DebugLevel.OFF,
                   "oFf": dist.DebugLevel.OFF, "INFO": dist.DebugLevel.INFO,
                   "info": dist.DebugLevel.INFO, "INfO": dist.DebugLevel.INFO,
                   "DETAIL": dist.DebugLevel.DETAIL, "detail": dist.DebugLevel.DETAIL,
                   "DeTaIl": dist.DebugLevel.DETAIL}
        for mode, level in mapping.items():
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = mode
            dist.set_debug_level_from_env()
            assert dist.get_debug_level() == level, (mode, dist.get_debug_level())
        for mode in ["foo", 0, 1, -1]:
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = str(mode)
            try:
                dist.set_debug_level_from_env()
            except ValueError:
                pass
            else:
                raise SystemExit(f"no ValueError for {mode!r}")
        print("ok")
    """)
    assert "ok" in out


def test_backend_class_attr():
    """PythonProcessGroupExtensionTest.test_backend_class_attr: a registered backend
    becomes a Backend attribute."""
    out = run_alone("""
        import hpccomm as dist

        def create_dummy(comm, timeout):
            raise AssertionError("not called")

        dist.Backend.register_backend("dummy", create_dummy)
        assert dist.Backend.DUMMY == "dummy"
        assert dist.Backend("DUMMY") == "dummy"
        print("ok")
    """)
    assert "ok" in out


def test_mpi_backend_ignores_rank_and_world_size():
    """init_process_group("mpi", rank=..., world_size=...) ignores them with torch's
    warning (the tutorial's ``init_process(0, 0, run, backend='mpi')``)."""
    out = run_alone("""
        import warnings
        import hpccomm as dist
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dist.init_process_group("mpi", rank=0, world_size=0)
        assert any("are ignored since they are assigned by the MPI runtime" in str(w.message)
                   for w in caught), [str(w.message) for w in caught]
        assert dist.get_world_size() == 1
        dist.destroy_process_group()
        print("ok")
    """)
    assert "ok" in out
