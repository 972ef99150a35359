"""``/api/v1/alert-rules`` and ``/api/v1/alerts``: alert rules (``task_queue.alerts``).
Listing needs a ``read`` token, changing an ``admin`` one. A token bound to agents
sees and changes only the rules of its agents."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.models import Prefetch, Q
from django.http import HttpRequest
from ninja import Query, Router, Status
from pydantic import Field

from task_queue.alerts import channels, evaluation, rules
from task_queue.models import AlertDelivery, AlertFiring, AlertNotification, AlertRule

from ..agents import own, require_agent
from ..alert_schemas import (
    AlertRuleCreate,
    AlertRuleOut,
    AlertRuleUpdate,
    AlertSilence,
    AlertsOut,
    AlertTestOut,
)
from ..auth import ADMIN, READ
from ..errors import ERROR_RESPONSES, ApiError
from ..schemas import StrictSchema

router = Router(tags=["alerts"])
RECENT_SHOWN = 100


class RecentQuery(StrictSchema):
    limit: int = Field(
        50, ge=1, le=RECENT_SHOWN, description="Recent notifications and firings shown."
    )


def _rule_out(rule: AlertRule) -> dict[str, Any]:
    return {
        **rules.described(rule),
        "id": rule.id,
        "silenced_until": rule.silenced_until,
        "source": rule.source,
        "firing": [  # the prefetched states: the firing ones
            {
                "agent": s.agent,
                "workflow_id": _text(s.workflow_id),
                "value": s.value,
                "firing_since": s.firing_since,
                "notified_at": s.notified_at,
            }
            for s in rule.states.all()
        ],
    }


def _rules(request: HttpRequest):
    firing = Prefetch("states", queryset=rules.firing_states())
    return own(request, AlertRule.objects.prefetch_related(firing), "agent")


def _invalid(error: rules.InvalidRule) -> ApiError:
    return ApiError(
        422, "validation_error", str(error), field_errors=[(error.field, error.message)]
    )


def _declared(error: rules.DeclaredInSettings) -> ApiError:
    return ApiError(409, "declared_in_settings", f"{error}: change or remove it there")


def _one(request: HttpRequest, rule_id: int) -> AlertRule:
    rule = _rules(request).filter(pk=rule_id).first()
    if rule is None:
        raise ApiError.not_found("alert rule")
    return rule


@router.post("/alert-rules", auth=ADMIN, response={201: AlertRuleOut, **ERROR_RESPONSES})
def create_alert_rule(request: HttpRequest, body: AlertRuleCreate):
    """A new rule. It fires once when its condition starts to hold for an agent,
    repeats every ``repeat_seconds`` while it holds, and resolves once when it stops;
    each notification goes to every channel. A channel's secret is never shown back."""
    require_agent(request, "agent", body.agent or "")
    try:
        rule = rules.create(body.model_dump(), actor=request.auth.actor, source="api")
    except rules.InvalidRule as error:
        raise _invalid(error) from None
    return Status(201, _rule_out(_one(request, rule.id)))


@router.get("/alert-rules", auth=READ, response={200: list[AlertRuleOut], **ERROR_RESPONSES})
def list_alert_rules(request: HttpRequest):
    """Every rule by name, with the agents it fires for now."""
    return [_rule_out(rule) for rule in _rules(request)]


@router.patch("/alert-rules/{rule_id}", auth=ADMIN, response={200: AlertRuleOut, **ERROR_RESPONSES})
def update_alert_rule(request: HttpRequest, rule_id: int, body: AlertRuleUpdate):
    """Change a rule: ``{"enabled": false}`` stops evaluating it. Fields left out stay;
    ``channels`` replaces the list (give each secret again). One declared in settings
    (``source`` ``code``) is changed there: 409."""
    changes = body.model_dump(exclude_unset=True)
    nulls = [name for name, value in changes.items() if value is None and name != "agent"]
    if not changes or nulls:
        raise ApiError(
            422,
            "validation_error",
            "give at least one field to change; only agent may be null",
            field_errors=[(name, "must not be null") for name in nulls]
            or [("body", "give at least one field")],
        )
    _one(request, rule_id)
    if "agent" in changes:
        require_agent(request, "agent", changes["agent"] or "")
    try:
        rules.update(rule_id, changes, actor=request.auth.actor, source="api")
    except rules.InvalidRule as error:
        raise _invalid(error) from None
    except rules.DeclaredInSettings as error:
        raise _declared(error) from None
    return _rule_out(_one(request, rule_id))


