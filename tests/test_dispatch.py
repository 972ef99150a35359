"""Broker-dispatched execution (issue 34 §2) against the real NATS JetStream and
RabbitMQ on this machine: ``relay_events --dispatch`` publishes a
``cmd.agent.<Agent>.execute.v1`` command for each task that becomes due, and
``runworker AGENT --dispatch URL`` claims the named task, acknowledging the command
once the outcome is committed. Each test works under its own namespace."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from agents_app.models import AgentEvent, EmbeddingJob
from task_queue import operations, reaper
from task_queue.models import Task, TaskHistory
from task_queue.relay.dispatch_commands import Dispatch
from task_queue.sql import leasing
from task_queue.sql import outcomes as outcomes_sql
from tests.support.brokers import (
    AMQP_URL,
    NATS_URL,
    jetstream,
    listening,
    nats_messages,
    needs_nats,
    needs_rabbitmq,
    rabbitmq,
    rabbitmq_messages,
    rabbitmq_queue,
)
from tests.support.processes import run_manage
from tests.support.queue import OWNER, make_failed
from tests.support.server import free_port
from tests.support.waiting import wait_for
from tests.test_relay import NATS_SERVER, cursor_at

pytestmark = pytest.mark.django_db(transaction=True)

# No republishing unless a test asks for it: each due task gets one command.
QUIET = {"QUEUE_DISPATCH_REPUBLISH_SECONDS": "3600"}


def nats_commands(namespace: str) -> list:
    """The dispatch commands in the namespace's GRNS_CMD, in stream order (none before
    the relay made the stream)."""
    from nats.js.errors import NotFoundError

    try:
        messages = nats_messages(namespace, "GRNS_CMD")
    except NotFoundError:
        return []
    return [m for m in messages if ".cmd.agent." in m.subject]


def commands_by_task(messages: list) -> dict[str, list[dict]]:
    by_task: dict[str, list[dict]] = {}
    for message in messages:
        envelope = json.loads(message.data)
        by_task.setdefault(envelope["payload"]["task_id"], []).append(envelope)
    return by_task


def enqueue(agent: str, task_type: str, payload: dict, **options) -> Task:
    return Task.objects.get(id=operations.enqueue(agent, task_type, payload, **options).id)


def claim(task: Task, lease_seconds: float = 30) -> leasing.ClaimedTask:
    claimed = leasing.claim_task(
        owner=OWNER, task_id=task.id, agent=task.agent_name, lease_seconds=lease_seconds, now=None
    )
    assert claimed is not None
    return claimed


def tasks_becoming_due_every_way() -> dict[str, tuple[Task, str]]:
    """One EchoAgent task for each way a task becomes due, with the reason its command
    must give; and a task of a paused agent, which must get none."""
    revived = Task.objects.get(id=make_failed([{"way": "revived"}])[0])
    operations.revive([revived.id], actor="test")
    retried = enqueue("EchoAgent", "echo", {"way": "retry"})
    held = claim(retried)
    error = json.dumps({"type": "Boom", "message": "boom", "retryable": True})
    outcomes_sql.fail_tasks(
        owner=OWNER, failures=[(held.id, held.lease_token, True, 0.0, error)], now=None
    )
    expired = enqueue("EchoAgent", "echo", {"way": "expired"})
    claim(expired)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
            [expired.id],
        )
    reaper.reap_expired_leases()
    new = enqueue("EchoAgent", "echo", {"way": "new"})
    soon = enqueue("EchoAgent", "echo", {"way": "soon"}, delay_seconds=2)
    # Enqueued two hours ago to run in two hours and two seconds: the scan's, not an event's.
    late = enqueue("EchoAgent", "echo", {"way": "late"}, delay_seconds=3600)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks SET updated_at = now() - interval '2 hours', "
            "available_at = now() + interval '2 seconds' WHERE id = %s",
            [late.id],
        )
    operations.pause_agent("SEOAgent", actor="test")
    paused = enqueue("SEOAgent", "generate_seo", {"way": "paused"})
    return {
        "revived": (revived, "revived"),
        "retry": (retried, "retry_due"),
        "expired": (expired, "lease_expired"),
        "new": (new, "new_task"),
        "soon": (soon, "new_task"),
        "late": (late, "new_task"),
        "paused": (paused, ""),
    }


@needs_nats
@pytest.mark.slow
def test_nats_relay_dispatches_each_task_as_it_becomes_due_and_never_a_paused_agents(
    manage_processes, nats_namespace
):
    ways = tasks_becoming_due_every_way()
    tasks_before = Task.objects.count()
    manage_processes(
        "relay_events", "--to", NATS_URL, "--namespace", nats_namespace, "--dispatch",
        "--consume-commands", env=QUIET,
    )  # fmt: skip
    expected = {str(task.id) for way, (task, _) in ways.items() if way != "paused"}
    wait_for(
        lambda: expected <= set(commands_by_task(nats_commands(nats_namespace))),
        timeout=30,
        what="a command for every task",
    )
    messages = nats_commands(nats_namespace)
    by_task = commands_by_task(messages)
    assert str(ways["paused"][0].id) not in by_task
    for way, (task, reason) in ways.items():
        if way == "paused":
            continue
        [command] = by_task[str(task.id)]  # one each
        task.refresh_from_db()
        assert command["kind"] == "cmd.agent.EchoAgent.execute.v1", way
        assert command["payload"] == {
            "task_id": str(task.id), "target_agent_type": "EchoAgent", "reason": reason,
        }, way  # fmt: skip
        assert command["trace_id"] == task.trace_id
    for message in messages:
        envelope = json.loads(message.data)
        assert message.subject == f"{nats_namespace}.{envelope['kind']}"
        assert message.headers["Nats-Msg-Id"] == envelope["message_id"]
        due_at = Task.objects.get(id=envelope["payload"]["task_id"]).available_at
        assert message.metadata.timestamp >= due_at  # not before it was due
    # The relay also consumes cmd.task.execute.v1: a dispatched command never became a
    # task, nor a dead letter.
    assert Task.objects.count() == tasks_before
    assert nats_messages(nats_namespace, "GRNS_DLQ") == []
    # Once its agent is resumed, the paused agent's task gets its command.
    paused = ways["paused"][0]
    operations.resume_agent("SEOAgent", actor="test")
    [command] = wait_for(
        lambda: commands_by_task(nats_commands(nats_namespace)).get(str(paused.id)),
        what="the resumed agent's command",
    )
    assert command["kind"] == "cmd.agent.SEOAgent.execute.v1"
    assert command["payload"]["reason"] == "new_task"


async def _consumer(js, namespace: str, agent: str = "EchoAgent"):
    return await js.consumer_info(f"{namespace}_GRNS_CMD", f"dispatch_{agent}")


def consumer_state(namespace: str) -> tuple[int, int]:
    """(commands not yet delivered, commands delivered and not acknowledged) of the
    agent's durable consumer."""
    info = asyncio.run(jetstream(lambda js: _consumer(js, namespace)))
    return info.num_pending, info.num_ack_pending


