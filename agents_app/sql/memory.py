"""Agent memory: the embedding jobs queue (spec 001 §12) and retention of agent events."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from task_queue import leases
from task_queue.leases import Lease, backoff, held_params
from task_queue.sql import locks
from task_queue.sql.db import NOW, execute, fetch

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

# The AgentEvent of each completed task and its embedding job, written by the queue's
# completion statement (task_queue.sql.outcomes.add_to_completion, from
# AgentsConfig.ready): CTEs over its `completed` rows, so a completion writes all of
# them or none.
EVENTS_OF_COMPLETED_TASKS = f"""
events AS (
    INSERT INTO agent_events (task_id, workflow_id, agent_name, event_type, content, data,
                              result_ref, created_at)
    SELECT id, workflow_id, agent_name, 'task.completed', summary,
           -- A result in a blob is referenced, not copied.
           CASE WHEN result_ref IS NULL
                THEN jsonb_build_object('task_type', task_type, 'result', result)
                ELSE jsonb_build_object('task_type', task_type) END,
           result_ref, {NOW}
    FROM completed
    RETURNING id
),
embedding AS (
    INSERT INTO embedding_jobs (agent_event_id) SELECT id FROM events
)
"""


def prune_agent_events(*, cutoff: datetime, batch: int) -> int:
    return execute(PRUNE_AGENT_EVENTS, {"cutoff": cutoff, "batch": batch})


# The agent-memory queue (spec 001 §12): leased like tasks (task_queue.leases), on
# embedding_jobs. A claim counts the attempt, so a job whose embedder keeps dying is
# given up on (dead) after max_attempts like one that keeps failing.
EMBEDDING_LEASE = Lease(
    table="embedding_jobs",
    token="lease_token",
    ends="lease_expires_at",
    owner="lease_owner",
    held=("leased",),
    recovery_lock=locks.EMBEDDING_RECOVERY,
    id_type="bigint",
)
_NOW = EMBEDDING_LEASE.now

CLAIM_EMBEDDING_JOBS = f"""
WITH due AS (
    SELECT id FROM embedding_jobs
    WHERE status = 'pending' AND available_at <= {_NOW}
    ORDER BY available_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE embedding_jobs j
SET status = 'leased', attempts = j.attempts + 1, {EMBEDDING_LEASE.grant()},
    updated_at = {_NOW}
FROM due, agent_events e
WHERE j.id = due.id AND e.id = j.agent_event_id
RETURNING j.id, j.lease_token, e.id, e.content, e.task_id, e.agent_name
"""

# Fenced: a job whose lease expired and was claimed again is not completed by its
# first embedder's late answer.
COMPLETE_EMBEDDING_JOBS = f"""
WITH held AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(vectors)s::text[])
        AS d(id, lease_token, vector)
),
finished AS (
    UPDATE embedding_jobs j
    SET status = 'completed', {EMBEDDING_LEASE.clear()}, error_info = NULL,
        updated_at = {_NOW}
    FROM held
    WHERE {EMBEDDING_LEASE.fenced_batch("j")} AND j.status = 'leased'
    RETURNING j.id, j.agent_event_id, held.vector
)
UPDATE agent_events e SET embedding = finished.vector::vector
FROM finished WHERE e.id = finished.agent_event_id
RETURNING finished.id
"""

FAIL_EMBEDDING_JOB = f"""
UPDATE embedding_jobs j
SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'pending' END,
    available_at = {_NOW} + {backoff("j.attempts", "%(base_delay)s")},
    error_info = %(error)s::jsonb, {EMBEDDING_LEASE.clear()}, updated_at = {_NOW}
WHERE {EMBEDDING_LEASE.fenced("j")} AND j.status = 'leased'
RETURNING j.status
"""

RECOVER_EMBEDDING_JOBS = f"""
WITH expired AS (
    SELECT id FROM embedding_jobs j
    WHERE {EMBEDDING_LEASE.expired("j")}
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE embedding_jobs j
SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'pending' END,
    available_at = {_NOW}, {EMBEDDING_LEASE.clear()},
    error_info = jsonb_build_object('type', 'LeaseExpired',
                                    'message', 'the embedder stopped heartbeating'),
    updated_at = {_NOW}
FROM expired
WHERE j.id = expired.id
RETURNING j.id
"""


@dataclass(frozen=True, slots=True)
class ClaimedEmbeddingJob:
    id: int
    lease_token: UUID
    agent_event_id: int
    text: str
    task_id: UUID | None  # the event's task and agent, for the log lines about it
    agent_name: str


def claim_embedding_jobs(
    *, owner: str, limit: int, lease_seconds: float, now: datetime | None = None
) -> list[ClaimedEmbeddingJob]:
    params = {"owner": owner, "limit": limit, "lease_seconds": lease_seconds, "now": now}
    return [ClaimedEmbeddingJob(*row) for row in fetch(CLAIM_EMBEDDING_JOBS, params)]


def complete_embedding_jobs(
    done: Sequence[tuple[int, UUID, Sequence[float]]],
    *,
    owner: str,
    now: datetime | None = None,
) -> set[int]:
    """(job id, lease token, vector) each; returns the jobs whose lease ``owner``
    still held."""
    params = held_params(owner, [(d[0], d[1]) for d in done], now) | {
        "vectors": ["[" + ",".join(repr(float(v)) for v in d[2]) + "]" for d in done],
    }
    return {row[0] for row in fetch(COMPLETE_EMBEDDING_JOBS, params)}


def fail_embedding_job(
    job_id: int,
    token: UUID,
    error: dict[str, Any],
    base_delay: float,
    *,
    owner: str,
    now: datetime | None = None,
) -> str | None:
    """Back to pending after attempts² × base_delay seconds, or dead; None if the
    lease was lost."""
    params = {
        "id": job_id,
        "token": token,
        "owner": owner,
        "error": json.dumps(error),
        "base_delay": base_delay,
        "now": now,
    }
    rows = fetch(FAIL_EMBEDDING_JOB, params)
    return rows[0][0] if rows else None


def recover_embedding_jobs(*, now: datetime | None = None) -> int | None:
    """Jobs whose embedder stopped renewing its lease: pending again, or dead. How
    many; None when another embedder is recovering them right now."""
    return leases.recover_expired(EMBEDDING_LEASE, RECOVER_EMBEDDING_JOBS, now=now)
