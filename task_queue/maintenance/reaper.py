"""The lease reaper: gives back tasks whose worker stopped heartbeating.

Runs inside every worker on a timer; an advisory lock lets one of them at a time
do the work across the whole cluster.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings

from task_queue import leases
from task_queue.sql import enqueue as enqueue_sql
from task_queue.sql import maintenance as maintenance_sql
from task_queue.sql.leasing import TASK_LEASE
from task_queue.task_logging import TaskRef, about_task

logger = logging.getLogger(__name__)


def reap_expired_leases(*, now: datetime | None = None) -> list[tuple] | None:
    """One reaper pass. Returns the (id, agent, new status) of the tasks recovered,
    or None if another worker holds the reaper lock right now."""

    def reap() -> list[tuple]:
        reaped = maintenance_sql.reap_expired_leases(limit=leases.RECOVERY_BATCH, now=now)
        if reaped:
            enqueue_sql.notify_agents([row[1] for row in reaped if row[2] == "pending"])
        maintenance_sql.prune_stale_workers(
            stale_seconds=settings.QUEUE_STALE_WORKER_SECONDS, now=now
        )
        return reaped

    reaped = leases.recover(TASK_LEASE, reap)
    if reaped is None:
        return None
    for task_id, agent, status, trace_id, attempts, holder in reaped:
        # A task whose last attempt's lease expired is dead: logged as a failure that
        # ended it (task_queue.outcomes.FAILURE_LEVELS), about the attempt and the
        # worker that held it.
        level = logging.ERROR if status == "dead" else logging.WARNING
        with about_task(TaskRef(task_id, trace_id, agent, attempts), holder):
            logger.log(level, "lease expired on task %s: now %s", task_id, status)
    return [(task_id, agent, status) for task_id, agent, status, *_ in reaped]
