"""``/api/v1/messages``: direct messages between agents (``agents_app.messaging``).

A token bound to agents acts only as them (``automechanica.api.agents``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated
from uuid import UUID

from django.http import HttpRequest
from ninja import Query, Router, Status
from pydantic import Field

from agents_app import messaging
from agents_app.models import AgentMessage

from ..agents import own, require_agent
from ..auth import READ, WRITE
from ..errors import ERROR_RESPONSES, ApiError
from ..messaging_schemas import (
    AgentName,
    DeliveredMessageOut,
    MessageAck,
    MessageAckOut,
    MessageOut,
    MessageReceive,
    MessageSend,
    MessageStatusName,
    MessageTypeName,
)

router = Router(tags=["agent messages"])


@router.post("/messages", auth=WRITE, response={201: MessageOut, **ERROR_RESPONSES})
def send_message(request: HttpRequest, body: MessageSend):
    """Send a message to an agent's mailbox; its readers wake at once."""
    require_agent(request, "from_agent", body.from_agent)
    message_id = messaging.send(
        body.from_agent,
        body.to_agent,
        body.message_type,
        body.payload,
        priority=body.priority,
        correlation_id=body.correlation_id,
        reply_to=body.reply_to,
        expires_in=body.expires_in_seconds,
        metadata=body.metadata,
    )
    return Status(201, AgentMessage.objects.get(id=message_id))


@router.post(
    "/messages/receive", auth=WRITE, response={200: list[DeliveredMessageOut], **ERROR_RESPONSES}
)
def receive_messages(request: HttpRequest, body: MessageReceive):
    """Lease up to ``limit`` of the agent's messages, highest priority first, then
    oldest. Acknowledge each with its receipt within the visibility timeout, or it is
    delivered again."""
    require_agent(request, "agent", body.agent)
    messages = messaging.receive(
        body.agent, limit=body.limit, visibility_timeout=body.visibility_timeout_seconds
    )
    return [{**asdict(m), "status": "delivered"} for m in messages]


@router.post(
    "/messages/{message_id}/ack", auth=WRITE, response={200: MessageAckOut, **ERROR_RESPONSES}
)
def ack_message(request: HttpRequest, message_id: UUID, body: MessageAck):
    """Mark a delivered message processed. 409 when the receipt is not the current
    delivery's (its lease ran out and it was given back or went to another reader,
    or it is done)."""
    _addressed_to_own_agent(request, message_id)
    if not messaging.acknowledge(message_id, body.receipt):
        raise ApiError.stale_receipt("message")
    return {"acknowledged": True}


@router.get("/messages", auth=READ, response={200: list[MessageOut], **ERROR_RESPONSES})
def list_messages(
    request: HttpRequest,
    agent: Annotated[AgentName | None, Query(description="The recipient.")] = None,
    status: MessageStatusName | None = None,
    message_type: MessageTypeName | None = None,
    correlation_id: Annotated[AgentName | None, Query()] = None,
    limit: Annotated[int, Field(ge=1, le=500)] = 100,
):
    """Messages newest first, for inspection (reading a mailbox is ``receive``); those
    ``failed`` wait for a revive. A bound token sees its agents' mailboxes only."""
    if agent is not None:
        require_agent(request, "agent", agent)
    messages = own(request, AgentMessage.objects.all(), "to_agent")
    for field, value in (
        ("to_agent", agent),
        ("status", status),
        ("message_type", message_type),
        ("correlation_id", correlation_id),
    ):
        if value is not None:
            messages = messages.filter(**{field: value})
    return list(messages.order_by("-created_at")[:limit])


@router.post(
    "/messages/{message_id}/revive", auth=WRITE, response={200: MessageOut, **ERROR_RESPONSES}
)
def revive_message(request: HttpRequest, message_id: UUID):
    """Make a failed message (delivered ``MESSAGE_MAX_DELIVERIES`` times, never
    acknowledged) receivable again, with a fresh delivery budget; audit-logged. 409
    when it is not failed."""
    message = _addressed_to_own_agent(request, message_id)
    if not messaging.revive([message_id], actor=request.auth.actor, source="api"):
        message.refresh_from_db()
        raise ApiError.wrong_status("message", message.status, "revive")
    message.refresh_from_db()
    return message


def _addressed_to_own_agent(request: HttpRequest, message_id: UUID) -> AgentMessage:
    """The message (404 if none), if the token may act as its recipient (else 403)."""
    message = AgentMessage.objects.filter(id=message_id).first()
    if message is None:
        raise ApiError.not_found("message")
    why = f"is addressed to {message.to_agent!r}, not one of this token's agents"
    require_agent(request, "message_id", message.to_agent, why)
    return message
