"""The stream hub: one per server process, feeding every open ``/api/v1/stream``.

Whatever the number of clients, a process costs the database one LISTEN (on
``EVENTS_CHANNEL``, which a trigger notifies once per transaction that writes
envelopes) and one read per wake-up: the hub reads the new events once, in position
order, and hands each to the clients whose filters it passes. Like the dashboard's
hub (``automechanica.dashboard.live``) it starts with the first client, stops with
the last (so that the trigger stops notifying: ``channel_listeners``), and uses the
one LISTEN loop (``task_queue.listen``).

Reading is ``event_stream.next_batch``, which first gives committed events their
positions (the sequencer, under its lock), so an event reaches a client as soon as
its transaction commits, not at the maintenance loop's next minute.

Every ``CHECK_SECONDS`` the hub also reads again, in case a notification was lost
with a connection, and looks up the tokens of its clients in one query: a client
whose token was revoked or deleted is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from channels.db import database_sync_to_async

from task_queue import event_stream
from task_queue.event_stream import Envelope
from task_queue.listen import listening_async
from task_queue.sql.channels import EVENTS_CHANNEL
from task_queue.sql.reading import task_workflows

from .stream_filter import StreamFilter, task_of
from .tokens import active_token_ids

logger = logging.getLogger(__name__)

BATCH = 1000
CHECK_SECONDS = 2.0
# Close codes (application range): the token was revoked or deleted; the client fell
# MAX_QUEUED events behind.
REVOKED = 4401
FELL_BEHIND = 4429
# Events waiting for one client beyond which it is closed (FELL_BEHIND): it resumes
# with ?after= from its last position, reading the backlog from the database.
MAX_QUEUED = 10_000


@dataclass(eq=False)
class Subscriber:
    """One open stream: its filter, its token and the events waiting to be sent."""

    filter: StreamFilter
    token_id: int
    queue: asyncio.Queue[Envelope] = field(default_factory=asyncio.Queue)
    # The hub's position when the client joined: every later event comes through
    # ``queue``; those before it, from the database (``after``).
    start: int = 0
    # Set (with a close code) when the client must be closed; the consumer watches it.
    closing: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def close(self, code: int) -> None:
        if not self.closing.done():
            self.closing.set_result(code)


async def workflows_needed(subscribers: list[Subscriber], events: list[Envelope]) -> dict[str, str]:
    """The workflows of the events' tasks, when a subscriber filters by workflow (else
    no trip to a thread and the database)."""
    if not any(s.filter.workflow_id for s in subscribers):
        return {}
    tasks = {t for e in events if (t := task_of(e))}
    return await database_sync_to_async(task_workflows)(tasks)


class StreamHub:
    def __init__(self) -> None:
        self.subscribers: set[Subscriber] = set()
        self.head = 0
        self.listening = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Clients between join's start and their place in ``subscribers``: the hub
        # does not stop under them.
        self._joining = 0

    async def join(self, subscriber: Subscriber) -> None:
        """Add a client once the hub listens; ``subscriber.start`` is then set."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests)
            self._stop()
            self._loop = loop
            self.listening, self._lock = asyncio.Event(), asyncio.Lock()
            self.subscribers = set()
        if self._task is None:  # the first client
            self._task = loop.create_task(self._run())
        self._joining += 1
        try:
            await self.listening.wait()
            async with self._lock:
                if not self.subscribers:  # nothing was read while no one listened
                    self.head = await database_sync_to_async(event_stream.head)()
                subscriber.start = self.head
                self.subscribers.add(subscriber)
        finally:
            self._joining -= 1
            self._stop_unless_used()

    def leave(self, subscriber: Subscriber) -> None:
        self.subscribers.discard(subscriber)
        self._stop_unless_used()

    def _stop_unless_used(self) -> None:
        if not self.subscribers and not self._joining:
            self._stop()

    def _stop(self) -> None:
        if self._task is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed already
                self._task.cancel()
        self._task = None
        self.listening.clear()

    async def _run(self) -> None:
        while True:
            try:
                async with listening_async(EVENTS_CHANNEL) as conn:
                    self.listening.set()
                    checked = 0.0
                    while True:
                        await self._deliver()  # what committed since the last read
                        if time.monotonic() - checked >= CHECK_SECONDS:
                            checked = time.monotonic()
                            await self._check_tokens()
                        async for _ in conn.notifies(timeout=CHECK_SECONDS, stop_after=1):
                            pass
                        # Those that came meanwhile are covered by the one read: under
                        # load, a read per read's time, not per transaction.
                        async for _ in conn.notifies(timeout=0):
                            pass
            except Exception as error:  # the hub must outlive any one failure
                self.listening.clear()
                logger.warning("the event stream hub failed (%r); reconnecting", error)
                await asyncio.sleep(1.0)

    async def _deliver(self) -> None:
        async with self._lock:
            while self.subscribers:
                events = await database_sync_to_async(event_stream.next_batch)(
                    self.head, limit=BATCH
                )
                if not events:
                    return
                subscribers = list(self.subscribers)
                workflows = await workflows_needed(subscribers, events)
                for subscriber in subscribers:
                    _offer(subscriber, events, workflows)
                self.head = events[-1].position
                if len(events) < BATCH:
                    return

    async def _check_tokens(self) -> None:
        subscribers = list(self.subscribers)
        if not subscribers:
            return
        active = await database_sync_to_async(active_token_ids)({s.token_id for s in subscribers})
        for subscriber in subscribers:
            if subscriber.token_id not in active:
                subscriber.close(REVOKED)


def _offer(subscriber: Subscriber, events: list[Envelope], workflows: dict[str, str]) -> None:
    for event in events:
        if not subscriber.filter.matches(event, workflows):
            continue
        if subscriber.queue.qsize() >= MAX_QUEUED:
            subscriber.close(FELL_BEHIND)
            return
        subscriber.queue.put_nowait(event)


hub = StreamHub()
