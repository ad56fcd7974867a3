"""Numbers for the collectives, shared by the desync check and the roll call.

Both send "which operation" between ranks as an int64; this table is what the number
means. Codes are stable within a job only (all ranks run the same hpccomm).
"""
from __future__ import annotations

from typing import Dict

#: Collective (as ``Work.op`` names it) -> its number on the wire.
CODES: Dict[str, int] = {
    "broadcast": 1, "all_reduce": 2, "reduce": 3, "all_gather": 4,
    "all_gather_into_tensor": 5, "gather": 6, "scatter": 7, "reduce_scatter": 8,
    "reduce_scatter_tensor": 9, "all_to_all_single": 10, "all_to_all": 11, "barrier": 12,
    # object collectives: each step is checked by operation and root only
    "broadcast_object_list": 13, "all_gather_object": 14, "gather_object": 15,
    "scatter_object_list": 16, "gather_single": 17,
}
#: Number -> collective.
NAMES: Dict[int, str] = {code: op for op, code in CODES.items()}
