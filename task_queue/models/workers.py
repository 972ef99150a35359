"""Live workers, their heartbeat history, paused agents and agent limits."""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now


class WorkerState(models.TextChoices):
    IDLE = "idle"  # running no task
    BUSY = "busy"  # running tasks (task_ids)
    DRAINING = "draining"  # stopping: takes no new task, lets its running ones finish


class WorkerKind(models.TextChoices):
    LOCAL = "local"  # a runworker process of this project, on the database
    REMOTE = "remote"  # an agent elsewhere, over the HTTP API's worker protocol


class Worker(models.Model):
    """A live worker, upserted by its heartbeat and removed when it exits (or
    forgotten once its heartbeats stop)."""

    worker_id = models.TextField(primary_key=True)
    hostname = models.TextField()
    pid = models.IntegerField()
    agents = ArrayField(models.TextField())
    concurrency = models.IntegerField()
    in_flight = models.IntegerField(default=0)
    memory_bytes = models.BigIntegerField(null=True, blank=True)  # resident set size
    state = models.TextField(choices=WorkerState.choices, db_default=WorkerState.IDLE)
    # The tasks it holds, as of its last heartbeat (or its change of state).
    # A database default: a worker of the release before, which does not write the
    # column, still registers during a rolling upgrade.
    task_ids = ArrayField(models.UUIDField(), default=list, db_default=[], blank=True)
    started_at = models.DateTimeField(db_default=Now())
    last_heartbeat_at = models.DateTimeField(db_default=Now())
    # A database default, as task_ids: a worker of the release before still registers.
    kind = models.TextField(choices=WorkerKind.choices, db_default=WorkerKind.LOCAL)

    class Meta:
        db_table = "workers"
        ordering = ["worker_id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__in=WorkerKind.values), name="workers_kind_valid"
            )
        ]

    def __str__(self) -> str:
        return self.worker_id


# Seconds: the upper bounds of the queue-wait and run-time histogram slots.


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


# Bounds of a limit: beyond them a value is almost surely a mistake (and the rate
# window's log, agent_starts, holds up to rate_count rows per agent).
MAX_CONCURRENCY_LIMIT = 100_000
MAX_RATE_COUNT = 100_000
MAX_RATE_PERIOD_SECONDS = 7 * 24 * 3600


class AgentLimits(models.Model):
    """Cluster-wide limits on one agent's tasks, enforced by the lease query itself.

    - ``concurrency_limit``: at most this many of the agent's tasks leased or running
      across every worker;
    - ``rate_count`` per ``rate_period_seconds``: at most this many starts in any
      window of that length (a sliding window over the log ``agent_starts``).

    An agent without limits has no row (so the claim of an unlimited agent looks up
    an empty index and takes no lock). Changed through ``task_queue.limits``, which
    writes the audit log and wakes the agent's workers.
    """

    agent_name = models.TextField(primary_key=True)
    concurrency_limit = models.IntegerField(null=True, blank=True)
    rate_count = models.IntegerField(null=True, blank=True)
    rate_period_seconds = models.IntegerField(null=True, blank=True)
    updated_by = models.TextField()
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "agent_limits"
        ordering = ["agent_name"]
        verbose_name = "agent limits"
        verbose_name_plural = "agent limits"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(concurrency_limit__isnull=True)
                | models.Q(concurrency_limit__gte=1, concurrency_limit__lte=MAX_CONCURRENCY_LIMIT),
                name="agent_limits_concurrency_range",
            ),
            models.CheckConstraint(
                condition=models.Q(rate_count__isnull=True, rate_period_seconds__isnull=True)
                | models.Q(
                    rate_count__gte=1,
                    rate_count__lte=MAX_RATE_COUNT,
                    rate_period_seconds__gte=1,
                    rate_period_seconds__lte=MAX_RATE_PERIOD_SECONDS,
                ),
                name="agent_limits_rate_range",
            ),
            models.CheckConstraint(
                condition=models.Q(concurrency_limit__isnull=False)
                | models.Q(rate_count__isnull=False),
                name="agent_limits_some_limit",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_name} limits"
