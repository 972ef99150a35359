"""The lease reaper: gives back tasks whose worker stopped heartbeating.

Runs inside every worker on a timer; an advisory lock lets one of them at a time
do the work across the whole cluster.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from . import queries

logger = logging.getLogger(__name__)

# pg_try_advisory_xact_lock key: "reap" in ASCII.
REAPER_LOCK_KEY = 0x72656170
BATCH = 1000


def reap_expired_leases(
    *, now: datetime | None = None, stale_worker_seconds: float = 90.0
) -> list[tuple] | None:
    """One reaper pass. Returns the (id, agent, new status) of the tasks recovered,
    or None if another worker holds the reaper lock right now."""
    with transaction.atomic():
        if not queries.try_advisory_xact_lock(REAPER_LOCK_KEY):
            return None
        reaped = queries.reap_expired_leases(limit=BATCH, now=now)
        if reaped:
            queries.notify_agents([agent for _, agent, status in reaped if status == "pending"])
        queries.prune_stale_workers(stale_seconds=stale_worker_seconds, now=now)
    for task_id, _, status in reaped:
        logger.warning("lease expired on task %s: now %s", task_id, status)
    return reaped
