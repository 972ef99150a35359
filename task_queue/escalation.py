"""Workflow escalation (spec 001 §9): a workflow created with
``escalate_after_failures`` escalates once that many of its tasks are dead or failed,
and one with ``escalate_after_seconds`` when it is not completed (nor cancelled) that
long after its creation: running, waiting on a dead task, or with no task yet. An
escalated workflow shows as ``escalated`` (``workflows.progress``), emits
``evt.workflow.escalated.v1`` on the event stream, fires the ``workflow_escalated``
alert rules, is kept by retention, and the reference orchestrator stops driving it
until an operator resumes it (``resume``) or cancels it.

A workflow escalates at most once: after a resume the thresholds no longer apply
(the operator has looked at it). The maintenance loop escalates (``escalate_due``),
so the failing transaction never waits for the workflow's row.
"""

from __future__ import annotations

from uuid import UUID

from django.db import transaction

from task_queue import audit
from task_queue.models import OperatorAction
from task_queue.sql import escalation as escalation_sql

# Check rows (each a failure) and past deadlines taken per pass; the rest wait for the
# next pass.
BATCH = 500


def escalate_due(*, limit: int = BATCH) -> list[UUID]:
    """Escalate the workflows over their failure threshold or past their deadline
    (up to ``limit`` looked at for each); the ones escalated."""
    with transaction.atomic():
        escalations = {
            workflow: {"reason": "failures", "failures": failures, "threshold": threshold}
            for workflow, failures, threshold in escalation_sql.workflows_over_their_failures(
                limit=limit
            )
        }
        for workflow, seconds, running in escalation_sql.workflows_past_their_deadline(limit=limit):
            if running and workflow not in escalations:
                escalations[workflow] = {"reason": "running_too_long", "seconds": seconds}
        return escalation_sql.escalate(escalations)


def resume(workflow_id: UUID, *, actor: str, source: str) -> bool:
    """Resume an escalated workflow (audited); False if it was not escalated."""
    with transaction.atomic():
        resumed = escalation_sql.resume(workflow_id, actor)
        if resumed:
            audit.record(
                actor=actor,
                action=OperatorAction.Kind.RESUME_WORKFLOW,
                source=source,
                changes={"workflow": str(workflow_id)},
            )
    return resumed
