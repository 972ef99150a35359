"""The shapes of ``/api/v1/schedules``: types are checked here, everything else (cron,
time zone, the agent and its task type) by ``task_queue.schedules``, which names the
field it refuses."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Schema
from pydantic import ConfigDict, Field
from pydantic import StrictBool as Bool
from pydantic import StrictInt as Int

from task_queue.models import Priority

from .schemas import StrictSchema, Text

Missed = Literal["run_once", "skip"]

EXAMPLE_SCHEDULE = {
    "name": "nightly price refresh",
    "cron": "30 2 * * *",
    "timezone": "Europe/Paris",
    "agent_name": "PricingAgent",
    "task_type": "refresh_prices",
    "payload": {"catalogue": "brakes"},
    "missed": "run_once",
}


class ScheduleCreate(StrictSchema):
    model_config = ConfigDict(json_schema_extra={"examples": [EXAMPLE_SCHEDULE]})

    name: Text
    cron: str | None = Field(None, description="Five fields: minute hour day month weekday.")
    timezone: str = Field("UTC", description="IANA name the cron expression is read in.")
    interval_seconds: Int | None = Field(
        None, description="Instead of cron: slots on multiples of this since the Unix epoch."
    )
    agent_name: Text
    task_type: Text
    payload: dict[str, Any] = {}
    priority: Int = Priority.MEDIUM
    max_attempts: Int | None = Field(None, description="Defaults to the agent's own setting.")
    missed: Missed = Field(
        "run_once", description="Slots missed while nothing ran: run the latest once, or skip."
    )
    enabled: Bool = True


class ScheduleUpdate(StrictSchema):
    """Only the fields given change; ``enabled: false`` pauses, ``true`` resumes."""

    name: Text | None = None
    cron: str | None = None
    timezone: str | None = None
    interval_seconds: Int | None = None
    agent_name: Text | None = None
    task_type: Text | None = None
    payload: dict[str, Any] | None = None
    priority: Int | None = None
    max_attempts: Int | None = None
    missed: Missed | None = None
    enabled: Bool | None = None


class ScheduleRunOut(Schema):
    slot: datetime
    task_id: UUID | None
    manual: bool


class ScheduleOut(Schema):
    id: int
    name: str
    cron: str | None
    timezone: str
    interval_seconds: int | None
    agent_name: str
    task_type: str
    payload: dict[str, Any]
    priority: int
    max_attempts: int | None
    missed: Missed
    enabled: bool
    source: Literal["code", "admin", "api", "dashboard"]
    next_run_at: datetime | None
    last_run_at: datetime | None = Field(description="The last slot fired (or run now).")
    last_task_id: UUID | None
    last_error: str
    recent_runs: list[ScheduleRunOut] = []


class ScheduleRunNowOut(Schema):
    task_id: UUID
