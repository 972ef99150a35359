"""What the dashboard, the API and the stats read of the tasks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from task_queue.sql.db import fetch

# Tasks that reached their final status in the last 15 minutes, per agent: the
# partial index tasks_finished_idx finds them without reading older tasks.
RECENT_FINISHED_TASKS = """
SELECT agent_name,
       count(*) FILTER (WHERE status = 'completed' AND finished_at >= now() - interval '1 minute'),
       count(*) FILTER (WHERE status = 'completed' AND finished_at >= now() - interval '5 minutes'),
       count(*) FILTER (WHERE status = 'completed'),
       count(*) FILTER (WHERE status IN ('failed', 'dead')
                          AND finished_at >= now() - interval '1 minute'),
       count(*) FILTER (WHERE status IN ('failed', 'dead')
                          AND finished_at >= now() - interval '5 minutes'),
       count(*) FILTER (WHERE status IN ('failed', 'dead')),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY EXTRACT(EPOCH FROM started_at - available_at))
           FILTER (WHERE started_at >= available_at),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY EXTRACT(EPOCH FROM finished_at - started_at))
           FILTER (WHERE started_at IS NOT NULL)
FROM tasks
WHERE status IN ('completed', 'failed', 'dead', 'cancelled')
  AND finished_at >= now() - interval '15 minutes'
GROUP BY agent_name
"""


@dataclass(frozen=True, slots=True)
class RecentActivity:
    agent_name: str
    completed: tuple[int, int, int]  # in the last 1, 5 and 15 minutes
    failed: tuple[int, int, int]  # failed or dead, likewise
    queue_wait_seconds: tuple[float, float, float] | None  # p50, p95, p99
    run_seconds: tuple[float, float, float] | None


def recent_activity() -> list[RecentActivity]:
    """Per agent: what finished in the last 1/5/15 minutes and how long it waited and ran.

    Queue wait is from when a task was due (``available_at``) to its last start.
    """
    return [
        RecentActivity(
            agent,
            (c1, c5, c15),
            (f1, f5, f15),
            tuple(wait) if wait else None,
            tuple(run) if run else None,
        )
        for agent, c1, c5, c15, f1, f5, f15, wait, run in fetch(RECENT_FINISHED_TASKS, {})
    ]


# Completions and failures per minute over the last hour (the overview's charts): the
# minute rollups where they are computed, and from the tasks (tasks_finished_idx)
# for the minutes since. Minutes with none are absent.
FINISHED_PER_MINUTE = """
WITH bounds AS (
    SELECT date_bin('1 minute', now(), 'epoch') - interval '59 minutes' AS hour_start,
           COALESCE((SELECT computed_until FROM metrics_rollup_progress
                     WHERE bucket_seconds = 60), '-infinity') AS rolled_until
)
SELECT m.bucket_start, sum(m.tasks_completed)::int, sum(m.tasks_failed + m.tasks_dead)::int
FROM task_queue_metrics m, bounds
WHERE m.bucket_seconds = 60 AND m.bucket_start >= bounds.hour_start
  AND m.bucket_start < bounds.rolled_until
GROUP BY m.bucket_start
UNION ALL
SELECT date_bin('1 minute', t.finished_at, 'epoch'),
       count(*) FILTER (WHERE t.status = 'completed'),
       count(*) FILTER (WHERE t.status IN ('failed', 'dead'))
FROM tasks t, bounds
WHERE t.status IN ('completed', 'failed', 'dead', 'cancelled')
  AND t.finished_at >= greatest(bounds.hour_start, bounds.rolled_until)
GROUP BY 1
"""


def finished_per_minute() -> list[tuple[datetime, int, int]]:
    """(minute, completed, failed or dead) for the minutes of the last hour with any."""
    return fetch(FINISHED_PER_MINUTE, {})


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
