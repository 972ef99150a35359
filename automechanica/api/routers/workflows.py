"""``/api/v1/workflows``: create a workflow with its first tasks, follow it, resume it
once escalated, cancel it."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from ninja import Router, Status
from pydantic import Field

from task_queue import blobs, escalation, operations, tracing
from task_queue.models import Task, TaskStatus, Workflow
from task_queue.storable import storable_json
from workflows.progress import progress_of, status_of, with_status

from ..agents import require_agent, token_agents
from ..auth import READ, WRITE
from ..errors import ERROR_RESPONSES, ApiError
from ..listing import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, lean, page, shown
from ..openapi import links
from ..schemas import (
    Cursor,
    WorkflowCancelOut,
    WorkflowCreate,
    WorkflowCreatedOut,
    WorkflowOut,
    WorkflowPage,
    WorkflowStatusName,
    WorkflowUpdate,
)

router = Router(tags=["workflows"])

Limit = Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE)]
LARGE_IN_LISTS = {"metadata": {}}  # see listing.lean


def _out(request: HttpRequest, workflows: list[Workflow]) -> list[dict[str, Any]]:
    progress = progress_of((w.id for w in workflows), token_agents(request))
    return [
        {
            "id": w.id,
            "name": w.name,
            "status": status_of(w, progress[w.id]),
            "open": w.open,
            "metadata": w.metadata,
            "metadata_ref": w.metadata_ref,
            "omitted": getattr(w, "omitted", []),
            "metadata_error": getattr(w, "metadata_error", None),
            "trace_id": w.trace_id,
            "progress": progress[w.id].counts,
            "total_tasks": progress[w.id].total,
            "cancelled_at": w.cancelled_at,
            "escalate_after_failures": w.escalate_after_failures,
            "escalate_after_seconds": w.escalate_after_seconds,
            "escalated_at": w.escalated_at,
            "escalation": w.escalation,
            "created_at": w.created_at,
            "updated_at": w.updated_at,
        }
        for w in workflows
    ]


def _visible(request: HttpRequest, workflows: QuerySet[Workflow]) -> QuerySet[Workflow]:
    """A bound token sees the workflows with a task of its agents."""
    agents = token_agents(request)
    if agents is None:
        return workflows
    return workflows.filter(
        Exists(Task.objects.filter(workflow_id=OuterRef("pk"), agent_name__in=agents))
    )


def _workflow(request: HttpRequest, workflow_id: UUID, *, for_update: bool = False) -> Workflow:
    workflows = Workflow.objects.select_for_update() if for_update else Workflow.objects
    workflow = _visible(request, workflows.filter(id=workflow_id)).first()
    if workflow is None:
        raise ApiError.not_found("workflow")
    return workflow


def _changeable(request: HttpRequest, workflow_id: UUID) -> Workflow:
    """The workflow locked, if the token may change it: a bound token only one whose
    every task is of its agents (a cancel cancels them all)."""
    workflow = _workflow(request, workflow_id, for_update=True)
    agents = token_agents(request)
    others = Task.objects.filter(workflow_id=workflow_id).exclude(agent_name__in=agents or [])
    if agents is not None and others.exists():
        require_agent(request, "workflow_id", others.values_list("agent_name", flat=True)[0],
                      "has tasks of an agent this token is not")  # fmt: skip
    return workflow


def _metadata_json(metadata: dict[str, Any]) -> str:
    """The metadata as JSON the queue stores (a 4xx naming the field if it cannot)."""
    try:
        return blobs.check_size(storable_json(metadata))
    except blobs.TooLarge as error:
        raise ApiError(
            413,
            "payload_too_large",
            f"metadata: over the limit of {error.limit} bytes as JSON",
            field_errors=[("metadata", "is too large")],
        ) from None
    except ValueError as error:
        raise ApiError.invalid("metadata", str(error)) from None


def _stored_metadata(metadata: dict[str, Any], text: str) -> dict[str, Any]:
    """The metadata's columns, in the transaction that writes them: a large one goes
    to a blob (task_queue.blobs), the row keeping {} and the reference."""
    _, ref = blobs.offload(text)
    return {"metadata": {} if ref else metadata, "metadata_ref": ref}


@router.post(
    "/workflows",
    auth=WRITE,
    response={201: WorkflowCreatedOut, **ERROR_RESPONSES},
    openapi_extra=links(
        "workflow_id",
        {
            "GetWorkflow": "get_workflow",
            "UpdateWorkflow": "update_workflow",
            "ResumeWorkflow": "resume_workflow",
            "CancelWorkflow": "cancel_workflow",
        },
    ),
)
def create_workflow(request: HttpRequest, body: WorkflowCreate):
    """The workflow and its first tasks, in one transaction: all or nothing.

    Without a ``trace_id``, a W3C ``traceparent`` header names the workflow's trace."""
    text = _metadata_json(body.metadata)
    header = request.headers.get("traceparent")
    with tracing.incoming(header) as parent, transaction.atomic():
        workflow = Workflow.objects.create(
            name=body.name,
            **_stored_metadata(body.metadata, text),
            open=body.open,
            trace_id=body.trace_id or (parent.trace_id if parent else None),
            escalate_after_failures=body.escalate_after_failures,
            escalate_after_seconds=body.escalate_after_seconds,
        )
        for index, task in enumerate(body.tasks):
            require_agent(request, f"tasks[{index}].agent_name", task.agent_name)
        specs = [
            # A task without a trace of its own joins the workflow's (enqueue_many).
            task.spec(workflow_id=workflow.id)
            for task in body.tasks
        ]
        results = operations.enqueue_many(specs, prefix="tasks")
    workflow.refresh_from_db()
    return Status(201, {**_out(request, [workflow])[0], "task_ids": [r.id for r in results]})


