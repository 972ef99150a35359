"""The claim's plan: each agent's due tasks come from an ordered scan of the lease
index that stops at the claim's room, whatever the planner's statistics say
(task_queue.sql.leasing.prepare_claim_session)."""

from __future__ import annotations

import pytest

from task_queue.operations import TaskSpec, enqueue_many
from task_queue.sql import leasing
from task_queue.sql.db import execute
from tests.support.claims import locked_scan_of_the_claim

pytestmark = pytest.mark.django_db(transaction=True)


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

    scan = locked_scan_of_the_claim(leasing.HEAD)

    assert scan["Node Type"] == "Index Scan", scan["Node Type"]
    assert scan["Index Name"] == "tasks_pending_lease_idx"
