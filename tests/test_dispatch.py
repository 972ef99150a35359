"""Broker dispatch, the relay's side (issue 34 §2), against the real NATS JetStream:
``relay_events --dispatch`` publishes a ``cmd.agent.<Agent>.execute.v1`` command for
each task that becomes due, with its reason, never for a paused agent, and resumes
after a restart. The workers' side: tests/test_dispatch_workers.py."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from task_queue import operations
from task_queue.maintenance import reaper
from task_queue.models import Task
from task_queue.relay.dispatch_commands import Dispatch
from task_queue.sql import outcomes as outcomes_sql
from tests.support.brokers import NATS_URL, nats_messages, needs_nats
from tests.support.dispatch import QUIET, claim, commands_by_task, enqueue, nats_commands
from tests.support.queue import OWNER, make_failed
from tests.support.waiting import wait_for
from tests.test_relay import cursor_at

pytestmark = pytest.mark.django_db(transaction=True)


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


@needs_nats
@pytest.mark.slow
def test_nats_a_relay_killed_while_a_task_waits_to_fall_due_dispatches_it_after_its_restart(
    manage_processes, nats_namespace
):
    from task_queue.event_stream import head

    # Due a minute after their changes, so nothing is due while the first relay runs:
    # soon (its event's, waiting in the relay's memory), late (the scan's: enqueued two
    # hours before it is due).
    soon = enqueue("EchoAgent", "echo", {"way": "soon"}, delay_seconds=60)
    late = enqueue("EchoAgent", "echo", {"way": "late"}, delay_seconds=3600)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks SET updated_at = now() - interval '2 hours', "
            "available_at = now() + interval '60 seconds' WHERE id = %s",
            [late.id],
        )
    ns = ["--namespace", nats_namespace]
    relay = manage_processes("relay_events", "--to", NATS_URL, *ns, "--dispatch", env=QUIET)
    last = head()
    wait_for(lambda: cursor_at(NATS_URL, nats_namespace) >= last, what="the events relayed")
    relay.kill()
    assert nats_commands(nats_namespace) == []
    # Both fall due a second from now (their rows' changes stay where they were; no event).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks SET available_at = now() + interval '1 second' WHERE id = ANY(%s)",
            [[soon.id, late.id]],
        )
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
