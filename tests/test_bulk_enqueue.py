"""Bulk enqueue (issue 15, target 6): tasks go in as arrays, a chunk a statement,
pipelined, with time-ordered ids, and a batch is answered with JSON that PostgreSQL
writes (or, asked ``Prefer: return=minimal``, with the ids only). Every guarantee of
``enqueue_many`` holds on that path."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.conf import settings
from django.db import transaction

from automechanica.api.schemas import TaskIdsOut, TaskOut
from task_queue.models import OutboxEvent, Task
from task_queue.operations import (
    CHUNK_SIZE,
    InvalidTask,
    TaskSpec,
    enqueue_many,
    enqueue_many_as_api_json,
)
from task_queue.sql.db import fetch
from tests.support.api import ECHO, field_names
from tests.support.queue import claim_and_start, complete_pending, fail_pending

pytestmark = pytest.mark.django_db

# Text that a text format would misread unescaped (COPY's separator, line ends,
# escape character and NULL marker; an array literal's quotes and braces), and text
# beyond ASCII.
AWKWARD = 'tab\there\nnew\rline back\\slash \\N "quoted" {braced,} NULL é ✓'


PREPARED_INSERTS = (
    "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'WITH input AS%%'"
)


@pytest.mark.parametrize("prepared", [True, False])
def test_the_insert_is_prepared_once_per_connection_unless_turned_off(settings, prepared):
    settings.QUEUE_PREPARED_STATEMENTS = prepared
    for n in range(3):  # each call a statement per chunk
        enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n})] * (CHUNK_SIZE + 1))
    assert fetch(PREPARED_INSERTS, {}) == [(1 if prepared else 0,)]
    assert Task.objects.count() == 3 * (CHUNK_SIZE + 1)


def test_awkward_text_arrives_as_given():
    payload = {AWKWARD: [AWKWARD, "\\", "\\\\N"], "n": 1.5}
    spec = TaskSpec(
        "EchoAgent", "echo", payload, idempotency_key=AWKWARD, trace_id="\\N"
    )  # fmt: skip
    [enqueued] = enqueue_many([spec])

    task = Task.objects.get(id=enqueued.id)
    assert task.payload == payload
    assert (task.idempotency_key, task.trace_id) == (AWKWARD, "\\N")
    event = OutboxEvent.objects.get(kind="evt.task.created.v1", subject_id=str(task.id))
    assert event.trace_id == "\\N"


def test_each_call_inserts_its_own_tasks_within_one_transaction():
    with transaction.atomic():
        first = enqueue_many([TaskSpec("EchoAgent", "echo", {"call": 1})] * 2)
        second = enqueue_many([TaskSpec("EchoAgent", "echo", {"call": 2})] * 3)
    assert len({task.id for task in first + second}) == 5
    assert sorted(Task.objects.values_list("payload__call", flat=True)) == [1, 1, 2, 2, 2]


def test_a_rolled_back_enqueue_leaves_nothing_for_the_next():
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_many([TaskSpec("EchoAgent", "echo", {"rolled_back": True})])
        raise RuntimeError
    [kept] = enqueue_many([TaskSpec("EchoAgent", "echo", {"kept": True})])
    assert list(Task.objects.values_list("id", flat=True)) == [kept.id]


def test_ids_grow_in_the_order_of_the_batch():
    enqueued = enqueue_many([TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(50)])
    ids = [task.id for task in enqueued]
    assert ids == sorted(ids) and {i.version for i in ids} == {7}
    by_creation = Task.objects.order_by("created_at").values_list("id", "payload__n")
    assert list(by_creation) == [(task_id, n) for n, task_id in enumerate(ids)]


def test_a_spec_given_many_times_makes_a_task_each_or_one_by_its_key():
    many = enqueue_many([TaskSpec("EchoAgent", "echo", {"same": True})] * 4)
    assert len({task.id for task in many}) == 4 and all(task.created for task in many)
    keyed = enqueue_many([TaskSpec("EchoAgent", "echo", idempotency_key="one")] * 3)
    assert len({task.id for task in keyed}) == 1
    assert [task.created for task in keyed] == [True, False, False]
    assert OutboxEvent.objects.filter(kind="evt.task.created.v1").count() == 5


def test_a_batch_answer_shows_each_task_as_its_own_page_does(api):
    # Existing tasks with their other fields filled: one completed with a result, one
    # failed with its error; and one running (lease, start).
    old = api.post("/api/v1/tasks", {**ECHO, "idempotency_key": "old", "trace_id": "t"}).json()
    complete_pending("EchoAgent", result={"ok": AWKWARD})
    api.post("/api/v1/tasks", {**ECHO, "idempotency_key": "failed"})
    fail_pending("EchoAgent", retryable=False)
    api.post("/api/v1/tasks", {**ECHO, "idempotency_key": "running"})
    claim_and_start("EchoAgent")
    on_the_second = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)  # no fraction to write
    batch = [
        {**ECHO, "payload": {"text": AWKWARD, "big": 10**30, "x": 0.25}},
        {**ECHO, "idempotency_key": "old", "trace_id": "t"},
        {**ECHO, "available_at": on_the_second.isoformat(), "priority": 9},
        {**ECHO, "payload": {"text": AWKWARD, "big": 10**30, "x": 0.25}, "delay_seconds": 1.5},
        {**ECHO, "idempotency_key": "failed"},
        {**ECHO, "idempotency_key": "running"},
    ]
    response = api.post("/api/v1/tasks", batch)

    assert response.status_code == 201 and response["Content-Type"].startswith("application/json")
    answer = response.json()
    assert answer["created"] == 3
    assert answer["items"][1]["id"] == old["id"]
    assert answer["items"][2]["available_at"] == "2031-05-06T07:08:09Z"
    for item in answer["items"]:
        assert list(item) == list(TaskOut.model_fields)
        page = api.get(f"/api/v1/tasks/{item['id']}").json()
        assert item == {name: page[name] for name in TaskOut.model_fields}
    assert answer["items"][1]["status"] == "completed"
    assert answer["items"][1]["result"] == {"ok": AWKWARD}
    assert answer["items"][4]["status"] == "failed" and answer["items"][4]["error_info"]
    assert answer["items"][5]["status"] == "running" and answer["items"][5]["lease_owner"]


def test_a_batch_of_new_tasks_is_answered_by_its_insert_as_each_page_shows_it(api):
    """All new: the insert itself writes the answer (its RETURNING), in batch order."""
    workflow = api.post("/api/v1/workflows", {"name": "w", "open": True}).json()
    batch = [
        {**ECHO, "payload": {"text": AWKWARD, "big": 10**30, "x": 0.25}, "priority": 0},
        {**ECHO, "workflow_id": workflow["id"]},  # the workflow's trace
        {**ECHO, "available_at": "2031-05-06T07:08:09.123456+02:00", "max_attempts": 7},
        {**ECHO, "delay_seconds": 1.5, "idempotency_key": AWKWARD, "trace_id": "\\N"},
    ] + [{**ECHO, "payload": {"n": n}} for n in range(20)]
    response = api.post("/api/v1/tasks", batch)

    assert response.status_code == 201
    answer = response.json()
    assert answer["created"] == len(batch)
    items = answer["items"]
    assert [item["payload"].get("n") for item in items[4:]] == list(range(20))
    assert items[1]["workflow_id"] == workflow["id"]
    # The time sent, to the microsecond.
    assert items[2]["available_at"] == "2031-05-06T05:08:09.123456Z"
    assert items[3]["idempotency_key"] == AWKWARD
    assert items[0]["trace_id"] == items[0]["id"].replace("-", "")
    assert items[1]["trace_id"] == workflow["trace_id"]
    for item in items:
        assert list(item) == list(TaskOut.model_fields)
        page = api.get(f"/api/v1/tasks/{item['id']}").json()
        assert item == {name: page[name] for name in TaskOut.model_fields}


def test_each_answer_holds_only_its_own_batch_within_one_transaction():
    with transaction.atomic():
        first, first_json = enqueue_many_as_api_json([TaskSpec("EchoAgent", "echo", {"n": 1})])
        second, second_json = enqueue_many_as_api_json(
            [TaskSpec("EchoAgent", "echo", {"n": n}) for n in (2, 3)]
        )
    assert [item["id"] for item in json.loads(first_json)] == [str(first[0].id)]
    assert [item["id"] for item in json.loads(second_json)] == [str(t.id) for t in second]


# Past the insert's chunk size, so a batch goes in as several pipelined statements.
SEVERAL_CHUNKS = CHUNK_SIZE * 2 + 17


def test_a_batch_of_several_chunks_keeps_its_order_and_its_keys(api, blob_dir):
    """A key given again in a later chunk finds the task an earlier chunk made (the
    statements are pipelined, not concurrent); the answer and created_at follow the
    batch's order through every chunk; a large payload in a later chunk is a blob."""
    batch = [{**ECHO, "payload": {"n": n}} for n in range(SEVERAL_CHUNKS)]
    batch[1]["idempotency_key"] = batch[-1]["idempotency_key"] = "new, across chunks"
    batch[-1]["payload"] = batch[1]["payload"]  # the same request, so no conflict
    large = {"n": CHUNK_SIZE + 1, "text": "x" * (settings.PAYLOAD_BLOB_THRESHOLD_BYTES + 1)}
    batch[CHUNK_SIZE + 1]["payload"] = large
    response = api.post("/api/v1/tasks", batch)

    assert response.status_code == 201
    answer = response.json()
    items = answer["items"]
    assert answer["created"] == SEVERAL_CHUNKS - 1
    expected = [task["payload"]["n"] for task in batch]
    expected[CHUNK_SIZE + 1] = None  # a blob: {} in the answer, whole on its page
    assert [item["payload"].get("n") for item in items] == expected
    assert items[1]["id"] == items[-1]["id"]
    by_creation = Task.objects.order_by("created_at").values_list("id", flat=True)
    assert [str(task_id) for task_id in by_creation] == [item["id"] for item in items[:-1]]
    blob = Task.objects.get(id=items[CHUNK_SIZE + 1]["id"])
    assert blob.payload_ref and api.get(f"/api/v1/tasks/{blob.id}").json()["payload"] == large

    other = [{**ECHO, "payload": {"n": n}} for n in range(SEVERAL_CHUNKS)]
    other[-1] = {**batch[1], "payload": {"different": True}}
    conflict = api.post("/api/v1/tasks", other)
    assert conflict.status_code == 409
    assert field_names(conflict) == [f"[{SEVERAL_CHUNKS - 1}].idempotency_key"]
    assert Task.objects.count() == SEVERAL_CHUNKS - 1


