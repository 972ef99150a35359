"""Writing alert rules, from the API and the alerts page (and silencing them): checked,
saved and recorded in the audit log in one transaction. A change takes the
evaluations' lock first (``locks.ALERTS``): an evaluation running meanwhile would
otherwise write back a state the change drops."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet

from task_queue import audit, registry
from task_queue.models import (
    AlertFiring,
    AlertKind,
    AlertRule,
    AlertState,
    OperatorAction,
    Schedule,
)
from task_queue.sql import db, locks
from task_queue.storable import text_problem
from task_queue.unique_names import save_named

from .channels import InvalidChannel, check_channels, shown

MAX_NAME_LENGTH = 200
NAME_CONSTRAINT = "alert_rules_name_key"
# The fields a rule may leave out.
DEFAULTS: dict[str, Any] = {
    "agent": None,
    "window_seconds": 900,
    "min_count": 10,
    "repeat_seconds": 3600,
    "channels": [],
    "enabled": True,
}
FIELDS = ("name", "kind", "agent", "threshold", *list(DEFAULTS)[1:])


class InvalidRule(ValueError):
    """A rule that cannot be saved: ``field`` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class DeclaredInSettings(ValueError):
    """A rule declared in settings (``QUEUE_ALERT_RULES``) is changed there only."""

    def __init__(self, name: str) -> None:
        super().__init__(f"alert rule {name!r} is declared in settings (QUEUE_ALERT_RULES)")


def _integer(values: dict[str, Any], field: str, low: int, high: int) -> None:
    value = values[field]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRule(field, f"must be an integer from {low} to {high}")


