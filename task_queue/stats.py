"""Queue counts for `queue_stats` and, later, the API and dashboard."""

from typing import Any

from . import queries
from .models import TaskStatus

# Below this many rows (the planner's estimate) the tasks table is counted exactly;
# above it, dashboards take the planner's figures for the bulk of finished tasks.
EXACT_COUNT_BELOW_ROWS = 100_000


def queue_stats() -> dict[str, Any]:
    """``totals`` (every status), ``by_agent`` (agent → every status) and the age in
    seconds of the longest-waiting due pending task (None when none waits)."""
    totals = dict.fromkeys(TaskStatus.values, 0)
    by_agent: dict[str, dict[str, int]] = {}
    for agent, status, count in queries.count_tasks_by_agent_and_status():
        totals[status] += count
        by_agent.setdefault(agent, dict.fromkeys(TaskStatus.values, 0))[status] = count
    return {
        "totals": totals,
        "by_agent": dict(sorted(by_agent.items())),
        "oldest_pending_age_seconds": queries.oldest_pending_age_seconds(),
    }
