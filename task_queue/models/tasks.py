"""Tasks, the workflows that group them, and each task's history."""

import uuid
from typing import Any

from django.contrib.postgres.functions import RandomUUID
from django.db import models
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast, Now

PRIORITY_MIN = 0
PRIORITY_MAX = 9
MAX_ATTEMPTS_LIMIT = 100


class Priority(models.IntegerChoices):
    """The named levels of spec 001 §7; any integer in 0–9 is accepted, 0 runs first."""

    CRITICAL = 0
    HIGH = 1
    MEDIUM = 2
    LOW = 3


class TaskStatus(models.TextChoices):
    PENDING = "pending"
    LEASED = "leased"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"  # a non-retryable error
    DEAD = "dead"  # attempts exhausted
    CANCELLED = "cancelled"


HELD_STATUSES = (TaskStatus.LEASED, TaskStatus.RUNNING)
FINAL_STATUSES = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.DEAD, TaskStatus.CANCELLED)
REVIVABLE_STATUSES = (TaskStatus.DEAD, TaskStatus.FAILED)


class Workflow(models.Model):
    """A group of tasks an orchestrator creates together (the table ``workflows``).

    It lives in the queue, below the orchestrator, because the queue acts on it:
    enqueueing into a workflow locks its row and refuses a cancelled one, cancelling
    one cancels its tasks, and retention prunes a workflow with its tasks. Its status
    is not stored: it follows from its tasks (``workflows.progress``). What is stored
    is what the tasks cannot say: whether the orchestrator will add more tasks
    (``open``) and whether an operator cancelled it.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, db_default=RandomUUID())
    name = models.TextField()
    metadata = models.JSONField(default=dict, blank=True)
    # Metadata too large for the row: its blob (task_queue.blobs); metadata is then {}.
    metadata_ref = models.TextField(null=True, blank=True)
    # An open workflow expects more tasks (an orchestrator adds each step as the steps
    # before it complete), so it is not completed while open, even if all its tasks are.
    open = models.BooleanField(default=False, db_default=False)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    trace_id = models.TextField(null=True, blank=True)
    # Escalation (spec 001 §9, task_queue.escalation): the workflow escalates once
    # this many of its tasks are dead or failed, or when not completed at
    # ``escalate_at`` (created + escalate_after_seconds, set by a trigger at insert,
    # queue 0040; cleared once looked at).
    escalate_after_failures = models.PositiveIntegerField(null=True, blank=True)
    escalate_after_seconds = models.PositiveIntegerField(null=True, blank=True)
    escalate_at = models.DateTimeField(null=True, blank=True)
    # Escalated: until an operator resumes it (escalated_at cleared) or cancels it.
    escalated_at = models.DateTimeField(null=True, blank=True)
    # Why and when it escalated, and who resumed it: once set, it never escalates again.
    escalation = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "workflows"
        ordering = ["-created_at", "-id"]
        indexes = [
            # The blob collector's reference check (task_queue.blobs.collection).
            models.Index(
                fields=["metadata_ref"],
                condition=models.Q(metadata_ref__isnull=False),
                name="workflows_metadata_ref_idx",
            ),
            # The workflows of a trace (the task page).
            models.Index(fields=["trace_id"], name="workflows_trace_idx"),
            # The maintenance loop's deadline check, and the escalated ones (the
            # workflow_escalated alert rules, GET /api/v1/workflows?status=escalated).
            models.Index(
                fields=["escalate_at"],
                condition=models.Q(escalate_at__isnull=False),
                name="workflows_escalate_at_idx",
            ),
            models.Index(
                fields=["escalated_at"],
                condition=models.Q(escalated_at__isnull=False),
                name="workflows_escalated_idx",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(escalate_after_failures__gte=1),
                name="workflows_escalate_after_failures_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(escalate_after_seconds__gte=1),
                name="workflows_escalate_after_seconds_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        # A workflow is one trace, which its tasks join (task_queue.sql.enqueue). Given
        # none, it starts its own, named by its id as 32 hex digits (a W3C trace-id),
        # as a task that starts a trace is.
        if self.trace_id is None:
            self.trace_id = uuid.UUID(str(self.id)).hex
        super().save(*args, **kwargs)


class Task(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, db_default=RandomUUID())
    # Indexed by tasks_workflow_idx, which leaves out the tasks of no workflow.
    workflow = models.ForeignKey(
        Workflow,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="tasks",
        db_index=False,
    )
    agent_name = models.TextField()
    task_type = models.TextField()
    payload = models.JSONField(default=dict)
    # A payload too large for the row: its blob (task_queue.blobs); payload is then {}.
    payload_ref = models.TextField(null=True, blank=True)
    priority = models.IntegerField(default=Priority.MEDIUM, db_default=Priority.MEDIUM)
    status = models.TextField(
        choices=TaskStatus.choices, default=TaskStatus.PENDING, db_default=TaskStatus.PENDING
    )
    attempts = models.IntegerField(default=0, db_default=0)
    max_attempts = models.IntegerField(default=3, db_default=3)
    available_at = models.DateTimeField(db_default=Now())
    lease_owner = models.TextField(null=True, blank=True)
    # A fresh token per lease: every write a worker makes is fenced on owner + token,
    # so a worker whose lease expired cannot overwrite what another worker did.
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The length of the lease its claim granted: a heartbeat of the worker protocol over
    # HTTP, which names only the task, extends the lease by it.
    lease_seconds = models.FloatField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    error_info = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    # A result too large for the row: its blob; result is then null.
    result_ref = models.TextField(null=True, blank=True)
    idempotency_key = models.TextField(null=True, blank=True)
    # A hash of the request that created a keyed task: the same key with another
    # request is a conflict, even after the task's payload was edited.
    idempotency_fingerprint = models.TextField(null=True, blank=True)
    trace_id = models.TextField(null=True, blank=True)
    # The W3C trace context (traceparent) of the span that enqueued the task: its
    # spans' parent or link (task_queue.tracing); null without one.
    traceparent = models.TextField(null=True, blank=True)
    # How far the current (or last) attempt got, as its handler reported it
    # (TaskContext.progress): written by the worker's heartbeat, cleared by a claim.
    progress = models.FloatField(null=True, blank=True)
    progress_message = models.TextField(null=True, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "tasks"
        ordering = ["priority", "created_at"]
        permissions = [
            ("revive_task", "Can revive dead or failed tasks"),
            ("cancel_task", "Can cancel tasks"),
            ("pause_agent", "Can pause and resume an agent's queue"),
            ("limit_agent", "Can set an agent's concurrency and rate limits"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=TaskStatus.values), name="tasks_status_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="tasks_priority_range",
            ),
            models.CheckConstraint(
                condition=models.Q(max_attempts__gte=1), name="tasks_max_attempts_positive"
            ),
            # Partial: most tasks have no key, and a full index would take an entry
            # for every new row version the worker writes.
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="tasks_idempotency_key_unique",
            ),
        ]
        # Every index here takes an entry for each row version a worker writes (a
        # status change is never a HOT update), so there are as few as serve the
        # lease query, the due timer and the reaper; partial ones only for the
        # rows they cover.
        indexes = [
            # The lease query: pending tasks of an agent in priority, then age order.
            models.Index(
                fields=["agent_name", "priority", "created_at"],
                condition=models.Q(status=TaskStatus.PENDING),
                name="tasks_pending_lease_idx",
            ),
            # When the next pending task of an agent falls due (the worker's poll timer).
            models.Index(
                fields=["agent_name", "available_at"],
                condition=models.Q(status=TaskStatus.PENDING),
                name="tasks_pending_due_idx",
            ),
            # The reaper: held tasks whose lease has run out.
            models.Index(
                fields=["lease_expires_at"],
                condition=models.Q(status__in=HELD_STATUSES),
                name="tasks_held_lease_idx",
            ),
            # The latest finished tasks' latency (the overview, the metrics endpoint)
            # and retention: one entry per task, taken when it reaches its final status.
            models.Index(
                fields=["finished_at"],
                condition=models.Q(status__in=FINAL_STATUSES),
                name="tasks_finished_idx",
            ),
            # The admin's dead-letter section, newest death first (the dashboard's page
            # and the API read the dead letter's own table, task_queue.models.dead_letter).
            models.Index(
                fields=["finished_at"],
                condition=models.Q(status__in=REVIVABLE_STATUSES),
                name="tasks_dead_letter_idx",
            ),
            # The admin's dead-letter filters (agent, task type) and their counts, read
            # from the dead and failed tasks alone; a count by agent or task type reads
            # only the index (once vacuum marked the pages visible).
            models.Index(
                "agent_name",
                KeyTransform("type", "error_info"),
                "task_type",
                "finished_at",
                condition=models.Q(status__in=REVIVABLE_STATUSES),
                name="tasks_dead_letter_filter_idx",
            ),
            # Lists newest first (the API, the admin) without sorting the whole table.
            models.Index(fields=["created_at", "id"], name="tasks_created_idx"),
            # The tasks of a trace (GET /tasks?trace_id=, the task page), sorted after.
            # A trace a task starts is its time-ordered id, so new entries land at the
            # index's end; a workflow's tasks share one key, which the btree stores once
            # (deduplication). With created_at in the key it cost ~10 µs more of
            # PostgreSQL's CPU per task in queue_bench (docs/performance.md).
            models.Index(fields=["trace_id"], name="tasks_trace_idx"),
            # A workflow's tasks (its page, its counts, cancelling it, the cascade when
            # it is deleted). Tasks outside any workflow are left out: such a task
            # costs no entry here at its insert, nor at its claim and outcome, which
            # make new versions of its row (in a 1,000-task API request about 1 ms of
            # PostgreSQL's 21, docs/performance.md).
            models.Index(
                fields=["workflow"],
                condition=models.Q(workflow__isnull=False),
                name="tasks_workflow_idx",
            ),
            # The blob collector's reference checks: only rows that hold a blob.
            models.Index(
                fields=["payload_ref"],
                condition=models.Q(payload_ref__isnull=False),
                name="tasks_payload_ref_idx",
            ),
            models.Index(
                fields=["result_ref"],
                condition=models.Q(result_ref__isnull=False),
                name="tasks_result_ref_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}.{self.task_type} {self.id} ({self.status})"

    @property
    def cancel_awaited(self) -> bool:
        """Running, with a cancel requested: its worker ends it at the next heartbeat,
        or sooner, whatever ends the attempt (the flag means nothing on another status)."""
        return self.cancel_requested_at is not None and self.status == TaskStatus.RUNNING


def payload_text() -> Cast:
    """A task's payload as JSON text: what the payload search matches."""
    return Cast("payload", models.TextField())


