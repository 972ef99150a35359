"""Per-agent limits (``agent_limits``) and the rate window's log (``agent_starts``).

The limits are enforced by the lease query (``task_queue.sql.leasing.CLAIM_TASKS``);
these statements show how much of each is in use and tidy the log.
"""

from __future__ import annotations

from dataclasses import dataclass

from task_queue.sql.db import execute, fetch


@dataclass(frozen=True, slots=True)
class LimitUsage:
    agent_name: str
    concurrency_limit: int | None
    rate_count: int | None
    rate_period_seconds: int | None
    held: int  # tasks leased or running now
    recent_starts: int | None  # starts in the current window, with a rate limit


# Held tasks from the running totals; starts from the window's log, within the window.
LIMITS_IN_USE = """
SELECT l.agent_name, l.concurrency_limit, l.rate_count, l.rate_period_seconds,
       coalesce((SELECT sum(n) FROM task_counts c
                 WHERE c.agent_name = l.agent_name
                   AND c.status IN ('leased', 'running')), 0)::int,
       CASE WHEN l.rate_count IS NOT NULL THEN
           (SELECT count(*) FROM agent_starts s
            WHERE s.agent_name = l.agent_name
              AND s.started_at > now() - make_interval(secs => l.rate_period_seconds))::int
       END
FROM agent_limits l
ORDER BY l.agent_name
"""


def limits_in_use() -> dict[str, LimitUsage]:
    """Every agent with a limit: its limits and how much of each is in use."""
    return {row[0]: LimitUsage(*row) for row in fetch(LIMITS_IN_USE, {})}


# An agent's rate window, when its rate limit is set anew or cleared (the claim
# prunes it only while there is one): a new rate limit starts with an empty window.
FORGET_STARTS = "DELETE FROM agent_starts WHERE agent_name = %(agent)s"


def forget_starts(agent: str) -> None:
    execute(FORGET_STARTS, {"agent": agent})
