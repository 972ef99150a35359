import uuid

from django.contrib.postgres.functions import RandomUUID
from django.db import models
from django.db.models.functions import Now


class WorkflowStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    NEEDS_ATTENTION = "needs_attention"
    CANCELLED = "cancelled"


class Workflow(models.Model):
    """A unit of orchestrated work: the parent of the tasks the orchestrator creates."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, db_default=RandomUUID())
    name = models.TextField()
    status = models.TextField(
        choices=WorkflowStatus.choices,
        default=WorkflowStatus.PENDING,
        db_default=WorkflowStatus.PENDING,
    )
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "workflows"
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=WorkflowStatus.values), name="workflows_status_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"
