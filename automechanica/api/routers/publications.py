"""``/api/v1/publications``: publish/subscribe between agents (``agents_app.pubsub``).

A token bound to agents acts only as them (``automechanica.api.agents``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from django.db.models import F, QuerySet
from django.http import HttpRequest
from ninja import Query, Router, Status
from pydantic import Field

from agents_app import pubsub
from agents_app.models import PublicationDelivery, Subscription

from ..agents import own, require_agent
from ..auth import READ, WRITE
from ..errors import ERROR_RESPONSES, ApiError
from ..messaging_schemas import (
    AgentName,
    DeliveryAck,
    DeliveryOut,
    DeliveryStateOut,
    MessageAckOut,
    MessageStatusName,
    PublicationIn,
    PublicationReceive,
    PublishedOut,
    SubscriptionIn,
    SubscriptionOut,
    SubscriptionRef,
)

router = Router(tags=["publish/subscribe"])


@router.post("/publications", auth=WRITE, response={201: PublishedOut, **ERROR_RESPONSES})
def publish(request: HttpRequest, body: PublicationIn):
    """Publish an event; a delivery is made at once for every matching subscription."""
    require_agent(request, "publisher_agent", body.publisher_agent)
    publication_id, deliveries = pubsub.publish(
        body.publisher_agent,
        body.event_name,
        body.payload,
        publication_type=body.publication_type,
        publisher_type=body.publisher_type,
        ttl=body.ttl_seconds,
        metadata=body.metadata,
    )
    return Status(201, {"id": publication_id, "deliveries": deliveries})


@router.post(
    "/publications/subscriptions", auth=WRITE, response={200: SubscriptionOut, **ERROR_RESPONSES}
)
def subscribe(request: HttpRequest, body: SubscriptionIn):
    """Create, change or reactivate the subscription ``name`` of the subscriber."""
    require_agent(request, "subscriber_agent", body.subscriber_agent)
    subscription_id = pubsub.subscribe(
        body.subscriber_agent,
        body.name,
        body.event_pattern,
        publisher=body.publisher_agent,
        publisher_type=body.publisher_type,
        publication_types=body.publication_types,
    )
    return pubsub.with_backlog(Subscription.objects.filter(id=subscription_id)).get()


@router.get(
    "/publications/subscriptions",
    auth=READ,
    response={200: list[SubscriptionOut], **ERROR_RESPONSES},
)
def list_subscriptions(request: HttpRequest, subscriber_agent: AgentName | None = None):
    """Subscriptions with their backlog (deliveries not yet acknowledged) and lag."""
    if subscriber_agent is not None:
        require_agent(request, "subscriber_agent", subscriber_agent)
    subscriptions = own(request, Subscription.objects.all(), "subscriber_agent")
    if subscriber_agent is not None:
        subscriptions = subscriptions.filter(subscriber_agent=subscriber_agent)
    return list(pubsub.with_backlog(subscriptions).order_by("subscriber_agent", "name")[:500])


@router.post(
    "/publications/subscriptions/unsubscribe",
    auth=WRITE,
    response={200: SubscriptionOut, **ERROR_RESPONSES},
)
def unsubscribe(request: HttpRequest, body: SubscriptionRef):
    """Stop a subscription (by subscriber and name); its unacknowledged deliveries go."""
    require_agent(request, "subscriber_agent", body.subscriber_agent)
    pubsub.unsubscribe(body.subscriber_agent, body.name)
    found = Subscription.objects.filter(subscriber_agent=body.subscriber_agent, name=body.name)
    if not found.exists():
        raise ApiError.not_found("subscription")
    return pubsub.with_backlog(found).get()


@router.post(
    "/publications/receive", auth=WRITE, response={200: list[DeliveryOut], **ERROR_RESPONSES}
)
def receive(request: HttpRequest, body: PublicationReceive):
    """Lease up to ``limit`` of the subscriber's deliveries, oldest publication first."""
    require_agent(request, "subscriber_agent", body.subscriber_agent)
    deliveries = pubsub.receive(
        body.subscriber_agent,
        subscription=body.subscription,
        limit=body.limit,
        visibility_timeout=body.visibility_timeout_seconds,
    )
    return [asdict(d) for d in deliveries]