@router.post(
    "/alert-rules/{rule_id}/silence", auth=ADMIN, response={200: AlertRuleOut, **ERROR_RESPONSES}
)
def silence_alert_rule(request: HttpRequest, rule_id: int, body: AlertSilence):
    """Silence a rule until a time (it is still evaluated; a firing that outlasts the
    silence is notified once it ends), or lift the silence (``null``). Audited; a rule
    declared in settings can be silenced too."""
    _one(request, rule_id)
    rules.silence(rule_id, body.until, actor=request.auth.actor, source="api")
    return _rule_out(_one(request, rule_id))


@router.post(
    "/alert-rules/{rule_id}/test", auth=ADMIN, response={201: AlertTestOut, **ERROR_RESPONSES}
)
def test_alert_rule(request: HttpRequest, rule_id: int):
    """Send a ``test`` notification to each of the rule's channels (audited); its
    deliveries show in ``GET /alerts`` like any other's."""
    rule = _one(request, rule_id)
    notification = evaluation.send_test(rule, actor=request.auth.actor, source="api")
    return Status(201, {"notification_id": notification.id})


@router.delete("/alert-rules/{rule_id}", auth=ADMIN, response={204: None, **ERROR_RESPONSES})
def delete_alert_rule(request: HttpRequest, rule_id: int):
    """Remove a rule, with its states and notifications."""
    _one(request, rule_id)
    try:
        rules.delete(rule_id, actor=request.auth.actor, source="api")
    except rules.DeclaredInSettings as error:
        raise _declared(error) from None
    return Status(204, None)


@router.get("/alerts", auth=READ, response={200: AlertsOut, **ERROR_RESPONSES})
def list_alerts(request: HttpRequest, query: Query[RecentQuery]):
    """The alerts firing now (each one's last firing notification) and the latest
    notifications, each with its deliveries and every attempt."""
    notifications = AlertNotification.objects.select_related("rule").prefetch_related(
        Prefetch("deliveries", queryset=AlertDelivery.objects.prefetch_related("tries"))
    )
    if request.auth.agents:
        notifications = notifications.filter(agent__in=request.auth.agents)
    firing_states = own(request, rules.firing_states(), "agent")
    wanted = Q(pk__in=[])
    for state in firing_states:
        wanted |= Q(
            rule_id=state.rule_id,
            agent=state.agent,
            workflow_id=state.workflow_id,
            created_at__gte=state.firing_since,
        )
    latest: dict[tuple[int, str, UUID | None], AlertNotification] = {}
    for n in notifications.filter(wanted, state="firing").order_by("created_at", "id"):
        latest[(n.rule_id, n.agent, n.workflow_id)] = n
    firings = own(request, AlertFiring.objects.select_related("rule"), "agent")
    return {
        "firing": [_notification_out(n) for n in latest.values()],
        "recent": [_notification_out(n) for n in notifications[: query.limit]],
        "firings": [_firing_out(f) for f in firings[: query.limit]],
    }


def _firing_out(f: AlertFiring) -> dict[str, Any]:
    return {
        "rule": f.rule.name,
        "agent": f.agent,
        "workflow_id": _text(f.workflow_id),
        "started_at": f.started_at,
        "ended_at": f.ended_at,
        "ended_by": f.ended_by,
        "peak_value": f.peak_value,
    }


def _notification_out(n: AlertNotification) -> dict[str, Any]:
    return {
        "id": n.id,
        "rule": n.rule.name,
        "agent": n.agent,
        "workflow_id": _text(n.workflow_id),
        "state": n.state,
        "value": n.value,
        "threshold": n.threshold,
        "started_at": n.started_at,
        "created_at": n.created_at,
        "summary": n.body["summary"],
        "deliveries": [
            {
                "channel": channels.shown(d.channel),
                "status": d.status,
                "attempts": d.attempts,
                "tries": [
                    {
                        "attempt": t.attempt,
                        "ok": t.ok,
                        "http_status": t.http_status,
                        "error": t.error,
                        "at": t.at,
                    }
                    for t in d.tries.all()
                ],
            }
            for d in n.deliveries.all()
        ],
    }


def _text(workflow_id: UUID | None) -> str | None:
    return str(workflow_id) if workflow_id else None
