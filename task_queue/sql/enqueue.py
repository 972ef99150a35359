"""Enqueueing tasks, idempotently, and waking the workers of their agents."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from task_queue.sql.channels import NOTIFY_CHANNEL
from task_queue.sql.db import NOW, fetch

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
                    {NOW} + make_interval(secs => COALESCE(delay_seconds, 0))),
           idempotency_key, idempotency_fingerprint, trace_id, clock_timestamp(), {NOW}
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
    result = fetch(ENQUEUE_TASKS, {"tasks": json.dumps(rows, default=str), "now": None})
    missing = [rows[ord_]["idempotency_key"] for ord_, task_id, _, _ in result if task_id is None]
    # A key whose row a concurrent transaction committed after this statement's
    # snapshot, or that came twice in this batch, is looked up anew.
    found = {
        key: (task_id, fingerprint)
        for key, task_id, fingerprint in (
            fetch(FIND_TASKS_BY_IDEMPOTENCY_KEY, {"keys": missing}) if missing else []
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
    fetch(NOTIFY_AGENTS, {"agents": sorted(set(agents))})
