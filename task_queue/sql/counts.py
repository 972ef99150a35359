"""The running totals of tasks by agent and status (table ``task_counts``), and of
the tasks finished in the last hour by 10-second bucket (``task_finish_counts``).

Triggers on ``tasks`` (migrations ``queue 0014`` and ``0028``) keep them in the
transaction of every change, each backend in rows of its own (``shard``, its pid), so
readers never count the tasks table and writers never wait on each other's counters.
Readers sum the shards; maintenance folds the totals of backends that ended into shard
0, and deletes the finish buckets older than the triggers' reach.
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


# The rows of backends no longer connected, and rows at zero, moved into shard 0 in
# one statement (so the sums never change). SKIP LOCKED: a row a transaction holds
# (a new backend that reused the pid) is left for the next fold, so this never waits
# on a writer and a writer waits on it only as long as this statement.
FOLD_ENDED_BACKENDS = """
WITH ended AS (
    SELECT agent_name, status, shard FROM task_counts c
    WHERE c.shard <> 0
      AND (c.n = 0 OR NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = c.shard))
    FOR UPDATE SKIP LOCKED
),
folded AS (
    DELETE FROM task_counts c USING ended e
    WHERE (c.agent_name, c.status, c.shard) = (e.agent_name, e.status, e.shard)
    RETURNING c.agent_name, c.status, c.n
)
INSERT INTO task_counts AS c (agent_name, status, shard, n)
SELECT agent_name, status, 0, sum(n) FROM folded
GROUP BY agent_name, status ORDER BY agent_name, status
ON CONFLICT (agent_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n
"""


def fold_ended_backends() -> int:
    """Fold the counter rows of backends that ended into shard 0; how many pairs."""
    return execute(FOLD_ENDED_BACKENDS, {})


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
