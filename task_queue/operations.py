"""The queue's Python API for the other apps: enqueue, and the operator actions
(revive, cancel, edit, run now, pause and resume an agent), each written to the
audit log in the transaction that makes the change (the caller's, if it has one).

Enqueueing runs inside the caller's transaction: if the caller rolls back there is
no task and no wake-up, because the NOTIFY that wakes workers is part of the same
transaction.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.db import transaction

from task_queue.sql import enqueue as enqueue_sql
from task_queue.sql import operator

from . import audit, blobs, registry, tracing
from .ids import time_ordered_ids
from .models import (
    MAX_ATTEMPTS_LIMIT,
    PRIORITY_MAX,
    PRIORITY_MIN,
    OperatorAction,
    PausedAgent,
    Priority,
    Task,
    Workflow,
)
from .storable import storable_json, text_problem

Kind = OperatorAction.Kind


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


class IdempotencyConflict(ValueError):
    """An idempotency key was used before, for a task created by a different request."""

    def __init__(self, key: str, task_id: UUID, path: str) -> None:
        super().__init__(
            f"{path}: idempotency key {key!r} belongs to task {task_id}, "
            "created by a different request"
        )
        self.key = key
        self.task_id = task_id
        self.path = path


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


# Longest delay accepted: beyond it a due time is almost surely a unit mistake.
MAX_DELAY_SECONDS = 366 * 24 * 3600
# Identifiers are indexed; PostgreSQL cannot index arbitrarily long text.
MAX_KEY_LENGTH = 200


def enqueue(
    agent_name: str, task_type: str, payload: dict[str, Any] | None = None, **options: Any
) -> Enqueued:
    """Enqueue one task; see :class:`TaskSpec` for the options."""
    spec = TaskSpec(agent_name, task_type, payload if payload is not None else {}, **options)
    return enqueue_many([spec], indexed=False)[0]


def enqueue_many(
    specs: Sequence[TaskSpec], *, prefix: str = "tasks", indexed: bool = True
) -> list[Enqueued]:
    """Enqueue tasks in one transaction; all or none.

    Raises :class:`InvalidTask` or :class:`IdempotencyConflict`, naming the field as
    ``{prefix}[i].field`` (just ``field`` when not ``indexed``). A task whose
    idempotency key exists already, from the same request, is returned with
    ``created`` false; from a different request, it is a conflict.

    A spec given several times (``[spec] * 1000``) is validated and encoded once.
    """
    if not specs:
        return []
    with tracing.active.enqueue(len(specs)) as (trace, parent):
        distinct: dict[int, dict[str, Any]] = {}
        rows = []
        for index, spec in enumerate(specs):
            row = distinct.get(id(spec))
            if row is None:
                row = distinct[id(spec)] = _validated(spec, index if indexed else None, prefix)
            rows.append(row)
        with transaction.atomic():
            # Only once every task is valid, in the transaction that references the blob
            # (so the collector leaves it alone: task_queue.blobs).
            for row in distinct.values():
                row["payload"], row["payload_ref"] = blobs.offload(row.pop("payload_json"))
                row["line"] = enqueue_sql.copy_line(row)
            _check_workflows(rows, prefix, indexed)
            results = enqueue_sql.enqueue_tasks(
                time_ordered_ids(len(rows)), [row["line"] for row in rows],
                [row["idempotency_key"] for row in rows],
                trace_id=trace, traceparent=parent,
            )  # fmt: skip
            for index, (row, result) in enumerate(zip(rows, results, strict=True)):
                # A task keyed before fingerprints were kept (None) matches any request.
                if (
                    not result.created
                    and result.existing_fingerprint is not None
                    and result.existing_fingerprint != row["idempotency_fingerprint"]
                ):
                    path = f"{prefix}[{index}].idempotency_key" if indexed else "idempotency_key"
                    raise IdempotencyConflict(row["idempotency_key"], result.id, path)
            enqueue_sql.notify_agents([row["agent_name"] for row in distinct.values()])
        return [Enqueued(result.id, result.created) for result in results]


def check(spec: TaskSpec) -> None:
    """Raise :class:`InvalidTask` (naming the field) if ``enqueue`` would refuse
    ``spec``: a schedule checks the task it will enqueue when it is written."""
    _validated(spec, None, "")


def _check_workflows(rows: list[dict[str, Any]], prefix: str, indexed: bool) -> None:
    wanted = {row["workflow_id"] for row in rows if row["workflow_id"]}
    if not wanted:
        return
    # Locked until the tasks are inserted, so a concurrent workflow cancel (which locks
    # the row too) either comes first and is seen here, or waits for these tasks and
    # cancels them with the others.
    workflows = Workflow.objects.filter(id__in=wanted).select_for_update(no_key=True)
    known = {
        str(key): cancelled_at for key, cancelled_at in workflows.values_list("id", "cancelled_at")
    }
    for index, row in enumerate(rows):
        workflow_id = row["workflow_id"]
        if workflow_id is None:
            continue
        where = {"index": index if indexed else None, "prefix": prefix}
        if workflow_id not in known:
            raise InvalidTask("workflow_id", f"no workflow {workflow_id}", **where)
        if known[workflow_id] is not None:
            raise InvalidTask(
                "workflow_id",
                f"workflow {workflow_id} is cancelled",
                code="workflow_cancelled",
                **where,
            )


def _validated(spec: TaskSpec, index: int | None, prefix: str) -> dict[str, Any]:
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
    _check_priority(spec.priority, invalid)
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


def _check_priority(priority: Any, invalid: Callable[..., InvalidTask]) -> None:
    if not _is_int(priority) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise invalid("priority", f"must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}")


def _fingerprint(row: dict[str, Any]) -> str:
    """A hash of everything the request said about the task."""
    canonical = json.dumps(row, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def run_now(task_id: UUID, *, actor: str, source: str = "python") -> None:
    """Make a pending task due now (one waiting for its retry backoff or its schedule).

    Raises :class:`TaskNotFound` or :class:`TaskNotPending`.
    """
    update_pending(task_id, actor=actor, due_now=True, source=source, action=Kind.RUN_NOW)


def revive(
    ids: Iterable[UUID],
    *,
    actor: str,
    payload: dict[str, Any] | None = None,
    source: str = "python",
    matched_filter: dict[str, Any] | None = None,
) -> list[UUID]:
    """Dead or failed tasks → pending, due now, with a fresh attempt budget.

    ``payload`` replaces the payload of every revived task (edit before retry); the
    audit log keeps the diff. ``matched_filter`` records, for a bulk revive, the
    filter the operator chose. Returns the ids revived; tasks in another status are
    left alone.
    """
    ids = list(ids)
    text = None if payload is None else payload_json(payload, InvalidTask)
    with transaction.atomic():
        new_payload, new_ref = _stored(text)
        before = _payloads(ids) if payload is not None else {}
        revived = operator.revive_tasks(
            ids=ids, actor=actor, payload=new_payload, payload_ref=new_ref, now=None
        )
        enqueue_sql.notify_agents([agent for _, agent in revived])
        revived_ids = [task_id for task_id, _ in revived]
        if revived_ids:
            changes = {}
            if payload is not None:
                diffs = {str(i): audit.payload_diff(before[i], payload) for i in revived_ids}
                changes = {"payload": {"diff": diffs}}
            audit.record(
                actor=actor,
                action=Kind.EDIT_AND_REVIVE if payload is not None else Kind.REVIVE,
                source=source,
                task_ids=revived_ids,
                matched_filter=matched_filter,
                changes=changes,
            )
    return revived_ids


def cancel(
    ids: Iterable[UUID],
    *,
    actor: str,
    source: str = "python",
    matched_filter: dict[str, Any] | None = None,
) -> dict[UUID, str]:
    """Cancel tasks: pending or leased ones at once; running ones are asked to stop,
    which their worker sees at its next heartbeat. Dead and failed tasks are
    cancelled too: the operator gives up on them and they leave the dead letter.
    Returns {id: "cancelled" or "cancel_requested"} for the tasks affected."""
    with transaction.atomic():
        outcome = dict(operator.cancel_tasks(ids=list(ids), actor=actor, now=None))
        if outcome:
            audit.record(
                actor=actor,
                action=Kind.CANCEL,
                source=source,
                task_ids=list(outcome),
                matched_filter=matched_filter,
            )
    return outcome


def _payloads(ids: Sequence[UUID]) -> dict[UUID, dict[str, Any]]:
    """The current payloads of ``ids``, locked until the transaction ends."""
    tasks = Task.objects.filter(id__in=ids).select_for_update(no_key=True)
    return {
        task_id: _readable_payload(payload, ref)
        for task_id, payload, ref in tasks.values_list("id", "payload", "payload_ref")
    }


def _readable_payload(payload: dict[str, Any], ref: str | None) -> dict[str, Any]:
    """For the audit diff: the blob's payload, or {} if the blob is gone."""
    try:
        return blobs.payload_of(payload, ref)
    except blobs.PayloadBlobError:
        return {}


