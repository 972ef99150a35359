"""One lease primitive (task_queue.leases), the same guarantees on all four leased
tables: tasks, embedding jobs, agent messages and publication deliveries.

Each scenario runs against each table through the table's own statements, with the
clock passed in (no sleeping):
- a holder whose lease ended and whose row went to another holder cannot write;
- a heartbeat extends only leases still held, and only with the right token;
- recovery gives back expired leases, and never while another process holds the
  table's recovery lock.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection

from agents_app import messaging, pubsub
from agents_app.models import AgentEvent, EmbeddingJob
from agents_app.sql import memory as memory_sql
from agents_app.sql import messages as messages_sql
from agents_app.sql import pubsub as pubsub_sql
from task_queue import leases, operations
from task_queue.leases import Lease
from task_queue.maintenance import reaper
from task_queue.sql import db, leasing
from task_queue.sql import outcomes as outcomes_sql

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_SECONDS = 10.0
MAX_DELIVERIES = 100  # the lease tests deliver a message again and again


@dataclass
class LeasedTable:
    """How a scenario drives one table: make a row, lease it, write with the lease,
    recover."""

    lease: Lease
    make: Callable[[], Any]
    # Lease the next row to ``owner`` at ``now``: its (id, token), or None.
    take: Callable[[str, datetime], tuple[Any, Any] | None]
    # The holder's fenced write (complete, ack): whether it was accepted.
    write: Callable[[str, tuple[Any, Any], datetime], bool]
    # Recovery at ``now``: how many rows it gave back, or None if locked out.
    recover: Callable[[datetime], int | None]


def _task_take(owner: str, now: datetime) -> tuple[Any, Any] | None:
    claimed = leasing.claim_tasks(
        owner=owner, agents=["EchoAgent"], limit=1, lease_seconds=LEASE_SECONDS, now=now
    )
    if not claimed:
        return None
    return claimed[0].id, claimed[0].lease_token


def _task_write(owner: str, held: tuple[Any, Any], now: datetime) -> bool:
    done = [(*held, "{}", None, "done")]
    return bool(outcomes_sql.complete_tasks(owner=owner, done=done, now=now))


def _task_recover(now: datetime) -> int | None:
    reaped = reaper.reap_expired_leases(now=now)
    return None if reaped is None else len(reaped)


def _job_make() -> None:
    event = AgentEvent.objects.create(agent_name="FitmentAgent", event_type="x", content="x")
    EmbeddingJob.objects.create(agent_event=event)


def _job_take(owner: str, now: datetime) -> tuple[Any, Any] | None:
    jobs = memory_sql.claim_embedding_jobs(
        owner=owner, limit=1, lease_seconds=LEASE_SECONDS, now=now
    )
    return (jobs[0].id, jobs[0].lease_token) if jobs else None


def _job_write(owner: str, held: tuple[Any, Any], now: datetime) -> bool:
    done = [(*held, [0.0] * 384)]
    return bool(memory_sql.complete_embedding_jobs(done, owner=owner, now=now))


def _message_take(owner: str, now: datetime) -> tuple[Any, Any] | None:
    rows = messages_sql.receive_messages(
        agent="FitmentAgent",
        limit=1,
        visibility_seconds=LEASE_SECONDS,
        max_deliveries=MAX_DELIVERIES,
        now=now,
    )
    return (rows[0][0], rows[0][-1]) if rows else None


def _delivery_make() -> None:
    pubsub.subscribe("SEOAgent", "leases", "fitment.*")
    pubsub.publish("FitmentAgent", "fitment.done", {"n": 1})


def _delivery_take(owner: str, now: datetime) -> tuple[Any, Any] | None:
    rows = pubsub_sql.receive_publications(
        subscriber="SEOAgent",
        subscription=None,
        limit=1,
        visibility_seconds=LEASE_SECONDS,
        max_deliveries=MAX_DELIVERIES,
        now=now,
    )
    return (rows[0][0], rows[0][1]) if rows else None


TABLES = {
    "tasks": LeasedTable(
        leasing.TASK_LEASE,
        lambda: operations.enqueue("EchoAgent", "echo", {}),
        _task_take,
        _task_write,
        _task_recover,
    ),
    "embedding_jobs": LeasedTable(
        memory_sql.EMBEDDING_LEASE,
        _job_make,
        _job_take,
        _job_write,
        lambda now: memory_sql.recover_embedding_jobs(now=now),
    ),
    "agent_messages": LeasedTable(
        messages_sql.MESSAGE_LEASE,
        lambda: messaging.send("PricingAgent", "FitmentAgent", "command", {"do": "x"}),
        _message_take,
        lambda owner, held, now: messages_sql.ack_message(*held, now=now),
        lambda now: messages_sql.recover_messages(max_deliveries=MAX_DELIVERIES, now=now),
    ),
    "publication_deliveries": LeasedTable(
        pubsub_sql.DELIVERY_LEASE,
        _delivery_make,
        _delivery_take,
        lambda owner, held, now: pubsub_sql.ack_publication(*held, None, None, now=now),
        lambda now: pubsub_sql.recover_deliveries(max_deliveries=MAX_DELIVERIES, now=now),
    ),
}


@pytest.fixture(params=sorted(TABLES))
def table(request) -> LeasedTable:
    return TABLES[request.param]


def _owner(lease: Lease, name: str) -> str | None:
    """The holder's name where the table records one (messages have receipts only)."""
    return name if lease.owner else None


