"""The shapes of the agent messaging routes' requests and answers (direct messages
and publish/subscribe), as the OpenAPI schema shows them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from ninja import Schema
from pydantic import AfterValidator, ConfigDict, Field
from pydantic import StrictInt as Int

from .schemas import BLOB_REF, UNREADABLE, StrictSchema, storable_text

# ------------------------------------------------------------------ agent messages

MessageTypeName = Literal["task_request", "data_share", "command", "response", "notification"]
MessageStatusName = Literal["pending", "delivered", "acknowledged", "expired", "failed"]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


AgentName = Annotated[
    str,
    Field(min_length=1, max_length=200),
    AfterValidator(storable_text),
    AfterValidator(_not_blank),
]


class MessageSend(StrictSchema):
    """A direct message (seed 002): at least once, highest priority first."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "from_agent": "PricingAgent",
                    "to_agent": "FitmentAgent",
                    "message_type": "task_request",
                    "payload": {"sku": "RTR-305F", "need": "fitment"},
                    "priority": 7,
                    "reply_to": "PricingAgent",
                }
            ]
        },
    )

    from_agent: AgentName
    to_agent: AgentName
    message_type: MessageTypeName
    payload: Any = Field(default_factory=dict)
    priority: Annotated[Int, Field(ge=1, le=10)] = 5
    correlation_id: AgentName | None = None
    reply_to: AgentName | None = Field(None, description="The agent a response goes to.")
    expires_in_seconds: Annotated[float, Field(gt=0, le=30 * 86400, allow_inf_nan=False)] = 3600.0
    metadata: dict[str, Any] = Field(default_factory=dict)


class MessageOut(Schema):
    id: UUID
    from_agent: str
    to_agent: str
    message_type: MessageTypeName
    payload: Any
    payload_ref: str | None = Field(None, description=BLOB_REF)
    priority: int
    status: MessageStatusName
    correlation_id: str | None
    reply_to: str | None
    metadata: dict[str, Any]
    created_at: datetime
    expires_at: datetime
    delivery_count: int


class DeliveredMessageOut(MessageOut):
    receipt: UUID = Field(description="This delivery's: acknowledge with it.")
    payload_error: str | None = Field(None, description=UNREADABLE)


class MessageReceive(StrictSchema):
    agent: AgentName
    limit: Annotated[Int, Field(ge=1, le=100)] = 10
    visibility_timeout_seconds: Annotated[float, Field(ge=0, le=43200, allow_inf_nan=False)] = (
        Field(30.0, description="Unacknowledged by then, the message is delivered again.")
    )


class MessageAck(StrictSchema):
    receipt: UUID


class MessageAckOut(Schema):
    acknowledged: bool


# ------------------------------------------------------------------ publish/subscribe


class PublicationIn(StrictSchema):
    publisher_agent: AgentName
    publisher_type: AgentName | None = None
    event_name: AgentName = Field(description="category.action, e.g. state.changed")
    publication_type: AgentName = "event"
    payload: Any = Field(default_factory=dict)
    ttl_seconds: Annotated[float, Field(gt=0, le=30 * 86400, allow_inf_nan=False)] = 3600.0
    metadata: dict[str, Any] = Field(default_factory=dict)


class PublishedOut(Schema):
    id: int
    deliveries: int = Field(description="Subscriptions it matched.")


class SubscriptionIn(StrictSchema):
    subscriber_agent: AgentName
    name: AgentName
    event_pattern: AgentName = Field("*", description="A glob: state.*, task.completed, *")
    publisher_agent: AgentName | None = None
    publisher_type: AgentName | None = None
    publication_types: list[AgentName] = Field(default_factory=list, max_length=50)


class SubscriptionRef(StrictSchema):
    subscriber_agent: AgentName
    name: AgentName


class SubscriptionOut(Schema):
    id: int
    subscriber_agent: str
    name: str
    event_pattern: str
    publisher_agent: str | None
    publisher_type: str | None
    publication_types: list[str]
    active: bool
    backlog: int = Field(description="Deliveries not yet acknowledged.")
    oldest: datetime | None = Field(description="When the oldest of them was published.")


class PublicationReceive(StrictSchema):
    subscriber_agent: AgentName
    subscription: AgentName | None = None
    limit: Annotated[Int, Field(ge=1, le=100)] = 10
    visibility_timeout_seconds: Annotated[float, Field(ge=0, le=43200, allow_inf_nan=False)] = 30.0


class DeliveryOut(Schema):
    id: int
    receipt: UUID
    delivery_count: int
    subscription: str
    publication_id: int
    publisher_agent: str
    publisher_type: str | None
    publication_type: str
    event_name: str
    payload: Any
    metadata: dict[str, Any]
    published_at: datetime
    expires_at: datetime
    payload_error: str | None = Field(None, description=UNREADABLE + " (payload or metadata)")


class DeliveryAck(StrictSchema):
    receipt: UUID
    result: Any = None


class DeliveryStateOut(Schema):
    """A delivery as it stands (``DeliveryOut`` is one handed to a reader)."""

    id: int
    subscriber_agent: str
    subscription: str
    publication_id: int
    publisher_agent: str
    event_name: str
    status: MessageStatusName
    delivery_count: int
    delivered_at: datetime | None
    acknowledged_at: datetime | None
    expires_at: datetime
    result: Any
