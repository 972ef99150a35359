"""A queue history whose every timestamp is chosen, so rollups and reports can be
checked against figures worked out by hand."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from uuid import UUID

from task_queue import metrics, operations
from task_queue.models import RollupProgress, Task, TaskQueueMetric
from task_queue.sql import heartbeats, leasing
from task_queue.sql import outcomes as outcomes_sql

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
OWNER = "metrics-test:1"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def created(seconds: float, **options) -> UUID:
    task_id = operations.enqueue("EchoAgent", "echo", {}, **options).id
    Task.objects.filter(id=task_id).update(created_at=at(seconds), available_at=at(seconds))
    return task_id


def start(seconds: float) -> dict[UUID, UUID]:
    claimed = leasing.claim_tasks(
        owner=OWNER, agents=["EchoAgent"], limit=10, lease_seconds=600, now=at(seconds)
    )
    return {t.id: t.lease_token for t in claimed}


def complete(task_id: UUID, token: UUID, seconds: float) -> None:
    outcomes_sql.complete_tasks(
        owner=OWNER, done=[(task_id, token, "{}", None, "done")], now=at(seconds)
    )


def fail(task_id: UUID, token: UUID, seconds: float, error: str, *, retryable: bool,
         delay: float = 0.0) -> None:  # fmt: skip
    failure = (task_id, token, retryable, delay, json.dumps({"type": error, "message": "x"}))
    outcomes_sql.fail_tasks(owner=OWNER, failures=[failure], now=at(seconds))


def beat(seconds: float) -> None:
    heartbeats.heartbeat(owner=OWNER, held=[], lease_seconds=600, hostname="h", pid=1,
                      agents=["EchoAgent"], concurrency=1, now=at(seconds))  # fmt: skip


def seed_history() -> None:
    """Minutes 10:00 and 10:01 of EchoAgent (waits are due → started, runs started → ended):

    A: created :05, started :10, completed :12 (waited 5 s, ran 2 s)
    C: created :25, started :26, failed for good with ValueError :29 (waited 1, ran 3)
    B: created :27, started :30, Boom :31 (ran 1 s), retried 29 s later (due 10:01),
       started 10:01:10, completed 10:01:14 (waited 70 - 60 = 10 s, ran 4 s)
    D: created :45 with one attempt, started :46, Timeout :50: dead (waited 1, ran 4)
    Heartbeats at :10, :25 (a 15 s gap) and 10:01:40 (a 75 s gap).
    """
    a = created(5)
    beat(10)
    (token_a,) = start(10).values()
    complete(a, token_a, 12)
    c = created(25)
    b = created(27)
    beat(25)
    (token_c,) = start(26).values()
    fail(c, token_c, 29, "ValueError", retryable=False)
    (token_b,) = start(30).values()
    fail(b, token_b, 31, "Boom", retryable=True, delay=29)
    d = created(45, max_attempts=1)
    (token_d,) = start(46).values()
    fail(d, token_d, 50, "Timeout", retryable=True)
    (token_b,) = start(70).values()
    complete(b, token_b, 74)
    beat(100)


def seed_day_and_week() -> None:
    """seed_history plus one more completed task (5 ended: 3 completed, 1 failed, 1
    dead), rolled up; and the 7 days before, 20 completed a day and no failure."""
    seed_history()
    extra = created(300)
    (token,) = start(301).values()
    complete(extra, token, 302)
    for width in metrics.BUCKET_SECONDS:
        RollupProgress.objects.create(
            bucket_seconds=width, computed_until=metrics.bucket_floor(T0, width)
        )
    metrics.roll_up(now=at(26 * 3600))
    seed_week()


def seed_week() -> None:
    """The 7 days before: 20 completed a day and no failure."""
    for n in range(1, 8):
        TaskQueueMetric.objects.create(
            bucket_start=metrics.bucket_floor(T0 - timedelta(days=n), metrics.DAY),
            bucket_seconds=metrics.DAY, agent_name="EchoAgent", tasks_created=20,
            tasks_completed=20, attempts=20,
        )  # fmt: skip