def nats_publish(namespace: str, bodies: list[bytes]) -> None:
    async def publish(js) -> None:
        for body in bodies:
            await js.publish(f"{namespace}.cmd.agent.EchoAgent.execute.v1", body)

    asyncio.run(jetstream(publish))


def garbage_commands(other_agent_task: Task) -> list[bytes]:
    return [
        b"\xff\xfe not UTF-8",
        b"[" * 100_000,
        b"{" + b'"x": 1, ' * 10_000 + b'"y": 2}',
        json.dumps({"payload": {"task_id": "nope", "target_agent_type": "EchoAgent"}}).encode(),
        json.dumps(
            {"payload": {"task_id": str(uuid.uuid4()), "target_agent_type": "EchoAgent"}}
        ).encode(),
        json.dumps(
            {"payload": {"task_id": str(other_agent_task.id), "target_agent_type": "SEOAgent"}}
        ).encode(),
    ]


def check_completed_once(ids: list) -> None:
    completed = TaskHistory.objects.filter(task_id__in=ids, event="completed")
    assert Counter(completed.values_list("task_id", flat=True)) == Counter(ids)
    events = AgentEvent.objects.filter(task_id__in=ids).values_list("task_id", flat=True)
    assert Counter(events) == Counter(ids)
    assert EmbeddingJob.objects.filter(agent_event__task_id__in=ids).count() == len(ids)


