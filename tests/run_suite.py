"""Run the whole test suite: serial tests, then MPI tests at 1, 2 and 4 ranks.

Each MPI run is ``mpiexec -n N python -m pytest -m mpi --with-mpi`` with hpccomm's
pytest plugin: every rank writes JUnit XML (``--junitxml=...-rank{rank}.xml``) and rank
> 0 writes its output to a log (``--hpccomm-rank0-output``), which is printed only if
that rank failed. The exit status is non-zero if anything failed or a run outlived
its time limit.

The last line is one pytest-style summary that counts each (test, world size) once, not
once per rank: a test that failed on any rank is failed, one skipped on every rank is
skipped, anything else passed. Skips are grouped by reason ("12 skipped: 10 no GPU, 2
needs torch"). A rank that wrote no report fails its run.

Several invocations (one per MPI library, say) combine into one final line: give each a
``--label`` and the same ``--results`` file, then ``--summarize`` that file:

    python tests/run_suite.py --label mpich --results R.jsonl
    python tests/run_suite.py --label openmpi --results R.jsonl
    python tests/run_suite.py --summarize R.jsonl

Usage: python tests/run_suite.py [--ranks 1,2,4] [--nodes K] [--no-serial] [--label L]
                                 [--serial-deselect NODEID]... [--results FILE]
                                 [--summarize FILE] [pytest args...]

``--nodes K`` runs the MPI tests as K simulated nodes of consecutive ranks (MPICH's
cliques, else ``HPCCOMM_NODES``), as a multi-node job places them.
"""
import argparse
import collections
import glob
import json
import os
import re
import shutil
import sys
import time
import xml.etree.ElementTree as ET

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import launch_command, run_job  # noqa: E402  (sys.path[0]: this directory)
from hpccomm.testing import outcomes as counting  # noqa: E402  (counting, skip reasons)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One directory per run, so that runs started at the same time do not mix reports.
REPORTS = os.path.join(ROOT, ".test-reports", f"run-{os.getpid()}")
RUN_LIMIT_S = int(os.environ.get("HPCCOMM_TEST_RUN_LIMIT", "1500"))

#: (pattern, reason) in order: the first pattern found in a skip message names its group;
#: the plugin's general ones first, then this suite's own.
SKIP_REASONS = counting.SKIP_PATTERNS + [
    (r"even number of ranks", "needs an even rank count"),
    (r"ml_dtypes", "needs ml_dtypes"),
    (r"no direct form with this MPI library", "no direct form of small-integer sums (Open MPI)"),
    (r"Slurm", "no Slurm"),
    (r"mpicc", "no mpicc wrapper (Intel MPI's runtime wheel)"),
    (r"lets the other ranks run on", "Intel MPI's mpiexec: a rank dying before MPI_Init"),
    (r"cmake|Lmod|CMake", "no CMake/Lmod"),
    (r"apt-get|not root", "cannot install system packages"),
]


def simulated_nodes(nodes):
    """The variables that make a job's ranks act as ``nodes`` nodes of consecutive ranks:
    MPICH simulates them inside MPI (its cliques), other libraries through hpccomm's own
    ``HPCCOMM_NODES``; none for one node."""
    if nodes <= 1:
        return {}
    import importlib.metadata

    try:
        importlib.metadata.version("mpich")
    except importlib.metadata.PackageNotFoundError:
        return {"HPCCOMM_NODES": str(nodes)}
    return {"MPIR_CVAR_NUM_CLIQUES": str(nodes), "MPIR_CVAR_CLIQUES_BY_BLOCK": "1"}


def run(argv, label, n=None, env=None):
    """Run ``argv`` (as ``n`` ranks, or alone), its output straight to this terminal;
    its exit status, -1 if it outlived RUN_LIMIT_S and was killed with its ranks."""
    print(f"\n===== {label}: {' '.join(launch_command(argv, n))}", flush=True)
    job = run_job(argv, n, env=env, limit=RUN_LIMIT_S, timeout_ok=True, capture=False)
    code = 0 if job.code == 5 else job.code  # 5: pytest collected no test
    if job.timed_out:
        print(f"!!!!! {label} exceeded {RUN_LIMIT_S} s and was killed", flush=True)
        code = -1
    print(f"===== {label}: exit {code} after {job.seconds:.1f} s", flush=True)
    return code


def skip_reason(message):
    """The group a skip message belongs to ("no GPU", "needs 4 ranks"...)."""
    return counting.skip_reason(message, SKIP_REASONS)


def rank_outcomes(path):
    """``{test id: (outcome, skip message)}`` of one JUnit XML file; ``None`` if unreadable."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return None
    found = {}
    for case in root.iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome, message = "failed", None
        elif case.find("skipped") is not None:
            skipped = case.find("skipped")
            outcome, message = "skipped", skipped.get("message", "")
            if message == "collection skipped":  # a whole module: its reason is in the
                # text, as pytest writes it: "('path', line, 'Skipped: reason')"
                text = skipped.text or message
                found_reason = re.search(r"'Skipped: (.*)'\)\s*$", text, re.S)
                message = found_reason.group(1) if found_reason else text
        else:
            outcome, message = "passed", None
        if test not in found or outcome == "failed":  # a teardown error fails the test
            found[test] = (outcome, message)
    return found


def slowest_files(path, count=8):
    """The test files that took the most seconds in one report, in words (what to look
    at first when the whole run grows)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return ""
    seconds = collections.Counter()
    for case in root.iter("testcase"):
        seconds[case.get("classname", "").split("::")[0]] += float(case.get("time") or 0)
    return ", ".join(f"{name.replace('tests.', '')} {spent:.0f} s"
                     for name, spent in seconds.most_common(count))


