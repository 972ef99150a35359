"""The RabbitMQ bridge (seed 000 §10): events to the topic exchange ``grns.evt`` with
the kind as routing key, commands from queue ``grns.cmd.task.execute`` (bound on
``grns.cmd`` to ``task.execute.v1`` and ``cmd.task.execute.v1``), refused commands
to ``grns.dlq``; dispatch commands to ``grns.cmd`` with routing key
``agent.<Agent>.execute.v1``, into a durable queue ``grns.cmd.agent.<Agent>`` per agent,
and a worker's source of them. Publisher confirms on; everything durable and
persistent. Needs the ``amqp`` extra (aio-pika)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import aio_pika
import aiormq

from task_queue.event_stream import Envelope
from task_queue.relay.commands import dead_letter_body
from task_queue.relay.dispatch_commands import Dispatch, kind_for, queue_for, routing_key_for
from task_queue.relay.follower import Delivery
from task_queue.relay.names import COMMAND_KIND, Names, subject_for

PREFETCH = 8


class RabbitMQBridge:
    # What an unreachable or restarting broker raises: the relay reconnects. (An ack
    # or publish on a channel the broker closed raises ChannelInvalidStateError, a
    # RuntimeError.)
    errors = (
        aio_pika.exceptions.AMQPError,
        aiormq.exceptions.ChannelInvalidStateError,
        OSError,
        asyncio.TimeoutError,
    )

    def __init__(self, url: str, names: Names, *, confirm_timeout: float) -> None:
        self.url = url
        self.names = names
        self.confirm_timeout = confirm_timeout
        self.connection: aio_pika.abc.AbstractConnection | None = None

    async def connect(self) -> None:
        # Not connect_robust: the relay reconnects itself and resumes from its cursor.
        self.connection = await aio_pika.connect(self.url, timeout=5)
        self.channel = await self.connection.channel(publisher_confirms=True)
        declare = self.channel.declare_exchange
        topic = aio_pika.ExchangeType.TOPIC
        self.events = await declare(self.names.amqp("grns.evt"), topic, durable=True)
        self.commands = await declare(self.names.amqp("grns.cmd"), topic, durable=True)
        self.dead_letters = await declare(self.names.amqp("grns.dlq"), topic, durable=True)
        self._agent_queues: set[str] = set()

    async def publish(self, events: Sequence[Envelope]) -> None:
        """Publish in order; return once the broker confirmed every one (or raise).

        The publishes start in list order (asyncio runs new tasks first in, first out)
        and take the channel's lock, which is first in, first out, in that order. An
        event no queue is bound for is dropped by RabbitMQ, as any topic exchange
        does: bind a durable queue to ``evt.#`` before relaying."""
        confirms = [
            asyncio.ensure_future(
                self.events.publish(
                    aio_pika.Message(
                        event.to_json(),
                        message_id=str(event.message_id),
                        type=event.kind,
                        content_type="application/json",
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=subject_for(event.kind),
                )
            )
            for event in events
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*confirms), self.confirm_timeout)
        finally:
            for confirm in confirms:
                confirm.cancel()

    async def publish_commands(self, commands: Sequence[Dispatch]) -> None:
        """Publish dispatch commands, each agent's queue declared first (a command
        published before any worker of the agent started waits there); return once
        the broker confirmed every one."""
        for agent in sorted({c.agent for c in commands} - self._agent_queues):
            await _declare_agent_queue(self.channel, self.names, self.commands, agent)
            self._agent_queues.add(agent)
        confirms = []
        for command in commands:
            message_id = command.message_id
            message = aio_pika.Message(
                command.to_json(message_id),
                message_id=message_id,
                type=kind_for(command.agent),
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            publish = self.commands.publish(message, routing_key=routing_key_for(command.agent))
            confirms.append(asyncio.ensure_future(publish))
        try:
            await asyncio.wait_for(asyncio.gather(*confirms), self.confirm_timeout)
        finally:
            for confirm in confirms:
                confirm.cancel()

    async def consume_commands(
        self, handle: Callable[[bytes], Awaitable[str | None]], *, drain: bool
    ) -> None:
        """As JetStreamBridge.consume_commands; refused commands go to ``grns.dlq`` with
        routing key ``dlq.cmd.task.execute.v1`` and the reason in a header."""
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        queue = await channel.declare_queue(self.names.amqp("grns.cmd.task.execute"), durable=True)
        for key in ("task.execute.v1", COMMAND_KIND):
            await queue.bind(self.names.amqp("grns.cmd"), routing_key=key)
        if drain:
            while (message := await queue.get(fail=False)) is not None:
                await self._execute(message, handle)
            return
        async with queue.iterator() as messages:
            async for message in messages:
                await self._execute(message, handle)
        raise ConnectionError("the command queue's channel closed")

    async def _execute(
        self,
        message: aio_pika.abc.AbstractIncomingMessage,
        handle: Callable[[bytes], Awaitable[str | None]],
    ) -> None:
        refused = await handle(message.body)
        if refused is not None:
            await self.dead_letters.publish(
                aio_pika.Message(
                    dead_letter_body(message.body),
                    headers={"refused": refused[:1000]},
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key="dlq." + COMMAND_KIND,
            )
        await message.ack()

    async def close(self) -> None:
        if self.connection is not None and not self.connection.is_closed:
            await self.connection.close()


async def _declare_agent_queue(
    channel: aio_pika.abc.AbstractChannel,
    names: Names,
    exchange: aio_pika.abc.AbstractExchange,
    agent: str,
) -> aio_pika.abc.AbstractQueue:
    queue = await channel.declare_queue(names.amqp(queue_for(agent)), durable=True)
    await queue.bind(exchange, routing_key=routing_key_for(agent))
    return queue


class RabbitMQDispatchSource:
    """A worker's dispatch commands: it consumes each agent's queue, with at most
    ``prefetch`` (its concurrency) unacknowledged, so the broker sends no more than
    the worker can start. A task running longer than RabbitMQ's consumer_timeout (30
    minutes by default) makes the broker close the channel: the follower reconnects,
    and the commands it held are delivered again (their claims answer 409)."""

    errors = RabbitMQBridge.errors
    ack_wait_seconds = 60.0  # nothing to renew: in_progress does nothing

    def __init__(self, url: str, names: Names) -> None:
        self.url = url
        self.names = names
        self.connection: aio_pika.abc.AbstractConnection | None = None

    async def connect(self, agents: list[str], prefetch: int) -> None:
        self.connection = await aio_pika.connect(self.url, timeout=5)
        self.channel = channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=max(prefetch, 1))
        exchange = await channel.declare_exchange(
            self.names.amqp("grns.cmd"), aio_pika.ExchangeType.TOPIC, durable=True
        )
        self.inbox: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        for agent in agents:
            queue = await _declare_agent_queue(channel, self.names, exchange, agent)
            await queue.consume(self.inbox.put)

    async def next(self, limit: int) -> list[Delivery]:
        if self.connection is None or self.connection.is_closed or self.channel.is_closed:
            raise ConnectionError("the dispatch connection or channel closed")
        try:
            messages = [await asyncio.wait_for(self.inbox.get(), 1.0)]
        except TimeoutError:
            return []
        while len(messages) < limit and not self.inbox.empty():
            messages.append(self.inbox.get_nowait())
        return [Delivery(m.body, m.ack, _requeue_after(m), _nothing) for m in messages]

    async def close(self) -> None:
        if self.connection is not None and not self.connection.is_closed:
            await self.connection.close()


def _requeue_after(message: aio_pika.abc.AbstractIncomingMessage):
    async def requeue(delay: float) -> None:
        await asyncio.sleep(delay)  # AMQP has no delayed requeue: held that long
        await message.nack(requeue=True)

    return requeue


async def _nothing() -> None:
    return None


# What relay_events and runworker --dispatch take from this module (relay.brokers).
Bridge = RabbitMQBridge
DispatchSource = RabbitMQDispatchSource
