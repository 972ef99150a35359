"""Direct messages between agents: order, at-least-once delivery with acknowledgement,
expiry, request/response, readers in several processes, and the HTTP API."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import Client

from agents_app import messaging
from agents_app.messaging import InvalidMessage, ack, receive, reply, send
from agents_app.models import AgentMessage
from agents_app.sql import messages as messages_sql
from task_queue.maintenance import retention
from task_queue.models import RetentionRun
from tests.support.api import token
from tests.support.readers import outputs, start_waiting_readers

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_mailbox_delivers_by_priority_then_arrival():
    low = send("PricingAgent", "FitmentAgent", "notification", {"n": 1}, priority=2)
    first = send("PricingAgent", "FitmentAgent", "task_request", {"n": 2}, priority=9)
    second = send("SEOAgent", "FitmentAgent", "task_request", {"n": 3}, priority=9)
    send("PricingAgent", "SEOAgent", "notification", {"n": 4})  # someone else's
    got = receive("FitmentAgent", limit=10)
    assert [m.id for m in got] == [first, second, low]
    assert got[0].payload == {"n": 2} and got[0].delivery_count == 1
    assert receive("FitmentAgent") == []  # leased: not visible to another reader
    assert all(ack(m) for m in got)
    assert set(AgentMessage.objects.filter(to_agent="FitmentAgent").values_list(
        "status", flat=True)) == {"acknowledged"}  # fmt: skip


def test_an_unacknowledged_message_comes_back_and_a_stale_ack_is_refused():
    message_id = send("PricingAgent", "FitmentAgent", "command", {"do": "x"})
    (first,) = receive("FitmentAgent", visibility_timeout=0)  # a reader that dies
    (again,) = receive("FitmentAgent", visibility_timeout=30)
    assert again.id == first.id == message_id and again.delivery_count == 2
    assert not ack(first)  # its lease is over: the message is the second reader's
    assert ack(again) and not ack(again)


def test_expired_messages_are_not_delivered_and_are_marked_then_pruned():
    message_id = send("PricingAgent", "FitmentAgent", "notification", expires_in=3600)
    AgentMessage.objects.filter(id=message_id).update(expires_at=Now() - timedelta(days=8))
    assert receive("FitmentAgent") == []
    retention.prune()
    assert not AgentMessage.objects.filter(id=message_id).exists()  # expired, then pruned
    assert RetentionRun.objects.get().messages == 1
    kept = send("PricingAgent", "FitmentAgent", "notification", expires_in=1)
    AgentMessage.objects.filter(id=kept).update(expires_at=Now() - timedelta(seconds=1))
    retention.prune()
    assert AgentMessage.objects.get(id=kept).status == "expired"


def test_request_and_response_are_correlated():
    request_id = send("PricingAgent", "FitmentAgent", "task_request", {"sku": "RTR-1"},
                      reply_to="PricingAgent")  # fmt: skip
    (request,) = receive("FitmentAgent")
    reply(request, "FitmentAgent", {"fits": ["corolla-2015"]})
    ack(request)
    (response,) = receive("PricingAgent")
    assert response.message_type == "response" and response.from_agent == "FitmentAgent"
    assert response.correlation_id == str(request_id)
    assert response.payload == {"fits": ["corolla-2015"]}


def test_a_waiting_reader_wakes_when_a_message_arrives(monkeypatch):
    monkeypatch.setattr(messaging, "POLL_SECONDS", 60.0)  # no polling to fall back on
    looked = threading.Event()
    original = messaging._receive

    def look(*args):
        found = original(*args)
        looked.set()
        return found

    monkeypatch.setattr(messaging, "_receive", look)
    received = []

    def read() -> None:
        try:
            received.extend(receive("SEOAgent", wait=30))
        finally:
            connection.close()

    reader = threading.Thread(target=read)
    reader.start()
    assert looked.wait(10)  # it found nothing and listens (LISTEN came first)
    sent = send("PricingAgent", "SEOAgent", "data_share", {"price": 1})
    reader.join(10)  # well before the 60 s poll: only the notification can wake it
    assert not reader.is_alive()
    assert [m.id for m in received] == [sent]


def test_waiting_is_refused_inside_a_transaction_and_bad_waits_are_refused():
    from django.db import transaction

    with transaction.atomic(), pytest.raises(InvalidMessage, match="wait"):
        receive("SEOAgent", wait=1)
    for wait in (-1, float("nan"), 10_000):
        with pytest.raises(InvalidMessage, match="wait"):
            receive("SEOAgent", wait=wait)


def test_bad_messages_are_refused_naming_the_field():
    cases = [
        ({"message_type": "gossip"}, "message_type"),
        ({"priority": 11}, "priority"),
        ({"payload": {"text": "a\x00b"}}, "payload"),
        ({"to_agent": " "}, "to_agent"),
        ({"expires_in": 0}, "expires_in"),
    ]
    for change, field in cases:
        args = {"from_agent": "A", "to_agent": "B", "message_type": "notification"} | change
        with pytest.raises(InvalidMessage) as refused:
            send(**args)
        assert refused.value.field == field
    assert not AgentMessage.objects.exists()


READER = """
import django, json, time
django.setup()
from agents_app.messaging import ack, receive
seen = []
batch = receive("FitmentAgent", limit=7, visibility_timeout=60, wait=60)  # all start here
while batch:
    for message in batch:
        time.sleep(0.005)  # some work, so the readers overlap
        seen.append(str(message.id))
        ack(message)
    batch = receive("FitmentAgent", limit=7, visibility_timeout=60)
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_readers_in_several_processes_take_each_message_once():
    from django.db import transaction

    readers = start_waiting_readers(READER, 3, messages_sql.MESSAGES_CHANNEL)
    with transaction.atomic():  # one commit: every reader wakes at once
        sent = {str(send("PricingAgent", "FitmentAgent", "task_request", {"n": n}))
                for n in range(300)}  # fmt: skip
    seen = outputs(readers)
    assert all(batch for batch in seen), [len(batch) for batch in seen]  # all took part
    everything = [m for batch in seen for m in batch]
    assert len(everything) == len(set(everything)) == 300 and set(everything) == sent
    assert set(AgentMessage.objects.values_list("status", "delivery_count")) == {
        ("acknowledged", 1)
    }