def collect(world, pattern, expected_ranks, code, problems):
    """``{"world|test": (outcome, reason)}`` for one run's reports; a missing report, or
    a failing exit status that no failed test explains, goes to ``problems``."""
    per_rank = []
    for rank in range(expected_ranks):
        path = os.path.join(REPORTS, pattern.format(rank=rank))
        outcomes = rank_outcomes(path) if os.path.exists(path) else None
        if outcomes is None:
            problems.append(f"{world}: rank {rank} wrote no readable report")
            continue
        per_rank.append(outcomes)
    merged = counting.merge_ranks(per_rank) if per_rank else {}
    found = {f"{world}|{test}": (outcome, skip_reason(message) if outcome == "skipped" else None)
             for test, (outcome, message) in merged.items()}
    if code != 0 and not any(outcome == "failed" for outcome, _ in found.values()):
        problems.append(f"{world}: exit status {code}")
    return found


def summary_line(records):
    """The closing line, in pytest's form, over one or more records."""
    counts = collections.Counter()
    reasons = collections.Counter()
    duration = 0.0
    failed_tests, problems = [], []
    for record in records:
        duration += record["duration"]
        for key, (outcome, reason) in record["outcomes"].items():
            counts[outcome] += 1
            if outcome == "skipped":
                reasons[reason] += 1
            elif outcome == "failed":
                failed_tests.append(f"[{record['label']}] {key}")
        problems += [f"[{record['label']}] {p}" for p in record["problems"]]
    failed = counts["failed"] + len(problems)
    line = counting.count_line(counts, reasons, duration, failed)
    labels = sorted({r["label"] for r in records})
    if len(labels) > 1:
        line += f"; runs: {', '.join(labels)}"
    return f"========== {line} ==========", failed_tests, problems, failed


def report(records):
    line, failed_tests, problems, failed = summary_line(records)
    for name in failed_tests:
        print(f"FAILED {name}")
    for problem in problems:
        print(f"FAILED {problem}")
    print("\nCounts: each (test, world size) once, failed if it failed on any rank.")
    print(line)
    return 1 if failed else 0


def summarize(path):
    with open(path) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    if not records:
        print(f"no results in {path}")
        return 1
    return report(records)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--nodes", type=int, default=1,
                        help="run the MPI tests as this many simulated nodes of consecutive "
                             "ranks (MPICH's cliques; HPCCOMM_NODES for other libraries)")
    parser.add_argument("--no-serial", action="store_true", help="run only the MPI tests")
    parser.add_argument("--serial-deselect", action="append", default=[], metavar="NODEID",
                        help="leave this test, file or folder out of the serial tests only "
                             "(repeatable; the MPI tests still run what it holds)")
    parser.add_argument("--label", default="default",
                        help="name of this run in combined summaries (e.g. the MPI library)")
    parser.add_argument("--results", help="append this run's outcomes to this JSON-lines file")
    parser.add_argument("--summarize", metavar="FILE",
                        help="run nothing: print one summary of every run in FILE")
    args, extra = parser.parse_known_args()
    if args.summarize:
        return summarize(args.summarize)
    shutil.rmtree(REPORTS, ignore_errors=True)
    os.makedirs(REPORTS)
    started = time.time()
    problems, outcomes = [], {}
    if not args.no_serial:
        code = run([sys.executable, "-m", "pytest", "-q", "-m", "not mpi", "-p",
                    "no:cacheprovider", f"--junitxml={REPORTS}/serial.xml", *extra,
                    *(f"--deselect={nodeid}" for nodeid in args.serial_deselect)],
                   "serial tests")
        outcomes.update(collect("serial", "serial.xml", 1, code, problems))
        print(f"===== serial tests, slowest files: "
              f"{slowest_files(os.path.join(REPORTS, 'serial.xml'))}", flush=True)
    env = simulated_nodes(args.nodes)
    placed = f" as {args.nodes} nodes" if args.nodes > 1 else ""
    for n in [int(x) for x in args.ranks.split(",") if x]:
        argv = [sys.executable, "-m", "pytest", "-q", "-m", "mpi", "--with-mpi", "-p",
                "no:cacheprovider", "--hpccomm-rank0-output",
                f"--hpccomm-rank-log-dir={REPORTS}/n{n}",
                f"--junitxml={REPORTS}/n{n}-rank{{rank}}.xml", *extra]
        code = run(argv, f"MPI tests at {n} ranks{placed}", n, env)
        outcomes.update(collect(f"n={n}{placed}", f"n{n}-rank{{rank}}.xml", n, code, problems))
        for log in sorted(glob.glob(os.path.join(REPORTS, f"n{n}", "rank-*.log"))):
            rank = os.path.basename(log)[len("rank-"):-len(".log")]
            outcomes_here = rank_outcomes(os.path.join(REPORTS, f"n{n}-rank{rank}.xml"))
            if outcomes_here is None or any(o == "failed" for o, _ in outcomes_here.values()):
                print(f"----- output of rank {rank} at n={n} (it failed) -----")
                with open(log, errors="replace") as handle:
                    print(handle.read()[-20000:])
    shutil.rmtree(REPORTS, ignore_errors=True)
    record = {"label": args.label, "duration": time.time() - started,
              "outcomes": outcomes, "problems": problems}
    if args.results:
        with open(args.results, "a") as handle:
            handle.write(json.dumps(record) + "\n")
    return report([record])


if __name__ == "__main__":
    sys.exit(main())
