"""The running totals of tasks by agent and status (table ``task_counts``), of the
tasks finished in the last hour by 10-second bucket (``task_finish_counts``), and of
everything created and every attempt's end since the start (``task_totals``, behind
Prometheus's counters).

Triggers on ``tasks`` and ``task_history`` (migrations ``queue 0014``, ``0028`` and
``0029``) keep them in the transaction of every change, each backend in rows of its
own (``shard``, its pid), so readers never count the tasks table and writers never
wait on each other's counters; the lease reaper's statement counts the leases it
expires (``lease_expired``) the same way. Readers sum the shards; maintenance folds the totals of
backends that ended into shard 0, and deletes the finish buckets older than the
triggers' reach.
"""

from __future__ import annotations

from datetime import datetime

from task_queue.sql.db import execute, fetch

# Pairs that netted to zero (every task of an agent gone from a status) are left out.
TASK_COUNTS = """
SELECT agent_name, status, sum(n)::bigint FROM task_counts
GROUP BY agent_name, status HAVING sum(n) <> 0
"""


def task_counts() -> list[tuple[str, str, int]]:
    """(agent, status, count) for every pair with tasks: exact, as of the snapshot."""
    return fetch(TASK_COUNTS, {})


def _fold_ended_backends(table: str, key: tuple[str, ...], sums: tuple[str, ...]) -> str:
    """The statement that moves the rows of backends no longer connected, and rows at
    zero, into shard 0 of a sharded counter table (key columns ``key``, counter
    columns ``sums``), in one statement, so the sums never change. SKIP LOCKED: a row
    a transaction holds (a new backend that reused the pid) is left for the next fold,
    so this never waits on a writer and a writer waits on it only as long as this
    statement."""
    zero = " AND ".join(f"c.{column} = 0" for column in sums)
    keys = ", ".join(key)
    return f"""
WITH ended AS (
    SELECT {keys}, shard FROM {table} c
    WHERE c.shard <> 0
      AND ({zero} OR NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = c.shard))
    FOR UPDATE SKIP LOCKED
),
folded AS (
    DELETE FROM {table} c USING ended e
    WHERE ({", ".join(f"c.{column}" for column in key)}, c.shard)
        = ({", ".join(f"e.{column}" for column in key)}, e.shard)
    RETURNING c.*
)
INSERT INTO {table} AS c ({keys}, shard, {", ".join(sums)})
SELECT {keys}, 0, {", ".join(f"sum({column})" for column in sums)} FROM folded
GROUP BY {keys} ORDER BY {keys}
ON CONFLICT ({keys}, shard) DO UPDATE
SET {", ".join(f"{column} = c.{column} + EXCLUDED.{column}" for column in sums)}
"""


FOLD_ENDED_COUNTS = _fold_ended_backends("task_counts", ("agent_name", "status"), ("n",))
FOLD_ENDED_TOTALS = _fold_ended_backends(
    "task_totals", ("agent_name", "measure", "slot"), ("n", "total")
)


def fold_ended_backends() -> int:
    """Fold the counter rows of backends that ended into shard 0 (``task_counts`` and
    ``task_totals``); how many (agent, status) pairs of ``task_counts``."""
    execute(FOLD_ENDED_TOTALS, {})
    return execute(FOLD_ENDED_COUNTS, {})


# Per agent, measure and slot, the running totals that Prometheus's counters and
# histograms show (task_totals, kept by the triggers of migration queue 0029 on
# tasks and task_history): a few rows per agent and live connection, whatever the
# queue's size or speed. The sums are added up exactly (numeric) and made floats
# once, so a histogram's sum never drops by a rounding however the shards were added
# or folded.
TASK_TOTALS = """
SELECT agent_name, measure, slot, sum(n)::bigint,
       (sum(sum(total)) OVER (PARTITION BY agent_name, measure))::float8
FROM task_totals
GROUP BY agent_name, measure, slot
"""


