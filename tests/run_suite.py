"""Run the whole test suite: serial tests, then MPI tests at 1, 2 and 4 ranks.

Each MPI run is ``mpiexec -n N python tests/rank_pytest.py -m mpi --with-mpi``; every
rank writes JUnit XML and rank > 0 writes its output to a log, which is printed only
if that rank failed. The last line is one pytest-style summary of all runs; the exit
status is non-zero if anything failed or a run outlived its time limit.

Usage: python tests/run_suite.py [--ranks 1,2,4] [pytest args...]
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One directory per run, so that runs started at the same time do not mix reports.
REPORTS = os.path.join(ROOT, ".test-reports", f"run-{os.getpid()}")
RUN_LIMIT_S = int(os.environ.get("HPCCOMM_TEST_RUN_LIMIT", "1500"))


def mpiexec() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")


def run(cmd, label):
    print(f"\n===== {label}: {' '.join(cmd)}", flush=True)
    start = time.time()
    try:
        code = subprocess.run(cmd, cwd=ROOT, timeout=RUN_LIMIT_S).returncode
        code = 0 if code == 5 else code  # 5: pytest collected no test
    except subprocess.TimeoutExpired:
        print(f"!!!!! {label} exceeded {RUN_LIMIT_S} s and was killed", flush=True)
        code = -1
    print(f"===== {label}: exit {code} after {time.time() - start:.1f} s", flush=True)
    return code


def tally(pattern):
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for path in glob.glob(os.path.join(REPORTS, pattern)):
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            counts["errors"] += 1
            continue
        for suite in root.iter("testsuite"):
            tests = int(suite.get("tests", 0))
            failed = int(suite.get("failures", 0))
            errors = int(suite.get("errors", 0))
            skipped = int(suite.get("skipped", 0))
            counts["failed"] += failed
            counts["errors"] += errors
            counts["skipped"] += skipped
            counts["passed"] += tests - failed - errors - skipped
    return counts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="1,2,4")
    args, extra = parser.parse_known_args()
    shutil.rmtree(REPORTS, ignore_errors=True)
    os.makedirs(REPORTS)
    started = time.time()
    codes = [run([sys.executable, "-m", "pytest", "-q", "-m", "not mpi", "-p", "no:cacheprovider",
                  f"--junitxml={REPORTS}/serial.xml", *extra], "serial tests")]
    for n in [int(x) for x in args.ranks.split(",") if x]:
        cmd = [mpiexec(), "-n", str(n), sys.executable, os.path.join("tests", "rank_pytest.py"),
               REPORTS, str(n), "-q", "-m", "mpi", "--with-mpi", "-p", "no:cacheprovider", *extra]
        codes.append(run(cmd, f"MPI tests at {n} ranks"))
        for log in sorted(glob.glob(os.path.join(REPORTS, f"n{n}-rank*.log"))):
            rank_xml = log[:-4] + ".xml"
            bad = tally(os.path.basename(rank_xml))
            if bad["failed"] or bad["errors"] or not os.path.exists(rank_xml):
                print(f"----- output of {os.path.basename(log)} (it failed) -----")
                with open(log, errors="replace") as handle:
                    print(handle.read()[-20000:])
    total = tally("*.xml")
    shutil.rmtree(REPORTS, ignore_errors=True)
    failed = total["failed"] + total["errors"]
    bad_exit = any(code != 0 for code in codes)
    parts = [f"{total['passed']} passed"]
    if failed or bad_exit:
        parts.append(f"{max(failed, 1 if bad_exit else 0)} failed")
    if total["skipped"]:
        parts.append(f"{total['skipped']} skipped")
    print("\nCounts add every rank's result (a 4-rank test counts 4 times).")
    print(f"========== {', '.join(parts)} in {time.time() - started:.2f}s ==========")
    return 1 if failed or bad_exit else 0


if __name__ == "__main__":
    sys.exit(main())