def validated(
    values: dict[str, Any], *, new_agent: bool = True, new_channels: bool = True
) -> dict[str, Any]:
    """A complete rule (defaults filled in), checked; :class:`InvalidRule` names the
    first bad field. ``new_agent``: the agent is given now, so it must be registered
    (a rule kept for an agent no longer registered can still be changed);
    ``new_channels`` likewise (a rule stored before a channel check was added, such as
    the webhook destinations', can still be disabled or changed)."""
    if unknown := sorted(set(values) - set(FIELDS)):
        raise InvalidRule(unknown[0], "is not a field of an alert rule")
    values = {**DEFAULTS, **values}
    name = values.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_LENGTH or text_problem(name):
        raise InvalidRule("name", f"must be text of 1 to {MAX_NAME_LENGTH} characters")
    if values.get("kind") not in AlertKind.values:
        raise InvalidRule("kind", f"must be one of {', '.join(AlertKind.values)}")
    agent = values["agent"]
    if agent is not None and new_agent and agent not in registry.names():
        raise InvalidRule("agent", f"no agent named {agent!r} is registered")
    threshold = values.get("threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise InvalidRule("threshold", "must be a number")
    # A count of 0 would fire for every agent that finished anything.
    low = 1 if values["kind"] in (AlertKind.DEAD_LETTER, AlertKind.LEASE_EXPIRATIONS) else 0
    high = 1 if values["kind"] == AlertKind.FAILURE_RATE else 1e12
    if not math.isfinite(threshold) or not low <= threshold <= high:
        raise InvalidRule("threshold", f"must be from {low} to {high:g}")
    _integer(values, "window_seconds", 10, 3600)  # the finish counters' reach
    _integer(values, "min_count", 1, 1_000_000)
    _integer(values, "repeat_seconds", 60, 7 * 86400)
    if not isinstance(values["enabled"], bool):
        raise InvalidRule("enabled", "must be true or false")
    if new_channels:
        try:
            values["channels"] = check_channels(values["channels"])
        except InvalidChannel as error:
            raise InvalidRule(error.field, error.message) from None
    return {field: values[field] for field in FIELDS}


def firing_states() -> QuerySet[AlertState]:
    """The states firing now, oldest first (the API's and the alerts page's)."""
    return AlertState.objects.filter(firing_since__isnull=False).order_by("firing_since")


def described(rule: AlertRule) -> dict[str, Any]:
    """The rule as the audit log and the API show it: channels without secrets, each
    with a fingerprint that changes with its URL or secret (an HMAC under the
    project's SECRET_KEY, so it tells nothing of them)."""
    return {
        **{field: getattr(rule, field) for field in FIELDS if field != "channels"},
        "channels": [
            {**shown(channel), "fingerprint": fingerprint(channel)} for channel in rule.channels
        ],
    }


def fingerprint(channel: dict[str, Any]) -> str:
    text = json.dumps(channel, sort_keys=True).encode()
    return hmac.new(settings.SECRET_KEY.encode(), text, hashlib.sha256).hexdigest()[:16]


def create(values: dict[str, Any], *, actor: str, source: str) -> AlertRule:
    values = validated(values)
    with transaction.atomic():
        rule = AlertRule(source=source, **values)
        _save(rule)
        _audit(rule, OperatorAction.Kind.CREATE_ALERT_RULE, actor, source, described(rule))
    return rule


def update(rule_id: int, changes: dict[str, Any], *, actor: str, source: str) -> AlertRule:
    """Change a rule (``redefine`` says what becomes of its states); one declared in
    settings is changed there (:class:`DeclaredInSettings`)."""
    with transaction.atomic():
        rule = _changeable(rule_id)
        before = described(rule)
        values = validated(
            {**{f: getattr(rule, f) for f in FIELDS}, **changes},
            new_agent=changes.get("agent", rule.agent) != rule.agent,
            new_channels=changes.get("channels", rule.channels) != rule.channels,
        )
        redefine(rule, values)
        _save(rule)
        after = described(rule)
        diff = {f: {"from": before[f], "to": after[f]} for f in FIELDS if before[f] != after[f]}
        if diff:
            _audit(rule, OperatorAction.Kind.UPDATE_ALERT_RULE, actor, source, diff)
    return rule


def delete(rule_id: int, *, actor: str, source: str) -> None:
    """Remove a rule with its states and notifications (not one declared in settings)."""
    with transaction.atomic():
        rule = _changeable(rule_id)
        _audit(rule, OperatorAction.Kind.DELETE_ALERT_RULE, actor, source, described(rule))
        rule.delete()


def silence(rule_id: int, until: datetime | None, *, actor: str, source: str) -> AlertRule:
    """Silence a rule until ``until`` (None lifts the silence), audited. A rule
    declared in settings too: silencing is operating it, not defining it."""
    with transaction.atomic():
        rule = AlertRule.objects.select_for_update().get(pk=rule_id)
        rule.silenced_until = until
        rule.save(update_fields=["silenced_until"])
        shown_until = until.isoformat() if until else None
        _audit(rule, OperatorAction.Kind.SILENCE_ALERT_RULE, actor, source,
               {"silenced_until": shown_until})  # fmt: skip
    return rule


def redefine(rule: AlertRule, values: dict[str, Any]) -> None:
    """Give a saved rule these (validated) values. Disabled, or watching another kind
    or agent, it starts afresh: its states are dropped, with no resolve sent."""
    if not values["enabled"] or values["agent"] != rule.agent or values["kind"] != rule.kind:
        AlertState.objects.filter(rule=rule).delete()
        AlertFiring.objects.filter(rule=rule, ended_at__isnull=True).update(
            ended_at=db.database_clock(), ended_by=AlertFiring.End.RULE_CHANGED
        )
    for field, value in values.items():
        setattr(rule, field, value)
    rule.updated_at = db.database_clock()


def _changeable(rule_id: int) -> AlertRule:
    """The rule locked, if it may change here; and the evaluations' lock, so that none
    writes back a state this transaction drops."""
    locks.advisory_xact_lock(locks.ALERTS)
    rule = AlertRule.objects.select_for_update().get(pk=rule_id)
    if rule.source == Schedule.Source.CODE:
        raise DeclaredInSettings(rule.name)
    return rule


def _audit(rule: AlertRule, action: str, actor: str, source: str, changes: dict) -> None:
    audit.record(
        actor=actor,
        action=action,
        source=source,
        agent_name=rule.agent,
        changes={"alert_rule": rule.name, **changes},
    )


def _save(rule: AlertRule) -> None:
    save_named(
        rule,
        NAME_CONSTRAINT,
        lambda: InvalidRule("name", f"an alert rule named {rule.name!r} exists"),
    )
