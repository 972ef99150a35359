"""The parts of pages that change live, each rendered the same way by the page's
view and by the live hub that pushes it over the WebSocket (htmx swaps it by id)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.paginator import Paginator
from django.template.loader import render_to_string
from django.utils import timezone

from task_queue.models import REVIVABLE_STATUSES, OperatorAction, Task, TaskStatus, Workflow
from workflows.progress import progress_of, status_of

from . import charts
from .overview import Snapshot, worker_lines

OVERVIEW = "dashboard/_overview_live.html"
WORKERS = "dashboard/_workers_live.html"
TASK = "dashboard/_task_live.html"
WORKFLOWS = "dashboard/_workflows_live.html"
WORKFLOW = "dashboard/_workflow_live.html"
WORKFLOWS_PAGE_SIZE = 50
WORKFLOW_TASKS_SHOWN = 500

User = AbstractBaseUser | AnonymousUser


def overview_context(snapshot: Snapshot, *, can_pause: bool, can_limit: bool) -> dict[str, Any]:
    return {
        "snapshot": snapshot,
        "can_pause": can_pause,
        "can_limit": can_limit,
        "throughput_chart": charts.per_minute_bars(
            [(m, done) for m, done, _ in snapshot.minutes],
            title="completed",
            css_class="chart-done",
        ),
        "failure_chart": charts.per_minute_bars(
            [(m, failed) for m, _, failed in snapshot.minutes],
            title="failed or dead",
            css_class="chart-failed",
        ),
        "retention_days": settings.QUEUE_RETENTION_DAYS,
        "event_retention_days": settings.AGENT_EVENT_RETENTION_DAYS,
    }


def render_overview(snapshot: Snapshot, *, can_pause: bool, can_limit: bool) -> str:
    return render_to_string(
        OVERVIEW, overview_context(snapshot, can_pause=can_pause, can_limit=can_limit)
    )


def overview_variant(*, can_pause: bool, can_limit: bool) -> str:
    """The key of the overview as rendered for a user with these permissions (the
    live hub renders each variant once per tick)."""
    return f"overview_pause{int(can_pause)}_limit{int(can_limit)}"


def workers_context() -> dict[str, Any]:
    now = timezone.now()
    return {
        "workers": worker_lines(now),
        "now": now,
        "stale_worker_seconds": settings.QUEUE_STALE_WORKER_SECONDS,
    }


def render_workers() -> str:
    return render_to_string(WORKERS, workers_context())


def task_context(task: Task, user: User) -> dict[str, Any]:
    """The task with its attempts, history, workflow and the actions ``user`` may take."""
    history = list(task.history.all())
    workflow_status = None
    if task.workflow_id:
        progress = progress_of([task.workflow_id])[task.workflow_id]
        workflow_status = status_of(task.workflow, progress)
    revivable = task.status in REVIVABLE_STATUSES
    pending = task.status == TaskStatus.PENDING
    return {
        "task": task,
        "history": history,
        "workflow_status": workflow_status,
        "actions": OperatorAction.objects.filter(task_ids__contains=[task.id])[:50],
        "can_revive": revivable and user.has_perm("queue.revive_task"),
        "can_edit": (revivable or pending) and user.has_perm("queue.revive_task"),
        "can_run_now": pending
        and task.available_at > timezone.now()
        and user.has_perm("queue.revive_task"),
        "can_cancel": task.status not in (TaskStatus.COMPLETED, TaskStatus.CANCELLED)
        and not task.cancel_awaited
        and user.has_perm("queue.cancel_task"),
    }


def load_task(task_id: UUID) -> Task | None:
    return Task.objects.select_related("workflow").filter(id=task_id).first()


def render_task(task: Task, user: User) -> str:
    return render_to_string(TASK, task_context(task, user))


def workflows_context(page_number: Any = 1) -> dict[str, Any]:
    """A page of workflows, newest first, each with its progress and status."""
    # The page shows no metadata: it stays in the database.
    workflows = Workflow.objects.defer("metadata")
    page = Paginator(workflows, WORKFLOWS_PAGE_SIZE).get_page(page_number)
    progress = progress_of(w.id for w in page)
    rows = [(w, progress[w.id], status_of(w, progress[w.id])) for w in page]
    return {"page": page, "rows": rows}


def render_workflows() -> str:
    return render_to_string(WORKFLOWS, workflows_context())


def workflow_context(workflow: Workflow) -> dict[str, Any]:
    progress = progress_of([workflow.id])[workflow.id]
    return {
        "workflow": workflow,
        "progress": progress,
        "status": status_of(workflow, progress),
        "tasks": workflow.tasks.order_by("created_at", "id")[:WORKFLOW_TASKS_SHOWN],
    }


# Who sees (and may press) an escalated workflow's Resume button.
RESUME_PERMISSION = "workflows.change_workflow"


def render_workflow_variants(
    workflow_id: UUID, rights: tuple[bool, ...] = (True, False)
) -> dict[str, str] | None:
    """The workflow fragment with and without its Resume button (shown with
    ``workflows.change_workflow``; ``rights``: which), from one reading, keyed by
    ``workflow_variant``; None for no such workflow."""
    workflow = Workflow.objects.filter(id=workflow_id).first()
    if workflow is None:
        return None
    context = workflow_context(workflow)
    return {
        workflow_variant(can_resume): render_to_string(
            WORKFLOW, {**context, "can_resume": can_resume}
        )
        for can_resume in rights
    }


def workflow_variant(can_resume: bool) -> str:
    return f"resume{int(can_resume)}"
