"""What a task must be to be enqueued (spec 001 §9 ``createTask``): :class:`TaskSpec`,
and the checks ``operations.enqueue_many`` makes of each, which give the task's row."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from . import blobs, registry
from .models import MAX_ATTEMPTS_LIMIT, PRIORITY_MAX, PRIORITY_MIN, Priority
from .storable import storable_json, text_problem


class InvalidTask(ValueError):
    """A task specification was refused.

    ``field`` names the offending field of the task, ``path`` where it is in the
    request (``tasks[3].priority``), ``code`` what kind of refusal it is
    (``invalid``, ``unknown_agent``, ``payload_too_large``, ``workflow_cancelled``).
    """

    def __init__(
        self,
        field: str,
        message: str,
        *,
        index: int | None = None,
        prefix: str = "tasks",
        code: str = "invalid",
        details: dict[str, Any] | None = None,
    ) -> None:
        self.path = f"{prefix}[{index}].{field}" if index is not None else field
        super().__init__(f"{self.path}: {message}")
        self.field = field
        self.index = index
        self.message = message
        self.code = code
        self.details = details or {}


@dataclass
class TaskSpec:
    """What a new task is (spec 001 §9 ``createTask``)."""

    agent_name: str
    task_type: str
    payload: dict[str, Any] = field(default_factory=dict)
    priority: int = Priority.MEDIUM
    max_attempts: int | None = None  # None: the agent's own setting
    workflow_id: UUID | None = None
    delay_seconds: float | None = None
    available_at: datetime | None = None
    idempotency_key: str | None = None
    trace_id: str | None = None


# Longest delay accepted: beyond it a due time is almost surely a unit mistake.
MAX_DELAY_SECONDS = 366 * 24 * 3600
# Identifiers are indexed; PostgreSQL cannot index arbitrarily long text.
MAX_KEY_LENGTH = 200


def check(spec: TaskSpec) -> None:
    """Raise :class:`InvalidTask` (naming the field) if ``enqueue`` would refuse
    ``spec``: a schedule checks the task it will enqueue when it is written."""
    validated(spec, None, "")


def validated(spec: TaskSpec, index: int | None, prefix: str) -> dict[str, Any]:
    def invalid(name: str, message: str, **kwargs: Any) -> InvalidTask:
        return InvalidTask(name, message, index=index, prefix=prefix, **kwargs)

    try:
        agent = registry.get(spec.agent_name)
    except (KeyError, TypeError):
        known = registry.names()
        raise invalid(
            "agent_name",
            f"unknown agent {spec.agent_name!r}; known: {', '.join(known)}",
            code="unknown_agent",
            details={"known_agents": known},
        ) from None
    if spec.task_type not in agent.task_types:
        handled = ", ".join(agent.task_types)
        raise invalid(
            "task_type",
            f"{spec.agent_name} handles {handled}, not {spec.task_type!r}",
            details={"task_types": list(agent.task_types)},
        )
    payload_text = payload_json(spec.payload, invalid)
    check_priority(spec.priority, invalid)
    max_attempts = agent.max_attempts if spec.max_attempts is None else spec.max_attempts
    if not _is_int(max_attempts) or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise invalid("max_attempts", f"must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}")
    if spec.delay_seconds is not None and (
        isinstance(spec.delay_seconds, bool)
        or not isinstance(spec.delay_seconds, int | float)
        or not math.isfinite(spec.delay_seconds)
        or not 0 <= spec.delay_seconds <= MAX_DELAY_SECONDS
    ):
        raise invalid("delay_seconds", f"must be a number of seconds from 0 to {MAX_DELAY_SECONDS}")
    if spec.available_at is not None and spec.delay_seconds is not None:
        raise invalid("available_at", "give available_at or delay_seconds, not both")
    if spec.available_at is not None and (
        not isinstance(spec.available_at, datetime) or spec.available_at.tzinfo is None
    ):
        raise invalid("available_at", "must be a timezone-aware datetime")
    for name in ("idempotency_key", "trace_id"):
        value = getattr(spec, name)
        if value is not None and (
            not isinstance(value, str)
            or not 1 <= len(value) <= MAX_KEY_LENGTH
            or text_problem(value)
        ):
            raise invalid(
                name, f"must be text of 1 to {MAX_KEY_LENGTH} characters that PostgreSQL can store"
            )
    row = {
        "agent_name": spec.agent_name,
        "task_type": spec.task_type,
        "payload": spec.payload,
        "priority": spec.priority,
        "max_attempts": max_attempts,
        "workflow_id": str(spec.workflow_id) if spec.workflow_id else None,
        "delay_seconds": spec.delay_seconds,
        # In UTC: PostgreSQL refuses the offsets beyond ±15:59 that Python allows.
        "available_at": spec.available_at.astimezone(UTC).isoformat()
        if spec.available_at
        else None,
        "idempotency_key": spec.idempotency_key,
        "trace_id": spec.trace_id,
    }
    row["idempotency_fingerprint"] = _fingerprint(row) if spec.idempotency_key else None
    row["payload_json"] = payload_text  # for enqueue_many's blob decision; not stored
    return row


def payload_json(payload: Any, invalid: Callable[..., InvalidTask]) -> str:
    """``payload`` as JSON text, if the queue can store it; ``invalid(field, message)``
    makes the error otherwise."""
    if not isinstance(payload, dict):
        raise invalid("payload", "must be a JSON object")
    try:
        return blobs.check_size(storable_json(payload))
    except blobs.TooLarge as error:
        raise invalid(
            "payload", str(error), code="payload_too_large", details={"limit_bytes": error.limit}
        ) from None
    except ValueError as error:
        raise invalid("payload", str(error)) from None


def check_priority(priority: Any, invalid: Callable[..., InvalidTask]) -> None:
    if not _is_int(priority) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise invalid("priority", f"must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}")


def _fingerprint(row: dict[str, Any]) -> str:
    """A hash of everything the request said about the task."""
    canonical = json.dumps(row, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
