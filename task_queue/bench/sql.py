"""The benchmark's statements (``queue_bench``, ``seed_tasks``, ``dashboard_bench``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from task_queue.sql.db import execute, fetch

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
    return execute(SEED_TASKS, params)


ANALYZE_TASKS = "ANALYZE tasks"

# The whole database: the rows earlier runs deleted (tasks, history, events) are
# cleaned up before a measurement, not by autovacuum in the middle of it, which
# counted in PostgreSQL's CPU per task and took a core from the drain in some runs.
VACUUM_DATABASE = "VACUUM (ANALYZE)"


def vacuum_database() -> None:
    """Vacuum and analyze every table (outside a transaction: Django's autocommit)."""
    execute(VACUUM_DATABASE, {})


def analyze_tasks() -> None:
    """Refresh the planner's statistics of tasks (the overview's estimates read them)."""
    execute(ANALYZE_TASKS, {})


TASK_PROGRESS = """
SELECT count(*) FILTER (WHERE status IN ('completed', 'failed', 'dead', 'cancelled')),
       count(*)
FROM tasks WHERE workflow_id = %(workflow_id)s
"""


def task_progress(workflow_id: UUID) -> tuple[int, int]:
    """(finished, total) tasks of a workflow."""
    return fetch(TASK_PROGRESS, {"workflow_id": workflow_id})[0]


# An agent's unfinished tasks, from the running totals (task_counts): no scan of tasks.
UNFINISHED_OF_AGENT = """
SELECT COALESCE(sum(n), 0)::bigint FROM task_counts
WHERE agent_name = %(agent)s AND status IN ('pending', 'leased', 'running')
"""


def unfinished_of_agent(agent: str) -> int:
    return fetch(UNFINISHED_OF_AGENT, {"agent": agent})[0][0]


TASK_TIMES = """
SELECT id, started_at, finished_at FROM tasks WHERE workflow_id = %(workflow_id)s
"""


def task_times(workflow_id: UUID) -> list[tuple[UUID, datetime | None, datetime | None]]:
    return fetch(TASK_TIMES, {"workflow_id": workflow_id})


# A benchmark's tasks with their history, events and embedding jobs; {doomed} selects
# the tasks' ids (each once). Joins (USING), not IN (SELECT …): the semi-join's hash
# aggregate over 100,000 new ids once ran on CPU for over 15 minutes (PostgreSQL 18,
# a backtrace inside its hash table's insert) where the same delete takes a second.
_DELETE_TASKS = """
WITH doomed AS ({doomed}),
events AS (
    SELECT e.id FROM agent_events e JOIN doomed d ON e.task_id = d.id
),
jobs AS (DELETE FROM embedding_jobs j USING events e WHERE j.agent_event_id = e.id),
deleted_events AS (DELETE FROM agent_events a USING events e WHERE a.id = e.id),
history AS (DELETE FROM task_history h USING doomed d WHERE h.task_id = d.id)
DELETE FROM tasks t USING doomed d WHERE t.id = d.id
"""
DELETE_WORKFLOW_TASKS = _DELETE_TASKS.format(
    doomed="SELECT id FROM tasks WHERE workflow_id = %(workflow_id)s"
)
DELETE_TASKS = _DELETE_TASKS.format(doomed="SELECT unnest(%(ids)s::uuid[]) AS id")


def delete_workflow_tasks(workflow_id: UUID) -> int:
    """Delete a workflow's tasks with their history, events and embedding jobs."""
    return execute(DELETE_WORKFLOW_TASKS, {"workflow_id": workflow_id})


def delete_tasks(ids: Sequence[UUID]) -> int:
    """Delete these tasks with their history, events and embedding jobs."""
    return execute(DELETE_TASKS, {"ids": list(ids)})


# The WAL's current position in bytes, and the process id of this session's backend
# (its parent is the postmaster). The position, not pg_stat_wal's wal_bytes: backends
# add to those statistics at most once a second, so they lag the drain's end.
SERVER_COUNTERS = """
SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, pg_backend_pid()
"""


def server_counters() -> tuple[int, int]:
    """(the WAL's insert position in bytes, this session's backend pid)."""
    return fetch(SERVER_COUNTERS, {})[0]
