"""Retention: what the queue forgets, and when (run by the maintenance loop).

- completed and cancelled tasks, with their history, ``QUEUE_RETENTION_DAYS`` after
  they finished (a workflow's tasks only with the workflow, once it is closed and all
  of them are that old);
- per-minute heartbeat counts and minute rollups once the wider rollups hold them;
- event stream envelopes ``QUEUE_RETENTION_DAYS`` after they were emitted, once every
  relay has relayed them;
- alert notifications (with their deliveries and attempts) ``QUEUE_RETENTION_DAYS``
  after they were made, once every delivery has ended; alert firings that long after
  they ended.

The queue prunes its own tables; apps above it register steps for theirs
(``register``), which run in the same batches, under the same lock: agents_app's
agent events, messages and publications (``agents_app.retention``).

Dead and failed tasks stay until an operator revives or cancels them. Each batch is
its own short transaction that skips rows someone else has locked, so a pass never
makes a worker or an operator wait; one process prunes at a time (advisory lock).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from task_queue.models import RetentionRun
from task_queue.sql import alerts as alerts_sql
from task_queue.sql import db, locks, outbox
from task_queue.sql import retention as retention_sql

logger = logging.getLogger(__name__)

BATCH = 500
EVERY_SECONDS = 60.0  # the maintenance loop prunes this often, not on every pass
MAX_BATCHES = 20  # per kind and pass: a long backlog goes over several passes
MINUTE_METRICS_DAYS = 30


@dataclass
class Pruned:
    """What a pass deleted, by kind (the kinds a prune step may count under; each a
    column of ``RetentionRun``)."""

    tasks: int = 0
    workflows: int = 0
    agent_events: int = 0
    messages: int = 0  # and publications
    stream_events: int = 0
    alert_notifications: int = 0  # with their deliveries and attempts
    alert_firings: int = 0

    def add(self, counts: dict[str, int]) -> None:
        for kind, n in counts.items():
            kind = "tasks" if kind == WORKFLOW_TASKS else kind
            if kind in KINDS:
                setattr(self, kind, getattr(self, kind) + n)

    def __bool__(self) -> bool:
        return any(getattr(self, kind) for kind in KINDS)


KINDS = tuple(Pruned.__dataclass_fields__)
# The tasks of pruned workflows: counted as tasks, but not a reason for another batch
# (a batch of workflows may hold any number of tasks).
WORKFLOW_TASKS = "workflow_tasks"

# A prune step deletes (or expires) one batch of what it owns, in the pass's
# transaction: given the database clock and the batch size, it returns its counts by
# kind (a kind outside KINDS, such as "expired", is counted only towards another batch).
PruneStep = Callable[[datetime, int], dict[str, int]]
_steps: dict[str, PruneStep] = {}


def register(name: str, step: PruneStep) -> None:
    """Add a step to every retention pass: how an app above the queue (agents_app)
    prunes its own tables under the queue's retention lock and schedule."""
    _steps[name] = step


def _finished_tasks(clock: datetime, batch: int) -> dict[str, int]:
    cutoff = clock - timedelta(days=settings.QUEUE_RETENTION_DAYS)
    tasks = retention_sql.prune_finished_tasks(cutoff=cutoff, batch=batch)
    workflow_tasks, workflows = retention_sql.prune_finished_workflows(cutoff=cutoff, batch=batch)
    return {"tasks": tasks, "workflows": workflows, WORKFLOW_TASKS: workflow_tasks}


def _stream_events(clock: datetime, batch: int) -> dict[str, int]:
    cutoff = clock - timedelta(days=settings.QUEUE_RETENTION_DAYS)
    return {"stream_events": outbox.prune_stream_events(cutoff=cutoff, batch=batch)}


def _alert_notifications(clock: datetime, batch: int) -> dict[str, int]:
    cutoff = clock - timedelta(days=settings.QUEUE_RETENTION_DAYS)
    return {"alert_notifications": alerts_sql.prune_notifications(cutoff=cutoff, batch=batch)}


def _alert_firings(clock: datetime, batch: int) -> dict[str, int]:
    cutoff = clock - timedelta(days=settings.QUEUE_RETENTION_DAYS)
    return {"alert_firings": alerts_sql.prune_firings(cutoff=cutoff, batch=batch)}


register("finished tasks and workflows", _finished_tasks)
register("stream events", _stream_events)
register("alert notifications", _alert_notifications)
register("alert firings", _alert_firings)


def prune(*, now: datetime | None = None) -> Pruned | None:
    """One retention pass; returns what it deleted, or None if another process is
    pruning right now."""
    clock = now or db.database_clock()
    pruned = Pruned()
    for _ in range(MAX_BATCHES):
        with transaction.atomic():
            if not locks.try_advisory_xact_lock(locks.RETENTION):
                return None
            counts = [step(clock, BATCH) for step in _steps.values()]
        for step_counts in counts:
            pruned.add(step_counts)
        batch_sizes = (n for c in counts for kind, n in c.items() if kind != WORKFLOW_TASKS)
        if all(n < BATCH for n in batch_sizes):
            break
    with transaction.atomic():
        retention_sql.prune_worker_heartbeats(
            cutoff=clock - timedelta(days=settings.QUEUE_METRICS_BACKFILL_DAYS)
        )
        retention_sql.prune_minute_metrics(cutoff=clock - timedelta(days=MINUTE_METRICS_DAYS))
        if pruned:
            RetentionRun.objects.create(**{kind: getattr(pruned, kind) for kind in KINDS})
            RetentionRun.objects.filter(ran_at__lt=clock - timedelta(days=30)).delete()
    if pruned:
        logger.info(
            "retention: pruned %d task(s), %d workflow(s), %d agent event(s), "
            "%d message(s) and publication(s), %d stream event(s), %d alert notification(s), "
            "%d alert firing(s)",
            pruned.tasks, pruned.workflows, pruned.agent_events, pruned.messages,
            pruned.stream_events, pruned.alert_notifications, pruned.alert_firings,
        )  # fmt: skip
    return pruned