def task_totals() -> list[tuple[str, str, int, int, float]]:
    """(agent, measure, slot, count, sum): ``measure`` is ``created``, an outcome
    (``completed``, ``failed``, ``dead``, ``retried``, ``cancelled``; slot 0), a
    lease expired by the reaper (``lease_expired``, slot 0; also counted as its
    outcome), or a
    histogram (``run_time``, ``queue_wait``; a slot of HISTOGRAM_BOUNDS), and the sum
    is of every value of the measure (the histogram's sum; 0 for the others)."""
    return fetch(TASK_TOTALS, {})


# What finished in the last 1, 5 and 15 minutes per agent (the overview, its live
# snapshot, GET /api/v1/metrics), from the finish counters (task_finish_counts,
# migration queue 0028) instead of the tasks: the cost does not grow with the queue's
# throughput. A window is the 10-second buckets that began in it, so it reaches back
# between 10 s less than its length and its length. Like every reader of these
# counters, it must run in a transaction under 10 minutes old (migration 0028 says why).
RECENT_FINISHES = """
SELECT agent_name,
       COALESCE(sum(n) FILTER (WHERE status = 'completed'
                                 AND bucket_start >= now() - interval '1 minute'), 0)::bigint,
       COALESCE(sum(n) FILTER (WHERE status = 'completed'
                                 AND bucket_start >= now() - interval '5 minutes'), 0)::bigint,
       COALESCE(sum(n) FILTER (WHERE status = 'completed'), 0)::bigint,
       COALESCE(sum(n) FILTER (WHERE status IN ('failed', 'dead')
                                 AND bucket_start >= now() - interval '1 minute'), 0)::bigint,
       COALESCE(sum(n) FILTER (WHERE status IN ('failed', 'dead')
                                 AND bucket_start >= now() - interval '5 minutes'), 0)::bigint,
       COALESCE(sum(n) FILTER (WHERE status IN ('failed', 'dead')), 0)::bigint
FROM task_finish_counts
WHERE bucket_start >= now() - interval '15 minutes'
GROUP BY agent_name HAVING sum(n) <> 0
"""


def recent_finishes() -> dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """Agent → ((completed in the last 1, 5, 15 minutes), (failed or dead, likewise)),
    for the agents with any task finished in the last 15 minutes; to the 10 seconds."""
    return {
        agent: ((c1, c5, c15), (f1, f5, f15))
        for agent, c1, c5, c15, f1, f5, f15 in fetch(RECENT_FINISHES, {})
    }


# Completions and failures per minute over the last hour (the overview's charts).
FINISHED_PER_MINUTE = """
SELECT date_bin('1 minute', bucket_start, 'epoch'),
       COALESCE(sum(n) FILTER (WHERE status = 'completed'), 0)::int,
       COALESCE(sum(n) FILTER (WHERE status IN ('failed', 'dead')), 0)::int
FROM task_finish_counts
WHERE bucket_start >= date_bin('1 minute', now(), 'epoch') - interval '59 minutes'
GROUP BY 1
"""


def finished_per_minute() -> list[tuple[datetime, int, int]]:
    """(minute, completed, failed or dead) for the minutes of the last hour with any."""
    return fetch(FINISHED_PER_MINUTE, {})


# Buckets past the reach of migration 0028's triggers (70 minutes), which no reader
# reads any more (they look back an hour at most). SKIP LOCKED: a row a writer holds
# is left for the next pass, so this never waits on a writer or deadlocks with one.
DROP_OLD_FINISH_BUCKETS = """
WITH old AS (
    SELECT bucket_start, agent_name, status, shard FROM task_finish_counts
    WHERE bucket_start < now() - interval '70 minutes'
    FOR UPDATE SKIP LOCKED
)
DELETE FROM task_finish_counts c USING old
WHERE (c.bucket_start, c.agent_name, c.status, c.shard)
    = (old.bucket_start, old.agent_name, old.status, old.shard)
"""


def drop_old_finish_buckets() -> int:
    """Delete the finish counters past the triggers' reach; how many rows."""
    return execute(DROP_OLD_FINISH_BUCKETS, {})
