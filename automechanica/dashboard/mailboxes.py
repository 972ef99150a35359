"""``/messages/``: agent mailboxes (backlog per agent) and subscription lag."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.db.models import Count, Min, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from agents_app.models import AgentMessage, Subscription
from agents_app.pubsub import with_backlog

OPEN_MESSAGES = ["pending", "delivered"]


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
    return render(
        request,
        "dashboard/mailboxes.html",
        {
            "boxes": [b | {"age": (now - b["oldest"]).total_seconds()} for b in boxes],
            "subscriptions": [
                (s, (now - s.oldest).total_seconds() if s.oldest else None) for s in subscriptions
            ],
        },
    )
