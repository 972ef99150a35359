"""The event stream: an envelope for every task transition and message, written in
the transaction of the change, read in order by position without gaps."""

from __future__ import annotations

import importlib
import json
import signal
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from uuid import RFC_4122, UUID

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

from agents_app import messaging, pubsub
from agents_app.models import Publication
from task_queue import event_stream, operations
from task_queue.models import OutboxEvent, TaskHistory
from task_queue.models.stream import SessionRandomUUID
from task_queue.sql import maintenance as maintenance_sql
from tests.support.database import database_url
from tests.support.queue import claim_and_start, complete_pending, fail_pending
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db


def events_of(subject: UUID | str) -> list[event_stream.Envelope]:
    return [e for e in event_stream.next_batch(0, limit=10_000) if e.subject_id == str(subject)]


def test_a_task_lifecycle_is_in_the_stream_in_order():
    task_id = operations.enqueue("EchoAgent", "echo", {}, trace_id="tr-life", max_attempts=3).id
    fail_pending("EchoAgent", retryable=True)  # attempt 1: a retry, due at once
    complete_pending("EchoAgent", {"ok": 1})

    events = events_of(task_id)
    assert [e.kind for e in events] == [
        "evt.task.created.v1",
        "evt.task.claimed.v1",
        "evt.task.retry_scheduled.v1",
        "evt.task.claimed.v1",
        "evt.task.completed.v1",
    ]
    positions = [e.position for e in events]
    assert positions == sorted(positions)
    created, claimed, retry, _, completed = events
    # The creation's message_id is the task's id: every later event names it as cause.
    assert created.message_id == task_id and created.causation_id is None
    assert {e.causation_id for e in events[1:]} == {str(task_id)}
    assert {e.trace_id for e in events} == {"tr-life"}
    assert len({e.message_id for e in events}) == 5
    # A claim starts the attempt: one envelope for both.
    assert claimed.payload["attempt"] == 1 and claimed.payload["lease_until"]
    assert claimed.payload["agent_id"] == "test-host:1"
    assert retry.payload["attempt"] == 1 and retry.payload["error_class"] == "Boom"
    assert retry.payload["next_attempt_at"] and retry.payload["backoff_ms"] == 0
    assert completed.payload["attempt"] == 2
    assert completed.payload["result_ref"] == f"db://tasks/{task_id}/result"
    # The run of the attempt that completed, from its start to its end, in whole ms.
    attempt = TaskHistory.objects.get(task_id=task_id, event="completed")
    run_us = (attempt.occurred_at - attempt.started_at) // timedelta(microseconds=1)
    assert completed.payload["duration_ms"] == int(
        (Decimal(run_us) / 1000).to_integral_value(ROUND_HALF_UP)
    )
    envelope = json.loads(completed.to_json())
    assert set(envelope) == {
        "schema_version", "message_id", "trace_id", "causation_id", "kind", "emitted_at",
        "position", "payload",
    }  # fmt: skip
    assert envelope["schema_version"] == "v1" and envelope["emitted_at"].endswith("Z")
    # Written by PostgreSQL from the stored row, to the microsecond, in UTC; a missing
    # cause is null.
    for event in (created, completed):
        row = OutboxEvent.objects.get(position=event.position)
        written = json.loads(event.to_json())
        assert datetime.fromisoformat(written["emitted_at"]) == row.emitted_at
        assert (written["position"], written["message_id"]) == (row.position, str(row.message_id))
        assert (written["kind"], written["payload"]) == (row.kind, row.payload)
        assert (written["trace_id"], written["causation_id"]) == (row.trace_id, row.causation_id)
        assert (event.message_id, event.subject_id) == (row.message_id, row.subject_id)
    assert json.loads(created.to_json())["causation_id"] is None


def test_lease_expiry_failure_revive_and_cancel_are_in_the_stream():
    doomed = operations.enqueue("EchoAgent", "echo", {}, max_attempts=1).id
    claim_and_start("EchoAgent")
    maintenance_sql.reap_expired_leases(limit=10, now=timezone.now() + timedelta(hours=1))
    operations.revive([doomed], actor="user:op")
    operations.cancel([doomed], actor="user:op")
    refused = operations.enqueue("EchoAgent", "echo", {}).id
    fail_pending("EchoAgent", retryable=False)
    # Cancelled while running, and its worker gone: the reaper ends it cancelled.
    abandoned = operations.enqueue("EchoAgent", "echo", {}).id
    claim_and_start("EchoAgent")
    operations.cancel([abandoned], actor="user:op")
    maintenance_sql.reap_expired_leases(limit=10, now=timezone.now() + timedelta(hours=1))

    assert [e.kind for e in events_of(doomed)] == [
        "evt.task.created.v1",
        "evt.task.claimed.v1",
        "evt.task.lease_expired.v1",
        "evt.task.dead.v1",
        "evt.task.revived.v1",
        "evt.task.cancelled.v1",
    ]
    failed = events_of(refused)[-1]
    assert failed.kind == "evt.task.failed.v1" and failed.payload["to_status"] == "failed"
    assert [e.kind for e in events_of(abandoned)][2:] == [
        "evt.task.cancel_requested.v1",
        "evt.task.lease_expired.v1",
        "evt.task.cancelled.v1",
    ]


