"""The alerts in a real browser: the overview's banner while a rule fires (pushed
live, gone once it resolves), /alerts/ with the rule's state and the notification's
delivery attempts, with no secret shown, and an operator creating (refused first, on
the field), changing, silencing, testing and disabling a rule."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from task_queue import operations
from task_queue.alerts import delivery, evaluation
from task_queue.models import AlertKind, AlertRule, OperatorAction
from tests.support.browser import POST_STATUS, needs_chromium
from tests.support.queue import make_failed
from tests.support.receiver import webhook_receiver
from tests.support.users import grant
from tests.test_dashboard_browser import db, live, log_in, shot, users  # noqa: F401 - fixture

pytestmark = [pytest.mark.slow, needs_chromium]


def test_the_banner_and_the_alerts_page_show_a_firing_rule(
    users,  # noqa: F811 - the fixture
    live_servers,
    browser,
):
    server = live_servers()
    with webhook_receiver([500]) as receiver:
        channel = {"type": "webhook", "url": receiver.url + "/hook-path", "secret": "s3cret"}
        db(
            lambda: AlertRule.objects.create(
                name="echo dead letter", kind=AlertKind.DEAD_LETTER, agent="EchoAgent",
                threshold=1, channels=[channel],
            )
        )  # fmt: skip
        failed = db(lambda: make_failed([{"n": 1}]))
        db(evaluation.evaluate)
        db(lambda: delivery.deliver(wait_for_sends=True))  # answered 500: to try again

    page = log_in(browser, server, "viewer")
    live(page)
    assert page.inner_text(".alert-banner") == "1 alert firing"
    shot(page, "overview-alert-banner")
    page.click(".alert-banner a")
    page.wait_for_url("**/alerts/")
    state = page.inner_text('tr[data-rule="echo dead letter"] [data-rule-state]')
    assert "firing EchoAgent since" in state
    deliveries = page.inner_text("[data-notification] [data-delivery-status]")
    assert "pending" in deliveries and "attempt 1" in deliveries and "HTTP 500" in deliveries
    html = page.content()
    assert "s3cret" not in html and "hook-path" not in html  # no secret, no path
    shot(page, "alerts")

    # Revived, the rule resolves: the banner leaves the open overview, pushed.
    page.goto(server.url + "/")
    live(page)
    db(lambda: operations.revive(failed, actor="test"))
    db(evaluation.evaluate)
    page.wait_for_selector(".alert-banner", state="detached", timeout=10_000)


def test_an_operator_with_manage_alerts_creates_silences_tests_and_disables_a_rule(
    users,  # noqa: F811 - the fixture
    live_servers,
    browser,
):
    db(lambda: grant(User.objects.get(username="operator"), "queue.manage_alerts"))
    server = live_servers()
    page = log_in(browser, server, "operator", "/alerts/")
    page.click("details#new-alert-rule summary")
    form = 'form[data-form="new-alert-rule"]'
    page.fill(f"{form} [name=name]", "backlog")
    page.select_option(f"{form} [name=kind]", "backlog_age")
    page.fill(f"{form} [name=threshold]", "60")
    page.fill(f"{form} [name=channels]", '[{"type": "email", "to": ["not an address"]}]')
    page.click(f"{form} button[data-action=create]")
    error = page.inner_text('[data-error="channels"]')
    assert error == "channels[0].to[0]: not an email address"  # refused, on its field
    shot(page, "alerts-new-rule-refused")
    page.fill(f"{form} [name=channels]", '[{"type": "email", "to": ["oncall@example.com"]}]')
    page.click(f"{form} button[data-action=create]")
    assert "Alert rule 'backlog' created." in page.inner_text("#messages")
    rule = db(lambda: AlertRule.objects.get(name="backlog"))
    assert (rule.kind, rule.threshold, rule.agent) == ("backlog_age", 60, None)
    page.click('tr[data-rule="backlog"] [data-action=edit]')
    assert page.input_value("[name=channels]") == ""  # kept unless replaced: never shown
    page.fill("[name=threshold]", "120")
    shot(page, "alert-rule-edit")
    page.click("button[data-action=save]")
    assert "Alert rule 'backlog' saved." in page.inner_text("#messages")
    assert db(lambda: AlertRule.objects.get(name="backlog").threshold) == 120
    row = 'tr[data-rule="backlog"]'
    page.click(f"{row} button:has-text('Silence 1 h')")
    assert "backlog: silenced until" in page.inner_text("#messages")
    assert "silenced until" in page.inner_text(f"{row} [data-rule-state]")
    page.click(f"{row} button:has-text('Send a test')")
    assert "a test notification is on its way" in page.inner_text("#messages")
    assert "a test of 'backlog', sent by user:operator" in page.inner_text("[data-notification]")
    page.click(f"{row} button:has-text('Disable')")
    assert "disabled" in page.inner_text(f"{row} [data-rule-state]")
    shot(page, "alerts-managed")
    actions = db(
        lambda: sorted(OperatorAction.objects.values_list("action", flat=True))
    )  # fmt: skip
    assert actions == [
        "create_alert_rule", "silence_alert_rule", "test_alert_rule", "update_alert_rule",
        "update_alert_rule",
    ]  # fmt: skip

    viewer = log_in(browser, server, "viewer", "/alerts/")
    assert viewer.query_selector(f"{row} button") is None
    assert viewer.evaluate(POST_STATUS, f"/alerts/{rule.id}/test/") == 403