def duplicate(task: Task) -> bytes:
    """Another command for the task, with a message id of its own (JetStream keeps it)."""
    dispatch = Dispatch(task.id, "EchoAgent", "new_task", 0, timezone.now(), None, True)
    return dispatch.to_json(str(uuid.uuid4()))


@needs_nats
@pytest.mark.slow
def test_nats_dispatched_workers_run_every_task_once_through_duplicates_and_garbage(
    manage_processes, nats_namespace
):
    seo = enqueue("SEOAgent", "generate_seo", {})
    tasks = [enqueue("EchoAgent", "echo", {"sleep_ms": 20}) for _ in range(40)]
    slow = enqueue("EchoAgent", "echo", {"sleep_ms": 3000})
    ns = ["--namespace", nats_namespace]
    manage_processes("relay_events", "--to", NATS_URL, *ns, "--dispatch", env=QUIET)
    # --poll 3600: the workers' own claim (the fallback) stays out of the way.
    for _ in range(2):
        manage_processes(
            "runworker", "EchoAgent", "--dispatch", NATS_URL, *ns, "--poll", "3600",
            "--concurrency", "4", env=QUIET,
        )  # fmt: skip
    wait_for(
        lambda: Task.objects.filter(id=slow.id, status="running").exists(),
        timeout=60,
        what="the slow task to run",
    )
    # Its command is unacknowledged while it runs (renewed by in-progress) ...
    assert consumer_state(nats_namespace)[1] >= 1
    nats_publish(nats_namespace, garbage_commands(seo) + [duplicate(t) for t in tasks])
    ids = [t.id for t in [*tasks, slow]]
    wait_for(
        lambda: Task.objects.filter(id__in=ids, status="completed").count() == len(ids),
        timeout=90,
        what="every task completed",
    )
    # ... and every command, duplicate and garbage is acknowledged in the end.
    wait_for(lambda: consumer_state(nats_namespace) == (0, 0), what="every command acked")
    check_completed_once(ids)
    assert Task.objects.get(id=seo.id).status == "pending"  # not the worker's agent


@needs_nats
@pytest.mark.slow
def test_nats_a_lost_command_is_covered_by_the_workers_claim_and_by_republishing(
    manage_processes, nats_namespace
):
    ns = ["--namespace", nats_namespace]
    # No relay at all: the worker's own claim, at its poll interval, takes the task.
    orphan = enqueue("EchoAgent", "echo", {})
    worker = manage_processes(
        "runworker", "EchoAgent", "--dispatch", NATS_URL, *ns, "--poll", "0.5"
    )
    wait_for(lambda: Task.objects.get(id=orphan.id).status == "completed", timeout=60)
    worker.stop()
    # A command the broker lost: published again once the task stayed due a second.
    lost = enqueue("EchoAgent", "echo", {"lost": True})
    manage_processes(
        "relay_events", "--to", NATS_URL, *ns, "--dispatch",
        env={"QUEUE_DISPATCH_REPUBLISH_SECONDS": "1"},
    )  # fmt: skip
    first = wait_for(
        lambda: commands_by_task(nats_commands(nats_namespace)).get(str(lost.id)),
        what="the command",
    )[0]

    async def lose(js) -> None:
        stream = f"{nats_namespace}_GRNS_CMD"
        info = await js.stream_info(stream)
        for sequence in range(info.state.first_seq, info.state.last_seq + 1):
            await js.delete_msg(stream, sequence)

    asyncio.run(jetstream(lose))
    again = wait_for(
        lambda: commands_by_task(nats_commands(nats_namespace)).get(str(lost.id)),
        what="the command published again",
    )[0]
    assert again["message_id"] != first["message_id"]
    assert again["payload"] == first["payload"]
    manage_processes(
        "runworker", "EchoAgent", "--dispatch", NATS_URL, *ns, "--poll", "3600", env=QUIET
    )
    wait_for(lambda: Task.objects.get(id=lost.id).status == "completed", timeout=60)
    check_completed_once([orphan.id, lost.id])


