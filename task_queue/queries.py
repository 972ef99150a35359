"""Every raw SQL statement of the queue, named and parameterised.

Nothing else opens a cursor on the queue tables. Each function runs one statement
on Django's connection for the calling thread, so it joins the caller's transaction
when there is one (enqueue inside ``transaction.atomic`` rolls back with it).

Time: statements that depend on the clock take ``now``; ``None`` means the
database's ``now()``. Tests pass a time to step through backoff without sleeping.

Fencing: every write a worker makes about a task names the task, the worker
(``owner``) and the lease token it was given, and only touches rows still held that
way. A worker whose lease expired finds its write affects no row, and learns it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection

NOTIFY_CHANNEL = "automechanica_tasks"
# Every statement that changes tasks (all but lease renewals) notifies here (a
# trigger, migrations queue 0004 and 0006): {"tasks": [[id, old_status, new_status],
# ... up to 60, dead-letter moves first], "more": changed tasks beyond those,
# "left": tasks that left the dead letter, "arrived": tasks that entered it}.
# The dashboard listens.
TASK_CHANGES_CHANNEL = "automechanica_task_changes"

# The statement's time: inlined rather than joined from a CTE, so the planner can
# use it as an index bound.
_NOW = "COALESCE(%(now)s::timestamptz, now())"


def _rows(sql: str, params: dict[str, Any]) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


# ---------------------------------------------------------------- enqueue

ENQUEUE_TASKS = f"""
WITH input AS MATERIALIZED (
    SELECT gen_random_uuid() AS id, r.*
    FROM jsonb_to_recordset(%(tasks)s::jsonb) AS r(
        ord int, workflow_id uuid, agent_name text, task_type text, payload jsonb,
        payload_ref text, priority int, max_attempts int, available_at timestamptz,
        delay_seconds float8, idempotency_key text, idempotency_fingerprint text,
        trace_id text)
),
inserted AS (
    INSERT INTO tasks (id, workflow_id, agent_name, task_type, payload, payload_ref, priority,
                       max_attempts, available_at, idempotency_key, idempotency_fingerprint,
                       trace_id, created_at, updated_at)
    SELECT input.id, workflow_id, agent_name, task_type, payload, payload_ref, priority,
           max_attempts,
           COALESCE(input.available_at,
                    {_NOW} + make_interval(secs => COALESCE(delay_seconds, 0))),
           idempotency_key, idempotency_fingerprint, trace_id, clock_timestamp(), {_NOW}
    FROM input
    ORDER BY ord
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT input.ord, COALESCE(inserted.id, existing.id), inserted.id IS NOT NULL,
       existing.idempotency_fingerprint
FROM input
LEFT JOIN inserted ON inserted.id = input.id
LEFT JOIN tasks existing
       ON inserted.id IS NULL AND existing.idempotency_key = input.idempotency_key
ORDER BY input.ord
"""

FIND_TASKS_BY_IDEMPOTENCY_KEY = """
SELECT idempotency_key, id, idempotency_fingerprint FROM tasks
WHERE idempotency_key = ANY(%(keys)s::text[])
"""


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    id: UUID
    created: bool
    # For a task that existed already: the fingerprint of the request that created it.
    existing_fingerprint: str | None


def enqueue_tasks(tasks: Sequence[dict[str, Any]]) -> list[EnqueueResult]:
    """Insert tasks; one result per input, in order.

    A task whose idempotency key exists already is not inserted: that row's id
    comes back with ``created`` false.
    """
    rows = [{**task, "ord": i} for i, task in enumerate(tasks)]
    result = _rows(ENQUEUE_TASKS, {"tasks": json.dumps(rows, default=str), "now": None})
    missing = [rows[ord_]["idempotency_key"] for ord_, task_id, _, _ in result if task_id is None]
    # A key whose row a concurrent transaction committed after this statement's
    # snapshot, or that came twice in this batch, is looked up anew.
    found = {
        key: (task_id, fingerprint)
        for key, task_id, fingerprint in (
            _rows(FIND_TASKS_BY_IDEMPOTENCY_KEY, {"keys": missing}) if missing else []
        )
    }
    results = []
    for ord_, task_id, created, fingerprint in result:
        if task_id is None:
            task_id, fingerprint = found[rows[ord_]["idempotency_key"]]
        results.append(EnqueueResult(task_id, created, fingerprint))
    return results


# Delivered when the enqueuing transaction commits, and not at all if it rolls back.
NOTIFY_AGENTS = f"""
SELECT pg_notify('{NOTIFY_CHANNEL}', agent) FROM unnest(%(agents)s::text[]) AS agent
"""


def notify_agents(agents: Sequence[str]) -> None:
    _rows(NOTIFY_AGENTS, {"agents": sorted(set(agents))})


# ---------------------------------------------------------------- leasing

RELAX_COMMIT_DURABILITY = "SET synchronous_commit TO off"


def relax_commit_durability() -> None:
    """Let this thread's connection commit without waiting for the WAL flush.

    Only for claims, starts and heartbeats: if the database crashes and loses one,
    the task is pending or its lease runs out, the worker's fenced outcome write is
    refused, and the task runs again, as after any crash. Outcomes stay durable.
    """
    _rows_nofetch(RELAX_COMMIT_DURABILITY, {})


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    id: UUID
    agent_name: str
    task_type: str
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    workflow_id: UUID | None
    trace_id: str | None
    lease_token: UUID
    payload_ref: str | None  # the payload's blob, when it is too large for the row


# Each agent's due tasks come from an ordered scan of tasks_pending_lease_idx
# (agent_name, priority, created_at); the best `limit` of them across agents are
# claimed; with several agents, rows locked but not chosen are let go when the
# statement commits. Paused agents (paused_agents) are left out before any row is
# locked.
CLAIM_TASKS = f"""
WITH due AS (
    SELECT t.id, t.priority, t.created_at
    FROM (
        SELECT name FROM unnest(%(agents)s::text[]) AS a(name)
        WHERE NOT EXISTS (SELECT FROM paused_agents p WHERE p.agent_name = a.name)
    ) AS agent
    CROSS JOIN LATERAL (
        SELECT id, priority, created_at
        FROM tasks
        WHERE status = 'pending' AND agent_name = agent.name AND available_at <= {_NOW}
        ORDER BY priority, created_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS t
),
chosen AS (
    SELECT id FROM due ORDER BY priority, created_at LIMIT %(limit)s
)
UPDATE tasks t
SET status = 'leased',
    lease_owner = %(owner)s,
    lease_token = gen_random_uuid(),
    lease_expires_at = {_NOW} + make_interval(secs => %(lease_seconds)s),
    updated_at = {_NOW}
FROM chosen
WHERE t.id = chosen.id
RETURNING t.id, t.agent_name, t.task_type, t.payload, t.attempts, t.max_attempts,
          t.workflow_id, t.trace_id, t.lease_token, t.payload_ref
"""


def claim_tasks(
    *, owner: str, agents: Sequence[str], limit: int, lease_seconds: float, now: datetime | None
) -> list[ClaimedTask]:
    """Lease up to ``limit`` due pending tasks of ``agents``, best priority first."""
    params = {
        "owner": owner,
        "agents": list(agents),
        "limit": limit,
        "lease_seconds": lease_seconds,
        "now": now,
    }
    # Django's psycopg setup hands jsonb back as text; JSONField decodes it, raw SQL here.
    return [
        ClaimedTask(task_id, agent, task_type, json.loads(payload), *rest)
        for task_id, agent, task_type, payload, *rest in _rows(CLAIM_TASKS, params)
    ]


# The held (id, lease_token) pairs a worker passes to fence its writes.
_HELD = "unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS held(id, lease_token)"
# `t.id = ANY(...)` makes the primary key drive the lookup; without it the planner
# may walk tasks_held_lease_idx, which fills with dead entries during a busy drain.
_FENCED = (
    "t.id = ANY(%(ids)s::uuid[]) AND t.id = held.id AND t.lease_token = held.lease_token"
    " AND t.lease_owner = %(owner)s"
)


def _held(owner: str, held: Sequence[tuple[UUID, UUID]], now: datetime | None) -> dict[str, Any]:
    return {
        "owner": owner,
        "ids": [task_id for task_id, _ in held],
        "tokens": [token for _, token in held],
        "now": now,
    }


START_TASKS = f"""
UPDATE tasks t
SET status = 'running', started_at = {_NOW}, updated_at = {_NOW}
FROM {_HELD}
WHERE {_FENCED} AND t.status = 'leased'
RETURNING t.id
"""


def start_tasks(
    *, owner: str, held: Sequence[tuple[UUID, UUID]], now: datetime | None
) -> set[UUID]:
    """Move leased tasks to running; returns the ids still held (not cancelled meanwhile)."""
    return {row[0] for row in _rows(START_TASKS, _held(owner, held, now))}


HEARTBEAT = f"""
WITH extended AS (
    UPDATE tasks t
    SET lease_expires_at = {_NOW} + make_interval(secs => %(lease_seconds)s)
    FROM {_HELD}
    WHERE {_FENCED} AND t.status IN ('leased', 'running')
    RETURNING t.id, t.cancel_requested_at IS NOT NULL
),
registered AS (
    INSERT INTO workers (worker_id, hostname, pid, agents, concurrency, in_flight,
                         memory_bytes, started_at, last_heartbeat_at)
    SELECT %(owner)s, %(hostname)s, %(pid)s, %(agents)s::text[], %(concurrency)s,
           %(in_flight)s, %(memory_bytes)s, {_NOW}, {_NOW}
    ON CONFLICT (worker_id) DO UPDATE
    SET last_heartbeat_at = EXCLUDED.last_heartbeat_at, in_flight = EXCLUDED.in_flight,
        memory_bytes = EXCLUDED.memory_bytes
),
-- The statement sees workers as it was before: the gap is since the last heartbeat.
gap AS (
    SELECT EXTRACT(EPOCH FROM {_NOW} - last_heartbeat_at)::float8 AS seconds
    FROM workers WHERE worker_id = %(owner)s
),
counted AS (
    INSERT INTO worker_heartbeats AS w (worker_id, minute, agents, beats, max_gap_seconds)
    SELECT %(owner)s, date_bin('1 minute', {_NOW}, 'epoch'), %(agents)s::text[], 1,
           (SELECT seconds FROM gap)
    ON CONFLICT (worker_id, minute) DO UPDATE
    SET beats = w.beats + 1,
        max_gap_seconds = greatest(w.max_gap_seconds, EXCLUDED.max_gap_seconds)
)
SELECT * FROM extended
"""


def heartbeat(
    *,
    owner: str,
    held: Sequence[tuple[UUID, UUID]],
    lease_seconds: float,
    hostname: str,
    pid: int,
    agents: Sequence[str],
    concurrency: int,
    now: datetime | None,
    memory_bytes: int | None = None,
) -> dict[UUID, bool]:
    """Extend every lease the worker holds and record that the worker is alive.

    Returns {task id: cancel requested} for the leases still held; a held task
    missing from the answer was lost (expired and reaped, or cancelled).
    """
    params = _held(owner, held, now) | {
        "lease_seconds": lease_seconds,
        "hostname": hostname,
        "pid": pid,
        "agents": list(agents),
        "concurrency": concurrency,
        "in_flight": len(held),
        "memory_bytes": memory_bytes,
    }
    return dict(_rows(HEARTBEAT, params))


DELETE_WORKER = "DELETE FROM workers WHERE worker_id = %(owner)s"


def delete_worker(owner: str) -> None:
    _rows_nofetch(DELETE_WORKER, {"owner": owner})


NEXT_DUE_AT = """
SELECT min(available_at) FROM tasks
WHERE status = 'pending' AND agent_name = ANY(%(agents)s::text[])
  AND agent_name NOT IN (SELECT agent_name FROM paused_agents)
"""


def next_due_at(agents: Sequence[str]) -> datetime | None:
    """When the earliest pending task of ``agents`` falls due (it may be past); paused
    agents' tasks do not count, so a worker of a paused agent sleeps until woken."""
    return _rows(NEXT_DUE_AT, {"agents": list(agents)})[0][0]


# ---------------------------------------------------------------- outcomes

COMPLETE_TASKS = f"""
WITH held AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(results)s::jsonb[],
                         %(summaries)s::text[]) AS d(id, lease_token, result, summary)
),
completed AS (
    UPDATE tasks t
    SET status = 'completed', result = held.result, finished_at = {_NOW},
        updated_at = {_NOW}, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM held
    WHERE {_FENCED} AND t.status = 'running'
    RETURNING t.id, t.workflow_id, t.agent_name, t.task_type, t.attempts, t.started_at,
              t.available_at, held.lease_token, held.result, held.summary
),
events AS (
    INSERT INTO agent_events (task_id, workflow_id, agent_name, event_type, content, data,
                              created_at)
    SELECT id, workflow_id, agent_name, 'task.completed', summary,
           jsonb_build_object('task_type', task_type, 'result', result), {_NOW}
    FROM completed
    RETURNING id
),
embedding AS (
    INSERT INTO embedding_jobs (agent_event_id) SELECT id FROM events
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              lease_token, started_at, due_at, occurred_at)
    SELECT id, 'completed', 'running', 'completed', attempts + 1, %(owner)s, lease_token,
           started_at, available_at, {_NOW}
    FROM completed
)
SELECT id FROM completed
"""


def complete_tasks(
    *,
    owner: str,
    done: Sequence[tuple[UUID, UUID, str, str]],
    now: datetime | None,
) -> set[UUID]:
    """Record successes: (id, lease token, result as JSON text, event summary) each.

    In the same statement: the AgentEvent, its embedding job and the history row.
    Returns the ids whose lease was still held; the others were refused.
    """
    params = {
        "owner": owner,
        "ids": [d[0] for d in done],
        "tokens": [d[1] for d in done],
        "results": [d[2] for d in done],
        "summaries": [d[3] for d in done],
        "now": now,
    }
    return {row[0] for row in _rows(COMPLETE_TASKS, params)}


FAIL_TASKS = f"""
WITH held AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(retryable)s::bool[],
                         %(base_delays)s::float8[], %(errors)s::jsonb[])
        AS f(id, lease_token, retryable, base_delay, error)
),
-- When each attempt was due, read before the update moves a retry's available_at.
due AS (
    SELECT t.id, t.available_at FROM tasks t JOIN held ON held.id = t.id
),
failed AS (
    UPDATE tasks t
    SET attempts = t.attempts + 1,
        status = CASE WHEN NOT held.retryable THEN 'failed'
                      WHEN t.attempts + 1 >= t.max_attempts THEN 'dead'
                      ELSE 'pending' END,
        available_at = CASE WHEN held.retryable AND t.attempts + 1 < t.max_attempts
                            THEN {_NOW}
                                 + make_interval(secs => (t.attempts + 1) ^ 2 * held.base_delay)
                            ELSE t.available_at END,
        error_info = held.error || jsonb_build_object(
            'attempt', t.attempts + 1, 'worker', %(owner)s, 'at', {_NOW}),
        finished_at = {_NOW}, updated_at = {_NOW},
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM held
    WHERE {_FENCED} AND t.status = 'running'
    RETURNING t.id, t.status, t.attempts, t.available_at, t.started_at, t.error_info,
              held.lease_token
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              lease_token, started_at, due_at, occurred_at, error, detail)
    SELECT failed.id, CASE status WHEN 'pending' THEN 'retry_scheduled' ELSE status END,
           'running', status, attempts, %(owner)s, lease_token, started_at,
           due.available_at, {_NOW}, error_info,
           CASE status WHEN 'pending' THEN jsonb_build_object('retry_at', failed.available_at)
           END
    FROM failed JOIN due ON due.id = failed.id
)
SELECT id, status, attempts, available_at FROM failed
"""


def fail_tasks(
    *,
    owner: str,
    failures: Sequence[tuple[UUID, UUID, bool, float, str]],
    now: datetime | None,
) -> list[tuple[UUID, str, int, datetime]]:
    """Record failed attempts: (id, lease token, retryable, base delay, error JSON) each.

    attempts + 1; a retryable failure goes back to pending ``attempts² × base_delay``
    seconds from now, or to dead once attempts reach max_attempts; a non-retryable
    one to failed. Returns (id, new status, attempts, available_at) per held task.
    """
    params = {
        "owner": owner,
        "ids": [f[0] for f in failures],
        "tokens": [f[1] for f in failures],
        "retryable": [f[2] for f in failures],
        "base_delays": [f[3] for f in failures],
        "errors": [f[4] for f in failures],
        "now": now,
    }
    return _rows(FAIL_TASKS, params)


CONFIRM_CANCELLED = f"""
WITH cancelled AS (
    UPDATE tasks t
    SET status = 'cancelled', finished_at = {_NOW}, updated_at = {_NOW},
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM {_HELD}
    WHERE {_FENCED} AND t.status = 'running'
    RETURNING t.id, t.attempts, t.started_at, held.lease_token
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              lease_token, started_at, occurred_at)
    SELECT id, 'cancelled', 'running', 'cancelled', attempts + 1, %(owner)s, lease_token,
           started_at, {_NOW}
    FROM cancelled
)
SELECT id FROM cancelled
"""


def confirm_cancelled(
    *, owner: str, held: Sequence[tuple[UUID, UUID]], now: datetime | None
) -> set[UUID]:
    """A worker stopped handlers whose cancellation was requested: mark them cancelled."""
    return {row[0] for row in _rows(CONFIRM_CANCELLED, _held(owner, held, now))}


RELEASE_TASKS = f"""
WITH target AS (
    SELECT t.id, t.status, held.lease_token
    FROM tasks t, {_HELD}
    WHERE {_FENCED} AND t.status IN ('leased', 'running')
    FOR UPDATE OF t
),
released AS (
    UPDATE tasks t
    SET status = 'pending', available_at = {_NOW}, updated_at = {_NOW},
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM target
    WHERE t.id = target.id
    RETURNING t.id, t.agent_name, t.attempts, t.started_at, target.status, target.lease_token
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              lease_token, started_at, occurred_at)
    SELECT id, 'released', status, 'pending', attempts + 1, %(owner)s, lease_token,
           started_at, {_NOW}
    FROM released
)
SELECT id, agent_name FROM released
"""


def release_tasks(
    *, owner: str, held: Sequence[tuple[UUID, UUID]], now: datetime | None
) -> list[tuple[UUID, str]]:
    """Give held tasks back as pending and due now, without counting an attempt."""
    return _rows(RELEASE_TASKS, _held(owner, held, now))


# ---------------------------------------------------------------- maintenance

TRY_ADVISORY_XACT_LOCK = "SELECT pg_try_advisory_xact_lock(%(key)s)"


def try_advisory_xact_lock(key: int) -> bool:
    """Take a cluster-wide lock until the current transaction ends, if it is free."""
    return _rows(TRY_ADVISORY_XACT_LOCK, {"key": key})[0][0]


ADVISORY_XACT_LOCK = "SELECT pg_advisory_xact_lock(%(key)s)"


def advisory_xact_lock(key: int) -> None:
    """Take a cluster-wide lock until the current transaction ends, waiting for it."""
    _rows(ADVISORY_XACT_LOCK, {"key": key})


REAP_EXPIRED_LEASES = f"""
WITH expired AS (
    SELECT t.id, t.status, t.lease_owner, t.lease_token, t.cancel_requested_at IS NOT NULL
               AS cancel_requested
    FROM tasks t
    WHERE t.status IN ('leased', 'running') AND t.lease_expires_at < {_NOW}
    ORDER BY t.lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
),
reaped AS (
    UPDATE tasks t
    SET attempts = t.attempts + (expired.status = 'running')::int,
        status = CASE WHEN expired.cancel_requested THEN 'cancelled'
                      WHEN expired.status = 'running' AND t.attempts + 1 >= t.max_attempts
                          THEN 'dead'
                      ELSE 'pending' END,
        available_at = {_NOW},
        error_info = CASE WHEN expired.status = 'running' THEN jsonb_build_object(
                'type', 'LeaseExpired',
                'message', 'lease expired: worker ' || expired.lease_owner
                           || ' stopped heartbeating while running the task',
                'retryable', true, 'attempt', t.attempts + 1,
                'worker', expired.lease_owner, 'at', {_NOW})
            ELSE t.error_info END,
        finished_at = CASE WHEN expired.status = 'running' THEN {_NOW} END,
        updated_at = {_NOW},
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM expired
    WHERE t.id = expired.id
    RETURNING t.id, t.agent_name, t.status, t.attempts, t.started_at, t.error_info,
              expired.status AS from_status, expired.lease_owner, expired.lease_token
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              lease_token, started_at, occurred_at, error, detail)
    SELECT id, 'lease_expired', from_status, status, attempts, 'reaper', lease_token,
           started_at, {_NOW},
           CASE WHEN from_status = 'running' THEN error_info END,
           jsonb_build_object('worker', lease_owner)
    FROM reaped
)
SELECT id, agent_name, status FROM reaped
"""


def reap_expired_leases(*, limit: int, now: datetime | None) -> list[tuple[UUID, str, str]]:
    """Return tasks whose lease ran out to pending (or dead); (id, agent, status) each.

    A task that was running counts the attempt, so a task that kills its worker
    every time ends dead instead of looping. A task only leased, never started,
    goes back without counting one.
    """
    return _rows(REAP_EXPIRED_LEASES, {"limit": limit, "now": now})


PRUNE_STALE_WORKERS = f"""
DELETE FROM workers
WHERE last_heartbeat_at < {_NOW} - make_interval(secs => %(stale_seconds)s)
"""


def prune_stale_workers(*, stale_seconds: float, now: datetime | None) -> int:
    return _rows_nofetch(PRUNE_STALE_WORKERS, {"stale_seconds": stale_seconds, "now": now})


# ---------------------------------------------------------------- operator actions

REVIVE_TASKS = f"""
WITH target AS (
    SELECT id, status FROM tasks
    WHERE id = ANY(%(ids)s::uuid[]) AND status IN ('dead', 'failed')
    FOR UPDATE
),
revived AS (
    UPDATE tasks t
    SET status = 'pending', attempts = 0, available_at = {_NOW}, updated_at = {_NOW},
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
    SELECT id, 'revived', from_status, 'pending', 0, %(actor)s, {_NOW},
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
    params = {"ids": list(ids), "actor": actor, "payload": payload, "payload_ref": payload_ref}
    return _rows(REVIVE_TASKS, {**params, "now": now})


CANCEL_TASKS = f"""
WITH target AS (
    SELECT id, status, attempts FROM tasks
    WHERE id = ANY(%(ids)s::uuid[])
      AND status IN ('pending', 'leased', 'running', 'dead', 'failed')
      AND cancel_requested_at IS NULL
    FOR UPDATE
),
cancelled AS (
    UPDATE tasks t
    SET status = 'cancelled', finished_at = {_NOW}, updated_at = {_NOW},
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM target
    WHERE t.id = target.id AND target.status <> 'running'
    RETURNING t.id, target.status AS from_status, t.status AS to_status, t.attempts
),
requested AS (
    UPDATE tasks t
    SET cancel_requested_at = {_NOW}, updated_at = {_NOW}
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
    SELECT id, event, from_status, to_status, attempts, %(actor)s, {_NOW}
    FROM changed
)
SELECT id, event FROM changed
"""


def cancel_tasks(
    *, ids: Sequence[UUID], actor: str, now: datetime | None
) -> list[tuple[UUID, str]]:
    """Pending, leased, dead or failed → cancelled now; running → cancel requested.
    (id, event) each."""
    return _rows(CANCEL_TASKS, {"ids": list(ids), "actor": actor, "now": now})


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
        available_at = CASE WHEN %(due_now)s THEN {_NOW}
                            ELSE COALESCE(%(available_at)s::timestamptz, t.available_at) END,
        updated_at = {_NOW}
    FROM target
    WHERE t.id = target.id AND target.status = 'pending'
    RETURNING t.id, t.agent_name, t.attempts, t.priority, t.payload, t.available_at
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              occurred_at, detail)
    SELECT updated.id, 'updated', 'pending', 'pending', updated.attempts, %(actor)s, {_NOW},
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
    rows = _rows(UPDATE_PENDING_TASK, params)
    return rows[0] if rows else None


# ---------------------------------------------------------------- reading

COUNT_TASKS_BY_AGENT_AND_STATUS = """
SELECT agent_name, status, count(*) FROM tasks GROUP BY agent_name, status
"""


def count_tasks_by_agent_and_status() -> list[tuple[str, str, int]]:
    return _rows(COUNT_TASKS_BY_AGENT_AND_STATUS, {})


OLDEST_PENDING_AGE = """
SELECT EXTRACT(EPOCH FROM now() - min(available_at))::float8
FROM tasks WHERE status = 'pending' AND available_at <= now()
"""


def oldest_pending_age_seconds() -> float | None:
    """How long the longest-waiting due task has waited, or None if none waits."""
    return _rows(OLDEST_PENDING_AGE, {})[0][0]


# Tasks that reached their final status in the last 15 minutes, per agent: the
# partial index tasks_finished_idx finds them without reading older tasks.
RECENT_FINISHED_TASKS = """
SELECT agent_name,
       count(*) FILTER (WHERE status = 'completed' AND finished_at >= now() - interval '1 minute'),
       count(*) FILTER (WHERE status = 'completed' AND finished_at >= now() - interval '5 minutes'),
       count(*) FILTER (WHERE status = 'completed'),
       count(*) FILTER (WHERE status IN ('failed', 'dead')
                          AND finished_at >= now() - interval '1 minute'),
       count(*) FILTER (WHERE status IN ('failed', 'dead')
                          AND finished_at >= now() - interval '5 minutes'),
       count(*) FILTER (WHERE status IN ('failed', 'dead')),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY EXTRACT(EPOCH FROM started_at - available_at))
           FILTER (WHERE started_at >= available_at),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY EXTRACT(EPOCH FROM finished_at - started_at))
           FILTER (WHERE started_at IS NOT NULL)
