"""The RabbitMQ bridge (seed 000 §10): events to the topic exchange ``grns.evt`` with
the kind as routing key, commands from queue ``grns.cmd.task.execute`` (bound on
``grns.cmd`` to ``task.execute.v1`` and ``cmd.task.execute.v1``), refused commands
to ``grns.dlq``. Publisher confirms on; everything durable and persistent. Needs the
``amqp`` extra (aio-pika)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import aio_pika

from task_queue.event_stream import Envelope
from task_queue.relay.commands import dead_letter_body
from task_queue.relay.names import COMMAND_KIND, Names, subject_for

PREFETCH = 8


class RabbitMQBridge:
    # What an unreachable or restarting broker raises: the relay reconnects.
    errors = (aio_pika.exceptions.AMQPError, OSError, asyncio.TimeoutError)

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
