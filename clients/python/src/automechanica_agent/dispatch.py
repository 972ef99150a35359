"""Dispatch commands from NATS JetStream (``relay_events --dispatch``), for a runner
that follows them instead of long-polling. Needs the ``nats`` extra (nats-py).

The agent's commands come from the durable pull consumer ``dispatch_<Agent>`` on
``cmd.agent.<Agent>.execute.v1`` in stream ``GRNS_CMD`` (under a namespace if given),
the consumer ``runworker --dispatch`` uses too, so remote and in-process workers of
an agent share its commands. The client runs nats-py on an event loop of its own
thread and offers blocking calls to the runner's threads. A command is held until
the runner acknowledges it (once its task's outcome was accepted) and told in
progress every ``IN_PROGRESS_SECONDS`` meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.js.api import ConsumerConfig

logger = logging.getLogger(__name__)

# As the server's consumer: JetStream delivers a command again after ACK_WAIT_SECONDS
# without an ack or an in-progress, and lets the agent's workers hold that many.
ACK_WAIT_SECONDS = 30.0
MAX_ACK_PENDING = 100_000
IN_PROGRESS_SECONDS = ACK_WAIT_SECONDS / 3
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(eq=False)
class Command:
    """One delivered command: the task it names, and the message to settle."""

    task_id: str
    message: Any = field(repr=False)


class NatsCommands:
    def __init__(self, url: str, agent: str, namespace: str = "") -> None:
        self.url = url
        name = _UNSAFE.sub("_", agent) or "_"
        prefix = f"{namespace}." if namespace else ""
        self.subject = f"{prefix}cmd.agent.{name}.execute.v1"
        self.stream = f"{namespace}_GRNS_CMD" if namespace else "GRNS_CMD"
        self.durable = f"dispatch_{name}"
        self._held: set[Command] = set()
        self._held_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="nats", daemon=True)
        self._thread.start()
        self._nc: Any = None
        self._subscription: Any = None
        self._call(self._start_in_progress())

    def _call(self, coroutine: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def fetch(self, limit: int, timeout: float = 1.0) -> list[Command]:
        """Up to ``limit`` commands, waiting at most ``timeout`` for the first;
        (re)connects first when needed. Commands it cannot read are acknowledged."""
        return self._call(self._fetch(limit, timeout), timeout + 30)

    def ack(self, command: Command) -> None:
        self._settle(command, lambda m: m.ack())

    def later(self, command: Command, delay: float) -> None:
        """Have the command delivered again after ``delay`` seconds."""
        self._settle(command, lambda m: m.nak(delay=delay))

    def close(self) -> None:
        if self._nc is not None:
            try:
                self._call(self._nc.close(), 10)
            except Exception:  # closing: nothing left to do about it
                logger.debug("closing the NATS connection failed", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _fetch(self, limit: int, timeout: float) -> list[Command]:
        if self._nc is None or self._nc.is_closed:
            await self._connect()
        try:
            messages = await self._subscription.fetch(batch=limit, timeout=timeout)
        except TimeoutError:  # nats-py's, and a bare one (no messages)
            return []
        commands = []
        for message in messages:
            task_id = _task_id(message.data)
            if task_id is None:
                logger.warning("dispatch command refused: not a command with a task_id")
                await message.ack()
                continue
            command = Command(task_id, message)
            with self._held_lock:
                self._held.add(command)
            commands.append(command)
        return commands

    async def _connect(self) -> None:
        self._nc = await nats.connect(self.url, allow_reconnect=False, connect_timeout=5)
        config = ConsumerConfig(ack_wait=ACK_WAIT_SECONDS, max_ack_pending=MAX_ACK_PENDING)
        self._subscription = await self._nc.jetstream().pull_subscribe(
            self.subject, durable=self.durable, stream=self.stream, config=config
        )
        logger.info("following %s on %s", self.subject, self.url)

    def _settle(self, command: Command, settle: Any) -> None:
        with self._held_lock:
            if command not in self._held:
                return
            self._held.discard(command)
        try:
            self._call(settle(command.message), 10)
        except Exception as error:  # delivered again, and answered by its claim
            logger.warning("settling a dispatch command failed (%r)", error)

    async def _start_in_progress(self) -> None:
        self._in_progress = asyncio.ensure_future(self._keep_in_progress())

    async def _keep_in_progress(self) -> None:
        while True:
            await asyncio.sleep(IN_PROGRESS_SECONDS)
            with self._held_lock:
                held = list(self._held)
            for command in held:
                try:
                    await command.message.in_progress()
                except Exception as error:  # the connection dropped: delivered again
                    logger.debug("in progress failed (%r)", error)


def _task_id(body: bytes) -> str | None:
    try:
        payload = json.loads(body)["payload"]
        task_id = payload["task_id"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return task_id if isinstance(task_id, str) and len(task_id) <= 64 else None
