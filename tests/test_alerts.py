"""Alert rules (task_queue.alerts) on the real database: each kind fires once when its
condition starts, again only after repeat_seconds, and resolves once when it stops;
notifications go to a real webhook receiver, signed, and a receiver answering 500 is
tried again with every attempt recorded. (Two maintenance processes, one killed
mid-evaluation: tests/test_alerts_processes.py.)"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection

from task_queue import operations
from task_queue.alerts import channels, delivery, evaluation, rules
from task_queue.maintenance import reaper, retention
from task_queue.models import (
    AlertDelivery,
    AlertKind,
    AlertNotification,
    AlertRule,
    DeliveryStatus,
    RetentionRun,
)
from task_queue.schedules import firing as schedule_firing
from task_queue.sql import db
from tests.support.queue import claim_and_start, complete_pending, fail_pending, make_failed
from tests.support.receiver import webhook_receiver
from tests.test_schedules import make as make_schedule

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "s3cret"
SIGNATURE = channels.SIGNATURE_HEADER.lower()  # the receiver's headers are by lower case


def rule(kind: str, threshold: float, channels_: list | None = None, **options) -> AlertRule:
    return AlertRule.objects.create(
        name=f"{kind} rule", kind=kind, threshold=threshold, channels=channels_ or [], **options
    )


def states(made) -> list[tuple[str, str]]:
    return [(n.agent, n.state) for n in made]


def test_a_rule_fires_once_repeats_after_its_period_and_resolves_once():
    dead_letter = rule(AlertKind.DEAD_LETTER, 2, agent="EchoAgent", repeat_seconds=600)
    make_failed([{"n": 1}])
    assert evaluation.evaluate() == []  # 1 < 2
    failed = make_failed([{"n": 2}])
    clock = db.database_clock()
    assert states(evaluation.evaluate(now=clock)) == [("EchoAgent", "firing")]
    assert evaluation.evaluate(now=clock + timedelta(seconds=599)) == []
    [reminder] = evaluation.evaluate(now=clock + timedelta(seconds=600))
    assert (reminder.state, reminder.value, reminder.started_at) == ("firing", 2, clock)

    operations.revive(failed, actor="test")  # back to pending: no longer dead
    [resolved] = evaluation.evaluate(now=clock + timedelta(seconds=601))
    assert (resolved.state, resolved.value, resolved.started_at) == ("resolved", 1, clock)
    assert evaluation.evaluate() == []
    body = resolved.body
    assert body["rule"] == dead_letter.name and body["kind"] == "dead_letter"
    assert body["summary"].startswith("resolved: dead_letter rule (EchoAgent)")
    assert body["links"]["dead_letter"] == "/dead-letter/?agent=EchoAgent"


def test_a_rule_for_every_agent_fires_per_agent():
    rule(AlertKind.DEAD_LETTER, 1)
    make_failed([{"n": 1}])
    operations.enqueue("FitmentAgent", "generate_fitment", {})
    fail_pending("FitmentAgent", retryable=False)
    assert sorted(states(evaluation.evaluate())) == [
        ("EchoAgent", "firing"),
        ("FitmentAgent", "firing"),
    ]


def test_failure_rate_needs_its_minimum_count():
    rule(AlertKind.FAILURE_RATE, 0.5, agent="EchoAgent", min_count=4)
    make_failed([{"n": 1}])  # 1 of 1 failed: too few to page anyone
    assert evaluation.evaluate() == []
    for n in range(2):
        operations.enqueue("EchoAgent", "echo", {"n": n})
    complete_pending("EchoAgent")
    make_failed([{"n": 3}])  # 2 of 4
    [fired] = evaluation.evaluate()
    assert (fired.state, fired.value) == ("firing", 0.5)


def test_cancelled_tasks_are_not_finishes_a_rate_is_read_from():
    rule(AlertKind.FAILURE_RATE, 0.5, min_count=1)
    task = operations.enqueue("EchoAgent", "echo", {})
    operations.cancel([task.id], actor="test")  # the agent's only finished task
    assert evaluation.evaluate() == []


def test_a_disabled_rule_or_one_for_another_agent_starts_afresh():
    dead_letter = rule(AlertKind.DEAD_LETTER, 1, agent="EchoAgent")
    make_failed([{"n": 1}])
    assert states(evaluation.evaluate()) == [("EchoAgent", "firing")]
    rules.update(dead_letter.id, {"enabled": False}, actor="test", source="api")
    assert not dead_letter.states.exists()
    rules.update(dead_letter.id, {"enabled": True}, actor="test", source="api")
    assert states(evaluation.evaluate()) == [("EchoAgent", "firing")]  # a new firing
    rules.update(dead_letter.id, {"agent": "FitmentAgent"}, actor="test", source="api")
    assert not dead_letter.states.exists()
    assert evaluation.evaluate() == []  # FitmentAgent has no dead task


def test_backlog_age_and_no_workers_read_the_due_tasks():
    backlog = rule(AlertKind.BACKLOG_AGE, 60, agent="EchoAgent")
    rule(AlertKind.NO_WORKERS, 1, agent="EchoAgent")
    task = operations.enqueue("EchoAgent", "echo", {})
    # Due for an hour, and no worker runs in this test.
    operations.update_pending(
        task.id, actor="test", source="api", available_at=db.database_clock() - timedelta(hours=1)
    )
    made = evaluation.evaluate()
    assert sorted((n.rule.kind, n.state) for n in made) == [
        ("backlog_age", "firing"),
        ("no_workers", "firing"),
    ]
    assert next(n for n in made if n.rule == backlog).value >= 3600
    complete_pending("EchoAgent")
    assert sorted(n.state for n in evaluation.evaluate()) == ["resolved", "resolved"]


def test_lease_expirations_count_the_leases_reaped_in_the_window():
    rule(AlertKind.LEASE_EXPIRATIONS, 2, window_seconds=300)
    for _ in range(2):
        operations.enqueue("EchoAgent", "echo", {})
    claim_and_start("EchoAgent")  # held for 30 s by a worker that then stops
    reaper.reap_expired_leases(now=db.database_clock() + timedelta(seconds=31))
    [firing] = evaluation.evaluate()
    assert (firing.agent, firing.state, firing.value) == ("EchoAgent", "firing", 2)
    assert "2 lease(s) expired in 300 s" in firing.body["summary"]
    assert set(firing.body["links"]) == {"workers", "agent"}
    with connection.cursor() as cursor:  # the window moves past them
        cursor.execute("UPDATE task_history SET occurred_at = now() - interval '301 seconds'")
    assert states(evaluation.evaluate()) == [("EchoAgent", "resolved")]


def test_schedule_missed_reads_how_late_a_slot_was_skipped_or_fired():
    rule(AlertKind.SCHEDULE_MISSED, 120, window_seconds=600)
    schedule = make_schedule(interval_seconds=60, missed="skip")
    on_time = schedule.next_run_at + timedelta(seconds=1)
    assert schedule_firing.fire_due(now=on_time) == 1
    schedule.refresh_from_db()
    assert (schedule.late_at, schedule.late_by_seconds) == (None, None)  # on time
    assert evaluation.evaluate() == []

    skipped = schedule.next_run_at
    schedule_firing.fire_due(now=skipped + timedelta(minutes=5, seconds=30))
    [firing] = evaluation.evaluate()
    assert (firing.agent, firing.state, firing.value) == ("EchoAgent", "firing", 330)
    assert "skipped or fired 330 s late" in firing.body["summary"]
    assert firing.body["links"] == {"schedules": "/schedules/"}
    with connection.cursor() as cursor:  # the window moves past it
        cursor.execute("UPDATE schedules SET late_at = now() - interval '601 seconds'")
    assert states(evaluation.evaluate()) == [("EchoAgent", "resolved")]


def test_a_notification_is_posted_signed_to_the_webhook():
    with webhook_receiver() as receiver:
        hook = {"type": "webhook", "url": receiver.url, "secret": SECRET}
        rule(AlertKind.DEAD_LETTER, 1, [hook, {"type": "webhook", "url": receiver.url}])
        make_failed([{"n": 1}])
        [notification] = evaluation.evaluate()
        assert delivery.deliver(wait_for_sends=True) == 2
    signed, unsigned = sorted(receiver.requests, key=lambda r: SIGNATURE not in r.headers)
    assert json.loads(signed.body) == notification.body
    timestamp = signed.headers[channels.TIMESTAMP_HEADER.lower()]
    mac = hmac.new(SECRET.encode(), timestamp.encode() + b"." + signed.body, hashlib.sha256)
    assert signed.headers[SIGNATURE] == f"sha256={mac.hexdigest()}"
    assert SIGNATURE not in unsigned.headers
    assert {r.headers[channels.DELIVERY_HEADER.lower()] for r in receiver.requests} == {
        str(d.id) for d in AlertDelivery.objects.all()
    }
    sent = AlertDelivery.objects.all()
    assert [(d.status, d.attempts) for d in sent] == [("sent", 1), ("sent", 1)]
    assert all(d.tries.get().http_status == 200 for d in sent)


def test_a_receiver_answering_500_is_tried_again_with_each_attempt_recorded():
    with webhook_receiver(statuses=[500, 502]) as receiver:
        rule(AlertKind.DEAD_LETTER, 1, [{"type": "webhook", "url": receiver.url}])
        make_failed([{"n": 1}])
        evaluation.evaluate()
        for _ in range(3):
            assert delivery.deliver(wait_for_sends=True) == 1
            # Due again after its backoff: now, for the test.
            AlertDelivery.objects.update(available_at=db.database_clock() - timedelta(seconds=1))
        assert delivery.deliver(wait_for_sends=True) == 0  # sent: never again
    [sent] = AlertDelivery.objects.all()
    assert (sent.status, sent.attempts) == (DeliveryStatus.SENT, 3)
    assert [(t.attempt, t.ok, t.http_status) for t in sent.tries.all()] == [
        (1, False, 500),
        (2, False, 502),
        (3, True, 200),
    ]
    assert len(receiver.requests) == 3


def test_a_receiver_that_is_down_fails_the_delivery_once_its_attempts_are_spent():
    with webhook_receiver() as receiver:
        url = receiver.url  # the port is closed once the receiver stops
    rule(AlertKind.DEAD_LETTER, 1, [{"type": "webhook", "url": url}])
    make_failed([{"n": 1}])
    evaluation.evaluate()
    AlertDelivery.objects.update(max_attempts=2)
    for _ in range(2):
        delivery.deliver(wait_for_sends=True)
        AlertDelivery.objects.update(available_at=db.database_clock() - timedelta(seconds=1))
    [failed] = AlertDelivery.objects.all()
    assert (failed.status, failed.attempts) == (DeliveryStatus.FAILED, 2)
    assert all("Connection refused" in t.error for t in failed.tries.all())


def test_slack_gets_its_format_and_email_goes_through_djangos_backend(mailoutbox):
    with webhook_receiver() as receiver:
        slack = {"type": "slack", "url": receiver.url}
        email = {"type": "email", "to": ["oncall@example.com"]}
        rule(AlertKind.DEAD_LETTER, 1, [slack, email], agent="EchoAgent")
        make_failed([{"n": 1}])
        [notification] = evaluation.evaluate()
        assert delivery.deliver(wait_for_sends=True) == 2
    [posted] = receiver.requests
    message = json.loads(posted.body)
    assert notification.body["summary"] in message["text"]
    assert message["blocks"][0]["text"]["type"] == "mrkdwn"
    [mail] = mailoutbox
    assert mail.to == ["oncall@example.com"]
    assert mail.subject == "[AutoMechanica] firing: dead_letter rule (EchoAgent)"
    assert notification.body["summary"] in mail.body
    assert [d.status for d in AlertDelivery.objects.all()] == ["sent", "sent"]


def test_retention_prunes_old_notifications_whose_deliveries_ended(settings):
    settings.QUEUE_RETENTION_DAYS = 1
    with webhook_receiver([500]) as receiver:
        rule(AlertKind.DEAD_LETTER, 1, [{"type": "webhook", "url": receiver.url}])
        make_failed([{"n": 1}])
        [ended] = evaluation.evaluate()
        delivery.deliver(wait_for_sends=True)  # one failed attempt; it is due again later
    pending = ended.deliveries.get()
    assert (pending.status, pending.tries.count()) == ("pending", 1)
    later = db.database_clock() + timedelta(days=2)
    retention.prune(now=later)
    assert AlertNotification.objects.filter(id=ended.id).exists()  # still to deliver
    AlertDelivery.objects.filter(id=pending.id).update(status=DeliveryStatus.FAILED)
    assert retention.prune(now=later).alert_notifications == 1
    assert RetentionRun.objects.order_by("-id").first().alert_notifications == 1
    assert not AlertNotification.objects.exists() and not AlertDelivery.objects.exists()


def test_slack_text_is_escaped_so_a_name_cannot_ping_or_link():
    message = channels._slack(
        {"state": "firing", "summary": "workflow '<!channel> <https://x|go>' & co", "links": {}}
    )
    assert message["text"].endswith("workflow '&lt;!channel&gt; &lt;https://x|go&gt;' &amp; co")
    assert "<!channel>" not in json.dumps(message)


@pytest.mark.parametrize(
    ("channels_", "field"),
    [
        ("not a list", "channels"),
        ([{"type": "pager"}], "channels[0].type"),
        ([{"type": "webhook", "url": "ftp://example.com/x"}], "channels[0].url"),
        ([{"type": "webhook", "url": "http:///no-host"}], "channels[0].url"),
        ([{"type": "webhook", "url": "https://e.com", "secret": ""}], "channels[0].secret"),
        ([{"type": "webhook", "url": "https://e.com", "secret": "a\x00b"}], "channels[0].secret"),
        ([{"type": "webhook", "url": "https://e.com", "secret": "\ud800"}], "channels[0].secret"),
        ([{"type": "slack", "url": "https://e.com", "secret": "x"}], "channels[0].secret"),
        ([{"type": "email", "to": []}], "channels[0].to"),
        ([{"type": "email", "to": ["ops@example.com", "nope"]}], "channels[0].to[1]"),
        ([{"type": "webhook", "url": "https://e.com/" + "x" * 3000}], "channels[0].url"),
    ],
    ids=lambda value: value if isinstance(value, str) and value.startswith("chan") else None,
)
def test_bad_channels_are_refused_naming_the_field(channels_, field):
    with pytest.raises(channels.InvalidChannel) as refused:
        channels.check_channels(channels_)
    assert refused.value.field == field


def test_a_channel_is_shown_without_its_secret_or_path():
    hook = {"type": "webhook", "url": "https://user:pw@hooks.example.com:8443/T0/B1?k=v",
            "secret": SECRET}  # fmt: skip
    assert channels.shown(hook) == {
        "type": "webhook",
        "url": "https://hooks.example.com:8443/…",
        "signed": True,
    }


def test_alert_bench_times_evaluations_and_leaves_no_rule(capsys):
    call_command("alert_bench", "--runs", "3")
    said = capsys.readouterr().out
    assert said.startswith("3 evaluations of 7 rules over ") and " median " in said
    assert not AlertRule.objects.exists()
