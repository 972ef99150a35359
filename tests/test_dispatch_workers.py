"""Broker dispatch, the workers' side (issue 34 §2), against the real NATS JetStream
and RabbitMQ: ``runworker AGENT --dispatch URL`` claims each command's task by id,
acknowledges a command once the outcome is committed, and every task completes once
through duplicates, garbage, crashes, lost commands, limits and a broker restart.
Each test works under its own namespace (or a NATS server of its own)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from task_queue import operations
from task_queue.models import Task, TaskHistory
from tests.support.brokers import (
    AMQP_URL,
    NATS_SERVER,
    NATS_URL,
    jetstream,
    needs_nats,
    needs_rabbitmq,
    rabbitmq,
    rabbitmq_messages,
    rabbitmq_queue,
    start_nats_server,
)
from tests.support.dispatch import (
    QUIET,
    check_completed_once,
    commands_by_task,
    consumer_state,
    duplicate,
    enqueue,
    garbage_commands,
    nats_commands,
    nats_publish,
)
from tests.support.processes import run_manage
from tests.support.server import free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


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

    server = start_nats_server(port, tmp_path / "js")
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
        server = start_nats_server(port, tmp_path / "js")
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
