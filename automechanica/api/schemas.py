"""The shapes of the API's requests and answers, as the OpenAPI schema shows them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args
from uuid import UUID

from ninja import Schema
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
)
from pydantic import StrictInt as Int

from task_queue.models import (
    MAX_ATTEMPTS_LIMIT,
    MAX_CONCURRENCY_LIMIT,
    MAX_RATE_COUNT,
    MAX_RATE_PERIOD_SECONDS,
    PRIORITY_MAX,
    PRIORITY_MIN,
    Priority,
)
from task_queue.storable import text_problem
from task_queue.task_specs import MAX_DELAY_SECONDS, MAX_KEY_LENGTH, TaskSpec

# Lists (tasks, dead letter, workflows) carry a large JSON field only up to this many
# bytes (automechanica.api.listing.lean): 500 rows stay a few MiB, whatever they hold.
LIST_INLINE_BYTES = 4096
OMITTED = f"Fields over {LIST_INLINE_BYTES} bytes or in a blob, left out: GET the item for them."
BLOB_REF = "Set when the value is stored as a blob (sha256-…)."
UNREADABLE = "Why the value stored as a blob could not be read."


def storable_text(value: str) -> str:
    if problem := text_problem(value):
        raise ValueError(problem)
    return value


def _in_utc(value: datetime) -> datetime:
    """Stored in UTC: PostgreSQL refuses offsets beyond ±15:59, which ISO 8601 allows."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range") from None


Moment = Annotated[AwareDatetime, AfterValidator(_in_utc)]
Text = Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH), AfterValidator(storable_text)]
# The query parameters of one GET must fit daphne's 16 KiB request head even when every
# character is 4-byte UTF-8, sent as 12 bytes (%XX%XX%XX%XX): a longer request line is
# refused with a bare 400 and a closed connection. tests/test_api_url_limits.py adds up
# every operation's longest valid URL from the OpenAPI schema.
SearchText = Annotated[str, Field(max_length=400), AfterValidator(storable_text)]
Cursor = Annotated[str, Field(max_length=200, description="A next_cursor this API returned.")]
TaskStatusName = Literal["pending", "leased", "running", "completed", "failed", "dead", "cancelled"]
WorkflowStatusName = Literal[
    "pending", "running", "completed", "needs_attention", "escalated", "cancelled"
]
Seconds = Annotated[float, Field(ge=0, le=MAX_DELAY_SECONDS, allow_inf_nan=False)]
PriorityValue = Annotated[Int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)]


