"""Publish/subscribe: pattern matching, independent subscribers with their own
deliveries and results, time to live, unsubscribing, and one subscriber read by
several processes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models.functions import Now

from agents_app.messaging import InvalidMessage
from agents_app.models import Publication, PublicationDelivery, Subscription
from agents_app.pubsub import (
    ack,
    glob_to_like,
    publish,
    receive,
    subscribe,
    unsubscribe,
    with_backlog,
)
from tests.support.readers import outputs, start_waiting_readers

pytestmark = pytest.mark.django_db(transaction=True)


def events(deliveries) -> list[str]:
    return [d.event_name for d in deliveries]


def test_glob_patterns():
    assert glob_to_like("state.*") == "state.%"
    # "_" and "%" are literal; "?" is any one character.
    assert glob_to_like("task_?.done%") == "task\\__.done\\%"


def test_subscriptions_match_by_pattern_publisher_and_type():
    subscribe("Monitor", "states", "state.*")
    subscribe("Monitor", "pricing-done", "task.completed", publisher="PricingAgent")
    subscribe("Auditor", "everything", "*")
    subscribe("Alerts", "alerts", "*", publication_types=["alert"], publisher_type="agent")
    publish("FitmentAgent", "state.changed", {"to": "paused"}, publication_type="status_change")
    publish("PricingAgent", "task.completed", {"n": 1})
    publish("SEOAgent", "task.completed", {"n": 2})  # not PricingAgent: not for Monitor
    publish("SEOAgent", "stateless.thing")  # "state.*" needs the dot
    publish("FitmentAgent", "disk.full", publication_type="alert", publisher_type="agent")
    publish("FitmentAgent", "disk.full", publication_type="alert")  # no publisher type

    assert events(receive("Monitor", limit=20)) == ["state.changed", "task.completed"]
    assert len(receive("Auditor", limit=20)) == 6
    assert [(d.event_name, d.publication_type) for d in receive("Alerts")] == [
        ("disk.full", "alert")
    ]


def test_each_subscriber_reads_and_acknowledges_independently():
    subscribe("A", "all", "*")
    subscribe("B", "all", "*")
    publication_id, deliveries = publish("FitmentAgent", "part.fitted", {"sku": "X"})
    assert deliveries == 2
    (for_a,) = receive("A")
    assert ack(for_a, {"stored": True})
    assert receive("A") == []  # done for A ...
    (for_b,) = receive("B", visibility_timeout=0)  # ... B has its own, not yet acked
    (again,) = receive("B")
    assert again.id == for_b.id and again.delivery_count == 2 and not ack(for_b)
    assert ack(again, {"ignored": "not mine"})
    tracked = dict(
        PublicationDelivery.objects.filter(publication_id=publication_id).values_list(
            "subscription__subscriber_agent", "result"
        )
    )
    assert tracked == {"A": {"stored": True}, "B": {"ignored": "not mine"}}


def test_a_late_subscriber_gets_only_later_publications_and_unsubscribing_drops_the_rest():
    publish("FitmentAgent", "early")
    subscribe("Late", "all", "*")
    publish("FitmentAgent", "later")
    publish("FitmentAgent", "latest")
    assert events(receive("Late", limit=1)) == ["later"]  # in publication order
    assert unsubscribe("Late", "all") and not unsubscribe("Late", "all")
    assert receive("Late") == []
    publish("FitmentAgent", "after")
    assert receive("Late") == []


def test_expired_publications_leave_the_backlog():
    from task_queue.maintenance import retention

    subscribe("A", "all", "*")
    publication_id, deliveries = publish("FitmentAgent", "short.lived", ttl=60)
    assert deliveries == 1
    (first,) = receive("A", visibility_timeout=0)  # deliverable while it lives
    assert first.publication_id == publication_id
    Publication.objects.filter(id=publication_id).update(expires_at=Now() - timedelta(seconds=1))
    PublicationDelivery.objects.update(expires_at=Now() - timedelta(seconds=1))
    assert receive("A") == []
    retention.prune()
    assert PublicationDelivery.objects.get().status == "expired"
    assert with_backlog(Subscription.objects.all()).get().backlog == 0


def test_a_stopped_subscription_hears_nothing_even_from_a_racing_publish():
    subscription_id = subscribe("A", "all", "*")
    assert unsubscribe("A", "all")
    # What a publish that saw the subscription still active would have left behind.
    publication_id, _ = publish("FitmentAgent", "raced")
    PublicationDelivery.objects.create(
        subscription_id=subscription_id, publication_id=publication_id,
        expires_at=Publication.objects.get(id=publication_id).expires_at,
    )  # fmt: skip
    assert receive("A") == []
    assert subscribe("A", "all", "*") == subscription_id  # reactivated: starts from now
    assert PublicationDelivery.objects.get().status == "expired"
    assert receive("A") == []


def test_bad_publications_and_subscriptions_are_refused():
    with pytest.raises(InvalidMessage, match="event_name"):
        publish("A", "")
    with pytest.raises(InvalidMessage, match="ttl"):
        publish("A", "x", ttl=0)
    with pytest.raises(InvalidMessage, match="publication_types"):
        subscribe("A", "s", "*", publication_types="alert")


READER = """
import django, json, time
django.setup()
from agents_app.pubsub import ack, receive
seen = []
batch = receive("Indexer", limit=5, visibility_timeout=60, wait=60)
while batch:
    for delivery in batch:
        time.sleep(0.005)
        seen.append(delivery.publication_id)
        ack(delivery, {"by": "reader"})
    batch = receive("Indexer", limit=5, visibility_timeout=60)
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_instances_of_one_subscriber_in_several_processes_take_each_delivery_once():
    subscribe("Indexer", "parts", "part.*")
    readers = start_waiting_readers(READER, 2, "automechanica_publications")
    with transaction.atomic():
        published = {publish("Supplier", "part.added", {"n": n})[0] for n in range(150)}
    seen = outputs(readers)
    assert all(seen)  # both took part
    everything = [p for batch in seen for p in batch]
    assert len(everything) == len(set(everything)) == 150 and set(everything) == published


