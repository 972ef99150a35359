"""Workflow escalation (spec 001 §9, task_queue.escalation): a workflow escalates once
its failures reach its threshold, or when still running past its deadline; it shows
escalated, emits its envelope once, and holds until resumed or cancelled."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from task_queue import escalation, operations
from task_queue.alerts import evaluation
from task_queue.maintenance import retention
from task_queue.models import (
    AlertKind,
    AlertRule,
    AlertState,
    OperatorAction,
    OutboxEvent,
    Workflow,
    WorkflowEscalationCheck,
)
from task_queue.sql import db
from tests.support.api import ECHO, Api, field_names, token
from tests.support.queue import complete_pending, fail_pending
from tests.test_api_workflows import workflow as create

pytestmark = pytest.mark.django_db


def shown(api: Api, workflow_id: str) -> dict:
    return api.get(f"/api/v1/workflows/{workflow_id}").json()


def fail_one(workflow_id: str) -> None:
    """A task of the workflow, failed for good (each in a statement of its own)."""
    operations.enqueue("EchoAgent", "echo", {}, workflow_id=workflow_id)
    assert len(fail_pending("EchoAgent", retryable=False)) == 1


def envelopes(kind: str) -> list[dict]:
    return list(OutboxEvent.objects.filter(kind=kind).values_list("payload", flat=True))


def test_a_workflow_escalates_once_its_failures_reach_the_threshold(api):
    workflow = create(api, escalate_after_failures=2, open=True)
    assert (workflow["escalate_after_failures"], workflow["escalated_at"]) == (2, None)
    fail_one(workflow["id"])
    assert escalation.escalate_due() == []
    assert shown(api, workflow["id"])["status"] == "needs_attention"

    fail_one(workflow["id"])
    assert [str(w) for w in escalation.escalate_due()] == [workflow["id"]]
    now = shown(api, workflow["id"])
    assert now["status"] == "escalated" and now["escalated_at"] is not None
    assert now["escalation"]["reason"] == "failures"
    assert (now["escalation"]["failures"], now["escalation"]["threshold"]) == (2, 2)
    [envelope] = envelopes("evt.workflow.escalated.v1")
    assert envelope["workflow_id"] == workflow["id"] and envelope["reason"] == "failures"
    assert not WorkflowEscalationCheck.objects.exists()

    fail_one(workflow["id"])  # more failures: it escalated once
    assert escalation.escalate_due() == []
    assert len(envelopes("evt.workflow.escalated.v1")) == 1
    assert api.get("/api/v1/workflows?status=escalated").json()["items"][0]["id"] == workflow["id"]


def test_a_workflow_still_running_past_its_deadline_escalates(api):
    running = create(api, escalate_after_seconds=60, tasks=[ECHO])
    done = create(api, escalate_after_seconds=60, tasks=[ECHO])
    complete_pending("EchoAgent")
    operations.enqueue("EchoAgent", "echo", {}, workflow_id=running["id"])  # still to run
    assert escalation.escalate_due() == []  # not due yet
    with connection.cursor() as cursor:
        cursor.execute("UPDATE workflows SET escalate_at = now() - interval '1 second'")
    assert [str(w) for w in escalation.escalate_due()] == [running["id"]]
    assert shown(api, running["id"])["escalation"]["reason"] == "running_too_long"
    assert shown(api, done["id"])["status"] == "completed"
    with connection.cursor() as cursor:  # looked at once: neither is due any more
        cursor.execute("SELECT count(*) FROM workflows WHERE escalate_at IS NOT NULL")
        assert cursor.fetchone()[0] == 0


def test_resume_holds_it_back_no_more_and_is_audited(api):
    workflow = create(api, escalate_after_failures=1, open=True)
    assert api.post(f"/api/v1/workflows/{workflow['id']}/resume").status_code == 409
    fail_one(workflow["id"])
    escalation.escalate_due()

    response = api.post(f"/api/v1/workflows/{workflow['id']}/resume")
    assert response.status_code == 200, response.content
    resumed = response.json()
    assert resumed["status"] == "needs_attention" and resumed["escalated_at"] is None
    assert resumed["escalation"]["resumed_by"].startswith("token:")
    [resume_event] = envelopes("evt.workflow.resumed.v1")
    assert resume_event["workflow_id"] == workflow["id"]
    action = OperatorAction.objects.get(action=OperatorAction.Kind.RESUME_WORKFLOW)
    assert action.changes == {"workflow": workflow["id"]} and action.source == "api"

    again = api.post(f"/api/v1/workflows/{workflow['id']}/resume")
    assert again.status_code == 409 and again.json()["code"] == "invalid_status"
    fail_one(workflow["id"])  # resumed: the threshold applies no more
    assert escalation.escalate_due() == []


def test_a_cancelled_workflow_does_not_escalate(api):
    workflow = create(api, escalate_after_failures=1, open=True)
    fail_one(workflow["id"])
    assert api.post(f"/api/v1/workflows/{workflow['id']}/cancel").status_code == 200
    assert escalation.escalate_due() == []
    assert shown(api, workflow["id"])["status"] == "cancelled"


@pytest.mark.parametrize(
    "fields",
    [
        {"escalate_after_failures": 0},
        {"escalate_after_failures": 10**12},
        {"escalate_after_failures": "two"},
        {"escalate_after_failures": "2"},
        {"escalate_after_failures": True},
        {"escalate_after_seconds": -1},
        {"escalate_after_seconds": 10**10},
        {"escalate_after_seconds": 1.5},
    ],
)
def test_bad_thresholds_are_refused_naming_the_field(api, fields):
    response = api.post("/api/v1/workflows", {"name": "w", "tasks": [ECHO], **fields})
    assert response.status_code == 422, response.content
    assert field_names(response) == list(fields)
    assert api.get("/api/v1/workflows").json()["items"] == []


def test_the_workflow_escalated_rules_fire_per_workflow_and_resolve_on_resume(api):
    AlertRule.objects.create(name="escalations", kind=AlertKind.WORKFLOW_ESCALATED, threshold=1)
    first = create(api, name="first", escalate_after_failures=1, open=True)
    second = create(api, name="second", escalate_after_failures=1, open=True)
    for workflow in (first, second):
        fail_one(workflow["id"])
    assert evaluation.evaluate() == []  # nothing escalated yet
    escalation.escalate_due()

    made = evaluation.evaluate()
    assert sorted((str(n.workflow_id), n.state) for n in made) == sorted(
        [(first["id"], "firing"), (second["id"], "firing")]
    )
    body = next(n.body for n in made if str(n.workflow_id) == first["id"])
    assert body["workflow"] == first["id"] and body["agent"] == ""
    assert body["links"] == {"workflow": f"/workflows/{first['id']}/"}
    assert "workflow 'first' escalated: 1 task(s) dead or failed (threshold 1)" in body["summary"]
    assert evaluation.evaluate() == []  # once

    api.post(f"/api/v1/workflows/{first['id']}/resume")
    [resolved] = evaluation.evaluate()
    assert (str(resolved.workflow_id), resolved.state) == (first["id"], "resolved")
    # A workflow escalates once: its state goes once resolved (they never pile up).
    assert [str(s.workflow_id) for s in AlertState.objects.all()] == [second["id"]]
    firing = Api(token("read")).get("/api/v1/alerts").json()["firing"]
    assert [n["workflow_id"] for n in firing] == [second["id"]]


def test_retention_keeps_an_escalated_workflow_until_it_is_resumed(api):
    workflow = create(api, escalate_after_seconds=1, tasks=[ECHO])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE workflows SET escalate_at = now() - interval '1 second'")
    escalation.escalate_due()
    complete_pending("EchoAgent")  # its task completes late: it stays escalated
    later = db.database_clock() + timedelta(days=30)
    retention.prune(now=later)
    assert shown(api, workflow["id"])["status"] == "escalated"
    api.post(f"/api/v1/workflows/{workflow['id']}/resume")
    retention.prune(now=later)
    assert api.get(f"/api/v1/workflows/{workflow['id']}").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_a_workflow_locked_elsewhere_is_skipped_with_its_checks_kept(api):
    held = create(api, escalate_after_failures=1, open=True)
    other = create(api, escalate_after_failures=1, open=True)
    fail_one(held["id"])
    fail_one(other["id"])
    fail_one(other["id"])  # two check rows of one workflow: counted once, both gone
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '5s'")  # waiting for the lock fails the test
    try:
        with psycopg.connect(**params) as operator:  # a long transaction on one workflow
            operator.execute("SELECT FROM workflows WHERE id = %s FOR UPDATE", [held["id"]])
            assert [str(w) for w in escalation.escalate_due()] == [other["id"]]
            kept = WorkflowEscalationCheck.objects.values_list("workflow_id", flat=True)
            assert [str(w) for w in kept] == [held["id"]]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert [str(w) for w in escalation.escalate_due()] == [held["id"]]
    assert not WorkflowEscalationCheck.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_workflow_held_for_long_does_not_stall_the_others(api):
    held = create(api, escalate_after_failures=9, open=True)
    other = create(api, escalate_after_failures=1, open=True)
    for _ in range(4):
        fail_one(held["id"])  # the oldest check rows: a whole batch of 2, and more
    fail_one(other["id"])
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params) as operator:
        operator.execute("SELECT FROM workflows WHERE id = %s FOR UPDATE", [held["id"]])
        escalated = []
        for _ in range(4):  # each pass leaves the held workflow one row of its batch
            escalated += [str(w) for w in escalation.escalate_due(limit=2)]
        assert escalated == [other["id"]]
    kept = WorkflowEscalationCheck.objects.values_list("workflow_id", flat=True)
    assert [str(w) for w in kept] == [held["id"]]  # counted once it is free


def test_the_deadline_is_set_however_the_workflow_is_created():
    created = Workflow.objects.create(name="made in code", escalate_after_seconds=90)
    created.refresh_from_db()
    assert created.escalate_at - created.created_at == timedelta(seconds=90)
    assert Workflow.objects.create(name="no deadline").escalate_at is None
