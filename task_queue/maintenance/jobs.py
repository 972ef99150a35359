"""The queue's own maintenance jobs, registered with ``task_queue.maintenance``.

- the lease reaper: gives back tasks whose lease expired and forgets workers that
  stopped heartbeating (workers run it too, so it keeps going with no maintenance
  process up);
- at every pass, the workflows to escalate (``task_queue.escalation``), after the
  reaper (whose dead tasks count);
- the metric rollups of the buckets that closed (``task_queue.metrics``);
- once a minute, positions for the event stream's new events, then retention
  (``task_queue.maintenance.retention``);
- every ten minutes, the blobs no row references any more
  (``task_queue.blobs.collection``);
- at every pass, the recurring schedules' due slots (``task_queue.schedules.firing``),
  after the rollups (the daily report's guard reads them);
- every ``QUEUE_ALERTS_EVALUATE_SECONDS``, the alert rules (those declared in
  settings synced first), and at every pass their
  notifications' deliveries (``task_queue.alerts``);
- once a minute, the task counters and Prometheus's counters of backends that ended
  folded into shard 0 (``task_queue.sql.counts``), so the counters stay a few rows
  per live connection, and the finish counters past their reach (70 minutes)
  deleted.
"""

from __future__ import annotations

import logging

from django.conf import settings

from task_queue import alerts, escalation, event_stream, maintenance, metrics
from task_queue.blobs import collection as blob_collection
from task_queue.schedules import firing as schedule_firing
from task_queue.sql import counts

from . import reaper, retention

logger = logging.getLogger(__name__)


def reap() -> str | None:
    reaped = reaper.reap_expired_leases()
    return f"reaper: recovered {len(reaped)} task(s)" if reaped else None


def escalate_workflows() -> None:
    for workflow in escalation.escalate_due():
        logger.warning("workflow %s escalated: an operator is to resume or cancel it", workflow)


def roll_up() -> None:
    rolled_up = metrics.roll_up()
    # Only when rows were written: a first run's catch-up over the backfill days
    # (QUEUE_METRICS_BACKFILL_DAYS) would otherwise log "{60: 0}" at every pass.
    if rolled_up and any(rolled_up.values()):
        logger.info("metric rollups written: %s", rolled_up)


def sequence_and_prune() -> None:
    # Positions for the stream, even with no reader running, so that retention only
    # ever keeps back events committed a moment ago.
    event_stream.sequence()
    retention.prune()


def evaluate_alerts() -> str | None:
    made = alerts.evaluation.evaluate()
    if made is None:
        logger.debug("alert rules: another process is evaluating them")
    if not made:
        return None
    return "alerts: " + ", ".join(f"{n.rule.name} ({n.agent}) {n.state}" for n in made)


def deliver_alerts() -> None:
    alerts.delivery.deliver()


def collect_blobs() -> str | None:
    deleted = blob_collection.collect()
    return f"blob collection: deleted {deleted} unreferenced blob(s)" if deleted else None


def fold_task_counts() -> None:
    counts.fold_ended_backends()
    counts.drop_old_finish_buckets()


# How often the counters of ended backends are folded.
FOLD_COUNTS_EVERY_SECONDS = 60.0


def register() -> None:
    maintenance.register("reaper", reap, order=maintenance.LEASES)
    maintenance.register("workflow escalation", escalate_workflows, order=maintenance.LEASES + 1)
    maintenance.register("metric rollups", roll_up, order=maintenance.ROLLUPS)
    maintenance.register(
        "schedules",
        maintenance.SyncedFirst(schedule_firing.sync_declared, schedule_firing.fire_due_slots),
        order=maintenance.REPORTS,
    )
    maintenance.register(
        "alert rules",
        maintenance.SyncedFirst(alerts.declared.sync_declared, evaluate_alerts),
        every_seconds=settings.QUEUE_ALERTS_EVALUATE_SECONDS,
        order=maintenance.REPORTS,
    )
    maintenance.register("alert deliveries", deliver_alerts, order=maintenance.REPORTS)
    maintenance.register("task counters", fold_task_counts, every_seconds=FOLD_COUNTS_EVERY_SECONDS)
    maintenance.register(
        "retention",
        sequence_and_prune,
        every_seconds=retention.EVERY_SECONDS,
        order=maintenance.RETENTION,
    )
    # After retention, which drops the rows that referenced blobs.
    maintenance.register(
        "blob collection",
        collect_blobs,
        every_seconds=blob_collection.EVERY_SECONDS,
        order=maintenance.RETENTION + 1,
    )
