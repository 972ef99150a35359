"""The queue's Python API for the other apps: enqueue, and the operator actions
(revive, cancel, edit, run now, pause and resume an agent), each written to the
audit log in the transaction that makes the change (the caller's, if it has one).

Enqueueing runs inside the caller's transaction: if the caller rolls back there is
no task and no wake-up, because the NOTIFY that wakes workers is part of the same
transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.db import transaction

from task_queue.sql import enqueue as enqueue_sql
from task_queue.sql import operator, reading

from . import audit, blobs, registry, task_specs, tracing
from .ids import time_ordered_ids
from .models import OperatorAction, PausedAgent, Task, Workflow
from .task_specs import InvalidTask, TaskSpec

Kind = OperatorAction.Kind


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


@dataclass(frozen=True)
class Enqueued:
    id: UUID
    created: bool  # False: an existing task with the same idempotency key


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
    return _enqueue(specs, prefix, indexed, as_api_json=False)[0]


def enqueue_many_as_api_json(
    specs: Sequence[TaskSpec], *, prefix: str = "tasks"
) -> tuple[list[Enqueued], str]:
    """:func:`enqueue_many`, and every task (new or found by its key) as the API shows
    it: one JSON array, in order, written by PostgreSQL (``TASK_AS_API``)."""
    enqueued, inserted = _enqueue(specs, prefix, True, as_api_json=True)
    if all(task.created for task in enqueued):
        return enqueued, inserted
    # Some exist already: the insert did not write them, so read them all, in order.
    return enqueued, reading.tasks_as_api_json([task.id for task in enqueued])


def _enqueue(
    specs: Sequence[TaskSpec], prefix: str, indexed: bool, *, as_api_json: bool
) -> tuple[list[Enqueued], str | None]:
    if not specs:
        return [], "[]" if as_api_json else None
    with tracing.active.enqueue(len(specs)) as (trace, parent):
        with transaction.atomic():
            workflows = _lock_workflows(specs)
            agents: set[str] = set()
            results, inserted = enqueue_sql.enqueue_tasks(
                _chunks(specs, prefix, indexed, workflows, agents),
                trace_id=trace, traceparent=parent, as_api_json=as_api_json,
            )  # fmt: skip
            for index, (spec, result) in enumerate(zip(specs, results, strict=True)):
                if result.conflicting:
                    path = f"{prefix}[{index}].idempotency_key" if indexed else "idempotency_key"
                    raise IdempotencyConflict(spec.idempotency_key, result.id, path)
            enqueue_sql.notify_agents(sorted(agents))
        return [Enqueued(result.id, result.created) for result in results], inserted


# Tasks an insert statement takes: enough that each statement's own cost (planning,
# its triggers) is small beside its rows', few enough that the first is sent early.
CHUNK_SIZE = 250


def _chunks(
    specs: Sequence[TaskSpec],
    prefix: str,
    indexed: bool,
    workflows: dict[str, datetime | None],
    agents: set[str],
) -> Iterator[dict[str, list]]:
    """The tasks as the insert's columns, ``CHUNK_SIZE`` at a time, each checked, its
    workflow too (``workflows``: :func:`_lock_workflows`), in order: ``InvalidTask``
    names the first bad one. A large payload is offloaded to a blob. Made only as the
    insert asks for them, so PostgreSQL inserts one chunk while the next is made.

    An invalid task after the first chunk rolls the sent ones back with the
    transaction: a batch refused late costs the inserts before it, and a blob already
    written is collected later, as after any rollback (task_queue.blobs). Adds each
    task's agent to ``agents``. A spec given several times (``[spec] * 1000``) is
    checked and encoded once.
    """
    ids = time_ordered_ids(len(specs))
    distinct: dict[int, dict[str, Any]] = {}
    for start in range(0, len(specs), CHUNK_SIZE):
        rows = []
        for index in range(start, min(start + CHUNK_SIZE, len(specs))):
            spec = specs[index]
            row = distinct.get(id(spec))
            if row is None:
                where = index if indexed else None
                row = task_specs.validated(spec, where, prefix)
                _check_workflow(row["workflow_id"], workflows, where, prefix)
                row["payload"], row["payload_ref"] = blobs.offload(row.pop("payload_json"))
                agents.add(row["agent_name"])
                distinct[id(spec)] = row
            rows.append(row)
        yield enqueue_sql.input_columns(ids[start : start + len(rows)], rows)


def _lock_workflows(specs: Sequence[TaskSpec]) -> dict[str, datetime | None]:
    """When each workflow the tasks name was cancelled (None: it was not), by id.

    Locked until the tasks are inserted, so a concurrent workflow cancel (which locks
    the row too) either comes first and is seen here, or waits for these tasks and
    cancels them with the others. In id order, as the maintenance loop's escalation
    locks them, so the two never deadlock."""
    wanted = {str(spec.workflow_id) for spec in specs if spec.workflow_id}
    if not wanted:
        return {}
    workflows = Workflow.objects.filter(id__in=wanted).order_by("id").select_for_update(no_key=True)
    return {
        str(key): cancelled_at for key, cancelled_at in workflows.values_list("id", "cancelled_at")
    }


def _check_workflow(
    workflow_id: str | None,
    workflows: dict[str, datetime | None],
    index: int | None,
    prefix: str,
) -> None:
    if workflow_id is None:
        return
    if workflow_id not in workflows:
        raise InvalidTask("workflow_id", f"no workflow {workflow_id}", index=index, prefix=prefix)
    if workflows[workflow_id] is not None:
        raise InvalidTask(
            "workflow_id",
            f"workflow {workflow_id} is cancelled",
            index=index,
            prefix=prefix,
            code="workflow_cancelled",
        )


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
    text = None if payload is None else task_specs.payload_json(payload, InvalidTask)
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
    text = None if payload is None else task_specs.payload_json(payload, InvalidTask)
    if priority is not None:
        task_specs.check_priority(priority, InvalidTask)
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
