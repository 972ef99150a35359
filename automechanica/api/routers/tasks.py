"""``/api/v1/tasks`` and ``/api/v1/dead-letter``: create, list, show, edit, cancel, revive."""

from __future__ import annotations

import json
import re
from typing import Annotated
from uuid import UUID

from django.http import HttpRequest, HttpResponse
from ninja import Body, Header, Query, Router, Status
from pydantic import Field

from task_queue import blobs, operations, tracing
from task_queue.models import (
    DeadLetterEntry,
    Task,
    dead_letter_payload_contains,
    dead_letter_tasks,
)

from ..agents import own, require_agent
from ..auth import ADMIN, READ, WRITE
from ..errors import ERROR_RESPONSES, ApiError
from ..listing import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, filter_tasks, lean, page, shown
from ..openapi import links
from ..schemas import (
    BulkReviveOut,
    BulkReviveRequest,
    CancelOut,
    Cursor,
    ReviveRequest,
    TaskBatchOut,
    TaskCreateBody,
    TaskDetailOut,
    TaskFilters,
    TaskIdsOut,
    TaskOut,
    TaskPage,
    TaskUpdate,
)

router = Router(tags=["tasks"])


TASK_LINKS = {
    "GetTask": "get_task",
    "UpdateTask": "update_task",
    "CancelTask": "cancel_task",
    "ReviveTask": "revive_task",
}

Limit = Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE)]
# What a list shows in place of a large field (see listing.lean).
LARGE_IN_LISTS = {"payload": {}, "result": None}


def _task(request: HttpRequest, task_id: UUID) -> Task:
    """The task, if the token may see it (a bound token sees only its agents')."""
    task = own(request, Task.objects.filter(id=task_id), "agent_name").first()
    if task is None:
        raise ApiError.not_found("task")
    return task


def _own_agents(request: HttpRequest, body: TaskCreateBody) -> None:
    """A bound token enqueues only for its agents (403 naming the task's field)."""
    tasks = body if isinstance(body, list) else [body]
    for index, task in enumerate(tasks):
        field = f"[{index}].agent_name" if isinstance(body, list) else "agent_name"
        require_agent(request, field, task.agent_name)


@router.post(
    "/tasks",
    auth=WRITE,
    response={
        200: TaskOut | TaskBatchOut | TaskIdsOut,
        201: TaskOut | TaskBatchOut | TaskIdsOut,
        **ERROR_RESPONSES,
    },
    summary="Create a task, or up to 1,000 in one transaction",
    openapi_extra=links("task_id", TASK_LINKS),
)
def create_tasks(
    request: HttpRequest,
    body: Body[TaskCreateBody],
    prefer: Annotated[
        str, Header(alias="Prefer", description="`return=minimal`: answer the ids only.")
    ] = "",
):
    """A single task answers 201 with the task, or 200 with the existing task when its
    idempotency key was used before by the same request. A list answers with every
    task in order, 201 if any is new; all are created or none.

    With ``Prefer: return=minimal`` (RFC 7240) the answer is only the tasks' ids, in
    order, and how many are new (``TaskIdsOut``), with ``Preference-Applied:
    return=minimal``: for an orchestrator that keeps its own copy of what it sent,
    a batch's answer is then some 40 bytes a task instead of 700.

    With a W3C ``traceparent`` header, tasks that name no ``trace_id`` take its
    trace, and their spans (with OpenTelemetry on) are its children."""
    _own_agents(request, body)
    with tracing.incoming(request.headers.get("traceparent")):
        if _prefers_minimal(prefer):
            return _create_tasks_minimal(body)
        return _create_tasks(request, body)


# One preference of a Prefer header: up to a comma that is not inside a quoted string.
_PREFERENCE = re.compile(r'(?:[^,"]|"(?:[^"\\]|\\.)*")+')


