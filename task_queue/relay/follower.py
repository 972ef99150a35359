"""``runworker AGENT --dispatch URL``: take work from the broker's dispatch commands.

The follower runs an asyncio loop on its own thread. It takes commands
(``cmd.agent.<Agent>.execute.v1``, task_queue.relay.dispatch_commands) only while the
worker has a free slot, and claims each command's task by id through the worker
(``Worker.claim_dispatched``: the claim every worker makes, picking that one task).
The claim is the gate: a command for a task that is not due, taken, finished, unknown
or of a paused agent is acknowledged at once, so duplicates and redeliveries cost one
claim each; one whose task is due but could not start now (its row locked by another
claim, its agent at a limit) is delivered again a little later.

A claimed task's command stays unacknowledged while the task runs (JetStream is told
it is in progress every third of its ack wait) and is acknowledged once the outcome
is committed (or the task was given back, or its lease lost: then another worker's
claim decides). A worker that dies leaves it unacknowledged: the broker delivers it
again, and the claim answers for the task as it is by then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from django.db import connection

from task_queue.relay.dispatch_commands import InvalidDispatch, parse
from task_queue.retry import CONNECTION_ERRORS

logger = logging.getLogger("task_queue.worker")

# A command delivered again when its task could not start now (no free slot, the
# database down, the task locked or its agent at a limit).
REDELIVER_SECONDS = 1.0
RECONNECT_SECONDS = 1.0

# A run of a task: its id and the lease token its claim gave.
Run = tuple[UUID, UUID]


@dataclass
class Delivery:
    """One command as the broker gave it, with how to settle it."""

    body: bytes
    ack: Callable[[], Awaitable[None]]
    redeliver: Callable[[float], Awaitable[None]]
    in_progress: Callable[[], Awaitable[None]]


class DispatchSource(Protocol):
    """A broker's dispatch commands for some agents (jetstream, rabbitmq)."""

    errors: tuple[type[BaseException], ...]
    ack_wait_seconds: float

    async def connect(self, agents: list[str], prefetch: int) -> None: ...
    async def next(self, limit: int) -> list[Delivery]: ...
    async def close(self) -> None: ...


class Claimer(Protocol):
    """What the follower needs of its worker."""

    def free_slots(self) -> int: ...
    def claim_dispatched(
        self, task_id: UUID, agent: str, before_start: Callable[[UUID], None]
    ) -> str: ...
    def stopping(self) -> bool: ...


class Follower:
    def __init__(
        self, source: DispatchSource, worker: Claimer, agents: Iterable[str], *, prefetch: int
    ) -> None:
        """``prefetch``: the most commands the broker hands over unacknowledged (the
        worker's concurrency: one per task it can run)."""
        self.source = source
        self.prefetch = prefetch
        self.worker = worker
        self.agents = frozenset(agents)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._room = asyncio.Event()
        self._stop = asyncio.Event()
        # The commands of the runs under way, written by the claim (on the database
        # thread, before the run starts) and read on the loop: hence the lock.
        self._running: dict[Run, Delivery] = {}
        self._running_lock = threading.Lock()
        self._settling: set[asyncio.Future] = set()  # acks and requeues under way
        # The database calls (claims) on one thread of their own: one connection.
        self._db = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dispatch-db")
        self._thread = threading.Thread(target=self._run, name="dispatch", daemon=True)

    # -------------------------------------------------- called from the worker's threads

    def start(self) -> None:
        self._thread.start()

    def slot_freed(self) -> None:
        self._call_soon(self._room.set)

    def settled(self, runs: Iterable[Run]) -> None:
        """These runs' outcomes are committed (or their tasks were given back, or their
        leases lost): acknowledge their commands."""
        with self._running_lock:
            deliveries = [d for run in runs if (d := self._running.pop(run, None)) is not None]
        if deliveries:
            self._call_soon(lambda: self._ack(deliveries))

    def stop(self, timeout: float = 5.0) -> None:
        self._call_soon(self._stop.set)
        self._thread.join(timeout)

    def _call_soon(self, callback: Callable[[], Any]) -> None:
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop just closed
                self._loop.call_soon_threadsafe(callback)

    # -------------------------------------------------- the follower's own thread

    def _run(self) -> None:
        try:
            asyncio.run(self._follow())
        finally:
            self._db.submit(connection.close).result()
            self._db.shutdown()

    async def _follow(self) -> None:
        """Follow until stopped, reconnecting after any failure: the worker keeps
        running either way (its own claim goes on at its poll interval)."""
        self._loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            failed = False
            try:
                await self.source.connect(sorted(self.agents), self.prefetch)
                logger.info("following dispatch commands for %s", ", ".join(sorted(self.agents)))
                in_progress = asyncio.ensure_future(self._keep_in_progress())
                try:
                    await self._take()
                    if self._settling:  # stopping: the last acks go out before the close
                        await asyncio.wait(list(self._settling), timeout=5)
                finally:
                    in_progress.cancel()
            except self.source.errors as error:
                logger.warning("dispatch broker unavailable (%r); reconnecting", error)
                failed = True
            except Exception:
                logger.exception("following dispatch commands failed; reconnecting")
                failed = True
            finally:
                with contextlib.suppress(Exception):
                    await self.source.close()
            if failed:
                with self._running_lock:  # unacknowledged: the broker delivers them again
                    self._running.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), RECONNECT_SECONDS)

    async def _take(self) -> None:
        while not self._stop.is_set():
            free = 0 if self.worker.stopping() else self.worker.free_slots()
            if free == 0:
                self._room.clear()
                stop = asyncio.ensure_future(self._stop.wait())
                room = asyncio.ensure_future(self._room.wait())
                await asyncio.wait([stop, room], timeout=1.0, return_when="FIRST_COMPLETED")
                stop.cancel()
                room.cancel()
                continue
            for delivery in await self.source.next(free):
                await self._claim(delivery)

    async def _claim(self, delivery: Delivery) -> None:
        try:
            task_id, agent = parse(delivery.body, self.agents)
        except InvalidDispatch as error:
            logger.warning("dispatch command refused: %s", error)
            self._settle(delivery.ack())  # never delivered again to be refused again
            return

        def register(lease_token: UUID) -> None:  # before the run starts: see settled
            with self._running_lock:
                self._running[(task_id, lease_token)] = delivery

        try:
            answer = await self._loop.run_in_executor(
                self._db, self.worker.claim_dispatched, task_id, agent, register
            )
        except CONNECTION_ERRORS as error:
            logger.warning("claiming task %s failed (%s); redelivered later", task_id, error)
            await self._loop.run_in_executor(self._db, connection.close)
            self._settle(delivery.redeliver(REDELIVER_SECONDS))
            return
        if answer == "later":  # no free slot, or its task cannot start just now
            self._settle(delivery.redeliver(REDELIVER_SECONDS))
        elif answer == "done":  # taken by another, finished, not due, paused, unknown
            self._settle(delivery.ack())

    async def _keep_in_progress(self) -> None:
        every = self.source.ack_wait_seconds / 3
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), every)
            with self._running_lock:
                running = list(self._running.values())
            for delivery in running:
                await delivery.in_progress()

    def _ack(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            self._settle(delivery.ack())

    def _settle(self, settling: Awaitable[None]) -> None:
        """Ack or requeue without holding up the follower (a requeue over AMQP waits
        before it puts the command back)."""

        async def settle() -> None:
            try:
                await settling
            except Exception as error:  # delivered again, and answered by its claim
                logger.warning("settling a dispatch command failed (%r)", error)

        future = asyncio.ensure_future(settle())
        self._settling.add(future)
        future.add_done_callback(self._settling.discard)
