"""Recurring schedules: a task enqueued at every slot of a cron expression or interval.

The maintenance loop fires them (``task_queue.schedules``). A slot's task carries the
idempotency key ``schedule:<name>:<slot>``, so however many maintenance processes
run, a slot has one task.
"""

from django.db import models
from django.db.models.functions import Now

from .tasks import Priority


class Schedule(models.Model):
    class Missed(models.TextChoices):
        # Slots missed while nothing ran (maintenance down, the schedule paused):
        RUN_ONCE = "run_once", "Run the latest once"
        SKIP = "skip", "Skip to the next slot"

    class Source(models.TextChoices):
        CODE = "code", "Declared in settings"
        ADMIN = "admin", "Admin"
        API = "api", "API"
        DASHBOARD = "dashboard", "Dashboard"

    name = models.TextField(unique=True)
    # One of the two: a cron expression read in ``timezone``, or seconds between slots
    # (slots on multiples of the interval since the Unix epoch).
    cron = models.TextField(null=True, blank=True)
    interval_seconds = models.IntegerField(null=True, blank=True)
    timezone = models.TextField(default="UTC")
    agent_name = models.TextField()
    task_type = models.TextField()
    payload = models.JSONField(default=dict, blank=True)
    priority = models.SmallIntegerField(default=Priority.MEDIUM)
    max_attempts = models.IntegerField(null=True, blank=True)  # None: the agent's own
    enabled = models.BooleanField(default=True)
    missed = models.TextField(choices=Missed.choices, default=Missed.RUN_ONCE)
    source = models.TextField(choices=Source.choices, default=Source.API)
    last_run_at = models.DateTimeField(null=True, blank=True)  # the last slot fired
    next_run_at = models.DateTimeField(null=True, blank=True)
    # The last slot's task (no foreign key: retention deletes tasks on its own).
    last_task_id = models.UUIDField(null=True, blank=True)
    # Why the last slot made no task (an agent no longer registered, say), or "".
    last_error = models.TextField(default="", blank=True)
    # The last slot skipped, or fired past QUEUE_SCHEDULE_GRACE_SECONDS: when a
    # maintenance pass found it, and how late it then was (the schedule_missed alerts).
    late_at = models.DateTimeField(null=True, blank=True)
    late_by_seconds = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "schedules"
        ordering = ["name"]
        permissions = [("operate_schedule", "Can pause, resume and run schedules now")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(cron__isnull=True) ^ models.Q(interval_seconds__isnull=True),
                name="schedules_cron_or_interval",
            ),
            models.CheckConstraint(
                condition=models.Q(missed__in=["run_once", "skip"]), name="schedules_missed_valid"
            ),
        ]
        indexes = [
            # The maintenance loop's probe: enabled schedules by next slot.
            models.Index(
                fields=["next_run_at"],
                name="schedules_due_idx",
                condition=models.Q(enabled=True),
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def every(self) -> str:
        """How the schedule is written, for people: ``*/5 * * * * (Europe/Paris)``."""
        if self.cron:
            return f"{self.cron} ({self.timezone})"
        return f"every {self.interval_seconds} s"


class ScheduleRun(models.Model):
    """One fired slot (or a run now): the last ``RUNS_KEPT`` of each schedule are kept,
    for the dashboard's recent runs."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="runs")
    slot = models.DateTimeField()
    task_id = models.UUIDField(null=True, blank=True)
    manual = models.BooleanField(default=False)
    fired_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "schedule_runs"
        ordering = ["-slot", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "slot"], name="schedule_runs_one_per_slot")
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} @ {self.slot}"
