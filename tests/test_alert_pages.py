"""Writing alert rules on ``/alerts/``: creating, changing and deleting one needs
``queue.manage_alerts``, goes through the same check as the API (a refusal comes back
on the field it names, with nothing written), keeps a channel's secret unshown, and is
in the audit log; a rule declared in settings is changed there only."""

from __future__ import annotations

import pytest

from task_queue.models import AlertFiring, AlertKind, AlertRule, OperatorAction
from task_queue.sql import db
from tests.support.users import staff

pytestmark = pytest.mark.django_db

MANAGE = "queue.manage_alerts"
WEBHOOK = '[{"type": "webhook", "url": "https://ops.example.com/hook/path", "secret": "s3cret"}]'
FORM = {
    "name": "echo dead letter",
    "kind": "dead_letter",
    "agent": "EchoAgent",
    "threshold": "5",
    "window_seconds": "900",
    "min_count": "10",
    "repeat_seconds": "3600",
    "channels": WEBHOOK,
    "enabled": "on",
}


def test_an_operator_creates_changes_and_deletes_a_rule_audited():
    operator = staff(MANAGE)
    page = operator.get("/alerts/").content.decode()
    assert 'data-form="new-alert-rule"' in page and 'name="csrfmiddlewaretoken"' in page
    assert operator.post("/alerts/new/", FORM).status_code == 302
    rule = AlertRule.objects.get()
    assert (rule.kind, rule.agent, rule.threshold, rule.source) == (
        "dead_letter", "EchoAgent", 5, "dashboard",
    )  # fmt: skip
    assert rule.channels[0]["secret"] == "s3cret"

    edit = operator.get(f"/alerts/{rule.id}/edit/").content.decode()
    assert "s3cret" not in edit and "hook/path" not in edit  # the channels are not shown
    assert 'value="echo dead letter"' in edit and "Blank keeps these 1 channel(s)" in edit
    assert "Now: webhook https://ops.example.com/… (signed)" in edit
    changed = {**FORM, "threshold": "7", "channels": "", "agent": ""}
    assert operator.post(f"/alerts/{rule.id}/edit/", changed).status_code == 302
    rule.refresh_from_db()
    assert (rule.threshold, rule.agent, rule.channels[0]["secret"]) == (7, None, "s3cret")
    operator.post(f"/alerts/{rule.id}/edit/", {**changed, "channels": "[]"})
    assert AlertRule.objects.get().channels == []

    assert operator.post(f"/alerts/{rule.id}/delete/").status_code == 302
    assert not AlertRule.objects.exists()
    actions = list(OperatorAction.objects.order_by("id").values_list("action", "source"))
    assert actions == [
        ("create_alert_rule", "dashboard"),
        ("update_alert_rule", "dashboard"),
        ("update_alert_rule", "dashboard"),
        ("delete_alert_rule", "dashboard"),
    ]
    assert "s3cret" not in str(list(OperatorAction.objects.values_list("changes", flat=True)))


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("name", "", "name"),
        ("threshold", "", "threshold"),
        ("threshold", "1e400", "threshold"),  # not a finite number
        ("window_seconds", "5", "window_seconds"),
        ("window_seconds", "9" * 40, "window_seconds"),
        ("agent", "NoSuchAgent", "agent"),
        ("kind", "nonsense", "kind"),
        ("channels", "[{", "channels"),
        ("channels", '[{"type": "webhook", "url": "ftp://x"}]', "channels"),
        ("channels", "[" * 5000 + "]" * 5000, "channels"),
        ("channels", "[" + "1" * 5000 + "]", "channels"),  # over Python's digit limit
        (
            "channels",
            '[{"type": "webhook", "url": "https://e.com", "secret": "a\\u0000"}]',
            "channels",
        ),
    ],
)
def test_a_refused_rule_is_shown_on_its_field_with_nothing_written(field, value, error):
    answer = staff(MANAGE).post("/alerts/new/", {**FORM, field: value})
    assert answer.status_code == 400
    assert f'data-error="{error}"' in answer.content.decode()
    assert not AlertRule.objects.exists() and not OperatorAction.objects.exists()


def test_a_channels_refusal_names_the_channels_own_field():
    bad = '[{"type": "email", "to": ["oncall@example.com", "not an address"]}]'
    page = staff(MANAGE).post("/alerts/new/", {**FORM, "channels": bad}).content.decode()
    assert "channels[0].to[1]: not an email address" in page


def test_writing_rules_needs_the_permission():
    rule = AlertRule.objects.create(name="r", kind=AlertKind.BACKLOG_AGE, threshold=60)
    viewer = staff()
    page = viewer.get("/alerts/").content.decode()
    assert 'data-form="new-alert-rule"' not in page and 'data-action="edit"' not in page
    assert viewer.post("/alerts/new/", FORM).status_code == 403
    assert viewer.get(f"/alerts/{rule.id}/edit/").status_code == 403
    assert viewer.post(f"/alerts/{rule.id}/delete/").status_code == 403
    assert AlertRule.objects.count() == 1 and not OperatorAction.objects.exists()


def test_a_rule_declared_in_settings_is_changed_there():
    rule = AlertRule.objects.create(
        name="declared", kind=AlertKind.BACKLOG_AGE, threshold=60, source="code"
    )
    operator = staff(MANAGE)
    assert 'data-action="edit"' not in operator.get("/alerts/").content.decode()
    answer = operator.get(f"/alerts/{rule.id}/edit/")
    assert answer.status_code == 409 and 'data-error="declared"' in answer.content.decode()
    assert operator.post(f"/alerts/{rule.id}/edit/", FORM).status_code == 409
    assert operator.post(f"/alerts/{rule.id}/delete/").status_code == 409
    assert AlertRule.objects.get().name == "declared"


def test_the_page_shows_the_history_of_firings():
    rule = AlertRule.objects.create(name="dead", kind=AlertKind.DEAD_LETTER, threshold=1)
    clock = db.database_clock()
    AlertFiring.objects.create(rule=rule, agent="EchoAgent", started_at=clock, peak_value=3)
    AlertFiring.objects.create(
        rule=rule, agent="FitmentAgent", started_at=clock, ended_at=clock, ended_by="resolved",
        peak_value=1,
    )  # fmt: skip
    page = staff().get("/alerts/").content.decode()
    assert page.count("data-firing=") == 2
    assert '<span class="tag bad">firing</span>' in page and "FitmentAgent" in page
