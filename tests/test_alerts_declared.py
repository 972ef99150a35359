"""Alert rules declared in settings (QUEUE_ALERT_RULES): synced when the maintenance
loop's alert job first runs, changed and removed only there."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError

from task_queue import maintenance
from task_queue.alerts import declared
from task_queue.maintenance.jobs import evaluate_alerts
from task_queue.models import AlertRule, AlertState
from tests.support.queue import make_failed

pytestmark = pytest.mark.django_db

DEAD_ECHO = {"kind": "dead_letter", "threshold": 1, "agent": "EchoAgent"}


def test_declared_rules_are_created_changed_and_removed_with_the_settings(settings):
    settings.QUEUE_ALERT_RULES = {"dead echo": DEAD_ECHO}
    maintenance.SyncedFirst(declared.sync_declared, evaluate_alerts)()  # syncs, evaluates
    rule = AlertRule.objects.get(name="dead echo")
    assert (rule.source, rule.kind, rule.threshold, rule.window_seconds) == (
        "code", "dead_letter", 1, 900
    )  # fmt: skip
    make_failed([{}])
    job = maintenance.SyncedFirst(declared.sync_declared, evaluate_alerts)
    assert job() == "alerts: dead echo (EchoAgent) firing"
    assert job() is None  # synced once: the second pass only evaluates

    settings.QUEUE_ALERT_RULES = {"dead echo": {**DEAD_ECHO, "threshold": 5}}
    declared.sync_declared()
    rule.refresh_from_db()
    assert rule.threshold == 5 and AlertState.objects.filter(rule=rule).exists()
    settings.QUEUE_ALERT_RULES = {"dead echo": {**DEAD_ECHO, "kind": "failure_rate"}}
    declared.sync_declared()
    assert not AlertState.objects.filter(rule=rule).exists()  # another kind: afresh

    settings.QUEUE_ALERT_RULES = {}
    declared.sync_declared()
    assert not AlertRule.objects.exists()


def test_a_rule_of_the_api_is_taken_over_and_then_refused_there(settings, admin_api):
    made = admin_api.post("/api/v1/alert-rules", {"name": "dead echo", **DEAD_ECHO}).json()
    settings.QUEUE_ALERT_RULES = {"dead echo": DEAD_ECHO}
    declared.sync_declared()
    assert AlertRule.objects.get(id=made["id"]).source == "code"
    for response in (
        admin_api.patch(f"/api/v1/alert-rules/{made['id']}", {"threshold": 9}),
        admin_api.delete(f"/api/v1/alert-rules/{made['id']}"),
    ):
        assert response.status_code == 409, response.content
        assert response.json()["code"] == "declared_in_settings"
        assert "QUEUE_ALERT_RULES" in response.json()["message"]
    assert AlertRule.objects.get(id=made["id"]).threshold == 1


def test_the_key_names_a_declared_rule(settings):
    settings.QUEUE_ALERT_RULES = {"dead echo": {**DEAD_ECHO, "name": "something else"}}
    declared.sync_declared()
    assert list(AlertRule.objects.values_list("name", flat=True)) == ["dead echo"]


def test_a_bad_declaration_names_the_rule_and_field_and_writes_nothing(settings):
    settings.QUEUE_ALERT_RULES = {
        "fine": DEAD_ECHO,
        "broken": {**DEAD_ECHO, "window_seconds": 5},
    }
    with pytest.raises(ImproperlyConfigured, match=r"QUEUE_ALERT_RULES\['broken'\]: window_"):
        declared.sync_declared()
    assert not AlertRule.objects.exists()


def test_runmaintenance_refuses_a_bad_declaration_in_one_line(settings, monkeypatch):
    settings.QUEUE_ALERT_RULES = {"broken": {**DEAD_ECHO, "kind": "sometimes"}}
    # As a process starting: this one's job may have synced already, in another test.
    [job] = [job for job in maintenance.registered() if job.name == "alert rules"]
    monkeypatch.setattr(job.run, "synced", False)
    with pytest.raises(CommandError, match=r"^QUEUE_ALERT_RULES\['broken'\]: kind: must be one"):
        call_command("runmaintenance", "--once")
