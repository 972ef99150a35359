"""``ws://HOST/api/v1/stream`` against a real daphne, with the ``websockets`` client."""

from __future__ import annotations

import json
import uuid
from contextlib import ExitStack
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from automechanica.api import stream, stream_hub
from automechanica.api.models import ApiToken
from automechanica.api.stream_filter import StreamFilter
from task_queue import event_stream
from task_queue.models import Task
from task_queue.sql.channels import EVENTS_CHANNEL
from tests.support.api import token
from tests.support.database import registered_listeners
from tests.support.server import http
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def ws_url(server: Any, query: str = "") -> str:
    return (
        server.url.replace("http://", "ws://") + "/api/v1/stream" + (f"?{query}" if query else "")
    )


def open_stream(server: Any, secret: str | None, query: str = "") -> ClientConnection:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    return connect(ws_url(server, query), additional_headers=headers, open_timeout=30)


def receive(socket: ClientConnection, count: int) -> list[str]:
    """The next ``count`` messages (waiting up to 30 s for each)."""
    return [socket.recv(timeout=30) for _ in range(count)]


def exported() -> dict[int, str]:
    """Every event as ``export_events`` writes its line, by position."""
    return {e.position: e.to_json().decode() for e in event_stream.next_batch(0, limit=100_000)}


def create(server: Any, secret: str, tasks: list[dict[str, Any]]) -> list[str]:
    status, body = http("POST", server.url + "/api/v1/tasks", secret, tasks)
    assert status == 201, body
    return [task["id"] for task in body["items"]]


def echo(**extra: Any) -> dict[str, Any]:
    return {"agent_name": "EchoAgent", "task_type": "echo", **extra}


def test_refused_at_the_handshake_without_a_valid_token(live_servers):
    server = live_servers()
    revoked = token("read", name="gone")
    ApiToken.objects.filter(name="gone").update(revoked_at=timezone.now())
    for secret in (None, "am_not-a-token", revoked):
        with pytest.raises(InvalidStatus) as refused:
            open_stream(server, secret)
        assert refused.value.response.status_code == 403
    # Not a bearer token at all.
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(server), additional_headers={"Authorization": "Basic eDp5"})
    assert refused.value.response.status_code == 403


def test_a_token_revoked_while_connected_closes_the_socket(live_servers):
    server = live_servers()
    secret = token("read", name="soon revoked")
    with open_stream(server, secret) as socket:
        ApiToken.objects.filter(name="soon revoked").update(revoked_at=timezone.now())
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=30)
        assert closed.value.rcvd.code == stream_hub.REVOKED


def test_a_bad_filter_is_named_and_the_socket_closed(live_servers):
    server = live_servers()
    with open_stream(server, token("read"), "after=-1") as socket:
        message = json.loads(socket.recv(timeout=30))
        assert message["field"] == "after"
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=30)
        assert closed.value.rcvd.code == stream.BAD_FILTER


def test_reconnecting_with_after_misses_nothing_and_repeats_nothing(live_servers):
    """Envelopes exactly as export_events writes them, in position order, across a
    reconnect halfway and events written while the client was away."""
    server = live_servers()
    writer, reader = token("write"), token("read")
    create(server, writer, [echo(payload={"n": n}) for n in range(5)])
    with open_stream(server, reader, "after=0") as socket:
        first = receive(socket, 3)
    last = json.loads(first[-1])["position"]
    create(server, writer, [echo(payload={"n": n}) for n in range(5, 10)])
    with open_stream(server, reader, f"after={last}") as socket:
        rest = receive(socket, 7)  # 2 from before the reconnect, 5 since
        create(server, writer, [echo(payload={"n": 10})])  # live, after catching up
        rest += receive(socket, 1)
    lines = exported()
    assert first + rest == [lines[p] for p in sorted(lines)]


def test_each_filter_sends_exactly_the_events_it_names(live_servers):
    with ExitStack() as sockets_open:
        each_filter(live_servers(), sockets_open)


