"""The claim statement, as the worker's fetch loop would run it, for the claim tests."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from task_queue.claim_position import Start
from task_queue.sql import leasing
from task_queue.sql.db import fetch_bound
from tests.support.database import plan_nodes


def claim_params(starts: dict[str, Start], limit: int = 50) -> dict[str, Any]:
    """``leasing.CLAIM_TASKS``'s parameters for a claim of ``limit`` tasks of the agents
    in ``starts``, each agent's scan from its start."""
    return {"owner": "w:1", "agents": list(starts), "limit": limit, "lease_seconds": 30.0,
            "now": None, "start_priorities": [start[0] for start in starts.values()],
            "start_times": [start[1] for start in starts.values()]}  # fmt: skip


def locked_scan_of_the_claim(start: Start, explain: str = "FORMAT JSON") -> dict[str, Any]:
    """What a claim of 50 EchoAgent tasks from ``start`` reads its tasks from under FOR
    UPDATE SKIP LOCKED: the scan below its LockRows node, from ``EXPLAIN (explain)``.
    With ANALYZE the claim runs, in a transaction rolled back afterwards."""
    params = claim_params({"EchoAgent": start})
    with transaction.atomic():
        ((plan,),) = fetch_bound(f"EXPLAIN ({explain}) " + leasing.CLAIM_TASKS, params)
        transaction.set_rollback(True)
    plan = plan if isinstance(plan, list) else json.loads(plan)
    (lock_rows,) = [n for n in plan_nodes(plan[0]["Plan"]) if n["Node Type"] == "LockRows"]
    (scan,) = lock_rows["Plans"]
    return scan
