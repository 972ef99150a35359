"""What the dashboard, the API and the stats read of the tasks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from task_queue.sql import counts
from task_queue.sql.db import fetch

# Queue wait and run time per agent, of the latest tasks (at most ``sample``, of all
# agents) that reached their final status in the last 15 minutes: the partial index
# tasks_finished_idx gives them newest first, so the read stops after the sample
# however many tasks finished. Cancelled tasks are read but not measured (one
# cancelled from the dead letter would count the hours since its last start): left
# out of the scan, a bulk cancel would make it read on through every one of them.
RECENT_TIMINGS = """
SELECT agent_name,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY EXTRACT(EPOCH FROM started_at - available_at))
           FILTER (WHERE started_at >= available_at AND status <> 'cancelled'),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY EXTRACT(EPOCH FROM finished_at - started_at))
           FILTER (WHERE started_at IS NOT NULL AND status <> 'cancelled')
FROM (
    SELECT agent_name, status, available_at, started_at, finished_at
    FROM tasks
    WHERE status IN ('completed', 'failed', 'dead', 'cancelled')
      AND finished_at >= now() - interval '15 minutes'
    ORDER BY finished_at DESC
    LIMIT %(sample)s
) AS latest
GROUP BY agent_name
"""
# Percentiles of at most this many of the latest finished tasks: exact for a queue that
# finishes fewer in 15 minutes, the latest ones for a busier one (about 18 ms to read
# at ten million tasks). In a busy queue the sample may hold none of a quiet agent's
# tasks: it then shows counts without percentiles.
TIMINGS_SAMPLE = 5000


@dataclass(frozen=True, slots=True)
class RecentActivity:
    agent_name: str
    completed: tuple[int, int, int]  # in the last 1, 5 and 15 minutes
    failed: tuple[int, int, int]  # failed or dead, likewise
    queue_wait_seconds: tuple[float, float, float] | None  # p50, p95, p99
    run_seconds: tuple[float, float, float] | None


def recent_activity() -> list[RecentActivity]:
    """Per agent: what finished in the last 1/5/15 minutes (the finish counters, to
    the 10 seconds) and how long the latest of those tasks (``TIMINGS_SAMPLE`` of all
    agents', cancelled ones left out) waited and ran. Queue wait is from when a task
    was due (``available_at``) to its last start."""
    timings = {
        agent: (_percentiles(wait), _percentiles(run))
        for agent, wait, run in fetch(RECENT_TIMINGS, {"sample": TIMINGS_SAMPLE})
    }
    finishes = counts.recent_finishes()
    none_finished = ((0, 0, 0), (0, 0, 0))
    return [
        RecentActivity(
            agent, *finishes.get(agent, none_finished), *timings.get(agent, (None, None))
        )
        for agent in sorted(finishes.keys() | timings.keys())
    ]


def _percentiles(values: list[float] | None) -> tuple[float, float, float] | None:
    """p50, p95 and p99 as PostgreSQL's array gives them (NULL: nothing measured)."""
    return tuple(values) if values else None


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
    return dict(fetch(OLDEST_PENDING_AGE_BY_AGENT, {"agents": list(agents)}))


# The transactions of this database that hold back the removal of dead row versions:
# those with a snapshot (backend_xmin) or a transaction id (backend_xid) of their own.
# While one is open, each claim steps over the lease-index entries of every task
# claimed since it began (docs/performance.md, "A snapshot held open"). VACUUM does
# not hold the horizon back for others; ANALYZE does, so an autovacuum worker counts
# only while it analyses (its query says "VACUUM ANALYZE" through both phases). A role
# without pg_read_all_stats sees only its own role's transactions here.
OLDEST_HORIZON_TRANSACTION_AGE = """
SELECT COALESCE(EXTRACT(EPOCH FROM max(clock_timestamp() - xact_start)), 0)::float8
FROM pg_stat_activity
WHERE datname = current_database()
  AND pid <> pg_backend_pid()
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
  AND (backend_type <> 'autovacuum worker'
       OR pid IN (SELECT pid FROM pg_stat_progress_analyze))
"""


def oldest_horizon_transaction_age() -> float:
    """Seconds the oldest transaction holding back dead-row cleanup has been open (0:
    none)."""
    return fetch(OLDEST_HORIZON_TRANSACTION_AGE, {})[0][0]


def _api_time(column: str) -> str:
    """``column`` (timestamptz) as JSON text the way the API writes a time (pydantic's
    serializer, ``automechanica.api.main.FastJsonRenderer``): UTC, to the microsecond,
    no fraction when there is none, and ``Z``. NULL stays NULL."""
    utc = f"({column} AT TIME ZONE 'UTC')"
    return (
        f"to_char({utc}, CASE WHEN date_part('microseconds', {utc})::bigint %% 1000000 = 0 "
        """THEN 'YYYY-MM-DD"T"HH24:MI:SS"Z"' ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"' END)"""
    )


# A task ``t`` as the API's TaskOut shows it, for ``json_agg(shown ...)`` with
# ``CROSS JOIN LATERAL (TASK_AS_API) AS shown``: built by PostgreSQL, so answering a
# batch of 1,000 new tasks makes no Python object per task. tests/test_api_tasks.py
# and tests/test_bulk_enqueue.py compare it with the API's own rendering of each task.
TASK_AS_API = f"""
    SELECT t.id, t.workflow_id, t.agent_name, t.task_type, t.payload, t.payload_ref,
           t.priority, t.status, t.attempts, t.max_attempts,
           {_api_time("t.available_at")} AS available_at, t.lease_owner,
           {_api_time("t.lease_expires_at")} AS lease_expires_at,
           {_api_time("t.cancel_requested_at")} AS cancel_requested_at, t.error_info,
           t.result, t.result_ref, '[]'::json AS omitted, t.idempotency_key, t.trace_id,
           t.progress, t.progress_message, {_api_time("t.started_at")} AS started_at,
           {_api_time("t.finished_at")} AS finished_at,
           {_api_time("t.created_at")} AS created_at,
           {_api_time("t.updated_at")} AS updated_at
"""

# Tasks as one JSON array (TASK_AS_API) in the order of ``ids`` (an id given twice is
# there twice).
TASKS_AS_API_JSON = f"""
SELECT COALESCE(json_agg(shown ORDER BY given.ord), '[]')::text
FROM unnest(%(ids)s::uuid[]) WITH ORDINALITY AS given(id, ord)
JOIN tasks t ON t.id = given.id
CROSS JOIN LATERAL ({TASK_AS_API}) AS shown
"""


def tasks_as_api_json(ids: Sequence[UUID]) -> str:
    """The JSON array of these tasks as the API shows them (``TASKS_AS_API_JSON``)."""
    return fetch(TASKS_AS_API_JSON, {"ids": list(ids)})[0][0]


TASK_WORKFLOWS = """
SELECT id::text, workflow_id::text FROM tasks
WHERE id = ANY(%(ids)s::uuid[]) AND workflow_id IS NOT NULL
"""


def task_workflows(ids: Sequence[str]) -> dict[str, str]:
    """The workflow of each of these tasks that is in one (task id → workflow id)."""
    return dict(fetch(TASK_WORKFLOWS, {"ids": list(ids)}))
