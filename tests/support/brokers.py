"""The real NATS JetStream and RabbitMQ on this machine, for the relay's and the
dispatch's tests: each test works under its own namespace (streams, subjects,
exchanges and queues), so runs sharing a broker do not see each other, and removes it
after. Tests skip with the reason when a broker or its client is absent."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import shutil
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

NATS_URL = "nats://127.0.0.1:4222"
NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
# The agents whose dispatch queues a RabbitMQ namespace may hold.
DISPATCH_AGENTS = ("EchoAgent", "SEOAgent")


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _needs(module: str, extra: str, port: int, broker: str) -> pytest.MarkDecorator:
    reason = None
    if importlib.util.find_spec(module) is None:
        reason = f"the {extra} extra is not installed (uv sync --extra {extra})"
    elif not listening(port):
        reason = f"no {broker} on 127.0.0.1:{port}"
    return pytest.mark.skipif(reason is not None, reason=reason or "")


needs_nats = _needs("nats", "nats", 4222, "NATS server")
needs_rabbitmq = _needs("aio_pika", "amqp", 5672, "RabbitMQ")


async def jetstream(work: Callable, url: str = NATS_URL) -> object:
    import nats

    nc = await nats.connect(url)
    try:
        return await work(nc.jetstream())
    finally:
        await nc.close()


def nats_messages(namespace: str, stream: str, url: str = NATS_URL) -> list:
    """Every message in the namespace's stream, in stream order."""
    from nats.js.api import AckPolicy, ConsumerConfig

    async def read(js) -> list:
        name = f"{namespace}_{stream}"
        count = (await js.stream_info(name)).state.messages
        subscription = await js.pull_subscribe(
            f"{namespace}.>", stream=name, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
        )
        messages = []
        while len(messages) < count:
            messages += await subscription.fetch(batch=min(500, count - len(messages)), timeout=5)
        return messages

    return asyncio.run(jetstream(read, url))


@pytest.fixture
def nats_namespace() -> Iterator[str]:
    namespace = f"t{uuid.uuid4().hex[:10]}"
    yield namespace

    async def remove(js) -> None:
        for stream in ("GRNS_EVT", "GRNS_CMD", "GRNS_DLQ"):
            with contextlib.suppress(NotFoundError):  # a stream the test never made
                await js.delete_stream(f"{namespace}_{stream}")

    from nats.js.errors import NotFoundError

    asyncio.run(jetstream(remove))


async def rabbitmq(work: Callable) -> object:
    import aio_pika

    connection = await aio_pika.connect(AMQP_URL)
    try:
        return await work(await connection.channel())
    finally:
        await connection.close()


def rabbitmq_queue(namespace: str, exchange: str, binding: str) -> str:
    """A queue bound to the namespace's exchange before the relay publishes."""
    import aio_pika

    name = f"{namespace}.observe.{exchange}"

    async def declare(channel) -> None:
        source = await channel.declare_exchange(
            f"{namespace}.{exchange}", aio_pika.ExchangeType.TOPIC, durable=True
        )
        queue = await channel.declare_queue(name, durable=True)
        await queue.bind(source, routing_key=binding)

    asyncio.run(rabbitmq(declare))
    return name


def rabbitmq_messages(queue_name: str) -> list:
    async def drain(channel) -> list:
        queue = await channel.get_queue(queue_name)
        messages = []
        while (message := await queue.get(fail=False)) is not None:
            await message.ack()
            messages.append(message)
        return messages

    return asyncio.run(rabbitmq(drain))


@pytest.fixture
def rabbitmq_namespace() -> Iterator[str]:
    namespace = f"t{uuid.uuid4().hex[:10]}"
    yield namespace

    async def remove(channel) -> None:
        queues = ["observe.grns.evt", "observe.grns.dlq", "observe.grns.cmd"]
        queues += ["grns.cmd.task.execute"] + [f"grns.cmd.agent.{a}" for a in DISPATCH_AGENTS]
        for queue in queues:
            await channel.queue_delete(f"{namespace}.{queue}")
        for exchange in ("grns.evt", "grns.cmd", "grns.dlq"):
            await channel.exchange_delete(f"{namespace}.{exchange}")

    asyncio.run(rabbitmq(remove))


def start_nats_server(port: int, store: Path) -> subprocess.Popen:
    """A NATS server with JetStream of a test's own (to kill and start again, while the
    shared one stays up), listening once this returns."""
    from tests.support.waiting import wait_for

    server = subprocess.Popen(
        [NATS_SERVER, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: listening(port), what="nats-server to listen")
    return server
