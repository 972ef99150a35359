"""A workflow's progress (its tasks by status) and the status that follows from it.

Spec 001 §9: completed when all its tasks are (and no more are coming: not
``open``); needs attention while one is dead or failed, and running again once
revived; cancelled by an operator. Derived on read, so it is never stale, except
escalated, which the queue records (``task_queue.escalation``): it holds until an
operator resumes or cancels the workflow, whatever its tasks do meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from uuid import UUID

from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from task_queue.models import Task, TaskStatus, Workflow

from .models import WorkflowStatus

ATTENTION = (TaskStatus.DEAD, TaskStatus.FAILED)
DONE = (TaskStatus.COMPLETED, TaskStatus.CANCELLED)


@dataclass(frozen=True)
class Progress:
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def progress_of(
    workflow_ids: Iterable[UUID], agents: Sequence[str] | None = None
) -> dict[UUID, Progress]:
    """Task counts by status (every status present, zeros included) per workflow; only
    of the tasks of ``agents`` when given (what a token bound to them may see)."""
    counts = {wid: dict.fromkeys(TaskStatus.values, 0) for wid in workflow_ids}
    tasks = Task.objects.filter(workflow_id__in=list(counts))
    if agents is not None:
        tasks = tasks.filter(agent_name__in=list(agents))
    rows = tasks.order_by().values_list("workflow_id", "status").annotate(n=Count("id"))
    for workflow_id, status, n in rows:
        counts[workflow_id][status] = n
    return {wid: Progress(c) for wid, c in counts.items()}


def status_of(workflow: Workflow, progress: Progress) -> str:
    counts = progress.counts
    if workflow.cancelled_at is not None:
        return WorkflowStatus.CANCELLED
    if workflow.escalated_at is not None:
        return WorkflowStatus.ESCALATED
    if any(counts[s] for s in ATTENTION):
        return WorkflowStatus.NEEDS_ATTENTION
    if progress.total == 0:
        return WorkflowStatus.PENDING
    if not workflow.open and all(counts[s] == 0 for s in counts if s not in DONE):
        return WorkflowStatus.COMPLETED
    return WorkflowStatus.RUNNING


def with_status(workflows: QuerySet, status: str) -> QuerySet:
    """``workflows`` narrowed to those whose derived status is ``status`` (in SQL)."""
    tasks = Task.objects.filter(workflow_id=OuterRef("pk"))
    has_tasks = Exists(tasks)
    attention = Exists(tasks.filter(status__in=ATTENTION))
    unfinished = Exists(tasks.exclude(status__in=DONE))
    cancelled = Q(cancelled_at__isnull=False)
    escalated = ~cancelled & Q(escalated_at__isnull=False)
    live = ~cancelled & Q(escalated_at__isnull=True)
    conditions = {
        WorkflowStatus.CANCELLED: cancelled,
        WorkflowStatus.ESCALATED: escalated,
        WorkflowStatus.NEEDS_ATTENTION: live & attention,
        WorkflowStatus.PENDING: live & ~has_tasks,
        WorkflowStatus.COMPLETED: live & ~attention & has_tasks & Q(open=False) & ~unfinished,
        WorkflowStatus.RUNNING: live & ~attention & has_tasks & (Q(open=True) | unfinished),
    }
    return workflows.filter(conditions[WorkflowStatus(status)])
