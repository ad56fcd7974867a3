"""``python -m hpccomm.trace DIR``: merge per-rank flight recorder dumps into one screen.

Reads ``DIR/rank*.json`` (written by :mod:`hpccomm.flight_recorder`) and prints, per
group, where each rank stands: the operation it failed in, its last recorded operation,
or that it left no dump. Ranks are "behind" when a roll call named them missing, when
their last operation on a group has a lower sequence number than the furthest rank's,
or when they left no dump while others timed out. Sequence numbers count every
operation of a group on a rank, point-to-point included, so they compare best in
collective-only code; the roll call does not depend on them.
"""
from __future__ import annotations

import glob
import json
import os
import sys
from typing import Any, Dict, List, Optional


def load(directory: str) -> Dict[int, Dict[str, Any]]:
    """``{global rank: dump}`` for every ``rank*.json`` in ``directory``."""
    dumps = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank*.json"))):
        try:
            with open(path) as handle:
                data = json.load(handle)
        except (OSError, ValueError) as exc:
            print(f"hpccomm.trace: skipping {path}: {exc}", file=sys.stderr)
            continue
        rank = data.get("rank")
        if rank is None:
            rank = int(os.path.basename(path)[4:-5]) if path[-6].isdigit() else -1
        dumps[int(rank)] = data
    return dumps


def _last_on(data: Dict[str, Any], group: str) -> Optional[Dict[str, Any]]:
    """The rank's furthest operation on ``group``: its failed one, else its last entry."""
    found = [e for e in data.get("entries", []) if e.get("group") == group]
    failed = data.get("failed_op")
    if failed and failed.get("group") == group:
        found.append(failed)
    return max(found, key=lambda e: e.get("seq", -1)) if found else None


def _op(entry: Dict[str, Any]) -> str:
    shape = f" {tuple(entry['shape'])} {entry['dtype']}" if entry.get("shape") is not None else ""
    return f"{entry['op']} seq {entry['seq']}{shape}"


def summarize(dumps: Dict[int, Dict[str, Any]]) -> str:
    """The one-screen summary of a set of dumps."""
    if not dumps:
        return "hpccomm.trace: no rank*.json dumps found"
    size = next((d["world_size"] for d in dumps.values() if d.get("world_size")), None)
    absent = sorted(set(range(size)) - set(dumps)) if size else []
    lines = [f"hpccomm trace: dumps from {len(dumps)} of {size or '?'} ranks "
             f"{sorted(dumps)}" + (f"; no dump from ranks {absent}" if absent else "")]
    named: Dict[int, List[int]] = {}
    for rank, data in sorted(dumps.items()):
        roll = data.get("rollcall") or {}
        for missing in roll.get("missing", []):
            named.setdefault(missing, []).append(rank)
    groups: Dict[str, List[int]] = {}
    for data in dumps.values():
        for name, info in (data.get("groups") or {}).items():
            groups.setdefault(name, info["ranks"])
    behind: Dict[int, str] = {}
    for name, ranks in groups.items():
        lasts = {r: _last_on(dumps[r], name) for r in ranks if r in dumps}
        seqs = [e["seq"] for e in lasts.values() if e is not None]
        if not seqs:
            continue
        front = max(seqs)
        lines.append(f"group '{name}' (global ranks {ranks}), furthest op seq {front}:")
        for rank in ranks:
            entry = lasts.get(rank)
            if rank not in dumps:
                why = (f"named missing by the roll call of ranks {named[rank]}"
                       if rank in named else "it did not time out or fail")
                lines.append(f"  rank {rank}: no dump ({why})")
                behind.setdefault(rank, f"did not reach seq {front} on group '{name}'")
                continue
            if entry is None:
                lines.append(f"  rank {rank}: nothing recorded on this group")
                continue
            state = entry.get("state", "?")
            lines.append(f"  rank {rank}: {state:<10} {_op(entry)}")
            if entry["seq"] < front:
                behind.setdefault(rank, f"last op seq {entry['seq']} < {front} on '{name}'")
    for rank, reporters in named.items():
        behind.setdefault(rank, f"named missing by the roll call of ranks {reporters}")
        if rank in dumps:
            behind[rank] += f" (roll call of ranks {reporters})"
    for rank, data in sorted(dumps.items()):
        roll = data.get("rollcall") or {}
        for other, where in (roll.get("elsewhere") or {}).items():
            lines.append(f"  rank {rank} saw global rank {other} stuck in {where}")
    if behind:
        lines.append("BEHIND: " + "; ".join(f"rank {r}: {why}" for r, why in sorted(behind.items())))
    else:
        lines.append("No rank is behind: all recorded ranks reached the same operations.")
    reasons = sorted({d.get("reason", "?") for d in dumps.values()})
    lines.append(f"dump reasons: {', '.join(reasons)}")
    first = next((d for d in dumps.values() if d.get("error")), None)
    if first is not None:
        lines.append(f"first error (rank {first['rank']}): {first['error'][:300]}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Print the summary of the dumps in ``argv[0]``; exit status 1 if none."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m hpccomm.trace DIR   (DIR holds rank<r>.json dumps)")
        return 2
    dumps = load(args[0])
    print(summarize(dumps))
    return 0 if dumps else 1


if __name__ == "__main__":
    sys.exit(main())