def test_a_stale_holder_cannot_write_once_the_row_is_leased_again(table):
    table.make()
    start = db.database_clock()
    first = table.take("first:1", start)
    assert first is not None
    assert table.take("second:2", start) is None  # held: nobody else gets it
    after_end = start + timedelta(seconds=LEASE_SECONDS + 1)
    assert table.recover(after_end) == 1
    second = table.take("second:2", after_end)
    assert second is not None and second[0] == first[0] and second[1] != first[1]
    assert not table.write("first:1", first, after_end)  # fenced out
    assert table.write("second:2", second, after_end)
    assert not table.write("second:2", second, after_end)  # the lease ended with it


def test_a_heartbeat_extends_only_a_lease_still_held(table):
    table.make()
    start = db.database_clock()
    held = table.take("holder:1", start)
    owner = _owner(table.lease, "holder:1")
    forged = (held[0], uuid.uuid4())
    later = start + timedelta(seconds=LEASE_SECONDS - 1)
    assert (
        leases.extend(
            table.lease, owner=owner, held=[forged], lease_seconds=LEASE_SECONDS, now=later
        )
        == set()
    )
    assert leases.extend(
        table.lease, owner=owner, held=[held], lease_seconds=LEASE_SECONDS, now=later
    ) == {held[0]}
    # Extended from `later`: past the first end, the lease still holds.
    past_first_end = start + timedelta(seconds=LEASE_SECONDS + 1)
    assert table.recover(past_first_end) == 0
    assert table.write("holder:1", held, past_first_end)


def test_recovery_runs_in_one_process_at_a_time(table):
    table.make()
    start = db.database_clock()
    held = table.take("holder:1", start)
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    after_end = start + timedelta(seconds=LEASE_SECONDS + 1)
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [table.lease.recovery_lock])
        assert table.recover(after_end) is None  # another process is recovering
        assert _token(table.lease, held[0]) == held[1]  # so the lease was left alone
        other.execute("SELECT pg_advisory_unlock(%s)", [table.lease.recovery_lock])
    assert table.recover(after_end) == 1
    assert _token(table.lease, held[0]) is None
    assert not table.write("holder:1", held, after_end)


def _token(lease: Lease, row_id: Any) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {lease.token} FROM {lease.table} WHERE id = %s", [row_id])
        return cursor.fetchone()[0]