@needs_rabbitmq
@pytest.mark.slow
def test_rabbitmq_dispatch_runs_every_task_once_and_never_becomes_a_task(
    manage_processes, rabbitmq_namespace
):
    import aio_pika

    observed = rabbitmq_queue(rabbitmq_namespace, "grns.cmd", "agent.#")
    operations.pause_agent("SEOAgent", actor="test")
    seo = enqueue("SEOAgent", "generate_seo", {})
    tasks = [enqueue("EchoAgent", "echo", {"sleep_ms": 20}) for _ in range(30)]
    tasks_before = Task.objects.count()
    ns = ["--namespace", rabbitmq_namespace]
    manage_processes(
        "relay_events", "--to", AMQP_URL, *ns, "--dispatch", "--consume-commands", env=QUIET
    )
    ids = [t.id for t in tasks]

    def queued() -> int | None:
        """Commands waiting in the agent's queue (None before the relay declared it)."""

        async def count(channel) -> int:
            queue = await channel.declare_queue(
                f"{rabbitmq_namespace}.grns.cmd.agent.EchoAgent", durable=True, passive=True
            )
            return queue.declaration_result.message_count

        try:
            return asyncio.run(rabbitmq(count))
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return None

    wait_for(lambda: queued() == len(ids), what="a command per task in the agent's queue")

    async def publish(channel) -> None:
        exchange = await channel.get_exchange(f"{rabbitmq_namespace}.grns.cmd")
        for body in garbage_commands(seo) + [duplicate(t) for t in tasks]:
            await exchange.publish(aio_pika.Message(body), "agent.EchoAgent.execute.v1")

    asyncio.run(rabbitmq(publish))
    for _ in range(2):
        manage_processes(
            "runworker", "EchoAgent", "--dispatch", AMQP_URL, *ns, "--poll", "3600",
            "--concurrency", "4", env=QUIET,
        )  # fmt: skip
    wait_for(
        lambda: Task.objects.filter(id__in=ids, status="completed").count() == len(ids),
        timeout=90,
        what="every task completed",
    )
    wait_for(lambda: queued() == 0, what="every command acknowledged")
    check_completed_once(ids)
    assert Task.objects.count() == tasks_before  # no command became a task
    assert Task.objects.get(id=seo.id).status == "pending"
    # What the relay routed (the test's own duplicates and garbage have no type).
    relayed = [m for m in rabbitmq_messages(observed) if m.type]
    assert {m.type for m in relayed} == {"cmd.agent.EchoAgent.execute.v1"}
    envelopes = [json.loads(m.body) for m in relayed]
    assert sorted(e["payload"]["task_id"] for e in envelopes) == sorted(str(i) for i in ids)
    assert {e["payload"]["reason"] for e in envelopes} == {"new_task"}
    assert all(m.message_id == e["message_id"] for m, e in zip(relayed, envelopes, strict=True))


def test_runworker_dispatch_refuses_a_bad_url_or_namespace_in_one_line():
    for args, reason in (
        (["--dispatch", "ftp://host/"], "--dispatch: expected nats://… or amqp://…"),
        (["--dispatch", NATS_URL, "--namespace", "a.b"], "--namespace: letters, digits"),
    ):
        result = run_manage("runworker", "EchoAgent", *args)
        assert result.returncode != 0
        assert reason in result.stderr
        assert "Traceback" not in result.stderr