@router.get("/workflows", auth=READ, response={200: WorkflowPage, **ERROR_RESPONSES})
def list_workflows(
    request: HttpRequest,
    status: WorkflowStatusName | None = None,
    open: bool | None = None,
    cursor: Cursor | None = None,
    limit: Limit = DEFAULT_PAGE_SIZE,
):
    """Newest first, with each workflow's status and task counts. Large metadata is
    left out (named in ``omitted``): ``GET /workflows/{id}`` has it."""
    workflows = lean(_visible(request, Workflow.objects.all()), LARGE_IN_LISTS)
    if status is not None:
        workflows = with_status(workflows, status)
    if open is not None:
        workflows = workflows.filter(open=open)
    items, next_cursor = page(workflows, cursor=cursor, limit=limit)
    return {"items": _out(request, shown(items, LARGE_IN_LISTS)), "next_cursor": next_cursor}


@router.get("/workflows/{workflow_id}", auth=READ, response={200: WorkflowOut, **ERROR_RESPONSES})
def get_workflow(request: HttpRequest, workflow_id: UUID):
    """The workflow, with its metadata read back from its blob if it has one."""
    workflow = _workflow(request, workflow_id)
    try:
        workflow.metadata = blobs.payload_of(workflow.metadata, workflow.metadata_ref)
    except blobs.PayloadBlobError as error:
        workflow.metadata_error = str(error)
    return _out(request, [workflow])[0]


@router.patch(
    "/workflows/{workflow_id}", auth=WRITE, response={200: WorkflowOut, **ERROR_RESPONSES}
)
def update_workflow(request: HttpRequest, workflow_id: UUID, body: WorkflowUpdate):
    """Rename it, replace its metadata, or close it (``open: false``) once no more
    tasks will be added, so it completes when its tasks do."""
    changes = {k: v for k, v in body.model_dump(exclude_unset=True).items() if v is not None}
    text = _metadata_json(changes["metadata"]) if "metadata" in changes else None
    with transaction.atomic():
        workflow = _changeable(request, workflow_id)
        if workflow.cancelled_at is not None:
            raise ApiError.wrong_status("workflow", "cancelled", "change it")
        if text is not None:
            changes.update(_stored_metadata(changes["metadata"], text))
        for name, value in changes.items():
            setattr(workflow, name, value)
        if changes:
            workflow.updated_at = timezone.now()
            workflow.save(update_fields=[*changes, "updated_at"])
    return _out(request, [workflow])[0]


@router.post(
    "/workflows/{workflow_id}/cancel",
    auth=WRITE,
    response={200: WorkflowCancelOut, **ERROR_RESPONSES},
)
def cancel_workflow(request: HttpRequest, workflow_id: UUID):
    """Cancel its tasks that have not started (pending or leased); running ones finish.
    No task can be added to it afterwards."""
    with transaction.atomic():
        workflow = _changeable(request, workflow_id)
        if workflow.cancelled_at is not None:
            raise ApiError.wrong_status("workflow", "cancelled", "cancel it again")
        workflow.cancelled_at = workflow.updated_at = timezone.now()
        workflow.open = False
        workflow.save(update_fields=["cancelled_at", "updated_at", "open"])
        waiting = Task.objects.filter(
            workflow_id=workflow_id, status__in=[TaskStatus.PENDING, TaskStatus.LEASED]
        ).values_list("id", flat=True)
        cancelled = operations.cancel(list(waiting), actor=request.auth.actor, source="api")
    return {"cancelled_tasks": len(cancelled), "workflow": _out(request, [workflow])[0]}


@router.post(
    "/workflows/{workflow_id}/resume", auth=WRITE, response={200: WorkflowOut, **ERROR_RESPONSES}
)
def resume_workflow(request: HttpRequest, workflow_id: UUID):
    """Resume an escalated workflow: the orchestrator drives it again, and it never
    escalates again (its escalation stays recorded, with who resumed it)."""
    with transaction.atomic():
        workflow = _changeable(request, workflow_id)
        if workflow.escalated_at is None or workflow.cancelled_at is not None:
            status = status_of(workflow, progress_of([workflow.id])[workflow.id])
            raise ApiError.wrong_status("workflow", status, "resume it: it is not escalated")
        escalation.resume(workflow.id, actor=request.auth.actor, source="api")
    workflow.refresh_from_db()
    return _out(request, [workflow])[0]
