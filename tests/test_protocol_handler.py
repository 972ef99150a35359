"""The worker protocol's routes served in one thread (automechanica.api.protocol_handler)
answer exactly as Django's ASGI handler does: the same middleware, authentication,
validation and views, on the real test database. Every other request still goes to
the app it wraps, and a request that finds every thread busy for too long is 503."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest
from django.core.handlers.asgi import ASGIHandler

from automechanica.api.protocol_handler import (
    PROTOCOL_PATHS,
    ProtocolHandler,
    serve_worker_protocol,
)
from task_queue import operations, remote
from tests.support.api import ECHO, token
from tests.support.database import database_url
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "0190a5e6-0000-7000-8000-000000000001"  # no such task (fixed: xdist collects alike)
LEASE = "0190a5e6-0000-7000-8000-000000000002"
WORKER = {"worker": "w:1"}


async def refuse_everything(scope: dict, receive: Any, send: Any) -> None:
    """The app behind the protocol routes in these tests: it must not be reached."""
    raise AssertionError(f"{scope['path']} reached the wrapped app")


# One handler for the module's requests (its threads stay, as in a server).
PROTOCOL = serve_worker_protocol(refuse_everything)


def call(app: Any, path: str, body: bytes, key: str | None, method: str = "POST") -> tuple:
    """One request through ``app``: (status, content type, decoded body)."""
    return asyncio.run(request(app, path, body, key, method))


async def request(app: Any, path: str, body: bytes, key: str | None, method: str = "POST"):
    headers = [(b"content-type", b"application/json"), (b"host", b"testserver")]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "server": ("testserver", 80),
        "client": ("127.0.0.1", 5000),
    }  # fmt: skip
    sent: list[dict] = []
    bodies = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if bodies:
            return bodies.pop()
        await asyncio.Event().wait()  # the client stays until the answer is out
        return {}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    content = b"".join(m.get("body", b"") for m in sent[1:])
    content_type = dict(start["headers"]).get(b"Content-Type")
    is_json = content_type and content_type.startswith(b"application/json")
    return start["status"], content_type, json.loads(content) if is_json else content


@pytest.mark.parametrize(
    ("path", "body", "scope"),
    [
        ("/api/v1/agents/EchoAgent/claim", WORKER, None),  # no token: 401
        ("/api/v1/agents/EchoAgent/claim", WORKER, "read"),  # too small a scope: 403
        ("/api/v1/agents/EchoAgent/claim", {**WORKER, "limit": 0}, "write"),  # 422, the field
        ("/api/v1/agents/EchoAgent/claim", b"{not json", "write"),
        ("/api/v1/agents/EchoAgent/claim", b'{"worker": "\xff\xfe"}', "write"),  # not UTF-8
        ("/api/v1/agents/NoSuchAgent/claim", WORKER, "write"),
        ("/api/v1/agents/EchoAgent/claim", {**WORKER, "wait_seconds": 0}, "write"),  # 200 []
        (f"/api/v1/tasks/{TASK}/heartbeat", {"lease_token": LEASE}, "write"),  # no such task
        ("/api/v1/tasks/not-a-uuid/heartbeat", {"lease_token": LEASE}, "write"),
        (f"/api/v1/tasks/{TASK}/complete", {"lease_token": LEASE, "result": {}}, "write"),
        (f"/api/v1/tasks/{TASK}/fail", {"lease_token": "x"}, "write"),
        (f"/api/v1/tasks/{TASK}/claim", WORKER, "write"),
        ("/api/v1/outcomes", {"outcomes": [{"task_id": TASK}] * 501}, "write"),
        ("/api/v1/outcomes", {"outcomes": []}, "write"),
    ],
)
def test_a_protocol_request_is_answered_as_djangos_asgi_handler_answers_it(path, body, scope):
    assert PROTOCOL_PATHS.fullmatch(path)
    key = token(scope) if scope else None
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    django = call(ASGIHandler(), path, raw, key)
    ours = call(PROTOCOL, path, raw, key)
    assert ours == django
    assert ours[0] != 500


def test_a_claim_through_it_takes_a_task_and_other_routes_pass_through():
    created = operations.enqueue(**ECHO, payload={})
    key = token("write")
    status, _, body = call(
        PROTOCOL,
        "/api/v1/agents/EchoAgent/claim",
        json.dumps({**WORKER, "wait_seconds": 0}).encode(),
        key,
    )
    assert status == 200 and [t["id"] for t in body["tasks"]] == [str(created.id)]
    # Not a protocol route, nor a protocol path with another method: the wrapped app's.
    reached: list[tuple[str, str]] = []

    async def wrapped(scope: dict, receive: Any, send: Any) -> None:
        reached.append((scope["method"], scope["path"]))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = serve_worker_protocol(wrapped)
    others = [("GET", "/api/v1/agents"), ("GET", "/api/v1/outcomes"), ("POST", "/api/v1/tasks")]
    for method, path in others:
        assert call(app, path, b"{}", key, method=method)[0] == 204
    assert reached == others


def test_a_request_finding_every_thread_busy_past_the_wait_is_503_and_the_other_answers():
    operations.enqueue(**ECHO, payload={})
    _, (claimed,) = remote.claim("w:1", "EchoAgent", limit=1, lease_seconds=60)
    path = f"/api/v1/tasks/{claimed.task.id}/heartbeat"
    beat = json.dumps({"lease_token": str(claimed.task.lease_token)}).encode()
    key = token("write")
    handler = ProtocolHandler(threads=1, wait_seconds=0.3)
    url = database_url()
    with psycopg.connect(url) as locker, psycopg.connect(url, autocommit=True) as observer:
        # The task's row locked: the one thread's heartbeat waits on it.
        locker.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", [claimed.task.id])

        def heartbeat_waits() -> bool:
            return observer.execute(LOCK_WAITS).fetchone()[0] == 1

        async def both() -> tuple:
            first = asyncio.create_task(request(handler, path, beat, key))
            await asyncio.to_thread(wait_for, heartbeat_waits, what="the heartbeat to wait")
            second = await request(handler, path, beat, key)
            await asyncio.to_thread(locker.rollback)
            return await first, second

        try:
            first, second = asyncio.run(both())
        finally:
            handler._threads.shutdown()
    assert second[0] == 503 and second[2]["code"] == "server_busy", second
    assert first[0] == 200 and first[2]["cancel_requested"] is False, first


LOCK_WAITS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'
"""
