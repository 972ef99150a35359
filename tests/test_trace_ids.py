"""Every task has a trace id (issue 17, point 3): generated when the caller gives
none, shared by a workflow's tasks, carried by what an agent sends while it runs a
task, filterable in the API and shown on the task page."""

from __future__ import annotations

import re
import uuid

import pytest
from django.core.management import call_command

from agents_app.models import AgentMessage, Publication
from task_queue import operations
from task_queue.models import OutboxEvent, Task, TaskStatus, Workflow
from task_queue.operations import TaskSpec
from tests.support.api import ECHO
from tests.support.waiting import wait_for


def hex_of(task_id: uuid.UUID | str) -> str:
    return uuid.UUID(str(task_id)).hex


@pytest.mark.django_db
def test_a_task_enqueued_without_a_trace_starts_its_own():
    """The trace of a task that starts one is its id as 32 hex digits (a W3C
    trace-id); a trace the caller gives is kept as given."""
    alone = operations.enqueue("EchoAgent", "echo").id
    batch = operations.enqueue_many([TaskSpec("EchoAgent", "echo")] * 3)
    given = operations.enqueue("EchoAgent", "echo", trace_id="tr-given").id

    traces = dict(Task.objects.values_list("id", "trace_id"))
    assert traces[alone] == hex_of(alone)
    assert [traces[e.id] for e in batch] == [hex_of(e.id) for e in batch]
    assert traces[given] == "tr-given"
    created = OutboxEvent.objects.get(kind="evt.task.created.v1", subject_id=str(alone))
    assert created.trace_id == hex_of(alone)


@pytest.mark.django_db
def test_a_keyed_retry_without_a_trace_is_the_same_request():
    """The generated trace is not part of the request: the same keyed enqueue again
    finds the first task instead of conflicting."""
    first = operations.enqueue("EchoAgent", "echo", idempotency_key="k-1")
    again = operations.enqueue("EchoAgent", "echo", idempotency_key="k-1")
    assert (again.id, again.created) == (first.id, False)


@pytest.mark.django_db
def test_the_cli_and_the_api_generate_one(api):
    call_command("enqueue", "EchoAgent", "echo", "--count", "2")
    created = api.post("/api/v1/tasks", ECHO).json()
    assert created["trace_id"] == hex_of(created["id"])
    assert all(trace == hex_of(id_) for id_, trace in Task.objects.values_list("id", "trace_id"))


@pytest.mark.django_db
def test_a_workflows_tasks_share_its_trace(api):
    created = api.post("/api/v1/workflows", {"name": "w", "tasks": [ECHO, ECHO]}).json()
    assert created["trace_id"] == hex_of(created["id"])
    # A later step, enqueued into the workflow, joins it; a task's own trace wins.
    later = operations.enqueue("EchoAgent", "echo", workflow_id=created["id"]).id
    own = operations.enqueue("EchoAgent", "echo", workflow_id=created["id"], trace_id="mine").id

    traces = dict(Task.objects.values_list("id", "trace_id"))
    shared = [str(task_id) for task_id in traces if task_id != own]
    assert sorted(shared) == sorted([*created["task_ids"], str(later)])
    assert {traces[uuid.UUID(task_id)] for task_id in shared} == {created["trace_id"]}
    assert traces[own] == "mine"


@pytest.mark.django_db
def test_a_workflows_given_trace_is_its_tasks(api):
    """As the reference orchestrator starts its workflows (trace ``wf-<run id>``)."""
    created = api.post(
        "/api/v1/workflows", {"name": "w", "trace_id": "wf-run-1", "tasks": [ECHO]}
    ).json()
    step = operations.enqueue("EchoAgent", "echo", workflow_id=created["id"]).id
    assert created["trace_id"] == "wf-run-1"
    assert set(Task.objects.values_list("trace_id", flat=True)) == {"wf-run-1"}
    assert Task.objects.get(id=step).trace_id == "wf-run-1"


@pytest.mark.django_db
def test_a_workflow_written_without_a_trace_lends_its_id():
    """A workflow row from before traces (no backfill): its tasks share its id."""
    workflow = Workflow.objects.create(name="old")
    Workflow.objects.filter(id=workflow.id).update(trace_id=None)
    tasks = operations.enqueue_many([TaskSpec("EchoAgent", "echo", workflow_id=workflow.id)] * 2)
    assert {Task.objects.get(id=t.id).trace_id for t in tasks} == {workflow.id.hex}


