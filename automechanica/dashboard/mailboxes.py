"""``/messages/``: agent mailboxes (backlog per agent), subscription lag, and the
failed messages and publication deliveries, which an operator may revive."""

from __future__ import annotations

from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.db.models import Count, Min, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from agents_app import messaging, pubsub
from agents_app.models import AgentMessage, PublicationDelivery, Subscription
from agents_app.pubsub import with_backlog

from .acting import require, who

OPEN_MESSAGES = ["pending", "delivered"]
REVIVE_PERMISSION = "agents_app.revive_agentmessage"
FAILED_SHOWN = 100  # of each kind, newest first; the API lists them all


@staff_member_required
@require_GET
def mailboxes(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    boxes = (
        AgentMessage.objects.filter(status__in=OPEN_MESSAGES, expires_at__gt=now)
        .values("to_agent")
        .annotate(
            waiting=Count("id", filter=Q(status="pending")),
            in_flight=Count("id", filter=Q(status="delivered")),
            redelivered=Count("id", filter=Q(delivery_count__gt=1)),
            oldest=Min("created_at"),
        )
        .order_by("to_agent")
    )
    subscriptions = with_backlog(Subscription.objects.order_by("subscriber_agent", "name"))
    failed_messages = AgentMessage.objects.filter(status="failed").order_by("-created_at")
    failed_deliveries = (
        PublicationDelivery.objects.filter(status="failed")
        .select_related("subscription", "publication")
        .order_by("-publication_id")
    )
    return render(
        request,
        "dashboard/mailboxes.html",
        {
            "boxes": [b | {"age": (now - b["oldest"]).total_seconds()} for b in boxes],
            "subscriptions": [
                (s, (now - s.oldest).total_seconds() if s.oldest else None) for s in subscriptions
            ],
            "failed_messages": failed_messages[:FAILED_SHOWN],
            "failed_deliveries": failed_deliveries[:FAILED_SHOWN],
            "can_revive": request.user.has_perm(REVIVE_PERMISSION),
            "max_deliveries": settings.MESSAGE_MAX_DELIVERIES,
        },
    )


@staff_member_required
@require_POST
def revive_message(request: HttpRequest, message_id: UUID) -> HttpResponse:
    """Revive one failed message (audit-logged); back to the page, which says how it went."""
    _require_revive(request)
    if messaging.revive([message_id], **who(request)):
        messages.success(request, f"Message {message_id} revived: it will be delivered again.")
    else:
        messages.warning(request, f"Message {message_id} is not failed (any more): not revived.")
    return redirect("dashboard:mailboxes")


@staff_member_required
@require_POST
def revive_delivery(request: HttpRequest, delivery_id: int) -> HttpResponse:
    """Revive one failed publication delivery, as ``revive_message``."""
    _require_revive(request)
    if pubsub.revive([delivery_id], **who(request)):
        messages.success(request, f"Delivery {delivery_id} revived: it will be delivered again.")
    else:
        messages.warning(request, f"Delivery {delivery_id} is not failed (any more): not revived.")
    return redirect("dashboard:mailboxes")


def _require_revive(request: HttpRequest) -> None:
    require(request, REVIVE_PERMISSION, "reviving")