def test_an_invalid_task_in_a_later_chunk_writes_nothing(api):
    """The chunks before it were already sent when it is found: the transaction
    takes them back, with their events and the agents' wake-up."""
    batch = [{**ECHO, "payload": {"n": n}} for n in range(SEVERAL_CHUNKS)]
    batch[-2]["priority"] = "high"  # pydantic lets no such value through: the queue's
    specs = [TaskSpec(**task) for task in batch]  # own check, in enqueue_many
    with pytest.raises(InvalidTask) as refused:
        enqueue_many(specs)
    assert refused.value.path == f"tasks[{SEVERAL_CHUNKS - 2}].priority"
    batch[-2] = {**ECHO, "agent_name": "NoSuchAgent"}
    response = api.post("/api/v1/tasks", batch)
    assert response.status_code == 422
    assert field_names(response) == [f"[{SEVERAL_CHUNKS - 2}].agent_name"]
    assert not Task.objects.exists() and not OutboxEvent.objects.exists()


def test_the_first_bad_task_is_the_one_named(api):
    """In the batch's order, whichever its problem: its own fields or its workflow."""
    workflow = api.post("/api/v1/workflows", {"name": "w", "open": True}).json()
    api.post(f"/api/v1/workflows/{workflow['id']}/cancel")
    bad_task = {**ECHO, "agent_name": "NoSuchAgent"}
    in_cancelled = {**ECHO, "workflow_id": workflow["id"]}

    first_its_own = api.post("/api/v1/tasks", [ECHO, bad_task, in_cancelled])
    assert field_names(first_its_own) == ["[1].agent_name"]
    first_its_workflow = api.post("/api/v1/tasks", [ECHO, in_cancelled, bad_task])
    assert first_its_workflow.status_code == 409  # workflow_cancelled
    assert field_names(first_its_workflow) == ["[1].workflow_id"]
    assert not Task.objects.exists()


