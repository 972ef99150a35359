"""The alert rules' statements: the figures an evaluation reads (from the running
counters, never a count of the tasks table) and the deliveries' lease."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from task_queue.leases import Lease, backoff
from task_queue.sql import locks
from task_queue.sql.db import execute, fetch

# Per agent, the tasks that finished in the last %(window)s seconds (at most the
# finish counters' hour), from the 10-second buckets that began in it: completed, and
# ended failed or dead (cancelled ones are neither); agents with none are left out.
# Like every reader of these counters, in a transaction under 10 minutes old
# (migration queue 0028).
FINISHED_IN_WINDOW = """
SELECT agent_name,
       COALESCE(sum(n) FILTER (WHERE status = 'completed'), 0)::bigint,
       COALESCE(sum(n) FILTER (WHERE status IN ('failed', 'dead')), 0)::bigint
FROM task_finish_counts
WHERE bucket_start >= now() - make_interval(secs => %(window)s)
  AND status IN ('completed', 'failed', 'dead')
GROUP BY agent_name HAVING sum(n) > 0
"""


def finished_in_window(window_seconds: int) -> dict[str, tuple[int, int]]:
    """Agent → (completed, failed or dead) in the last ``window_seconds``, to the 10 s."""
    return {
        agent: (completed, bad)
        for agent, completed, bad in fetch(FINISHED_IN_WINDOW, {"window": window_seconds})
    }


# Per agent, the leases the reaper took back in the last %(window)s seconds (its
# history rows, through their own index: as many as expired).
LEASES_EXPIRED_IN_WINDOW = """
SELECT t.agent_name, count(*)
FROM task_history h
JOIN tasks t ON t.id = h.task_id
WHERE h.event = 'lease_expired'
  AND h.occurred_at >= now() - make_interval(secs => %(window)s)
