"""Claims behind a backlog start where the worker's last claim began
(task_queue.claim_position), and what that means for the order."""

from __future__ import annotations

from typing import Any

import pytest

from task_queue.claim_position import ClaimPosition
from task_queue.models import Priority
from task_queue.operations import TaskSpec, enqueue_many
from task_queue.sql import leasing
from task_queue.sql.db import execute, fetch_bound
from tests.support.claims import claim_params, locked_scan_of_the_claim

pytestmark = pytest.mark.django_db(transaction=True)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def claim(limit: int, position: ClaimPosition | None) -> list[leasing.ClaimedTask]:
    return leasing.claim_tasks(
        owner="w:1", agents=["EchoAgent"], limit=limit, lease_seconds=30, now=None,
        position=position,
    )  # fmt: skip


def payloads(tasks: list[leasing.ClaimedTask]) -> list[Any]:
    return [task.payload["n"] for task in tasks]


def test_behind_a_backlog_a_claim_skips_the_entries_of_the_tasks_claimed_before(claim_session):
    # 20,000 tasks claimed leave their entries at the head of the lease index: a claim
    # from the head walks past all of them (221 pages read by its scan, measured), one
    # from the position only past the last claim's 100 (6).
    enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(30_000)])
    position = ClaimPosition(clock=Clock())
    for _ in range(200):
        claim(100, position)

    def pages_read(start: Any) -> int:
        """By the claim's scan: index pages, and heap pages of the entries it checks."""
        scan = locked_scan_of_the_claim(start, "ANALYZE, BUFFERS, FORMAT JSON")
        assert scan["Index Name"] == "tasks_pending_lease_idx"
        assert scan["Actual Rows"] == 50
        return scan["Shared Hit Blocks"] + scan["Shared Read Blocks"]

    (start,) = position.next_starts(["EchoAgent"])
    from_position = pages_read(start)
    from_head = pages_read(leasing.HEAD)

    assert from_position < 20 and from_head > 80, (from_position, from_head)


def test_claims_from_the_position_skip_no_task_of_the_backlog(claim_session):
    enqueue_many(
        [TaskSpec("EchoAgent", "echo", {"n": n}, priority=Priority.HIGH) for n in range(300)]
        + [TaskSpec("EchoAgent", "echo", {"n": 300 + n}) for n in range(300)]
    )
    position = ClaimPosition(clock=Clock())

    got = [n for _ in range(12) for n in payloads(claim(50, position))]

    assert got == list(range(600))
    assert claim(50, position) == []


def test_tasks_written_at_the_same_time_are_all_claimed_from_the_position(claim_session):
    # One statement writing 100 tasks with one created_at (as the ORM's db_default,
    # now(), does): the position is that key, and the claims after the first go on
    # from it, taking the rest (a start past the key would find none).
    execute(
        "INSERT INTO tasks (agent_name, task_type, payload, available_at, created_at)"
        " SELECT 'EchoAgent', 'echo', jsonb_build_object('n', n), now(), now()"
        " FROM generate_series(0, 99) AS n",
        {},
    )
    position = ClaimPosition(clock=Clock())

    got = [n for _ in range(4) for n in payloads(claim(30, position))]

    assert sorted(got) == list(range(100))


def test_a_task_of_higher_priority_is_claimed_first_at_the_next_claim_from_the_head(
    claim_session,
):
    enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(200)])
    clock = Clock()
    position = ClaimPosition(clock=clock, from_head_every=0.1)
    assert payloads(claim(50, position)) == list(range(50))
    enqueue_many([TaskSpec("EchoAgent", "echo", {"n": "urgent"}, priority=Priority.CRITICAL)])

    # Behind the backlog the claim goes on from where the last one began...
    assert payloads(claim(50, position)) == list(range(50, 100))
    # ...until the next claim from the head, at most from_head_every later.
    clock.now += 0.1
    assert payloads(claim(50, position)) == ["urgent", *range(100, 149)]


def test_after_a_claim_that_did_not_fill_its_room_the_next_reads_from_the_head(claim_session):
    enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(60)])
    position = ClaimPosition(clock=Clock())
    assert payloads(claim(50, position)) == list(range(50))
    assert payloads(claim(50, position)) == list(range(50, 60))  # the queue ran short
    enqueue_many([TaskSpec("EchoAgent", "echo", {"n": "urgent"}, priority=Priority.CRITICAL)])

    assert payloads(claim(50, position)) == ["urgent"]


def test_a_claim_answers_with_the_created_at_of_each_agents_first_task_alone(claim_session):
    # The position needs each agent's first task of a claim; a timestamptz for every
    # task cost a worker about 6 µs a task to load (leasing.CLAIM_TASKS). 40 of 30 + 30
    # tasks: the claim takes some of each agent's.
    enqueue_many(
        [TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(30)]
        + [TaskSpec("FitmentAgent", "generate_fitment", {"n": n}) for n in range(30)]
    )
    params = claim_params({"EchoAgent": leasing.HEAD, "FitmentAgent": leasing.HEAD}, limit=40)

    rows = fetch_bound(leasing.CLAIM_TASKS, params)

    firsts = sorted((row[1], row[-2], row[-1]) for row in rows if row[-1] is not None)
    assert len(rows) == 40
    assert firsts == fetch_bound(
        "SELECT DISTINCT ON (agent_name) agent_name, priority, created_at FROM tasks"
        " WHERE id = ANY(%(ids)s) ORDER BY agent_name, priority, created_at",
        {"ids": [row[0] for row in rows]},
    )
    assert [agent for agent, _, _ in firsts] == ["EchoAgent", "FitmentAgent"]


def test_the_position_is_the_first_task_each_agent_got() -> None:
    clock = Clock()
    position = ClaimPosition(clock=clock, from_head_every=1.0)
    assert position.next_starts(["A", "B"]) == [None, None]

    position.claimed([("A", 2, 5), ("A", 1, 9), ("B", 3, 1), ("A", 1, 7)], filled=True)
    assert position.next_starts(["A", "B", "C"]) == [(1, 7), (3, 1), None]

    position.claimed([("A", 2, 8)], filled=True)  # B got nothing: from the head again
    assert position.next_starts(["A", "B"]) == [(2, 8), None]

    clock.now = 1.0
    assert position.next_starts(["A"]) == [None]
