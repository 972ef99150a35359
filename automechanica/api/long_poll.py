"""The long poll of ``POST /api/v1/agents/{name}/claim``, waiting outside Django.

Django's ASGI handler gives every request a thread of its own for its synchronous
parts (an asgiref ``ThreadSensitiveContext``) until the response is sent, and the
view would hold a pooled database connection meanwhile: two hundred remote workers
waiting would be two hundred threads. So the waiting happens here, in the server's
event loop, between two runs of the ordinary view:

1. subscribe to the agent's wake-ups (``claim_wakeups``), then run the request
   through Django with a :class:`LongPoll` in its scope, keeping the answer back;
2. if the view found nothing due and asked to wait (``LongPoll.wait``), keep that
   answer back, wait for a wake-up, the next task's due time or the deadline, with no
   thread and no connection, and run the request again (the wake-ups keep a waiting
   worker's row alive meanwhile, one statement a tick for all of them); at the
   deadline, with notifications heard and none for the agent, the answer kept back
   is sent as it is: an idle worker's long poll runs the view once, not twice;
3. otherwise send the answer.

Every run authenticates and claims afresh, so a revoked token or a paused agent takes
effect at the next wake-up. A client that hangs up ends the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from task_queue import remote
from task_queue.storable import text_problem

from .claim_wakeups import UNHEARD_RETRY_SECONDS, wakeups

# The key of the request's LongPoll in the ASGI scope (the view reads request.scope).
LONG_POLL = "automechanica.long_poll"
CLAIM_PATH = re.compile(r"/api/v1/agents/(?P<agent>[^/]+)/claim/?")
# The least wait before the claim runs again for a task that is due already.
DUE_RETRY_SECONDS = 0.05

Scope = dict[str, Any]
Message = dict[str, Any]
App = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Any]


class LongPoll:
    """What the claim view tells the wrapper: wait (until when, and when the agent's
    next task falls due), or answer now."""

    def __init__(self, worker: str | None) -> None:
        self.worker = worker
        self.started = time.monotonic()
        self.deadline: float | None = None
        self.due_in: float | None = None
        self.waiting = False
        # The last wait was to last until the deadline (nothing else could end it
        # sooner but a wake-up or the client leaving).
        self.until_deadline = False
        # The answers to the outcomes sent with the claim, once its first run recorded
        # them: a later run answers these and records nothing again.
        self.reported: list[Any] | None = None

    def wait(self, wait_seconds: float, due_in: float | None) -> None:
        """Nothing was claimed: wait, until ``wait_seconds`` after the request came in
        (at most ``API_CLAIM_MAX_WAIT_SECONDS``), for a task of the agent (``due_in``:
        seconds until the next one falls due)."""
        if self.deadline is None:
            wait_seconds = min(wait_seconds, settings.API_CLAIM_MAX_WAIT_SECONDS)
            self.deadline = self.started + wait_seconds
        self.due_in = due_in
        self.waiting = time.monotonic() < self.deadline

    def timeout(self, listening: bool) -> float:
        """How long the next wait may last."""
        remaining = self.deadline - time.monotonic()
        # A waiting worker named in its request is kept alive by the wake-ups' ticks;
        # one that is not (a body the view refused) runs again every third of a lease.
        limits = [remaining] if self.worker else [remaining, settings.QUEUE_LEASE_SECONDS / 3]
        if self.due_in is not None:
            # A task already due that the claim could not take (another transaction has
            # it locked) is tried again shortly, not in a loop.
            limits.append(max(self.due_in, DUE_RETRY_SECONDS))
        if not listening:
            limits.append(UNHEARD_RETRY_SECONDS)
        self.until_deadline = listening and min(limits) == remaining
        return max(min(limits), 0.0)


def long_polling(app: App) -> App:
    """``app`` with the claim route's long poll; every other request passes through."""

    async def application(scope: Scope, receive: Any, send: Any) -> None:
        match = CLAIM_PATH.fullmatch(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or scope.get("method") != "POST":
            return await app(scope, receive, send)
        # ASGI's path is already percent-decoded: the agent's name as it is.
        await _claim(app, scope, receive, send, match["agent"])

    return application


async def _claim(app: App, scope: Scope, receive: Any, send: Any, agent: str) -> None:
    body = await _read_body(receive)
    if body is None:
        return  # the client hung up before its request was whole
    hung_up = asyncio.Event()
    watcher = asyncio.create_task(_watch_disconnect(receive, hung_up))
    poll = LongPoll(_worker_of(body))
    try:
        woken_before = False
        while True:
            answer: list[Message] = []
            async with wakeups.subscribe(agent, poll.worker) as woken:
                poll.waiting = False
                await app({**scope, LONG_POLL: poll}, _replay(body, hung_up), _keep(answer))
                answering = not poll.waiting or hung_up.is_set()
                if answering and (woken_before or woken.is_set()):
                    # A wake-up (before this run, or during it) that this claim will not
                    # wait on again: it got tasks (more may be due), failed, or its
                    # client left. The next waiting claim gets it.
                    wakeups.pass_on(agent, woken)
                if answering:
                    break
                timeout = poll.timeout(wakeups.listening.is_set())
                await _first(woken.wait(), hung_up.wait(), timeout=timeout)
                woken_before = woken.is_set()
                quiet = not woken_before and wakeups.listening.is_set()
                if poll.until_deadline and quiet and not hung_up.is_set():
                    # The deadline, and nothing heard since the claim found nothing: its
                    # answer (kept back) is the answer, without running the claim again.
                    break
            if hung_up.is_set():
                if woken_before:
                    wakeups.pass_on(agent, woken)
                return
        if hung_up.is_set():
            # The client left while its claim ran: give back what it took (else the
            # tasks would stay leased to no one until their leases end).
            await sync_to_async(_release_unread, thread_sensitive=False)(answer)
            return
        for message in answer:
            await send(message)
    finally:
        watcher.cancel()


def _release_unread(answer: list[Message]) -> None:
    body = b"".join(m.get("body", b"") for m in answer if m["type"] == "http.response.body")
    try:
        tasks = json.loads(body).get("tasks") or []
        held = [(UUID(t["id"]), UUID(t["lease_token"])) for t in tasks]
    except (ValueError, AttributeError, KeyError, TypeError):
        return  # not a claim's answer (an error): nothing was taken
    if held:
        try:
            remote.release_unread(held)
        finally:
            close_old_connections()


def _worker_of(body: bytes) -> str | None:
    """The worker's name in the claim's body, if it has one the view will take (the
    view checks the body itself; this only says whom the wait keeps alive)."""
    try:
        worker = json.loads(body).get("worker")
    except (ValueError, AttributeError):
        return None
    if not isinstance(worker, str) or not 0 < len(worker) <= 200 or text_problem(worker):
        return None
    return worker


async def _read_body(receive: Any) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _watch_disconnect(receive: Any, hung_up: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    hung_up.set()


def _replay(body: bytes, hung_up: asyncio.Event) -> Callable[[], Awaitable[Message]]:
    """The request's body once, then (as a server would) a disconnect when the client
    hangs up."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await hung_up.wait()
        return {"type": "http.disconnect"}

    return receive


def _keep(answer: list[Message]) -> Callable[[Message], Awaitable[None]]:
    async def send(message: Message) -> None:
        answer.append(message)

    return send


async def _first(*waits: Awaitable[Any], timeout: float) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
