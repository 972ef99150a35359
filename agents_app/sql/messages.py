"""Direct messages between agents: send, leased mailbox reads, ack, failure and revive,
expiry, retention."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from task_queue import leases
from task_queue.leases import Lease
from task_queue.sql import locks
from task_queue.sql.db import execute, fetch

MESSAGES_CHANNEL = "automechanica_messages"  # payload: the recipient agent's name


# One statement: the message, and the notification that wakes its recipient's readers
# (sent at commit, so a rolled-back send wakes nobody).
SEND_MESSAGE = f"""
WITH sent AS (
    INSERT INTO agent_messages (from_agent, to_agent, message_type, payload, payload_ref,
                                priority, correlation_id, reply_to, metadata, metadata_ref,
                                expires_at)
    VALUES (%(from_agent)s, %(to_agent)s, %(message_type)s, %(payload)s::jsonb,
            %(payload_ref)s, %(priority)s, %(correlation_id)s, %(reply_to)s, %(metadata)s::jsonb,
            %(metadata_ref)s, now() + make_interval(secs => %(expires_in)s))
    RETURNING id, to_agent
)
SELECT sent.id, pg_notify('{MESSAGES_CHANNEL}', sent.to_agent) IS NULL FROM sent
"""


# A message is leased to one reader for its visibility timeout: the lease's end is
# visible_at, when the message may be received again, and its token is the receipt
# the reader acknowledges with. clock_timestamp(), not now(): a reader inside a long
# transaction still sees what became visible after it began.
MESSAGE_LEASE = Lease(
    table="agent_messages",
    token="receipt",
    ends="visible_at",
    held=("delivered",),
    recovery_lock=locks.MESSAGE_RECOVERY,
    clock="clock_timestamp()",
    ends_cleared=False,
)
_NOW = MESSAGE_LEASE.now

# A mailbox read: the visible messages of one agent, highest priority first, then
# oldest, each leased to this reader under a new receipt. SKIP LOCKED: two readers of
# one agent never take the same message at once. A message already delivered
# %(max_deliveries)s times is not delivered again: its last lease ran out
# unacknowledged, and recovery marks it failed.
RECEIVE_MESSAGES = f"""
WITH visible AS (
    SELECT id FROM agent_messages
    WHERE to_agent = %(agent)s AND status IN ('pending', 'delivered')
      AND visible_at <= {_NOW} AND expires_at > {_NOW}
      AND delivery_count < %(max_deliveries)s
    ORDER BY priority DESC, created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE agent_messages m
SET status = 'delivered', delivered_at = {_NOW}, delivery_count = m.delivery_count + 1,
    {MESSAGE_LEASE.grant("%(visibility_seconds)s")}
FROM visible
WHERE m.id = visible.id
RETURNING m.id, m.from_agent, m.to_agent, m.message_type, m.payload, m.payload_ref,
          m.priority, m.correlation_id, m.reply_to, m.metadata, m.metadata_ref, m.created_at,
          m.expires_at, m.delivery_count, m.receipt
"""

# Fenced by the receipt: a reader whose lease ran out (the message went to another,
# or was given back) cannot acknowledge it.
ACK_MESSAGE = f"""
UPDATE agent_messages m
SET status = 'acknowledged', acknowledged_at = {_NOW}, {MESSAGE_LEASE.clear()}
WHERE {MESSAGE_LEASE.fenced("m")} AND m.status = 'delivered'
RETURNING m.id
"""


def recover_statement(lease: Lease) -> str:
    """Give back up to %(limit)s rows of ``lease``'s table (messages or publication
    deliveries: the same columns) whose reader's lease ended: pending again,
    receivable at once, or failed once delivered %(max_deliveries)s times (a poison
    message is not delivered for ever). Rows someone holds are skipped, never
    waited for."""
    return f"""