def _prefers_minimal(prefer: str) -> bool:
    """Whether a ``Prefer`` header asks for ``return=minimal``. RFC 7240: preferences
    are separated by commas, their parameters by semicolons (ignored here), names are
    any case, and only the first ``return`` counts."""
    for preference in _PREFERENCE.findall(prefer):
        name, _, value = preference.partition(";")[0].partition("=")
        if name.strip().lower() == "return":
            return value.strip().strip('"').lower() == "minimal"
    return False


def _enqueue(body: TaskCreateBody) -> list[operations.Enqueued]:
    """The body's tasks, enqueued; a list's refusals name ``[i].field``, one task's
    ``field``."""
    if isinstance(body, list):
        return operations.enqueue_many([task.spec() for task in body], prefix="")
    return operations.enqueue_many([body.spec()], indexed=False)


def _answer(json_text: str, created: int) -> HttpResponse:
    """A batch's answer, already JSON: 201 if any task is new, else 200."""
    return HttpResponse(
        json_text, status=201 if created else 200, content_type="application/json; charset=utf-8"
    )


def _create_tasks_minimal(body: TaskCreateBody) -> HttpResponse:
    results = _enqueue(body)
    created = sum(r.created for r in results)
    response = _answer(
        json.dumps({"ids": [str(r.id) for r in results], "created": created}), created
    )
    response["Preference-Applied"] = "return=minimal"
    return response


def _create_tasks(request: HttpRequest, body: TaskCreateBody) -> HttpResponse | Status:
    if isinstance(body, list):
        # TaskBatchOut, written by PostgreSQL: up to 1,000 tasks through ORM objects
        # and the response schema cost several times the enqueue itself.
        results, items = operations.enqueue_many_as_api_json(
            [task.spec() for task in body], prefix=""
        )
        created = sum(r.created for r in results)
        return _answer(f'{{"items": {items}, "created": {created}}}', created)
    [result] = _enqueue(body)
    return Status(201 if result.created else 200, _task(request, result.id))


@router.get("/tasks", auth=READ, response={200: TaskPage, **ERROR_RESPONSES})
def list_tasks(
    request: HttpRequest,
    filters: Query[TaskFilters],
    cursor: Cursor | None = None,
    limit: Limit = DEFAULT_PAGE_SIZE,
):
    """Newest first. Follow ``next_cursor`` for the next page. A large payload or
    result is left out (named in ``omitted``): ``GET /tasks/{id}`` has it."""
    tasks = lean(
        filter_tasks(own(request, Task.objects.all(), "agent_name"), filters), LARGE_IN_LISTS
    )
    items, next_cursor = page(tasks, cursor=cursor, limit=limit)
    return {"items": shown(items, LARGE_IN_LISTS), "next_cursor": next_cursor}


@router.get("/dead-letter", auth=READ, response={200: TaskPage, **ERROR_RESPONSES})
def dead_letter(
    request: HttpRequest,
    filters: Query[TaskFilters],
    cursor: Cursor | None = None,
    limit: Limit = DEFAULT_PAGE_SIZE,
):
    """Dead (attempts exhausted) and failed (non-retryable) tasks, newest first."""
    # Filtered and paged in the dead letter's compact table; the page's tasks by key.
    entries = own(request, DeadLetterEntry.objects.all(), "agent_name")
    entries = filter_tasks(entries, filters, dead_letter_payload_contains)
    items, next_cursor = page(
        entries,
        cursor=cursor,
        limit=limit,
        read=lambda chosen: lean(dead_letter_tasks(chosen), LARGE_IN_LISTS),
    )
    return {"items": shown(items, LARGE_IN_LISTS), "next_cursor": next_cursor}