def payload_contains(tasks: models.QuerySet, text: str) -> models.QuerySet:
    """``tasks`` whose payload, as JSON text, contains ``text`` in any case.

    Django writes this ``upper(payload::text) LIKE upper('%text%')``: the expression of
    the trigram index of migration ``queue 0010`` (where the server has pg_trgm), so
    every search of all tasks' payloads (the API's ``q``, the admin) must keep it to
    use that index. The dead letter's searches use
    :func:`~task_queue.models.dead_letter.dead_letter_payload_contains`.
    """
    return tasks.alias(payload_text=payload_text()).filter(payload_text__icontains=text)


class TaskEvent(models.TextChoices):
    """What a history row records."""

    COMPLETED = "completed"
    RETRY_SCHEDULED = "retry_scheduled"
    FAILED = "failed"
    DEAD = "dead"
    LEASE_EXPIRED = "lease_expired"
    RELEASED = "released"  # given back by a worker shutting down; no attempt counted
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLED = "cancelled"
    REVIVED = "revived"
    UPDATED = "updated"  # an operator changed a pending task (priority, payload, due time)


class TaskHistory(models.Model):
    """One row per finished attempt and per operator or reaper action.

    A worker attempt is one row written with its outcome, carrying the lease token
    and when the handler started, so pending → leased → running → outcome is
    recorded without a write per step on the hot path.
    """

    # No database constraint (agents_app/models.py says why): rows come from the same
    # statement that updates their task; deleting a task deletes them (ORM cascade).
    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="history", db_constraint=False
    )
    event = models.TextField(choices=TaskEvent.choices)
    from_status = models.TextField()
    to_status = models.TextField()
    attempt = models.IntegerField()
    # Who made the transition: a worker id ("host:pid") or an operator ("user:alice").
    actor = models.TextField(null=True, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # When the attempt was due (the task's available_at as it was claimed): its queue
    # wait is started_at - due_at. Set for attempts that completed or failed.
    due_at = models.DateTimeField(null=True, blank=True)
    occurred_at = models.DateTimeField(db_default=Now())
    error = models.JSONField(null=True, blank=True)
    detail = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "task_history"
        ordering = ["occurred_at", "id"]
        verbose_name_plural = "task history"
        # The metric rollups read a time range. (Not BRIN: retention frees old pages,
        # new rows land in them, and BRIN ranges then span everything.)
        indexes = [
            models.Index(fields=["occurred_at"], name="task_history_occurred_idx"),
            # The lease_expirations alert rules read the expirations of a window: as
            # many rows as expired, however busy the history is.
            models.Index(
                fields=["occurred_at"],
                condition=models.Q(event="lease_expired"),
                name="task_history_lease_expired_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} {self.event} (attempt {self.attempt})"


class DeadLetterTask(Task):
    """Dead and failed tasks: the admin's dead-letter section (a proxy, no table)."""

    class Meta:
        proxy = True
        verbose_name = "dead-letter task"


class WorkflowEscalationCheck(models.Model):
    """A workflow with a failure threshold had a task end dead or failed: the
    maintenance loop counts its failures (task_queue.escalation). Written by the
    history trigger, inside the failing transaction, without locking the workflow."""

    workflow_id = models.UUIDField()

    class Meta:
        db_table = "workflow_escalation_checks"
        indexes = [models.Index(fields=["workflow_id"], name="escalation_checks_workflow_idx")]

    def __str__(self) -> str:
        return f"check workflow {self.workflow_id}"
