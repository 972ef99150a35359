"""Wake-ups for long-polling claims: one per server process.

Whatever the number of waiting claims, a process costs the database one LISTEN on the
workers' channel (``NOTIFY_CHANNEL``: an enqueue, a revive, a release, a freed slot of
a limited agent, and a retry reported over the worker protocol each notify the
agent's name, in the writer's transaction), through the
one LISTEN loop (``task_queue.listen``). A claim subscribes to its agent before it
claims, so a task that commits between its empty claim and its wait still wakes it.

Each notification wakes one waiting claim; one that gets tasks wakes the next, so a
burst is taken by as many claims as it needs, one after another, while a single task
wakes a single claim. The LISTEN starts with the first subscription and then stays:
remote workers poll again as soon as they are answered, and the channel notifies
whether anyone listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from task_queue.listen import (
    HEARD_WITHIN_SECONDS,
    heard_async,
    listening_async,
    warn_not_in_effect,
)
from task_queue.sql import heartbeats
from task_queue.sql.channels import NOTIFY_CHANNEL
from task_queue.sql.connections import listen_sessions_shared

logger = logging.getLogger(__name__)

RECONNECT_SECONDS = 1.0
# Without a LISTEN in effect (the database unreachable, or a pooler in transaction mode
# in between), waiting claims are run again this often.
UNHEARD_RETRY_SECONDS = 1.0


class ClaimWakeups:
    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Event]] = {}
        # Remote workers with a claim waiting here: how many claims each.
        self._workers: dict[str, int] = {}
        self._task: asyncio.Task | None = None
        self._toucher: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.listening = asyncio.Event()

    @contextlib.asynccontextmanager
    async def subscribe(self, agent: str, worker: str | None) -> AsyncIterator[asyncio.Event]:
        """An event set when a task of ``agent`` may have become due; meanwhile the
        ``worker`` (its name, if the request gave one) is kept alive on /workers/."""
        self._start()
        woken = asyncio.Event()
        self._waiting.setdefault(agent, set()).add(woken)
        if worker is not None:
            self._workers[worker] = self._workers.get(worker, 0) + 1
        try:
            yield woken
        finally:
            waiting = self._waiting.get(agent, set())
            waiting.discard(woken)
            if not waiting:
                self._waiting.pop(agent, None)
            if worker is not None:
                self._workers[worker] -= 1
                if not self._workers[worker]:
                    del self._workers[worker]

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests)
            self._loop, self._task, self._toucher = loop, None, None
            self.listening = asyncio.Event()
            self._waiting, self._workers = {}, {}
        if self._task is None:
            self._task = loop.create_task(self._run())
            self._toucher = loop.create_task(self._touch())

    def _wake(self, agent: str | None, passing: asyncio.Event | None = None) -> None:
        """Wake one claim waiting for ``agent`` (None: every waiting claim). One
        notification, one claim run: a hundred waiting workers do not all run the
        view, each with a thread and a pooled connection, for one task. A woken claim
        that got tasks passes the wake-up on (``pass_on``), since more may be due."""
        if agent is None:
            for waiting in self._waiting.values():
                for woken in waiting:
                    woken.set()
            return
        for woken in self._waiting.get(agent, ()):
            if woken is not passing and not woken.is_set():
                woken.set()
                return

    def pass_on(self, agent: str, passing: asyncio.Event) -> None:
        """A woken claim got tasks, or will not use its wake-up: wake the next one
        (not the claim's own ``passing`` subscription)."""
        self._wake(agent, passing)

    async def _touch(self) -> None:
        """Every third of a lease (as runworker heartbeats), one statement marks every
        worker waiting here alive, on a pooled connection given back at once."""
        while True:
            await asyncio.sleep(settings.QUEUE_LEASE_SECONDS / 3)
            if not self._workers:
                continue
            try:
                await sync_to_async(_touch, thread_sensitive=False)(list(self._workers))
            except Exception as error:  # the next tick tries again
                logger.warning("marking waiting workers alive failed (%r)", error)

    async def _run(self) -> None:
        instead = f"waiting claims look for tasks every {UNHEARD_RETRY_SECONDS:.1f} s instead"
        while True:
            try:
                if await sync_to_async(listen_sessions_shared, thread_sensitive=False)():
                    warn_not_in_effect(True, instead)  # and ``listening`` stays clear
                    return
                async with listening_async(NOTIFY_CHANNEL) as conn:
                    if await heard_async(conn, HEARD_WITHIN_SECONDS):
                        self.listening.set()
                    else:
                        warn_not_in_effect(False, instead)
                    self._wake(None)  # anything that came while no one listened
                    async for note in conn.notifies():
                        self._wake(note.payload)
            except Exception as error:  # the wake-ups must outlive any one failure
                self.listening.clear()
                logger.warning("claim wake-ups failed (%r); reconnecting", error)
                await asyncio.sleep(RECONNECT_SECONDS)


def _touch(workers: list[str]) -> None:
    try:
        heartbeats.touch_workers(workers)
    finally:
        close_old_connections()  # the pooled connection goes back


wakeups = ClaimWakeups()
