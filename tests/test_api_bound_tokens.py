"""What a token bound to agents gets from each route that is not messaging's, called
about another agent's task, workflow, schedule or alert rule: hidden, refused or
filtered, never served. (Messaging's routes: tests/test_api_auth.py.)"""

from __future__ import annotations

import uuid

import pytest

from task_queue.sql import heartbeats
from tests.support.api import Api, token
from tests.test_api_auth import BOUND, MESSAGING, OTHER, REQUIRED_SCOPE

pytestmark = pytest.mark.django_db

# ------------------------------------------------- bound tokens: tasks, workflows, schedules

# What a token bound to BOUND gets for each route that is not messaging's, called about
# OTHER's task, workflow or schedule: "hidden" (404: for it they do not exist),
# "refused" (403 agent_not_allowed), "filtered" (a list without OTHER's), or "open"
# (no agent's data: the API's docs, agents, workers, metrics). A new route fails
# test_every_route_says_what_a_bound_token_gets until it is written down here.
BOUND_GETS = {
    ("GET", "api/openapi.json"): "open",
    ("GET", "api/docs"): "open",
    ("GET", "api/v1/agents"): "open",
    ("PATCH", "api/v1/agents/<name>"): "open",
    ("GET", "api/v1/metrics"): "open",
    ("GET", "api/v1/workers"): "filtered",
    ("POST", "api/v1/tasks"): "refused",
    ("GET", "api/v1/tasks"): "filtered",
    ("GET", "api/v1/dead-letter"): "filtered",
    ("POST", "api/v1/tasks/revive"): "filtered",
    ("GET", "api/v1/tasks/<task_id>"): "hidden",
    ("GET", "api/v1/tasks/<task_id>/similar"): "hidden",
    ("GET", "api/v1/memory/similar"): "filtered",
    ("PATCH", "api/v1/tasks/<task_id>"): "hidden",
    ("POST", "api/v1/tasks/<task_id>/cancel"): "hidden",
    ("POST", "api/v1/tasks/<task_id>/revive"): "hidden",
    ("POST", "api/v1/workflows"): "refused",
    ("GET", "api/v1/workflows"): "filtered",
    ("GET", "api/v1/workflows/<workflow_id>"): "hidden",
    ("PATCH", "api/v1/workflows/<workflow_id>"): "hidden",
    ("POST", "api/v1/workflows/<workflow_id>/cancel"): "hidden",
    ("POST", "api/v1/workflows/<workflow_id>/resume"): "hidden",
    ("POST", "api/v1/schedules"): "refused",
    ("GET", "api/v1/schedules"): "filtered",
    ("PATCH", "api/v1/schedules/<schedule_id>"): "hidden",
    ("DELETE", "api/v1/schedules/<schedule_id>"): "hidden",
    ("POST", "api/v1/schedules/<schedule_id>/run"): "hidden",
    ("POST", "api/v1/agents/<name>/claim"): "refused",
    ("POST", "api/v1/tasks/<task_id>/claim"): "refused",
    ("POST", "api/v1/tasks/<task_id>/heartbeat"): "refused",
    ("POST", "api/v1/tasks/<task_id>/complete"): "refused",
    ("POST", "api/v1/tasks/<task_id>/fail"): "refused",
    ("POST", "api/v1/outcomes"): "refused",
    ("POST", "api/v1/alert-rules"): "refused",
    ("GET", "api/v1/alert-rules"): "filtered",
    ("PATCH", "api/v1/alert-rules/<rule_id>"): "hidden",
    ("DELETE", "api/v1/alert-rules/<rule_id>"): "hidden",
    ("POST", "api/v1/alert-rules/<rule_id>/silence"): "hidden",
    ("POST", "api/v1/alert-rules/<rule_id>/test"): "hidden",
    ("GET", "api/v1/alerts"): "filtered",
}


