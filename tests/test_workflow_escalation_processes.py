"""Two processes escalating at once escalate each workflow once: each of its failures
left a check row, and both processes take them side by side."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest
from django.db import connection

from task_queue import operations
from task_queue.models import OutboxEvent, Workflow, WorkflowEscalationCheck
from tests.support.database import database_url
from tests.support.processes import start_python
from tests.support.queue import fail_pending
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

START = 7_300_001  # the advisory lock both processes wait on, to start together
ESCALATE_ONE_CHECK_AT_A_TIME = f"""
import django; django.setup()
from django.db import connection
from task_queue.escalation import escalate_due
from task_queue.models import WorkflowEscalationCheck
with connection.cursor() as cursor:
    cursor.execute("SELECT pg_advisory_lock_shared({START})")
escalated = 0
while WorkflowEscalationCheck.objects.exists():
    escalated += len(escalate_due(limit=1))
print(escalated)
"""


def waiting_for_the_start() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND objid = %s",
            [START],
        )
        return cursor.fetchone()[0]


def test_two_processes_escalate_each_workflow_once(transactional_db):
    workflows = [
        Workflow.objects.create(name=f"w{i}", escalate_after_failures=1) for i in range(40)
    ]
    for workflow in workflows:  # each workflow's two check rows side by side
        for _ in range(2):
            operations.enqueue("EchoAgent", "echo", {}, workflow_id=workflow.id)
            fail_pending("EchoAgent", retryable=False)
    assert WorkflowEscalationCheck.objects.count() == 80

    with psycopg.connect(database_url(), autocommit=True) as starter:
        starter.execute("SELECT pg_advisory_lock(%s)", [START])
        processes = [start_python(ESCALATE_ONE_CHECK_AT_A_TIME) for _ in range(2)]
        wait_for(lambda: waiting_for_the_start() == 2, timeout=60, what="both processes")
        starter.execute("SELECT pg_advisory_unlock(%s)", [START])
    outputs = [process.communicate(timeout=120) for process in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    per_process = [int(out) for out, _ in outputs]
    assert sum(per_process) == 40, per_process

    envelopes = OutboxEvent.objects.filter(kind="evt.workflow.escalated.v1")
    assert Counter(e.payload["workflow_id"] for e in envelopes) == Counter(
        str(w.id) for w in workflows
    )
    assert not WorkflowEscalationCheck.objects.exists()
    assert Workflow.objects.filter(escalated_at__isnull=False).count() == 40
