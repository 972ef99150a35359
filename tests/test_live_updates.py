"""The dashboard's WebSocket in-process (Channels' communicator against the real ASGI
application and database): who may connect, and what arrives when tasks change."""

from __future__ import annotations

import asyncio
from uuid import UUID

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from automechanica.asgi import application
from automechanica.dashboard.live import hub
from task_queue import operations
from tests.support.queue import complete_pending, fail_pending

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = b"http://127.0.0.1:8000"


def session_cookie(*, is_staff: bool = True) -> bytes:
    user = User.objects.create_user(f"u{User.objects.count()}", password="pw", is_staff=is_staff)
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def socket(path: str, cookie: bytes | None, origin: bytes = ORIGIN) -> WebsocketCommunicator:
    headers = [(b"origin", origin), (b"host", b"127.0.0.1:8000")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, path, headers=headers)


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
        received = [[await c.receive_from(timeout=5) for _ in range(3)] for c in sockets]
        taken = hub.snapshots_taken - before
        for communicator in sockets:
            await communicator.disconnect()
        return taken, received

    taken, received = async_to_sync(watch)()
    # Each socket got 3 pushes; one snapshot per push serves all four (not 12).
    assert taken <= 4, taken
    assert all('id="overview-live"' in html for pushes in received for html in pushes)
    assert all('data-agent="EchoAgent"' in pushes[-1] for pushes in received)


def test_a_revived_task_leaves_open_dead_letter_pages():
    cookie = session_cookie()
    task_id = operations.enqueue("EchoAgent", "echo", {}).id
    fail_pending("EchoAgent", retryable=False)

    async def watch() -> str:
        communicator = socket("/ws/dead-letter/", cookie)
        assert (await communicator.connect())[0]
        await asyncio.wait_for(hub.listening.wait(), 10)
        await sync_to_async(operations.revive)([task_id], actor="user:elsewhere")
        message = await communicator.receive_from(timeout=5)
        await communicator.disconnect()
        return message

    message = async_to_sync(watch)()
    assert f'<tr id="dl-{task_id}" hx-swap-oob="delete"></tr>' in message


def test_a_task_page_follows_its_task():
    cookie = session_cookie()
    task_id: UUID = operations.enqueue("EchoAgent", "echo", {"hello": "world"}).id

    async def watch() -> tuple[str, str]:
        communicator = socket(f"/ws/tasks/{task_id}/", cookie)
        assert (await communicator.connect())[0]
        first = await communicator.receive_from(timeout=5)  # the catch-up render
        await asyncio.wait_for(hub.listening.wait(), 10)
        await sync_to_async(complete_pending)("EchoAgent")
        updates = []
        while 'data-status="completed"' not in (updates[-1] if updates else ""):
            updates.append(await communicator.receive_from(timeout=5))
        await communicator.disconnect()
        return first, updates[-1]

    first, last = async_to_sync(watch)()
    assert 'data-status="pending"' in first
    assert 'data-status="completed"' in last and "&quot;ok&quot;: true" in last


def test_a_workflow_page_follows_its_progress():
    from workflows.models import Workflow

    cookie = session_cookie()
    workflow = Workflow.objects.create(name="onboarding")
    operations.enqueue("EchoAgent", "echo", {}, workflow_id=workflow.id)

    async def watch() -> tuple[str, str]:
        communicator = socket(f"/ws/workflows/{workflow.id}/", cookie)
        assert (await communicator.connect())[0]
        first = await communicator.receive_from(timeout=5)
        await sync_to_async(complete_pending)("EchoAgent")
        last = first
        while "wf-completed" not in last:
            last = await communicator.receive_from(timeout=5)
        await communicator.disconnect()
        return first, last

    first, last = async_to_sync(watch)()
    assert 'id="workflow-live"' in first and "wf-running" in first
    assert "completed 1" in last
