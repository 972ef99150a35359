"""The claim's plan: each agent's due tasks come from an ordered scan of the lease
index that stops at the claim's room, whatever the planner's statistics say
(task_queue.sql.leasing.prepare_claim_session)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from task_queue.operations import TaskSpec, enqueue_many
from task_queue.sql import leasing
from task_queue.sql.db import execute, fetch_bound
from tests.support.database import plan_nodes

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claim_session() -> Iterator[None]:
    """This test's connection with a worker's claim settings; closed afterwards, so no
    later test plans with them. Autovacuum keeps off tasks meanwhile: an automatic
    ANALYZE would bring the statistics up to date, and the test would no longer be the
    burst it means to be."""
    execute("ALTER TABLE tasks SET (autovacuum_enabled = off)", {})
    leasing.prepare_claim_session()
    yield
    connection.close()
    execute("ALTER TABLE tasks RESET (autovacuum_enabled)", {})


def _locked_scan_of_the_claim() -> dict[str, Any]:
    """What the claim's FOR UPDATE SKIP LOCKED reads its tasks from (not run)."""
    priority, created_at = leasing.HEAD
    params = {"owner": "w", "agents": ["EchoAgent"], "limit": 50, "lease_seconds": 30.0,
              "start_priorities": [priority], "start_times": [created_at]}  # fmt: skip
    ((plan,),) = fetch_bound("EXPLAIN (FORMAT JSON) " + leasing.CLAIM_TASKS, params | {"now": None})
    plan = plan if isinstance(plan, list) else json.loads(plan)
    (lock_rows,) = [n for n in plan_nodes(plan[0]["Plan"]) if n["Node Type"] == "LockRows"]
    (scan,) = lock_rows["Plans"]
    return scan


def test_after_a_burst_onto_an_idle_queue_a_claim_sorts_no_pending_task(claim_session):
    # Statistics taken while nothing was pending, as on a queue that was idle before a
    # burst; then enough tasks for the lease index to grow far larger than the due
    # index (which deduplicates a batch's one due time). The planner, expecting one
    # row from either, chose the smaller index and a sort of every pending task, on
    # every claim (60,000 pending in queue_bench: 35 ms a claim). 5,000 were not enough.
    enqueue_many([TaskSpec("EchoAgent", "echo")])
    execute("UPDATE tasks SET status = 'completed', finished_at = now()", {})
    execute("ANALYZE tasks", {})
    enqueue_many([TaskSpec("EchoAgent", "echo") for _ in range(60_000)])

    scan = _locked_scan_of_the_claim()

    assert scan["Node Type"] == "Index Scan", scan["Node Type"]
    assert scan["Index Name"] == "tasks_pending_lease_idx"
