"""Alert rules declared in settings (``QUEUE_ALERT_RULES``), like schedules: synced
when a maintenance loop starts, marked as declared there (``source`` ``code``), and
changed or removed only there (the API answers 409).

A declared rule's changes are the deployment's, so they are not in the operators'
audit log; a rule of the same name made through the API is taken over.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import QuerySet

from task_queue.models import AlertRule, Schedule
from task_queue.sql import locks

from .rules import FIELDS, InvalidRule, redefine, validated


def sync_declared() -> None:
    """New declared rules created, changed ones redefined, removed ones deleted; a bad
    declaration refuses to start, naming the rule and the field."""
    declared: dict[str, dict[str, Any]] = settings.QUEUE_ALERT_RULES
    checked = {}
    for name, definition in declared.items():
        try:
            checked[name] = validated({**definition, "name": name})  # the key names it
        except InvalidRule as error:
            raise ImproperlyConfigured(f"QUEUE_ALERT_RULES[{name!r}]: {error}") from None
    with transaction.atomic():
        locks.advisory_xact_lock(locks.ALERT_RULE_SYNC)  # one process syncs at a time
        if _drops_states(checked):
            # Before any rule's row, as the API and the page take them: a change drops
            # states, which no evaluation may write back meanwhile. Only then: a loop
            # starting while another evaluates (or is stuck mid-evaluation) waits only
            # if it must.
            locks.advisory_xact_lock(locks.ALERTS)
        for name, values in checked.items():
            rule = AlertRule.objects.select_for_update().filter(name=name).first()
            if rule is None:
                AlertRule.objects.create(source=Schedule.Source.CODE, **values)
                continue
            if _unchanged(rule, values):
                continue
            locks.advisory_xact_lock(locks.ALERTS)  # held already, unless changed meanwhile
            redefine(rule, values)
            rule.source = Schedule.Source.CODE
            rule.save()
        undeclared = _undeclared(checked)
        if undeclared.exists():
            locks.advisory_xact_lock(locks.ALERTS)
            undeclared.delete()


def _drops_states(checked: dict[str, dict[str, Any]]) -> bool:
    """Whether syncing ``checked`` changes or removes a rule that exists. Read without
    locks: should an operator change a rule between this read and the sync's row
    lock, the sync takes the evaluations' lock after the row's, and a collision with
    another change at that moment is a deadlock PostgreSQL ends (the next pass syncs
    again)."""
    existing = AlertRule.objects.filter(name__in=list(checked))
    changed = any(not _unchanged(rule, checked[rule.name]) for rule in existing)
    return changed or _undeclared(checked).exists()


def _unchanged(rule: AlertRule, values: dict[str, Any]) -> bool:
    """Declared in settings already, as ``values`` say."""
    return rule.source == Schedule.Source.CODE and all(
        getattr(rule, field) == values[field] for field in FIELDS
    )


def _undeclared(checked: dict[str, dict[str, Any]]) -> QuerySet[AlertRule]:
    return AlertRule.objects.filter(source=Schedule.Source.CODE).exclude(name__in=list(checked))
