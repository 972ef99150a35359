"""Publish/subscribe between agents: publish with fan-out, subscriptions, leased
reads of deliveries, ack, expiry, retention.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from agents_app.sql.messages import expire_statement, recover_statement
from task_queue import leases
from task_queue.leases import Lease
from task_queue.sql import locks
from task_queue.sql.db import execute, fetch

PUBLICATIONS_CHANNEL = "automechanica_publications"  # payload: a subscriber agent


# Deliveries are leased like messages (agents_app.sql.messages): the receipt is the
# token, visible_at the lease's end.
DELIVERY_LEASE = Lease(
    table="agent_publication_deliveries",
    token="receipt",
    ends="visible_at",
    held=("delivered",),
    recovery_lock=locks.DELIVERY_RECOVERY,
    id_type="bigint",
    clock="clock_timestamp()",
    ends_cleared=False,
)
_NOW = DELIVERY_LEASE.now

# One statement: the publication, a delivery for every active subscription it
# matches (fan-out on write, so each subscriber reads its own deliveries, never
# missing one that committed late), and a wake-up for each subscriber.
PUBLISH = f"""
WITH published AS (
    INSERT INTO agent_publications (publisher_agent, publisher_type, publication_type,
                                    event_name, payload, payload_ref, metadata,
                                    metadata_ref, expires_at)
    VALUES (%(publisher_agent)s, %(publisher_type)s, %(publication_type)s, %(event_name)s,
            %(payload)s::jsonb, %(payload_ref)s, %(metadata)s::jsonb, %(metadata_ref)s,
            now() + make_interval(secs => %(ttl)s))
    RETURNING id, publisher_agent, publisher_type, publication_type, event_name, expires_at
),
fanned AS (
    INSERT INTO agent_publication_deliveries (subscription_id, publication_id, expires_at)
    SELECT s.id, p.id, p.expires_at
    FROM published p JOIN agent_subscriptions s
      ON s.active
     AND (s.publisher_agent IS NULL OR s.publisher_agent = p.publisher_agent)
     AND (s.publisher_type IS NULL OR s.publisher_type = p.publisher_type)
     AND p.event_name LIKE s.event_like ESCAPE '\\'
     AND (cardinality(s.publication_types) = 0
          OR p.publication_type = ANY(s.publication_types))
    RETURNING subscription_id
),
woken AS (
    SELECT DISTINCT s.subscriber_agent
    FROM fanned f JOIN agent_subscriptions s ON s.id = f.subscription_id
)
SELECT (SELECT id FROM published), (SELECT count(*) FROM fanned),
       (SELECT count(pg_notify('{PUBLICATIONS_CHANNEL}', subscriber_agent)) FROM woken)
"""


# Create or change a subscription. Reactivating a stopped one first drops deliveries
# that a publish racing the unsubscribe (or a recovery failing one) left behind: it
# starts from now.
SUBSCRIBE = f"""
WITH stopped AS (
    SELECT id FROM agent_subscriptions
    WHERE subscriber_agent = %(subscriber)s AND name = %(name)s AND NOT active
),
leftovers AS (
    UPDATE agent_publication_deliveries d SET status = 'expired', {DELIVERY_LEASE.clear()}
    FROM stopped
    WHERE d.subscription_id = stopped.id AND d.status IN ('pending', 'delivered', 'failed')
)
INSERT INTO agent_subscriptions (subscriber_agent, name, publisher_agent, publisher_type,
                                 event_pattern, event_like, publication_types, active)
VALUES (%(subscriber)s, %(name)s, %(publisher_agent)s, %(publisher_type)s,
        %(event_pattern)s, %(event_like)s, %(publication_types)s::text[], true)
ON CONFLICT (subscriber_agent, name) DO UPDATE
SET publisher_agent = EXCLUDED.publisher_agent, publisher_type = EXCLUDED.publisher_type,
    event_pattern = EXCLUDED.event_pattern, event_like = EXCLUDED.event_like,
    publication_types = EXCLUDED.publication_types, active = true
