"""The reaper's statements: expired leases given back, stale workers forgotten."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from task_queue.sql.db import NOW, execute, fetch
from task_queue.sql.leasing import TASK_LEASE

REAP_EXPIRED_LEASES = f"""
WITH expired AS (
    SELECT t.id, t.status, t.lease_owner, t.lease_token, t.cancel_requested_at IS NOT NULL
               AS cancel_requested
    FROM tasks t
    WHERE {TASK_LEASE.expired("t")}
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
        available_at = {NOW},
        error_info = CASE WHEN expired.status = 'running' THEN jsonb_build_object(
                'type', 'LeaseExpired',
                'message', 'lease expired: worker ' || expired.lease_owner
                           || ' stopped heartbeating while running the task',
                'retryable', true, 'attempt', t.attempts + 1,
                'worker', expired.lease_owner, 'at', {NOW})
            ELSE t.error_info END,
        finished_at = CASE WHEN expired.status = 'running' OR expired.cancel_requested
                           THEN {NOW} END,
        updated_at = {NOW},
        {TASK_LEASE.clear()}
    FROM expired
    WHERE t.id = expired.id
    RETURNING t.id, t.agent_name, t.status, t.attempts, t.started_at, t.error_info,
              t.trace_id, expired.status AS from_status, expired.lease_owner,
              expired.lease_token
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              lease_token, started_at, occurred_at, error, detail)
    SELECT id, 'lease_expired', from_status, status, attempts, 'reaper', lease_token,
           started_at, {NOW},
           CASE WHEN from_status = 'running' THEN error_info END,
           jsonb_build_object('worker', lease_owner)
    FROM reaped
),
-- Prometheus's automechanica_tasks_lease_expired_total (task_queue.sql.counts): the
-- reaper is what expires leases, so it counts them, as the triggers count the rest.
counted AS (
    INSERT INTO task_totals AS c (agent_name, measure, slot, shard, n, total)
    SELECT agent_name, 'lease_expired', 0, pg_backend_pid(), count(*), 0 FROM reaped
    GROUP BY agent_name ORDER BY agent_name
    ON CONFLICT (agent_name, measure, slot, shard) DO UPDATE SET n = c.n + EXCLUDED.n
)
SELECT id, agent_name, status, trace_id, attempts - (from_status = 'running')::int,
       lease_owner
FROM reaped
"""


def reap_expired_leases(
    *, limit: int, now: datetime | None
) -> list[tuple[UUID, str, str, str | None, int, str]]:
    """Return tasks whose lease ran out to pending (or dead); (id, agent, status, trace
    id, attempts counted before the one whose lease expired, lease holder) each.

    A task that was running counts the attempt, so a task that kills its worker
    every time ends dead instead of looping. A task only leased, never started,
    goes back without counting one.
    """
    return fetch(REAP_EXPIRED_LEASES, {"limit": limit, "now": now})


PRUNE_STALE_WORKERS = f"""
DELETE FROM workers
WHERE last_heartbeat_at < {NOW} - make_interval(secs => %(stale_seconds)s)
"""


def prune_stale_workers(*, stale_seconds: float, now: datetime | None) -> int:
    return execute(PRUNE_STALE_WORKERS, {"stale_seconds": stale_seconds, "now": now})
