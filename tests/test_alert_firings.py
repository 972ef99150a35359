"""The history of firings (``alert_firings``): one row from when a rule begins to hold
for an agent to when it resolves, with the highest reading in between; a silenced
firing is kept too; a rule change that drops its states ends its open firings;
retention forgets ended ones; the firings under way when queue 0040 runs get their
open row."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction

from automechanica.dashboard.overview import take_snapshot
from task_queue import operations
from task_queue.alerts import evaluation, rules
from task_queue.maintenance import retention
from task_queue.models import AlertFiring, AlertKind, AlertRule, AlertState, RetentionRun
from task_queue.sql import db
from tests.support.queue import make_failed

pytestmark = pytest.mark.django_db(transaction=True)


def dead_letter_rule(**options) -> AlertRule:
    return AlertRule.objects.create(
        name="dead", kind=AlertKind.DEAD_LETTER, agent="EchoAgent", threshold=1, **options
    )


def history() -> list[tuple[str, float, str | None]]:
    return [
        (f.agent, f.peak_value, f.ended_by)
        for f in AlertFiring.objects.order_by("started_at", "id")
    ]


def test_a_firing_is_recorded_from_start_to_resolve_with_its_peak():
    dead_letter_rule()
    first = make_failed([{"n": 1}])
    clock = db.database_clock()
    evaluation.evaluate(now=clock)
    second = make_failed([{"n": 2}])
    evaluation.evaluate(now=clock + timedelta(seconds=5))  # 2 dead now: the peak
    operations.revive(second, actor="test")
    evaluation.evaluate(now=clock + timedelta(seconds=10))  # 1 again: still firing
    assert history() == [("EchoAgent", 2.0, None)]
    operations.revive(first, actor="test")
    evaluation.evaluate(now=clock + timedelta(seconds=15))
    [firing] = AlertFiring.objects.all()
    assert (firing.started_at, firing.ended_at) == (clock, clock + timedelta(seconds=15))
    assert history() == [("EchoAgent", 2.0, "resolved")]

    make_failed([{"n": 3}])  # fires again (the two revived fail with it): a second row
    evaluation.evaluate(now=clock + timedelta(seconds=20))
    assert history() == [("EchoAgent", 2.0, "resolved"), ("EchoAgent", 3.0, None)]


def test_a_silenced_firing_is_kept_and_a_rule_change_ends_it():
    rule = dead_letter_rule(silenced_until=db.database_clock() + timedelta(hours=1))
    make_failed([{"n": 1}])
    assert evaluation.evaluate() == []  # silenced: nothing sent
    assert history() == [("EchoAgent", 1.0, None)]
    rules.update(rule.id, {"enabled": False}, actor="test", source="api")
    assert history() == [("EchoAgent", 1.0, "rule_changed")]


def test_one_open_firing_per_rule_and_agent_is_all_the_table_takes():
    rule = dead_letter_rule()
    clock = db.database_clock()
    AlertFiring.objects.create(rule=rule, agent="EchoAgent", started_at=clock)
    with pytest.raises(IntegrityError), transaction.atomic():
        AlertFiring.objects.create(rule=rule, agent="EchoAgent", started_at=clock)
    AlertFiring.objects.update(ended_at=clock)
    AlertFiring.objects.create(rule=rule, agent="EchoAgent", started_at=clock)  # ended: free


def test_retention_forgets_ended_firings_only(settings):
    settings.QUEUE_RETENTION_DAYS = 1
    rule = dead_letter_rule()
    clock = db.database_clock()
    AlertFiring.objects.create(
        rule=rule, agent="EchoAgent", started_at=clock, ended_at=clock, ended_by="resolved"
    )
    AlertFiring.objects.create(rule=rule, agent="FitmentAgent", started_at=clock)
    assert retention.prune(now=clock + timedelta(days=2)).alert_firings == 1
    assert list(AlertFiring.objects.values_list("agent", flat=True)) == ["FitmentAgent"]
    # Recorded with the pass, and shown on the overview among the last day's pruning.
    assert RetentionRun.objects.get().alert_firings == 1
    assert take_snapshot().pruned == {kind: 0 for kind in retention.KINDS} | {"alert_firings": 1}


def test_the_firings_under_way_when_migrated_get_their_open_row():
    rule = dead_letter_rule()
    clock = db.database_clock()
    AlertState.objects.create(
        rule=rule, agent="EchoAgent", value=3, firing_since=clock, evaluated_at=clock
    )
    AlertState.objects.create(rule=rule, agent="FitmentAgent", value=0, evaluated_at=clock)
    try:
        call_command("migrate", "queue", "0039", verbosity=0)
        call_command("migrate", "queue", "0040", verbosity=0)
        assert history() == [("EchoAgent", 3.0, None)]
        assert AlertFiring.objects.get().started_at == clock
    finally:
        call_command("migrate", verbosity=0)
