"""The orchestrator's view of workflows: their derived status, and the admin's model.

The table and its model live in the queue (``task_queue.models.Workflow``), which acts
on workflows when it enqueues, cancels and prunes. ``Workflow`` here is a proxy of it,
so that the admin's pages and the ``workflows.*_workflow`` permissions keep the names
they had when the model lived in this app.
"""

from django.db import models

from task_queue.models import Workflow as QueueWorkflow


class WorkflowStatus(models.TextChoices):
    PENDING = "pending"  # no task yet
    RUNNING = "running"
    COMPLETED = "completed"
    NEEDS_ATTENTION = "needs_attention"  # a task is dead or failed
    ESCALATED = "escalated"  # past a threshold it set, until resumed (task_queue.escalation)
    CANCELLED = "cancelled"


class Workflow(QueueWorkflow):
    class Meta:
        proxy = True
        verbose_name = "workflow"
