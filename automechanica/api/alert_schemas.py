"""The shapes of ``/api/v1/alert-rules`` and ``/api/v1/alerts``: types are checked here,
the rest (the agent, ranges, each channel) by ``task_queue.alerts.rules``, which names
the field it refuses. Answers never carry a channel's secret."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic import StrictBool as Bool
from pydantic import StrictInt as Int

from task_queue.models import AlertKind

from .schemas import Moment, StrictSchema, Text

# The kinds the queue knows (task_queue.models.AlertKind), spelled out in the schema.
Kind = Literal[tuple(AlertKind.values)]

EXAMPLE_RULE = {
    "name": "fitment dead letter",
    "kind": "dead_letter",
    "agent": "FitmentAgent",
    "threshold": 5,
    "window_seconds": 900,
    "channels": [
        {"type": "webhook", "url": "https://ops.example.com/hooks/queue", "secret": "…"},
        {"type": "slack", "url": "https://hooks.slack.com/services/…"},
        {"type": "email", "to": ["oncall@example.com"]},
    ],
}


class AlertRuleCreate(StrictSchema):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [EXAMPLE_RULE]})

    name: Text
    kind: Kind
    agent: Text | None = Field(None, description="None: every agent, each on its own.")
    threshold: float = Field(
        description="dead_letter, lease_expirations: tasks; failure_rate: 0 to 1; "
        "backlog_age, schedule_missed: seconds; no_workers, workflow_escalated: ignored."
    )
    window_seconds: Int = Field(900, description="10 to 3600.")
    min_count: Int = Field(10, description="failure_rate: tasks finished in the window at least.")
    repeat_seconds: Int = Field(3600, description="Notify again this often while it holds.")
    channels: list[dict[str, Any]] = Field(
        default_factory=list,
        description='{"type": "webhook", "url", "secret"?}, {"type": "slack", "url"}, '
        '{"type": "email", "to": [...]}',
    )
    enabled: Bool = True


class AlertSilence(StrictSchema):
    until: Moment | None = Field(
        description="Nothing is sent until then (the rule is still evaluated); null lifts it."
    )


class AlertTestOut(BaseModel):
    notification_id: int


class AlertRuleUpdate(StrictSchema):
    name: Text | None = None
    kind: Kind | None = None
    agent: Text | None = None
    threshold: float | None = None
    window_seconds: Int | None = None
    min_count: Int | None = None
    repeat_seconds: Int | None = None
    channels: list[dict[str, Any]] | None = None
    enabled: Bool | None = None


class AlertStateOut(BaseModel):
    agent: str
    workflow_id: str | None = Field(description="workflow_escalated: the workflow.")
    value: float | None
    firing_since: datetime | None
    notified_at: datetime | None


class AlertRuleOut(BaseModel):
    id: int
    name: str
    kind: str
    agent: str | None
    threshold: float
    window_seconds: int
    min_count: int
    repeat_seconds: int
    channels: list[dict[str, Any]] = Field(
        description="Without secrets, URLs cut to the host; a fingerprint that changes "
        "with the URL or the secret."
    )
    enabled: bool
    silenced_until: datetime | None
    source: str
    firing: list[AlertStateOut] = Field(description="The agents it fires for now.")


class DeliveryAttemptOut(BaseModel):
    attempt: int
    ok: bool
    http_status: int | None
    error: str
    at: datetime


class DeliveryOut(BaseModel):
    channel: dict[str, Any]
    status: str
    attempts: int
    tries: list[DeliveryAttemptOut]


class NotificationOut(BaseModel):
    id: int
    rule: str
    agent: str
    workflow_id: str | None = Field(description="workflow_escalated: the workflow.")
    state: str
    value: float | None
    threshold: float
    started_at: datetime
    created_at: datetime
    summary: str
    deliveries: list[DeliveryOut]


class FiringOut(BaseModel):
    rule: str
    agent: str
    workflow_id: str | None = Field(description="workflow_escalated: the workflow.")
    started_at: datetime
    ended_at: datetime | None = Field(description="None: firing now.")
    ended_by: str | None = Field(description="resolved, or rule_changed.")
    peak_value: float | None = Field(description="The highest reading while it fired.")


class AlertsOut(BaseModel):
    firing: list[NotificationOut] = Field(description="The last firing of each alert now firing.")
    recent: list[NotificationOut] = Field(description="The latest notifications, newest first.")
    firings: list[FiringOut] = Field(
        description="The history of firings (whether notified or silenced), newest first."
    )