def test_the_http_api_sends_receives_and_acknowledges():
    writer = Client(headers={"Authorization": f"Bearer {token('write')}"})
    sent = writer.post("/api/v1/messages", {
        "from_agent": "PricingAgent", "to_agent": "FitmentAgent",
        "message_type": "task_request", "payload": {"sku": "RTR-1"}, "priority": 7,
    }, content_type="application/json")  # fmt: skip
    assert sent.status_code == 201, sent.content
    assert sent.json()["status"] == "pending"
    got = writer.post("/api/v1/messages/receive", {"agent": "FitmentAgent"},
                      content_type="application/json").json()  # fmt: skip
    assert [m["id"] for m in got] == [sent.json()["id"]]
    ack_url = f"/api/v1/messages/{got[0]['id']}/ack"
    wrong = writer.post(ack_url, {"receipt": "00000000-0000-0000-0000-000000000000"},
                        content_type="application/json")  # fmt: skip
    assert wrong.status_code == 409 and wrong.json()["code"] == "stale_receipt"
    done = writer.post(ack_url, {"receipt": got[0]["receipt"]}, content_type="application/json")
    assert done.json() == {"acknowledged": True}
    listed = writer.get("/api/v1/messages", {"agent": "FitmentAgent"}).json()
    assert [m["status"] for m in listed] == ["acknowledged"]
    bad = writer.post("/api/v1/messages", {
        "from_agent": "A", "to_agent": "B", "message_type": "notification",
        "payload": {"t": "a\x00b"},
    }, content_type="application/json")  # fmt: skip
    assert bad.status_code == 422 and bad.json()["field_errors"][0]["field"] == "payload"
    missing = f"/api/v1/messages/{'0' * 8}-0000-0000-0000-{'0' * 12}/ack"
    assert writer.post(missing, {"receipt": got[0]["receipt"]},
                       content_type="application/json").status_code == 404  # fmt: skip
    assert messaging.receive("FitmentAgent") == []
