"""Workflows: the units of orchestrated work, parents of the tasks an orchestrator creates.

A workflow's status is not stored: it follows from its tasks (``workflows.progress``),
so it is never stale and the worker's completion path never writes a workflow row.
What is stored is what the tasks cannot say: whether the orchestrator will add more
tasks (``open``) and whether an operator cancelled it.
"""

import uuid

from django.contrib.postgres.functions import RandomUUID
from django.db import models
from django.db.models.functions import Now


class WorkflowStatus(models.TextChoices):
    PENDING = "pending"  # no task yet
    RUNNING = "running"
    COMPLETED = "completed"
    NEEDS_ATTENTION = "needs_attention"  # a task is dead or failed
    CANCELLED = "cancelled"


class Workflow(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, db_default=RandomUUID())
    name = models.TextField()
    metadata = models.JSONField(default=dict, blank=True)
    # An open workflow expects more tasks (an orchestrator adds each step as the steps
    # before it complete), so it is not completed while open, even if all its tasks are.
    open = models.BooleanField(default=False, db_default=False)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    trace_id = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "workflows"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name
