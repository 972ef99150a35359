"""``/api/v1/alert-rules`` and ``/api/v1/alerts``: an admin token creates, changes and
deletes rules (each change in the audit log), a read token lists them, secrets are
never shown back, bad input is 422 naming the field, a bound token is confined to
its agents; the alerts list shows what fired and every delivery attempt."""

from __future__ import annotations

import pytest

from task_queue.alerts import delivery, evaluation
from task_queue.models import AlertRule, OperatorAction
from tests.support.api import Api, field_names, token
from tests.support.queue import make_failed
from tests.support.receiver import webhook_receiver

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "never-shown"
RULE = {
    "name": "echo dead letter",
    "kind": "dead_letter",
    "agent": "EchoAgent",
    "threshold": 1,
    "channels": [{"type": "webhook", "url": "https://hooks.example.com/a/b?k=v", "secret": SECRET}],
}


def test_an_admin_creates_changes_and_deletes_a_rule_and_each_change_is_audited(admin_api):
    created = admin_api.post("/api/v1/alert-rules", RULE)
    assert created.status_code == 201, created.content
    rule = created.json()
    assert SECRET.encode() not in created.content
    [shown] = rule["channels"]
    assert {k: shown[k] for k in ("type", "url", "signed")} == {
        "type": "webhook",
        "url": "https://hooks.example.com/…",
        "signed": True,
    }
    assert (rule["window_seconds"], rule["repeat_seconds"], rule["firing"]) == (900, 3600, [])
    assert AlertRule.objects.get().channels[0]["secret"] == SECRET  # kept, for signing

    listed = Api(token("read")).get("/api/v1/alert-rules")
    assert listed.status_code == 200 and [r["name"] for r in listed.json()] == [RULE["name"]]
    assert SECRET.encode() not in listed.content

    changed = admin_api.patch(f"/api/v1/alert-rules/{rule['id']}", {"enabled": False})
    assert changed.status_code == 200 and changed.json()["enabled"] is False
    assert admin_api.delete(f"/api/v1/alert-rules/{rule['id']}").status_code == 204
    assert not AlertRule.objects.exists()
    actions = OperatorAction.objects.order_by("occurred_at", "id")
    assert [a.action for a in actions] == [
        "create_alert_rule",
        "update_alert_rule",
        "delete_alert_rule",
    ]
    assert actions[1].changes == {
        "alert_rule": RULE["name"],
        "enabled": {"from": True, "to": False},
    }
    assert all(SECRET not in str(a.changes) for a in actions)


def test_a_new_secret_or_url_is_audited_without_showing_it(admin_api):
    rule = admin_api.post("/api/v1/alert-rules", RULE).json()
    rotated = [{**RULE["channels"][0], "secret": "rotated-secret"}]
    changed = admin_api.patch(f"/api/v1/alert-rules/{rule['id']}", {"channels": rotated})
    assert changed.status_code == 200
    assert changed.json()["channels"][0]["fingerprint"] != rule["channels"][0]["fingerprint"]
    update = OperatorAction.objects.get(action="update_alert_rule")
    assert set(update.changes) == {"alert_rule", "channels"}
    assert "rotated-secret" not in str(update.changes) and SECRET not in str(update.changes)


def test_changing_rules_needs_an_admin_token(api):
    assert api.post("/api/v1/alert-rules", RULE).status_code == 403
    assert api.get("/api/v1/alert-rules").status_code == 200
    assert Api(None).get("/api/v1/alerts").status_code == 401


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kind": "disk_full"}, "kind"),
        ({"agent": "NoSuchAgent"}, "agent"),
        ({"window_seconds": 86400}, "window_seconds"),
        ({"kind": "failure_rate", "threshold": 2}, "threshold"),
        ({"threshold": "many"}, "threshold"),
        ({"repeat_seconds": 0}, "repeat_seconds"),
        ({"channels": [{"type": "webhook", "url": "file:///etc/passwd"}]}, "channels[0].url"),
        ({"channels": [{"type": "email", "to": ["x"]}]}, "channels[0].to[0]"),
        ({"channels": [{"type": "email", "to": [{"@": 1}]}]}, "channels[0].to[0]"),
        (
            {"channels": [{"type": "webhook", "url": "https://u:pw@h.example.com/"}]},
            "channels[0].url",
        ),
        (
            {"channels": [{"type": "webhook", "url": "http://h.example.com:99999/"}]},
            "channels[0].url",
        ),
        ({"channels": [{"type": "webhook", "url": "http://[bad/"}]}, "channels[0].url"),
        # Not public (the suite allows 127.0.0.0/8 alone: tests/settings.py).
        ({"channels": [{"type": "webhook", "url": "http://169.254.169.254/"}]}, "channels[0].url"),
        ({"channels": [{"type": "slack", "url": "https://[::1]:5432/"}]}, "channels[0].url"),
        ({"channels": [{"type": "slack", "url": "https://h.example.com/a\nb"}]}, "channels[0].url"),
        ({"threshold": 0}, "threshold"),
        ({"colour": "red"}, "colour"),
        ({"name": ""}, "name"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_rules_are_422_naming_the_field(admin_api, change, field):
    refused = admin_api.post("/api/v1/alert-rules", {**RULE, **change})
    assert refused.status_code == 422, refused.content
    assert field in field_names(refused)
    assert not AlertRule.objects.exists()


def test_a_taken_name_is_422(admin_api):
    assert admin_api.post("/api/v1/alert-rules", RULE).status_code == 201
    again = admin_api.post("/api/v1/alert-rules", RULE)
    assert again.status_code == 422 and field_names(again) == ["name"]


def test_a_bound_token_is_confined_to_its_agents(admin_api):
    bound = Api(token("admin", "echo-admin", ("EchoAgent",)))
    every_agent = bound.post("/api/v1/alert-rules", {**RULE, "agent": None})
    assert every_agent.status_code == 403 and field_names(every_agent) == ["agent"]
    assert bound.post("/api/v1/alert-rules", RULE).status_code == 201
    other = admin_api.post(
        "/api/v1/alert-rules", {**RULE, "name": "fitment", "agent": "FitmentAgent"}
    )
    assert [r["name"] for r in bound.get("/api/v1/alert-rules").json()] == [RULE["name"]]
    assert bound.delete(f"/api/v1/alert-rules/{other.json()['id']}").status_code == 404


def test_the_alerts_list_shows_what_fires_and_every_delivery_attempt(admin_api):
    with webhook_receiver(statuses=[500]) as receiver:
        hook = {"type": "webhook", "url": receiver.url, "secret": SECRET}
        admin_api.post("/api/v1/alert-rules", {**RULE, "channels": [hook]})
        make_failed([{"n": 1}])
        evaluation.evaluate()
        delivery.deliver(wait_for_sends=True)
    alerts = Api(token("read")).get("/api/v1/alerts")
    assert alerts.status_code == 200 and SECRET.encode() not in alerts.content
    body = alerts.json()
    [firing] = body["firing"]
    assert (firing["rule"], firing["agent"], firing["state"]) == (
        RULE["name"],
        "EchoAgent",
        "firing",
    )
    assert body["recent"] == [firing]
    [sent] = firing["deliveries"]
    assert (sent["status"], sent["attempts"]) == ("pending", 1)
    assert [(t["attempt"], t["ok"], t["http_status"]) for t in sent["tries"]] == [(1, False, 500)]