FROM tasks
WHERE status IN ('completed', 'failed', 'dead', 'cancelled')
  AND finished_at >= now() - interval '15 minutes'
GROUP BY agent_name
"""


@dataclass(frozen=True, slots=True)
class RecentActivity:
    agent_name: str
    completed: tuple[int, int, int]  # in the last 1, 5 and 15 minutes
    failed: tuple[int, int, int]  # failed or dead, likewise
    queue_wait_seconds: tuple[float, float, float] | None  # p50, p95, p99
    run_seconds: tuple[float, float, float] | None


def recent_activity() -> list[RecentActivity]:
    """Per agent: what finished in the last 1/5/15 minutes and how long it waited and ran.

    Queue wait is from when a task was due (``available_at``) to its last start.
    """
    return [
        RecentActivity(
            agent,
            (c1, c5, c15),
            (f1, f5, f15),
            tuple(wait) if wait else None,
            tuple(run) if run else None,
        )
        for agent, c1, c5, c15, f1, f5, f15, wait, run in _rows(RECENT_FINISHED_TASKS, {})
    ]


# The statuses a dashboard counts exactly, each branch matching one partial index's
# predicate (pending: tasks_pending_lease_idx; held: tasks_held_lease_idx; dead and
# failed: tasks_dead_letter_idx), so none reads the bulk of finished tasks.
COUNT_OPEN_TASKS = """
SELECT agent_name, 'pending', count(*) FROM tasks WHERE status = 'pending' GROUP BY agent_name
UNION ALL
SELECT agent_name, status, count(*) FROM tasks WHERE status IN ('leased', 'running')
GROUP BY agent_name, status
UNION ALL
SELECT agent_name, status, count(*) FROM tasks WHERE status IN ('dead', 'failed')
GROUP BY agent_name, status
"""


def count_open_tasks() -> list[tuple[str, str, int]]:
    """(agent, status, count) for pending, leased, running, dead and failed tasks."""
    return _rows(COUNT_OPEN_TASKS, {})


# The planner's own figures: the table's row count scaled to its current size, as the
# planner does, and the share of each (agent, status) pair from the extended
# statistics tasks_agent_status_stats (migration queue 0004), as of the last ANALYZE.
ESTIMATE_TASKS_BY_AGENT_AND_STATUS = """
WITH size AS (
    SELECT CASE WHEN c.relpages > 0
                THEN c.reltuples / c.relpages
                     * (pg_relation_size(c.oid) / current_setting('block_size')::int)
                ELSE c.reltuples END AS rows
    FROM pg_class c WHERE c.oid = 'tasks'::regclass
)
SELECT s.most_common_vals[i][1], s.most_common_vals[i][2],
       round(s.most_common_freqs[i] * size.rows)::bigint
