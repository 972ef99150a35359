"""The NATS JetStream bridge (seed 000 §9): events on ``evt.…`` subjects in stream
GRNS_EVT, commands from GRNS_CMD by a durable pull consumer, refused commands to
GRNS_DLQ, dispatch commands (``cmd.agent.<Agent>.execute.v1``) to GRNS_CMD, and a
worker's source of them (a durable pull consumer per agent, shared by its workers).
Streams are created when absent. Needs the ``nats`` extra (nats-py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import nats
from nats.js.api import ConsumerConfig, StreamConfig
from nats.js.errors import NotFoundError

from task_queue.event_stream import Envelope
from task_queue.relay.commands import dead_letter_body
from task_queue.relay.dispatch_commands import Dispatch, kind_for
from task_queue.relay.follower import Delivery
from task_queue.relay.names import COMMAND_KIND, Names, subject_for

# JetStream drops a message whose Nats-Msg-Id it stored within this window, so a
# batch published again after a relay crash mostly arrives once.
DUPLICATE_WINDOW_SECONDS = 120
DURABLE = "automechanica"
# How long JetStream waits for a dispatched worker's ack before delivering again; the
# worker says it is still working every third of it.
DISPATCH_ACK_WAIT_SECONDS = 30.0
# The most dispatch commands one agent's workers may hold unacknowledged (one per task
# they run); JetStream's default, 1,000, would stall a larger fleet.
DISPATCH_MAX_ACK_PENDING = 100_000
# How long GRNS_CMD, when this creates it, keeps a command (acknowledged or not): a
# dispatch command a week old is long covered by republishing, and a consumer made
# anew replays no more than that. (GRNS_EVT and GRNS_DLQ keep theirs.)
COMMANDS_MAX_AGE_SECONDS = 7 * 24 * 3600


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
        self.nc, self.js = await _connect(self.url, self.names)

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

    async def publish_commands(self, commands: Sequence[Dispatch]) -> None:
        """Publish dispatch commands; return once JetStream stored every one."""
        acks = []
        for command in commands:
            message_id = command.message_id
            acks.append(
                await self.js.publish_async(
                    self.names.subject(kind_for(command.agent)),
                    command.to_json(message_id),
                    headers={"Nats-Msg-Id": message_id},
                    wait_stall=self.confirm_timeout,
                )
            )
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


async def _connect(url: str, names: Names) -> tuple[nats.NATS, object]:
    """A connection and its JetStream context, the streams created if absent. The
    relay and the follower reconnect themselves (the relay resumes from its cursor),
    so the client's own reconnect, which would hold publishes in a buffer, is off.
    (nats-py tries connecting max_reconnect_attempts times even without it.)"""
    nc = await nats.connect(
        url,
        allow_reconnect=False,
        max_reconnect_attempts=1,
        reconnect_time_wait=0.2,
        connect_timeout=5,
        error_cb=_log_error,
    )
    js = nc.jetstream()
    for name, subjects, max_age in (
        ("GRNS_EVT", "evt.>", None),
        ("GRNS_CMD", "cmd.>", COMMANDS_MAX_AGE_SECONDS),
        ("GRNS_DLQ", "dlq.>", None),
    ):
        try:
            await js.stream_info(names.stream(name))
        except NotFoundError:
            await js.add_stream(
                StreamConfig(
                    name=names.stream(name),
                    subjects=[names.subject(subjects)],
                    duplicate_window=DUPLICATE_WINDOW_SECONDS,
                    max_age=max_age,
                )
            )
    return nc, js


class JetStreamDispatchSource:
    """A worker's dispatch commands: one durable pull consumer per agent
    (``dispatch_<Agent>``), shared by every worker of that agent, each command going
    to one of them."""

    errors = JetStreamBridge.errors
    ack_wait_seconds = DISPATCH_ACK_WAIT_SECONDS

    def __init__(self, url: str, names: Names) -> None:
        self.url = url
        self.names = names
        self.nc: nats.NATS | None = None
        self._turn = 0

    async def connect(self, agents: list[str], prefetch: int) -> None:
        self.nc, js = await _connect(self.url, self.names)
        config = ConsumerConfig(
            ack_wait=DISPATCH_ACK_WAIT_SECONDS, max_ack_pending=DISPATCH_MAX_ACK_PENDING
        )
        self.subscriptions = [
            await js.pull_subscribe(
                self.names.subject(kind_for(agent)),
                durable="dispatch_" + kind_for(agent).split(".")[2],
                stream=self.names.stream("GRNS_CMD"),
                config=config,
            )
            for agent in agents
        ]

    async def next(self, limit: int) -> list[Delivery]:
        """Up to ``limit`` commands of one agent, taking the agents in turn (waiting
        at most a second in all when none has any)."""
        subscription = self.subscriptions[self._turn % len(self.subscriptions)]
        self._turn += 1
        try:
            messages = await subscription.fetch(batch=limit, timeout=1.0 / len(self.subscriptions))
        except TimeoutError:  # (nats-py's own, and a bare one: see consume_commands)
            return []
        return [
            Delivery(m.data, m.ack, lambda delay, m=m: m.nak(delay=delay), m.in_progress)
            for m in messages
        ]

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()


# What relay_events and runworker --dispatch take from this module (relay.brokers).
Bridge = JetStreamBridge
DispatchSource = JetStreamDispatchSource
