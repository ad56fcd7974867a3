"""tests/run_suite.py's reading of pytest's reports: what the closing line counts."""
import subprocess
import sys

import run_suite


def test_a_module_skipped_whole_is_counted_under_its_own_reason(tmp_path):
    """A module that skips itself at import (``allow_module_level``) is reported by pytest
    as "collection skipped" with its reason inside a (path, line, text) tuple: the count
    groups it by that reason, not by the tuple's text."""
    (tmp_path / "test_whole.py").write_text(
        "import pytest\n"
        "pytest.skip('torch 9.9 has no such API (torch 10 adds it)', allow_module_level=True)\n")
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={report}", str(tmp_path / "test_whole.py")],
                   cwd=tmp_path, capture_output=True, timeout=60)
    found = run_suite.rank_outcomes(str(report))
    assert [outcome for outcome, _ in found.values()] == ["skipped"], found
    (message,) = [message for _, message in found.values()]
    assert message == "torch 9.9 has no such API (torch 10 adds it)", message
    assert run_suite.skip_reason(message) == "torch 9.9 has no such API", message
