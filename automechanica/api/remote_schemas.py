"""The shapes of the worker protocol's requests and answers (docs/remote-agents.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AfterValidator, BaseModel, Field, model_validator

from .schemas import StrictBody, storable_text

MAX_WORKER_NAME = 200
MAX_CLAIM = 500
MAX_OUTCOMES = 500
MIN_LEASE_SECONDS, MAX_LEASE_SECONDS = 5, 3600
MAX_WAIT_SECONDS = 60

WorkerName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_WORKER_NAME,
        description="The worker's name (host:pid, or any name): its row on /workers/.",
    ),
    AfterValidator(storable_text),
]
LeaseSeconds = Annotated[float, Field(ge=MIN_LEASE_SECONDS, le=MAX_LEASE_SECONDS)]


# Requests are StrictBody (a field this protocol does not know is a mistake, refused)
# and answers plain pydantic models: ninja's Schema reads through a wrapper made for
# ORM objects, which took a fifth of the server's time in a remote drain (py-spy).
Strict = StrictBody


class ClaimOneRequest(Strict):
    worker: WorkerName
    lease_seconds: LeaseSeconds = 30


class ClaimedTaskOut(BaseModel):
    id: UUID
    agent_name: str
    task_type: str
    payload: Any
    priority: int
    attempt: int = Field(description="This attempt's number, from 1.")
    max_attempts: int
    trace_id: str | None
    workflow_id: UUID | None
    lease_token: UUID = Field(description="Send it with every heartbeat and outcome.")
    lease_expires_at: datetime


class ProgressIn(Strict):
    fraction: float = Field(ge=0, le=1)
    message: str = ""


class HeartbeatRequest(Strict):
    lease_token: UUID
    progress: ProgressIn | None = None
    lease_seconds: LeaseSeconds | None = Field(
        None, description="Extend by this much (default: the lease's length at its claim)."
    )


class HeartbeatOut(BaseModel):
    lease_expires_at: datetime
    cancel_requested: bool = Field(
        description="Stop the task and report it failed: it then ends cancelled."
    )


class ErrorIn(Strict):
    type: Annotated[str, Field(min_length=1, max_length=200), AfterValidator(storable_text)]
    message: str
    traceback: str | None = None


class CompleteRequest(Strict):
    lease_token: UUID
    result: dict[str, Any] = Field(default_factory=dict)
    summary: str | None = Field(
        None, description="The AgentEvent's text (agent memory); default: the result."
    )


class FailRequest(Strict):
    lease_token: UUID
    error: ErrorIn
    retryable: bool = True


class OutcomeIn(Strict):
    task_id: UUID
    lease_token: UUID
    status: Literal["completed", "failed", "released"] = Field(
        description="released: given back unfinished (a worker stopping), no attempt counted."
    )
    result: dict[str, Any] | None = None
    summary: str | None = None
    error: ErrorIn | None = None
    retryable: bool = True

    @model_validator(mode="after")
    def _one_kind(self) -> OutcomeIn:
        if self.status == "failed" and self.error is None:
            raise ValueError("a failed outcome needs an error")
        if self.status != "failed" and self.error is not None:
            raise ValueError(f"a {self.status} outcome has no error")
        return self


def _once_each(outcomes: list[OutcomeIn]) -> list[OutcomeIn]:
    ids = [outcome.task_id for outcome in outcomes]
    if len(set(ids)) != len(ids):
        raise ValueError("each task may appear once")
    return outcomes


# A batch's outcomes, each task at most once (refused as the field ``outcomes``).
Outcomes = Annotated[list[OutcomeIn], AfterValidator(_once_each)]


class OutcomesRequest(Strict):
    outcomes: Outcomes = Field(min_length=1, max_length=MAX_OUTCOMES)


class ClaimRequest(Strict):
    worker: WorkerName
    limit: int = Field(1, ge=1, le=MAX_CLAIM, description="At most this many tasks.")
    lease_seconds: LeaseSeconds = Field(
        30, description="How long the leases last unless a heartbeat extends them."
    )
    wait_seconds: float = Field(
        0,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="With nothing due, wait up to this long for a task (a long poll).",
    )
    outcomes: Outcomes = Field(
        default_factory=list,
        max_length=MAX_OUTCOMES,
        description="Outcomes to record before claiming, as POST /api/v1/outcomes does "
        "(answered in results): a busy worker reports and claims in one request.",
    )


class OutcomeOut(BaseModel):
    task_id: UUID
    status: Literal["completed", "pending", "dead", "failed", "cancelled"] = Field(
        description="The task's new status: pending means retried at available_at."
    )
    available_at: datetime | None = None


class OutcomeRefusedOut(BaseModel):
    task_id: UUID
    error: dict[str, str] = Field(description="code and message, e.g. lease_lost.")


class OutcomesOut(BaseModel):
    results: list[OutcomeOut | OutcomeRefusedOut] = Field(
        description="One per outcome sent, in order."
    )


class ClaimOut(BaseModel):
    tasks: list[ClaimedTaskOut]
    results: list[OutcomeOut | OutcomeRefusedOut] = Field(
        default_factory=list, description="One per outcome sent with the claim, in order."
    )
