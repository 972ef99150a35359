"""``/alerts/``: the alert rules with where each stands (ok, silenced, or firing since
when, for which agents or workflows), the recent notifications with every delivery
attempt and the history of firings, for any staff user (secrets never:
``channels.shown``). An operator with ``queue.manage_alerts`` creates, changes,
deletes, enables or disables a rule, silences it for a while, and sends a test
notification, each through ``task_queue.alerts.rules`` (checked as for the API, and
audited). A rule declared in settings (``QUEUE_ALERT_RULES``) is changed there only."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from task_queue.alerts import evaluation, rules
from task_queue.alerts.channels import shown
from task_queue.models import AlertDelivery, AlertFiring, AlertNotification, AlertRule, Schedule
from task_queue.sql import db

from .acting import require, who
from .alert_form import AlertRuleForm
from .form_inputs import saved

RECENT_SHOWN = 50
MANAGE_PERMISSION = "queue.manage_alerts"
SILENCE = timedelta(hours=1)
ACTIONS = ("enable", "disable", "silence", "unsilence", "test")
EDIT = "dashboard/alert_edit.html"


@staff_member_required
@require_GET
def alerts(request: HttpRequest) -> HttpResponse:
    return _page(request)


def _page(
    request: HttpRequest, form: AlertRuleForm | None = None, status: int = 200
) -> HttpResponse:
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
    can_manage = request.user.has_perm(MANAGE_PERMISSION)
    context = {
        "rules": shown_rules,
        "recent": recent,
        "firings": AlertFiring.objects.select_related("rule")[:RECENT_SHOWN],
        "now": db.database_clock(),
        "can_manage": can_manage,
        "form": (form or AlertRuleForm()) if can_manage else None,
    }
    return render(request, "dashboard/alerts.html", context, status=status)


@staff_member_required
@require_POST
def act(request: HttpRequest, rule_id: int, action: str) -> HttpResponse:
    """One action on a rule; back to the page, with what it did."""
    if action not in ACTIONS:
        raise Http404(f"no action {action!r}")
    require(request, MANAGE_PERMISSION, action)
    rule = get_object_or_404(AlertRule, pk=rule_id)
    actor = who(request)
    try:
        if action in ("enable", "disable"):
            rules.update(rule.id, {"enabled": action == "enable"}, **actor)
            messages.success(request, f"{rule.name}: {action}d")
        elif action == "silence":
            until = db.database_clock() + SILENCE
            rules.silence(rule.id, until, **actor)
            messages.success(request, f"{rule.name}: silenced until {until:%Y-%m-%d %H:%M} UTC")
        elif action == "unsilence":
            rules.silence(rule.id, None, **actor)
            messages.success(request, f"{rule.name}: no longer silenced")
        else:
            evaluation.send_test(rule, **actor)
            messages.success(request, f"{rule.name}: a test notification is on its way")
    except rules.DeclaredInSettings as error:
        messages.error(request, f"{error}: change it there")
    return redirect("dashboard:alerts")


@staff_member_required
@require_POST
def alert_new(request: HttpRequest) -> HttpResponse:
    """Create a rule; a refused one comes back (400) with the reason on its field, and
    nothing written."""
    require(request, MANAGE_PERMISSION, "creating an alert rule")
    form = AlertRuleForm(request.POST)
    created = saved(form, lambda: rules.create(form.values(), **who(request)), rules.InvalidRule)
    if created is None:
        return _page(request, form, status=400)
    messages.success(request, f"Alert rule {created.name!r} created.")
    return redirect("dashboard:alerts")


@staff_member_required
@require_http_methods(["GET", "POST"])
def alert_edit(request: HttpRequest, rule_id: int) -> HttpResponse:
    """Change a rule not declared in settings (one declared there answers 409: it is
    changed there). A refused change comes back (400) with the reason on its field."""
    require(request, MANAGE_PERMISSION, "changing an alert rule")
    rule = get_object_or_404(AlertRule, pk=rule_id)
    if rule.source == Schedule.Source.CODE:
        return render(request, EDIT, {"rule": rule, "declared": True}, status=409)
    if request.method == "GET":
        return render(request, EDIT, {"rule": rule, "form": AlertRuleForm.of(rule)})
    form = AlertRuleForm(request.POST, rule=rule)
    try:
        changed = saved(
            form, lambda: rules.update(rule.id, form.values(), **who(request)), rules.InvalidRule
        )
    except rules.DeclaredInSettings:  # settings took its name meanwhile
        return render(request, EDIT, {"rule": rule, "declared": True}, status=409)
    if changed is None:
        return render(request, EDIT, {"rule": rule, "form": form}, status=400)
    messages.success(request, f"Alert rule {changed.name!r} saved.")
    return redirect("dashboard:alerts")


@staff_member_required
@require_POST
def alert_delete(request: HttpRequest, rule_id: int) -> HttpResponse:
    """Delete a rule not declared in settings, with its states, firings and
    notifications (audited), then back to the list."""
    require(request, MANAGE_PERMISSION, "deleting an alert rule")
    rule = get_object_or_404(AlertRule, pk=rule_id)
    try:
        rules.delete(rule.id, **who(request))
    except rules.DeclaredInSettings as declared:
        return HttpResponse(str(declared), status=409, content_type="text/plain; charset=utf-8")
    messages.success(request, f"Alert rule {rule.name!r} deleted.")
    if request.htmx:
        return HttpResponseClientRedirect(reverse("dashboard:alerts"))
    return redirect("dashboard:alerts")
