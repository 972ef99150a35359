"""Retention: what the queue forgets, and when (run by the maintenance loop).

- completed and cancelled tasks, with their history, ``QUEUE_RETENTION_DAYS`` after
  they finished (a workflow's tasks only with the workflow, once it is closed and all
  of them are that old);
- agent events and their embedding jobs after ``AGENT_EVENT_RETENTION_DAYS``: they are
  the agents' memory, kept longer;
- per-minute heartbeat counts and minute rollups once the wider rollups hold them;
- agent messages: unacknowledged ones past their expiry (and no longer leased) are
  marked expired, and acknowledged or expired ones go ``QUEUE_RETENTION_DAYS`` after
  they expired; so do publications, with their deliveries;
- event stream envelopes ``QUEUE_RETENTION_DAYS`` after they were emitted, once every
  relay has relayed them.

Dead and failed tasks stay until an operator revives or cancels them. Each batch is
its own short transaction that skips rows someone else has locked, so a pass never
makes a worker or an operator wait; one process prunes at a time (advisory lock).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from . import queries
from .models import RetentionRun

logger = logging.getLogger(__name__)

BATCH = 500
EVERY_SECONDS = 60.0  # the maintenance loop prunes this often, not on every pass
MAX_BATCHES = 20  # per kind and pass: a long backlog goes over several passes
# pg_try_advisory_xact_lock key: "prun" in ASCII.
RETENTION_LOCK_KEY = 0x7072756E
MINUTE_METRICS_DAYS = 30


@dataclass
class Pruned:
    tasks: int = 0
    workflows: int = 0
    agent_events: int = 0
    messages: int = 0  # and publications
    stream_events: int = 0

    def __bool__(self) -> bool:
        return bool(
            self.tasks or self.workflows or self.agent_events or self.messages
            or self.stream_events
        )  # fmt: skip


def prune(*, now: datetime | None = None) -> Pruned | None:
    """One retention pass; returns what it deleted, or None if another process is
    pruning right now."""
    clock = now or queries.database_clock()
    task_cutoff = clock - timedelta(days=settings.QUEUE_RETENTION_DAYS)
    event_cutoff = clock - timedelta(days=settings.AGENT_EVENT_RETENTION_DAYS)
    pruned = Pruned()
    for _ in range(MAX_BATCHES):
        with transaction.atomic():
            if not queries.try_advisory_xact_lock(RETENTION_LOCK_KEY):
                return None
            tasks = queries.prune_finished_tasks(cutoff=task_cutoff, batch=BATCH)
            workflow_tasks, workflows = queries.prune_finished_workflows(
                cutoff=task_cutoff, batch=BATCH
            )
            events = queries.prune_agent_events(cutoff=event_cutoff, batch=BATCH)
            expired = queries.expire_messages(batch=BATCH)
            messages = queries.prune_messages(cutoff=task_cutoff, batch=BATCH)
            expired += queries.expire_deliveries(batch=BATCH)
            messages += queries.prune_publications(cutoff=task_cutoff, batch=BATCH)
            stream = queries.prune_stream_events(cutoff=task_cutoff, batch=BATCH)
        pruned.tasks += tasks + workflow_tasks
        pruned.workflows += workflows
        pruned.agent_events += events
        pruned.messages += messages
        pruned.stream_events += stream
        if max(tasks, workflows, events, expired, messages, stream) < BATCH:
            break
    with transaction.atomic():
        queries.prune_worker_heartbeats(
            cutoff=clock - timedelta(days=settings.QUEUE_METRICS_BACKFILL_DAYS)
        )
        queries.prune_minute_metrics(cutoff=clock - timedelta(days=MINUTE_METRICS_DAYS))
        if pruned:
            RetentionRun.objects.create(
                tasks=pruned.tasks,
                workflows=pruned.workflows,
                agent_events=pruned.agent_events,
                stream_events=pruned.stream_events,
            )
            RetentionRun.objects.filter(ran_at__lt=clock - timedelta(days=30)).delete()
    if pruned:
        logger.info(
            "retention: pruned %d task(s), %d workflow(s), %d agent event(s), "
            "%d message(s) and publication(s), %d stream event(s)",
            pruned.tasks, pruned.workflows, pruned.agent_events, pruned.messages,
            pruned.stream_events,
        )  # fmt: skip
    return pruned
