"""The worker protocol over HTTP, in-process through Django's ASGI handler, on the real
test database: claim, heartbeat with progress, complete, fail, the batch of outcomes,
fencing, a bound token's confinement and bad input. (Real processes, SIGKILL and
SIGSTOP, and the long poll against a real daphne: tests/test_remote_workers.py.)"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import timedelta

import pytest

from agents_app.models import AgentEvent, EmbeddingJob
from task_queue import operations
from task_queue.maintenance import reaper
from task_queue.models import PausedAgent, Task, TaskHistory, Worker
from task_queue.task_logging import TaskFields
from tests.support.api import Api, field_names, token

pytestmark = pytest.mark.django_db

WORKER = {"worker": "gpu-box:4242"}


@pytest.fixture
def agent_api() -> Api:
    """A write token bound to EchoAgent, as an agent elsewhere would hold."""
    return Api(token("write", "echo-agent", ("EchoAgent",)))


def claim(api: Api, agent: str = "EchoAgent", **body) -> list[dict]:
    response = api.post(f"/api/v1/agents/{agent}/claim", {**WORKER, **body})
    assert response.status_code == 200, response.content
    return response.json()["tasks"]


def test_claim_answers_the_task_with_its_lease(agent_api):
    task = operations.enqueue("EchoAgent", "echo", {"say": "hi"}, priority=1)
    [claimed] = claim(agent_api, limit=5, lease_seconds=60)
    row = Task.objects.get(id=task.id)
    assert row.status == "running" and row.lease_owner == "gpu-box:4242"
    assert claimed["id"] == str(task.id) and claimed["payload"] == {"say": "hi"}
    assert claimed["lease_token"] == str(row.lease_token)
    assert claimed["attempt"] == 1 and claimed["priority"] == 1
    assert claimed["trace_id"] == row.trace_id and claimed["task_type"] == "echo"
    assert abs((row.lease_expires_at - row.started_at).total_seconds() - 60) < 0.001
    assert claimed["lease_expires_at"].startswith(row.lease_expires_at.isoformat()[:19])
    worker = Worker.objects.get(worker_id="gpu-box:4242")
    assert (worker.kind, worker.agents, worker.task_ids) == ("remote", ["EchoAgent"], [task.id])
    assert (worker.state, row.lease_seconds) == ("busy", 60)


def test_a_heartbeat_extends_the_lease_by_the_length_its_claim_granted(agent_api):
    task = operations.enqueue("EchoAgent", "echo")
    # Another claim of the same worker with a shorter lease changes nothing for it.
    [claimed] = claim(agent_api, lease_seconds=600)
    assert claim(agent_api, lease_seconds=5) == []
    path = f"/api/v1/tasks/{task.id}/heartbeat"
    beat = agent_api.post(path, {"lease_token": claimed["lease_token"]}).json()
    row = Task.objects.get(id=task.id)
    assert abs((row.lease_expires_at - row.started_at).total_seconds() - 600) < 1
    assert beat["lease_expires_at"].startswith(row.lease_expires_at.isoformat()[:19])
    shorter = agent_api.post(path, {"lease_token": claimed["lease_token"], "lease_seconds": 60})
    assert shorter.status_code == 200
    row.refresh_from_db()
    assert abs((row.lease_expires_at - row.started_at).total_seconds() - 60) < 1


def test_an_empty_claim_registers_the_worker_idle(agent_api):
    assert claim(agent_api) == []
    worker = Worker.objects.get(worker_id="gpu-box:4242")
    assert (worker.kind, worker.state, worker.in_flight) == ("remote", "idle", 0)


def test_claim_respects_pause_and_the_concurrency_limit(agent_api, admin_api):
    for _ in range(3):
        operations.enqueue("EchoAgent", "echo")
    PausedAgent.objects.create(agent_name="EchoAgent", paused_by="test")
    assert claim(agent_api, limit=3) == []
    PausedAgent.objects.all().delete()
    limited = admin_api.patch("/api/v1/agents/EchoAgent", {"concurrency_limit": 2})
    assert limited.status_code == 200
    assert len(claim(agent_api, limit=3)) == 2
    assert claim(agent_api, limit=3) == []


def test_heartbeat_extends_the_lease_writes_progress_and_reports_cancel(agent_api, api):
    task = operations.enqueue("EchoAgent", "echo")
    [claimed] = claim(agent_api, lease_seconds=30)
    path = f"/api/v1/tasks/{task.id}/heartbeat"
    beat = agent_api.post(
        path,
        {"lease_token": claimed["lease_token"], "progress": {"fraction": 0.5, "message": "half"}},
    )
    assert beat.status_code == 200, beat.content
    assert beat.json()["cancel_requested"] is False
    row = Task.objects.get(id=task.id)
    assert (row.progress, row.progress_message) == (0.5, "half")
    assert beat.json()["lease_expires_at"].startswith(row.lease_expires_at.isoformat()[:19])
    assert api.post(f"/api/v1/tasks/{task.id}/cancel").status_code == 200
    again = agent_api.post(path, {"lease_token": claimed["lease_token"]})
    assert again.json()["cancel_requested"] is True
    # The agent stops and reports a failure: the task ends cancelled.
    failed = agent_api.post(
        f"/api/v1/tasks/{task.id}/fail",
        {"lease_token": claimed["lease_token"], "error": {"type": "Stopped", "message": "asked"}},
    )
    assert failed.json()["status"] == "cancelled"


def test_complete_writes_the_result_history_agent_event_and_embedding_job(agent_api, api):
    task = operations.enqueue("EchoAgent", "echo", {"n": 1})
    [claimed] = claim(agent_api)
    done = agent_api.post(
        f"/api/v1/tasks/{task.id}/complete",
        {"lease_token": claimed["lease_token"], "result": {"echo": 1}, "summary": "echoed 1"},
    )
    assert done.status_code == 200, done.content
    assert done.json() == {"task_id": str(task.id), "status": "completed", "available_at": None}
    row = Task.objects.get(id=task.id)
    assert (row.status, row.result, row.lease_token) == ("completed", {"echo": 1}, None)
    [history] = TaskHistory.objects.filter(task_id=task.id, event="completed")
    assert history.actor == "gpu-box:4242"
    event = AgentEvent.objects.get(task_id=task.id)
    assert event.content == "echoed 1"
    assert EmbeddingJob.objects.filter(agent_event=event).count() == 1
    # A claim's tasks share its lease token: a bound token never sees one in a history.
    [seen] = agent_api.get(f"/api/v1/tasks/{task.id}").json()["history"]
    assert seen["lease_token"] is None
    [full] = api.get(f"/api/v1/tasks/{task.id}").json()["history"]
    assert full["lease_token"] == claimed["lease_token"]


def test_fail_retries_with_backoff_then_dead_and_non_retryable_fails(
    agent_api, caplog, django_capture_on_commit_callbacks
):
    caplog.handler.addFilter(TaskFields())  # the filter settings.LOGGING gives its handler
    caplog.set_level(logging.INFO, logger="task_queue.outcomes")
    task = operations.enqueue("EchoAgent", "echo", max_attempts=2)
    error = {"type": "Timeout", "message": "upstream", "traceback": "line 1"}
    # Failures are logged once committed: the test's transaction runs the callbacks of
    # the commits inside it at the block's end.
    with django_capture_on_commit_callbacks(execute=True):
        [claimed] = claim(agent_api)
        first = agent_api.post(
            f"/api/v1/tasks/{task.id}/fail", {"lease_token": claimed["lease_token"], "error": error}
        ).json()
        assert first["status"] == "pending" and first["available_at"] is not None
        row = Task.objects.get(id=task.id)
        assert row.error_info["type"] == "Timeout" and row.error_info["traceback"] == "line 1"
        Task.objects.filter(id=task.id).update(available_at=row.created_at - timedelta(days=1))
        [again] = claim(agent_api)
        assert again["attempt"] == 2
        last = agent_api.post(
            f"/api/v1/tasks/{task.id}/fail", {"lease_token": again["lease_token"], "error": error}
        ).json()
        assert last == {"task_id": str(task.id), "status": "dead", "available_at": None}

        other = operations.enqueue("EchoAgent", "echo")
        [claimed] = claim(agent_api)
        final = agent_api.post(
            f"/api/v1/tasks/{other.id}/fail",
            {"lease_token": claimed["lease_token"], "error": error, "retryable": False},
        )
        assert final.json()["status"] == "failed"

    # The server logs each failure as it ended, about its task and the remote worker.
    lines = [(r.levelname, r.task_id, r.worker, r.attempt) for r in caplog.records]
    assert lines == [
        ("INFO", str(task.id), WORKER["worker"], 1),
        ("ERROR", str(task.id), WORKER["worker"], 2),
        ("WARNING", str(other.id), WORKER["worker"], 1),
    ]
    assert all(
        r.error_type == "Timeout" and "Timeout: upstream" in r.message for r in caplog.records
    )


def test_a_late_write_after_the_lease_was_recovered_is_409_and_changes_nothing(agent_api):
    task = operations.enqueue("EchoAgent", "echo")
    [stale] = claim(agent_api, lease_seconds=5)
    long_ago = Task.objects.get(id=task.id).created_at - timedelta(days=1)
    Task.objects.filter(id=task.id).update(lease_expires_at=long_ago)
    assert reaper.reap_expired_leases() == [(task.id, "EchoAgent", "pending")]
    Task.objects.filter(id=task.id).update(available_at=long_ago)
    [fresh] = claim(agent_api)
    assert fresh["lease_token"] != stale["lease_token"]
    before = TaskHistory.objects.filter(task_id=task.id).count()
    for route, body in [
        ("complete", {"result": {"late": True}}),
        ("fail", {"error": {"type": "Late", "message": "late"}}),
        ("heartbeat", {"progress": {"fraction": 0.9}}),
    ]:
        late = agent_api.post(
            f"/api/v1/tasks/{task.id}/{route}", {"lease_token": stale["lease_token"], **body}
        )
        assert late.status_code == 409 and late.json()["code"] == "lease_lost", route
    row = Task.objects.get(id=task.id)
    assert (row.status, row.lease_token, row.progress) == (
        "running",
        uuid.UUID(fresh["lease_token"]),
        None,
    )
    assert TaskHistory.objects.filter(task_id=task.id).count() == before
    assert not AgentEvent.objects.filter(task_id=task.id).exists()


def test_outcomes_batch_answers_each_task_in_order(agent_api):
    tasks = [operations.enqueue("EchoAgent", "echo", {"n": n}) for n in range(3)]
    claimed = {c["id"]: c for c in claim(agent_api, limit=3)}
    stale = str(uuid.uuid4())
    body = {
        "outcomes": [
            {"task_id": str(tasks[0].id), "lease_token": claimed[str(tasks[0].id)]["lease_token"],
             "status": "completed", "result": {"n": 0}},
            {"task_id": str(tasks[1].id), "lease_token": stale, "status": "completed",
             "result": {"n": 1}},
            {"task_id": str(tasks[2].id), "lease_token": claimed[str(tasks[2].id)]["lease_token"],
             "status": "failed", "error": {"type": "E", "message": "m"}, "retryable": False},
        ]
    }  # fmt: skip
    response = agent_api.post("/api/v1/outcomes", body)
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [r["task_id"] for r in results] == [str(t.id) for t in tasks]
    assert results[0]["status"] == "completed"
    assert results[1]["error"]["code"] == "lease_lost"
    assert results[2]["status"] == "failed"
    assert Task.objects.get(id=tasks[1].id).status == "running"


def test_a_claim_records_the_outcomes_it_carries_then_claims(agent_api):
    done, stale_task = (operations.enqueue("EchoAgent", "echo", {"n": n}) for n in range(2))
    claimed = {c["id"]: c for c in claim(agent_api, limit=2)}
    nxt = operations.enqueue("EchoAgent", "echo", {"n": 2})
    carried = [
        {"task_id": str(done.id), "lease_token": claimed[str(done.id)]["lease_token"],
         "status": "completed", "result": {"n": 0}},
        {"task_id": str(stale_task.id), "lease_token": str(uuid.uuid4()), "status": "completed",
         "result": {"n": 1}},
    ]  # fmt: skip
    response = agent_api.post(
        "/api/v1/agents/EchoAgent/claim", {**WORKER, "limit": 5, "outcomes": carried}
    )
    assert response.status_code == 200, response.content
    answer = response.json()
    assert [t["id"] for t in answer["tasks"]] == [str(nxt.id)]
    assert answer["results"][0] == {"task_id": str(done.id), "status": "completed",
                                    "available_at": None}  # fmt: skip
    assert answer["results"][1]["error"]["code"] == "lease_lost"
    row = Task.objects.get(id=done.id)
    assert (row.status, row.result) == ("completed", {"n": 0})
    assert AgentEvent.objects.filter(task_id=done.id).count() == 1
    assert EmbeddingJob.objects.filter(agent_event__task_id=done.id).count() == 1
    assert Task.objects.get(id=stale_task.id).status == "running"
    # Without outcomes, results is empty.
    assert agent_api.post("/api/v1/agents/EchoAgent/claim", WORKER).json() == {
        "tasks": [], "results": []
    }  # fmt: skip


def test_a_claim_carrying_a_refused_outcome_writes_and_claims_nothing(agent_api):
    mine = operations.enqueue("EchoAgent", "echo")
    [held] = claim(agent_api)
    other = operations.enqueue("SEOAgent", "generate_seo", {"sku": "X"})
    waiting = operations.enqueue("EchoAgent", "echo")
    carried = [
        {"task_id": str(mine.id), "lease_token": held["lease_token"], "status": "completed",
         "result": {}},
        {"task_id": str(other.id), "lease_token": str(uuid.uuid4()), "status": "completed",
         "result": {}},
    ]  # fmt: skip
    refused = agent_api.post("/api/v1/agents/EchoAgent/claim", {**WORKER, "outcomes": carried})
    assert refused.status_code == 403 and field_names(refused) == ["outcomes[1].task_id"]
    assert Task.objects.get(id=mine.id).status == "running"
    assert Task.objects.get(id=waiting.id).status == "pending"
    twice = agent_api.post(
        "/api/v1/agents/EchoAgent/claim", {**WORKER, "outcomes": [carried[0], carried[0]]}
    )
    assert twice.status_code == 422 and field_names(twice) == ["outcomes"]
    assert Task.objects.get(id=waiting.id).status == "pending"


def test_claim_by_id_succeeds_once_then_409_with_the_reason(agent_api, api):
    task = operations.enqueue("EchoAgent", "echo", {"k": "v"})
    path = f"/api/v1/tasks/{task.id}/claim"
    first = agent_api.post(path, WORKER)
    assert first.status_code == 200 and first.json()["payload"] == {"k": "v"}
    second = agent_api.post(path, WORKER)
    assert second.status_code == 409 and second.json()["details"]["reason"] == "leased"

    later = operations.enqueue("EchoAgent", "echo", delay_seconds=600)
    assert agent_api.post(f"/api/v1/tasks/{later.id}/claim", WORKER).json()["details"] == {
        "reason": "not_due"
    }
    api.post(f"/api/v1/tasks/{later.id}/cancel")
    finished = agent_api.post(f"/api/v1/tasks/{later.id}/claim", WORKER).json()
    assert finished["details"]["reason"] == "finished"

    paused = operations.enqueue("EchoAgent", "echo")
    PausedAgent.objects.create(agent_name="EchoAgent", paused_by="test")
    refused = agent_api.post(f"/api/v1/tasks/{paused.id}/claim", WORKER).json()
    assert refused["details"]["reason"] == "paused"


def test_a_bound_token_is_403_for_another_agents_tasks_and_claims(agent_api):
    other = operations.enqueue("SEOAgent", "generate_seo", {"sku": "X"})
    refused = agent_api.post("/api/v1/agents/SEOAgent/claim", WORKER)
    assert refused.status_code == 403 and refused.json()["code"] == "agent_not_allowed"
    for route in ("claim", "heartbeat", "complete", "fail"):
        body = {**WORKER} if route == "claim" else {"lease_token": str(uuid.uuid4())}
        if route == "fail":
            body["error"] = {"type": "E", "message": "m"}
        response = agent_api.post(f"/api/v1/tasks/{other.id}/{route}", body)
        assert response.status_code == 403, route
    batch = agent_api.post(
        "/api/v1/outcomes",
        {"outcomes": [{"task_id": str(other.id), "lease_token": str(uuid.uuid4()),
                       "status": "completed", "result": {}}]},
    )  # fmt: skip
    assert batch.status_code == 403 and field_names(batch) == ["outcomes[0].task_id"]
    assert Task.objects.get(id=other.id).status == "pending"


def test_routes_need_a_write_token():
    read = Api(token("read"))
    assert read.post("/api/v1/agents/EchoAgent/claim", WORKER).status_code == 403
    assert Api(None).post("/api/v1/agents/EchoAgent/claim", WORKER).status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"worker": ""}, "worker"),
        ({"worker": "w" * 201}, "worker"),
        ({"worker": "a\x00b"}, "worker"),
        ({**WORKER, "limit": 0}, "limit"),
        ({**WORKER, "limit": 501}, "limit"),
        ({**WORKER, "lease_seconds": 4}, "lease_seconds"),
        ({**WORKER, "lease_seconds": 3601}, "lease_seconds"),
        ({**WORKER, "wait_seconds": 61}, "wait_seconds"),
        ({**WORKER, "wait_seconds": -1}, "wait_seconds"),
        ({**WORKER, "limit": "many"}, "limit"),
        ({**WORKER, "unknown": 1}, "unknown"),
        ({"worker": "h:²"}, None),  # not a pid: a name like any other (200)
    ],
)
def test_bad_claims_are_422_naming_the_field(agent_api, body, field):
    response = agent_api.post("/api/v1/agents/EchoAgent/claim", body)
    if field is None:
        assert response.status_code == 200, response.content
        return
    assert response.status_code == 422, response.content
    assert field in field_names(response)


def test_bad_outcomes_are_refused_before_anything_is_written(agent_api, settings):
    task = operations.enqueue("EchoAgent", "echo")
    [claimed] = claim(agent_api)
    token_ = claimed["lease_token"]
    settings.QUEUE_MAX_PAYLOAD_BYTES = 1000
    too_large = agent_api.post(
        f"/api/v1/tasks/{task.id}/complete", {"lease_token": token_, "result": {"x": "y" * 2000}}
    )
    assert too_large.status_code == 413 and field_names(too_large) == ["result"]
    nul = agent_api.post(
        f"/api/v1/tasks/{task.id}/complete", {"lease_token": token_, "result": {"x": "a\x00"}}
    )
    assert nul.status_code == 422 and field_names(nul) == ["result"]
    no_error = agent_api.post(
        "/api/v1/outcomes",
        {"outcomes": [{"task_id": str(task.id), "lease_token": token_, "status": "failed"}]},
    )
    assert no_error.status_code == 422
    twice = {"task_id": str(task.id), "lease_token": token_, "status": "completed"}
    assert agent_api.post("/api/v1/outcomes", {"outcomes": [twice, twice]}).status_code == 422
    nul_type = agent_api.post(
        f"/api/v1/tasks/{task.id}/fail",
        {"lease_token": token_, "error": {"type": "E\x00", "message": "m"}},
    )
    assert nul_type.status_code == 422 and field_names(nul_type) == ["error.type"]
    progress = agent_api.post(
        f"/api/v1/tasks/{task.id}/heartbeat", {"lease_token": token_, "progress": {"fraction": 2}}
    )
    assert progress.status_code == 422 and "progress.fraction" in field_names(progress)
    missing = agent_api.post(f"/api/v1/tasks/{uuid.uuid4()}/complete", {"lease_token": token_})
    assert missing.status_code == 404
    assert Task.objects.get(id=task.id).status == "running"
    assert TaskHistory.objects.filter(task_id=task.id).count() == 0


def test_a_released_task_goes_back_pending_without_an_attempt(agent_api, api):
    kept, cancelled = (operations.enqueue("EchoAgent", "echo") for _ in range(2))
    claimed = {c["id"]: c["lease_token"] for c in claim(agent_api, limit=2)}
    api.post(f"/api/v1/tasks/{cancelled.id}/cancel")  # running: a cancel is requested
    body = {
        "outcomes": [
            {"task_id": str(t.id), "lease_token": claimed[str(t.id)], "status": "released"}
            for t in (kept, cancelled)
        ]
    }
    results = agent_api.post("/api/v1/outcomes", body).json()["results"]
    assert [r["status"] for r in results] == ["pending", "cancelled"]
    row = Task.objects.get(id=kept.id)
    assert (row.status, row.attempts, row.lease_token) == ("pending", 0, None)
    again = agent_api.post("/api/v1/outcomes", body).json()["results"]
    assert [r["error"]["code"] for r in again] == ["lease_lost", "lease_lost"]


@pytest.mark.django_db(transaction=True)
def test_a_claim_whose_client_left_during_its_run_gives_its_tasks_back():
    """The long poll's wrapper around the real Django application: the client hangs up
    while the claim's view runs (it took the task); the wrapper must not leave the task
    leased to no one."""
    import asyncio

    from django.core.asgi import get_asgi_application

    from automechanica.api.long_poll import long_polling

    task = operations.enqueue("EchoAgent", "echo")
    django_app = get_asgi_application()
    gone = asyncio.Event()

    async def client_leaves_during_the_run(scope, receive, send):
        await django_app(scope, receive, send)
        gone.set()  # the client hangs up as the view finishes
        for _ in range(3):
            await asyncio.sleep(0)  # the wrapper's watcher hears it

    body = json.dumps({"worker": "leaving:1", "wait_seconds": 5}).encode()
    sent: list[dict] = []
    bodies = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if bodies:
            return bodies.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "method": "POST", "path": "/api/v1/agents/EchoAgent/claim",
        "raw_path": b"/api/v1/agents/EchoAgent/claim", "query_string": b"", "root_path": "",
        "scheme": "http", "server": ("testserver", 80), "client": ("127.0.0.1", 1),
        "headers": [(b"authorization", f"Bearer {token('write')}".encode()),
                    (b"content-type", b"application/json"), (b"host", b"testserver")],
    }  # fmt: skip
    asyncio.run(long_polling(client_leaves_during_the_run)(scope, receive, send))
    assert sent == []  # nothing was sent to a client that had gone
    row = Task.objects.get(id=task.id)
    assert (row.status, row.attempts, row.lease_token) == ("pending", 0, None)
    events = list(TaskHistory.objects.filter(task_id=task.id).values_list("event", flat=True))
    assert events == ["released"]


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_runs_its_claim_once_unless_woken():
    """The long poll's wrapper around the real Django application, with the wake-ups
    listening: a poll that hears nothing answers at its deadline with what its one
    run of the claim found; a poll woken by an enqueue runs the claim again and takes
    the task."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import sync_to_async
    from django.core.asgi import get_asgi_application
    from django.db import connections

    from automechanica.api.claim_wakeups import wakeups
    from automechanica.api.long_poll import long_polling

    django_app = get_asgi_application()
    runs: list[int] = []
    ran: list[asyncio.Event] = []  # set as each run of the view ends

    async def counted(scope, receive, send):
        await django_app(scope, receive, send)
        runs.append(1)
        for event in ran:
            event.set()

    app = long_polling(counted)
    key = token("write")

    async def poll(wait_seconds: float) -> dict:
        body = json.dumps({"worker": "once:1", "wait_seconds": wait_seconds}).encode()
        requests = [{"type": "http.request", "body": body, "more_body": False}]
        staying = asyncio.Event()  # the client never hangs up
        sent: list[dict] = []

        async def receive():
            if requests:
                return requests.pop()
            await staying.wait()

        async def send(message):
            sent.append(message)

        scope = {
            "type": "http", "method": "POST", "path": "/api/v1/agents/EchoAgent/claim",
            "raw_path": b"/api/v1/agents/EchoAgent/claim", "query_string": b"",
            "root_path": "", "scheme": "http", "server": ("testserver", 80),
            "client": ("127.0.0.1", 1),
            "headers": [(b"authorization", f"Bearer {key}".encode()),
                        (b"content-type", b"application/json"), (b"host", b"testserver")],
        }  # fmt: skip
        await app(scope, receive, send)
        assert sent[0]["status"] == 200
        return json.loads(b"".join(m.get("body", b"") for m in sent[1:]))

    async def main() -> None:
        # One thread for the wake-ups' database work, so that its connection can be
        # closed at the end (the test database is dropped after the run).
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        try:
            await poll(0)  # the wake-ups start listening
            await asyncio.wait_for(wakeups.listening.wait(), 30)
            runs.clear()
            assert await poll(1.0) == {"tasks": [], "results": []}
            assert len(runs) == 1  # not run again at the deadline
            runs.clear()
            ran.append(asyncio.Event())
            waiting = asyncio.ensure_future(poll(30))
            await asyncio.wait_for(ran[0].wait(), 30)  # its first run found nothing
            enqueue = sync_to_async(operations.enqueue, thread_sensitive=False)
            task = await enqueue("EchoAgent", "echo")
            answer = await asyncio.wait_for(waiting, 30)
            assert [t["id"] for t in answer["tasks"]] == [str(task.id)] and len(runs) == 2
        finally:
            await sync_to_async(connections.close_all, thread_sensitive=False)()

    asyncio.run(main())