FROM pg_stats_ext s
CROSS JOIN size
CROSS JOIN LATERAL generate_subscripts(s.most_common_freqs, 1) AS i
WHERE s.statistics_name = 'tasks_agent_status_stats'
  AND s.schemaname = current_schema() AND s.tablename = 'tasks'
"""


DATABASE_CLOCK = "SELECT clock_timestamp()"


def database_clock() -> datetime:
    """The database server's time now: what task timestamps are written with."""
    return _rows(DATABASE_CLOCK, {})[0][0]


ESTIMATED_TABLE_ROWS = "SELECT reltuples FROM pg_class WHERE oid = 'tasks'::regclass"


def estimate_tasks_by_agent_and_status() -> list[tuple[str, str, int]]:
    """(agent, status, estimated count) for the pairs the last ANALYZE saw; none
    before the first, and none for a role that does not own the table (PostgreSQL
    shows extended statistics to the owner only)."""
    return _rows(ESTIMATE_TASKS_BY_AGENT_AND_STATUS, {})


def estimated_table_rows() -> float:
    """The planner's estimate of the tasks table's row count (-1: never analysed)."""
    return _rows(ESTIMATED_TABLE_ROWS, {})[0][0]


# Completions and failures per minute over the last hour (the overview's charts), from
# tasks_finished_idx. Minutes with none are absent.
# Completions and failures per minute over the last hour (the overview's charts): the
# minute rollups where they are computed, and from the tasks (tasks_finished_idx)
# for the minutes since. Minutes with none are absent.
FINISHED_PER_MINUTE = """
WITH bounds AS (
    SELECT date_bin('1 minute', now(), 'epoch') - interval '59 minutes' AS hour_start,
           COALESCE((SELECT computed_until FROM metrics_rollup_progress
                     WHERE bucket_seconds = 60), '-infinity') AS rolled_until
)
SELECT m.bucket_start, sum(m.tasks_completed)::int, sum(m.tasks_failed + m.tasks_dead)::int
FROM task_queue_metrics m, bounds
WHERE m.bucket_seconds = 60 AND m.bucket_start >= bounds.hour_start
  AND m.bucket_start < bounds.rolled_until
GROUP BY m.bucket_start
UNION ALL
SELECT date_bin('1 minute', t.finished_at, 'epoch'),
       count(*) FILTER (WHERE t.status = 'completed'),
       count(*) FILTER (WHERE t.status IN ('failed', 'dead'))
FROM tasks t, bounds
WHERE t.status IN ('completed', 'failed', 'dead', 'cancelled')
  AND t.finished_at >= greatest(bounds.hour_start, bounds.rolled_until)
GROUP BY 1
"""