def test_return_minimal_answers_the_ids_in_order(api):
    old = api.post("/api/v1/tasks", {**ECHO, "idempotency_key": "old"}).json()
    batch = [{**ECHO, "payload": {"n": n}} for n in range(3)]
    batch.insert(1, {**ECHO, "idempotency_key": "old"})
    minimal = {"Prefer": 'respond-async, RETURN = "Minimal"; foo=bar'}

    response = api.post("/api/v1/tasks", batch, headers=minimal)
    assert response.status_code == 201
    assert response["Preference-Applied"] == "return=minimal"
    answer = response.json()
    assert list(answer) == list(TaskIdsOut.model_fields)
    assert answer["created"] == 3 and answer["ids"][1] == old["id"]
    new = [api.get(f"/api/v1/tasks/{task_id}").json() for task_id in answer["ids"]]
    assert [task["payload"].get("n") for task in new] == [0, None, 1, 2]

    again = api.post("/api/v1/tasks", {**ECHO, "idempotency_key": "old"}, headers=minimal)
    assert again.status_code == 200 and again.json() == {"ids": [old["id"]], "created": 0}
    conflict = api.post(
        "/api/v1/tasks", {**ECHO, "idempotency_key": "old", "priority": 9}, headers=minimal
    )
    assert conflict.status_code == 409


@pytest.mark.parametrize(
    "prefer",
    [
        "return=representation",
        "return=representation, return=minimal",  # the first counts
        "minimal",
        'foo="a,return=minimal"',  # inside a quoted value
    ],
)
def test_without_return_minimal_a_batch_is_answered_whole(api, prefer):
    response = api.post("/api/v1/tasks", [ECHO], headers={"Prefer": prefer})
    assert response.status_code == 201 and "Preference-Applied" not in response
    assert list(response.json()["items"][0]) == list(TaskOut.model_fields)
