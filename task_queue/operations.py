"""The queue's Python API for the other apps: enqueue, revive, cancel.

Enqueueing runs inside the caller's transaction: if the caller rolls back there is
no task and no wake-up, because the NOTIFY that wakes workers is part of the same
transaction.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction

from agents_app import registry

from . import queries
from .models import PRIORITY_MAX, PRIORITY_MIN, Priority
from .storable import json_has_nul


class InvalidTask(ValueError):
    """A task specification was refused; ``field`` names the offending field."""

    def __init__(self, field: str, message: str, *, index: int | None = None) -> None:
        where = f"tasks[{index}].{field}" if index is not None else field
        super().__init__(f"{where}: {message}")
        self.field = field
        self.index = index
        self.message = message


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


@dataclass(frozen=True)
class Enqueued:
    id: UUID
    created: bool  # False: an existing task with the same idempotency key


def enqueue(
    agent_name: str, task_type: str, payload: dict[str, Any] | None = None, **options: Any
) -> Enqueued:
    """Enqueue one task; see :class:`TaskSpec` for the options."""
    spec = TaskSpec(agent_name, task_type, payload if payload is not None else {}, **options)
    return enqueue_many([spec])[0]


def enqueue_many(specs: Sequence[TaskSpec]) -> list[Enqueued]:
    """Enqueue tasks in one statement; all or none. Raises :class:`InvalidTask`."""
    rows = [_validated(spec, index if len(specs) > 1 else None) for index, spec in enumerate(specs)]
    if not rows:
        return []
    with transaction.atomic():
        result = queries.enqueue_tasks(rows)
        queries.notify_agents([row["agent_name"] for row in rows])
    return [Enqueued(task_id, created) for task_id, created in result]


def _validated(spec: TaskSpec, index: int | None) -> dict[str, Any]:
    def invalid(name: str, message: str) -> InvalidTask:
        return InvalidTask(name, message, index=index)

    try:
        agent = registry.get(spec.agent_name)
    except KeyError:
        known = ", ".join(registry.names())
        raise invalid("agent_name", f"unknown agent {spec.agent_name!r}; known: {known}") from None
    if spec.task_type not in agent.task_types:
        handled = ", ".join(agent.task_types)
        raise invalid("task_type", f"{spec.agent_name} handles {handled}, not {spec.task_type!r}")
    if not isinstance(spec.payload, dict):
        raise invalid("payload", "must be a JSON object")
    try:
        payload_json = json.dumps(spec.payload, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise invalid("payload", f"is not JSON-serialisable: {error}") from None
    if json_has_nul(payload_json):
        raise invalid("payload", "contains a NUL character, which PostgreSQL cannot store")
    if not _is_int(spec.priority) or not PRIORITY_MIN <= spec.priority <= PRIORITY_MAX:
        raise invalid("priority", f"must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}")
    max_attempts = agent.max_attempts if spec.max_attempts is None else spec.max_attempts
    if not _is_int(max_attempts) or max_attempts < 1:
        raise invalid("max_attempts", "must be an integer of at least 1")
    if spec.delay_seconds is not None and (
        isinstance(spec.delay_seconds, bool)
        or not isinstance(spec.delay_seconds, int | float)
        or not math.isfinite(spec.delay_seconds)
        or spec.delay_seconds < 0
    ):
        raise invalid("delay_seconds", "must be a non-negative number of seconds")
    if spec.available_at is not None and spec.delay_seconds is not None:
        raise invalid("available_at", "give available_at or delay_seconds, not both")
    if spec.available_at is not None and (
        not isinstance(spec.available_at, datetime) or spec.available_at.tzinfo is None
    ):
        raise invalid("available_at", "must be a timezone-aware datetime")
    return {
        "agent_name": spec.agent_name,
        "task_type": spec.task_type,
        "payload": spec.payload,
        "priority": spec.priority,
        "max_attempts": max_attempts,
        "workflow_id": str(spec.workflow_id) if spec.workflow_id else None,
        "delay_seconds": spec.delay_seconds,
        "available_at": spec.available_at.isoformat() if spec.available_at else None,
        "idempotency_key": spec.idempotency_key,
        "trace_id": spec.trace_id,
    }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def revive(ids: Iterable[UUID], *, actor: str, payload: dict[str, Any] | None = None) -> list[UUID]:
    """Dead or failed tasks → pending, due now, with a fresh attempt budget.

    ``payload`` replaces the payload of every revived task (edit before retry).
    Returns the ids revived; tasks in another status are left alone.
    """
    new_payload = json.dumps(payload) if payload is not None else None
    with transaction.atomic():
        revived = queries.revive_tasks(ids=list(ids), actor=actor, payload=new_payload, now=None)
        queries.notify_agents([agent for _, agent in revived])
    return [task_id for task_id, _ in revived]


def cancel(ids: Iterable[UUID], *, actor: str) -> dict[UUID, str]:
    """Cancel tasks: pending or leased ones at once; running ones are asked to stop,
    which their worker sees at its next heartbeat. Returns {id: "cancelled" or
    "cancel_requested"} for the tasks affected."""
    return dict(queries.cancel_tasks(ids=list(ids), actor=actor, now=None))
