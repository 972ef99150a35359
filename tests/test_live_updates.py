"""The dashboard's WebSocket in-process (Channels' communicator against the real ASGI
application and database): who may connect, and what arrives when tasks change."""

from __future__ import annotations

import asyncio
import json
from uuid import UUID

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from automechanica.asgi import application
from automechanica.dashboard import consumers
from automechanica.dashboard.live import hub
from task_queue import operations
from task_queue.sql.channels import TASK_CHANGES_CHANNEL
from tests.support.database import registered_listeners
from tests.support.queue import complete_pending, fail_pending
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = b"http://127.0.0.1:8000"


def session_cookie(*, is_staff: bool = True) -> bytes:
    return logged_in(is_staff=is_staff)[1]


def logged_in(*, is_staff: bool = True) -> tuple[Client, bytes]:
    user = User.objects.create_user(f"u{User.objects.count()}", password="pw", is_staff=is_staff)
    client = Client()
    client.force_login(user)
    return client, f"sessionid={client.cookies['sessionid'].value}".encode()


def socket(path: str, cookie: bytes | None, origin: bytes = ORIGIN) -> WebsocketCommunicator:
    headers = [(b"origin", origin), (b"host", b"127.0.0.1:8000")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, path, headers=headers)


async def next_message(communicator: WebsocketCommunicator, kind: str) -> dict:
    """The next message: JSON that names its type, which live.js goes by."""
    message = json.loads(await communicator.receive_from(timeout=5))
    assert message["type"] == kind, message
    return message


async def html_from(communicator: WebsocketCommunicator) -> str:
    """The fragments of the next message (the ws extension swaps them in by id)."""
    return (await next_message(communicator, "html"))["html"]


async def dead_letter_change(communicator: WebsocketCommunicator) -> dict:
    return (await next_message(communicator, "changes"))["dead_letter"]


def test_a_socket_needs_a_staff_session_and_our_origin():
    staff, plain = session_cookie(), session_cookie(is_staff=False)

    async def attempts() -> list[bool]:
        results = []
        for path, cookie, origin in [
            ("/ws/overview/", None, ORIGIN),
            ("/ws/overview/", plain, ORIGIN),
            ("/ws/overview/", staff, b"http://evil.example"),
            ("/ws/overview/", staff, ORIGIN),
        ]:
            communicator = socket(path, cookie, origin)
            connected, _ = await communicator.connect()
            results.append(connected)
            await communicator.disconnect()
        return results

    assert async_to_sync(attempts)() == [False, False, False, True]


def test_open_overviews_share_one_snapshot_per_second():
    cookie = session_cookie()
    operations.enqueue("EchoAgent", "echo", {})

    async def watch() -> tuple[int, list[list[str]]]:
        sockets = [socket("/ws/overview/", cookie) for _ in range(4)]
        for communicator in sockets:
            assert (await communicator.connect())[0]
        before = hub.snapshots_taken
        received = [[await html_from(c) for _ in range(3)] for c in sockets]
        taken = hub.snapshots_taken - before
        for communicator in sockets:
            await communicator.disconnect()
        return taken, received

    taken, received = async_to_sync(watch)()
    # Each socket got 3 pushes; one snapshot per push serves all four (not 12).
    assert taken <= 4, taken
    assert all('id="overview-live"' in html for pushes in received for html in pushes)
    assert all('data-agent="EchoAgent"' in pushes[-1] for pushes in received)


def test_a_page_is_live_only_once_its_hub_listens():
    # The socket opening is what turns a page's badge live: a change made after that
    # must reach it, so the hub must already listen (its first page starts it).
    cookie = session_cookie()

    async def watch() -> bool:
        communicator = socket("/ws/dead-letter/", cookie)
        assert (await communicator.connect())[0]
        listening = hub.listening.is_set()
        await communicator.disconnect()
        return listening

    assert async_to_sync(watch)()


def test_dead_letter_pages_hear_which_tasks_left_and_how_many_arrived():
    cookie = session_cookie()
    revived = operations.enqueue("EchoAgent", "echo", {}).id
    fail_pending("EchoAgent", retryable=False)
    operations.enqueue("EchoAgent", "echo", {})

    async def watch() -> list[dict]:
        communicator = socket("/ws/dead-letter/", cookie)
        assert (await communicator.connect())[0]
        await asyncio.wait_for(hub.listening.wait(), 10)
        await sync_to_async(operations.revive)([revived], actor="user:elsewhere")
        changes = [await dead_letter_change(communicator)]
        # The revived task fails again (it arrives), and so does the other one.
        await sync_to_async(fail_pending)("EchoAgent", retryable=False)
        changes.append(await dead_letter_change(communicator))
        await communicator.disconnect()
        return changes

    left, arrived = async_to_sync(watch)()
    assert left == {"left": [str(revived)], "arrived": 0, "unknown": 0}
    assert arrived == {"left": [], "arrived": 2, "unknown": 0}


def test_a_bulk_change_beyond_the_notification_sample_is_reported_as_unknown():
    cookie = session_cookie()
    ids = [operations.enqueue("EchoAgent", "echo", {"n": n}).id for n in range(65)]
    fail_pending("EchoAgent", retryable=False)
    busy = [operations.enqueue("EchoAgent", "echo", {"n": n}).id for n in range(100)]

    async def watch() -> dict:
        communicator = socket("/ws/dead-letter/", cookie)
        assert (await communicator.connect())[0]
        await asyncio.wait_for(hub.listening.wait(), 10)
        # 100 claims and completions beyond the sample: nothing for the dead letter.
        assert sorted(await sync_to_async(complete_pending)("EchoAgent")) == sorted(busy)
        await sync_to_async(operations.revive)(ids, actor="user:elsewhere")
        change = await dead_letter_change(communicator)
        await communicator.disconnect()
        return change

    change = async_to_sync(watch)()
    assert len(change["left"]) == 60 and change["unknown"] == 5
    assert set(change["left"]) <= {str(i) for i in ids}


