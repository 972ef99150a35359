"""The metric rollups and the record of retention passes."""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now

# The histograms' upper bounds (seconds). The database sorts values into slots by
# them with task_histogram_slot (migration queue 0029, which holds a copy): changing
# them takes a migration that replaces that function (a test checks they agree).
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


class RetentionRun(models.Model):
    """One retention pass that deleted something: how much of each kind."""

    ran_at = models.DateTimeField(db_default=Now())
    tasks = models.IntegerField(default=0)
    workflows = models.IntegerField(default=0)
    agent_events = models.IntegerField(default=0)
    stream_events = models.IntegerField(default=0, db_default=0)
    messages = models.IntegerField(default=0, db_default=0)  # and publications
    alert_notifications = models.IntegerField(default=0, db_default=0)
    alert_firings = models.IntegerField(default=0, db_default=0)

    class Meta:
        db_table = "retention_runs"
        ordering = ["-ran_at"]
        # The overview sums the last day's every second while it is open.
        indexes = [models.Index(fields=["ran_at"], name="retention_runs_ran_at_idx")]

    def __str__(self) -> str:
        return f"{self.ran_at:%Y-%m-%d %H:%M}: {self.tasks} tasks, {self.agent_events} events"
