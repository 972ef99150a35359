"""Poison messages: a message or publication delivery delivered MESSAGE_MAX_DELIVERIES
times without an acknowledgement fails, is delivered no more, is listed (API and
/messages/) and can be revived, audit-logged; receivers crash in their own processes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models.functions import Now

from agents_app import messaging, pubsub
from agents_app.messaging import send
from agents_app.models import AgentMessage, PublicationDelivery
from agents_app.sql import messages as messages_sql
from task_queue.ids import short_id
from task_queue.models import OperatorAction, OutboxEvent
from tests.support.api import Api, token
from tests.support.processes import REPO, manage_env
from tests.support.readers import outputs, start_waiting_readers
from tests.support.users import staff
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

MAX = 3

# A receiver that takes what its mailbox has and crashes before acknowledging it: its
# lease runs out, and the message is delivered again.
CRASHING_RECEIVER = """
import django, json, os, sys
django.setup()
from agents_app.messaging import receive
got = receive("FitmentAgent", limit=5, visibility_timeout=float(sys.argv[1]))
print(json.dumps([[str(m.id), m.delivery_count] for m in got]), flush=True)
os._exit(int(sys.argv[2]))
"""

ACKING_RECEIVER = """
import django, json
django.setup()
from agents_app.messaging import ack, receive
got = receive("FitmentAgent", limit=5, visibility_timeout=30)
print(json.dumps([[str(m.id), m.delivery_count, ack(m)] for m in got]))
"""


@pytest.fixture
def max_deliveries(settings, monkeypatch) -> int:
    """MESSAGE_MAX_DELIVERIES of MAX here and in the processes the test starts."""
    settings.MESSAGE_MAX_DELIVERIES = MAX
    monkeypatch.setenv("MESSAGE_MAX_DELIVERIES", str(MAX))
    return MAX


def run_receiver(script: str, *args: str) -> tuple[int, list]:
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env=manage_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def kinds(subject: str) -> list[str]:
    rows = OutboxEvent.objects.filter(subject_id=subject).order_by("seq")
    return [kind for kind in rows.values_list("kind", flat=True) if kind.startswith("evt.message")]


@pytest.mark.slow
def test_a_poison_message_fails_after_its_deliveries_and_a_revive_delivers_it_again(
    max_deliveries,
):
    poison = send("PricingAgent", "FitmentAgent", "command", {"do": "crash"})
    for attempt in range(1, max_deliveries + 1):
        code, got = run_receiver(CRASHING_RECEIVER, "0.2", "1")
        assert code == 1 and got == [[str(poison), attempt]]
        # The crashed receiver's lease runs out.
        wait_for(
            lambda: AgentMessage.objects.filter(id=poison, visible_at__lte=Now()).exists(),
            timeout=10,
            what="the lease to end",
        )
    assert run_receiver(CRASHING_RECEIVER, "0.2", "1") == (1, [])  # not delivered again
    messaging.recover_leases()  # the maintenance loop's job
    message = AgentMessage.objects.get(id=poison)
    assert (message.status, message.delivery_count, message.receipt) == ("failed", MAX, None)
    assert kinds(str(poison)) == ["evt.message.sent.v1", "evt.message.failed.v1"]
    messaging.recover_leases()
    assert AgentMessage.objects.get(id=poison).status == "failed"  # stays failed
    assert run_receiver(CRASHING_RECEIVER, "0.2", "1") == (1, [])

    api = Api(token("write", name="fitment-ops"))
    listed = api.get("/api/v1/messages?status=failed").json()
    assert [(m["id"], m["delivery_count"]) for m in listed] == [(str(poison), MAX)]
    revived = api.post(f"/api/v1/messages/{poison}/revive")
    assert revived.status_code == 200, revived.content
    assert (revived.json()["status"], revived.json()["delivery_count"]) == ("pending", 0)
    (action,) = OperatorAction.objects.all()
    assert (action.action, action.actor, action.source, action.agent_name) == (
        "revive_messages", "token:fitment-ops", "api", "FitmentAgent"
    )  # fmt: skip
    assert action.changes["messages"]["ids"] == [str(poison)]
    again = api.post(f"/api/v1/messages/{poison}/revive")
    assert again.status_code == 409 and again.json()["details"] == {"status": "pending"}
    assert OperatorAction.objects.count() == 1

    assert run_receiver(ACKING_RECEIVER) == (0, [[str(poison), 1, True]])  # a fresh budget
    assert AgentMessage.objects.get(id=poison).status == "acknowledged"
    assert kinds(str(poison))[-2:] == ["evt.message.revived.v1", "evt.message.acknowledged.v1"]


# Receivers that never acknowledge: each takes what is visible, lets its lease run
# out at once (visibility 0) and takes again, until nothing is deliverable.
NEVER_ACKING = """
import django, json
django.setup()
from agents_app.messaging import receive
seen = []
batch = receive("FitmentAgent", limit=5, visibility_timeout=0, wait=60)  # all start here
while batch:
    seen += [[str(m.id), m.delivery_count] for m in batch]
    batch = receive("FitmentAgent", limit=5, visibility_timeout=0)
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_concurrent_receivers_deliver_each_poison_message_exactly_max_times(max_deliveries):
    readers = start_waiting_readers(NEVER_ACKING, 3, messages_sql.MESSAGES_CHANNEL)
    with transaction.atomic():  # one commit: every receiver wakes at once
        sent = {str(send("PricingAgent", "FitmentAgent", "command", {"n": n})) for n in range(40)}
    seen = outputs(readers)
    assert sum(bool(batch) for batch in seen) >= 2  # they raced
    counts = defaultdict(list)
    for message_id, count in (pair for batch in seen for pair in batch):
        counts[message_id].append(count)
    assert set(counts) == sent
    assert {tuple(sorted(c)) for c in counts.values()} == {tuple(range(1, max_deliveries + 1))}
    messaging.recover_leases()
    assert Counter(AgentMessage.objects.values_list("status", "delivery_count")) == {
        ("failed", max_deliveries): 40
    }


