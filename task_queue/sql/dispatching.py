"""The dispatcher's statements (``relay_events --dispatch``): which tasks became due,
and where its scan of due times stopped (``event_relay_cursors.dispatched_through``).

A task's due time is ``available_at``; ``updated_at`` is when its row last changed (the
enqueue, a retry, a reap, a revive). How far ahead of that change it fell due says who
publishes its command (task_queue.relay.dispatcher)."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from task_queue.sql.db import execute, fetch

# Pending tasks of agents not paused, among ``ids`` (the tasks of events just read).
# near: due at most ``horizon`` seconds after the change that made it pending.
DISPATCHABLE = """
SELECT t.id, t.agent_name, t.attempts, t.available_at, t.trace_id,
       t.available_at <= t.updated_at + make_interval(secs => %(horizon)s) AS near
FROM tasks t
WHERE t.id = ANY(%(ids)s::uuid[]) AND t.status = 'pending'
  AND NOT EXISTS (SELECT FROM paused_agents p WHERE p.agent_name = t.agent_name)
"""


def dispatchable(ids: list[UUID], *, horizon: float) -> list[tuple]:
    """(id, agent, attempts, available_at, trace_id, near) of those of ``ids`` that are
    pending and whose agent is not paused."""
    return fetch(DISPATCHABLE, {"ids": ids, "horizon": horizon})


# Pending tasks of agents not paused (of one agent, if given), due in (after, through],
# in due order, each agent's from tasks_pending_due_idx (agent_name, available_at); the
# agents with pending tasks come from the running totals (task_counts). ``min_lead`` and
# ``max_lead`` (seconds, or null for no bound) keep only tasks that fell due that long
# after their last change. ``limit`` null: all of them (a page's last due time, whole:
# the tasks of one batch enqueue share it, and paging inside it by id would sort
# the whole group again for each page).
DUE_TASKS = """
SELECT t.id, t.agent_name, t.attempts, t.available_at, t.trace_id
FROM (
    SELECT agent_name FROM task_counts
    WHERE status = 'pending' AND (%(agent)s::text IS NULL OR agent_name = %(agent)s::text)
    GROUP BY agent_name HAVING sum(n) > 0
) AS a
CROSS JOIN LATERAL (
    SELECT id, agent_name, attempts, available_at, trace_id
    FROM tasks
    WHERE status = 'pending' AND agent_name = a.agent_name
      AND available_at > %(after)s AND available_at <= %(through)s
      AND (%(min_lead)s::float8 IS NULL
           OR available_at > updated_at + make_interval(secs => %(min_lead)s::float8))
      AND (%(max_lead)s::float8 IS NULL
           OR available_at <= updated_at + make_interval(secs => %(max_lead)s::float8))
    ORDER BY available_at
    LIMIT %(limit)s
) AS t
WHERE NOT EXISTS (SELECT FROM paused_agents p WHERE p.agent_name = a.agent_name)
ORDER BY t.available_at
LIMIT %(limit)s
"""


def due_tasks(
    *,
    after: datetime,
    through: datetime,
    limit: int | None,
    min_lead: float | None = None,
    max_lead: float | None = None,
    agent: str | None = None,
) -> list[tuple]:
    """(id, agent, attempts, available_at, trace_id) of pending tasks due after ``after``
    and by ``through``, in due order, at most ``limit`` (None: all)."""
    params = {
        "after": after,
        "through": through,
        "limit": limit,
        "min_lead": min_lead,
        "max_lead": max_lead,
        "agent": agent,
    }
    return fetch(DUE_TASKS, params)


DISPATCH_BOOKMARK = """
SELECT dispatched_through FROM event_relay_cursors WHERE destination = %(destination)s
"""


def dispatch_bookmark(destination: str) -> datetime | None:
    """Where the dispatcher's scan of due times stopped, or None before its first run."""
    rows = fetch(DISPATCH_BOOKMARK, {"destination": destination})
    return rows[0][0] if rows else None


ADVANCE_DISPATCH_BOOKMARK = """
UPDATE event_relay_cursors SET dispatched_through = %(at)s
WHERE destination = %(destination)s
"""


def advance_dispatch_bookmark(destination: str, bookmark: datetime) -> None:
    """Record that every task due by ``bookmark`` has had its command published."""
    execute(ADVANCE_DISPATCH_BOOKMARK, {"destination": destination, "at": bookmark})


PAUSED_AGENTS = "SELECT agent_name FROM paused_agents"


def paused_agents() -> set[str]:
    return {name for (name,) in fetch(PAUSED_AGENTS, {})}