def _stored(text: str | None) -> tuple[str | None, str | None]:
    """A new payload's JSON as it goes in the row: (JSON text, blob reference), in the
    transaction that writes it; (None, None) for no new payload."""
    return (None, None) if text is None else blobs.offload(text)


def pause_agent(agent_name: str, *, actor: str, source: str = "python") -> bool:
    """Stop workers leasing ``agent_name``'s tasks (from their next claim on).

    Tasks already leased run to their end. Returns False if it was paused already.
    """
    registry.get(agent_name)  # KeyError for an unknown agent
    with transaction.atomic():
        _, created = PausedAgent.objects.get_or_create(
            agent_name=agent_name, defaults={"paused_by": actor}
        )
        if created:
            audit.record(actor=actor, action=Kind.PAUSE, source=source, agent_name=agent_name)
    return created


def resume_agent(agent_name: str, *, actor: str, source: str = "python") -> bool:
    """Let workers lease ``agent_name``'s tasks again, and wake them at once.

    Returns False if it was not paused.
    """
    with transaction.atomic():
        deleted, _ = PausedAgent.objects.filter(agent_name=agent_name).delete()
        if deleted:
            enqueue_sql.notify_agents([agent_name])
            audit.record(actor=actor, action=Kind.RESUME, source=source, agent_name=agent_name)
    return bool(deleted)


