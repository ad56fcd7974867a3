"""One outcome per (test, world size), skip reasons in groups, and the closing line.

A test run on N ranks has N outcomes; it counts once: failed if it failed on any rank,
skipped if it was skipped on every rank, passed otherwise. Skips are counted by reason,
the reason being the first pattern of a list found in the skip message ("needs 4
ranks"), else the message's first clause. Used by the plugin's closing line and by the
project's own runner (``tests/run_suite.py``), which adds patterns of its own.
"""
from __future__ import annotations

import collections
import re
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

#: ``(pattern, reason)`` in order: the first pattern found in a skip message names its
#: group, formatted with the pattern's groups.
SKIP_PATTERNS: List[Tuple[str, str]] = [
    (r"requires (\d+) MPI processes", "needs {0} ranks"),       # pytest-mpi's min_size
    (r"needs exactly (\d+) ranks", "needs exactly {0} ranks"),
    (r"needs (\d+) ranks?\b", "needs {0} ranks"),              # parallel(nprocs=...)
    (r"\bGPU\b|CUDA|CuPy|NCCL", "no GPU"),
    (r"torch is not installed|needs torch", "needs torch"),
]

#: Outcome as ``(outcome, skip message or None)``; outcome is passed, failed or skipped.
Outcome = Tuple[str, Optional[str]]


def skip_reason(message: Optional[str],
                patterns: Sequence[Tuple[str, str]] = SKIP_PATTERNS) -> str:
    """The group a skip message belongs to ("no GPU", "needs 4 ranks"...)."""
    for pattern, reason in patterns:
        found = re.search(pattern, message or "")
        if found:
            return re.sub(r"\b1 ranks\b", "1 rank", reason.format(*found.groups()))
    text = " ".join((message or "no reason given").split())
    text = re.sub(r"^Skipped: ", "", text)
    text = re.split(r" \(|; |: |\. ", text)[0]  # the first clause says why
    return text if len(text) <= 70 else text[:70].rsplit(" ", 1)[0] + " ..."


def merge(per_rank: Iterable[Outcome]) -> Outcome:
    """One test's outcome from its ranks': failed anywhere -> failed; skipped on every
    rank -> skipped (the first rank's message); else passed."""
    seen = list(per_rank)
    if any(outcome == "failed" for outcome, _ in seen):
        return "failed", None
    if seen and all(outcome == "skipped" for outcome, _ in seen):
        return "skipped", seen[0][1]
    return "passed", None


def merge_ranks(per_rank: Sequence[Mapping[str, Outcome]]) -> dict:
    """``{test: outcome}`` from one ``{test: outcome}`` per rank (see :func:`merge`)."""
    return {test: merge(ranks[test] for ranks in per_rank if test in ranks)
            for test in set().union(*per_rank)}


def count_line(counts: Mapping[str, int], reasons: Mapping[str, int], seconds: float,
               failed: Optional[int] = None) -> str:
    """``"7 passed, 1 failed, 3 skipped in 2.10s; skipped: 2 needs 4 ranks, 1 no GPU"``.

    ``counts`` maps passed/failed/skipped to numbers of (test, world size); ``reasons``
    maps skip reasons to numbers; ``failed`` overrides the failed count (a runner adds
    its runs that failed without a test to blame)."""
    failed = counts.get("failed", 0) if failed is None else failed
    parts = [f"{counts.get('passed', 0)} passed"]
    if failed:
        parts.append(f"{failed} failed")
    if counts.get("skipped", 0):
        parts.append(f"{counts['skipped']} skipped")
    line = f"{', '.join(parts)} in {seconds:.2f}s"
    if reasons:
        ordered = collections.Counter(reasons).most_common()
        line += "; skipped: " + ", ".join(f"{n} {why}" for why, n in ordered)
    return line
