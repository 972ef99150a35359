"""Publish/subscribe between agents (seed 002, pattern 2).

An agent publishes an event (``event_name`` like ``state.changed``, a
``publication_type``, a payload and a time to live). A subscription names what an
agent wants: a publisher (by id and/or type), a glob on the event name (``state.*``,
``task.completed``, ``*``) and publication types; None or empty matches anything.
Publishing fans out in the same statement: one delivery per matching subscription, so
each subscriber reads its own deliveries, in publication order, independently of the
others, and acknowledges each with its processing result (at least once, like direct
messages: an unacknowledged delivery comes back after the visibility timeout, and is
failed after ``MESSAGE_MAX_DELIVERIES`` deliveries, until ``revive``). A
subscription made after a publication does not receive it. Subscribers are woken by
NOTIFY, with polling as the fallback.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from agents_app.sql import pubsub as pubsub_sql
from task_queue import blobs
from task_queue.models import OperatorAction

from .messaging import (
    DEFAULT_EXPIRY_SECONDS,
    InvalidMessage,
    as_json,
    check_lifetime,
    check_metadata,
    check_receive,
    check_text,
    record_revive,
    traced,
    wait_for_some,
)
from .models import PublicationDelivery, Subscription

OPEN = ("pending", "delivered")


@dataclass(frozen=True)
class Delivery:
    id: int
    receipt: UUID  # ack with it
    delivery_count: int
    subscription: str
    publication_id: int
    publisher_agent: str
    publisher_type: str | None
    publication_type: str
    event_name: str
    payload: Any  # read from its blob when it was too large for the row
    metadata: dict[str, Any]
    published_at: datetime
    expires_at: datetime
    payload_error: str | None = None  # why the payload could not be read (a lost blob)


def glob_to_like(pattern: str) -> str:
    """``state.*`` → ``state.%``: ``*`` any run, ``?`` one character; LIKE's own
    wildcards and the escape character taken literally."""
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%").replace("?", "_")


def publish(
    publisher: str,
    event_name: str,
    payload: Any = None,
    *,
    publication_type: str = "event",
    publisher_type: str | None = None,
    ttl: float = DEFAULT_EXPIRY_SECONDS,
    metadata: dict[str, Any] | None = None,
) -> tuple[int, int]:
    """Publish; returns (publication id, deliveries made to matching subscriptions)."""
    check_text("publisher", publisher, required=True)
    check_text("event_name", event_name, required=True)
    check_text("publication_type", publication_type, required=True)
    check_text("publisher_type", publisher_type)
    check_lifetime("ttl", ttl)
    check_metadata(metadata)
    payload_text = as_json("payload", {} if payload is None else payload)
    metadata_text = as_json("metadata", traced(metadata) or {})
    with transaction.atomic():  # the blobs' locks last until the row commits
        payload_json, payload_ref = blobs.offload(payload_text)
        metadata_json, metadata_ref = blobs.offload(metadata_text)
        return pubsub_sql.publish(
            publisher_agent=publisher,
            publisher_type=publisher_type,
            publication_type=publication_type,
            event_name=event_name,
            payload=payload_json,
            payload_ref=payload_ref,
            metadata=metadata_json,
            metadata_ref=metadata_ref,
            ttl=float(ttl),
        )


def subscribe(
    subscriber: str,
    name: str,
    event_pattern: str = "*",
    *,
    publisher: str | None = None,
    publisher_type: str | None = None,
    publication_types: Sequence[str] = (),
) -> int:
    """Create or change (and reactivate) the subscription ``name`` of ``subscriber``;
    returns its id."""
    for field, value in (
        ("subscriber", subscriber),
        ("name", name),
        ("event_pattern", event_pattern),
    ):
        check_text(field, value, required=True)
    check_text("publisher", publisher)
    check_text("publisher_type", publisher_type)
    if isinstance(publication_types, str):
        raise InvalidMessage("publication_types", "must be a list of strings")
    for kind in publication_types:
        check_text("publication_types", kind, required=True)
    return pubsub_sql.subscribe(
        subscriber=subscriber,
        name=name,
        publisher_agent=publisher,
        publisher_type=publisher_type,
        event_pattern=event_pattern,
        event_like=glob_to_like(event_pattern),
        publication_types=list(publication_types),
    )


def unsubscribe(subscriber: str, name: str) -> bool:
    """Stop the subscription; what it had not acknowledged is dropped. False if it
    was not active."""
    return pubsub_sql.unsubscribe(subscriber=subscriber, name=name)


def receive(
    subscriber: str,
    *,
    subscription: str | None = None,
    limit: int = 10,
    visibility_timeout: float = 30.0,
    wait: float = 0.0,
) -> list[Delivery]:
    """Lease up to ``limit`` of the subscriber's deliveries (of one subscription, or
    all), oldest publication first; with ``wait``, block that long for one."""
    check_text("subscriber", subscriber, required=True)
    check_text("subscription", subscription)
    check_receive(limit, visibility_timeout, wait)

    def look() -> list[Delivery]:
        rows = pubsub_sql.receive_publications(
            subscriber=subscriber,
            subscription=subscription,
            limit=limit,
            visibility_seconds=visibility_timeout,
            max_deliveries=settings.MESSAGE_MAX_DELIVERIES,
        )
        return sorted((_delivery(row) for row in rows), key=lambda d: d.publication_id)

    return wait_for_some(look, channel=pubsub_sql.PUBLICATIONS_CHANNEL, agent=subscriber, wait=wait)


def ack(delivery: Delivery, result: Any = None) -> bool:
    """Mark ``delivery`` processed with its ``result``; False if its lease ran out and
    it was given back or went to another reader."""
    return acknowledge(delivery.id, delivery.receipt, result)


def acknowledge(delivery_id: int, receipt: UUID, result: Any = None) -> bool:
    """``ack`` by id and receipt (what the HTTP API receives)."""
    if result is None:
        return pubsub_sql.ack_publication(delivery_id, receipt, None, None)
    result_text = as_json("result", result)
    with transaction.atomic():  # the blob's lock lasts until the row commits
        result_json, result_ref = blobs.offload(result_text, empty=None)
        return pubsub_sql.ack_publication(delivery_id, receipt, result_json, result_ref)


def recover_leases() -> None:
    """The maintenance job: give back deliveries whose reader's lease ended, and fail
    those made MESSAGE_MAX_DELIVERIES times."""
    pubsub_sql.recover_deliveries(max_deliveries=settings.MESSAGE_MAX_DELIVERIES)


def revive(ids: Iterable[int], *, actor: str, source: str = "python") -> list[int]:
    """Failed deliveries → pending, as ``messaging.revive`` does for messages; the
    ids revived."""
    with transaction.atomic():
        revived = pubsub_sql.revive_deliveries(ids=sorted(set(ids)))
        record_revive(
            OperatorAction.Kind.REVIVE_DELIVERIES, "deliveries", revived, actor=actor, source=source
        )
    return [delivery_id for delivery_id, _ in revived]


def _delivery(row: tuple) -> Delivery:
    values = list(row)
    metadata_ref, payload_ref = values.pop(), values.pop()
    values[9], values[10] = json.loads(values[9]), json.loads(values[10])  # jsonb as text
    try:
        values[9] = blobs.payload_of(values[9], payload_ref)
        values[10] = blobs.payload_of(values[10], metadata_ref)
    except blobs.PayloadBlobError as error:
        # The subscriber gets the delivery and the reason; acknowledging it ends it.
        return Delivery(*values, payload_error=str(error))
    return Delivery(*values)


def with_backlog(subscriptions: QuerySet[Subscription]) -> QuerySet[Subscription]:
    """Each subscription with ``backlog`` (deliveries not acknowledged and not expired)
    and ``oldest`` (when the oldest of them was published): two correlated lookups per
    subscription, which only read its open deliveries."""
    now = timezone.now()
    waiting = PublicationDelivery.objects.filter(
        subscription=OuterRef("pk"), status__in=OPEN, expires_at__gt=now
    )
    return subscriptions.annotate(
        backlog=Coalesce(
            Subquery(waiting.values("subscription").annotate(n=Count("id")).values("n")),
            0,
        ),
        oldest=Subquery(waiting.order_by("publication_id").values("publication__created_at")[:1]),
    )