def each_filter(server: Any, sockets_open: ExitStack) -> None:
    writer, reader = token("write"), token("read")
    trace = "trace-" + uuid.uuid4().hex
    start = event_stream.head()
    status, workflow = http(
        "POST",
        server.url + "/api/v1/workflows",
        writer,
        {"name": "w", "open": True, "tasks": [echo(payload={"w": 1})]},
    )
    assert status == 201, workflow
    # Live from now (the hub filters), but for the two that resume from ``start``
    # (catching up filters too).
    queries = {
        "trace": f"trace_id={trace}",
        # Its first task was created with it: read from before.
        "workflow": f"workflow_id={workflow['id']}&after={start}",
        "agent": "agent=FitmentAgent",
        "kind": "kind=evt.task.cancel*",
        "tasks": None,  # once the tasks exist
    }
    sockets = {
        name: sockets_open.enter_context(open_stream(server, reader, q))
        for name, q in queries.items()
        if q
    }
    traced = create(server, writer, [echo(trace_id=trace), echo(trace_id=trace)])
    other = create(
        server, writer, [{"agent_name": "FitmentAgent", "task_type": "generate_fitment"}]
    )
    in_workflow = create(server, writer, [echo(workflow_id=workflow["id"])])
    query = f"task_id={traced[0]}&task_id={other[0]}&after={start}"
    sockets["tasks"] = sockets_open.enter_context(open_stream(server, reader, query))
    for task_id in (traced[1], other[0], in_workflow[0]):
        status, body = http("POST", f"{server.url}/api/v1/tasks/{task_id}/cancel", writer)
        assert status == 200, body
    events = [json.loads(line) for line in exported().values()]
    events = [e for e in events if e["position"] > start]
    workflow_tasks = {str(t.id) for t in Task.objects.filter(workflow_id=workflow["id"])}
    assert len(workflow_tasks) == 2
    expected = {
        "trace": [e for e in events if e["trace_id"] == trace],
        "workflow": [e for e in events if e["payload"].get("task_id") in workflow_tasks],
        "agent": [e for e in events if e["payload"].get("agent_type") == "FitmentAgent"],
        "kind": [e for e in events if e["kind"] == "evt.task.cancelled.v1"],
        "tasks": [e for e in events if e["payload"].get("task_id") in {traced[0], other[0]}],
    }
    for name, socket in sockets.items():
        wanted = expected[name]
        assert wanted, name
        got = [json.loads(m) for m in receive(socket, len(wanted))]
        assert got == wanted, name


def test_clients_share_one_listen_per_server_process(live_servers):
    """Ten clients of one server: the database sees one connection listening on the
    events channel."""
    server = live_servers()
    reader = token("read")
    with ExitStack() as sockets_open:
        sockets = [sockets_open.enter_context(open_stream(server, reader)) for _ in range(10)]
        create(server, token("write"), [echo()])
        for socket in sockets:
            assert json.loads(socket.recv(timeout=30))["kind"] == "evt.task.created.v1"
        assert listeners() == 1


def listeners() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = 'LISTEN automechanica_events'"
        )
        return cursor.fetchone()[0]


def test_a_server_listens_only_while_a_stream_is_open(live_servers):
    """With no stream open the process stops listening, so the trigger on the event
    outbox stops notifying (``channel_listeners``); the next client starts it again."""
    server = live_servers()
    reader, writer = token("read"), token("write")
    for _ in range(2):
        with open_stream(server, reader) as socket:
            create(server, writer, [echo()])
            assert json.loads(socket.recv(timeout=30))["kind"] == "evt.task.created.v1"
            assert registered_listeners(EVENTS_CHANNEL) == 1
        wait_for(
            lambda: registered_listeners(EVENTS_CHANNEL) == 0, what="the server to stop listening"
        )


def test_a_token_bound_to_agents_sees_only_their_envelopes(live_servers):
    """As the routes: a token bound to agents gets only their messages and their
    tasks' events, never another agent's."""
    server = live_servers()
    writer = token("write", name="sender")
    start = event_stream.head()
    for sender in ("SEOAgent", "PricingAgent"):
        message = {"from_agent": sender, "to_agent": "FitmentAgent", "message_type": "notification"}
        status, body = http("POST", server.url + "/api/v1/messages", writer, message)
        assert status == 201, body
    create(server, writer, [echo()])  # an EchoAgent task: not for this token
    pricing = {"agent_name": "PricingAgent", "task_type": "price_parts", "payload": {}}
    (task_id,) = create(server, writer, [pricing])
    bound = token("read", name="pricing", agents=("PricingAgent",))
    with open_stream(server, bound, f"after={start}") as socket:
        first, second = (json.loads(m) for m in receive(socket, 2))
    assert first["payload"]["from_agent"] == "PricingAgent"
    assert (second["kind"], second["payload"]["task_id"]) == ("evt.task.created.v1", task_id)


def test_a_filter_parses_an_events_payload_only_when_it_looks_into_it():
    # An envelope whose text cannot be parsed: a filter that reads the payload fails on
    # it, one that does not passes it untouched.
    event = event_stream.Envelope(7, uuid.uuid4(), "evt.task.created.v1", "s", "tr-1", "{")
    for query in (b"", b"trace_id=tr-1", b"kind=evt.task.*", b"after=3"):
        assert StreamFilter.from_query(query).matches(event, {})
    for query in (b"agent=EchoAgent", f"task_id={uuid.uuid4()}".encode()):
        with pytest.raises(json.JSONDecodeError):
            StreamFilter.from_query(query).matches(event, {})
    assert not StreamFilter.from_query(b"trace_id=other").matches(event, {})