# Declared before /tasks/{task_id}: Django takes the first pattern that matches.
@router.post("/tasks/revive", auth=ADMIN, response={200: BulkReviveOut, **ERROR_RESPONSES})
def revive_many(request: HttpRequest, body: BulkReviveRequest):
    """Revive dead and failed tasks by ``ids``, or every one that ``filters`` match."""
    if (body.ids is None) == (body.filters is None):
        raise ApiError(
            422,
            "validation_error",
            "give ids or filters, not both",
            field_errors=[("ids", "give ids or filters, not both")],
        )
    if body.ids is not None:
        ids = list(
            own(request, Task.objects.filter(id__in=body.ids), "agent_name").values_list(
                "id", flat=True
            )
        )
    else:
        # The dead letter's compact table.
        entries = own(request, DeadLetterEntry.objects.all(), "agent_name")
        matching = filter_tasks(entries, body.filters, dead_letter_payload_contains)
        ids = list(matching.values_list("id", flat=True))
    revived = operations.revive(
        ids,
        actor=request.auth.actor,
        source="api",
        matched_filter=body.filters.model_dump(mode="json", exclude_none=True)
        if body.filters
        else None,
    )
    return {"revived": len(revived)}


@router.get("/tasks/{task_id}", auth=READ, response={200: TaskDetailOut, **ERROR_RESPONSES})
def get_task(request: HttpRequest, task_id: UUID):
    """The task with its history: every attempt, its error and traceback, its worker,
    and every operator action. A payload or result stored as a blob is read back."""
    task = _task(request, task_id)
    task.hide_lease_tokens = bool(request.auth.agents)
    try:
        task.payload = blobs.payload_of(task.payload, task.payload_ref)
    except blobs.PayloadBlobError as error:
        task.payload_error = str(error)
    try:
        task.result = blobs.payload_of(task.result, task.result_ref)
    except blobs.PayloadBlobError as error:
        task.result_error = str(error)
    return task


@router.patch("/tasks/{task_id}", auth=WRITE, response={200: TaskOut, **ERROR_RESPONSES})
def update_task(request: HttpRequest, task_id: UUID, body: TaskUpdate):
    """Change priority, payload or ``available_at`` of a pending task; 409 otherwise."""
    changes = body.model_dump(exclude_unset=True)
    if not changes or any(value is None for value in changes.values()):
        raise ApiError(
            422,
            "validation_error",
            "give at least one of priority, payload, available_at (not null)",
            field_errors=[(name, "must not be null") for name, v in changes.items() if v is None]
            or [("body", "give at least one of priority, payload, available_at")],
        )
    _task(request, task_id)
    try:
        operations.update_pending(task_id, actor=request.auth.actor, source="api", **changes)
    except operations.TaskNotFound:
        raise ApiError.not_found("task") from None
    except operations.TaskNotPending as error:
        raise ApiError.wrong_status("task", error.status, "change it: only pending tasks") from None
    return _task(request, task_id)


@router.post("/tasks/{task_id}/cancel", auth=WRITE, response={200: CancelOut, **ERROR_RESPONSES})
def cancel_task(request: HttpRequest, task_id: UUID):
    """A pending or leased task is cancelled at once; a running one is asked to stop
    and its worker cancels it at its next heartbeat."""
    _task(request, task_id)
    outcome = operations.cancel([task_id], actor=request.auth.actor, source="api").get(task_id)
    task = _task(request, task_id)
    if outcome is None:
        state = "cancel requested" if task.cancel_awaited else task.status
        raise ApiError.wrong_status("task", state, "cancel it")
    return {"id": task_id, "outcome": outcome, "task": task}


@router.post("/tasks/{task_id}/revive", auth=WRITE, response={200: TaskOut, **ERROR_RESPONSES})
def revive_task(request: HttpRequest, task_id: UUID, body: ReviveRequest | None = None):
    """A dead or failed task back to pending with fresh attempts, optionally with an
    edited payload."""
    payload = body.payload if body is not None else None
    _task(request, task_id)
    revived = operations.revive([task_id], actor=request.auth.actor, payload=payload, source="api")
    task = _task(request, task_id)
    if not revived:
        raise ApiError.wrong_status("task", task.status, "revive it: only dead or failed tasks")
    return task