WITH expired AS (
    SELECT id FROM {lease.table} x
    WHERE {lease.expired("x")}
    ORDER BY {lease.ends}
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {lease.table} x
SET status = CASE WHEN x.delivery_count >= %(max_deliveries)s THEN 'failed'
                  ELSE 'pending' END,
    {lease.clear()}
FROM expired
WHERE x.id = expired.id
RETURNING x.id
"""


def expire_statement(lease: Lease) -> str:
    """Mark up to %(batch)s open, unleased rows of ``lease``'s table whose expiry passed
    as expired. Retention, in batches that skip rows someone holds: a row still leased
    to a reader is left to it until the lease ends, so its acknowledgement is not
    refused."""
    return f"""
WITH due AS (
    SELECT id FROM {lease.table}
    WHERE status IN ('pending', 'delivered') AND expires_at <= {lease.now}
      AND visible_at <= {lease.now}
    ORDER BY expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {lease.table} x SET status = 'expired', {lease.clear()} FROM due WHERE x.id = due.id
"""


RECOVER_MESSAGES = recover_statement(MESSAGE_LEASE)
EXPIRE_MESSAGES = expire_statement(MESSAGE_LEASE)


# An operator's revive: failed messages pending again, receivable at once, with a
# fresh delivery budget and, if their expiry passed meanwhile, a fresh lifetime as
# long as their first; their recipients' readers are woken. Ids locked in order, so
# two overlapping revives do not deadlock.
REVIVE_MESSAGES = f"""
WITH target AS (
    SELECT id FROM agent_messages
    WHERE id = ANY(%(ids)s::uuid[]) AND status = 'failed'
    ORDER BY id
    FOR UPDATE
),
revived AS (
    UPDATE agent_messages m
    SET status = 'pending', delivery_count = 0, visible_at = {_NOW},
        expires_at = greatest(m.expires_at, {_NOW} + (m.expires_at - m.created_at)),
        {MESSAGE_LEASE.clear()}
    FROM target
    WHERE m.id = target.id
    RETURNING m.id, m.to_agent
)
SELECT id, to_agent, pg_notify('{MESSAGES_CHANNEL}', to_agent) IS NULL FROM revived
"""


# A failed message, like an expired one, is kept QUEUE_RETENTION_DAYS after its expiry
# (for an operator to revive); a revive gives it a new expiry.
PRUNE_MESSAGES = """
WITH doomed AS (
    SELECT id FROM agent_messages
    WHERE status IN ('acknowledged', 'expired', 'failed') AND expires_at < %(cutoff)s
    ORDER BY expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM agent_messages m USING doomed WHERE m.id = doomed.id
"""


def send_message(
    *,
    from_agent: str,
    to_agent: str,
    message_type: str,
    payload: str,
    payload_ref: str | None,
    priority: int,
    correlation_id: str | None,
    reply_to: str | None,
    metadata: str,
    metadata_ref: str | None,
    expires_in: float,
) -> UUID:
    params = {
        "from_agent": from_agent,
        "to_agent": to_agent,
        "message_type": message_type,
        "payload": payload,
        "payload_ref": payload_ref,
        "priority": priority,
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "metadata": metadata,
        "metadata_ref": metadata_ref,
        "expires_in": expires_in,
    }
    return fetch(SEND_MESSAGE, params)[0][0]


def receive_messages(
    *,
    agent: str,
    limit: int,
    visibility_seconds: float,
    max_deliveries: int,
    now: datetime | None = None,
) -> list[tuple]:
    params = {
        "agent": agent,
        "limit": limit,
        "visibility_seconds": visibility_seconds,
        "max_deliveries": max_deliveries,
        "now": now,
    }
    return fetch(RECEIVE_MESSAGES, params)


def ack_message(message_id: UUID, receipt: UUID, *, now: datetime | None = None) -> bool:
    return bool(fetch(ACK_MESSAGE, {"id": message_id, "token": receipt, "now": now}))


def recover_messages(*, max_deliveries: int, now: datetime | None = None) -> int | None:
    """Messages whose reader's lease ended, given back (or failed); how many, or None
    when another process is recovering them right now."""
    params = {"max_deliveries": max_deliveries}
    return leases.recover_expired(MESSAGE_LEASE, RECOVER_MESSAGES, now=now, params=params)


def revive_messages(*, ids: list[UUID], now: datetime | None = None) -> list[tuple[UUID, str]]:
    """Failed messages among ``ids`` made pending again; (id, recipient) each."""
    return [(row[0], row[1]) for row in fetch(REVIVE_MESSAGES, {"ids": ids, "now": now})]


def expire_messages(*, batch: int, now: datetime | None = None) -> int:
    """Mark up to ``batch`` unacknowledged, unleased messages past their expiry expired."""
    return execute(EXPIRE_MESSAGES, {"batch": batch, "now": now})


def prune_messages(*, cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` acknowledged or expired messages that expired before
    ``cutoff``."""
    return execute(PRUNE_MESSAGES, {"cutoff": cutoff, "batch": batch})