def test_a_rolled_back_change_writes_no_event():
    before = OutboxEvent.objects.count()
    with pytest.raises(RuntimeError), transaction.atomic():
        operations.enqueue("EchoAgent", "echo", {})
        assert OutboxEvent.objects.count() == before + 1  # in the same transaction
        raise RuntimeError("roll back")
    assert OutboxEvent.objects.count() == before


def test_messages_and_publications_are_in_the_stream(blob_dir):
    sent = messaging.send("Planner", "Pricer", "task_request", {"sku": "A1"}, metadata={
        "trace_id": "tr-msg"})  # fmt: skip
    [message] = messaging.receive("Pricer")
    messaging.ack(message)
    publication_id, _ = pubsub.publish(
        "pricer-1", "price.changed", {"sku": "A1"}, publisher_type="PricingAgent"
    )

    assert [(e.kind, e.trace_id) for e in events_of(sent)] == [
        ("evt.message.sent.v1", "tr-msg"),
        ("evt.message.acknowledged.v1", "tr-msg"),
    ]
    assert events_of(sent)[0].payload["payload"] == {"sku": "A1"}
    [published] = events_of(publication_id)
    assert published.kind == "evt.agent.PricingAgent.price.changed.v1"
    assert published.payload["payload"] == {"sku": "A1"}
    # A large publication: the envelope names its blob, and stays small itself.
    large_id, _ = pubsub.publish("pricer-1", "feed.loaded", {"rows": "x" * 70_000})
    [large] = events_of(large_id)
    assert large.payload["payload"] == {} and large.payload["payload_bytes"] is None
    assert large.payload["payload_ref"] == Publication.objects.get(id=large_id).payload_ref
    assert len(large.to_json()) < 2000


# Envelopes with the message id the table makes, 20,000 at a time.
ENVELOPES_WITH_DEFAULT_IDS = """
INSERT INTO event_outbox (kind, subject_id, payload)
SELECT 'evt.test.v1', g::text, '{}' FROM generate_series(1, 20000) AS g
RETURNING message_id
"""


@pytest.mark.django_db(transaction=True)
def test_message_ids_are_random_version_4_uuids_unique_across_sessions():
    ids: list[UUID] = []
    sessions = set()
    for _ in range(2):  # two sessions, each seeding its own generator
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            sessions.add(cursor.fetchone()[0])
            cursor.execute(ENVELOPES_WITH_DEFAULT_IDS)
            ids += [row[0] for row in cursor.fetchall()]
        connection.close()

    assert len(sessions) == 2
    assert len(set(ids)) == len(ids) == 40_000
    assert {(i.version, i.variant) for i in ids} == {(4, RFC_4122)}
    # Every one of the 122 random bits varies.
    fixed = (0xF << 76) | (0b11 << 62)
    ones = zeros = 0
    for i in ids:
        ones |= i.int
        zeros |= ~i.int
    assert ones & ~fixed & zeros == ((1 << 128) - 1) & ~fixed


def test_the_message_id_default_is_the_sql_its_migration_set():
    # Django does not compare a default's SQL between the model and the migrations.
    for name in (
        "0030_outbox_message_id_from_session_random",
        "0041_outbox_message_id_on_every_server",
    ):
        migration = importlib.import_module(f"task_queue.migrations.{name}")
        assert SessionRandomUUID.template == migration.SESSION_RANDOM_UUID


