"""Retention of the queue's tables: finished tasks and workflows, heartbeat counts,
minute rollups (``task_queue.maintenance.retention`` runs them).
"""

from __future__ import annotations

from datetime import datetime

from task_queue.sql.db import execute, fetch

# Completed and cancelled tasks are final: nothing changes them again, so deleting
# them races with no worker. Rows someone has locked anyway (an operator's action
# looking at them) are skipped, never waited for. A task of a workflow goes only with
# its workflow (PRUNE_FINISHED_WORKFLOWS), so that no workflow loses some of its tasks
# and shows a status its history does not support.
PRUNE_FINISHED_TASKS = """
WITH doomed AS (
    SELECT id FROM tasks
    WHERE status IN ('completed', 'cancelled') AND finished_at < %(cutoff)s
      AND workflow_id IS NULL
    ORDER BY finished_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
history AS (
    DELETE FROM task_history h USING doomed WHERE h.task_id = doomed.id
)
DELETE FROM tasks t USING doomed WHERE t.id = doomed.id
"""


# Closed (or cancelled) workflows created before the cutoff whose every task was
# completed or cancelled before it: the workflow, its tasks and their history. An
# escalated one stays until an operator resumes or cancels it (task_queue.escalation).
PRUNE_FINISHED_WORKFLOWS = """
WITH doomed AS (
    SELECT w.id FROM workflows w
    WHERE (NOT w.open OR w.cancelled_at IS NOT NULL) AND w.created_at < %(cutoff)s
      AND (w.escalated_at IS NULL OR w.cancelled_at IS NOT NULL)
      AND NOT EXISTS (
          SELECT FROM tasks t
          WHERE t.workflow_id = w.id
            AND (t.status NOT IN ('completed', 'cancelled') OR t.finished_at >= %(cutoff)s))
    ORDER BY w.created_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
doomed_tasks AS (
    SELECT t.id FROM tasks t JOIN doomed ON t.workflow_id = doomed.id
),
history AS (
    DELETE FROM task_history h USING doomed_tasks d WHERE h.task_id = d.id
),
tasks_gone AS (
    DELETE FROM tasks t USING doomed_tasks d WHERE t.id = d.id RETURNING t.id
),
workflows_gone AS (
    DELETE FROM workflows w USING doomed WHERE w.id = doomed.id RETURNING w.id
)
SELECT (SELECT count(*) FROM tasks_gone), (SELECT count(*) FROM workflows_gone)
"""


# Heartbeat counts once every width has rolled them up; minute rollups once the
# hours hold them (hours and days are kept).
PRUNE_WORKER_HEARTBEATS = """
DELETE FROM worker_heartbeats
WHERE minute < %(cutoff)s
  AND minute < (SELECT min(computed_until) FROM metrics_rollup_progress)
"""


PRUNE_MINUTE_METRICS = """
DELETE FROM task_queue_metrics
WHERE bucket_seconds = 60 AND bucket_start < %(cutoff)s
  AND bucket_start < (SELECT computed_until FROM metrics_rollup_progress
                      WHERE bucket_seconds = 3600)
"""


def prune_finished_tasks(*, cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` completed or cancelled tasks outside any workflow that
    finished before ``cutoff``, with their history; returns how many."""
    return execute(PRUNE_FINISHED_TASKS, {"cutoff": cutoff, "batch": batch})


def prune_finished_workflows(*, cutoff: datetime, batch: int) -> tuple[int, int]:
    """Delete up to ``batch`` finished workflows with their tasks and history;
    returns (tasks, workflows) deleted."""
    return fetch(PRUNE_FINISHED_WORKFLOWS, {"cutoff": cutoff, "batch": batch})[0]


def prune_worker_heartbeats(*, cutoff: datetime) -> int:
    return execute(PRUNE_WORKER_HEARTBEATS, {"cutoff": cutoff})


def prune_minute_metrics(*, cutoff: datetime) -> int:
    return execute(PRUNE_MINUTE_METRICS, {"cutoff": cutoff})
