"""Retention deletes exactly what is past its time, and nothing in flight."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import psycopg
import pytest
from django.db import connection

from agents_app.models import AgentEvent, EmbeddingJob
from task_queue import operations
from task_queue.maintenance import retention
from task_queue.models import RetentionRun, Task, TaskHistory, TaskStatus
from task_queue.sql import db
from tests.support.queue import claim_and_start, complete_pending, fail_pending
from workflows.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)


def task(**options) -> UUID:
    return operations.enqueue("EchoAgent", "echo", {}, **options).id


def finished_days_ago(days: float, *ids: UUID) -> None:
    when = db.database_clock() - timedelta(days=days)
    Task.objects.filter(id__in=ids).update(finished_at=when)


def test_pruning_deletes_exactly_the_finished_tasks_past_retention():
    running = task()
    claim_and_start("EchoAgent")
    old_done, recent_done = task(), task()
    complete_pending("EchoAgent")
    old_cancelled = task()
    operations.cancel([old_cancelled], actor="user:ops")
    dead = task(max_attempts=1)
    fail_pending("EchoAgent", retryable=True)
    failed = task()
    fail_pending("EchoAgent", retryable=False)
    revived = task()
    fail_pending("EchoAgent", retryable=False)

    closed = Workflow.objects.create(name="done long ago", open=False)
    closed_tasks = [task(workflow_id=closed.id) for _ in range(2)]
    complete_pending("EchoAgent")
    troubled = Workflow.objects.create(name="one task dead", open=False)
    troubled_done = task(workflow_id=troubled.id)
    complete_pending("EchoAgent")
    troubled_dead = task(workflow_id=troubled.id, max_attempts=1)
    fail_pending("EchoAgent", retryable=True)
    still_open = Workflow.objects.create(name="open", open=True)
    open_done = task(workflow_id=still_open.id)
    complete_pending("EchoAgent")

    operations.revive([revived], actor="user:ops")  # pending again, finished long ago
    old = [old_done, old_cancelled, dead, failed, revived, running, *closed_tasks,
           troubled_done, troubled_dead, open_done]  # fmt: skip
    finished_days_ago(8, *old)
    finished_days_ago(1, recent_done)
    Workflow.objects.update(created_at=db.database_clock() - timedelta(days=9))
    old_event = AgentEvent.objects.get(task_id=old_done)
    AgentEvent.objects.filter(id=old_event.id).update(
        created_at=db.database_clock() - timedelta(days=91)
    )
    history_before = dict(
        (t, TaskHistory.objects.filter(task_id=t).count())
        for t in Task.objects.values_list("id", flat=True)
    )

    pruned = retention.prune()

    gone = {old_done, old_cancelled, *closed_tasks}
    assert (pruned.tasks, pruned.workflows, pruned.agent_events) == (4, 1, 1)
    assert set(history_before) - set(Task.objects.values_list("id", flat=True)) == gone
    assert not TaskHistory.objects.filter(task_id__in=gone).exists()
    for kept in set(history_before) - gone:  # everything else, with its whole history
        assert TaskHistory.objects.filter(task_id=kept).count() == history_before[kept]
    assert Task.objects.get(id=running).status == TaskStatus.RUNNING
    assert Task.objects.get(id=revived).status == TaskStatus.PENDING
    assert set(Workflow.objects.values_list("name", flat=True)) == {"one task dead", "open"}
    # Agent events outlive their tasks until their own retention.
    assert not AgentEvent.objects.filter(id=old_event.id).exists()
    assert not EmbeddingJob.objects.filter(agent_event_id=old_event.id).exists()
    assert AgentEvent.objects.filter(task_id__in=closed_tasks).count() == 2
    run = RetentionRun.objects.get()
    assert (run.tasks, run.workflows, run.agent_events) == (4, 1, 1)
    assert retention.prune() == retention.Pruned()  # it ran, and found nothing left


def test_pruning_skips_a_row_someone_holds_instead_of_waiting():
    held, other = task(), task()
    complete_pending("EchoAgent")
    finished_days_ago(8, held, other)
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params) as operator:  # a transaction holding one row
        operator.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", [held])
        pruned = retention.prune()
        assert pruned.tasks == 1
        assert list(Task.objects.values_list("id", flat=True)) == [held]
    assert retention.prune().tasks == 1


def test_the_overview_shows_what_retention_pruned():
    from django.contrib.auth.models import User
    from django.test import Client

    done = task()
    complete_pending("EchoAgent")
    finished_days_ago(8, done)
    retention.prune()
    client = Client()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    page = client.get("/").content.decode()
    assert "Retention, last 24 hours: 1 finished task(s), 0 workflow(s)" in page


def test_stream_events_go_once_old_and_relayed_keeping_the_newest():
    from task_queue import event_stream
    from task_queue.models import EventRelayCursor, OutboxEvent

    for _ in range(4):
        task()
    event_stream.sequence()
    task()  # no position yet
    OutboxEvent.objects.update(emitted_at=db.database_clock() - timedelta(days=30))
    EventRelayCursor.objects.create(destination="nats://x", position=2)

    assert retention.prune().stream_events == 2  # what the relay confirmed
    assert list(OutboxEvent.objects.order_by("seq").values_list("position", flat=True)) == [
        3, 4, None,
    ]  # fmt: skip
    EventRelayCursor.objects.all().delete()  # the destination is gone
    # The newest positioned event stays; so does the one without a position yet.
    assert retention.prune().stream_events == 1
    event_stream.sequence()
    assert list(OutboxEvent.objects.order_by("seq").values_list("position", flat=True)) == [4, 5]
    assert RetentionRun.objects.order_by("-id").first().stream_events == 1


def test_every_kind_a_pass_counts_has_its_column():
    # A kind without one would fail every pass as it records what it pruned.
    columns = {field.name for field in RetentionRun._meta.get_fields()}
    assert set(retention.KINDS) <= columns
