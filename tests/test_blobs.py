"""Large payloads: stored content-addressed through Django's storage, read back
transparently, and a lost blob is that task's error, not the worker's end."""

from __future__ import annotations

import hashlib
import json

import pytest

from agents_app import messaging
from agents_app.models import AgentMessage
from task_queue import blobs, operations
from task_queue.models import OutboxEvent, Task, TaskStatus
from tests.support.api import Api, token
from tests.support.waiting import wait_for

FIVE_MIB = 5 * 1024 * 1024


def large_payload(size: int = FIVE_MIB) -> dict:
    return {"feed": "x" * size, "rows": list(range(100))}


def digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_5_mib_payload_goes_end_to_end(worker_processes, blob_dir):
    api = Api(token("write"))
    payload = large_payload()
    response = api.post("/api/v1/tasks", {"agent_name": "PayloadDigest", "task_type": "digest",
                                          "payload": payload})  # fmt: skip
    assert response.status_code == 201, response.content[:500]
    task_id = response.json()["id"]

    row = Task.objects.get(id=task_id)
    assert row.payload == {} and row.payload_ref.startswith("sha256-")
    [stored] = list(blob_dir.rglob("sha256-*"))
    assert stored.name == row.payload_ref and stored.stat().st_size > FIVE_MIB
    assert not list(blob_dir.rglob(".partial-*"))

    worker_processes("PayloadDigest").wait_ready()
    wait_for(lambda: Task.objects.get(id=task_id).status == TaskStatus.COMPLETED, what="done")
    result = Task.objects.get(id=task_id).result
    assert result["sha256"] == digest(payload)  # the handler got the whole payload

    detail = api.get(f"/api/v1/tasks/{task_id}").json()
    assert detail["payload"] == payload and detail["payload_ref"] == row.payload_ref
    listed = api.get("/api/v1/tasks?agent_name=PayloadDigest").json()["items"][0]
    assert listed["payload"] == {} and listed["payload_ref"] == row.payload_ref
    created = OutboxEvent.objects.get(kind="evt.task.created.v1", subject_id=task_id)
    assert len(json.dumps(created.payload)) < 1000  # the envelope names the task only

    # The same payload again: the same blob, not a second one.
    assert api.post("/api/v1/tasks", {"agent_name": "PayloadDigest", "task_type": "digest",
                                      "payload": payload}).status_code == 201  # fmt: skip
    assert len(list(blob_dir.rglob("sha256-*"))) == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_lost_blob_fails_its_task_and_the_worker_goes_on(worker_processes, blob_dir):
    lost = operations.enqueue("PayloadDigest", "digest", large_payload(100_000)).id
    ref = Task.objects.get(id=lost).payload_ref
    next(blob_dir.rglob(ref)).unlink()
    fine = operations.enqueue("PayloadDigest", "digest", {"small": True}).id

    worker = worker_processes("PayloadDigest", "--concurrency", "1").wait_ready()
    wait_for(lambda: Task.objects.get(id=fine).status == TaskStatus.COMPLETED, what="the next")
    task = Task.objects.get(id=lost)
    assert task.status == TaskStatus.FAILED
    assert task.error_info["type"] == "PayloadBlobMissing"
    assert task.error_info["message"] == f"payload blob {ref} is missing from storage"
    assert worker.process.poll() is None

    # Edit and revive: the new payload is small, so the row keeps it and the ref goes.
    operations.revive([lost], actor="user:op", payload={"rewritten": 1})
    wait_for(lambda: Task.objects.get(id=lost).status == TaskStatus.COMPLETED, what="revived")
    assert Task.objects.get(id=lost).payload_ref is None


@pytest.mark.django_db
def test_messages_carry_large_payloads_and_say_when_a_blob_is_lost(blob_dir):
    payload = large_payload(200_000)
    sent = messaging.send("Planner", "Pricer", "data_share", payload)
    assert AgentMessage.objects.get(id=sent).payload_ref.startswith("sha256-")
    [received] = messaging.receive("Pricer")
    assert received.payload == payload and received.payload_error is None
    event = OutboxEvent.objects.get(kind="evt.message.sent.v1", subject_id=str(sent))
    assert event.payload["payload"] == {} and event.payload["payload_ref"].startswith("sha256-")

    messaging.ack(received)
    messaging.send("Planner", "Pricer", "data_share", payload)
    for path in blob_dir.rglob("sha256-*"):
        path.unlink()
    [broken] = messaging.receive("Pricer")
    assert broken.payload is None and "is missing from storage" in broken.payload_error


@pytest.mark.django_db
def test_blobs_are_checked_against_their_hash(blob_dir):
    ref = blobs.put(b'{"a": 1}')
    assert blobs.put(b'{"a": 1}') == ref and blobs.get(ref) == b'{"a": 1}'
    next(blob_dir.rglob(ref)).write_bytes(b'{"a": 2}')
    with pytest.raises(blobs.PayloadBlobMissing, match="does not match its hash"):
        blobs.get(ref)
    with pytest.raises(blobs.PayloadBlobMissing, match="is not sha256-"):
        blobs.get("../../etc/passwd")
    assert blobs.offload('{"small": 1}') == ('{"small": 1}', None)


def test_the_blob_directories_and_files_are_their_owners_alone(blob_dir):
    blob_dir.mkdir(mode=0o755)  # made before the rule: made private at the next save
    ref = blobs.put(b"private payload")
    fan_out = ref.removeprefix(blobs.PREFIX)[:2]
    modes = {str(p.relative_to(blob_dir)): p.stat().st_mode & 0o777 for p in blob_dir.rglob("*")}
    assert blob_dir.stat().st_mode & 0o777 == 0o700
    assert modes == {fan_out: 0o700, f"{fan_out}/{ref}": 0o600}
