"""``/alerts/``: the alert rules with where each stands (ok, silenced, or firing since
when, for which agents or workflows) and the recent notifications with every delivery
attempt, for any staff user (secrets never: ``channels.shown``). An operator with
``queue.manage_alerts`` enables or disables a rule, silences it for a while, and sends
a test notification, each audited. Rules are written through the API
(``/api/v1/alert-rules``) or declared in settings (``QUEUE_ALERT_RULES``)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from task_queue.alerts import evaluation, rules
from task_queue.alerts.channels import shown
from task_queue.audit import user_actor
from task_queue.models import AlertDelivery, AlertNotification, AlertRule
from task_queue.sql import db

RECENT_SHOWN = 50
MANAGE_PERMISSION = "queue.manage_alerts"
SILENCE = timedelta(hours=1)
ACTIONS = ("enable", "disable", "silence", "unsilence", "test")


@staff_member_required
@require_GET
def alerts(request: HttpRequest) -> HttpResponse:
    firing = Prefetch("states", queryset=rules.firing_states())
    shown_rules = list(AlertRule.objects.prefetch_related(firing))
    for rule in shown_rules:
        rule.shown_channels = [shown(channel) for channel in rule.channels]
    recent = list(
        AlertNotification.objects.select_related("rule").prefetch_related(
            Prefetch("deliveries", queryset=AlertDelivery.objects.prefetch_related("tries"))
        )[:RECENT_SHOWN]
    )
    for notification in recent:
        for delivery in notification.deliveries.all():
            delivery.shown_channel = shown(delivery.channel)
    context = {
        "rules": shown_rules,
        "recent": recent,
        "now": db.database_clock(),
        "can_manage": request.user.has_perm(MANAGE_PERMISSION),
    }
    return render(request, "dashboard/alerts.html", context)


@staff_member_required
@require_POST
def act(request: HttpRequest, rule_id: int, action: str) -> HttpResponse:
    """One action on a rule; back to the page, with what it did."""
    if action not in ACTIONS:
        raise Http404(f"no action {action!r}")
    if not request.user.has_perm(MANAGE_PERMISSION):
        raise PermissionDenied(f"{action} needs the {MANAGE_PERMISSION} permission")
    rule = get_object_or_404(AlertRule, pk=rule_id)
    who = {"actor": user_actor(request.user), "source": "dashboard"}
    try:
        if action in ("enable", "disable"):
            rules.update(rule.id, {"enabled": action == "enable"}, **who)
            messages.success(request, f"{rule.name}: {action}d")
        elif action == "silence":
            until = db.database_clock() + SILENCE
            rules.silence(rule.id, until, **who)
            messages.success(request, f"{rule.name}: silenced until {until:%Y-%m-%d %H:%M} UTC")
        elif action == "unsilence":
            rules.silence(rule.id, None, **who)
            messages.success(request, f"{rule.name}: no longer silenced")
        else:
            evaluation.send_test(rule, **who)
            messages.success(request, f"{rule.name}: a test notification is on its way")
    except rules.DeclaredInSettings as error:
        messages.error(request, f"{error}: change it there")
    return redirect("dashboard:alerts")