def test_a_task_page_follows_its_task():
    cookie = session_cookie()
    task_id: UUID = operations.enqueue("EchoAgent", "echo", {"hello": "world"}).id

    async def watch() -> tuple[str, str]:
        communicator = socket(f"/ws/tasks/{task_id}/", cookie)
        assert (await communicator.connect())[0]
        first = await html_from(communicator)  # the catch-up render
        await asyncio.wait_for(hub.listening.wait(), 10)
        await sync_to_async(complete_pending)("EchoAgent")
        updates = []
        while 'data-status="completed"' not in (updates[-1] if updates else ""):
            updates.append(await html_from(communicator))
        await communicator.disconnect()
        return first, updates[-1]

    first, last = async_to_sync(watch)()
    assert 'data-status="pending"' in first
    assert 'data-status="completed"' in last and "&quot;ok&quot;: true" in last


def test_a_task_page_shows_an_edit_that_keeps_the_status():
    cookie = session_cookie()
    task_id: UUID = operations.enqueue("EchoAgent", "echo", {"hello": "world"}).id

    async def watch() -> str:
        communicator = socket(f"/ws/tasks/{task_id}/", cookie)
        assert (await communicator.connect())[0]
        await html_from(communicator)  # the catch-up render
        await asyncio.wait_for(hub.listening.wait(), 10)
        await sync_to_async(operations.update_pending)(
            task_id, actor="user:elsewhere", payload={"hello": "edited"}
        )
        update = await html_from(communicator)
        await communicator.disconnect()
        return update

    update = async_to_sync(watch)()
    assert 'data-status="pending"' in update and "edited" in update


def test_a_socket_closes_once_its_user_logs_out(monkeypatch):
    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.0)
    client, cookie = logged_in()

    async def watch() -> dict:
        communicator = socket("/ws/overview/", cookie)
        assert (await communicator.connect())[0]
        assert 'id="overview-live"' in await html_from(communicator)
        await sync_to_async(client.logout)()
        closed = await communicator.receive_output(timeout=5)
        await communicator.disconnect()
        return closed

    assert async_to_sync(watch)() == {"type": "websocket.close", "code": consumers.SIGNED_OUT}


def test_a_socket_follows_a_permission_change(monkeypatch):
    from django.contrib.auth.models import Permission

    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.0)
    client, cookie = logged_in()
    user = User.objects.get(pk=client.session["_auth_user_id"])
    user.user_permissions.add(Permission.objects.get(codename="pause_agent"))
    operations.enqueue("EchoAgent", "echo", {})

    async def watch() -> tuple[str, str]:
        communicator = socket("/ws/overview/", cookie)
        assert (await communicator.connect())[0]
        before = await html_from(communicator)
        await sync_to_async(user.user_permissions.clear)()
        after = await html_from(communicator)
        await communicator.disconnect()
        return before, after

    before, after = async_to_sync(watch)()
    assert ">Pause</button>" in before
    assert ">Pause</button>" not in after


def test_a_workflow_page_follows_its_progress():
    from workflows.models import Workflow

    cookie = session_cookie()
    workflow = Workflow.objects.create(name="onboarding")
    operations.enqueue("EchoAgent", "echo", {}, workflow_id=workflow.id)

    async def watch() -> tuple[str, str]:
        communicator = socket(f"/ws/workflows/{workflow.id}/", cookie)
        assert (await communicator.connect())[0]
        first = await html_from(communicator)
        await sync_to_async(complete_pending)("EchoAgent")
        last = first
        while "wf-completed" not in last:
            last = await html_from(communicator)
        await communicator.disconnect()
        return first, last

    first, last = async_to_sync(watch)()
    assert 'id="workflow-live"' in first and "wf-running" in first
    assert "completed 1" in last


def test_the_hub_listens_only_while_a_page_is_open():
    # While it listens, every change of tasks notifies; with no page open, none does
    # (channel_listeners, migration queue 0026).
    cookie = session_cookie()
    task_id = operations.enqueue("EchoAgent", "echo", {}).id

    async def open_and_close() -> None:
        communicator = socket("/ws/dead-letter/", cookie)
        assert (await communicator.connect())[0]
        await asyncio.wait_for(hub.listening.wait(), 10)
        assert await sync_to_async(registered_listeners)(TASK_CHANGES_CHANNEL) == 1
        await communicator.disconnect()
        await sync_to_async(wait_for)(
            lambda: registered_listeners(TASK_CHANGES_CHANNEL) == 0,
            what="the hub to stop listening",
        )

    async def open_again() -> str:
        communicator = socket(f"/ws/tasks/{task_id}/", cookie)
        assert (await communicator.connect())[0]
        await html_from(communicator)  # the catch-up render
        await asyncio.wait_for(hub.listening.wait(), 10)
        await sync_to_async(complete_pending)("EchoAgent")
        last = ""
        while 'data-status="completed"' not in last:
            last = await html_from(communicator)
        await communicator.disconnect()
        return last

    async_to_sync(open_and_close)()
    assert 'data-status="completed"' in async_to_sync(open_again)()