@pytest.mark.django_db(transaction=True)
def test_an_event_committed_late_is_read_after_the_reader_passed_its_seq():
    """seq is taken at insert: a reader going by seq would skip the late commit."""
    with (
        psycopg.connect(database_url()) as late,
        psycopg.connect(database_url(), autocommit=True) as early,
    ):
        insert = (
            "INSERT INTO tasks (agent_name, task_type, payload) "
            "VALUES ('EchoAgent', 'echo', '{}') RETURNING id"
        )
        late_id = late.execute(insert).fetchone()[0]  # open transaction: lower seq
        early_id = early.execute(insert).fetchone()[0]  # committed: higher seq
        [first] = event_stream.next_batch(0, limit=100)
        assert first.subject_id == str(early_id) and first.position == 1
        late.commit()
        [second] = event_stream.next_batch(first.position, limit=100)
        assert second.subject_id == str(late_id) and second.position == 2
    seqs = dict(OutboxEvent.objects.values_list("subject_id", "seq"))
    assert seqs[str(late_id)] < seqs[str(early_id)]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_export_resumes_after_a_kill_with_no_repeat_and_no_gap(
    worker_processes, manage_processes, tmp_path
):
    """Four workers change tasks while an exporter follows, is SIGKILLed mid-stream
    and restarted: the file ends with every event once, positions 1..N in order, and
    each task's events in the order they happened."""
    output = tmp_path / "events.jsonl"

    def exporter(to: Path, poll: str = "0.05"):
        return manage_processes("export_events", "--follow", "--poll", poll, "--output", str(to))

    def lines() -> list[dict]:
        if not output.exists():
            return []
        return [json.loads(line) for line in output.read_bytes().splitlines(keepends=True)
                if line.endswith(b"\n")]  # fmt: skip

    first = exporter(output)
    # A second exporter, to a file of its own, sequences events concurrently.
    other_output = tmp_path / "other.jsonl"
    other = exporter(other_output, poll="0.01")
    for _ in range(4):
        worker_processes("EchoAgent", "--concurrency", "4").wait_ready()
    ids = [t.id for t in operations.enqueue_many(
        [operations.TaskSpec("EchoAgent", "echo", {}) for _ in range(400)])]  # fmt: skip
    wait_for(lambda: len(lines()) >= 300, timeout=60, what="the exporter to write 300 events")
    first.kill()
    second = exporter(output)
    wait_for(
        lambda: OutboxEvent.objects.filter(kind="evt.task.completed.v1").count() == 400,
        timeout=120,
        what="all tasks to complete",
    )
    total = OutboxEvent.objects.count()
    wait_for(lambda: len(lines()) >= total, timeout=60, what="the exporter to catch up")
    second.signal(signal.SIGINT)
    assert second.wait(10) == 0, second.log()
    wait_for(
        lambda: other_output.read_bytes().count(b"\n") >= total,
        timeout=60,
        what="the other exporter to catch up",
    )
    other.signal(signal.SIGINT)
    assert other.wait(10) == 0, other.log()
    assert other_output.read_bytes() == output.read_bytes()

    exported = lines()
    assert [e["position"] for e in exported] == list(range(1, total + 1))
    assert len({e["message_id"] for e in exported}) == total
    by_task: dict[str, list[str]] = {}
    for event in exported:
        by_task.setdefault(event["payload"]["task_id"], []).append(event["kind"])
    assert set(by_task) == {str(i) for i in ids}
    expected = [f"evt.task.{kind}.v1" for kind in ("created", "claimed", "completed")]
    assert all(kinds == expected for kinds in by_task.values())


def test_export_options_and_a_cut_line(tmp_path, capsys):
    for n in range(3):
        operations.enqueue("EchoAgent", "echo", {"n": n})
    output = tmp_path / "events.jsonl"
    call_command("export_events", "--since", "1", "--output", str(output))
    assert [json.loads(line)["position"] for line in output.read_text().splitlines()] == [2, 3]
    with output.open("ab") as f:
        f.write(b'{"position": 4, "kind"')  # a crash in the middle of a line
    operations.enqueue("EchoAgent", "echo", {"n": 3})
    call_command("export_events", "--output", str(output))
    assert [json.loads(line)["position"] for line in output.read_text().splitlines()] == [
        2, 3, 4,
    ]  # fmt: skip

    capsys.readouterr()
    call_command("export_events", "--since-time", (timezone.now() + timedelta(hours=1)).isoformat())
    assert capsys.readouterr().out == ""
    call_command("export_events", "--since", "3")
    assert [json.loads(line)["position"] for line in capsys.readouterr().out.splitlines()] == [4]

    with pytest.raises(CommandError, match="--since-time: not an ISO 8601 time"):
        call_command("export_events", "--since-time", "yesterday")
    output.write_text("not json\n")
    with pytest.raises(CommandError, match="the last line is not an exported event"):
        call_command("export_events", "--output", str(output))
