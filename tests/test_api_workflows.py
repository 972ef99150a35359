"""Workflows, agents, workers and metrics through the ASGI app."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest

from task_queue.models import Task, TaskStatus, Worker
from tests.support.api import ECHO, Api, field_names
from tests.support.queue import complete_pending, fail_pending
from workflows.models import Workflow

pytestmark = pytest.mark.django_db


def workflow(api: Api, **fields) -> dict:
    response = api.post("/api/v1/workflows", {"name": "onboarding", **fields})
    assert response.status_code == 201, response.content
    return response.json()


def status(api: Api, workflow_id: str) -> str:
    return api.get(f"/api/v1/workflows/{workflow_id}").json()["status"]


def test_workflow_is_created_with_its_first_tasks(api):
    created = workflow(
        api,
        metadata={"supplier": "Acme"},
        trace_id="trace-9",
        tasks=[{**ECHO, "payload": {"n": 1}}, {**ECHO, "payload": {"n": 2}, "priority": 0}],
    )
    assert created["status"] == "running" and created["total_tasks"] == 2
    assert created["progress"]["pending"] == 2 and created["metadata"] == {"supplier": "Acme"}
    tasks = Task.objects.filter(workflow_id=created["id"])
    assert {str(t.id) for t in tasks} == set(created["task_ids"])
    assert {t.trace_id for t in tasks} == {"trace-9"}


def test_a_bad_task_leaves_no_workflow_behind(api):
    response = api.post(
        "/api/v1/workflows",
        {"name": "w", "tasks": [ECHO, {**ECHO, "priority": 99}]},
    )
    assert response.status_code == 422
    assert field_names(response) == ["tasks[1].priority"]
    unknown = api.post(
        "/api/v1/workflows", {"name": "w", "tasks": [ECHO, {**ECHO, "agent_name": "X"}]}
    )
    assert unknown.status_code == 422 and field_names(unknown) == ["tasks[1].agent_name"]
    assert Workflow.objects.count() == 0 and Task.objects.count() == 0


def test_metadata_postgresql_cannot_store_is_refused(api):
    nan = api.post("/api/v1/workflows", raw=b'{"name": "w", "metadata": {"x": NaN}}')
    assert nan.status_code == 400 and nan.json()["code"] == "invalid_json"
    raw = json.dumps({"name": "w", "metadata": {"x": "\ud800"}}).encode()
    surrogate = api.post("/api/v1/workflows", raw=raw)
    assert surrogate.status_code == 422 and field_names(surrogate) == ["metadata"]
    assert Workflow.objects.count() == 0
    created = workflow(api)
    patched = api.call("PATCH", f"/api/v1/workflows/{created['id']}", raw=raw)
    assert patched.status_code == 422 and field_names(patched) == ["metadata"]


def test_status_follows_the_tasks(api):
    """Spec 001 §9: completed when all its tasks are; needs attention when one is
    dead or failed; running again once revived."""
    created = workflow(api, tasks=[{**ECHO, "max_attempts": 1}, {**ECHO, "max_attempts": 1}])
    wid = created["id"]
    assert status(api, wid) == "running"
    fail_pending("EchoAgent", retryable=True)
    assert status(api, wid) == "needs_attention"
    dead = Task.objects.filter(workflow_id=wid, status=TaskStatus.DEAD).values_list("id", flat=True)
    for task_id in dead:
        assert api.post(f"/api/v1/tasks/{task_id}/revive").status_code == 200
    assert status(api, wid) == "running"
    complete_pending("EchoAgent")
    assert status(api, wid) == "completed"
    by_status = api.get("/api/v1/workflows?status=completed").json()["items"]
    assert [w["id"] for w in by_status] == [wid]


def test_an_open_workflow_completes_only_once_closed(api):
    created = workflow(api, open=True, tasks=[ECHO])
    complete_pending("EchoAgent")
    assert status(api, created["id"]) == "running"
    assert api.get("/api/v1/workflows?status=running").json()["items"][0]["id"] == created["id"]
    assert api.post("/api/v1/tasks", {**ECHO, "workflow_id": created["id"]}).status_code == 201
    complete_pending("EchoAgent")
    closed = api.patch(f"/api/v1/workflows/{created['id']}", {"open": False})
    assert closed.status_code == 200 and closed.json()["status"] == "completed"
    assert closed.json()["progress"]["completed"] == 2


def test_list_filters_by_status_and_open(api):
    empty = workflow(api)
    running = workflow(api, tasks=[ECHO])
    failing = workflow(
        api,
        open=True,
        tasks=[{**ECHO, "agent_name": "FitmentAgent", "task_type": "generate_fitment"}],
    )
    fail_pending("FitmentAgent", retryable=False)

    def ids(query: str) -> list[str]:
        response = api.get(f"/api/v1/workflows?{query}")
        assert response.status_code == 200, response.content
        return [w["id"] for w in response.json()["items"]]

    assert ids("") == [failing["id"], running["id"], empty["id"]]
    assert ids("status=pending") == [empty["id"]]
    assert ids("status=running") == [running["id"]]
    assert ids("status=needs_attention") == [failing["id"]]
    assert ids("open=true") == [failing["id"]]
    assert ids("limit=1") == [failing["id"]]
    bad = api.get("/api/v1/workflows?status=lost")
    assert bad.status_code == 422 and field_names(bad) == ["status"]


def test_cancel_cancels_the_tasks_not_started_and_closes_the_workflow(api):
    from tests.support.queue import claim_and_start

    created = workflow(api, open=True, tasks=[ECHO])
    claim_and_start("EchoAgent")  # the first task is running
    api.post("/api/v1/tasks", [{**ECHO, "workflow_id": created["id"]}] * 2)
    response = api.post(f"/api/v1/workflows/{created['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["cancelled_tasks"] == 2
    assert response.json()["workflow"]["status"] == "cancelled"
    assert response.json()["workflow"]["progress"]["running"] == 1
    late = api.post("/api/v1/tasks", {**ECHO, "workflow_id": created["id"]})
    assert late.status_code == 409 and late.json()["code"] == "workflow_cancelled"
    assert field_names(late) == ["workflow_id"]
    again = api.post(f"/api/v1/workflows/{created['id']}/cancel")
    assert again.status_code == 409
    assert api.patch(f"/api/v1/workflows/{created['id']}", {"open": True}).status_code == 409


def test_unknown_workflow_is_404(api):
    wid = uuid.uuid4()
    assert api.get(f"/api/v1/workflows/{wid}").status_code == 404
    assert api.post(f"/api/v1/workflows/{wid}/cancel").status_code == 404
    assert api.patch(f"/api/v1/workflows/{wid}", {"open": False}).status_code == 404


def test_agents_show_settings_and_counts(api):
    api.post("/api/v1/tasks", [ECHO, ECHO])
    complete_pending("EchoAgent")
    api.post("/api/v1/tasks", ECHO)
    agents = {a["name"]: a for a in api.get("/api/v1/agents").json()}
    assert {"FitmentAgent", "SupplierNormalizationAgent", "PricingAgent", "SEOAgent"} <= set(agents)
    echo = agents["EchoAgent"]
    assert echo["task_types"] == ["echo"] and echo["max_attempts"] == 3
    assert echo["counts"]["completed"] == 2 and echo["counts"]["pending"] == 1
    assert agents["FitmentAgent"]["counts"]["pending"] == 0


def test_workers_show_heartbeat_age_and_staleness(api):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    Worker.objects.create(
        worker_id="h:1",
        hostname="h",
        pid=1,
        agents=["EchoAgent"],
        concurrency=4,
        in_flight=2,
        last_heartbeat_at=now,
    )
    Worker.objects.create(
        worker_id="h:2",
        hostname="h",
        pid=2,
        agents=["FitmentAgent"],
        concurrency=1,
        last_heartbeat_at=now - timedelta(minutes=5),
    )
    workers = {w["worker_id"]: w for w in api.get("/api/v1/workers").json()}
    assert workers["h:1"]["in_flight"] == 2 and workers["h:1"]["stale"] is False
    assert workers["h:2"]["stale"] is True and workers["h:2"]["heartbeat_age_seconds"] >= 299


def test_metrics(api):
    api.post("/api/v1/tasks", [ECHO] * 3)
    complete_pending("EchoAgent")
    api.post("/api/v1/tasks", {**ECHO, "max_attempts": 1})
    fail_pending("EchoAgent", retryable=True)
    api.post("/api/v1/tasks", ECHO)
    # One completion 3 minutes ago, one 10 minutes ago, one 20 (outside every window).
    completed = list(Task.objects.filter(status=TaskStatus.COMPLETED).order_by("created_at"))
    for task, minutes in zip(completed, (3, 10, 20), strict=True):
        Task.objects.filter(id=task.id).update(
            finished_at=task.finished_at - timedelta(minutes=minutes),
            started_at=task.finished_at - timedelta(minutes=minutes, seconds=2),
        )
    metrics = api.get("/api/v1/metrics").json()
    assert metrics["totals"]["completed"] == 3 and metrics["totals"]["dead"] == 1
    echo = metrics["agents"]["EchoAgent"]
    assert echo["counts"]["pending"] == 1
    assert echo["completed"] == {"1m": 0, "5m": 1, "15m": 2}
    assert echo["failed"] == {"1m": 1, "5m": 1, "15m": 1}
    assert set(echo["queue_wait_seconds"]) == {"p50", "p95", "p99"}
    # run times: 2 s for the two moved completions, ~0 for the dead one.
    assert echo["run_seconds"]["p99"] == pytest.approx(2, abs=0.1)
    assert metrics["agents"]["FitmentAgent"]["queue_wait_seconds"] is None
    assert metrics["oldest_pending_age_seconds"] is not None


@pytest.mark.django_db(transaction=True)
def test_enqueue_into_a_workflow_being_cancelled_waits_and_is_refused():
    """A cancel that commits while tasks are being added to its workflow: the adding
    transaction waits on the workflow row and then sees it cancelled, so no pending
    task is left behind in a cancelled workflow."""
    import threading

    import psycopg
    from django.db import connection

    from task_queue import operations
    from tests.support.database import database_url
    from tests.support.waiting import wait_for

    created = Workflow.objects.create(name="w", open=True)
    with psycopg.connect(database_url()) as other:
        other.execute(
            "SELECT 1 FROM workflows WHERE id = %s FOR UPDATE", [created.id]
        )  # what the cancel endpoint holds
        other.execute("UPDATE workflows SET cancelled_at = now() WHERE id = %s", [created.id])
        outcome: list[object] = []

        def add_task() -> None:
            try:
                operations.enqueue("EchoAgent", "echo", workflow_id=created.id)
                outcome.append("created")
            except operations.InvalidTask as error:
                outcome.append(error.code)
            finally:
                connection.close()

        adder = threading.Thread(target=add_task)
        adder.start()
        with psycopg.connect(database_url(), autocommit=True) as observer:
            wait_for(
                lambda: observer.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                ).fetchone()[0],
                what="the enqueue to wait for the workflow's lock",
            )
        other.commit()
        adder.join(30)
    assert outcome == ["workflow_cancelled"]
    assert Task.objects.count() == 0
