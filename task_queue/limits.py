"""Per-agent limits across the cluster: how many of an agent's tasks may be leased or
running at once, and how many may start per period.

The lease query enforces them (``task_queue.sql.leasing.CLAIM_TASKS``); this module
changes them, each change written to the audit log in its transaction, and wakes the
agent's workers so a raised or cleared limit takes effect at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from task_queue.sql import enqueue as enqueue_sql
from task_queue.sql import limits as limits_sql
from task_queue.sql import locks
from task_queue.sql.limits import LimitUsage, limits_in_use

from . import audit, registry
from .models import (
    MAX_CONCURRENCY_LIMIT,
    MAX_RATE_COUNT,
    MAX_RATE_PERIOD_SECONDS,
    AgentLimits,
    OperatorAction,
)

__all__ = ["UNCHANGED", "InvalidLimit", "LimitUsage", "RateLimit", "limits_in_use", "set_limits"]

# A limit not given to ``set_limits`` stays as it is; None clears it.
UNCHANGED: Any = object()


class InvalidLimit(ValueError):
    """A limit was refused; ``field`` names it as the request does
    (``concurrency_limit``, ``rate_limit.count``, ``rate_limit.period_seconds``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class RateLimit:
    count: int
    period_seconds: int


def set_limits(
    agent_name: str,
    *,
    concurrency_limit: int | None = UNCHANGED,
    rate_limit: RateLimit | None = UNCHANGED,
    actor: str,
    source: str = "python",
) -> AgentLimits | None:
    """Set or clear (None) an agent's limits; the others stay. Returns the agent's
    limits after the change (None: it has none). ``KeyError`` for an unknown agent,
    :class:`InvalidLimit` for a value out of range."""
    registry.get(agent_name)
    if concurrency_limit is not UNCHANGED and concurrency_limit is not None:
        _check("concurrency_limit", concurrency_limit, MAX_CONCURRENCY_LIMIT)
    if rate_limit is not UNCHANGED and rate_limit is not None:
        _check("rate_limit.count", rate_limit.count, MAX_RATE_COUNT)
        _check("rate_limit.period_seconds", rate_limit.period_seconds, MAX_RATE_PERIOD_SECONDS)
    with transaction.atomic():
        # Changes of one agent's limits one at a time (even the first, with no row to
        # lock), and none in the middle of a claim.
        locks.agent_limits_lock(agent_name)
        existing = AgentLimits.objects.filter(agent_name=agent_name).first()
        before = _described(existing)
        row = existing or AgentLimits(agent_name=agent_name)
        if concurrency_limit is not UNCHANGED:
            row.concurrency_limit = concurrency_limit
        if rate_limit is not UNCHANGED:
            row.rate_count = rate_limit and rate_limit.count
            row.rate_period_seconds = rate_limit and rate_limit.period_seconds
        after = _described(row)
        if after == before:
            return existing
        if row.concurrency_limit is None and row.rate_count is None:
            AgentLimits.objects.filter(agent_name=agent_name).delete()
            row = None
        else:
            row.updated_by = actor
            row.save()
            row.refresh_from_db(fields=["updated_at"])
        if not (before["rate_limit"] and after["rate_limit"]):
            limits_sql.forget_starts(agent_name)  # set anew or cleared: an empty window
        changes = {
            name: {"before": before[name], "after": after[name]}
            for name in after
            if after[name] != before[name]
        }
        audit.record(
            actor=actor,
            action=OperatorAction.Kind.LIMIT,
            source=source,
            agent_name=agent_name,
            changes=changes,
        )
        # A raised or cleared limit makes room now: wake the agent's workers.
        enqueue_sql.notify_agents([agent_name])
    return row


def _check(field: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidLimit(field, "must be a whole number")
    if not 1 <= value <= maximum:
        raise InvalidLimit(field, f"must be between 1 and {maximum}")


def _described(row: AgentLimits | None) -> dict[str, Any]:
    """The limits as the audit log and the API show them."""
    if row is None:
        return {"concurrency_limit": None, "rate_limit": None}
    rate = (
        None
        if row.rate_count is None
        else {"count": row.rate_count, "period_seconds": row.rate_period_seconds}
    )
    return {"concurrency_limit": row.concurrency_limit, "rate_limit": rate}
