"""``cmd.agent.<AgentName>.execute.v1``: "a task of yours is due, claim it" (seed 000 §3).

The relay publishes one when a task becomes due (``relay_events --dispatch``); a
dispatched worker claims the task by id, which is the gate: a duplicate, a redelivery
or a command for a task someone else took gets a 409 and is acknowledged. The
envelope::

    {"schema_version": "v1", "message_id": "…", "trace_id": "<the task's>",
     "causation_id": null, "kind": "cmd.agent.EchoAgent.execute.v1",
     "emitted_at": "…",
     "payload": {"task_id": "…", "target_agent_type": "EchoAgent", "reason": "new_task"}}

It is not ``cmd.task.execute.v1`` (``relay_events --consume-commands`` turns those into
tasks and refuses every other kind), so a dispatched command never becomes a task.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from task_queue.relay.names import subject_for

# Why a task became due, as the payload's "reason" names it.
REASONS = ("new_task", "retry_due", "lease_expired", "revived")
# A body larger than this is not a dispatch command (a real one is a few hundred bytes).
MAX_BODY_BYTES = 16 * 1024
# The same due occurrence of a task (its id, attempt and due time) always gets the same
# message_id, so JetStream's duplicate window drops a second publish of it.
_OCCURRENCE = uuid.UUID("6b1d5f0e-7a0c-4d55-9d5e-8a4f2f3c1e07")


class InvalidDispatch(ValueError):
    """A body that is not a dispatch command for one of the worker's agents."""


def kind_for(agent: str) -> str:
    """The command's kind, which is also its NATS subject (before any namespace)."""
    return subject_for(f"cmd.agent.{agent}.execute.v1")


def routing_key_for(agent: str) -> str:
    """Its RabbitMQ routing key on exchange ``grns.cmd``."""
    return kind_for(agent).removeprefix("cmd.")


def queue_for(agent: str) -> str:
    """The agent's durable RabbitMQ queue (before any namespace)."""
    return "grns.cmd." + kind_for(agent).removeprefix("cmd.").removesuffix(".execute.v1")


@dataclass(frozen=True, slots=True)
class Dispatch:
    """One command to publish: a task of ``agent`` due at ``due_at`` (attempt ``attempt``)."""

    task_id: uuid.UUID
    agent: str
    reason: str
    attempt: int
    due_at: datetime
    trace_id: str | None
    republished: bool = False

    @property
    def message_id(self) -> str:
        if self.republished:  # a new message, past the broker's duplicate window
            return str(uuid.uuid4())
        occurrence = f"{self.task_id}/{self.attempt}/{self.due_at.isoformat()}"
        return str(uuid.uuid5(_OCCURRENCE, occurrence))

    def to_json(self, message_id: str) -> bytes:
        return json.dumps(
            {
                "schema_version": "v1",
                "message_id": message_id,
                "trace_id": self.trace_id,
                "causation_id": None,
                "kind": kind_for(self.agent),
                "emitted_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "payload": {
                    "task_id": str(self.task_id),
                    "target_agent_type": self.agent,
                    "reason": self.reason,
                },
            }
        ).encode()


def parse(body: bytes, agents: frozenset[str]) -> tuple[uuid.UUID, str]:
    """(task id, agent) of a dispatch command for one of ``agents``, or
    :class:`InvalidDispatch` naming what is wrong (whatever the bytes)."""
    if len(body) > MAX_BODY_BYTES:
        raise InvalidDispatch(f"body: {len(body)} bytes, more than {MAX_BODY_BYTES}")
    try:
        envelope = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidDispatch("body: not UTF-8") from None
    except (ValueError, RecursionError):
        raise InvalidDispatch("body: not JSON") from None
    payload = envelope.get("payload") if isinstance(envelope, dict) else None
    if not isinstance(payload, dict):
        raise InvalidDispatch("payload: must be an object")
    agent = payload.get("target_agent_type")
    if not isinstance(agent, str) or agent not in agents:
        raise InvalidDispatch("payload.target_agent_type: not one of this worker's agents")
    try:
        task_id = uuid.UUID(str(payload.get("task_id")))
    except ValueError:
        raise InvalidDispatch("payload.task_id: not a UUID") from None
    return task_id, agent
