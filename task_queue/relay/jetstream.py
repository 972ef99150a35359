"""The NATS JetStream bridge (seed 000 §9): events on ``evt.…`` subjects in stream
GRNS_EVT, commands from GRNS_CMD by a durable pull consumer, refused commands to
GRNS_DLQ. Streams are created when absent. Needs the ``nats`` extra (nats-py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import nats
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from task_queue.event_stream import Envelope
from task_queue.relay.commands import dead_letter_body
from task_queue.relay.names import COMMAND_KIND, Names, subject_for

# JetStream drops a message whose Nats-Msg-Id it stored within this window, so a
# batch published again after a relay crash mostly arrives once.
DUPLICATE_WINDOW_SECONDS = 120
DURABLE = "automechanica"


logger = logging.getLogger(__name__)


async def _log_error(error: Exception) -> None:
    # nats-py's default prints a traceback per failed connect; the relay logs one line.
    logger.debug("nats: %r", error)


class JetStreamBridge:
    # What an unreachable or restarting server raises: the relay reconnects.
    # (TooManyStalledMsgsError, a publish waiting on the client's buffer, is one.)
    errors = (nats.errors.Error, OSError, asyncio.TimeoutError)

    def __init__(self, url: str, names: Names, *, confirm_timeout: float) -> None:
        self.url = url
        self.names = names
        self.confirm_timeout = confirm_timeout
        self.nc: nats.NATS | None = None

    async def connect(self) -> None:
        # The relay reconnects itself (and resumes from its cursor), so the client's
        # own reconnect, which would hold publishes in a buffer, is off.
        # (nats-py tries connecting max_reconnect_attempts times even without it.)
        self.nc = await nats.connect(
            self.url,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.2,
            connect_timeout=5,
            error_cb=_log_error,
        )
        self.js = self.nc.jetstream()
        for name, subjects in (("GRNS_EVT", "evt.>"), ("GRNS_CMD", "cmd.>"), ("GRNS_DLQ", "dlq.>")):
            await self._ensure_stream(self.names.stream(name), self.names.subject(subjects))

    async def _ensure_stream(self, name: str, subjects: str) -> None:
        try:
            await self.js.stream_info(name)
        except NotFoundError:
            await self.js.add_stream(
                StreamConfig(
                    name=name, subjects=[subjects], duplicate_window=DUPLICATE_WINDOW_SECONDS
                )
            )

    async def publish(self, events: Sequence[Envelope]) -> None:
        """Publish in order; return once JetStream stored every one (or raise)."""
        acks = [
            await self.js.publish_async(
                self.names.subject(subject_for(event.kind)),
                event.to_json(),
                headers={"Nats-Msg-Id": str(event.message_id)},
                wait_stall=self.confirm_timeout,
            )
            for event in events
        ]
        await asyncio.wait_for(asyncio.gather(*acks), self.confirm_timeout)

    async def consume_commands(
        self, handle: Callable[[bytes], Awaitable[str | None]], *, drain: bool
    ) -> None:
        """Turn commands into tasks until cancelled (``drain``: until none is waiting).
        ``handle`` returns None, or why the command was refused: it then goes to
        ``dlq.cmd.task.execute.v1`` with the reason in a header. Acked either way."""
        subscription = await self.js.pull_subscribe(
            self.names.subject(COMMAND_KIND), durable=DURABLE, stream=self.names.stream("GRNS_CMD")
        )
        while True:
            try:
                messages = await subscription.fetch(batch=8, timeout=1)
            # Not only nats.errors.TimeoutError (a subclass): nats-py's fetch of a batch
            # raises a bare TimeoutError when the server's "no messages" comes
            # back after the deadline (seen under load: `relay_events --once
            # --consume-commands` failed with "TimeoutError: ").
            except TimeoutError:
                if drain:
                    return
                continue
            for message in messages:
                refused = await handle(message.data)
                if refused is not None:
                    await self.js.publish(
                        self.names.subject("dlq." + COMMAND_KIND),
                        dead_letter_body(message.data),
                        headers={"Refused": refused[:1000]},
                    )
                await message.ack()

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()
