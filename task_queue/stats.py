"""Queue counts for `queue_stats`, the API, the dashboard and Prometheus.

The counts come from the running totals the writes keep (``task_queue.sql.counts``),
so they are exact and cost the same at a thousand tasks as at ten million.
"""

from typing import Any

from task_queue.sql import counts, reading

from .models import TaskStatus


def task_counts() -> list[tuple[str, str, int]]:
    """(agent, status, count) for every pair that has tasks."""
    return counts.task_counts()


def queue_stats() -> dict[str, Any]:
    """``totals`` (every status), ``by_agent`` (agent → every status) and the age in
    seconds of the longest-waiting due pending task (None when none waits)."""
    totals = dict.fromkeys(TaskStatus.values, 0)
    by_agent: dict[str, dict[str, int]] = {}
    for agent, status, count in task_counts():
        totals[status] += count
        by_agent.setdefault(agent, dict.fromkeys(TaskStatus.values, 0))[status] = count
    # One index probe per agent with pending tasks, rather than a scan of them all.
    waiting = [agent for agent, c in by_agent.items() if c[TaskStatus.PENDING]]
    ages = [age for age in reading.oldest_pending_age_by_agent(waiting).values() if age is not None]
    return {
        "totals": totals,
        "by_agent": dict(sorted(by_agent.items())),
        "oldest_pending_age_seconds": max(ages, default=None),
    }
