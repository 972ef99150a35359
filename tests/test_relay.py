"""relay_events against the real NATS JetStream and RabbitMQ on this machine.

Each test works under its own namespace (streams, subjects and exchanges), so runs
sharing a broker do not see each other, and removes it after.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from task_queue import operations
from task_queue.models import EventRelayCursor, OutboxEvent, Task
from task_queue.relay.names import destination_key
from tests.support.brokers import (
    AMQP_URL,
    NATS_SERVER,
    NATS_URL,
    jetstream,
    nats_messages,
    needs_nats,
    needs_rabbitmq,
    rabbitmq,
    rabbitmq_messages,
    rabbitmq_queue,
    start_nats_server,
)
from tests.support.processes import ManageProcess, manage_env, run_manage
from tests.support.queue import complete_pending
from tests.support.server import free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def relays(manage_processes) -> Callable[..., ManageProcess]:
    """``relay_events --to URL --namespace NS ...`` subprocesses."""

    def start(url: str, namespace: str, *args: str) -> ManageProcess:
        return manage_processes("relay_events", "--to", url, "--namespace", namespace, *args)

    return start


def make_events(tasks: int) -> list[str]:
    """``tasks`` tasks run to completion (created, claimed, started, completed), and a
    message."""
    ids = operations.enqueue_many(
        [operations.TaskSpec("EchoAgent", "echo", {"n": n}) for n in range(tasks)]
    )
    complete_pending("EchoAgent")
    from agents_app import messaging

    messaging.send("Planner", "Pricer", "notification", {"hello": 1})
    return [str(t.id) for t in ids]


def cursor_at(url: str, namespace: str) -> int:
    cursor = EventRelayCursor.objects.filter(destination=destination_key(url, namespace)).first()
    return cursor.position if cursor else 0


def check_delivery(bodies: list[bytes]) -> None:
    """Every event of the outbox arrived at least once, and each subject's events (a
    task's, a message's) arrived in position order."""
    received = [json.loads(body) for body in bodies]
    expected = dict(OutboxEvent.objects.values_list("message_id", "position"))
    assert {uuid.UUID(e["message_id"]) for e in received} == set(expected)
    first_seen: dict[str, dict] = {}
    for event in received:
        first_seen.setdefault(event["message_id"], event)
    by_subject: dict[str, list[int]] = {}
    for event in first_seen.values():
        subject = event["payload"].get("task_id") or event["payload"].get("message_id")
        by_subject.setdefault(subject, []).append(event["position"])
    assert all(positions == sorted(positions) for positions in by_subject.values())
    assert all(e["position"] == expected[uuid.UUID(e["message_id"])] for e in received)


def kill_mid_stream_and_restart(relays, url: str, namespace: str) -> ManageProcess:
    """Relay in small batches, SIGKILL the relay part-way, restart it, and wait until
    it has relayed everything; returns the running second relay."""
    make_events(300)
    total = OutboxEvent.objects.count()
    first = relays(url, namespace, "--batch", "10")
    wait_for(lambda: cursor_at(url, namespace) >= 200, timeout=60, what="200 events relayed")
    first.kill()
    assert cursor_at(url, namespace) < total, "killed after the end: not mid-stream"
    second = relays(url, namespace, "--batch", "50")
    wait_for(lambda: cursor_at(url, namespace) >= total, timeout=60, what="the rest relayed")
    more = make_events(20)  # live events after the restart go out too
    wait_for(
        lambda: cursor_at(url, namespace) >= OutboxEvent.objects.count(),
        timeout=60,
        what="live events relayed",
    )
    assert Task.objects.filter(id__in=more, status="completed").count() == 20
    return second


def command(message_id: str, **payload) -> bytes:
    return json.dumps(
        {"schema_version": "v1", "message_id": message_id, "trace_id": "tr-cmd",
         "causation_id": None, "kind": "cmd.task.execute.v1",
         "emitted_at": "2026-11-23T00:00:00Z", "payload": payload}
    ).encode()  # fmt: skip


def check_commands_executed(message_id: str) -> None:
    [task] = Task.objects.filter(idempotency_key=f"cmd:{message_id}")
    assert (task.agent_name, task.payload, task.trace_id) == ("EchoAgent", {"n": 7}, "tr-cmd")
    created = OutboxEvent.objects.get(kind="evt.task.created.v1", subject_id=str(task.id))
    assert created.causation_id == message_id


# ---------------------------------------------------------------- NATS JetStream


@pytest.mark.slow
@needs_nats
def test_nats_relay_killed_mid_stream_delivers_every_event_in_order(relays, nats_namespace):
    second = kill_mid_stream_and_restart(relays, NATS_URL, nats_namespace)
    second.signal(signal.SIGTERM)
    assert second.wait() == 0, second.log()
    messages = nats_messages(nats_namespace, "GRNS_EVT")
    check_delivery([m.data for m in messages])
    assert {m.subject.split(".", 1)[1] for m in messages} >= {
        "evt.task.created.v1", "evt.task.claimed.v1", "evt.task.completed.v1",
        "evt.message.sent.v1",
    }  # fmt: skip
    assert all(m.headers["Nats-Msg-Id"] == json.loads(m.data)["message_id"] for m in messages)


@needs_nats
def test_nats_commands_become_tasks_once(relays, nats_namespace):
    async def send(js) -> None:
        await js.add_stream(name=f"{nats_namespace}_GRNS_CMD", subjects=[f"{nats_namespace}.cmd.>"])
        subject = f"{nats_namespace}.cmd.task.execute.v1"
        good = command("cmd-1", target_agent_type="EchoAgent", task_type="echo", payload={"n": 7})
        await js.publish(subject, good)
        await js.publish(subject, good)  # redelivered: no second task
        await js.publish(subject, command("cmd-2", target_agent_type="Nobody", task_type="x"))

    asyncio.run(jetstream(send))
    relay = relays(NATS_URL, nats_namespace, "--once", "--consume-commands")
    assert relay.wait() == 0, relay.log()
    check_commands_executed("cmd-1")
    assert not Task.objects.filter(idempotency_key="cmd:cmd-2").exists()
    [refused] = nats_messages(nats_namespace, "GRNS_DLQ")
    assert json.loads(refused.data)["message_id"] == "cmd-2"
    assert "unknown agent 'Nobody'" in refused.headers["Refused"]


def poison_commands() -> list[tuple[bytes, str]]:
    """Bodies that once stopped the relay (issue 14, finding 1), each with what its
    refusal says."""
    huge_number = command("cmd-big", target_agent_type="EchoAgent", task_type="echo")
    huge_number = huge_number.replace(b'"task_type": "echo"', b'"task_type": "echo", '
                                      b'"delay_seconds": 1' + b"0" * 400)  # fmt: skip
    return [
        (b"[" * 100_000, "nested too deeply"),
        (huge_number, "OverflowError"),
        (b'{"kind": "cmd.task.execute.v1", "message_id": "\xff\xfe"}', "not UTF-8"),
    ]


@needs_nats
def test_nats_poison_commands_go_to_the_dead_letters_and_the_relay_carries_on(
    relays, nats_namespace
):
    poison = poison_commands()

    async def send(js) -> None:
        await js.add_stream(name=f"{nats_namespace}_GRNS_CMD", subjects=[f"{nats_namespace}.cmd.>"])
        subject = f"{nats_namespace}.cmd.task.execute.v1"
        for body, _ in poison:
            await js.publish(subject, body)
        good = command("cmd-1", target_agent_type="EchoAgent", task_type="echo", payload={"n": 7})
        await js.publish(subject, good)

    asyncio.run(jetstream(send))
    make_events(3)  # events to relay while the poison is refused
    before = set(OutboxEvent.objects.values_list("message_id", flat=True))
    relay = relays(NATS_URL, nats_namespace, "--once", "--consume-commands")
    assert relay.wait() == 0, relay.log()
    assert "Traceback" not in relay.log()
    check_commands_executed("cmd-1")
    refused = nats_messages(nats_namespace, "GRNS_DLQ")
    assert [m.data for m in refused] == [body[: 64 * 1024] for body, _ in poison]
    for message, (_, reason) in zip(refused, poison, strict=True):
        assert reason in message.headers["Refused"]
    # Every event written before the relay started was relayed despite the poison.
    relayed = {uuid.UUID(json.loads(m.data)["message_id"]) for m in nats_messages(
        nats_namespace, "GRNS_EVT"
    )}  # fmt: skip
    assert before and before <= relayed


# ---------------------------------------------------------------- RabbitMQ


@pytest.mark.slow
@needs_rabbitmq
def test_rabbitmq_relay_killed_mid_stream_delivers_every_event_in_order(relays, rabbitmq_namespace):
    observed = rabbitmq_queue(rabbitmq_namespace, "grns.evt", "evt.#")
    second = kill_mid_stream_and_restart(relays, AMQP_URL, rabbitmq_namespace)
    second.signal(signal.SIGTERM)
    assert second.wait() == 0, second.log()
    messages = rabbitmq_messages(observed)
    check_delivery([m.body for m in messages])
    assert all(m.routing_key == json.loads(m.body)["kind"] for m in messages)
    assert all(m.message_id == json.loads(m.body)["message_id"] for m in messages)


@needs_rabbitmq
def test_rabbitmq_commands_become_tasks_once(relays, rabbitmq_namespace):
    import aio_pika

    refused_queue = rabbitmq_queue(rabbitmq_namespace, "grns.dlq", "dlq.#")
    # The relay declares and binds its command queue; the commands wait there.
    setup = relays(AMQP_URL, rabbitmq_namespace, "--once", "--consume-commands")
    assert setup.wait() == 0, setup.log()

    async def send(channel) -> None:
        exchange = await channel.get_exchange(f"{rabbitmq_namespace}.grns.cmd")
        good = command("cmd-1", target_agent_type="EchoAgent", task_type="echo", payload={"n": 7})
        for body, key in (
            (good, "task.execute.v1"),
            (good, "cmd.task.execute.v1"),  # redelivered: no second task
            (b"not json", "cmd.task.execute.v1"),
        ):
            await exchange.publish(aio_pika.Message(body), routing_key=key)

    asyncio.run(rabbitmq(send))
    relay = relays(AMQP_URL, rabbitmq_namespace, "--once", "--consume-commands")
    assert relay.wait() == 0, relay.log()
    check_commands_executed("cmd-1")
    [refused] = rabbitmq_messages(refused_queue)
    assert refused.body == b"not json" and "body: not JSON" in refused.headers["refused"]


@needs_rabbitmq
def test_rabbitmq_poison_commands_go_to_the_dead_letters_and_the_relay_carries_on(
    relays, rabbitmq_namespace, settings
):
    import aio_pika

    refused_queue = rabbitmq_queue(rabbitmq_namespace, "grns.dlq", "dlq.#")
    setup = relays(AMQP_URL, rabbitmq_namespace, "--once", "--consume-commands")
    assert setup.wait() == 0, setup.log()
    # Many MiB: refused unread, its dead letter only the first 64 KiB.
    oversized = b"x" * (settings.QUEUE_MAX_PAYLOAD_BYTES + 128 * 1024)
    poison = [*poison_commands(), (oversized, "bytes, more than")]

    async def send(channel) -> None:
        exchange = await channel.get_exchange(f"{rabbitmq_namespace}.grns.cmd")
        for body, _ in poison:
            await exchange.publish(aio_pika.Message(body), routing_key="cmd.task.execute.v1")
        good = command("cmd-1", target_agent_type="EchoAgent", task_type="echo", payload={"n": 7})
        await exchange.publish(aio_pika.Message(good), routing_key="cmd.task.execute.v1")

    asyncio.run(rabbitmq(send))
    relay = relays(AMQP_URL, rabbitmq_namespace, "--once", "--consume-commands")
    assert relay.wait() == 0, relay.log()
    assert "Traceback" not in relay.log()
    check_commands_executed("cmd-1")
    refused = rabbitmq_messages(refused_queue)
    assert len(refused) == len(poison)
    for message, (body, reason) in zip(refused, poison, strict=True):
        assert message.body == body[: 64 * 1024]
        assert reason in message.headers["refused"]


def test_relay_refuses_a_bad_destination(relays):
    bad = relays("kafka://127.0.0.1:9092", "x", "--once")
    assert bad.wait() == 1
    assert (
        bad.log()
        .strip()
        .endswith("--to: expected nats://… or amqp://…, got 'kafka://127.0.0.1:9092'")
    )


@pytest.mark.skipif(importlib.util.find_spec("nats") is None, reason="the nats extra is absent")
def test_relay_once_exits_with_the_reason_when_the_broker_is_unreachable(relays):
    down = relays(f"nats://127.0.0.1:{free_port()}", "x", "--once")
    assert down.wait() == 1
    assert "NoServersError" in down.log().strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("nats") is None or not Path(NATS_SERVER).exists(),
    reason="needs the nats extra and the nats-server binary",
)
def test_relay_rides_out_a_broker_restart(relays, tmp_path):
    """A NATS server of the test's own (so the shared one stays up) is killed while
    the relay is mid-stream, events keep coming, and it starts again: the relay
    reconnects, resumes from its cursor, and every event arrives, in order."""
    port = free_port()
    url = f"nats://127.0.0.1:{port}"

    server = start_nats_server(port, tmp_path / "js")
    try:
        make_events(300)
        relay = relays(url, "restart", "--batch", "10")
        wait_for(lambda: cursor_at(url, "restart") >= 100, timeout=60, what="100 relayed")
        server.kill()
        server.wait()
        make_events(50)  # while the broker is down
        wait_for(lambda: "broker unavailable" in relay.log(), what="the relay to notice")
        server = start_nats_server(port, tmp_path / "js")
        wait_for(
            lambda: cursor_at(url, "restart") >= OutboxEvent.objects.count(),
            timeout=60,
            what="everything relayed after the restart",
        )
        assert "broker back after" in relay.log()
        relay.signal(signal.SIGTERM)
        assert relay.wait() == 0, relay.log()
        check_delivery([m.data for m in nats_messages("restart", "GRNS_EVT", url)])
    finally:
        server.kill()
        server.wait()


@pytest.mark.slow
@needs_nats
def test_one_relay_per_destination(relays, nats_namespace):
    running = relays(NATS_URL, nats_namespace)
    wait_for(
        lambda: EventRelayCursor.objects.filter(
            destination=destination_key(NATS_URL, nats_namespace)
        ).exists(),
        what="the first relay to start",
    )
    second = relays(NATS_URL, nats_namespace, "--once")
    assert second.wait() == 1
    assert f"another relay_events is relaying to nats://127.0.0.1:4222#{nats_namespace}" in (
        second.log()
    )
    running.signal(signal.SIGTERM)
    assert running.wait() == 0


@needs_nats
def test_the_destination_can_come_from_the_environment_not_the_command_line(nats_namespace):
    """Issue 14, finding 9: a broker URL may carry a password, which ps would show."""
    env = manage_env() | {"AUTOMECHANICA_RELAY_TO": NATS_URL}
    done = run_manage("relay_events", "--once", "--namespace", nats_namespace, env=env)
    assert done.returncode == 0, done.stderr
    key = destination_key(NATS_URL, nats_namespace)
    assert EventRelayCursor.objects.filter(destination=key).exists()


def test_relay_without_a_destination_says_how_to_give_one():
    done = run_manage("relay_events", "--once")
    assert done.returncode == 1
    assert done.stderr.strip().endswith(
        "a destination is needed: --to URL or $AUTOMECHANICA_RELAY_TO"
    )
