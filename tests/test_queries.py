"""The fenced statements of task_queue.sql (leasing, outcomes), driven with a controlled clock."""

from datetime import UTC, datetime, timedelta

import pytest

from task_queue import operations
from task_queue.maintenance import reaper
from task_queue.models import OutboxEvent, Task, TaskHistory, TaskStatus
from task_queue.sql import heartbeats, leasing
from task_queue.sql import outcomes as outcomes_sql

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 30.0


def claim_and_start(owner, now):
    (task,) = leasing.claim_tasks(
        owner=owner, agents=["EchoAgent"], limit=1, lease_seconds=LEASE, now=now
    )
    return task


def test_same_worker_cannot_write_with_a_lease_it_lost():
    """A worker whose lease expired, and who then claimed the same task again, must
    not be able to finish the old attempt: the token, not just the owner, fences."""
    task_id = operations.enqueue("EchoAgent", "echo").id
    t0 = datetime.now(UTC) + timedelta(seconds=1)
    first = claim_and_start("host:1", t0)

    after_expiry = t0 + timedelta(seconds=LEASE + 1)
    assert reaper.reap_expired_leases(now=after_expiry) == [(task_id, "EchoAgent", "pending")]
    second = claim_and_start("host:1", after_expiry)
    assert second.lease_token != first.lease_token

    stale = (task_id, first.lease_token, '{"from": "stale"}', None, "stale")
    assert outcomes_sql.complete_tasks(owner="host:1", done=[stale], now=after_expiry) == set()
    assert (
        heartbeats.heartbeat(
            owner="host:1",
            held=[(task_id, first.lease_token)],
            lease_seconds=LEASE,
            hostname="host",
            pid=1,
            agents=["EchoAgent"],
            concurrency=1,
            now=after_expiry,
        )
        == {}
    )
    fresh = (task_id, second.lease_token, '{"from": "fresh"}', None, "fresh")
    assert outcomes_sql.complete_tasks(owner="host:1", done=[fresh], now=after_expiry) == {task_id}
    assert Task.objects.get(id=task_id).result == {"from": "fresh"}


def test_heartbeat_extends_the_lease_so_the_reaper_leaves_it():
    operations.enqueue("EchoAgent", "echo")
    t0 = datetime.now(UTC) + timedelta(seconds=1)
    task = claim_and_start("host:1", t0)
    later = t0 + timedelta(seconds=LEASE - 1)
    alive = heartbeats.heartbeat(
        owner="host:1",
        held=[(task.id, task.lease_token)],
        lease_seconds=LEASE,
        hostname="host",
        pid=1,
        agents=["EchoAgent"],
        concurrency=1,
        now=later,
    )
    assert alive == {task.id: (False, later + timedelta(seconds=LEASE))}
    assert reaper.reap_expired_leases(now=t0 + timedelta(seconds=LEASE + 1)) == []
    assert Task.objects.get(id=task.id).lease_expires_at == later + timedelta(seconds=LEASE)


def test_a_task_that_keeps_killing_its_worker_ends_dead():
    task_id = operations.enqueue("EchoAgent", "echo", max_attempts=2).id
    now = datetime.now(UTC) + timedelta(seconds=1)
    statuses = []
    for _ in range(2):
        claim_and_start(f"host:{len(statuses)}", now)
        now += timedelta(seconds=LEASE + 1)
        statuses += [status for _, _, status in reaper.reap_expired_leases(now=now)]
    assert statuses == ["pending", "dead"]
    task = Task.objects.get(id=task_id)
    assert (task.status, task.attempts, task.error_info["type"]) == ("dead", 2, "LeaseExpired")
    assert list(
        TaskHistory.objects.filter(task_id=task_id).values_list("to_status", flat=True)
    ) == [
        "pending",
        "dead",
    ]


def test_a_claim_starts_the_task_and_writes_one_claimed_envelope():
    task_id = operations.enqueue("EchoAgent", "echo").id
    t0 = datetime.now(UTC) + timedelta(seconds=1)
    leasing.claim_tasks(owner="host:1", agents=["EchoAgent"], limit=1, lease_seconds=LEASE, now=t0)
    task = Task.objects.get(id=task_id)
    assert (task.status, task.started_at, task.lease_owner) == (TaskStatus.RUNNING, t0, "host:1")
    assert task.lease_expires_at == t0 + timedelta(seconds=LEASE)
    (envelope,) = OutboxEvent.objects.filter(subject_id=str(task_id)).exclude(
        kind="evt.task.created.v1"
    )
    assert envelope.kind == "evt.task.claimed.v1"
    assert envelope.payload == {
        "task_id": str(task_id),
        "agent_type": "EchoAgent",
        "agent_id": "host:1",
        "attempt": 1,
        "lease_until": envelope.payload["lease_until"],
    }


def test_one_batch_of_failures_takes_base_delays_given_as_int_and_float():
    ids = [operations.enqueue("EchoAgent", "echo").id for _ in range(2)]
    t0 = datetime.now(UTC) + timedelta(seconds=1)
    claimed = leasing.claim_tasks(
        owner="host:1", agents=["EchoAgent"], limit=2, lease_seconds=LEASE, now=t0
    )
    failures = [
        (task.id, task.lease_token, True, delay, '{"type": "Boom"}')
        for task, delay in zip(claimed, [0.0, 2], strict=True)  # an agent's int delay
    ]
    rows = outcomes_sql.fail_tasks(owner="host:1", failures=failures, now=t0)
    assert {row[0] for row in rows} == set(ids)


def test_a_lease_left_by_an_older_worker_before_its_start_counts_no_attempt():
    """Workers before the claim started tasks left them ``leased`` until a second
    statement: such a lease running out gives the task back without an attempt."""
    task_id = operations.enqueue("EchoAgent", "echo").id
    t0 = datetime.now(UTC) + timedelta(seconds=1)
    leasing.claim_tasks(owner="host:1", agents=["EchoAgent"], limit=1, lease_seconds=LEASE, now=t0)
    Task.objects.filter(id=task_id).update(status=TaskStatus.LEASED, started_at=None)
    reaper.reap_expired_leases(now=t0 + timedelta(seconds=LEASE + 1))
    task = Task.objects.get(id=task_id)
    assert (task.status, task.attempts, task.error_info) == (TaskStatus.PENDING, 0, None)


def test_only_one_reaper_runs_at_a_time():
    from django.db import connections, transaction

    from task_queue.sql.locks import REAPER as REAPER_LOCK_KEY

    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [REAPER_LOCK_KEY])
        assert reaper.reap_expired_leases() is None
        other.rollback()
        assert reaper.reap_expired_leases() == []
    finally:
        other.close()
    assert not transaction.get_connection().in_atomic_block


def test_a_claimed_task_that_carries_the_flag_ends_cancelled_with_its_finish_time():
    """A flagged pending task (left by a lost request) claimed, and its lease expiring:
    it ends cancelled, with the finish time retention prunes it by."""
    task_id = operations.enqueue("EchoAgent", "echo", {}).id
    Task.objects.filter(id=task_id).update(cancel_requested_at="2026-11-01T00:00:00Z")
    now = datetime.now(UTC) + timedelta(seconds=1)
    leasing.claim_tasks(owner="host:1", agents=["EchoAgent"], limit=1, lease_seconds=30, now=now)
    reaped = reaper.reap_expired_leases(now=now + timedelta(seconds=31))
    assert reaped == [(task_id, "EchoAgent", "cancelled")]
    assert Task.objects.get(id=task_id).finished_at == now + timedelta(seconds=31)
