"""Direct messages between agents (seed 002, pattern 1), delivered at least once.

``send`` writes a message and wakes its recipient's readers (NOTIFY). ``receive``
leases up to ``limit`` of an agent's messages, highest priority first, then oldest,
for ``visibility_timeout`` seconds; ``ack`` with the delivery's receipt marks one
processed. A message not acknowledged in time is delivered again (its
``delivery_count`` says how often), and one past ``expires_at`` is delivered no more.
One delivered ``MESSAGE_MAX_DELIVERIES`` times without an acknowledgement (a poison
message that crashes its readers) is failed once its last lease ends: delivered no
more until an operator revives it (``revive``, audit-logged).
Readers of one agent in many processes never hold the same message at once (FOR
UPDATE SKIP LOCKED). With ``wait``, ``receive`` blocks on the notification, polling
as a fallback.

Messages carry facts and requests: an agent that wants work from another sends a
``task_request``, and the orchestrator turns requests into tasks (spec 001 §10).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from agents_app.sql import messages as messages_sql
from task_queue import audit, blobs, listen, task_logging
from task_queue.models import OperatorAction
from task_queue.storable import storable_json, text_problem

from .models import MessageType

DEFAULT_EXPIRY_SECONDS = 3600.0
MAX_EXPIRY_SECONDS = 30 * 86400.0
MAX_VISIBILITY_SECONDS = 12 * 3600.0
MAX_RECEIVE = 100
T = TypeVar("T")
MAX_WAIT_SECONDS = 3600.0
POLL_SECONDS = 5.0  # the fallback when no notification comes


class InvalidMessage(ValueError):
    """A message was refused; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Message:
    id: UUID
    from_agent: str
    to_agent: str
    message_type: str
    priority: int
    correlation_id: str | None
    reply_to: str | None
    metadata: dict[str, Any]
    created_at: datetime
    expires_at: datetime
    delivery_count: int
    receipt: UUID  # this delivery's: ack with it
    payload: Any  # read from its blob when it was too large for the row
    payload_ref: str | None = None  # that blob
    payload_error: str | None = None  # why the payload could not be read (a lost blob)


def send(
    from_agent: str,
    to_agent: str,
    message_type: str,
    payload: Any = None,
    *,
    priority: int = 5,
    correlation_id: str | None = None,
    reply_to: str | None = None,
    expires_in: float = DEFAULT_EXPIRY_SECONDS,
    metadata: dict[str, Any] | None = None,
) -> UUID:
    """Send a message; returns its id. Raises :class:`InvalidMessage`."""
    for field, value in (("from_agent", from_agent), ("to_agent", to_agent)):
        check_text(field, value, required=True)
    check_text("correlation_id", correlation_id)
    check_text("reply_to", reply_to)
    if message_type not in MessageType.values:
        raise InvalidMessage("message_type", f"must be one of {', '.join(MessageType.values)}")
    if isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= 10:
        raise InvalidMessage("priority", "must be an integer from 1 to 10")
    check_lifetime("expires_in", expires_in)
    check_metadata(metadata)
    payload_text = as_json("payload", {} if payload is None else payload)
    metadata_text = as_json("metadata", traced(metadata) or {})
    with transaction.atomic():  # the blobs' locks last until the row commits
        payload_json, payload_ref = blobs.offload(payload_text)
        metadata_json, metadata_ref = blobs.offload(metadata_text)
        return messages_sql.send_message(
            from_agent=from_agent,
            to_agent=to_agent,
            message_type=message_type,
            payload=payload_json,
            payload_ref=payload_ref,
            priority=priority,
            correlation_id=correlation_id,
            reply_to=reply_to,
            metadata=metadata_json,
            metadata_ref=metadata_ref,
            expires_in=float(expires_in),
        )


