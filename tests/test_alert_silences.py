"""Silencing an alert rule and sending a test notification (issue 35 §4), in process
and through the API: a silenced rule is evaluated but sends nothing, and a firing that
outlasts the silence is notified once it ends."""

from __future__ import annotations

from datetime import timedelta

import pytest

from task_queue.alerts import evaluation, rules
from task_queue.models import AlertKind, AlertNotification, AlertRule, OperatorAction, Task
from task_queue.sql import db
from tests.support.queue import make_failed

pytestmark = pytest.mark.django_db

WEBHOOK = {"type": "webhook", "url": "https://hooks.example.com/x", "secret": "s"}


def dead_echo() -> AlertRule:
    return AlertRule.objects.create(
        name="dead echo", kind=AlertKind.DEAD_LETTER, agent="EchoAgent", threshold=1,
        channels=[WEBHOOK],
    )  # fmt: skip


def test_a_silenced_rule_sends_nothing_until_the_silence_ends():
    rule = dead_echo()
    clock = db.database_clock()
    rules.silence(rule.id, clock + timedelta(hours=1), actor="user:op", source="dashboard")
    make_failed([{}])
    assert evaluation.evaluate(now=clock) == []  # firing, silenced
    assert rule.states.get().firing_since == clock
    assert evaluation.evaluate(now=clock + timedelta(minutes=59)) == []
    [late] = evaluation.evaluate(now=clock + timedelta(hours=1, seconds=1))
    assert (late.state, late.started_at) == ("firing", clock)  # it began in the silence
    assert evaluation.evaluate(now=clock + timedelta(hours=1, seconds=2)) == []  # once
    action = OperatorAction.objects.get(action=OperatorAction.Kind.SILENCE_ALERT_RULE)
    assert action.changes["alert_rule"] == "dead echo" and action.actor == "user:op"


def test_silence_and_test_through_the_api(admin_api):
    rule = dead_echo()
    until = (db.database_clock() + timedelta(hours=2)).isoformat()
    response = admin_api.post(f"/api/v1/alert-rules/{rule.id}/silence", {"until": until})
    assert response.status_code == 200, response.content
    assert response.json()["silenced_until"] is not None
    lifted = admin_api.post(f"/api/v1/alert-rules/{rule.id}/silence", {"until": None})
    assert lifted.json()["silenced_until"] is None
    bad = admin_api.post(f"/api/v1/alert-rules/{rule.id}/silence", {"until": "soon"})
    assert bad.status_code == 422 and bad.json()["field_errors"][0]["field"] == "until"

    sent = admin_api.post(f"/api/v1/alert-rules/{rule.id}/test")
    assert sent.status_code == 201, sent.content
    test = AlertNotification.objects.get(id=sent.json()["notification_id"])
    assert test.state == "test" and test.deliveries.count() == 1
    assert test.body["links"] == {"alerts": "/alerts/"}
    assert "a test of 'dead echo', sent by token:" in test.body["summary"]
    assert OperatorAction.objects.filter(action=OperatorAction.Kind.TEST_ALERT_RULE).exists()
    listed = admin_api.get("/api/v1/alerts").json()
    assert [n["state"] for n in listed["recent"]] == ["test"] and listed["firing"] == []
    assert admin_api.post("/api/v1/alert-rules/999999/test").status_code == 404


def test_a_firing_again_during_a_silence_is_told_when_it_ends_and_resolves_told():
    rule = dead_echo()
    clock = db.database_clock()
    minute = timedelta(minutes=1)
    make_failed([{}])
    assert states(evaluation.evaluate(now=clock)) == ["firing"]
    Task.objects.filter(status="failed").update(status="completed")  # it stops holding
    assert states(evaluation.evaluate(now=clock + minute)) == ["resolved"]

    rules.silence(rule.id, clock + 10 * minute, actor="user:op", source="api")
    make_failed([{}])
    assert evaluation.evaluate(now=clock + 2 * minute) == []  # fires again, silenced
    # The silence ends: told at once, not a repeat period after the last notification.
    assert states(evaluation.evaluate(now=clock + 11 * minute)) == ["firing"]
    rules.silence(rule.id, clock + 30 * minute, actor="user:op", source="api")
    Task.objects.filter(status="failed").update(status="completed")
    # Resolved during a silence: people were told it fired, so they are told it ended.
    assert states(evaluation.evaluate(now=clock + 12 * minute)) == ["resolved"]


def test_a_firing_nobody_was_told_of_resolves_without_a_word():
    rule = dead_echo()
    clock = db.database_clock()
    rules.silence(rule.id, clock + timedelta(hours=1), actor="user:op", source="api")
    make_failed([{}])
    assert evaluation.evaluate(now=clock) == []
    Task.objects.filter(status="failed").update(status="completed")
    assert evaluation.evaluate(now=clock + timedelta(hours=2)) == []
    assert not AlertNotification.objects.exists()


def states(made: list[AlertNotification]) -> list[str]:
    return [n.state for n in made]