def test_a_dispatch_command_is_built_and_read_back():
    from task_queue.relay.dispatch_commands import InvalidDispatch, parse

    task_id = uuid.uuid4()
    due = timezone.now() - timedelta(seconds=1)
    command = Dispatch(task_id, "EchoAgent", "retry_due", 2, due, "tr")
    assert command.message_id == Dispatch(task_id, "EchoAgent", "new_task", 2, due, None).message_id
    assert parse(command.to_json(command.message_id), frozenset({"EchoAgent"})) == (
        task_id,
        "EchoAgent",
    )
    with pytest.raises(InvalidDispatch, match="target_agent_type"):
        parse(command.to_json("x"), frozenset({"SEOAgent"}))
    with pytest.raises(InvalidDispatch, match="bytes"):
        parse(b" " * 20_000, frozenset({"EchoAgent"}))


@needs_nats
@pytest.mark.slow
def test_nats_a_relay_killed_while_a_task_waits_to_fall_due_dispatches_it_after_its_restart(
    manage_processes, nats_namespace
):
    from task_queue.event_stream import head

    soon = enqueue("EchoAgent", "echo", {"way": "soon"}, delay_seconds=8)
    late = enqueue("EchoAgent", "echo", {"way": "late"}, delay_seconds=3600)
    with connection.cursor() as cursor:  # the scan's: enqueued two hours before it is due
        cursor.execute(
            "UPDATE tasks SET updated_at = now() - interval '2 hours', "
            "available_at = now() + interval '8 seconds' WHERE id = %s",
            [late.id],
        )
    ns = ["--namespace", nats_namespace]
    relay = manage_processes("relay_events", "--to", NATS_URL, *ns, "--dispatch", env=QUIET)
    last = head()
    wait_for(lambda: cursor_at(NATS_URL, nats_namespace) >= last, what="the events relayed")
    relay.kill()  # soon waits in the relay's memory; late's due time not scanned yet
    assert nats_commands(nats_namespace) == []
    manage_processes("relay_events", "--to", NATS_URL, *ns, "--dispatch", env=QUIET)
    by_task = wait_for(
        lambda: (
            (found := commands_by_task(nats_commands(nats_namespace))).keys()
            >= {str(soon.id), str(late.id)}
            and found
        ),
        what="both commands after the restart",
    )
    assert [len(by_task[str(t.id)]) for t in (soon, late)] == [1, 1]


@needs_nats
@pytest.mark.slow
def test_nats_dispatched_workers_killed_mid_task_leave_every_task_completed_once(
    manage_processes, nats_namespace
):
    """SIGKILL a dispatched worker while it runs tasks: their commands stay
    unacknowledged, the reaper gives the tasks back, the relay dispatches them again
    (lease_expired), and the other worker runs them; the old commands, delivered again,
    get a 409 and are acknowledged."""
    tasks = [enqueue("EchoAgent", "echo", {"sleep_ms": 1500}) for _ in range(6)]
    ids = [t.id for t in tasks]
    ns = ["--namespace", nats_namespace]
    manage_processes("relay_events", "--to", NATS_URL, *ns, "--dispatch", env=QUIET)
    worker = ["runworker", "EchoAgent", "--dispatch", NATS_URL, *ns, "--poll", "3600"]
    victim = manage_processes(*worker, "--lease", "3", "--concurrency", "6", env=QUIET)
    wait_for(
        lambda: Task.objects.filter(id__in=ids, status="running").count() == 6,
        timeout=60,
        what="the victim to run every task",
    )
    # Each run's command is held unacknowledged: the dispatch claimed every task.
    assert consumer_state(nats_namespace) == (0, 6)
    victim.kill()
    manage_processes("runmaintenance")  # the reaper
    manage_processes(*worker, "--lease", "3", "--concurrency", "6", env=QUIET)
    wait_for(
        lambda: Task.objects.filter(id__in=ids, status="completed").count() == len(ids),
        timeout=120,
        what="every task completed",
    )
    check_completed_once(ids)
    expired = TaskHistory.objects.filter(task_id__in=ids, event="lease_expired").count()
    assert expired == len(ids)
    reasons = Counter(
        command["payload"]["reason"]
        for commands in commands_by_task(nats_commands(nats_namespace)).values()
        for command in commands
    )
    assert reasons == {"new_task": 6, "lease_expired": 6}


