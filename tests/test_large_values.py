"""Large results, metadata and lists: a result over the cap fails its task, one over
the blob threshold is a blob its AgentEvent references, and lists leave large values
in the database."""

from __future__ import annotations

import json
import secrets
import threading
import tracemalloc
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from agents_app import messaging, pubsub
from agents_app.agents.echo import EchoAgent
from agents_app.models import AgentEvent, AgentMessage, Publication, PublicationDelivery
from task_queue import operations
from task_queue.execution import InFlight, deadline_for, run_handler
from task_queue.models import Task, TaskStatus, Workflow
from task_queue.outcomes import OutcomeWriter
from tests.support.api import Api, token
from tests.support.queue import OWNER, claimed_and_started, complete_pending
from workflows.orchestrator.definitions import parse
from workflows.orchestrator.driver import Orchestrator

MIB = 1024 * 1024


def run_echo_tasks() -> None:
    """Run every due EchoAgent task in this process, as a worker would: the handler,
    then the outcome writer on its own thread and connection."""
    writer = OutcomeWriter(OWNER, lambda: None, threading.Event())
    writer.start()
    agent = EchoAgent()
    for task in claimed_and_started("EchoAgent"):
        writer.put(run_handler(InFlight(task=task, agent=agent, deadline=deadline_for(agent))))
    writer.close(timeout=30)


@pytest.mark.django_db(transaction=True)
def test_a_large_result_is_a_blob_its_agent_event_references(blob_dir):
    payload = {"feed": "x" * 200_000}
    task_id = operations.enqueue("EchoAgent", "echo", payload).id
    run_echo_tasks()

    task = Task.objects.get(id=task_id)
    assert task.status == TaskStatus.COMPLETED
    # Echo returns its payload: the same JSON, so the same blob.
    assert task.result is None and task.result_ref == task.payload_ref
    assert len(list(blob_dir.rglob("sha256-*"))) == 1
    event = AgentEvent.objects.get(task_id=task_id)
    assert event.result_ref == task.result_ref and event.data == {"task_type": "echo"}

    api = Api(token("read"))
    detail = api.get(f"/api/v1/tasks/{task_id}").json()
    assert detail["result"] == payload and detail["result_ref"] == task.result_ref
    [listed] = api.get("/api/v1/tasks?agent_name=EchoAgent").json()["items"]
    assert listed["result"] is None and listed["omitted"] == ["payload", "result"]


@pytest.mark.django_db(transaction=True)
def test_a_result_over_the_cap_fails_its_task_and_is_not_stored(blob_dir, settings):
    task_id = operations.enqueue("EchoAgent", "echo", {"feed": "x" * 5000}).id
    settings.QUEUE_MAX_PAYLOAD_BYTES = 4000  # the result is over it
    run_echo_tasks()

    task = Task.objects.get(id=task_id)
    assert task.status == TaskStatus.FAILED and task.result is None and task.result_ref is None
    message = "result too large: is 5012 bytes as JSON; the limit is 4000"
    assert task.error_info["message"] == message
    assert not task.error_info["retryable"]
    assert not AgentEvent.objects.filter(task_id=task_id).exists()