@pytest.mark.django_db
def test_the_api_filters_tasks_by_trace(api):
    workflow = api.post("/api/v1/workflows", {"name": "w", "tasks": [ECHO, ECHO]}).json()
    other = api.post("/api/v1/tasks", ECHO).json()

    listed = api.get(f"/api/v1/tasks?trace_id={workflow['trace_id']}").json()
    assert sorted(t["id"] for t in listed["items"]) == sorted(workflow["task_ids"])
    alone = api.get(f"/api/v1/tasks?trace_id={other['trace_id']}").json()
    assert [t["id"] for t in alone["items"]] == [other["id"]]
    assert api.get("/api/v1/tasks?trace_id=nothing").json()["items"] == []


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_what_an_agent_sends_or_enqueues_while_running_a_task_carries_its_trace(worker_processes):
    worker_processes("Announcer").wait_ready()
    workflow = Workflow.objects.create(name="announcing", trace_id="tr-announce")
    task_id = operations.enqueue("Announcer", "announce", workflow_id=workflow.id).id

    wait_for(
        lambda: Task.objects.get(id=task_id).status == TaskStatus.COMPLETED,
        what="the task to complete",
    )
    message = AgentMessage.objects.get(from_agent="Announcer")
    publication = Publication.objects.get(publisher_agent="Announcer")
    assert message.metadata["trace_id"] == publication.metadata["trace_id"] == "tr-announce"
    sent = OutboxEvent.objects.get(kind="evt.message.sent.v1", subject_id=str(message.id))
    published = OutboxEvent.objects.get(subject_id=str(publication.id))
    assert sent.trace_id == published.trace_id == "tr-announce"
    # And a task it enqueues, outside the workflow, joins the trace too.
    (child,) = Task.objects.filter(payload__announced_by=str(task_id))
    assert child.workflow_id is None and child.trace_id == "tr-announce"


@pytest.mark.django_db
def test_a_trace_named_by_the_sender_or_no_task_leaves_metadata_as_given():
    from agents_app import messaging
    from task_queue.task_logging import TaskRef, about_task

    outside = messaging.send("A", "B", "notification")
    with about_task(TaskRef(uuid.uuid4(), "tr-task", "A")):
        inside = messaging.send("A", "B", "notification", metadata={"k": 1})
        named = messaging.send("A", "B", "notification", metadata={"trace_id": "tr-own"})
    metadata = dict(AgentMessage.objects.values_list("id", "metadata"))
    assert metadata[outside] == {}
    assert metadata[inside] == {"k": 1, "trace_id": "tr-task"}
    assert metadata[named] == {"trace_id": "tr-own"}


@pytest.mark.django_db
def test_the_task_page_shows_the_trace_and_links_to_everything_in_it():
    from agents_app import messaging, pubsub
    from task_queue.task_logging import TaskRef, about_task
    from tests.support.users import staff

    workflow = Workflow.objects.create(name="onboarding")
    first, second = operations.enqueue_many(
        [TaskSpec("EchoAgent", "echo", workflow_id=workflow.id)] * 2
    )
    elsewhere = operations.enqueue("EchoAgent", "echo").id
    with about_task(TaskRef(second.id, workflow.trace_id, "EchoAgent")):
        message = messaging.send("EchoAgent", "Announcer", "notification")
        publication, _ = pubsub.publish("EchoAgent", "echoed")
    messaging.send("EchoAgent", "Announcer", "notification")  # in no trace

    page = staff().get(f"/tasks/{first.id}/").content.decode()
    section = page[page.index('<section id="trace"') :]
    section = section[: section.index("</section>")]
    assert f'data-trace="{workflow.id.hex}"' in section
    assert f'data-trace-workflow="{workflow.id}"' in section
    assert f'href="/workflows/{workflow.id}/"' in section
    assert f'href="/tasks/{second.id}/"' in section and "(this task)" in section
    assert str(elsewhere) not in section
    assert f"trace_id={workflow.id.hex}" in section  # the API's listing and stream
    assert [int(n) for n in re.findall(r'data-trace-publication="(\d+)"', section)] == [publication]
    assert re.findall(r'data-trace-message="([^"]+)"', section) == [str(message)]


@pytest.mark.django_db
def test_the_page_of_a_task_from_before_traces_says_so():
    from tests.support.users import staff

    task_id = operations.enqueue("EchoAgent", "echo").id
    Task.objects.filter(id=task_id).update(trace_id=None)
    page = staff().get(f"/tasks/{task_id}/").content.decode()
    assert "enqueued before every task had a trace" in page


@pytest.mark.django_db
def test_a_relay_command_and_a_schedule_get_one():
    import json
    from datetime import timedelta

    from task_queue import schedules
    from task_queue.relay.commands import execute_command
    from task_queue.schedules import firing as schedule_firing

    workflow = Workflow.objects.create(name="commanded")
    body = {"schema_version": "v1", "message_id": "m-1", "kind": "cmd.task.execute.v1",
            "payload": {"target_agent_type": "EchoAgent", "task_type": "echo"}}  # fmt: skip
    alone = execute_command(json.dumps(body).encode())
    body["message_id"], body["payload"]["workflow_id"] = "m-2", str(workflow.id)
    joined = execute_command(json.dumps(body).encode())
    # The relay's log lines about the command's task carry the trace it was given.
    assert alone.trace_id == Task.objects.get(id=alone.id).trace_id == alone.id.hex
    assert joined.trace_id == Task.objects.get(id=joined.id).trace_id == workflow.trace_id

    schedule = schedules.create(
        {"name": "tick", "agent_name": "EchoAgent", "task_type": "echo", "interval_seconds": 60},
        actor="user:tester",
        source="api",
    )
    assert schedule_firing.fire_due(now=schedule.next_run_at + timedelta(seconds=1)) == 1
    fired = Task.objects.get(idempotency_key__startswith="schedule:tick:")
    assert fired.trace_id == fired.id.hex
