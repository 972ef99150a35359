"""The running totals of tasks by agent and status (table ``task_counts``).

Triggers on ``tasks`` (migration ``queue 0014``) keep them in the transaction of
every change, each backend in rows of its own (``shard``, its pid), so readers never
count the tasks table and writers never wait on each other's counters. Readers sum
the shards; maintenance folds the rows of backends that ended into shard 0.
"""

from __future__ import annotations

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