RETURNING id
"""


# Deactivate, and let go of what was waiting or failed: an unsubscribed agent reads
# nothing more, and has nothing to revive.
UNSUBSCRIBE = f"""
WITH gone AS (
    UPDATE agent_subscriptions SET active = false
    WHERE subscriber_agent = %(subscriber)s AND name = %(name)s AND active
    RETURNING id
),
dropped AS (
    UPDATE agent_publication_deliveries d SET status = 'expired', {DELIVERY_LEASE.clear()}
    FROM gone WHERE d.subscription_id = gone.id AND d.status IN ('pending', 'delivered', 'failed')
)
SELECT count(*) FROM gone
"""


# A subscriber's deliveries in publication-id order (ids are taken at insert, so one
# committing late comes after newer ones), leased like messages (SKIP LOCKED: two
# instances of one subscriber never hold the same delivery at once). As with messages,
# a delivery made %(max_deliveries)s times is not made again: recovery fails it.
RECEIVE_PUBLICATIONS = f"""
WITH visible AS (
    SELECT d.id
    FROM agent_publication_deliveries d
    JOIN agent_subscriptions s ON s.id = d.subscription_id
    WHERE s.subscriber_agent = %(subscriber)s AND s.active
      AND (%(subscription)s::text IS NULL OR s.name = %(subscription)s::text)
      AND d.status IN ('pending', 'delivered') AND d.visible_at <= {_NOW}
      AND d.expires_at > {_NOW} AND d.delivery_count < %(max_deliveries)s
    ORDER BY d.publication_id
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE agent_publication_deliveries d
SET status = 'delivered', delivered_at = {_NOW}, delivery_count = d.delivery_count + 1,
    {DELIVERY_LEASE.grant("%(visibility_seconds)s")}
FROM visible, agent_publications p, agent_subscriptions s
WHERE d.id = visible.id AND p.id = d.publication_id AND s.id = d.subscription_id
RETURNING d.id, d.receipt, d.delivery_count, s.name, p.id, p.publisher_agent,
          p.publisher_type, p.publication_type, p.event_name, p.payload, p.metadata,
          p.created_at, p.expires_at, p.payload_ref, p.metadata_ref
"""

ACK_PUBLICATION = f"""
UPDATE agent_publication_deliveries d
SET status = 'acknowledged', acknowledged_at = {_NOW}, {DELIVERY_LEASE.clear()},
    result = %(result)s::jsonb, result_ref = %(result_ref)s
WHERE {DELIVERY_LEASE.fenced("d")} AND d.status = 'delivered'
RETURNING d.id
"""

RECOVER_DELIVERIES = recover_statement(DELIVERY_LEASE)

# Retention: deliveries whose publication's time to live ran out leave the backlog,
# and publications go with their deliveries QUEUE_RETENTION_DAYS later.
EXPIRE_DELIVERIES = expire_statement(DELIVERY_LEASE)


# An operator's revive, as for messages (agents_app.sql.messages.REVIVE_MESSAGES): a
# fresh lifetime is as long as the publication's time to live.
REVIVE_DELIVERIES = f"""
WITH target AS (
    SELECT d.id, p.expires_at - p.created_at AS ttl
    FROM agent_publication_deliveries d JOIN agent_publications p ON p.id = d.publication_id
    WHERE d.id = ANY(%(ids)s::bigint[]) AND d.status = 'failed'
    ORDER BY d.id
    FOR UPDATE OF d
),
revived AS (
    UPDATE agent_publication_deliveries d
    SET status = 'pending', delivery_count = 0, visible_at = {_NOW},
        expires_at = greatest(d.expires_at, {_NOW} + target.ttl), {DELIVERY_LEASE.clear()}
    FROM target, agent_subscriptions s
    WHERE d.id = target.id AND s.id = d.subscription_id
    RETURNING d.id, s.subscriber_agent
)
SELECT id, subscriber_agent, pg_notify('{PUBLICATIONS_CHANNEL}', subscriber_agent) IS NULL
FROM revived
"""


PRUNE_PUBLICATIONS = """
WITH doomed AS (
    SELECT id FROM agent_publications WHERE expires_at < %(cutoff)s
    ORDER BY expires_at LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
deliveries AS (
    DELETE FROM agent_publication_deliveries d USING doomed WHERE d.publication_id = doomed.id
)
DELETE FROM agent_publications p USING doomed WHERE p.id = doomed.id
"""


def publish(**params: Any) -> tuple[int, int]:
    """(publication id, deliveries made); ``params`` as PUBLISH names them."""
    publication_id, deliveries, _ = fetch(PUBLISH, params)[0]
    return publication_id, deliveries


def subscribe(**params: Any) -> int:
    return fetch(SUBSCRIBE, params)[0][0]


def unsubscribe(*, subscriber: str, name: str) -> bool:
    return bool(fetch(UNSUBSCRIBE, {"subscriber": subscriber, "name": name})[0][0])


def receive_publications(
    *,
    subscriber: str,
    subscription: str | None,
    limit: int,
    visibility_seconds: float,
    max_deliveries: int,
    now: datetime | None = None,
) -> list[tuple]:
    params = {
        "subscriber": subscriber,
        "subscription": subscription,
        "limit": limit,
        "visibility_seconds": visibility_seconds,
        "max_deliveries": max_deliveries,
        "now": now,
    }
    return fetch(RECEIVE_PUBLICATIONS, params)


def ack_publication(
    delivery_id: int,
    receipt: UUID,
    result: str | None,
    result_ref: str | None,
    *,
    now: datetime | None = None,
) -> bool:
    params = {
        "id": delivery_id,
        "token": receipt,
        "result": result,
        "result_ref": result_ref,
        "now": now,
    }
    return bool(fetch(ACK_PUBLICATION, params))


def recover_deliveries(*, max_deliveries: int, now: datetime | None = None) -> int | None:
    """Deliveries whose reader's lease ended, given back (or failed); how many, or
    None when another process is recovering them right now."""
    params = {"max_deliveries": max_deliveries}
    return leases.recover_expired(DELIVERY_LEASE, RECOVER_DELIVERIES, now=now, params=params)


def revive_deliveries(*, ids: list[int], now: datetime | None = None) -> list[tuple[int, str]]:
    """Failed deliveries among ``ids`` made pending again; (id, subscriber) each."""
    return [(row[0], row[1]) for row in fetch(REVIVE_DELIVERIES, {"ids": ids, "now": now})]


def expire_deliveries(*, batch: int, now: datetime | None = None) -> int:
    return execute(EXPIRE_DELIVERIES, {"batch": batch, "now": now})


def prune_publications(*, cutoff: datetime, batch: int) -> int:
    return execute(PRUNE_PUBLICATIONS, {"cutoff": cutoff, "batch": batch})