@router.post(
    "/publications/deliveries/{delivery_id}/ack",
    auth=WRITE,
    response={200: MessageAckOut, **ERROR_RESPONSES},
)
def ack(request: HttpRequest, delivery_id: int, body: DeliveryAck):
    """Mark a delivery processed, with the subscriber's result. 409 when the receipt is
    not the current delivery's."""
    _for_own_agent(request, delivery_id)
    if not pubsub.acknowledge(delivery_id, body.receipt, body.result):
        raise ApiError.stale_receipt("delivery")
    return {"acknowledged": True}


@router.get(
    "/publications/deliveries",
    auth=READ,
    response={200: list[DeliveryStateOut], **ERROR_RESPONSES},
)
def list_deliveries(
    request: HttpRequest,
    subscriber_agent: AgentName | None = None,
    subscription: Annotated[AgentName | None, Query(description="Its name.")] = None,
    status: MessageStatusName | None = None,
    limit: Annotated[int, Field(ge=1, le=500)] = 100,
):
    """Deliveries newest publication first, for inspection (reading them is
    ``receive``); those ``failed`` wait for a revive."""
    if subscriber_agent is not None:
        require_agent(request, "subscriber_agent", subscriber_agent)
    deliveries = own(request, PublicationDelivery.objects.all(), "subscription__subscriber_agent")
    for field, value in (
        ("subscription__subscriber_agent", subscriber_agent),
        ("subscription__name", subscription),
        ("status", status),
    ):
        if value is not None:
            deliveries = deliveries.filter(**{field: value})
    return _states(deliveries.order_by("-publication_id", "-id")[:limit])


@router.post(
    "/publications/deliveries/{delivery_id}/revive",
    auth=WRITE,
    response={200: DeliveryStateOut, **ERROR_RESPONSES},
)
def revive(request: HttpRequest, delivery_id: int):
    """Make a failed delivery (made ``MESSAGE_MAX_DELIVERIES`` times, never
    acknowledged) receivable again, with a fresh delivery budget; audit-logged. 409
    when it is not failed."""
    _for_own_agent(request, delivery_id)
    revived = pubsub.revive([delivery_id], actor=request.auth.actor, source="api")
    (state,) = _states(PublicationDelivery.objects.filter(id=delivery_id))
    if not revived:
        raise ApiError.wrong_status("delivery", state["status"], "revive")
    return state


def _states(deliveries: QuerySet[PublicationDelivery]) -> list[dict[str, Any]]:
    """Deliveries as ``DeliveryStateOut`` rows, with their subscription and publication
    (``subscription`` is its name; the model's field of that name is the row)."""
    rows = deliveries.values(
        "id", "publication_id", "status", "delivery_count", "delivered_at", "acknowledged_at",
        "expires_at", "result",
        subscriber_agent=F("subscription__subscriber_agent"),
        subscription_name=F("subscription__name"),
        publisher_agent=F("publication__publisher_agent"),
        event_name=F("publication__event_name"),
    )  # fmt: skip
    return [row | {"subscription": row.pop("subscription_name")} for row in rows]


def _for_own_agent(request: HttpRequest, delivery_id: int) -> None:
    """404 if there is no such delivery, 403 if the token may not act as its subscriber."""
    subscriber = (
        PublicationDelivery.objects.filter(id=delivery_id)
        .values_list("subscription__subscriber_agent", flat=True)
        .first()
    )
    if subscriber is None:
        raise ApiError.not_found("delivery")
    why = f"is for {subscriber!r}, not one of this token's agents"
    require_agent(request, "delivery_id", subscriber, why)