@pytest.fixture
def others() -> dict[str, str]:
    """OTHER's objects: a pending task in a workflow, a dead task, a schedule."""
    from task_queue import operations as queue
    from task_queue import schedules
    from task_queue.models import AlertRule, Task, Workflow

    workflow = Workflow.objects.create(name="pricing run", open=True)
    pending = queue.enqueue(OTHER, "price_parts", {}, workflow_id=workflow.id)
    # A worker of OTHER's (its row names its agents and tasks).
    heartbeats.heartbeat(owner="pricing-box:7", held=[], lease_seconds=30, hostname="pricing-box",
                      pid=7, agents=[OTHER], concurrency=1, now=None)  # fmt: skip
    dead = queue.enqueue(OTHER, "price_parts", {})
    Task.objects.filter(id=dead.id).update(status="dead", attempts=3)
    schedule = schedules.create(
        {"name": "prices", "interval_seconds": 3600, "agent_name": OTHER,
         "task_type": "price_parts"},
        actor="test", source="test",
    )  # fmt: skip
    rule = AlertRule.objects.create(name="pricing", kind="dead_letter", agent=OTHER, threshold=1)
    return {"task": str(pending.id), "dead": str(dead.id), "workflow": str(workflow.id),
            "schedule": str(schedule.id), "rule": str(rule.id)}  # fmt: skip


def other_calls(ids: dict[str, str]) -> dict[tuple[str, str], tuple[str, dict | None]]:
    """(method, route) -> (path, body) about OTHER's objects, for the routes whose
    answer depends on the token's agents."""
    task, dead, workflow, schedule = ids["task"], ids["dead"], ids["workflow"], ids["schedule"]
    lease = {"lease_token": str(uuid.uuid4())}
    new_task = {"agent_name": OTHER, "task_type": "price_parts"}
    return {
        ("POST", "api/v1/tasks"): ("/api/v1/tasks", new_task),
        ("GET", "api/v1/tasks"): ("/api/v1/tasks", None),
        ("GET", "api/v1/workers"): ("/api/v1/workers", None),
        ("GET", "api/v1/dead-letter"): ("/api/v1/dead-letter", None),
        ("POST", "api/v1/tasks/revive"): ("/api/v1/tasks/revive", {"ids": [dead]}),
        ("GET", "api/v1/tasks/<task_id>"): (f"/api/v1/tasks/{task}", None),
        ("GET", "api/v1/tasks/<task_id>/similar"): (f"/api/v1/tasks/{task}/similar", None),
        ("GET", "api/v1/memory/similar"): ("/api/v1/memory/similar?text=parts", None),
        ("PATCH", "api/v1/tasks/<task_id>"): (f"/api/v1/tasks/{task}", {"priority": 0}),
        ("POST", "api/v1/tasks/<task_id>/cancel"): (f"/api/v1/tasks/{task}/cancel", None),
        ("POST", "api/v1/tasks/<task_id>/revive"): (f"/api/v1/tasks/{dead}/revive", None),
        ("POST", "api/v1/workflows"): ("/api/v1/workflows", {"name": "w", "tasks": [new_task]}),
        ("GET", "api/v1/workflows"): ("/api/v1/workflows", None),
        ("GET", "api/v1/workflows/<workflow_id>"): (f"/api/v1/workflows/{workflow}", None),
        ("PATCH", "api/v1/workflows/<workflow_id>"): (
            f"/api/v1/workflows/{workflow}", {"open": False}),
        ("POST", "api/v1/workflows/<workflow_id>/cancel"): (
            f"/api/v1/workflows/{workflow}/cancel", None),
        ("POST", "api/v1/workflows/<workflow_id>/resume"): (
            f"/api/v1/workflows/{workflow}/resume", None),
        ("POST", "api/v1/schedules"): ("/api/v1/schedules", {
            "name": "mine", "interval_seconds": 60, "agent_name": OTHER,
            "task_type": "price_parts"}),
        ("GET", "api/v1/schedules"): ("/api/v1/schedules", None),
        ("PATCH", "api/v1/schedules/<schedule_id>"): (
            f"/api/v1/schedules/{schedule}", {"enabled": False}),
        ("DELETE", "api/v1/schedules/<schedule_id>"): (f"/api/v1/schedules/{schedule}", None),
        ("POST", "api/v1/schedules/<schedule_id>/run"): (
            f"/api/v1/schedules/{schedule}/run", None),
        ("POST", "api/v1/agents/<name>/claim"): (
            f"/api/v1/agents/{OTHER}/claim", {"worker": "w"}),
        ("POST", "api/v1/tasks/<task_id>/claim"): (f"/api/v1/tasks/{task}/claim", {"worker": "w"}),
        ("POST", "api/v1/tasks/<task_id>/heartbeat"): (f"/api/v1/tasks/{task}/heartbeat", lease),
        ("POST", "api/v1/tasks/<task_id>/complete"): (f"/api/v1/tasks/{task}/complete", lease),
        ("POST", "api/v1/tasks/<task_id>/fail"): (
            f"/api/v1/tasks/{task}/fail", {**lease, "error": {"type": "E", "message": "m"}}),
        ("POST", "api/v1/outcomes"): ("/api/v1/outcomes", {"outcomes": [
            {"task_id": task, **lease, "status": "completed", "result": {}}]}),
        ("POST", "api/v1/alert-rules"): ("/api/v1/alert-rules", {
            "name": "mine", "kind": "dead_letter", "agent": OTHER, "threshold": 1}),
        ("GET", "api/v1/alert-rules"): ("/api/v1/alert-rules", None),
        ("PATCH", "api/v1/alert-rules/<rule_id>"): (
            f"/api/v1/alert-rules/{ids['rule']}", {"enabled": False}),
        ("DELETE", "api/v1/alert-rules/<rule_id>"): (f"/api/v1/alert-rules/{ids['rule']}", None),
        ("POST", "api/v1/alert-rules/<rule_id>/silence"): (
            f"/api/v1/alert-rules/{ids['rule']}/silence", {"until": None}),
        ("POST", "api/v1/alert-rules/<rule_id>/test"): (
            f"/api/v1/alert-rules/{ids['rule']}/test", None),
        ("GET", "api/v1/alerts"): ("/api/v1/alerts", None),
    }  # fmt: skip