def paused_agents() -> dict[str, PausedAgent]:
    return {paused.agent_name: paused for paused in PausedAgent.objects.all()}


class TaskNotFound(LookupError):
    pass


class TaskNotPending(ValueError):
    def __init__(self, status: str) -> None:
        super().__init__(f"the task is {status}, not pending")
        self.status = status


def update_pending(
    task_id: UUID,
    *,
    actor: str,
    priority: int | None = None,
    payload: dict[str, Any] | None = None,
    available_at: datetime | None = None,
    due_now: bool = False,
    source: str = "python",
    action: str | None = None,
) -> None:
    """Change a pending task (what Oban calls editing a job before it runs).

    ``action`` names the change in the audit log when it is more than an edit
    (``run_now``).

    Raises :class:`TaskNotFound`, :class:`TaskNotPending`, or :class:`InvalidTask`
    for a value the queue would not accept at enqueue.
    """
    text = None if payload is None else payload_json(payload, InvalidTask)
    if priority is not None:
        _check_priority(priority, InvalidTask)
    if available_at is not None and available_at.tzinfo is None:
        raise InvalidTask("available_at", "must be a timezone-aware datetime")
    with transaction.atomic():
        new_payload, new_ref = _stored(text)
        before = Task.objects.select_for_update(no_key=True).filter(id=task_id).first()
        found = operator.update_pending_task(
            task_id=task_id,
            actor=actor,
            priority=priority,
            payload=new_payload,
            payload_ref=new_ref,
            available_at=available_at.astimezone(UTC) if available_at else None,
            due_now=due_now,
            now=None,
        )
        if found is None:
            raise TaskNotFound(str(task_id))
        status, agent_name = found
        if agent_name is None:
            raise TaskNotPending(status)
        enqueue_sql.notify_agents([agent_name])
        changes: dict[str, Any] = {}
        if payload is not None:
            old_payload = _readable_payload(before.payload, before.payload_ref)
            diff = audit.payload_diff(old_payload, payload)
            changes["payload"] = {"diff": {str(task_id): diff}}
        if priority is not None:
            changes["priority"] = {"from": before.priority, "to": priority}
        if available_at is not None or due_now:
            changes["available_at"] = {
                "from": before.available_at.isoformat(),
                "to": "now" if due_now else available_at.astimezone(UTC).isoformat(),
            }
        audit.record(
            actor=actor,
            action=action or Kind.EDIT,
            source=source,
            task_ids=[task_id],
            changes=changes,
        )
