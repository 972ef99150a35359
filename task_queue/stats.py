"""Queue counts for `queue_stats`, the API, the dashboard and Prometheus."""

from typing import Any

from task_queue.sql import reading

from .models import TaskStatus

# Below this many rows (the planner's estimate) the tasks table is counted exactly;
# above it, dashboards take the planner's figures for the bulk of finished tasks.
EXACT_COUNT_BELOW_ROWS = 100_000
ESTIMATED_STATUSES = (TaskStatus.COMPLETED, TaskStatus.CANCELLED)


def task_counts() -> tuple[list[tuple[str, str, int]], bool]:
    """(agent, status, count) rows, and whether completed and cancelled are estimates.

    Pending, held, dead and failed tasks are always counted exactly (their partial
    indexes); completed and cancelled ones, the bulk of a large table, are taken from
    the planner's statistics once the table holds EXACT_COUNT_BELOW_ROWS rows.
    """
    estimates = []
    if reading.estimated_table_rows() >= EXACT_COUNT_BELOW_ROWS:
        estimates = reading.estimate_tasks_by_agent_and_status()
    if not estimates:
        # No statistics (a small table, never analysed, or statistics this role may
        # not read): count exactly, slower at scale but never wrong.
        return reading.count_tasks_by_agent_and_status(), False
    finished = [row for row in estimates if row[1] in ESTIMATED_STATUSES]
    return reading.count_open_tasks() + finished, True


def queue_stats() -> dict[str, Any]:
    """``totals`` (every status), ``by_agent`` (agent → every status) and the age in
    seconds of the longest-waiting due pending task (None when none waits)."""
    totals = dict.fromkeys(TaskStatus.values, 0)
    by_agent: dict[str, dict[str, int]] = {}
    for agent, status, count in reading.count_tasks_by_agent_and_status():
        totals[status] += count
        by_agent.setdefault(agent, dict.fromkeys(TaskStatus.values, 0))[status] = count
    return {
        "totals": totals,
        "by_agent": dict(sorted(by_agent.items())),
        "oldest_pending_age_seconds": reading.oldest_pending_age_seconds(),
    }