@needs_nats
@pytest.mark.slow
def test_nats_a_command_whose_task_waits_on_its_agents_limit_is_delivered_again(
    manage_processes, nats_namespace
):
    """EchoAgent may run one task at a time: the commands of the other two find their
    tasks due but over the limit, and are delivered again (not acknowledged and
    dropped) until each can run. The workers' own claim is off (--poll 3600)."""
    from task_queue.limits import set_limits

    set_limits("EchoAgent", concurrency_limit=1, actor="test")
    tasks = [enqueue("EchoAgent", "echo", {"sleep_ms": 300}) for _ in range(3)]
    ids = [t.id for t in tasks]
    ns = ["--namespace", nats_namespace]
    manage_processes("relay_events", "--to", NATS_URL, *ns, "--dispatch", env=QUIET)
    manage_processes(
        "runworker", "EchoAgent", "--dispatch", NATS_URL, *ns, "--poll", "3600", env=QUIET
    )
    wait_for(
        lambda: Task.objects.filter(id__in=ids, status="completed").count() == len(ids),
        timeout=60,
        what="every task completed, one at a time",
    )
    check_completed_once(ids)
    wait_for(lambda: consumer_state(nats_namespace) == (0, 0), what="every command acked")


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("nats") is None or not Path(NATS_SERVER).exists(),
    reason="needs the nats extra and the nats-server binary",
)
def test_a_dispatched_worker_and_the_relay_ride_out_a_broker_restart(manage_processes, tmp_path):
    """A NATS server of the test's own is killed under a dispatched worker and the
    relay, and started again: both reconnect, and the tasks enqueued meanwhile run
    through their commands (the worker's own claim is off: --poll 3600)."""
    port = free_port()
    url = f"nats://127.0.0.1:{port}"

    def start_server() -> subprocess.Popen:
        server = subprocess.Popen(
            [NATS_SERVER, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path / "js")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: listening(port), what="nats-server to listen")
        return server

    server = start_server()
    try:
        first = [enqueue("EchoAgent", "echo", {"n": n}).id for n in range(5)]
        manage_processes("relay_events", "--to", url, "--dispatch", env=QUIET)
        worker = manage_processes(
            "runworker", "EchoAgent", "--dispatch", url, "--poll", "3600", env=QUIET
        )
        wait_for(
            lambda: Task.objects.filter(id__in=first, status="completed").count() == 5,
            timeout=60,
            what="the first tasks done",
        )
        server.kill()
        server.wait()
        later = [enqueue("EchoAgent", "echo", {"n": n}).id for n in range(5, 10)]
        wait_for(lambda: "dispatch broker unavailable" in worker.log(), what="the worker to notice")
        server = start_server()
        wait_for(
            lambda: Task.objects.filter(id__in=later, status="completed").count() == 5,
            timeout=90,
            what="the tasks enqueued while the broker was down done",
        )
        check_completed_once([*first, *later])
    finally:
        server.kill()
        server.wait()


@pytest.mark.slow
@needs_nats
def test_nats_a_dispatched_worker_stopped_mid_task_acks_the_command_before_it_exits(
    manage_processes, nats_namespace
):
    """SIGTERM while a dispatched task runs: the task finishes within the grace period,
    and its command is acknowledged before the worker exits (not left to be delivered
    again after the ack wait)."""
    import signal

    task = enqueue("EchoAgent", "echo", {"sleep_ms": 1500})
    ns = ["--namespace", nats_namespace]
    manage_processes("relay_events", "--to", NATS_URL, *ns, "--dispatch", env=QUIET)
    worker = manage_processes(
        "runworker", "EchoAgent", "--dispatch", NATS_URL, *ns, "--poll", "3600", env=QUIET
    )
    wait_for(lambda: Task.objects.get(id=task.id).status == "running", what="the task to run")
    assert consumer_state(nats_namespace) == (0, 1)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()
    assert Task.objects.get(id=task.id).status == "completed"
    assert consumer_state(nats_namespace) == (0, 0)
