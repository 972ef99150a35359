"""Live workers, their heartbeat history, and paused agents."""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now


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
