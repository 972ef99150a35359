"""Reading and writing dispatch commands on the real NATS for the dispatch tests
(tests/test_dispatch.py, tests/test_dispatch_workers.py, the client's)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter

from django.utils import timezone

from agents_app.models import AgentEvent, EmbeddingJob
from task_queue import operations
from task_queue.models import Task, TaskHistory
from task_queue.relay.dispatch_commands import Dispatch
from task_queue.sql import leasing
from tests.support.brokers import jetstream, nats_messages
from tests.support.queue import OWNER

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