def test_the_http_api_publishes_subscribes_receives_and_acknowledges():
    from django.test import Client

    from tests.support.api import token

    api = Client(headers={"Authorization": f"Bearer {token('write')}"})

    def post(path: str, body: dict):
        return api.post(path, body, content_type="application/json")

    monitor = {"subscriber_agent": "Monitor", "name": "states"}
    made = post("/api/v1/publications/subscriptions", monitor | {"event_pattern": "state.*"})
    assert made.status_code == 200 and made.json()["backlog"] == 0
    published = post("/api/v1/publications", {"publisher_agent": "FitmentAgent",
                                               "event_name": "state.changed"})  # fmt: skip
    assert published.status_code == 201 and published.json()["deliveries"] == 1
    listed = api.get("/api/v1/publications/subscriptions", {"subscriber_agent": "Monitor"})
    assert listed.json()[0]["backlog"] == 1
    (delivery,) = post("/api/v1/publications/receive", {"subscriber_agent": "Monitor"}).json()
    ack_url = f"/api/v1/publications/deliveries/{delivery['id']}/ack"
    stale = post(ack_url, {"receipt": "00000000-0000-0000-0000-000000000000"})
    assert stale.status_code == 409
    done = post(ack_url, {"receipt": delivery["receipt"], "result": {"seen": True}})
    assert done.json() == {"acknowledged": True}
    assert PublicationDelivery.objects.get(id=delivery["id"]).result == {"seen": True}
    gone = post("/api/v1/publications/subscriptions/unsubscribe", monitor)
    assert gone.json()["active"] is False
    bad = post("/api/v1/publications", {"publisher_agent": "A", "event_name": "x",
                                        "payload": {"t": "a\x00b"}})  # fmt: skip
    assert bad.status_code == 422 and bad.json()["field_errors"][0]["field"] == "payload"
    unknown = monitor | {"name": "never made"}
    assert post("/api/v1/publications/subscriptions/unsubscribe", unknown).status_code == 404
    blank = post("/api/v1/publications/subscriptions", monitor | {"subscriber_agent": "  "})
    assert blank.status_code == 422
    assert blank.json()["field_errors"][0]["field"] == "subscriber_agent"
    assert post("/api/v1/publications/deliveries/999999/ack",
                {"receipt": delivery["receipt"]}).status_code == 404  # fmt: skip


def test_the_messages_page_shows_mailbox_backlog_and_subscription_lag():
    from agents_app.messaging import send
    from tests.support.users import staff

    for n in range(3):
        send("PricingAgent", "FitmentAgent", "task_request", {"n": n})
    subscribe("Monitor", "states", "state.*")
    publish("FitmentAgent", "state.changed")
    publish("FitmentAgent", "state.changed")
    page = staff().get("/messages/").content.decode()
    assert 'data-mailbox="FitmentAgent"' in page
    assert "<td data-waiting>3</td>" in page
    assert 'data-subscription="Monitor/states"' in page and "<td data-backlog>2</td>" in page