def finished_per_minute() -> list[tuple[datetime, int, int]]:
    """(minute, completed, failed or dead) for the minutes of the last hour with any."""
    return _rows(FINISHED_PER_MINUTE, {})


# One index probe per agent into tasks_pending_due_idx (agent_name, available_at):
# the first entry is the agent's longest-waiting task.
OLDEST_PENDING_AGE_BY_AGENT = """
SELECT agent.name,
       (SELECT EXTRACT(EPOCH FROM now() - min(available_at))::float8
        FROM tasks
        WHERE status = 'pending' AND agent_name = agent.name AND available_at <= now())
FROM unnest(%(agents)s::text[]) AS agent(name)
"""


def oldest_pending_age_by_agent(agents: Sequence[str]) -> dict[str, float | None]:
    """Agent → seconds its longest-waiting due task has waited (None: none waits)."""
    return dict(_rows(OLDEST_PENDING_AGE_BY_AGENT, {"agents": list(agents)}))


def _rows_nofetch(sql: str, params: dict[str, Any]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


# ---------------------------------------------------------------- metric rollups


def _histogram(name: str, source: str, column: str) -> str:
    """Two CTEs: ``{name}`` holds, per bucket and agent, the counts of ``column`` in
    each slot of %(bounds)s (slot i: above bound i-1, up to and including bound i, as
    Prometheus's ``le``; the last, beyond the last bound), as one array with a zero
    for each empty slot."""
    return f"""
{name}_slots AS (
    SELECT bucket, agent_name,
           (SELECT count(*) FROM unnest(%(bounds)s::float8[]) AS b WHERE b < {column}) AS slot,
           count(*) AS n
    FROM {source} WHERE {column} IS NOT NULL GROUP BY 1, 2, 3
),
{name} AS (
    SELECT k.bucket, k.agent_name, array_agg(COALESCE(c.n, 0) ORDER BY s.slot) AS counts
    FROM (SELECT DISTINCT bucket, agent_name FROM {name}_slots) AS k
    CROSS JOIN generate_series(0, cardinality(%(bounds)s::float8[])) AS s(slot)
    LEFT JOIN {name}_slots c
           ON c.bucket = k.bucket AND c.agent_name = k.agent_name AND c.slot = s.slot
    GROUP BY k.bucket, k.agent_name
)"""


# The figures of every bucket of one width in [since, until), for every agent with
# anything in it (columns: METRIC_COLUMNS),
# from the source tables: task_history (each attempt's end: outcomes, run time, error
# class, queue wait from when the attempt was due; task_history_occurred_idx), tasks
# (created; tasks_created_idx) and worker_heartbeats. Buckets are aligned
# on the Unix epoch, so days are UTC days.
METRIC_COLUMNS = (
    "bucket_start", "bucket_seconds", "agent_name", "tasks_created", "tasks_completed",
    "tasks_failed", "tasks_dead", "tasks_retried", "tasks_cancelled", "attempts",
    "average_latency", "queue_wait_p50", "queue_wait_p95", "run_time_average",
    "run_time_p50", "run_time_p95", "queue_wait_histogram", "queue_wait_sum",
    "run_time_histogram", "run_time_sum", "worker_heartbeat_delay", "error_rates_per_agent",
)  # fmt: skip
METRICS = f"""
WITH ended AS (
    SELECT date_bin(make_interval(secs => %(width)s), h.occurred_at, 'epoch') AS bucket,
           t.agent_name, h.event, h.to_status, h.error,
           -- An attempt ran if it started (a lease that expired before the start, or
           -- a task given back at shutdown, did not run).
           CASE WHEN h.started_at IS NOT NULL AND h.event <> 'released'
                     AND (h.event <> 'lease_expired' OR h.from_status = 'running')
                THEN EXTRACT(EPOCH FROM h.occurred_at - h.started_at)::float8 END AS run,
           CASE WHEN h.started_at >= h.due_at
                THEN EXTRACT(EPOCH FROM h.started_at - h.due_at)::float8 END AS wait
    FROM task_history h JOIN tasks t ON t.id = h.task_id
    WHERE h.occurred_at >= %(since)s AND h.occurred_at < %(until)s
),
outcomes AS (
    SELECT bucket, agent_name,
           count(*) FILTER (WHERE event = 'completed') AS completed,
           count(*) FILTER (WHERE event = 'failed') AS failed,
           count(*) FILTER (WHERE to_status = 'dead' AND event IN ('dead', 'lease_expired'))
               AS dead,
           count(*) FILTER (WHERE event = 'retry_scheduled'
                               OR (event = 'lease_expired' AND to_status = 'pending'))
               AS retried,
           count(*) FILTER (WHERE to_status = 'cancelled'
                               AND event IN ('cancelled', 'lease_expired')) AS cancelled,
           count(run) AS attempts,
           avg(run) AS run_average,
           COALESCE(sum(run), 0) AS run_sum,
           percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY run) AS run_pct
    FROM ended GROUP BY bucket, agent_name
),
errors AS (
    SELECT bucket, agent_name, COALESCE(error->>'type', 'unknown') AS error_class,
           count(*) AS n
    FROM ended WHERE run IS NOT NULL AND error IS NOT NULL
    GROUP BY bucket, agent_name, error_class
),
created AS (
    SELECT date_bin(make_interval(secs => %(width)s), created_at, 'epoch') AS bucket,
           agent_name, count(*) AS n
    FROM tasks WHERE created_at >= %(since)s AND created_at < %(until)s
    GROUP BY bucket, agent_name
),
waited AS (
    SELECT bucket, agent_name, avg(wait) AS average, sum(wait) AS total,
           percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY wait) AS pct
    FROM ended WHERE wait IS NOT NULL GROUP BY bucket, agent_name
),
{_histogram("run_histogram", "ended", "run")},
{_histogram("wait_histogram", "ended", "wait")},
beats AS (
    SELECT date_bin(make_interval(secs => %(width)s), minute, 'epoch') AS bucket,
           agent AS agent_name, max(max_gap_seconds) AS delay
    FROM worker_heartbeats CROSS JOIN LATERAL unnest(agents) AS agent
    WHERE minute >= %(since)s AND minute < %(until)s
    GROUP BY bucket, agent
),
buckets AS (
    SELECT bucket, agent_name FROM outcomes UNION SELECT bucket, agent_name FROM created
    UNION SELECT bucket, agent_name FROM beats
)
SELECT b.bucket, %(width)s, b.agent_name, COALESCE(c.n, 0), COALESCE(o.completed, 0),
       COALESCE(o.failed, 0), COALESCE(o.dead, 0), COALESCE(o.retried, 0),
       COALESCE(o.cancelled, 0), COALESCE(o.attempts, 0), w.average, w.pct[1], w.pct[2],
       o.run_average, o.run_pct[1], o.run_pct[2], COALESCE(wh.counts, '{{}}'),
       COALESCE(w.total, 0), COALESCE(rh.counts, '{{}}'), COALESCE(o.run_sum, 0), beats.delay,
       COALESCE((SELECT jsonb_object_agg(e.error_class, jsonb_build_object(
                     'count', e.n, 'rate', round(e.n::numeric / o.attempts, 4)))
                 FROM errors e
                 WHERE e.bucket = b.bucket AND e.agent_name = b.agent_name), '{{}}')
FROM buckets b
LEFT JOIN outcomes o USING (bucket, agent_name)
LEFT JOIN created c USING (bucket, agent_name)
LEFT JOIN waited w USING (bucket, agent_name)
LEFT JOIN wait_histogram wh USING (bucket, agent_name)
LEFT JOIN run_histogram rh USING (bucket, agent_name)
LEFT JOIN beats USING (bucket, agent_name)
"""
INSERT_METRICS = f"INSERT INTO task_queue_metrics ({', '.join(METRIC_COLUMNS)}) {METRICS}"

DELETE_METRICS = """
DELETE FROM task_queue_metrics
WHERE bucket_seconds = %(width)s AND bucket_start >= %(since)s AND bucket_start < %(until)s
"""


def recompute_metrics(
    width: int, since: datetime, until: datetime, histogram_bounds: Sequence[float]
) -> int:
    """Replace the rollups of the ``width``-second buckets in [since, until) (bounds on
    bucket edges) with figures computed afresh; returns the rows written. Run it in a
    transaction: the old rows go and the new ones come at once."""
    params = {
        "width": width,
        "since": since,
        "until": until,
        "bounds": [float(b) for b in histogram_bounds],
    }
    _rows_nofetch(DELETE_METRICS, params)
    return _rows_nofetch(INSERT_METRICS, params)


def compute_metrics(
    width: int, since: datetime, until: datetime, histogram_bounds: Sequence[float]
) -> list[dict[str, Any]]:
    """The figures of the ``width``-second buckets in [since, until), computed now
    and stored nowhere (a bucket not closed yet, or the tail after the rollups)."""
    params = {
        "width": width,
        "since": since,
        "until": until,
        "bounds": [float(b) for b in histogram_bounds],
    }
    rows = [dict(zip(METRIC_COLUMNS, row, strict=True)) for row in _rows(METRICS, params)]
    for row in rows:  # jsonb comes back as text from raw SQL here
        row["error_rates_per_agent"] = json.loads(row["error_rates_per_agent"])
    return rows


def metrics_since(since: datetime, histogram_bounds: Sequence[float]) -> list[dict[str, Any]]:
    """Per agent, the figures of everything from ``since`` on, as one bucket (the
    part of the counters that no rollup holds yet)."""
    until = datetime.max.replace(tzinfo=since.tzinfo)
    return compute_metrics(100 * 365 * 86400, since, until, histogram_bounds)


# The stored rollups that together cover everything rolled up, each moment once:
# days up to the day progress, then hours, then minutes (three range scans of the
# unique index); what comes after the last edge is in no rollup yet.
ROLLUP_EDGES = """
WITH progress AS (
    SELECT max(computed_until) FILTER (WHERE bucket_seconds = 86400) AS days,
           max(computed_until) FILTER (WHERE bucket_seconds = 3600) AS hours,
           max(computed_until) FILTER (WHERE bucket_seconds = 60) AS minutes
    FROM metrics_rollup_progress
)
SELECT days, greatest(days, hours), greatest(days, hours, minutes) FROM progress
"""
TOTAL_COLUMNS = (
    "agent_name", "tasks_created", "tasks_completed", "tasks_failed", "tasks_dead",
    "tasks_retried", "tasks_cancelled", "queue_wait_histogram", "queue_wait_sum",
    "run_time_histogram", "run_time_sum",
)  # fmt: skip


_TOTALS = ", ".join(TOTAL_COLUMNS)
ROLLED_UP_ROWS = f"""
SELECT {_TOTALS} FROM task_queue_metrics
WHERE bucket_seconds = 86400 AND bucket_start < %(days)s
UNION ALL
SELECT {_TOTALS} FROM task_queue_metrics
WHERE bucket_seconds = 3600 AND bucket_start >= %(days)s AND bucket_start < %(hours)s
UNION ALL
SELECT {_TOTALS} FROM task_queue_metrics
WHERE bucket_seconds = 60 AND bucket_start >= %(hours)s AND bucket_start < %(minutes)s
"""


def rolled_up_totals() -> tuple[datetime, list[dict[str, Any]]] | None:
    """Where the rollups end and the rollup rows that cover everything before it
    once (TOTAL_COLUMNS each); None before the rollups have a start
    (``metrics.ensure_started``)."""
    days, hours, minutes = _rows(ROLLUP_EDGES, {})[0]
    if days is None or hours is None or minutes is None:
        return None
    rows = _rows(ROLLED_UP_ROWS, {"days": days, "hours": hours, "minutes": minutes})
    return minutes, [dict(zip(TOTAL_COLUMNS, row, strict=True)) for row in rows]


START_ROLLUPS = """
INSERT INTO metrics_rollup_progress (bucket_seconds, computed_until)
SELECT width, %(start)s FROM unnest(%(widths)s::int[]) AS width
ON CONFLICT (bucket_seconds) DO NOTHING
"""


def start_rollups(widths: Sequence[int], start: datetime) -> None:
    """Record ``start`` as where the rollups of each width begin, unless they have."""
    _rows_nofetch(START_ROLLUPS, {"widths": list(widths), "start": start})


ROLLUP_PROGRESS = """
SELECT computed_until FROM metrics_rollup_progress WHERE bucket_seconds = %(width)s
"""

SET_ROLLUP_PROGRESS = """
INSERT INTO metrics_rollup_progress (bucket_seconds, computed_until)
VALUES (%(width)s, %(until)s)
ON CONFLICT (bucket_seconds) DO UPDATE SET computed_until = EXCLUDED.computed_until
"""


def rollup_progress(width: int) -> datetime | None:
    """Where the rollups of this width stop (every bucket before it is computed)."""
    rows = _rows(ROLLUP_PROGRESS, {"width": width})
    return rows[0][0] if rows else None


def set_rollup_progress(width: int, until: datetime) -> None:
    _rows_nofetch(SET_ROLLUP_PROGRESS, {"width": width, "until": until})


# ---------------------------------------------------------------- retention

# Completed and cancelled tasks are final: nothing changes them again, so deleting
# them races with no worker. Rows someone has locked anyway (an operator's action
# looking at them) are skipped, never waited for. A task of a workflow goes only with
# its workflow (PRUNE_FINISHED_WORKFLOWS), so that no workflow loses some of its tasks
# and shows a status its history does not support.
PRUNE_FINISHED_TASKS = """
WITH doomed AS (
    SELECT id FROM tasks
    WHERE status IN ('completed', 'cancelled') AND finished_at < %(cutoff)s
      AND workflow_id IS NULL
    ORDER BY finished_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
history AS (
    DELETE FROM task_history h USING doomed WHERE h.task_id = doomed.id
)
DELETE FROM tasks t USING doomed WHERE t.id = doomed.id
"""

# Closed (or cancelled) workflows created before the cutoff whose every task was
# completed or cancelled before it: the workflow, its tasks and their history.
PRUNE_FINISHED_WORKFLOWS = """
WITH doomed AS (
    SELECT w.id FROM workflows w
    WHERE (NOT w.open OR w.cancelled_at IS NOT NULL) AND w.created_at < %(cutoff)s
      AND NOT EXISTS (
          SELECT FROM tasks t
          WHERE t.workflow_id = w.id
            AND (t.status NOT IN ('completed', 'cancelled') OR t.finished_at >= %(cutoff)s))
    ORDER BY w.created_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
doomed_tasks AS (
    SELECT t.id FROM tasks t JOIN doomed ON t.workflow_id = doomed.id
),
history AS (
    DELETE FROM task_history h USING doomed_tasks d WHERE h.task_id = d.id
),
tasks_gone AS (
    DELETE FROM tasks t USING doomed_tasks d WHERE t.id = d.id RETURNING t.id
),
workflows_gone AS (
    DELETE FROM workflows w USING doomed WHERE w.id = doomed.id RETURNING w.id
)
SELECT (SELECT count(*) FROM tasks_gone), (SELECT count(*) FROM workflows_gone)
"""

# Agent events (the agents' memory) have their own, longer retention; their
# embedding jobs go with them.
PRUNE_AGENT_EVENTS = """
WITH doomed AS (
    SELECT id FROM agent_events WHERE created_at < %(cutoff)s
    ORDER BY created_at LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
jobs AS (
    DELETE FROM embedding_jobs j USING doomed WHERE j.agent_event_id = doomed.id
)
DELETE FROM agent_events e USING doomed WHERE e.id = doomed.id
"""

# Heartbeat counts once every width has rolled them up; minute rollups once the
# hours hold them (hours and days are kept).
PRUNE_WORKER_HEARTBEATS = """
DELETE FROM worker_heartbeats
WHERE minute < %(cutoff)s
  AND minute < (SELECT min(computed_until) FROM metrics_rollup_progress)
"""

PRUNE_MINUTE_METRICS = """
DELETE FROM task_queue_metrics
WHERE bucket_seconds = 60 AND bucket_start < %(cutoff)s
  AND bucket_start < (SELECT computed_until FROM metrics_rollup_progress
                      WHERE bucket_seconds = 3600)
"""


# Positioned stream events emitted before the cutoff, once every relay has relayed
# them (a destination no longer used holds them until its cursor row is deleted).
# The newest positioned event always stays: positions continue from it
# (SEQUENCE_EVENTS). Unpositioned ones stay for the sequencer (the maintenance loop
# runs it before pruning).
PRUNE_STREAM_EVENTS = """
WITH doomed AS (
    SELECT seq FROM event_outbox
    WHERE emitted_at < %(cutoff)s
      AND position < (SELECT max(position) FROM event_outbox)
      AND position <= COALESCE((SELECT min(position) FROM event_relay_cursors), position)
    ORDER BY emitted_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM event_outbox e USING doomed WHERE e.seq = doomed.seq
"""


def prune_finished_tasks(*, cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` completed or cancelled tasks outside any workflow that
    finished before ``cutoff``, with their history; returns how many."""
    return _rows_nofetch(PRUNE_FINISHED_TASKS, {"cutoff": cutoff, "batch": batch})


def prune_finished_workflows(*, cutoff: datetime, batch: int) -> tuple[int, int]:
    """Delete up to ``batch`` finished workflows with their tasks and history;
    returns (tasks, workflows) deleted."""
    return _rows(PRUNE_FINISHED_WORKFLOWS, {"cutoff": cutoff, "batch": batch})[0]


def prune_agent_events(*, cutoff: datetime, batch: int) -> int:
    return _rows_nofetch(PRUNE_AGENT_EVENTS, {"cutoff": cutoff, "batch": batch})


def prune_stream_events(*, cutoff: datetime, batch: int) -> int:
    return _rows_nofetch(PRUNE_STREAM_EVENTS, {"cutoff": cutoff, "batch": batch})


def prune_worker_heartbeats(*, cutoff: datetime) -> int:
    return _rows_nofetch(PRUNE_WORKER_HEARTBEATS, {"cutoff": cutoff})


def prune_minute_metrics(*, cutoff: datetime) -> int:
    return _rows_nofetch(PRUNE_MINUTE_METRICS, {"cutoff": cutoff})


# ---------------------------------------------------------------- embedding jobs

# The agent-memory queue (spec 001 §12): the same leasing as tasks, on
# embedding_jobs. A claim counts the attempt, so a job whose embedder keeps dying is
# given up on (dead) after max_attempts like one that keeps failing.
CLAIM_EMBEDDING_JOBS = """
WITH due AS (
    SELECT id FROM embedding_jobs
    WHERE status = 'pending' AND available_at <= now()
    ORDER BY available_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE embedding_jobs j
SET status = 'leased', attempts = j.attempts + 1, lease_owner = %(owner)s,
    lease_token = gen_random_uuid(),
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), updated_at = now()
FROM due, agent_events e
WHERE j.id = due.id AND e.id = j.agent_event_id
RETURNING j.id, j.lease_token, e.id, e.content
"""

# Fenced by the lease token: a job whose lease expired and was claimed again is not
# completed by its first embedder's late answer.
COMPLETE_EMBEDDING_JOBS = """
WITH done AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(vectors)s::text[])
        AS d(id, token, vector)
),
finished AS (
    UPDATE embedding_jobs j
    SET status = 'completed', lease_owner = NULL, lease_token = NULL,
        lease_expires_at = NULL, error_info = NULL, updated_at = now()
    FROM done
    WHERE j.id = done.id AND j.lease_token = done.token AND j.status = 'leased'
    RETURNING j.id, j.agent_event_id, done.vector
)
UPDATE agent_events e SET embedding = finished.vector::vector
FROM finished WHERE e.id = finished.agent_event_id
RETURNING finished.id
"""

FAIL_EMBEDDING_JOB = """
UPDATE embedding_jobs
SET status = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END,
    available_at = now() + make_interval(secs => attempts * attempts * %(base_delay)s),
    error_info = %(error)s::jsonb, lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, updated_at = now()
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'leased'
RETURNING status
"""

RECOVER_EMBEDDING_JOBS = """
UPDATE embedding_jobs
SET status = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END,
    available_at = now(), lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    error_info = jsonb_build_object('type', 'LeaseExpired',
                                    'message', 'the embedder stopped heartbeating'),
    updated_at = now()
WHERE status = 'leased' AND lease_expires_at < now()
"""


@dataclass(frozen=True, slots=True)
class ClaimedEmbeddingJob:
    id: int
    lease_token: UUID
    agent_event_id: int
    text: str


def claim_embedding_jobs(
    *, owner: str, limit: int, lease_seconds: float
) -> list[ClaimedEmbeddingJob]:
    params = {"owner": owner, "limit": limit, "lease_seconds": lease_seconds}
    return [ClaimedEmbeddingJob(*row) for row in _rows(CLAIM_EMBEDDING_JOBS, params)]


def complete_embedding_jobs(done: Sequence[tuple[int, UUID, Sequence[float]]]) -> set[int]:
    """(job id, lease token, vector) each; returns the jobs whose lease was still held."""
    params = {
        "ids": [d[0] for d in done],
        "tokens": [d[1] for d in done],
        "vectors": ["[" + ",".join(repr(float(v)) for v in d[2]) + "]" for d in done],
    }
    return {row[0] for row in _rows(COMPLETE_EMBEDDING_JOBS, params)}


def fail_embedding_job(
    job_id: int, token: UUID, error: dict[str, Any], base_delay: float
) -> str | None:
    """Back to pending after attempts² × base_delay seconds, or dead; None if the
    lease was lost."""
    params = {"id": job_id, "token": token, "error": json.dumps(error), "base_delay": base_delay}
    rows = _rows(FAIL_EMBEDDING_JOB, params)
    return rows[0][0] if rows else None


def recover_embedding_jobs() -> int:
    """Jobs whose embedder stopped renewing its lease: pending again, or dead."""
    return _rows_nofetch(RECOVER_EMBEDDING_JOBS, {})


# ---------------------------------------------------------------- agent messages

MESSAGES_CHANNEL = "automechanica_messages"  # payload: the recipient agent's name

# One statement: the message, and the notification that wakes its recipient's readers
# (sent at commit, so a rolled-back send wakes nobody).
SEND_MESSAGE = f"""
WITH sent AS (
    INSERT INTO agent_messages (from_agent, to_agent, message_type, payload, payload_ref,
                                priority, correlation_id, reply_to, metadata, expires_at)
    VALUES (%(from_agent)s, %(to_agent)s, %(message_type)s, %(payload)s::jsonb,
            %(payload_ref)s, %(priority)s, %(correlation_id)s, %(reply_to)s, %(metadata)s::jsonb,
            now() + make_interval(secs => %(expires_in)s))
    RETURNING id, to_agent
)
SELECT sent.id, pg_notify('{MESSAGES_CHANNEL}', sent.to_agent) IS NULL FROM sent
"""

# A mailbox read: the visible messages of one agent, highest priority first, then
# oldest, each leased to this reader for the visibility timeout under a new receipt.
# SKIP LOCKED: two readers of one agent never take the same message at once.
# clock_timestamp(), not now(): a reader inside a long transaction still sees what
# became visible after it began.
RECEIVE_MESSAGES = """
WITH visible AS (
    SELECT id FROM agent_messages
    WHERE to_agent = %(agent)s AND status IN ('pending', 'delivered')
      AND visible_at <= clock_timestamp() AND expires_at > clock_timestamp()
    ORDER BY priority DESC, created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE agent_messages m
SET status = 'delivered', delivered_at = clock_timestamp(),
    delivery_count = m.delivery_count + 1, receipt = gen_random_uuid(),
    visible_at = clock_timestamp() + make_interval(secs => %(visibility_seconds)s)
FROM visible
WHERE m.id = visible.id
RETURNING m.id, m.from_agent, m.to_agent, m.message_type, m.payload, m.payload_ref,
          m.priority, m.correlation_id, m.reply_to, m.metadata, m.created_at, m.expires_at,
          m.delivery_count, m.receipt
"""

# Fenced by the receipt: a reader whose lease ran out (the message went to another)
# cannot acknowledge it.
ACK_MESSAGE = """
UPDATE agent_messages
SET status = 'acknowledged', acknowledged_at = clock_timestamp(), receipt = NULL
WHERE id = %(id)s AND receipt = %(receipt)s AND status = 'delivered'
RETURNING id
"""


# Retention, in batches that skip rows someone holds. A message still leased to a
# reader is left to it until the lease ends, so its acknowledgement is not refused.
def _expire_leased(table: str) -> str:
    """Mark up to %(batch)s open, unleased rows of ``table`` (messages or publication
    deliveries: the same lease columns) whose expiry passed as expired."""
    return f"""
WITH due AS (
    SELECT id FROM {table}
    WHERE status IN ('pending', 'delivered') AND expires_at <= now() AND visible_at <= now()
    ORDER BY expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {table} t SET status = 'expired', receipt = NULL FROM due WHERE t.id = due.id
"""


EXPIRE_MESSAGES = _expire_leased("agent_messages")

PRUNE_MESSAGES = """
WITH doomed AS (
    SELECT id FROM agent_messages
    WHERE status IN ('acknowledged', 'expired') AND expires_at < %(cutoff)s
    ORDER BY expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM agent_messages m USING doomed WHERE m.id = doomed.id
"""


def send_message(
    *,
    from_agent: str,
    to_agent: str,
    message_type: str,
    payload: str,
    payload_ref: str | None,
    priority: int,
    correlation_id: str | None,
    reply_to: str | None,
    metadata: str,
    expires_in: float,
) -> UUID:
    params = {
        "from_agent": from_agent,
        "to_agent": to_agent,
        "message_type": message_type,
        "payload": payload,
        "payload_ref": payload_ref,
        "priority": priority,
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "metadata": metadata,
        "expires_in": expires_in,
    }
    return _rows(SEND_MESSAGE, params)[0][0]


def receive_messages(*, agent: str, limit: int, visibility_seconds: float) -> list[tuple]:
    params = {"agent": agent, "limit": limit, "visibility_seconds": visibility_seconds}
    return _rows(RECEIVE_MESSAGES, params)


def ack_message(message_id: UUID, receipt: UUID) -> bool:
    return bool(_rows(ACK_MESSAGE, {"id": message_id, "receipt": receipt}))


def expire_messages(*, batch: int) -> int:
    """Mark up to ``batch`` unacknowledged, unleased messages past their expiry expired."""
    return _rows_nofetch(EXPIRE_MESSAGES, {"batch": batch})


def prune_messages(*, cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` acknowledged or expired messages that expired before
    ``cutoff``."""
    return _rows_nofetch(PRUNE_MESSAGES, {"cutoff": cutoff, "batch": batch})


# ---------------------------------------------------------------- publish/subscribe

PUBLICATIONS_CHANNEL = "automechanica_publications"  # payload: a subscriber agent

# One statement: the publication, a delivery for every active subscription it
# matches (fan-out on write, so each subscriber reads its own deliveries, never
# missing one that committed late), and a wake-up for each subscriber.
PUBLISH = f"""
WITH published AS (
    INSERT INTO agent_publications (publisher_agent, publisher_type, publication_type,
                                    event_name, payload, metadata, expires_at)
    VALUES (%(publisher_agent)s, %(publisher_type)s, %(publication_type)s, %(event_name)s,
            %(payload)s::jsonb, %(metadata)s::jsonb,
            now() + make_interval(secs => %(ttl)s))
    RETURNING id, publisher_agent, publisher_type, publication_type, event_name, expires_at
),
fanned AS (
    INSERT INTO agent_publication_deliveries (subscription_id, publication_id, expires_at)
    SELECT s.id, p.id, p.expires_at
    FROM published p JOIN agent_subscriptions s
      ON s.active
     AND (s.publisher_agent IS NULL OR s.publisher_agent = p.publisher_agent)
     AND (s.publisher_type IS NULL OR s.publisher_type = p.publisher_type)
     AND p.event_name LIKE s.event_like ESCAPE '\\'
     AND (cardinality(s.publication_types) = 0
          OR p.publication_type = ANY(s.publication_types))
    RETURNING subscription_id
),
woken AS (
    SELECT DISTINCT s.subscriber_agent
    FROM fanned f JOIN agent_subscriptions s ON s.id = f.subscription_id
)
SELECT (SELECT id FROM published), (SELECT count(*) FROM fanned),
       (SELECT count(pg_notify('{PUBLICATIONS_CHANNEL}', subscriber_agent)) FROM woken)
"""

# Create or change a subscription. Reactivating a stopped one first drops deliveries
# that a publish racing the unsubscribe left behind: it starts from now.
SUBSCRIBE = """
WITH stopped AS (
    SELECT id FROM agent_subscriptions
    WHERE subscriber_agent = %(subscriber)s AND name = %(name)s AND NOT active
),
leftovers AS (
    UPDATE agent_publication_deliveries d SET status = 'expired', receipt = NULL
    FROM stopped WHERE d.subscription_id = stopped.id AND d.status IN ('pending', 'delivered')
)
INSERT INTO agent_subscriptions (subscriber_agent, name, publisher_agent, publisher_type,
                                 event_pattern, event_like, publication_types, active)
VALUES (%(subscriber)s, %(name)s, %(publisher_agent)s, %(publisher_type)s,
        %(event_pattern)s, %(event_like)s, %(publication_types)s::text[], true)
ON CONFLICT (subscriber_agent, name) DO UPDATE
SET publisher_agent = EXCLUDED.publisher_agent, publisher_type = EXCLUDED.publisher_type,
    event_pattern = EXCLUDED.event_pattern, event_like = EXCLUDED.event_like,
    publication_types = EXCLUDED.publication_types, active = true
RETURNING id
"""

# Deactivate, and let go of what was waiting: an unsubscribed agent reads nothing more.
UNSUBSCRIBE = """
WITH gone AS (
    UPDATE agent_subscriptions SET active = false
    WHERE subscriber_agent = %(subscriber)s AND name = %(name)s AND active
    RETURNING id
),
dropped AS (
    UPDATE agent_publication_deliveries d SET status = 'expired', receipt = NULL
    FROM gone WHERE d.subscription_id = gone.id AND d.status IN ('pending', 'delivered')
)
SELECT count(*) FROM gone
"""

# A subscriber's deliveries in publication-id order (ids are taken at insert, so one
# committing late comes after newer ones), leased like messages (SKIP LOCKED: two
# instances of one subscriber never hold the same delivery at once).
RECEIVE_PUBLICATIONS = """
WITH visible AS (
    SELECT d.id
    FROM agent_publication_deliveries d
    JOIN agent_subscriptions s ON s.id = d.subscription_id
    WHERE s.subscriber_agent = %(subscriber)s AND s.active
      AND (%(subscription)s::text IS NULL OR s.name = %(subscription)s::text)
      AND d.status IN ('pending', 'delivered') AND d.visible_at <= clock_timestamp()
      AND d.expires_at > clock_timestamp()
    ORDER BY d.publication_id
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE agent_publication_deliveries d
SET status = 'delivered', delivered_at = clock_timestamp(),
    delivery_count = d.delivery_count + 1, receipt = gen_random_uuid(),
    visible_at = clock_timestamp() + make_interval(secs => %(visibility_seconds)s)
FROM visible, agent_publications p, agent_subscriptions s
WHERE d.id = visible.id AND p.id = d.publication_id AND s.id = d.subscription_id
RETURNING d.id, d.receipt, d.delivery_count, s.name, p.id, p.publisher_agent,
          p.publisher_type, p.publication_type, p.event_name, p.payload, p.metadata,
          p.created_at, p.expires_at
"""

ACK_PUBLICATION = """
UPDATE agent_publication_deliveries
SET status = 'acknowledged', acknowledged_at = clock_timestamp(), receipt = NULL,
    result = %(result)s::jsonb
WHERE id = %(id)s AND receipt = %(receipt)s AND status = 'delivered'
RETURNING id
"""

# Retention: deliveries whose publication's time to live ran out leave the backlog,
# and publications go with their deliveries QUEUE_RETENTION_DAYS later.
EXPIRE_DELIVERIES = _expire_leased("agent_publication_deliveries")

PRUNE_PUBLICATIONS = """
WITH doomed AS (
    SELECT id FROM agent_publications WHERE expires_at < %(cutoff)s
    ORDER BY expires_at LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
deliveries AS (
    DELETE FROM agent_publication_deliveries d USING doomed WHERE d.publication_id = doomed.id
)
DELETE FROM agent_publications p USING doomed WHERE p.id = doomed.id
"""


def publish(**params: Any) -> tuple[int, int]:
    """(publication id, deliveries made); ``params`` as PUBLISH names them."""
    publication_id, deliveries, _ = _rows(PUBLISH, params)[0]
    return publication_id, deliveries


def subscribe(**params: Any) -> int:
    return _rows(SUBSCRIBE, params)[0][0]


def unsubscribe(*, subscriber: str, name: str) -> bool:
    return bool(_rows(UNSUBSCRIBE, {"subscriber": subscriber, "name": name})[0][0])


def receive_publications(
    *, subscriber: str, subscription: str | None, limit: int, visibility_seconds: float
) -> list[tuple]:
    params = {
        "subscriber": subscriber,
        "subscription": subscription,
        "limit": limit,
        "visibility_seconds": visibility_seconds,
    }
    return _rows(RECEIVE_PUBLICATIONS, params)


def ack_publication(delivery_id: int, receipt: UUID, result: str | None) -> bool:
    params = {"id": delivery_id, "receipt": receipt, "result": result}
    return bool(_rows(ACK_PUBLICATION, params))


def expire_deliveries(*, batch: int) -> int:
    return _rows_nofetch(EXPIRE_DELIVERIES, {"batch": batch})


def prune_publications(*, cutoff: datetime, batch: int) -> int:
    return _rows_nofetch(PRUNE_PUBLICATIONS, {"cutoff": cutoff, "batch": batch})


# ---------------------------------------------------------------- event stream

# One sequencer at a time: each run commits its positions before the next begins,
# so a reader never sees position n+1 before n exists.
EVENT_SEQUENCER_LOCK = 0x65767473  # "evts"

# Committed events without a position get the next ones, in seq order (an event
# that commits after a run gets a position after that run's, whatever its seq). The run
# must hold EVENT_SEQUENCER_LOCK and take its snapshot after it (a statement of its
# own before this one). Positions continue from the highest: retention always keeps
# the newest positioned event, so they never start again.
SEQUENCE_EVENTS = """
WITH head AS (
    SELECT COALESCE(max(position), 0) AS position FROM event_outbox
),
unpositioned AS (
    SELECT seq, row_number() OVER (ORDER BY seq) AS n
    FROM (
        SELECT seq FROM event_outbox WHERE position IS NULL ORDER BY seq LIMIT %(limit)s
    ) AS oldest
)
UPDATE event_outbox e
SET position = head.position + unpositioned.n
FROM head, unpositioned
WHERE e.seq = unpositioned.seq
"""


def sequence_events(*, limit: int) -> int:
    """Give up to ``limit`` committed events their stream position; how many got one."""
    advisory_xact_lock(EVENT_SEQUENCER_LOCK)
    return _rows_nofetch(SEQUENCE_EVENTS, {"limit": limit})


READ_EVENTS = """
SELECT position, schema_version, message_id, kind, trace_id, causation_id, subject_id,
       emitted_at, payload
FROM event_outbox
WHERE position > %(after)s
  AND (%(since_time)s::timestamptz IS NULL OR emitted_at >= %(since_time)s::timestamptz)
ORDER BY position
LIMIT %(limit)s
"""


def read_events(*, after: int, limit: int, since_time: datetime | None = None) -> list[tuple]:
    """Positioned events after ``after``, in order (and emitted at or after
    ``since_time``); rows as READ_EVENTS selects them, the payload as JSON text."""
    return _rows(READ_EVENTS, {"after": after, "limit": limit, "since_time": since_time})


TRY_RELAY_LOCK = "SELECT pg_try_advisory_lock(hashtextextended(%(name)s, 0))"
RELAY_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended(%(name)s, 0))"


def try_relay_lock(destination: str) -> bool:
    """One relay per destination: a lock held by this database session until
    :func:`relay_unlock` or the session ends (a killed relay's ends with it)."""
    return _rows(TRY_RELAY_LOCK, {"name": f"relay:{destination}"})[0][0]


def relay_unlock(destination: str) -> None:
    _rows(RELAY_UNLOCK, {"name": f"relay:{destination}"})


RELAY_CURSOR = """
INSERT INTO event_relay_cursors (destination, position, relayed, updated_at)
VALUES (%(destination)s, 0, 0, now())
ON CONFLICT (destination) DO UPDATE SET destination = EXCLUDED.destination
RETURNING position
"""


def relay_cursor(destination: str) -> int:
    """Where relaying to ``destination`` stopped (created at 0 the first time)."""
    return _rows(RELAY_CURSOR, {"destination": destination})[0][0]


# An upsert: an operator may delete the cursor (admin) while its relay runs.
ADVANCE_RELAY_CURSOR = """
INSERT INTO event_relay_cursors (destination, position, relayed, updated_at)
VALUES (%(destination)s, %(position)s, %(relayed)s, now())
ON CONFLICT (destination) DO UPDATE
SET position = greatest(event_relay_cursors.position, EXCLUDED.position),
    relayed = event_relay_cursors.relayed + EXCLUDED.relayed, updated_at = now()
"""


def advance_relay_cursor(*, destination: str, position: int, relayed: int) -> None:
    """Record that the broker confirmed every event up to ``position``."""
    _rows_nofetch(
        ADVANCE_RELAY_CURSOR,
        {"destination": destination, "position": position, "relayed": relayed},
    )


# ---------------------------------------------------------------- benchmark

# Synthetic history for measuring the dashboard at scale: `count` tasks of `agents`,
# created over the last `days`, mostly completed, with pending, dead, failed and
# cancelled shares. The 'seed:' task type marks them.
SEED_TASKS = """
INSERT INTO tasks (agent_name, task_type, payload, priority, status, attempts, max_attempts,
                   available_at, started_at, finished_at, error_info, result,
                   created_at, updated_at)
SELECT agent, 'seed:' || agent, jsonb_build_object('sku', 'SKU-' || n, 'batch', %(batch)s),
       n %% 4, status, CASE WHEN status IN ('dead', 'failed') THEN 3 ELSE 1 END, 3,
       created, CASE WHEN status <> 'pending' THEN created + interval '2 seconds' END,
       CASE WHEN status <> 'pending' THEN created + interval '3 seconds' END,
       CASE WHEN status IN ('dead', 'failed') THEN jsonb_build_object(
           'type', (ARRAY['TimeoutError', 'InvalidPayload', 'ConnectionError'])[1 + n %% 3],
           'message', 'seeded failure of SKU-' || n, 'retryable', status = 'dead') END,
       CASE WHEN status = 'completed' THEN '{"ok": true}'::jsonb END,
       created, created
FROM (
    SELECT n,
           (%(agents)s::text[])[1 + n %% cardinality(%(agents)s::text[])] AS agent,
           CASE WHEN r < %(pending)s THEN 'pending'
                WHEN r < %(pending)s + %(dead)s THEN 'dead'
                WHEN r < %(pending)s + %(dead)s + %(failed)s THEN 'failed'
                WHEN r < %(pending)s + %(dead)s + %(failed)s + %(cancelled)s THEN 'cancelled'
                ELSE 'completed' END AS status,
           now() - roll.t * make_interval(days => %(days)s) AS created
    FROM (
        -- Two draws per row (volatile, so this subquery is not flattened).
        SELECT n, random() AS r, random() AS t
        FROM generate_series(%(start)s, %(start)s + %(count)s - 1) AS n
    ) AS roll
) AS seeded
"""


def seed_tasks(
    *,
    start: int,
    count: int,
    agents: Sequence[str],
    shares: dict[str, float],
    days: int,
    batch: str,
) -> int:
    """Insert ``count`` synthetic tasks; ``shares`` of pending, dead, failed, cancelled."""
    params = {"start": start, "count": count, "agents": list(agents), "days": days,
              "batch": batch, **shares}  # fmt: skip
    return _rows_nofetch(SEED_TASKS, params)


ANALYZE_TASKS = "ANALYZE tasks"


def analyze_tasks() -> None:
    """Refresh the planner's statistics of tasks (the overview's estimates read them)."""
    _rows_nofetch(ANALYZE_TASKS, {})


TASK_PROGRESS = """
SELECT count(*) FILTER (WHERE status IN ('completed', 'failed', 'dead', 'cancelled')),
       count(*)
FROM tasks WHERE workflow_id = %(workflow_id)s
"""


def task_progress(workflow_id: UUID) -> tuple[int, int]:
    """(finished, total) tasks of a workflow."""
    return _rows(TASK_PROGRESS, {"workflow_id": workflow_id})[0]


TASK_TIMES = """
SELECT id, started_at, finished_at FROM tasks WHERE workflow_id = %(workflow_id)s
"""


def task_times(workflow_id: UUID) -> list[tuple[UUID, datetime | None, datetime | None]]:
    return _rows(TASK_TIMES, {"workflow_id": workflow_id})


DELETE_WORKFLOW_TASKS = """
WITH doomed AS (SELECT id FROM tasks WHERE workflow_id = %(workflow_id)s),
events AS (
    SELECT id FROM agent_events WHERE task_id IN (SELECT id FROM doomed)
),
jobs AS (DELETE FROM embedding_jobs WHERE agent_event_id IN (SELECT id FROM events)),
deleted_events AS (DELETE FROM agent_events WHERE id IN (SELECT id FROM events)),
history AS (DELETE FROM task_history WHERE task_id IN (SELECT id FROM doomed))
DELETE FROM tasks WHERE id IN (SELECT id FROM doomed)
"""


def delete_workflow_tasks(workflow_id: UUID) -> int:
    """Delete a workflow's tasks with their history, events and embedding jobs."""
    return _rows_nofetch(DELETE_WORKFLOW_TASKS, {"workflow_id": workflow_id})
