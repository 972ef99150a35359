"""The relay loop: stream → broker with confirms, resuming from the cursor.

The cursor (``event_relay_cursors``) moves only after the broker confirmed every
event up to it, so a crash or an outage repeats at most the unconfirmed batch: a
duplicate, never a gap. Consumers deduplicate by ``message_id`` (JetStream does it
itself within its duplicate window). Events go out in position order, so a task's
events arrive in the order they happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.db import DataError, IntegrityError

from task_queue import event_stream
from task_queue.event_stream import Envelope
from task_queue.relay.commands import DEAD_LETTER_BODY_BYTES, InvalidCommand, execute_command
from task_queue.relay.dispatch_commands import Dispatch
from task_queue.relay.dispatcher import Dispatcher
from task_queue.sql import outbox
from task_queue.task_logging import about_task

logger = logging.getLogger(__name__)

RECONNECT_FIRST_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 5.0
PROGRESS_EVERY_SECONDS = 10.0


# What a command's own content can raise on its way to a task: refused, not retried.
POISON = (
    InvalidCommand,
    ValueError,
    TypeError,
    OverflowError,
    RecursionError,
    MemoryError,
    DataError,
    IntegrityError,
)


class Bridge(Protocol):
    errors: tuple[type[BaseException], ...]

    async def connect(self) -> None: ...
    async def publish(self, events: Sequence[Envelope]) -> None: ...
    async def publish_commands(self, commands: Sequence[Dispatch]) -> None: ...
    async def consume_commands(
        self, handle: Callable[[bytes], Awaitable[str | None]], *, drain: bool
    ) -> None: ...
    async def close(self) -> None: ...


class RelayBusy(RuntimeError):
    """Another relay holds this destination."""


class BrokerUnavailable(RuntimeError):
    """With --once: the broker could not be reached or did not confirm."""


@dataclass
class RelayStats:
    relayed: int = 0
    dispatched: int = 0
    commands: int = 0
    refused: int = 0
    outages: int = 0
    position: int = 0
    started: float = field(default_factory=time.monotonic)

    def rate(self) -> float:
        return self.relayed / max(time.monotonic() - self.started, 1e-9)


def _db(function: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    # One thread for every database call: the relay lock is held by its session.
    return sync_to_async(function, thread_sensitive=True)


class Relay:
    def __init__(
        self,
        bridge: Bridge,
        destination: str,
        *,
        batch: int,
        poll_seconds: float,
        once: bool,
        consume_commands: bool,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.bridge = bridge
        self.destination = destination
        self.batch = batch
        self.poll_seconds = poll_seconds
        self.once = once
        self.consume_commands = consume_commands
        self.dispatcher = dispatcher
        self.stats = RelayStats()
        self.working = False  # since the last connect: a batch confirmed, or caught up

    async def run(self, stop: asyncio.Event) -> RelayStats:
        """Relay until ``stop`` is set (with ``once``: until nothing is pending)."""
        if not await _db(outbox.try_relay_lock)(self.destination):
            raise RelayBusy(f"another relay_events is relaying to {self.destination}")
        try:
            if self.dispatcher is not None:
                await _db(self.dispatcher.start)()
            await self._run_connected(stop)
        finally:
            with contextlib.suppress(Exception):
                await self.bridge.close()
            # (On a lost database connection the lock went with it.)
            with contextlib.suppress(Exception):
                await _db(outbox.relay_unlock)(self.destination)
        return self.stats

    async def _run_connected(self, stop: asyncio.Event) -> None:
        wait = RECONNECT_FIRST_SECONDS
        down_since: float | None = None
        while not stop.is_set():
            self.working = False
            try:
                await self.bridge.connect()
                if down_since is not None:
                    logger.warning(
                        "broker back after %.1f s; resuming after position %d",
                        time.monotonic() - down_since,
                        self.stats.position,
                    )
                    down_since = None
                await self._relay(stop)
                return
            except self.bridge.errors as error:
                # Back off afresh only after a batch was confirmed (or the relay had
                # caught up): an error that recurs right after connecting keeps
                # doubling the wait instead of spinning.
                if self.working:
                    wait = RECONNECT_FIRST_SECONDS
                if self.once:
                    raise BrokerUnavailable(
                        f"{self.destination}: {type(error).__name__}: {error}"
                    ) from None
                if down_since is None:
                    down_since = time.monotonic()
                    self.stats.outages += 1
                logger.warning("broker unavailable (%r); retrying in %.1f s", error, wait)
                with contextlib.suppress(Exception):
                    await self.bridge.close()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
                wait = min(wait * 2, RECONNECT_MAX_SECONDS)

    async def _relay(self, stop: asyncio.Event) -> None:
        commands = None
        if self.consume_commands:
            commands = asyncio.ensure_future(
                self.bridge.consume_commands(self._execute, drain=self.once)
            )
        try:
            position = await _db(outbox.relay_cursor)(self.destination)
            self.stats.position = position
            reported = time.monotonic()
            while not stop.is_set():
                if commands is not None and commands.done():
                    commands.result()  # its error: reconnect (or, not a broker's, stop)
                    if not self.once:
                        raise ConnectionError("the command consumer stopped")
                events = await _db(event_stream.next_batch)(position, limit=self.batch)
                if events:
                    await self.bridge.publish(events)
                    self.working = True
                behind = await self._dispatch(events)
                if events:
                    position = events[-1].position
                    await _db(outbox.advance_relay_cursor)(
                        destination=self.destination, position=position, relayed=len(events)
                    )
                    self.stats.relayed += len(events)
                    self.stats.position = position
                    if time.monotonic() - reported > PROGRESS_EVERY_SECONDS:
                        reported = time.monotonic()
                        logger.info(
                            "relayed %d events (%.0f/s), at position %d; %d dispatched",
                            self.stats.relayed,
                            self.stats.rate(),
                            position,
                            self.stats.dispatched,
                        )
                if len(events) == self.batch or behind:
                    continue
                if self.once:
                    break
                self.working = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_seconds)
            if commands is not None and self.once:
                await commands
        finally:
            if commands is not None and not commands.done():
                commands.cancel()
                with contextlib.suppress(asyncio.CancelledError, *self.bridge.errors):
                    await commands

    async def _dispatch(self, events: Sequence[Envelope]) -> bool:
        """With --dispatch: publish the commands of the tasks now due (the events' and
        the scan's) before the cursor moves past their events; whether the scan has
        more due at once."""
        if self.dispatcher is None:
            return False
        commands, bookmark = await _db(self.dispatcher.due)(events)
        if commands:
            await self.bridge.publish_commands(commands)
            self.working = True
            self.stats.dispatched += len(commands)
        await _db(self.dispatcher.published)(bookmark)
        return self.dispatcher.behind

    async def _execute(self, body: bytes) -> str | None:
        """The command's task, or why it was refused (it then goes to the dead-letter
        subject, and is acknowledged either way: a poison command is never redelivered
        to stop the relay again). A command is refused for what is wrong with it: its
        body, its fields, or data the database will not store. Any other database error
        (lost connection, read-only standby, a schema not migrated yet) is not the
        command's fault: it raises, the command stays unacknowledged, and the relay
        stops for its supervisor to restart it."""
        try:
            task = await _db(execute_command)(body)
        except POISON as error:
            reason = (
                str(error)
                if isinstance(error, InvalidCommand)
                else (f"{type(error).__name__}: {error}")
            )
            if len(body) > DEAD_LETTER_BODY_BYTES:
                reason += f" (the dead letter keeps the first {DEAD_LETTER_BODY_BYTES} bytes)"
            self.stats.refused += 1
            logger.warning("command refused: %s", reason[:1000])
            return reason
        self.stats.commands += 1
        with about_task(task):
            logger.info("command: task %s %s", task.id, "created" if task.created else "exists")
        return None
