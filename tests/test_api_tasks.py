"""The task endpoints through the ASGI app, on the real test database."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from task_queue.models import Task, TaskHistory, TaskStatus
from tests.support.api import ECHO, Api, field_names
from tests.support.queue import complete_pending, fail_pending

pytestmark = pytest.mark.django_db


def create(api: Api, **fields):
    response = api.post("/api/v1/tasks", {**ECHO, **fields})
    assert response.status_code == 201, response.content
    return response.json()


# ------------------------------------------------------------------ create


def test_create_one_task_with_every_option(api):
    workflow = api.post("/api/v1/workflows", {"name": "w", "open": True}).json()
    due = datetime(2030, 1, 1, tzinfo=UTC)
    body = {
        **ECHO,
        "workflow_id": workflow["id"],
        "payload": {"sku": "RTR-1"},
        "priority": 0,
        "max_attempts": 7,
        "available_at": due.isoformat(),
        "idempotency_key": "k-1",
        "trace_id": "trace-1",
    }
    response = api.post("/api/v1/tasks", body)
    assert response.status_code == 201
    task = response.json()
    assert {k: task[k] for k in body if k != "available_at"} == {
        k: v for k, v in body.items() if k != "available_at"
    }
    assert datetime.fromisoformat(task["available_at"]) == due
    assert task["status"] == "pending" and task["attempts"] == 0
    assert Task.objects.get(id=task["id"]).workflow_id == uuid.UUID(workflow["id"])


def test_delay_sets_available_at(api):
    task = create(api, delay_seconds=60)
    wait = datetime.fromisoformat(task["available_at"]) - datetime.fromisoformat(task["created_at"])
    assert timedelta(seconds=59) < wait <= timedelta(seconds=60)


def test_idempotency_key_returns_the_existing_task_and_refuses_a_different_body(api):
    first = api.post("/api/v1/tasks", {**ECHO, "payload": {"n": 1}, "idempotency_key": "once"})
    again = api.post("/api/v1/tasks", {**ECHO, "payload": {"n": 1}, "idempotency_key": "once"})
    other = api.post("/api/v1/tasks", {**ECHO, "payload": {"n": 2}, "idempotency_key": "once"})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    assert again.json()["id"] == first.json()["id"]
    assert other.json()["code"] == "idempotency_conflict"
    assert field_names(other) == ["idempotency_key"]
    assert other.json()["details"]["task_id"] == first.json()["id"]
    assert Task.objects.count() == 1


def test_idempotency_survives_an_edit_of_the_task(api):
    """The key is compared with the request that created the task, not its current state."""
    first = create(api, payload={"n": 1}, idempotency_key="edited")
    assert api.patch(f"/api/v1/tasks/{first['id']}", {"payload": {"n": 9}}).status_code == 200
    again = api.post("/api/v1/tasks", {**ECHO, "payload": {"n": 1}, "idempotency_key": "edited"})
    assert again.status_code == 200 and again.json()["id"] == first["id"]


def test_a_batch_is_created_in_one_transaction(api):
    response = api.post("/api/v1/tasks", [{**ECHO, "payload": {"n": n}} for n in range(3)])
    assert response.status_code == 201
    assert response.json()["created"] == 3
    assert [t["payload"]["n"] for t in response.json()["items"]] == [0, 1, 2]


def test_one_bad_task_refuses_the_whole_batch_naming_it(api):
    batch = [{**ECHO}, {"agent_name": "Nobody", "task_type": "echo"}, {**ECHO}]
    response = api.post("/api/v1/tasks", batch)
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "unknown_agent"
    assert field_names(response) == ["[1].agent_name"]
    assert "EchoAgent" in body["details"]["known_agents"]
    assert "FitmentAgent" in body["message"]
    assert Task.objects.count() == 0


def test_a_conflicting_key_in_a_batch_writes_nothing(api):
    create(api, idempotency_key="taken")
    batch = [
        {**ECHO, "payload": {"new": True}},
        {**ECHO, "payload": {"n": 2}, "idempotency_key": "taken"},
    ]
    response = api.post("/api/v1/tasks", batch)
    assert response.status_code == 409
    assert field_names(response) == ["[1].idempotency_key"]
    assert Task.objects.count() == 1


def test_batches_are_limited_to_1000(api):
    response = api.post("/api/v1/tasks", [ECHO] * 1001)
    assert response.status_code == 422
    assert Task.objects.count() == 0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"agent_name": "Nobody"}, "agent_name"),
        ({"task_type": "shout"}, "task_type"),
        ({"priority": 10}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 10**12}, "max_attempts"),
        ({"payload": [1, 2]}, "payload"),
        ({"payload": {"text": "nul\x00"}}, "payload"),
        ({"agent_name": "Echo\x00Agent"}, "agent_name"),
        ({"available_at": "2030-01-01T00:00:00"}, "available_at"),
        ({"delay_seconds": -1}, "delay_seconds"),
        ({"delay_seconds": 1e300}, "delay_seconds"),
        ({"idempotency_key": "k" * 201}, "idempotency_key"),
        ({"workflow_id": str(uuid.uuid4())}, "workflow_id"),
        ({"workflow_id": "not-a-uuid"}, "workflow_id"),
        ({"priorty": 1}, "priorty"),
        ({"available_at": "2030-01-01T00:00:00Z", "delay_seconds": 5}, "available_at"),
    ],
)
def test_bad_fields_are_named_and_nothing_is_written(api, change, field):
    response = api.post("/api/v1/tasks", {**ECHO, **change})
    assert response.status_code == 422, response.content
    assert field_names(response) == [field]
    assert Task.objects.count() == 0


def test_payload_over_the_limit_is_413(api, settings):
    settings.QUEUE_MAX_PAYLOAD_BYTES = 1000
    response = api.post("/api/v1/tasks", {**ECHO, "payload": {"blob": "x" * 1000}})
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    assert field_names(response) == ["payload"]
    assert Task.objects.count() == 0


def test_request_body_over_the_limit_is_413(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    response = api.post("/api/v1/tasks", [{**ECHO, "payload": {"blob": "x" * 100}}] * 200)
    assert response.status_code == 413
    assert response.json()["code"] == "request_too_large"
    assert Task.objects.count() == 0


@pytest.mark.parametrize(
    "raw",
    [b"{nope", b"[1,", b"\xff\xfe", b'{"agent_name": NaN}', b'{"payload": {"x": 1e999}}'],
)
def test_malformed_json_is_400(api, raw):
    response = api.post("/api/v1/tasks", raw=raw)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_json"
    assert Task.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**ECHO, "payload": {"s": "\ud800"}}, "payload"),
        ({**ECHO, "payload": {"\udc00": 1}}, "payload"),
        ({**ECHO, "idempotency_key": "\ud800"}, "idempotency_key"),
        ({**ECHO, "trace_id": "a\x00b"}, "trace_id"),
    ],
)
def test_text_postgresql_cannot_store_is_named(api, body, field):
    """Unpaired surrogates and NUL: refused here rather than by PostgreSQL (a 500)."""
    raw = json.dumps(body).encode()  # keeps the surrogate as a \ud800 escape
    response = api.post("/api/v1/tasks", raw=raw)
    assert response.status_code == 422, response.content
    assert field_names(response) == [field]
    assert Task.objects.count() == 0


# ------------------------------------------------------------------ list


def test_list_filters(api):
    workflow = api.post("/api/v1/workflows", {"name": "w", "open": True}).json()
    in_workflow = create(api, workflow_id=workflow["id"], payload={"sku": "BRK-Alpha"})
    high = create(api, priority=0, payload={"sku": "x"})
    fitment = api.post(
        "/api/v1/tasks",
        {"agent_name": "FitmentAgent", "task_type": "generate_fitment", "payload": {}},
    ).json()
    fail_pending("FitmentAgent", retryable=False)

    def ids(query: str) -> set[str]:
        response = api.get(f"/api/v1/tasks?{query}")
        assert response.status_code == 200, response.content
        return {t["id"] for t in response.json()["items"]}

    assert ids("") == {in_workflow["id"], high["id"], fitment["id"]}
    assert ids("status=failed") == {fitment["id"]}
    assert ids("status=failed&status=pending") == {in_workflow["id"], high["id"], fitment["id"]}
    assert ids("agent_name=FitmentAgent") == {fitment["id"]}
    assert ids("task_type=echo") == {in_workflow["id"], high["id"]}
    assert ids(f"workflow_id={workflow['id']}") == {in_workflow["id"]}
    assert ids("priority=0") == {high["id"]}
    assert ids("q=brk-alpha") == {in_workflow["id"]}
    assert ids("q=100%25") == set()  # % is text, not a wildcard
    middle = Task.objects.get(id=high["id"]).created_at.isoformat().replace("+00:00", "Z")
    assert ids(f"created_after={middle}") == {high["id"], fitment["id"]}
    assert ids(f"created_before={middle}") == {in_workflow["id"]}
    # updated_at is the transaction's now(): the same for every task of this test.
    updated = Task.objects.get(id=high["id"]).updated_at
    assert ids(f"updated_after={updated.isoformat().replace('+00:00', 'Z')}") == ids("")
    earlier = (updated - timedelta(microseconds=1)).isoformat().replace("+00:00", "Z")
    assert ids(f"updated_before={earlier}") == set()


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=lost", "status"),
        ("priority=11", "priority"),
        ("created_after=yesterday", "created_after"),
        ("created_after=2030-01-01T00:00:00", "created_after"),
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("cursor=bm9wZQ", "cursor"),
        ("workflow_id=7", "workflow_id"),
        ("agent_name=a%00b", "agent_name"),
    ],
)
def test_bad_filters_are_named(api, query, field):
    response = api.get(f"/api/v1/tasks?{query}")
    assert response.status_code == 422, response.content
    assert field_names(response) == [field]


def test_times_with_any_offset_are_accepted_and_out_of_range_ones_named(api):
    far = api.get("/api/v1/tasks?created_after=5777-11-06T14:52:19-17:37")
    assert far.status_code == 200 and far.json()["items"] == []
    beyond = api.get("/api/v1/tasks?created_after=9999-12-31T23:00:00-17:00")
    assert beyond.status_code == 422 and field_names(beyond) == ["created_after"]
    offset = json.dumps(["2024-01-01T00:00:00+20:00", str(uuid.uuid4())]).encode()
    cursor = base64.urlsafe_b64encode(offset).decode()
    assert api.get(f"/api/v1/tasks?cursor={cursor}").status_code == 200
    task = create(api, available_at="2030-01-01T00:00:00-17:30")
    assert task["available_at"] == "2030-01-01T17:30:00Z"


@pytest.mark.parametrize(
    "position",
    [
        ["2024-01-01T00:00:00", "00000000-0000-0000-0000-000000000000"],
        ["2024-01-01T00:00:00+00:00", 5],
        "[" * 1000,
    ],
)
def test_forged_cursors_are_422(api, position):
    raw = position.encode() if isinstance(position, str) else json.dumps(position).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    response = api.get(f"/api/v1/tasks?cursor={cursor}")
    assert response.status_code == 422 and field_names(response) == ["cursor"]


def test_pages_are_stable_while_tasks_are_added(api):
    """Every task that existed when paging began is seen exactly once, however many
    are enqueued between pages."""
    api.post("/api/v1/tasks", [{**ECHO, "payload": {"n": n}} for n in range(25)])
    before = set(Task.objects.values_list("id", flat=True))
    seen: list[str] = []
    cursor = None
    while True:
        suffix = f"&cursor={cursor}" if cursor else ""
        page = api.get(f"/api/v1/tasks?limit=7{suffix}").json()
        seen += [t["id"] for t in page["items"]]
        api.post("/api/v1/tasks", [{**ECHO, "payload": {"late": True}}] * 3)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 25
    assert {uuid.UUID(i) for i in seen} == before


# ------------------------------------------------------------------ one task


def test_task_detail_has_every_attempt_with_error_traceback_and_worker(api):
    task = create(api, max_attempts=2)
    fail_pending("EchoAgent", retryable=True)
    # base delay 0: due again at once (the transaction's now())
    fail_pending("EchoAgent", retryable=True)
    detail = api.get(f"/api/v1/tasks/{task['id']}").json()
    assert detail["status"] == "dead" and detail["attempts"] == 2
    assert [(h["event"], h["attempt"]) for h in detail["history"]] == [
        ("retry_scheduled", 1),
        ("dead", 2),
    ]
    for attempt in detail["history"]:
        assert attempt["actor"] == "test-host:1"
        assert attempt["error"]["type"] == "Boom"
        assert attempt["error"]["traceback"].startswith("Traceback")
        assert attempt["started_at"] is not None and attempt["lease_token"] is not None


def test_unknown_task_is_404_and_a_bad_id_is_422(api):
    missing = api.get(f"/api/v1/tasks/{uuid.uuid4()}")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    bad = api.get("/api/v1/tasks/not-a-uuid")
    assert bad.status_code == 422 and field_names(bad) == ["task_id"]


def test_patch_changes_a_pending_task_and_records_what_changed(api):
    task = create(api, payload={"n": 1}, priority=3)
    due = datetime(2031, 5, 1, tzinfo=UTC)
    response = api.patch(
        f"/api/v1/tasks/{task['id']}",
        {"priority": 0, "payload": {"n": 2}, "available_at": due.isoformat()},
    )
    assert response.status_code == 200
    changed = response.json()
    assert (changed["priority"], changed["payload"]) == (0, {"n": 2})
    assert datetime.fromisoformat(changed["available_at"]) == due
    (entry,) = TaskHistory.objects.filter(task_id=task["id"])
    assert entry.event == "updated" and entry.actor == "token:test-write"
    assert entry.detail["priority"] == {"from": 3, "to": 0}
    assert entry.detail["payload"] == {"from": {"n": 1}, "to": {"n": 2}}


def test_patch_of_a_task_that_is_not_pending_is_409_naming_its_status(api):
    task = create(api)
    complete_pending("EchoAgent")
    response = api.patch(f"/api/v1/tasks/{task['id']}", {"priority": 0})
    assert response.status_code == 409
    assert response.json()["details"] == {"status": "completed"}
    assert "completed" in response.json()["message"]
    assert Task.objects.get(id=task["id"]).priority == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "body"), ({"priority": None}, "priority"), ({"status": "completed"}, "status")],
)
def test_patch_needs_a_change(api, body, field):
    task = create(api)
    response = api.patch(f"/api/v1/tasks/{task['id']}", body)
    assert response.status_code == 422
    assert field_names(response) == [field]


def test_cancel_a_pending_task_then_again(api):
    task = create(api)
    response = api.post(f"/api/v1/tasks/{task['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["outcome"] == "cancelled"
    assert response.json()["task"]["status"] == "cancelled"
    again = api.post(f"/api/v1/tasks/{task['id']}/cancel")
    assert again.status_code == 409 and again.json()["details"] == {"status": "cancelled"}


def test_cancel_a_running_task_asks_its_worker(api):
    from tests.support.queue import claim_and_start

    task = create(api)
    claim_and_start("EchoAgent")
    response = api.post(f"/api/v1/tasks/{task['id']}/cancel")
    assert response.json()["outcome"] == "cancel_requested"
    assert response.json()["task"]["status"] == "running"
    assert response.json()["task"]["cancel_requested_at"] is not None


def test_revive_a_dead_task_with_an_edited_payload(api):
    task = create(api, max_attempts=1, payload={"n": 1})
    fail_pending("EchoAgent", retryable=True)
    assert Task.objects.get(id=task["id"]).status == TaskStatus.DEAD
    response = api.post(f"/api/v1/tasks/{task['id']}/revive", {"payload": {"n": 2}})
    assert response.status_code == 200
    revived = response.json()
    assert (revived["status"], revived["attempts"], revived["payload"]) == ("pending", 0, {"n": 2})
    again = api.post(f"/api/v1/tasks/{task['id']}/revive")
    assert again.status_code == 409 and again.json()["details"] == {"status": "pending"}


def test_revive_refuses_an_unstorable_payload(api, settings):
    task = create(api, max_attempts=1)
    fail_pending("EchoAgent", retryable=False)
    settings.QUEUE_MAX_PAYLOAD_BYTES = 100
    response = api.post(f"/api/v1/tasks/{task['id']}/revive", {"payload": {"x": "y" * 200}})
    assert response.status_code == 413
    assert Task.objects.get(id=task["id"]).status == TaskStatus.FAILED


def test_dead_letter_lists_dead_and_failed_tasks(api):
    dead = create(api, max_attempts=1)
    fail_pending("EchoAgent", retryable=True)
    failed = create(api)
    fail_pending("EchoAgent", retryable=False)
    create(api)
    response = api.get("/api/v1/dead-letter")
    assert {t["id"] for t in response.json()["items"]} == {dead["id"], failed["id"]}
    only_failed = api.get("/api/v1/dead-letter?status=failed").json()["items"]
    assert [t["id"] for t in only_failed] == [failed["id"]]


def test_bulk_revive_by_ids_and_by_filter(admin_api):
    api = admin_api
    for n in range(4):
        create(api, max_attempts=1, payload={"n": n, "batch": "a" if n < 3 else "b"})
    fail_pending("EchoAgent", retryable=True)
    some = list(Task.objects.filter(payload__n__in=[0, 1]).values_list("id", flat=True))
    by_ids = api.post("/api/v1/tasks/revive", {"ids": [str(i) for i in some]})
    assert by_ids.status_code == 200 and by_ids.json() == {"revived": 2}
    by_filter = api.post("/api/v1/tasks/revive", {"filters": {"q": '"batch": "a"'}})
    assert by_filter.json() == {"revived": 1}  # n=2: the others are pending already
    assert Task.objects.filter(status=TaskStatus.DEAD).count() == 1
    both = api.post("/api/v1/tasks/revive", {"ids": [str(some[0])], "filters": {}})
    assert both.status_code == 422 and field_names(both) == ["ids"]
    typo = api.post("/api/v1/tasks/revive", {"filters": {"agent": "EchoAgent"}})
    assert typo.status_code == 422 and field_names(typo) == ["filters.agent"]


def test_bulk_revive_needs_the_admin_scope(api):
    response = api.post("/api/v1/tasks/revive", {"ids": [str(uuid.uuid4())]})
    assert response.status_code == 403 and response.json()["code"] == "forbidden"