GROUP BY t.agent_name
"""


def leases_expired_in_window(window_seconds: int) -> dict[str, int]:
    """Agent → leases expired in the last ``window_seconds``."""
    return dict(fetch(LEASES_EXPIRED_IN_WINDOW, {"window": window_seconds}))


# Per agent, the latest missed slot of its schedules found in the last %(window)s
# seconds: how late it was (skipped, or fired past the grace); schedules are few.
SCHEDULES_LATE_IN_WINDOW = """
SELECT agent_name, max(late_by_seconds) FROM schedules
WHERE late_at >= now() - make_interval(secs => %(window)s)
GROUP BY agent_name
"""


def schedules_late_in_window(window_seconds: int) -> dict[str, float]:
    """Agent → seconds its latest missed slot in the last ``window_seconds`` was late."""
    return dict(fetch(SCHEDULES_LATE_IN_WINDOW, {"window": window_seconds}))


# The agents served by a worker, in-process or remote, that heartbeat within a lease.
SERVED_AGENTS = """
SELECT DISTINCT unnest(agents) FROM workers
WHERE last_heartbeat_at >= now() - make_interval(secs => %(lease_seconds)s)
"""


def served_agents(lease_seconds: float) -> set[str]:
    return {agent for (agent,) in fetch(SERVED_AGENTS, {"lease_seconds": lease_seconds})}


DELIVERY_LEASE = Lease(
    table="alert_deliveries",
    token="lease_token",
    ends="lease_expires_at",
    held=("sending",),
    recovery_lock=locks.ALERT_DELIVERY_RECOVERY,
    id_type="bigint",
    clock="clock_timestamp()",
)
_NOW = DELIVERY_LEASE.now

# Due deliveries, oldest first, leased to a sender for %(lease_seconds)s: each claim
# counts an attempt, so one a sender died in is not tried for ever.
CLAIM_DELIVERIES = f"""
WITH due AS (
    SELECT id FROM alert_deliveries
    WHERE status = 'pending' AND available_at <= {_NOW}
    ORDER BY available_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE alert_deliveries d
SET status = 'sending', attempts = d.attempts + 1, {DELIVERY_LEASE.grant()}
FROM due, alert_notifications n
WHERE d.id = due.id AND n.id = d.notification_id
RETURNING d.id, d.lease_token, d.attempts, d.channel, n.body
"""

# The outcome of an attempt, by its lease's holder only: sent; or failed, tried again
# after ``attempt² × %(base_delay)s`` seconds, or failed for good once its attempts are
# spent. The attempt is recorded with it.
FINISH_DELIVERY = f"""
WITH finished AS (
    UPDATE alert_deliveries d
    SET status = CASE WHEN %(ok)s THEN 'sent'
                      WHEN d.attempts >= d.max_attempts THEN 'failed'
                      ELSE 'pending' END,
        sent_at = CASE WHEN %(ok)s THEN {_NOW} END,
        available_at = CASE WHEN %(ok)s THEN d.available_at
                            ELSE {_NOW} + {backoff("d.attempts", "%(base_delay)s")} END,
        {DELIVERY_LEASE.clear()}
    WHERE {DELIVERY_LEASE.fenced("d")}
    RETURNING d.id, d.attempts, d.status
),
tried AS (
    INSERT INTO alert_delivery_attempts (delivery_id, attempt, ok, http_status, error, at)
    SELECT id, attempts, %(ok)s, %(http_status)s, %(error)s, {_NOW} FROM finished
)
SELECT status FROM finished
"""

# Deliveries whose sender died mid-send: due again at once (the attempt counted), or
# failed once their attempts are spent.
RECOVER_DELIVERIES = f"""
WITH expired AS (
    SELECT id FROM alert_deliveries d WHERE {DELIVERY_LEASE.expired("d")}
    ORDER BY lease_expires_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE alert_deliveries d
SET status = CASE WHEN d.attempts >= d.max_attempts THEN 'failed' ELSE 'pending' END,
    available_at = {_NOW}, {DELIVERY_LEASE.clear()}
FROM expired WHERE d.id = expired.id
RETURNING d.id
"""


def claim_deliveries(
    *, owner: str, limit: int, lease_seconds: float, now: datetime | None = None
) -> list[tuple[int, Any, int, dict, dict]]:
    """(id, lease token, attempt, channel, body) of up to ``limit`` due deliveries."""
    params = {"owner": owner, "limit": limit, "lease_seconds": lease_seconds, "now": now}
    # Django's connection reads jsonb as text (JSONField decodes it).
    return [
        (delivery_id, token, attempt, json.loads(channel), json.loads(body))
        for delivery_id, token, attempt, channel, body in fetch(CLAIM_DELIVERIES, params)
    ]


def finish_delivery(
    *,
    delivery_id: int,
    token: Any,
    ok: bool,
    http_status: int | None,
    error: str,
    base_delay: float,
    now: datetime | None = None,
) -> str | None:
    """Record an attempt's outcome; the delivery's new status, or None when the lease
    was no longer this sender's (nothing written)."""
    rows = fetch(
        FINISH_DELIVERY,
        {
            "id": delivery_id,
            "token": token,
            "ok": ok,
            "http_status": http_status,
            "error": error,
            "base_delay": base_delay,
            "now": now,
        },
    )
    return rows[0][0] if rows else None


# Notifications made before the cutoff whose every delivery has ended (sent or
# failed), with their deliveries and attempts (retention). Alerts are rare: the
# table is small, and a scan of it costs little.
PRUNE_NOTIFICATIONS = """
WITH doomed AS (
    SELECT n.id FROM alert_notifications n
    WHERE n.created_at < %(cutoff)s
      AND NOT EXISTS (SELECT FROM alert_deliveries d
                      WHERE d.notification_id = n.id AND d.status IN ('pending', 'sending'))
    ORDER BY n.created_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
deliveries AS (
    DELETE FROM alert_deliveries d USING doomed WHERE d.notification_id = doomed.id
    RETURNING d.id
),
attempts AS (
    DELETE FROM alert_delivery_attempts a USING deliveries WHERE a.delivery_id = deliveries.id
)
DELETE FROM alert_notifications n USING doomed WHERE n.id = doomed.id
"""


def prune_notifications(*, cutoff: datetime, batch: int) -> int:
    return execute(PRUNE_NOTIFICATIONS, {"cutoff": cutoff, "batch": batch})


# Firings that ended before the cutoff (retention); one still firing stays.
PRUNE_FIRINGS = """
DELETE FROM alert_firings WHERE id IN (
    SELECT id FROM alert_firings
    WHERE ended_at < %(cutoff)s
    ORDER BY ended_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
"""


def prune_firings(*, cutoff: datetime, batch: int) -> int:
    return execute(PRUNE_FIRINGS, {"cutoff": cutoff, "batch": batch})
