"""The metric rollups (``task_queue_metrics``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from task_queue.sql.db import execute, fetch


def _histogram(name: str, source: str, column: str) -> str:
    """Two CTEs: ``{name}`` holds, per bucket and agent, the counts of ``column`` in
    each histogram slot (the SQL function ``task_histogram_slot`` of migration queue
    0029, which holds the bounds: slot i is above bound i-1, up to and including bound
    i, as Prometheus's ``le``; the last, beyond the last bound, is the slot of
    infinity), as one array with a zero for each empty slot."""
    return f"""
{name}_slots AS (
    SELECT bucket, agent_name, task_histogram_slot({column}) AS slot, count(*) AS n
    FROM {source} WHERE {column} IS NOT NULL GROUP BY 1, 2, 3
),
{name} AS (
    SELECT k.bucket, k.agent_name, array_agg(COALESCE(c.n, 0) ORDER BY s.slot) AS counts
    FROM (SELECT DISTINCT bucket, agent_name FROM {name}_slots) AS k
    CROSS JOIN generate_series(0, task_histogram_slot('Infinity')) AS s(slot)
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
    -- What a row counts as (outcome, run time, queue wait) is decided by the
    -- functions of migration queue 0029, which the Prometheus counters use too.
    SELECT date_bin(make_interval(secs => %(width)s), h.occurred_at, 'epoch') AS bucket,
           t.agent_name, h.error, task_attempt_outcome(h) AS outcome,
           task_attempt_run_seconds(h) AS run, task_attempt_wait_seconds(h) AS wait
    FROM task_history h JOIN tasks t ON t.id = h.task_id
    WHERE h.occurred_at >= %(since)s AND h.occurred_at < %(until)s
),
outcomes AS (
    SELECT bucket, agent_name,
           count(*) FILTER (WHERE outcome = 'completed') AS completed,
           count(*) FILTER (WHERE outcome = 'failed') AS failed,
           count(*) FILTER (WHERE outcome = 'dead') AS dead,
           count(*) FILTER (WHERE outcome = 'retried') AS retried,
           count(*) FILTER (WHERE outcome = 'cancelled') AS cancelled,
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


def recompute_metrics(width: int, since: datetime, until: datetime) -> int:
    """Replace the rollups of the ``width``-second buckets in [since, until) (bounds on
    bucket edges) with figures computed afresh; returns the rows written. Run it in a
    transaction: the old rows go and the new ones come at once."""
    params = {"width": width, "since": since, "until": until}
    execute(DELETE_METRICS, params)
    return execute(INSERT_METRICS, params)


def compute_metrics(width: int, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """The figures of the ``width``-second buckets in [since, until), computed now
    and stored nowhere (a bucket not closed yet)."""
    params = {"width": width, "since": since, "until": until}
    rows = [dict(zip(METRIC_COLUMNS, row, strict=True)) for row in fetch(METRICS, params)]
    for row in rows:  # jsonb comes back as text from raw SQL here
        row["error_rates_per_agent"] = json.loads(row["error_rates_per_agent"])
    return rows


START_ROLLUPS = """
INSERT INTO metrics_rollup_progress (bucket_seconds, computed_until)
SELECT width, %(start)s FROM unnest(%(widths)s::int[]) AS width
ON CONFLICT (bucket_seconds) DO NOTHING
"""


def start_rollups(widths: Sequence[int], start: datetime) -> None:
    """Record ``start`` as where the rollups of each width begin, unless they have."""
    execute(START_ROLLUPS, {"widths": list(widths), "start": start})


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
    rows = fetch(ROLLUP_PROGRESS, {"width": width})
    return rows[0][0] if rows else None


def set_rollup_progress(width: int, until: datetime) -> None:
    execute(SET_ROLLUP_PROGRESS, {"width": width, "until": until})