@pytest.mark.django_db
def test_a_list_over_large_rows_stays_small():
    """50 tasks with 1 MiB results each (in the row, as before blobs): a list of 500
    carries none of them, and the web process never holds them."""
    for _ in range(50):
        operations.enqueue("EchoAgent", "echo", {"n": 1})
    complete_pending("EchoAgent", {"rows": secrets.token_hex(MIB // 2)})  # incompressible
    small = operations.enqueue("EchoAgent", "echo", {"small": True}).id
    complete_pending("EchoAgent", {"ok": 1})
    api = Api(token("read"))
    api.get("/api/v1/tasks?agent_name=EchoAgent&limit=1")  # imports, schemas: not the list's

    tracemalloc.start()
    try:
        response = api.get("/api/v1/tasks?agent_name=EchoAgent&limit=500")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 200
    items = response.json()["items"]
    assert len(items) == 51
    assert len(response.content) < 100_000, len(response.content)
    assert peak < 2 * MIB, peak  # a single result is 1 MiB, all of them 50
    by_id = {item["id"]: item for item in items}
    assert by_id[str(small)]["result"] == {"ok": 1} and by_id[str(small)]["omitted"] == []
    large = [item for item in items if item["id"] != str(small)]
    assert all(item["result"] is None and item["omitted"] == ["result"] for item in large)
    # One task's own page has it whole.
    detail = api.get(f"/api/v1/tasks/{large[0]['id']}").json()
    assert len(detail["result"]["rows"]) == MIB


@pytest.mark.django_db
def test_large_workflow_metadata_is_a_blob_and_left_out_of_lists(blob_dir):
    api = Api(token("write"))
    metadata = {"input": "m" * 100_000}
    created = api.post("/api/v1/workflows", {"name": "big", "metadata": metadata})
    assert created.status_code == 201, created.content[:300]
    workflow = Workflow.objects.get(id=created.json()["id"])
    assert workflow.metadata == {} and workflow.metadata_ref.startswith("sha256-")

    [listed] = api.get("/api/v1/workflows").json()["items"]
    assert listed["metadata"] == {} and listed["omitted"] == ["metadata"]
    assert listed["metadata_ref"] == workflow.metadata_ref
    assert api.get(f"/api/v1/workflows/{workflow.id}").json()["metadata"] == metadata

    # Back to small metadata: in the row again, and in lists.
    api.patch(f"/api/v1/workflows/{workflow.id}", {"metadata": {"small": 1}})
    [listed] = api.get("/api/v1/workflows").json()["items"]
    assert listed["metadata"] == {"small": 1} and listed["omitted"] == []
    assert listed["metadata_ref"] is None


@pytest.mark.django_db
def test_message_and_publication_values_over_the_threshold_are_blobs(blob_dir):
    large = {"rows": "r" * 100_000}
    sent = messaging.send("Planner", "Pricer", "data_share", {"a": 1}, metadata=large)
    assert AgentMessage.objects.get(id=sent).metadata_ref.startswith("sha256-")
    [received] = messaging.receive("Pricer")
    assert received.metadata == large and received.payload == {"a": 1}

    pubsub.subscribe("Pricer", "all")
    publication_id, _ = pubsub.publish("Planner", "feed.loaded", large, metadata=large)
    publication = Publication.objects.get(id=publication_id)
    assert publication.payload == {} and publication.payload_ref == publication.metadata_ref
    [delivery] = pubsub.receive("Pricer")
    assert delivery.payload == large and delivery.metadata == large
    assert pubsub.ack(delivery, result=large)
    stored = PublicationDelivery.objects.get(id=delivery.id)
    assert stored.result is None and stored.result_ref == publication.payload_ref
    assert len(list(blob_dir.rglob("sha256-*"))) == 1  # one content, one blob


@pytest.mark.django_db
def test_every_json_value_a_client_fills_is_capped(settings):
    settings.QUEUE_MAX_PAYLOAD_BYTES = 1000
    too_large = {"x": "y" * 2000}
    with pytest.raises(messaging.InvalidMessage, match="metadata: is 2009 bytes as JSON"):
        messaging.send("Planner", "Pricer", "data_share", {}, metadata=too_large)
    with pytest.raises(messaging.InvalidMessage, match="payload: is 2009 bytes"):
        pubsub.publish("Planner", "feed.loaded", too_large)
    response = Api(token("write")).post("/api/v1/workflows", {"name": "w", "metadata": too_large})
    assert response.status_code == 413
    assert json.loads(response.content)["field_errors"][0]["field"] == "metadata"


class InProcessClient:
    """The orchestrator's API client calls, through the API in this process."""

    def __init__(self) -> None:
        self.api = Api(token("write"))

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        return self.api.get(f"{path}?{query}" if query else path).json()

    def post(self, path: str, body: Any = None) -> Any:
        return self.api.post(path, body).json()

    def patch(self, path: str, body: Any) -> Any:
        return self.api.patch(path, body).json()

    def pages(self, path: str, **params: Any) -> Iterator[dict[str, Any]]:
        page = self.get(path, **params, limit=500)
        assert page["next_cursor"] is None
        yield from page["items"]


@pytest.mark.django_db
def test_the_orchestrator_reads_what_lists_leave_out():
    """Its workflow's metadata (the input) and a step's result are over what lists
    carry: the orchestrator reads them from the workflow's and the task's own GET."""
    definition = parse({
        "name": "large",
        "steps": [
            {"name": "first", "agent_name": "EchoAgent", "task_type": "echo",
             "payload": {"text": "$input.text"}},
            {"name": "second", "agent_name": "EchoAgent", "task_type": "echo",
             "depends_on": ["first"], "payload": {"got": "$steps.first.result.text"}},
        ],
    })  # fmt: skip
    text = "t" * 10_000
    driver = Orchestrator(InProcessClient())
    workflow = driver.start(definition, {"text": text})
    complete_pending("EchoAgent", {"text": text})
    [listed] = driver.client.get("/api/v1/tasks", workflow_id=workflow)["items"]
    assert listed["omitted"] == ["payload", "result"]

    assert driver.run_once() == 1
    second = Task.objects.get(idempotency_key__endswith=":second")
    assert second.payload == {"got": text}
