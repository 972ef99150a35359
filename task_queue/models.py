"""The queue's tables: tasks, their history, live workers and metric rollups.

Django owns the schema (migrations, admin); reading and writing tasks on the hot
path goes through the named SQL in ``task_queue.queries``.
"""

import uuid

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.functions import RandomUUID
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models.functions import Now

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


class Task(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, db_default=RandomUUID())
    workflow = models.ForeignKey(
        "workflows.Workflow", null=True, blank=True, on_delete=models.CASCADE, related_name="tasks"
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
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    error_info = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    idempotency_key = models.TextField(null=True, blank=True)
    # A hash of the request that created a keyed task: the same key with another
    # request is a conflict, even after the task's payload was edited.
    idempotency_fingerprint = models.TextField(null=True, blank=True)
    trace_id = models.TextField(null=True, blank=True)
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
            # Throughput and latency over the last minutes (the metrics endpoint): one
            # entry per task, taken when it reaches its final status.
            models.Index(
                fields=["finished_at"],
                condition=models.Q(status__in=FINAL_STATUSES),
                name="tasks_finished_idx",
            ),
            # The dead-letter page, newest death first.
            models.Index(
                fields=["finished_at"],
                condition=models.Q(status__in=REVIVABLE_STATUSES),
                name="tasks_dead_letter_idx",
            ),
            # Lists newest first (the API, the admin) without sorting the whole table.
            models.Index(fields=["created_at", "id"], name="tasks_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}.{self.task_type} {self.id} ({self.status})"


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
        indexes = [models.Index(fields=["occurred_at"], name="task_history_occurred_idx")]

    def __str__(self) -> str:
        return f"{self.task_id} {self.event} (attempt {self.attempt})"


class Worker(models.Model):
    """A live worker process, upserted by its heartbeat and removed when it exits."""

    worker_id = models.TextField(primary_key=True)
    hostname = models.TextField()
    pid = models.IntegerField()
    agents = ArrayField(models.TextField())
    concurrency = models.IntegerField()
    in_flight = models.IntegerField(default=0)
    memory_bytes = models.BigIntegerField(null=True, blank=True)  # resident set size
    started_at = models.DateTimeField(db_default=Now())
    last_heartbeat_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "workers"
        ordering = ["worker_id"]

    def __str__(self) -> str:
        return self.worker_id


# Seconds: the upper bounds of the queue-wait and run-time histogram slots.
HISTOGRAM_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class TaskQueueMetric(models.Model):
    """A rollup of queue activity for one agent over one closed time bucket (spec 001
    §11): one minute, one hour or one day (``bucket_seconds``), computed by
    ``task_queue.metrics`` from ``tasks``, ``task_history`` and ``worker_heartbeats``.
    Recomputing a bucket replaces its rows with the same figures. A bucket in which
    an agent did nothing has no row."""

    bucket_start = models.DateTimeField()
    bucket_seconds = models.IntegerField()
    agent_name = models.TextField()
    tasks_created = models.IntegerField(default=0)
    tasks_completed = models.IntegerField(default=0)
    # Attempts that failed for good (a non-retryable error), that used up the last
    # attempt (dead), that will be retried, and tasks cancelled.
    tasks_failed = models.IntegerField(default=0)
    tasks_dead = models.IntegerField(default=0)
    tasks_retried = models.IntegerField(default=0)
    tasks_cancelled = models.IntegerField(default=0)
    attempts = models.IntegerField(default=0)  # attempts that ended in the bucket
    # Queue wait (due → started, of tasks finished in the bucket): mean, p50, p95.
    average_latency = models.FloatField(null=True, blank=True)
    queue_wait_p50 = models.FloatField(null=True, blank=True)
    queue_wait_p95 = models.FloatField(null=True, blank=True)
    # Run time (started → ended, of attempts that ended in the bucket).
    run_time_average = models.FloatField(null=True, blank=True)
    run_time_p50 = models.FloatField(null=True, blank=True)
    run_time_p95 = models.FloatField(null=True, blank=True)
    # Histograms for Prometheus: counts per slot of HISTOGRAM_BOUNDS (slot i holds
    # values from bound i-1 up to bound i; the last, those beyond the last bound).
    queue_wait_histogram = ArrayField(models.IntegerField(), default=list)
    queue_wait_sum = models.FloatField(default=0)
    run_time_histogram = ArrayField(models.IntegerField(), default=list)
    run_time_sum = models.FloatField(default=0)
    # The longest gap between two heartbeats of a worker serving the agent (seconds).
    worker_heartbeat_delay = models.FloatField(null=True, blank=True)
    # Error class → {"count": failed attempts, "rate": share of the bucket's attempts}.
    error_rates_per_agent = models.JSONField(default=dict)

    class Meta:
        db_table = "task_queue_metrics"
        ordering = ["-bucket_start", "agent_name"]
        constraints = [
            models.UniqueConstraint(
                fields=["bucket_seconds", "bucket_start", "agent_name"],
                name="task_queue_metrics_bucket_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.agent_name} {self.bucket_start:%Y-%m-%d %H:%M} ({self.bucket_seconds} s)"


class RollupProgress(models.Model):
    """How far each bucket width has been rolled up: every bucket that starts before
    ``computed_until`` is in ``task_queue_metrics``."""

    bucket_seconds = models.IntegerField(primary_key=True)
    computed_until = models.DateTimeField()

    class Meta:
        db_table = "metrics_rollup_progress"

    def __str__(self) -> str:
        return f"{self.bucket_seconds} s buckets until {self.computed_until}"


class WorkerHeartbeat(models.Model):
    """Each worker's heartbeats per minute: how many, and the longest gap since the
    one before. One row per worker and minute, written by the heartbeat (never on a
    task's completion path), so heartbeat delay is history, not a snapshot."""

    pk = models.CompositePrimaryKey("worker_id", "minute")
    worker_id = models.TextField()
    minute = models.DateTimeField()
    agents = ArrayField(models.TextField())
    beats = models.IntegerField()
    max_gap_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        db_table = "worker_heartbeats"
        indexes = [models.Index(fields=["minute"], name="worker_heartbeats_minute_idx")]

    def __str__(self) -> str:
        return f"{self.worker_id} {self.minute:%Y-%m-%d %H:%M}: {self.beats} beats"


class PausedAgent(models.Model):
    """An agent whose queue is paused: workers lease none of its tasks until it is resumed.

    The lease query skips paused agents itself, so a pause takes effect at every
    worker's next claim, without any worker having to be told.
    """

    agent_name = models.TextField(primary_key=True)
    paused_by = models.TextField()
    paused_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "paused_agents"
        ordering = ["agent_name"]

    def __str__(self) -> str:
        return f"{self.agent_name} (paused by {self.paused_by})"


class OperatorAction(models.Model):
    """The audit log: one row per operator action, from the dashboard, the admin or the API.

    Written in the transaction that makes the change, so the log cannot miss an
    action that happened nor show one that rolled back.
    """

    class Kind(models.TextChoices):
        REVIVE = "revive", "Revive"
        EDIT_AND_REVIVE = "edit_and_revive", "Edit payload and revive"
        EDIT = "edit", "Edit"
        CANCEL = "cancel", "Cancel"
        RUN_NOW = "run_now", "Run now"
        PAUSE = "pause", "Pause agent"
        RESUME = "resume", "Resume agent"

    actor = models.TextField()  # "user:alice", "token:orchestrator"
    action = models.TextField(choices=Kind.choices)
    # Where it came from: "dashboard", "admin" or "api".
    source = models.TextField()
    task_ids = ArrayField(models.UUIDField(), default=list, blank=True)
    agent_name = models.TextField(null=True, blank=True)
    # For a bulk action on every task a filter matched: the filter, as the operator set it.
    matched_filter = models.JSONField(null=True, blank=True)
    # What changed: {"payload": {"diff": "...unified diff..."}, "priority": {...}}.
    changes = models.JSONField(default=dict, blank=True)
    occurred_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "operator_actions"
        ordering = ["-occurred_at", "-id"]
        indexes = [
            # "Operator actions" on a task's page: the rows whose task_ids contain it.
            GinIndex(fields=["task_ids"], name="operator_actions_tasks_idx"),
            models.Index(fields=["-occurred_at"], name="operator_actions_time_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} ×{len(self.task_ids)} at {self.occurred_at}"


class DeadLetterTask(Task):
    """Dead and failed tasks: the admin's dead-letter section (a proxy, no table)."""

    class Meta:
        proxy = True
        verbose_name = "dead-letter task"


class RetentionRun(models.Model):
    """One retention pass that deleted something: how much of each kind."""

    ran_at = models.DateTimeField(db_default=Now())
    tasks = models.IntegerField(default=0)
    workflows = models.IntegerField(default=0)
    agent_events = models.IntegerField(default=0)
    stream_events = models.IntegerField(default=0, db_default=0)

    class Meta:
        db_table = "retention_runs"
        ordering = ["-ran_at"]
        # The overview sums the last day's every second while it is open.
        indexes = [models.Index(fields=["ran_at"], name="retention_runs_ran_at_idx")]

    def __str__(self) -> str:
        return f"{self.ran_at:%Y-%m-%d %H:%M}: {self.tasks} tasks, {self.agent_events} events"


class OutboxEvent(models.Model):
    """One envelope of the event stream (seed 000 §3), written by triggers in the same
    transaction as the change it records: a task's creation, claim and every history
    row, a direct message sent, acknowledged or expired, a publication.

    ``seq`` is taken at insert, so a transaction that commits late can hold a lower
    ``seq`` than one already read. Readers therefore go by ``position``, which one
    sequencer at a time gives to committed events in ``seq`` order
    (``task_queue.event_stream.sequence``): a reader resuming after a position never
    misses an event, and a task's events keep the order they happened in.
    """

    seq = models.BigAutoField(primary_key=True)
    position = models.BigIntegerField(null=True, blank=True)
    schema_version = models.TextField(db_default="v1")
    message_id = models.UUIDField(db_default=RandomUUID())
    kind = models.TextField()  # evt.task.completed.v1, evt.message.sent.v1, …
    trace_id = models.TextField(null=True, blank=True)
    causation_id = models.TextField(null=True, blank=True)
    # What the event is about: a task, message or publication id.
    subject_id = models.TextField()
    emitted_at = models.DateTimeField(db_default=Now())
    payload = models.JSONField(default=dict)

    class Meta:
        db_table = "event_outbox"
        ordering = ["position"]
        constraints = [
            # Partial: a new event (no position yet) costs this index nothing.
            models.UniqueConstraint(
                fields=["position"],
                condition=models.Q(position__isnull=False),
                name="event_outbox_position_key",
            )
        ]
        indexes = [
            # The sequencer's work list: committed events without a position yet.
            models.Index(
                fields=["seq"],
                name="event_outbox_unpositioned_idx",
                condition=models.Q(position__isnull=True),
            ),
            models.Index(fields=["emitted_at"], name="event_outbox_emitted_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.position or '-'} {self.kind} {self.subject_id}"


class EventRelayCursor(models.Model):
    """How far ``relay_events`` has relayed the stream to one broker, with confirms."""

    destination = models.TextField(primary_key=True)  # the broker URL without credentials
    position = models.BigIntegerField(default=0)
    relayed = models.BigIntegerField(default=0)  # events confirmed, in all runs
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "event_relay_cursors"

    def __str__(self) -> str:
        return f"{self.destination} at {self.position}"