class StrictSchema(Schema):
    """A request body: an unknown field is an error (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------ tasks


EXAMPLE_TASK = {
    "agent_name": "FitmentAgent",
    "task_type": "generate_fitment",
    "payload": {
        "part": {
            "sku": "RTR-305F",
            "category": "brake_rotor",
            "attributes": {"diameter_mm": 305, "position": "front"},
        }
    },
    "priority": 0,
    "max_attempts": 3,
}


class StrictBody(BaseModel):
    """A request body that pydantic alone validates. ninja's ``Schema`` validates a
    model that forbids extra fields twice, the second time through a wrapper made
    for reading ORM objects: for a batch of 1,000 tasks that took longer than
    enqueueing them. A JSON body needs neither."""

    model_config = ConfigDict(extra="forbid")


class NewTask(StrictBody):
    """``createTask`` of spec 001 §9, without the workflow (a workflow's own tasks)."""

    model_config = ConfigDict(json_schema_extra={"examples": [EXAMPLE_TASK]})

    agent_name: Text
    task_type: Text
    payload: dict[str, Any] = {}
    priority: PriorityValue = Priority.MEDIUM
    max_attempts: Annotated[Int, Field(ge=1, le=MAX_ATTEMPTS_LIMIT)] | None = Field(
        None, description="Defaults to the agent's own setting."
    )
    available_at: Moment | None = Field(None, description="Not before this time.")
    delay_seconds: (
        Annotated[float, Field(ge=0, le=MAX_DELAY_SECONDS, allow_inf_nan=False)] | None
    ) = Field(None, description="Not before this many seconds from now.")
    idempotency_key: Text | None = Field(
        None,
        description="The same key again returns the existing task (200 instead of 201); "
        "with a different request it is refused (409).",
    )
    trace_id: Text | None = None

    def spec(self, **more: Any) -> TaskSpec:
        """The task for ``enqueue_many``, from its fields as they are: ``model_dump``
        copies each (2 ms per 1,000 tasks against 0.3, measured)."""
        return TaskSpec(**self.__dict__, **more)


class TaskCreate(NewTask):
    workflow_id: UUID | None = None


def _one_or_many(value: Any) -> str:
    return "many" if isinstance(value, list) else "one"


TaskCreateBody = Annotated[
    Annotated[TaskCreate, Tag("one")]
    | Annotated[list[TaskCreate], Tag("many"), Field(min_length=1, max_length=1000)],
    Discriminator(_one_or_many),
]


class TaskOut(Schema):
    id: UUID
    workflow_id: UUID | None
    agent_name: str
    task_type: str
    payload: dict[str, Any] = Field(description="In lists, {} for a large one (see omitted).")
    payload_ref: str | None = Field(None, description=BLOB_REF)
    priority: int
    status: TaskStatusName
    attempts: int
    max_attempts: int
    available_at: datetime
    lease_owner: str | None
    lease_expires_at: datetime | None
    cancel_requested_at: datetime | None
    error_info: dict[str, Any] | None
    result: Any = Field(None, description="The result; in lists, null for a large one.")
    result_ref: str | None = Field(None, description=BLOB_REF)
    omitted: list[Literal["payload", "result"]] = Field([], description=OMITTED)
    idempotency_key: str | None
    trace_id: str | None
    progress: float | None = Field(
        None,
        description="How far the current (or last) attempt got, from 0 to 1, as its handler "
        "last reported it; written with the worker's heartbeat (every third of the lease). "
        "Kept when the task ends, cleared when it starts again; null: none reported.",
    )
    progress_message: str | None = Field(
        None, description="The handler's message with its last progress (up to 200 characters)."
    )
    started_at: datetime | None
    finished_at: datetime | None
    created_at: datetime
    updated_at: datetime


class TaskBatchOut(Schema):
    items: list[TaskOut]
    created: int = Field(description="How many are new; the others existed (idempotency keys).")


class TaskIdsOut(Schema):
    """The answer to ``Prefer: return=minimal``: the tasks' ids, not the tasks."""

    ids: list[UUID] = Field(description="One per task given, in order.")
    created: int = Field(description="How many are new; the others existed (idempotency keys).")


class HistoryOut(Schema):
    event: str
    from_status: str
    to_status: str
    attempt: int
    actor: str | None = Field(description='A worker ("host:pid"), "reaper", or who acted.')
    lease_token: UUID | None
    started_at: datetime | None
    occurred_at: datetime
    error: dict[str, Any] | None = Field(description="type, message, traceback, retryable")
    detail: dict[str, Any] | None


class TaskDetailOut(TaskOut):
    history: list[HistoryOut]
    payload_error: str | None = Field(None, description=UNREADABLE)
    result_error: str | None = Field(None, description=UNREADABLE)

    @staticmethod
    def resolve_history(task: Any) -> list[Any]:
        history = list(task.history.all())
        # A claim gives every task it takes one lease token: a past attempt's token may
        # be the current token of a task still running. Only an unbound token (an
        # operator's program, which may act on every task anyway) sees them.
        if getattr(task, "hide_lease_tokens", False):
            for row in history:
                row.lease_token = None
        return history


class TaskPage(Schema):
    items: list[TaskOut]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null at the end."
    )


class TaskUpdate(StrictSchema):
    priority: PriorityValue | None = None
    payload: dict[str, Any] | None = None
    available_at: Moment | None = None


class ReviveRequest(StrictSchema):
    payload: dict[str, Any] | None = Field(
        None, description="Replaces the task's payload before it runs again."
    )


class TaskFilters(Schema):
    """The filters of ``GET /tasks``, ``GET /dead-letter`` and bulk revive."""

    status: list[TaskStatusName] | None = Field(None, max_length=len(get_args(TaskStatusName)))
    agent_name: Text | None = None
    task_type: Text | None = None
    workflow_id: UUID | None = None
    trace_id: Text | None = Field(None, description="The tasks of one trace.")
    priority: Annotated[int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)] | None = None
    created_after: Moment | None = None
    created_before: Moment | None = None
    updated_after: Moment | None = None
    updated_before: Moment | None = None
    q: SearchText | None = Field(None, description="Text that the payload contains (any case).")


class StrictTaskFilters(TaskFilters, StrictSchema):
    pass


class BulkReviveRequest(StrictSchema):
    """Either ``ids`` or ``filters`` (the filters of ``GET /tasks``), not both."""

    ids: Annotated[list[UUID], Field(min_length=1, max_length=10000)] | None = None
    filters: StrictTaskFilters | None = None


class BulkReviveOut(Schema):
    revived: int


class CancelOut(Schema):
    id: UUID
    outcome: Literal["cancelled", "cancel_requested"] = Field(
        description="cancelled at once, or (running) asked to stop at its next heartbeat"
    )
    task: TaskOut


# ------------------------------------------------------------------ workflows


MAX_ESCALATE_SECONDS = 366 * 86_400


class WorkflowCreate(StrictSchema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"name": "onboard Acme", "open": False, "tasks": [EXAMPLE_TASK]}]
        }
    )

    name: Text
    metadata: dict[str, Any] = {}
    open: bool = Field(
        False,
        description="True while more tasks will be added: an open workflow is not "
        "completed even if all its tasks are.",
    )
    trace_id: Text | None = None
    tasks: Annotated[list[NewTask], Field(max_length=1000)] = []
    escalate_after_failures: Annotated[Int, Field(ge=1, le=1_000_000)] | None = Field(
        None,
        description="Escalate the workflow once this many of its tasks are dead or failed.",
    )
    escalate_after_seconds: Annotated[Int, Field(ge=1, le=MAX_ESCALATE_SECONDS)] | None = Field(
        None,
        description="Escalate the workflow if it is not completed this long after now.",
    )


