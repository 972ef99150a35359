"""Operator actions on tasks: revive, cancel, edit a pending task."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from task_queue.sql.db import NOW, fetch
from task_queue.sql.leasing import TASK_LEASE

# Ids per statement in a bulk action (a filter may match any number of tasks): each
# statement locks and changes at most this many rows, in the caller's transaction.
CHUNK = 1000

REVIVE_TASKS = f"""
WITH target AS (
    SELECT id, status FROM tasks
    WHERE id = ANY(%(ids)s::uuid[]) AND status IN ('dead', 'failed')
    FOR UPDATE
),
revived AS (
    UPDATE tasks t
    SET status = 'pending', attempts = 0, available_at = {NOW}, updated_at = {NOW},
        payload = COALESCE(%(payload)s::jsonb, t.payload),
        payload_ref = CASE WHEN %(payload)s IS NULL THEN t.payload_ref ELSE %(payload_ref)s END,
        cancel_requested_at = NULL
    FROM target
    WHERE t.id = target.id
    RETURNING t.id, t.agent_name, target.status AS from_status
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              occurred_at, detail)
    SELECT id, 'revived', from_status, 'pending', 0, %(actor)s, {NOW},
           jsonb_build_object('payload_changed', %(payload)s::jsonb IS NOT NULL)
    FROM revived
)
SELECT id, agent_name FROM revived
"""


def revive_tasks(
    *,
    ids: Sequence[UUID],
    actor: str,
    payload: str | None,
    now: datetime | None,
    payload_ref: str | None = None,
) -> list[tuple[UUID, str]]:
    """Dead or failed → pending, due now, with a fresh attempt budget; (id, agent) each.
    A new ``payload`` (JSON text) replaces the old with its ``payload_ref``."""
    params = {"actor": actor, "payload": payload, "payload_ref": payload_ref, "now": now}
    return [row for chunk in _chunks(ids) for row in fetch(REVIVE_TASKS, {**params, "ids": chunk})]


CANCEL_TASKS = f"""
WITH target AS (
    SELECT id, status, attempts FROM tasks
    WHERE id = ANY(%(ids)s::uuid[])
      AND status IN ('pending', 'leased', 'running', 'dead', 'failed')
      -- A running task whose cancel was requested waits for its worker; any other
      -- that carries the flag (from before requests always ended a task) is cancelled.
      AND (cancel_requested_at IS NULL OR status <> 'running')
    FOR UPDATE
),
cancelled AS (
    UPDATE tasks t
    SET status = 'cancelled', finished_at = {NOW}, updated_at = {NOW},
        {TASK_LEASE.clear()}
    FROM target
    WHERE t.id = target.id AND target.status <> 'running'
    RETURNING t.id, target.status AS from_status, t.status AS to_status, t.attempts
),
requested AS (
    UPDATE tasks t
    SET cancel_requested_at = {NOW}, updated_at = {NOW}
    FROM target
    WHERE t.id = target.id AND target.status = 'running'
    RETURNING t.id, target.status AS from_status, t.status AS to_status, t.attempts
),
changed AS (
    SELECT *, 'cancelled' AS event FROM cancelled
    UNION ALL
    SELECT *, 'cancel_requested' AS event FROM requested
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              occurred_at)
    SELECT id, event, from_status, to_status, attempts, %(actor)s, {NOW}
    FROM changed
)
SELECT id, event FROM changed
"""


def cancel_tasks(
    *, ids: Sequence[UUID], actor: str, now: datetime | None
) -> list[tuple[UUID, str]]:
    """Pending, leased, dead or failed → cancelled now; running → cancel requested.
    (id, event) each."""
    params = {"actor": actor, "now": now}
    return [row for chunk in _chunks(ids) for row in fetch(CANCEL_TASKS, {**params, "ids": chunk})]


def _chunks(ids: Sequence[UUID]) -> list[list[UUID]]:
    """Sorted, so that concurrent bulk actions lock the rows they share in one order
    (as a single statement's index scan would) and cannot deadlock."""
    ids = sorted(set(ids))
    return [ids[start : start + CHUNK] for start in range(0, len(ids), CHUNK)]


UPDATE_PENDING_TASK = f"""
WITH target AS (
    SELECT id, status, priority, payload, available_at FROM tasks
    WHERE id = %(id)s
    FOR UPDATE
),
updated AS (
    UPDATE tasks t
    SET priority = COALESCE(%(priority)s, t.priority),
        payload = COALESCE(%(payload)s::jsonb, t.payload),
        payload_ref = CASE WHEN %(payload)s IS NULL THEN t.payload_ref ELSE %(payload_ref)s END,
        available_at = CASE WHEN %(due_now)s THEN {NOW}
                            ELSE COALESCE(%(available_at)s::timestamptz, t.available_at) END,
        updated_at = {NOW}
    FROM target
    WHERE t.id = target.id AND target.status = 'pending'
    RETURNING t.id, t.agent_name, t.attempts, t.priority, t.payload, t.available_at
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              occurred_at, detail)
    SELECT updated.id, 'updated', 'pending', 'pending', updated.attempts, %(actor)s, {NOW},
           jsonb_strip_nulls(jsonb_build_object(
               'priority', CASE WHEN %(priority)s IS NOT NULL THEN jsonb_build_object(
                   'from', target.priority, 'to', updated.priority) END,
               'payload', CASE WHEN %(payload)s IS NOT NULL THEN jsonb_build_object(
                   'from', target.payload, 'to', updated.payload) END,
               'available_at', CASE WHEN %(available_at)s IS NOT NULL OR %(due_now)s
                                    THEN jsonb_build_object(
                   'from', target.available_at, 'to', updated.available_at) END))
    FROM updated JOIN target ON target.id = updated.id
)
SELECT target.status, updated.agent_name
FROM target LEFT JOIN updated ON updated.id = target.id
"""


def update_pending_task(
    *,
    task_id: UUID,
    actor: str,
    priority: int | None,
    payload: str | None,
    available_at: datetime | None,
    now: datetime | None,
    due_now: bool = False,
    payload_ref: str | None = None,
) -> tuple[str, str | None] | None:
    """Change a pending task's priority, payload (JSON text) or due time (``due_now``:
    the database's now); None leaves a field as it is. The history row records each
    change, from and to.

    Returns (status before, agent name if updated), or None when there is no such
    task; a task that is not pending is left alone.
    """
    params = {
        "id": task_id,
        "actor": actor,
        "priority": priority,
        "payload": payload,
        "payload_ref": payload_ref,
        "available_at": available_at,
        "due_now": due_now,
        "now": now,
    }
    rows = fetch(UPDATE_PENDING_TASK, params)
    return rows[0] if rows else None
