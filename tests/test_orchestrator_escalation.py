"""The reference orchestrator stops driving an escalated workflow, logs it once, and
drives it again once an operator resumes it: over a real daphne, following the stream
and polling."""

from __future__ import annotations

import pytest

from task_queue import escalation, operations
from tests.support.api import token
from tests.support.queue import complete_pending, fail_pending
from tests.test_orchestrator import TWO_STEPS, StuckWorkflowApi, next_events, tasks_of
from workflows.models import Workflow
from workflows.orchestrator.client import ApiClient
from workflows.orchestrator.definitions import parse
from workflows.orchestrator.driver import Orchestrator
from workflows.orchestrator.follow import EventStream

pytestmark = pytest.mark.slow

HELD_BACK = "escalated: not driven until an operator resumes or cancels it"


def kinds(events: list[dict]) -> list[str]:
    return [e["kind"] for e in events]


def test_an_escalated_workflow_is_held_back_until_resumed(live_servers, caplog):
    server = live_servers()
    client = ApiClient(server.url, token("write"))
    driver = Orchestrator(client)
    stream = EventStream(server.url, client.token)
    stream.connect()
    caplog.set_level("INFO", logger="workflows.orchestrator.driver")
    try:
        workflow = driver.start(parse({**TWO_STEPS, "escalate_after_failures": 1}), {})
        assert Workflow.objects.get(id=workflow).escalate_after_failures == 1
        [a] = tasks_of(workflow, "a")
        fail_pending("EchoAgent", retryable=False)
        assert escalation.escalate_due() == [a.workflow_id]
        events = next_events(stream)
        while "evt.workflow.escalated.v1" not in kinds(events):
            events += next_events(stream)
        assert driver.on_events(events) == 0
        held_back = [m for m in caplog.messages if HELD_BACK in m]
        assert held_back == [f"workflow {workflow} {HELD_BACK}"]

        # Its step a revived and completed: still held back, step b is not enqueued.
        operations.revive([a.id], actor="test")
        complete_pending("EchoAgent")
        events = next_events(stream)
        while "evt.task.completed.v1" not in kinds(events):
            events += next_events(stream)
        assert driver.on_events(events) == 0
        assert tasks_of(workflow, "b") == []
        polling = Orchestrator(client)  # a fresh one, polling, reads it escalated
        assert polling.run_once() == 0 and tasks_of(workflow, "b") == []
        assert len([m for m in caplog.messages if HELD_BACK in m]) == 2  # once each

        client.post(f"/api/v1/workflows/{workflow}/resume")
        events = next_events(stream)
        assert kinds(events) == ["evt.workflow.resumed.v1"]
        assert driver.on_events(events) == 1  # step b, at once
        assert len(tasks_of(workflow, "b")) == 1
        assert f"workflow {workflow}: resumed by an operator; driving it again" in caplog.messages
    finally:
        stream.close()


def test_an_escalated_workflow_closed_or_cancelled_is_forgotten():
    api = StuckWorkflowApi()
    api.workflow["status"] = "escalated"
    driver = Orchestrator(api)
    assert driver.run_once() == 0
    assert driver._escalated == {"wf-1"} and driver._escalation_logged == {"wf-1"}
    api.open = False  # closed, or cancelled by an operator: no longer listed open
    driver.run_once()
    assert driver._escalated == set() and driver._escalation_logged == set()
