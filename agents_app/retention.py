"""Retention of the agents' tables, as steps of the queue's retention pass
(``task_queue.maintenance.retention``: same batches, same lock, same schedule).

- agent events, with their embedding jobs, ``AGENT_EVENT_RETENTION_DAYS`` after they
  were written: they are the agents' memory, kept longer than tasks;
- messages: unacknowledged ones past their expiry (and no longer leased) are marked
  expired; acknowledged or expired ones go ``QUEUE_RETENTION_DAYS`` after they expired;
- publications likewise, with their deliveries.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from agents_app.sql import memory as memory_sql
from agents_app.sql import messages as messages_sql
from agents_app.sql import pubsub as pubsub_sql


def prune_agent_events(clock: datetime, batch: int) -> dict[str, int]:
    cutoff = clock - timedelta(days=settings.AGENT_EVENT_RETENTION_DAYS)
    return {"agent_events": memory_sql.prune_agent_events(cutoff=cutoff, batch=batch)}


def prune_messages(clock: datetime, batch: int) -> dict[str, int]:
    cutoff = clock - timedelta(days=settings.QUEUE_RETENTION_DAYS)
    return {
        "expired": messages_sql.expire_messages(batch=batch),
        "messages": messages_sql.prune_messages(cutoff=cutoff, batch=batch),
    }


def prune_publications(clock: datetime, batch: int) -> dict[str, int]:
    cutoff = clock - timedelta(days=settings.QUEUE_RETENTION_DAYS)
    return {
        "expired": pubsub_sql.expire_deliveries(batch=batch),
        "messages": pubsub_sql.prune_publications(cutoff=cutoff, batch=batch),
    }
