"""An escalated workflow in a real browser: the workflows list and the workflow page
show it, and an operator with ``workflows.change_workflow`` resumes it there, the
button pushed live as it escalates (one without it is pushed no button and is
refused)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from task_queue import escalation, operations
from task_queue.models import OperatorAction
from task_queue.models import Workflow as QueueWorkflow
from tests.support.browser import POST_STATUS, needs_chromium
from tests.support.queue import fail_pending
from tests.support.users import grant
from tests.test_dashboard_browser import db, live, log_in, shot, users  # noqa: F401 - fixture

pytestmark = [pytest.mark.slow, needs_chromium]

RESUME = "#workflow-live button[data-action=resume]"


def failing_workflow() -> QueueWorkflow:
    """A workflow whose one task failed for good: escalated at the next pass."""
    workflow = QueueWorkflow.objects.create(name="supplier onboarding", escalate_after_failures=1)
    operations.enqueue("EchoAgent", "echo", {}, workflow_id=workflow.id)
    fail_pending("EchoAgent", retryable=False)
    return workflow


def escalate(workflow: QueueWorkflow) -> None:
    assert escalation.escalate_due() == [workflow.id]


def test_an_escalated_workflow_is_shown_and_resumed(
    users,  # noqa: F811 - the fixture
    live_servers,
    browser,
):
    db(lambda: grant(User.objects.get(username="operator"), "workflows.change_workflow"))
    workflow = db(failing_workflow)
    server = live_servers()

    page = log_in(browser, server, "operator", f"/workflows/{workflow.id}/")
    live(page)
    assert page.query_selector(RESUME) is None
    db(lambda: escalate(workflow))  # while the page is open: the button is pushed
    page.wait_for_selector(RESUME, timeout=10_000)
    assert "1 task(s) dead or failed (threshold 1)" in page.inner_text("p.escalated")
    shot(page, "workflow-escalated")

    page.goto(f"{server.url}/workflows/")
    assert page.inner_text(".wf-escalated") == "escalated"
    shot(page, "workflows-escalated")
    page.goto(f"{server.url}/workflows/{workflow.id}/")
    live(page)
    page.click(RESUME)
    page.wait_for_selector("#workflow-live .wf-needs_attention", timeout=10_000)
    assert "resumed by user:operator" in page.inner_text("#workflow-live")
    assert page.query_selector(RESUME) is None
    shot(page, "workflow-resumed")
    action = db(lambda: OperatorAction.objects.get(action=OperatorAction.Kind.RESUME_WORKFLOW))
    assert (action.actor, action.source) == ("user:operator", "dashboard")


def test_resuming_needs_the_permission(users, live_servers, browser):  # noqa: F811
    workflow = db(failing_workflow)
    server = live_servers()
    page = log_in(browser, server, "viewer", f"/workflows/{workflow.id}/")
    live(page)
    db(lambda: escalate(workflow))
    page.wait_for_selector("p.escalated", timeout=10_000)  # the push arrived
    assert page.query_selector(RESUME) is None
    page.reload()
    assert page.query_selector(RESUME) is None
    assert page.evaluate(POST_STATUS, f"/workflows/{workflow.id}/resume/") == 403
    assert db(lambda: QueueWorkflow.objects.get(id=workflow.id).escalated_at) is not None