def test_a_failed_publication_delivery_is_listed_revived_and_delivered_again(max_deliveries):
    pubsub.subscribe("Monitor", "states", "state.*")
    pubsub.subscribe("Auditor", "all", "*")
    publication_id, _ = pubsub.publish("FitmentAgent", "state.changed", {"to": "paused"})
    for attempt in range(1, max_deliveries + 1):
        (delivery,) = pubsub.receive("Monitor", visibility_timeout=0)  # never acknowledged
        assert delivery.delivery_count == attempt
    assert pubsub.receive("Monitor") == []
    (for_auditor,) = pubsub.receive("Auditor", visibility_timeout=0)  # one delivery left
    pubsub.recover_leases()
    failed = PublicationDelivery.objects.get(subscription__subscriber_agent="Monitor")
    assert (failed.status, failed.delivery_count) == ("failed", MAX)
    assert PublicationDelivery.objects.get(id=for_auditor.id).status == "pending"

    api = Api(token("write", name="monitor-ops"))
    listed = api.get("/api/v1/publications/deliveries?status=failed").json()
    assert [(d["id"], d["subscriber_agent"], d["subscription"], d["event_name"])
            for d in listed] == [(failed.id, "Monitor", "states", "state.changed")]  # fmt: skip
    assert api.post(f"/api/v1/publications/deliveries/{for_auditor.id}/revive").status_code == 409
    assert api.post("/api/v1/publications/deliveries/999999/revive").status_code == 404
    revived = api.post(f"/api/v1/publications/deliveries/{failed.id}/revive")
    assert revived.status_code == 200, revived.content
    assert (revived.json()["status"], revived.json()["delivery_count"]) == ("pending", 0)
    (action,) = OperatorAction.objects.all()
    assert (action.action, action.source, action.agent_name) == (
        "revive_deliveries", "api", "Monitor"
    )  # fmt: skip
    assert action.changes["deliveries"]["ids"] == [str(failed.id)]
    (delivery,) = pubsub.receive("Monitor")
    assert (delivery.publication_id, delivery.delivery_count) == (publication_id, 1)
    assert pubsub.ack(delivery, {"handled": True})


def test_a_failed_message_whose_expiry_passed_is_revived_with_a_fresh_lifetime(max_deliveries):
    poison = send("PricingAgent", "FitmentAgent", "command", expires_in=60)
    AgentMessage.objects.filter(id=poison).update(status="failed", delivery_count=MAX)
    AgentMessage.objects.filter(id=poison).update(
        created_at=Now() - timedelta(hours=3), expires_at=Now() - timedelta(hours=2)
    )
    assert messaging.revive([poison], actor="user:ops") == [poison]
    (again,) = messaging.receive("FitmentAgent")  # not expired: it lives an hour again
    assert again.id == poison and again.expires_at > again.created_at + timedelta(hours=3)


def test_the_messages_page_lists_failed_ones_and_revives_with_the_permission(max_deliveries):
    poison = send("PricingAgent", "FitmentAgent", "command", {"do": "crash"})
    pubsub.subscribe("Monitor", "states", "state.*")
    pubsub.publish("FitmentAgent", "state.changed")
    AgentMessage.objects.filter(id=poison).update(status="failed", delivery_count=MAX)
    PublicationDelivery.objects.update(status="failed", delivery_count=MAX)
    delivery_id = PublicationDelivery.objects.get().id

    looker = staff()
    page = looker.get("/messages/").content.decode()
    assert "<title>Messages · AutoMechanica</title>" in page
    assert page.count(f'data-failed-message="{poison}"') == 1
    assert page.count(f'data-failed-delivery="{delivery_id}"') == 1
    assert "Revive</button>" not in page  # no permission, no button
    assert looker.post(f"/messages/{poison}/revive/").status_code == 403
    assert looker.post(f"/messages/deliveries/{delivery_id}/revive/").status_code == 403
    assert AgentMessage.objects.get(id=poison).status == "failed"

    operator = staff("agents_app.revive_agentmessage", username="ops")
    assert "Revive</button>" in operator.get("/messages/").content.decode()
    assert operator.get(f"/messages/{poison}/revive/").status_code == 405
    answer = operator.post(f"/messages/{poison}/revive/", follow=True)
    assert "revived: it will be delivered again" in answer.content.decode()
    assert operator.post(f"/messages/deliveries/{delivery_id}/revive/").status_code == 302
    assert AgentMessage.objects.get(id=poison).status == "pending"
    assert PublicationDelivery.objects.get().status == "pending"
    assert list(OperatorAction.objects.order_by("id").values_list("action", "actor", "source")) == [
        ("revive_messages", "user:ops", "dashboard"),
        ("revive_deliveries", "user:ops", "dashboard"),
    ]
    again = operator.post(f"/messages/{poison}/revive/", follow=True).content.decode()
    assert "is not failed (any more): not revived" in again
    assert OperatorAction.objects.count() == 2
    audit = operator.get("/audit/").content.decode()
    assert "Revive messages FitmentAgent" in audit and f"<code>{short_id(poison)}</code>" in audit


def test_a_max_deliveries_below_one_is_refused_at_startup(settings):
    from automechanica.checks import message_max_deliveries

    assert message_max_deliveries() == []
    for bad in (0, -1, 2.5, True):
        settings.MESSAGE_MAX_DELIVERIES = bad
        (error,) = message_max_deliveries()
        assert error.id == "queue.E002" and "MESSAGE_MAX_DELIVERIES" in error.msg
