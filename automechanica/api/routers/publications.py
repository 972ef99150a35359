"""``/api/v1/publications``: publish/subscribe between agents (``agents_app.pubsub``)."""

from __future__ import annotations

from dataclasses import asdict

from django.http import HttpRequest
from ninja import Router, Status

from agents_app import pubsub
from agents_app.models import PublicationDelivery, Subscription

from ..auth import READ, WRITE
from ..errors import ERROR_RESPONSES, ApiError
from ..schemas import (
    AgentName,
    DeliveryAck,
    DeliveryOut,
    MessageAckOut,
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
    subscriptions = Subscription.objects.all()
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
    if not PublicationDelivery.objects.filter(id=delivery_id).exists():
        raise ApiError.not_found("delivery")
    if not pubsub.acknowledge(delivery_id, body.receipt, body.result):
        raise ApiError.stale_receipt("delivery")
    return {"acknowledged": True}
