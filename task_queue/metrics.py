"""Metric rollups (spec 001 §11): ``task_queue_metrics`` per agent and closed bucket.

Buckets are one minute, one hour and one day wide. Each width is computed from the
source tables, not summed from the narrower one, so an hour's percentiles are exact.
Nothing here runs on a task's completion path: the maintenance loop calls
:func:`roll_up`, which computes the buckets that closed since its last pass, one
process at a time across the cluster (an advisory lock), and records how far it got
(``metrics_rollup_progress``). :func:`recompute` replaces any range's rows with the
same figures the first computation gave, as long as the source rows are kept.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction

from task_queue.sql import db, locks
from task_queue.sql import metrics as metrics_sql

MINUTE, HOUR, DAY = 60, 3600, 86400
BUCKET_SECONDS = (MINUTE, HOUR, DAY)
# How much one pass computes per width at most, so a long backlog is caught up in
# steps that never hold the lock for long.
MAX_SPAN = {MINUTE: timedelta(hours=6), HOUR: timedelta(days=2), DAY: timedelta(days=14)}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def bucket_floor(moment: datetime, width: int) -> datetime:
    """The start of the ``width``-second bucket holding ``moment`` (epoch-aligned)."""
    return EPOCH + timedelta(seconds=(moment - EPOCH) // timedelta(seconds=width) * width)


def roll_up(*, now: datetime | None = None) -> dict[int, int] | None:
    """Compute the buckets of each width that closed since the last pass; returns
    {width: rows written}, or None when another process holds the rollup lock."""
    with transaction.atomic():
        if not locks.try_advisory_xact_lock(locks.ROLLUP):
            return None
        clock = now or db.database_clock()
        ensure_started(clock)
        written = {}
        for width in BUCKET_SECONDS:
            grace = timedelta(seconds=settings.QUEUE_METRICS_GRACE_SECONDS)
            closed = bucket_floor(clock - grace, width)
            since = metrics_sql.rollup_progress(width)
            until = min(closed, since + MAX_SPAN[width])
            if since < until:
                written[width] = metrics_sql.recompute_metrics(width, since, until)
                metrics_sql.set_rollup_progress(width, until)
        return written


def ensure_started(clock: datetime) -> None:
    """Give every width the same start, the first time: the UTC day that began
    QUEUE_METRICS_BACKFILL_DAYS ago, so the widths cover the same span."""
    backfill = timedelta(days=settings.QUEUE_METRICS_BACKFILL_DAYS)
    metrics_sql.start_rollups(BUCKET_SECONDS, bucket_floor(clock - backfill, DAY))


def recompute(width: int, since: datetime, until: datetime) -> int:
    """Compute the ``width`` buckets from the one holding ``since`` up to the one
    holding ``until`` afresh, replacing their rows; returns the rows written."""
    if width not in BUCKET_SECONDS:
        raise ValueError(f"width must be one of {BUCKET_SECONDS}")
    start, end = bucket_floor(since, width), bucket_floor(until, width) + timedelta(seconds=width)
    with transaction.atomic():
        locks.advisory_xact_lock(locks.ROLLUP)  # not alongside a rollup pass
        return metrics_sql.recompute_metrics(width, start, end)
