"""Claims behind a backlog start where the worker's last claim began
(task_queue.claim_position), and what that means for the order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from task_queue.claim_position import ClaimPosition
from task_queue.models import Priority
from task_queue.operations import TaskSpec, enqueue_many
from task_queue.sql import leasing
from task_queue.sql.db import execute, fetch_bound
from tests.support.database import plan_nodes

pytestmark = pytest.mark.django_db(transaction=True)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def claim_session() -> Iterator[None]:
    """A worker's claim settings on this test's connection, autovacuum off on tasks (a
    vacuum would remove the claimed tasks' index entries the tests count); closed
    afterwards, so no later test plans with them."""
    execute("ALTER TABLE tasks SET (autovacuum_enabled = off)", {})
    leasing.prepare_claim_session()
    yield
    connection.close()
    execute("ALTER TABLE tasks RESET (autovacuum_enabled)", {})


def claim(limit: int, position: ClaimPosition | None) -> list[leasing.ClaimedTask]:
    return leasing.claim_tasks(
        owner="w:1", agents=["EchoAgent"], limit=limit, lease_seconds=30, now=None,
        position=position,
    )  # fmt: skip


def payloads(tasks: list[leasing.ClaimedTask]) -> list[Any]:
    return [task.payload["n"] for task in tasks]


def test_behind_a_backlog_a_claim_reads_no_entry_of_the_tasks_claimed_before(claim_session):
    # 20,000 tasks claimed leave their entries at the head of the lease index: a claim
    # from the head walks past all of them (about a hundred index pages), one from the
    # position only past the last claim's 100.
    enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(30_000)])
    position = ClaimPosition(clock=Clock())
    for _ in range(200):
        claim(100, position)

    def index_pages_read(starts: list[Any]) -> int:
        params = {"owner": "w:1", "agents": ["EchoAgent"], "limit": 50, "lease_seconds": 30,
                  "now": None, "start_priorities": [s[0] if s else None for s in starts],
                  "start_times": [s[1] if s else None for s in starts]}  # fmt: skip
        with transaction.atomic():
            ((plan,),) = fetch_bound(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + leasing.CLAIM_TASKS, params
            )
            transaction.set_rollback(True)
        plan = plan if isinstance(plan, list) else json.loads(plan)
        (lock_rows,) = [n for n in plan_nodes(plan[0]["Plan"]) if n["Node Type"] == "LockRows"]
        (scan,) = lock_rows["Plans"]
        assert scan["Index Name"] == "tasks_pending_lease_idx"
        assert scan["Actual Rows"] == 50
        return scan["Shared Hit Blocks"] + scan["Shared Read Blocks"]

    from_position = index_pages_read(position.starts(["EchoAgent"]))
    from_head = index_pages_read([None])

    assert from_position < 20 and from_head > 80, (from_position, from_head)


def test_claims_from_the_position_take_the_backlog_in_order_each_task_once(claim_session):
    enqueue_many(
        [TaskSpec("EchoAgent", "echo", {"n": n}, priority=Priority.HIGH) for n in range(300)]
        + [TaskSpec("EchoAgent", "echo", {"n": 300 + n}) for n in range(300)]
    )
    position = ClaimPosition(clock=Clock())

    got = [n for _ in range(12) for n in payloads(claim(50, position))]

    assert got == list(range(600))
    assert claim(50, position) == []


def test_a_task_of_higher_priority_is_claimed_first_at_the_next_claim_from_the_head(
    claim_session,
):
    enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(200)])
    clock = Clock()
    position = ClaimPosition(clock=clock, full_scan_every=0.1)
    assert payloads(claim(50, position)) == list(range(50))
    enqueue_many([TaskSpec("EchoAgent", "echo", {"n": "urgent"}, priority=Priority.CRITICAL)])

    # Behind the backlog the claim goes on from where the last one began...
    assert payloads(claim(50, position)) == list(range(50, 100))
    # ...until the next claim from the head, at most full_scan_every later.
    clock.now += 0.1
    assert payloads(claim(50, position)) == ["urgent", *range(100, 149)]


def test_after_a_claim_that_did_not_fill_its_room_the_next_reads_from_the_head(claim_session):
    enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(60)])
    position = ClaimPosition(clock=Clock())
    assert payloads(claim(50, position)) == list(range(50))
    assert payloads(claim(50, position)) == list(range(50, 60))  # the queue ran short
    enqueue_many([TaskSpec("EchoAgent", "echo", {"n": "urgent"}, priority=Priority.CRITICAL)])

    assert payloads(claim(50, position)) == ["urgent"]


def test_the_position_is_the_first_task_each_agent_got() -> None:
    clock = Clock()
    position = ClaimPosition(clock=clock, full_scan_every=1.0)
    assert position.starts(["A", "B"]) == [None, None]

    position.claimed([("A", 2, 5), ("A", 1, 9), ("B", 3, 1), ("A", 1, 7)], filled=True)
    assert position.starts(["A", "B", "C"]) == [(1, 7), (3, 1), None]

    position.claimed([("A", 2, 8)], filled=True)  # B got nothing: from the head again
    assert position.starts(["A", "B"]) == [(2, 8), None]

    clock.now = 1.0
    assert position.starts(["A"]) == [None]