def test_every_route_says_what_a_bound_token_gets():
    # Every route the resolver has is in REQUIRED_SCOPE (tests/test_api_auth.py).
    routes = {op for op in REQUIRED_SCOPE if not op[1].startswith(MESSAGING)}
    assert routes == set(BOUND_GETS)


def test_a_bound_token_neither_sees_nor_touches_another_agents_tasks(others):
    from task_queue.models import Schedule, Task, TaskHistory

    bound = Api(token("admin", name="fitment", agents=(BOUND,)))
    for (method, route), (path, body) in other_calls(others).items():
        response = bound.call(method, path, body)
        expected = BOUND_GETS[(method, route)]
        text = response.content.decode()
        if expected == "hidden":
            assert response.status_code == 404, (method, route, text)
        elif expected == "refused":
            assert response.status_code == 403, (method, route, text)
            assert response.json()["code"] == "agent_not_allowed", (method, route)
        else:
            assert response.status_code in (200, 201), (method, route, text)
            assert OTHER not in text and others["task"] not in text, (method, route, text)
            assert others["workflow"] not in text and others["dead"] not in text, (method, route)
    # Nothing was done to OTHER's objects.
    assert Task.objects.filter(agent_name=OTHER).count() == 2
    assert Task.objects.get(id=others["task"]).status == "pending"
    assert Task.objects.get(id=others["dead"]).status == "dead"
    assert not TaskHistory.objects.filter(task__agent_name=OTHER).exists()
    assert Schedule.objects.get(id=others["schedule"]).enabled
    # An unbound token sees them.
    unbound = Api(token("admin", name="orchestrator"))
    assert others["task"] in unbound.get("/api/v1/tasks").content.decode()
    assert unbound.get(f"/api/v1/workflows/{others['workflow']}").json()["total_tasks"] == 1


def test_a_bound_token_sees_a_shared_workflow_with_its_own_tasks_only(others):
    from task_queue import operations as queue

    queue.enqueue(
        BOUND, "generate_fitment", {"sku": "S"}, workflow_id=uuid.UUID(others["workflow"])
    )
    bound = Api(token("write", name="fitment", agents=(BOUND,)))
    seen = bound.get(f"/api/v1/workflows/{others['workflow']}")
    assert seen.status_code == 200 and seen.json()["total_tasks"] == 1
    listed = bound.get("/api/v1/workflows").json()["items"]
    assert [w["id"] for w in listed] == [others["workflow"]]
    cancel = bound.post(f"/api/v1/workflows/{others['workflow']}/cancel")
    assert cancel.status_code == 403 and cancel.json()["code"] == "agent_not_allowed"