def traced(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """``metadata`` with the trace of the task being run, when sent from inside one
    (a handler on a worker) and ``metadata`` names no trace of its own. The event
    stream's envelope takes its ``trace_id`` from there."""
    trace_id = task_logging.current_trace_id()
    if trace_id is None or (isinstance(metadata, dict) and "trace_id" in metadata):
        return metadata
    return {**(metadata or {}), "trace_id": trace_id}


def reply(to: Message, from_agent: str, payload: Any = None, **options: Any) -> UUID:
    """Answer ``to``: a ``response`` to its ``reply_to`` (or its sender), correlated by
    its ``correlation_id`` (or its id)."""
    options.setdefault("correlation_id", to.correlation_id or str(to.id))
    return send(from_agent, to.reply_to or to.from_agent, MessageType.RESPONSE, payload, **options)


def receive(
    agent: str, *, limit: int = 10, visibility_timeout: float = 30.0, wait: float = 0.0
) -> list[Message]:
    """Lease up to ``limit`` of ``agent``'s visible messages; with ``wait``, block up to
    that many seconds for one to arrive."""
    check_text("agent", agent, required=True)
    check_receive(limit, visibility_timeout, wait)
    return wait_for_some(
        lambda: _receive(agent, limit, visibility_timeout),
        channel=messages_sql.MESSAGES_CHANNEL,
        agent=agent,
        wait=wait,
    )


def check_receive(limit: int, visibility_timeout: float, wait: float) -> None:
    """The limits of a read, shared by mailboxes and subscriptions."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RECEIVE:
        raise InvalidMessage("limit", f"must be an integer from 1 to {MAX_RECEIVE}")
    if not 0 <= visibility_timeout <= MAX_VISIBILITY_SECONDS:  # False for NaN too
        raise InvalidMessage("visibility_timeout", "must be seconds from 0 to 43200")
    if not 0 <= wait <= MAX_WAIT_SECONDS:
        raise InvalidMessage("wait", f"must be seconds from 0 to {MAX_WAIT_SECONDS:.0f}")


def wait_for_some(look: Callable[[], list[T]], *, channel: str, agent: str, wait: float) -> list[T]:
    """``look()``; if it finds nothing and ``wait`` is set, look again whenever
    ``channel`` names ``agent`` (or every POLL_SECONDS), until ``wait`` runs out."""
    found = look()
    if found or not wait:
        return found
    if connection.in_atomic_block:
        # A send commits, and so wakes anyone, only outside this transaction's view.
        raise InvalidMessage("wait", "cannot wait inside a transaction")
    deadline = time.monotonic() + wait
    with listen.listening(channel) as notes:  # listening before each look: no wake-up is lost
        while True:
            found = look()
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return found
            for note in notes.notifies(timeout=min(remaining, POLL_SECONDS)):
                if note.payload == agent:
                    break


def ack(message: Message) -> bool:
    """Mark ``message`` processed; False if its lease ran out and it was given back or
    went to another reader."""
    return acknowledge(message.id, message.receipt)


def acknowledge(message_id: UUID, receipt: UUID) -> bool:
    """``ack`` by id and receipt (what the HTTP API receives)."""
    return messages_sql.ack_message(message_id, receipt)


def recover_leases() -> None:
    """The maintenance job: give back messages whose reader's lease ended, and fail
    those delivered MESSAGE_MAX_DELIVERIES times."""
    messages_sql.recover_messages(max_deliveries=settings.MESSAGE_MAX_DELIVERIES)


def revive(ids: Iterable[UUID], *, actor: str, source: str = "python") -> list[UUID]:
    """Failed messages → pending, receivable at once with a fresh delivery budget (and
    a fresh lifetime if theirs ran out), written to the operator audit log in the
    same transaction. Returns the ids revived; messages in another status are left
    alone."""
    with transaction.atomic():
        revived = messages_sql.revive_messages(ids=sorted(set(ids)))
        record_revive(
            OperatorAction.Kind.REVIVE_MESSAGES, "messages", revived, actor=actor, source=source
        )
    return [message_id for message_id, _ in revived]


def record_revive(
    action: str, what: str, revived: list[tuple[Any, str]], *, actor: str, source: str
) -> None:
    """The audit row of a revive of messages or deliveries (none if nothing was
    revived): their ids, and their agent when there is one."""
    if not revived:
        return
    agents = {agent for _, agent in revived}
    audit.record(
        actor=actor,
        action=action,
        source=source,
        agent_name=agents.pop() if len(agents) == 1 else None,
        changes={what: {"from": "failed", "to": "pending", "ids": [str(i) for i, _ in revived]}},
    )


def _receive(agent: str, limit: int, visibility_timeout: float) -> list[Message]:
    rows = messages_sql.receive_messages(
        agent=agent,
        limit=limit,
        visibility_seconds=visibility_timeout,
        max_deliveries=settings.MESSAGE_MAX_DELIVERIES,
    )
    messages = [_message(row) for row in rows]
    return sorted(messages, key=lambda m: (-m.priority, m.created_at))


def _message(row: tuple) -> Message:
    values = list(row)
    payload, payload_ref = json.loads(values.pop(4)), values.pop(4)  # jsonb comes as text
    values[7], metadata_ref = json.loads(values[7]), values.pop(8)
    try:
        values[7] = blobs.payload_of(values[7], metadata_ref)
        payload = blobs.payload_of(payload, payload_ref)
    except blobs.PayloadBlobError as error:
        # The reader gets the message and the reason; acknowledging it ends it.
        return Message(*values, payload=None, payload_ref=payload_ref, payload_error=str(error))
    return Message(*values, payload=payload, payload_ref=payload_ref)


def check_text(field: str, value: str | None, *, required: bool = False) -> None:
    """Refuse (InvalidMessage naming ``field``) what is not a storable name-like text."""
    if value is None and not required:
        return
    if not isinstance(value, str) or not value.strip():
        raise InvalidMessage(field, "must be a non-empty string")
    if len(value) > 200:
        raise InvalidMessage(field, "must be at most 200 characters")
    if problem := text_problem(value):
        raise InvalidMessage(field, problem)


def check_lifetime(field: str, seconds: float) -> None:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 < seconds <= MAX_EXPIRY_SECONDS
    ):
        raise InvalidMessage(field, f"must be seconds in (0, {MAX_EXPIRY_SECONDS:.0f}]")


def check_metadata(metadata: Any) -> None:
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidMessage("metadata", "must be an object")


def as_json(field: str, value: Any) -> str:
    """``value`` as JSON text jsonb accepts and within QUEUE_MAX_PAYLOAD_BYTES, or
    InvalidMessage naming ``field``."""
    try:
        return blobs.check_size(storable_json(value))
    except ValueError as error:  # blobs.TooLarge too
        raise InvalidMessage(field, str(error)) from None
