"""A ``cmd.task.execute.v1`` command from the broker into a task (seed 000 §3).

The command's envelope::

    {"schema_version": "v1", "message_id": "…", "trace_id": "…", "causation_id": null,
     "kind": "cmd.task.execute.v1", "emitted_at": "…",
     "payload": {"target_agent_type": "FitmentAgent", "task_type": "generate_fitment",
                 "payload": {…}, "priority": 1, "max_attempts": 3,
                 "delay_seconds": 0, "workflow_id": null}}

The kind may also be written without its version, ``cmd.task.execute``, as seed 000
§3 does. The task's idempotency key is ``cmd:<message_id>``: a redelivered command finds its
task instead of making a second one, and the task's ``evt.task.created.v1`` names
the command as its cause. Spec 001 §10 holds: only the orchestrator's side sends
these; agents publish facts.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from task_queue.models import Task
from task_queue.operations import IdempotencyConflict, InvalidTask, TaskSpec, enqueue_many
from task_queue.relay.names import COMMAND_KIND
from task_queue.task_specs import MAX_KEY_LENGTH

# The task fields a command may set, beyond the agent and task type.
_OPTIONS = ("priority", "max_attempts", "delay_seconds")


@dataclass(frozen=True, slots=True)
class CommandTask:
    """The task a command created (or found): what the relay's log line is about
    (``task_logging.about_task``)."""

    id: uuid.UUID
    created: bool  # False: an earlier delivery of the command created it
    agent_name: str
    trace_id: str | None


# Room for the envelope around a task payload of QUEUE_MAX_PAYLOAD_BYTES.
ENVELOPE_BYTES = 64 * 1024
# What a dead letter keeps of a refused body: enough to tell what it was, small
# enough for any broker's message (NATS refuses more than 1 MiB by default).
DEAD_LETTER_BODY_BYTES = 64 * 1024


class InvalidCommand(ValueError):
    """A command that cannot become a task; the message names the field."""


def max_command_bytes() -> int:
    return settings.QUEUE_MAX_PAYLOAD_BYTES + ENVELOPE_BYTES


def dead_letter_body(body: bytes) -> bytes:
    """The part of a refused command's body its dead letter carries."""
    return body[:DEAD_LETTER_BODY_BYTES]


def execute_command(body: bytes) -> CommandTask:
    """Create the command's task, or find the one an earlier delivery created.

    Whatever the body, the answer is a task or :class:`InvalidCommand`: a body over
    ``max_command_bytes()`` is refused unread, and one that is not UTF-8, nests too
    deeply for the parser, or holds a number no field can take is refused with why.
    """
    if len(body) > max_command_bytes():
        raise InvalidCommand(f"body: {len(body)} bytes, more than {max_command_bytes()}")
    try:
        envelope = json.loads(body.decode("utf-8-sig"))
    except UnicodeDecodeError as error:
        raise InvalidCommand(f"body: not UTF-8 ({error})") from None
    except RecursionError:
        raise InvalidCommand("body: JSON nested too deeply") from None
    except ValueError as error:
        raise InvalidCommand(f"body: not JSON ({error})") from None
    if not isinstance(envelope, dict):
        raise InvalidCommand("body: must be a JSON object (an envelope)")
    if envelope.get("kind") not in (COMMAND_KIND, "cmd.task.execute"):
        raise InvalidCommand(f"kind: expected {COMMAND_KIND}, got {envelope.get('kind')!r}")
    message_id = envelope.get("message_id")
    if not isinstance(message_id, str) or not 1 <= len(message_id) <= MAX_KEY_LENGTH - 4:
        raise InvalidCommand("message_id: required, text of at most 196 characters")
    command = envelope.get("payload")
    if not isinstance(command, dict):
        raise InvalidCommand("payload: must be an object")
    for name in ("target_agent_type", "task_type"):
        if not isinstance(command.get(name), str):
            raise InvalidCommand(f"payload.{name}: required text")
    spec = TaskSpec(
        agent_name=command["target_agent_type"],
        task_type=command["task_type"],
        payload=command.get("payload", {}),
        workflow_id=_workflow_id(command.get("workflow_id")),
        idempotency_key=f"cmd:{message_id}",
        trace_id=envelope.get("trace_id"),
        **{name: command[name] for name in _OPTIONS if command.get(name) is not None},
    )
    try:
        task = enqueue_many([spec], prefix="payload", indexed=False)[0]
    except InvalidTask as error:
        raise InvalidCommand(str(error)) from None
    except (OverflowError, RecursionError) as error:  # a number or nesting out of range
        raise InvalidCommand(f"payload: {type(error).__name__}: {error}") from None
    except IdempotencyConflict:
        raise InvalidCommand(
            f"message_id: {message_id!r} was already executed with different content"
        ) from None
    # Given no trace, the task was given one (its workflow's or its own, in SQL).
    trace_id = spec.trace_id or Task.objects.values_list("trace_id", flat=True).get(id=task.id)
    return CommandTask(task.id, task.created, spec.agent_name, trace_id)


def _workflow_id(value: Any) -> uuid.UUID | None:
    if value is None:
        return None
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidCommand("payload.workflow_id: not a UUID") from None