class WorkflowUpdate(StrictSchema):
    name: Text | None = None
    metadata: dict[str, Any] | None = None
    open: bool | None = None


class WorkflowOut(Schema):
    id: UUID
    name: str
    status: WorkflowStatusName
    open: bool
    metadata: dict[str, Any] = Field(description="In lists, {} for large metadata (see omitted).")
    metadata_ref: str | None = Field(None, description=BLOB_REF)
    omitted: list[Literal["metadata"]] = Field([], description=OMITTED)
    metadata_error: str | None = Field(None, description=UNREADABLE)
    trace_id: str | None
    progress: dict[TaskStatusName, int] = Field(description="Task counts by status.")
    total_tasks: int
    cancelled_at: datetime | None
    escalate_after_failures: int | None
    escalate_after_seconds: int | None
    escalated_at: datetime | None = Field(
        description="Set while escalated: until resumed (POST .../resume) or cancelled."
    )
    escalation: dict[str, Any] | None = Field(
        description="Why and when it escalated (reason failures or running_too_long), "
        "and who resumed it: once set, the workflow never escalates again."
    )
    created_at: datetime
    updated_at: datetime


class WorkflowCreatedOut(WorkflowOut):
    task_ids: list[UUID]


class WorkflowPage(Schema):
    items: list[WorkflowOut]
    next_cursor: str | None


class WorkflowCancelOut(Schema):
    cancelled_tasks: int
    workflow: WorkflowOut


# ------------------------------------------------------------------ agent memory


class SimilarEventOut(Schema):
    id: int = Field(description="The agent event's id.")
    task_id: UUID | None
    agent_name: str
    event_type: str
    content: str
    created_at: datetime
    distance: float = Field(description="Cosine distance: 0 is the same direction, 2 opposite.")


# ------------------------------------------------------------------ agents, workers, metrics


class RateLimitValue(StrictSchema):
    count: Annotated[Int, Field(ge=1, le=MAX_RATE_COUNT)]
    period_seconds: Annotated[Int, Field(ge=1, le=MAX_RATE_PERIOD_SECONDS)]


class AgentLimitsUpdate(StrictSchema):
    """Cluster-wide limits of an agent; a field left out stays as it is, null clears it."""

    concurrency_limit: Annotated[Int, Field(ge=1, le=MAX_CONCURRENCY_LIMIT)] | None = Field(
        None, description="At most this many of the agent's tasks leased or running at once."
    )
    rate_limit: RateLimitValue | None = Field(
        None, description="At most `count` task starts in any window of `period_seconds`."
    )


class AgentOut(Schema):
    name: str
    task_types: list[str]
    description: str
    base_delay: float
    max_attempts: int
    timeout: float
    retryable_errors: list[str]
    counts: dict[TaskStatusName, int]
    concurrency_limit: int | None
    concurrency_in_use: int = Field(description="Tasks leased or running now.")
    rate_limit: RateLimitValue | None
    rate_in_use: int | None = Field(
        description="Starts in the rate limit's current window; null without a rate limit."
    )


class WorkerOut(Schema):
    worker_id: str
    kind: Literal["local", "remote"] = Field(
        description="local: a runworker process; remote: an agent over the worker protocol."
    )
    hostname: str
    pid: int
    agents: list[str]
    concurrency: int
    in_flight: int
    state: Literal["idle", "busy", "draining"] = Field(
        description="busy: running tasks; draining: stopping, finishing its running tasks "
        "and taking no new one (written at once on the stop signal)."
    )
    task_ids: list[UUID] = Field(description="The tasks it runs, as of its last heartbeat.")
    started_at: datetime
    last_heartbeat_at: datetime
    heartbeat_age_seconds: float
    stale: bool = Field(description="No heartbeat for longer than a lease.")


class Percentiles(Schema):
    p50: float
    p95: float
    p99: float


class AgentMetrics(Schema):
    counts: dict[TaskStatusName, int]
    completed: dict[Literal["1m", "5m", "15m"], int]
    failed: dict[Literal["1m", "5m", "15m"], int] = Field(description="failed or dead")
    queue_wait_seconds: Percentiles | None = Field(
        description="due → started, of the latest 5,000 tasks (of all agents) that ran "
        "and finished in the last 15 minutes"
    )
    run_seconds: Percentiles | None = Field(description="started → finished, of the same tasks")


class MetricsOut(Schema):
    generated_at: datetime
    totals: dict[TaskStatusName, int]
    oldest_pending_age_seconds: float | None
    agents: dict[str, AgentMetrics]
