"""Agent memory: what agents did (AgentEvent) and the jobs that embed it (spec 001 §12).

Both are written, with the task's history row, by the statement that completes a
task. Their foreign keys have no database constraint: Django's are deferred, and
checking four of them per task at commit cost the completion path about 80 % of its
time (docs/architecture.md). The rows are inserted from the parent rows the same
statement returns. Retention (task_queue.maintenance.retention) deletes finished tasks before
their events, which are the agents' memory and kept longer: an event may then name a
task that is gone, so readers treat ``task_id`` as a reference, not a join.
"""

import uuid

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.functions import RandomUUID
from django.db import models
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Now
from pgvector.django import HnswIndex, VectorField

from .embeddings import DIMENSIONS


class AgentEvent(models.Model):
    """Something an agent did; written with every completed task."""

    task = models.ForeignKey(
        "queue.Task",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="agent_events",
        db_constraint=False,
    )
    workflow = models.ForeignKey(
        "queue.Workflow",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,
    )
    agent_name = models.TextField()
    event_type = models.TextField()
    content = models.TextField()
    data = models.JSONField(default=dict)
    # The task's result when it is a blob (task_queue.blobs): the event references it
    # rather than copying it into data.
    result_ref = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    # The content's embedding (agents_app.embeddings), filled by the embedding worker.
    embedding = VectorField(dimensions=DIMENSIONS, null=True, blank=True)

    class Meta:
        db_table = "agent_events"
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["agent_name", "created_at"], name="agent_events_agent_idx"),
            # Retention finds old events by time.
            models.Index(fields=["created_at"], name="agent_events_created_idx"),
            # Nearest neighbours by cosine distance (agents_app.memory.similar_events).
            HnswIndex(
                name="agent_events_embedding_hnsw",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
            ),
            # The blob collector's reference checks (task_queue.blobs.collection).
            models.Index(
                fields=["result_ref"],
                condition=models.Q(result_ref__isnull=False),
                name="agent_events_result_ref_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_name} {self.event_type} #{self.pk}"


class EmbeddingJobStatus(models.TextChoices):
    PENDING = "pending"
    LEASED = "leased"  # an embedder holds it
    COMPLETED = "completed"
    DEAD = "dead"  # attempts exhausted


class EmbeddingJob(models.Model):
    """A request to embed one AgentEvent into agent memory, consumed asynchronously."""

    agent_event = models.ForeignKey(
        AgentEvent, on_delete=models.CASCADE, related_name="embedding_jobs", db_constraint=False
    )
    status = models.TextField(
        choices=EmbeddingJobStatus.choices,
        default=EmbeddingJobStatus.PENDING,
        db_default=EmbeddingJobStatus.PENDING,
    )
    attempts = models.IntegerField(default=0, db_default=0)
    max_attempts = models.IntegerField(default=3, db_default=3)
    available_at = models.DateTimeField(db_default=Now())
    lease_owner = models.TextField(null=True, blank=True)
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    error_info = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "embedding_jobs"
        ordering = ["created_at"]
        indexes = [
            models.Index(
                fields=["available_at"],
                condition=models.Q(status="pending"),
                name="embedding_jobs_pending_idx",
            ),
            # Leases that ran out (agents_app.sql.memory.RECOVER_EMBEDDING_JOBS).
            models.Index(
                fields=["lease_expires_at"],
                condition=models.Q(status="leased"),
                name="embedding_jobs_leased_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"embedding job #{self.pk} ({self.status})"


class DailyReport(models.Model):
    """The AnalyticsAgent's report of one UTC day (``agents_app.analytics``); a
    partial one (the day was not over) is replaced when the report runs again."""

    day = models.DateField(primary_key=True)
    report = models.JSONField()
    partial = models.BooleanField()
    generated_at = models.DateTimeField(db_default=Now())
    # The task that wrote it (not a foreign key: retention prunes tasks, not reports).
    task_id = models.UUIDField(null=True, blank=True)

    class Meta:
        db_table = "daily_reports"
        ordering = ["-day"]
        permissions = [("run_daily_report", "Can run the daily report on demand")]

    def __str__(self) -> str:
        return f"daily report {self.day}{' (partial)' if self.partial else ''}"


class MessageType(models.TextChoices):
    TASK_REQUEST = "task_request"
    DATA_SHARE = "data_share"
    COMMAND = "command"
    RESPONSE = "response"
    NOTIFICATION = "notification"


class MessageStatus(models.TextChoices):
    PENDING = "pending"  # not received, or given back when its reader's lease ended
    DELIVERED = "delivered"  # received, not acknowledged: redelivered once visible again
    ACKNOWLEDGED = "acknowledged"
    EXPIRED = "expired"
    # Delivered MESSAGE_MAX_DELIVERIES times and never acknowledged (a poison message):
    # delivered no more until an operator revives it.
    FAILED = "failed"


class AgentMessage(models.Model):
    """A direct message from one agent to another (seed 002, pattern 1), delivered at
    least once: a receiver leases it for a visibility timeout and acknowledges it after
    processing; unacknowledged, it is delivered again (``agents_app.messaging``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, db_default=RandomUUID())
    from_agent = models.TextField()
    to_agent = models.TextField()
    message_type = models.TextField(choices=MessageType.choices)
    payload = models.JSONField(default=dict)
    # A payload too large for the row: its blob (task_queue.blobs); payload is then {}.
    payload_ref = models.TextField(null=True, blank=True)
    priority = models.IntegerField(default=5, db_default=5)  # 1–10, higher first
    status = models.TextField(
        choices=MessageStatus.choices, default=MessageStatus.PENDING, db_default="pending"
    )
    correlation_id = models.TextField(null=True, blank=True)
    reply_to = models.TextField(null=True, blank=True)  # the agent a response goes to
    metadata = models.JSONField(default=dict, blank=True)
    metadata_ref = models.TextField(null=True, blank=True)  # as payload_ref, for metadata
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()
    # When a receiver may have it (again): creation, then the end of each lease.
    visible_at = models.DateTimeField(db_default=Now())
    delivered_at = models.DateTimeField(null=True, blank=True)
    delivery_count = models.IntegerField(default=0, db_default=0)
    receipt = models.UUIDField(null=True, blank=True)  # the current delivery's, for ack
    acknowledged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "agent_messages"
        ordering = ["-created_at"]
        permissions = [
            ("revive_agentmessage", "Can revive failed messages and publication deliveries")
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(priority__gte=1, priority__lte=10),
                name="agent_messages_priority_range",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=MessageStatus.values),
                name="agent_messages_status_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(message_type__in=MessageType.values),
                name="agent_messages_type_valid",
            ),
        ]
        indexes = [
            models.Index(
                fields=["payload_ref"],
                condition=models.Q(payload_ref__isnull=False),
                name="agent_messages_payload_ref_idx",
            ),
            models.Index(
                fields=["metadata_ref"],
                condition=models.Q(metadata_ref__isnull=False),
                name="agent_messages_meta_ref_idx",
            ),
            # A mailbox in delivery order: priority, then arrival.
            models.Index(
                "to_agent",
                models.F("priority").desc(),
                "created_at",
                condition=models.Q(status__in=["pending", "delivered"]),
                name="agent_messages_mailbox_idx",
            ),
            models.Index(
                fields=["expires_at"],
                condition=models.Q(status__in=["pending", "delivered"]),
                name="agent_messages_open_expiry_idx",
            ),
            models.Index(
                fields=["correlation_id"],
                condition=models.Q(correlation_id__isnull=False),
                name="agent_messages_correlation_idx",
            ),
            # Retention of the finished ones; the API's listing of a mailbox.
            models.Index(
                fields=["expires_at"],
                condition=models.Q(status__in=["acknowledged", "expired", "failed"]),
                name="agent_messages_end_expiry_idx",
            ),
            models.Index(fields=["to_agent", "-created_at"], name="agent_messages_listing_idx"),
            # The messages of a trace (the task page): those that carry one.
            models.Index(
                KeyTransform("trace_id", "metadata"),
                condition=models.Q(metadata__has_key="trace_id"),
                name="agent_messages_trace_idx",
            ),
            # The failed ones, newest first (/messages/, GET /api/v1/messages?status=failed).
            models.Index(
                fields=["-created_at"],
                condition=models.Q(status="failed"),
                name="agent_messages_failed_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.message_type} {self.from_agent} → {self.to_agent} ({self.status})"


class Publication(models.Model):
    """An event an agent published (seed 002, pattern 2); fanned out at publish time
    to a delivery per matching subscription (``agents_app.pubsub``)."""

    id = models.BigAutoField(primary_key=True)
    publisher_agent = models.TextField()
    publisher_type = models.TextField(null=True, blank=True)
    publication_type = models.TextField(default="event")  # status_change, event, metric, …
    event_name = models.TextField()  # category.action, e.g. state.changed
    payload = models.JSONField(default=dict)
    # Too large for the row: their blobs (task_queue.blobs); the value is then {}.
    payload_ref = models.TextField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    metadata_ref = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "agent_publications"
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["expires_at"], name="agent_publications_expiry_idx"),
            models.Index(
                fields=["payload_ref"],
                condition=models.Q(payload_ref__isnull=False),
                name="agent_pubs_payload_ref_idx",
            ),
            models.Index(
                fields=["metadata_ref"],
                condition=models.Q(metadata_ref__isnull=False),
                name="agent_pubs_meta_ref_idx",
            ),
            # The publications of a trace (the task page): those that carry one.
            models.Index(
                KeyTransform("trace_id", "metadata"),
                condition=models.Q(metadata__has_key="trace_id"),
                name="agent_pubs_trace_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_name} by {self.publisher_agent} #{self.pk}"


class Subscription(models.Model):
    """What one agent wants to hear: publisher (id, type), an event-name glob and
    publication types; a None or empty filter matches anything."""

    id = models.BigAutoField(primary_key=True)
    subscriber_agent = models.TextField()
    name = models.TextField()
    publisher_agent = models.TextField(null=True, blank=True)
    publisher_type = models.TextField(null=True, blank=True)
    event_pattern = models.TextField(default="*")  # a glob: state.*, task.completed, *
    event_like = models.TextField()  # the glob as a LIKE pattern (escape: backslash)
    publication_types = ArrayField(models.TextField(), default=list, blank=True)
    active = models.BooleanField(default=True, db_default=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "agent_subscriptions"
        ordering = ["subscriber_agent", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["subscriber_agent", "name"], name="agent_subscriptions_name_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.subscriber_agent}/{self.name} ({self.event_pattern})"


class PublicationDelivery(models.Model):
    """One publication for one subscription: leased, acknowledged with a processing
    result, or expired with its publication."""

    id = models.BigAutoField(primary_key=True)
    subscription = models.ForeignKey(
        Subscription, on_delete=models.CASCADE, related_name="deliveries", db_constraint=False
    )
    publication = models.ForeignKey(
        Publication, on_delete=models.CASCADE, related_name="deliveries", db_constraint=False
    )
    expires_at = models.DateTimeField()  # the publication's, so reads need no join
    status = models.TextField(
        choices=MessageStatus.choices, default=MessageStatus.PENDING, db_default="pending"
    )
    visible_at = models.DateTimeField(db_default=Now())
    delivered_at = models.DateTimeField(null=True, blank=True)
    delivery_count = models.IntegerField(default=0, db_default=0)
    receipt = models.UUIDField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)  # what the subscriber made of it
    result_ref = models.TextField(null=True, blank=True)  # a result too large: its blob

    class Meta:
        db_table = "agent_publication_deliveries"
        constraints = [
            # Also a subscriber's deliveries in publication order.
            models.UniqueConstraint(
                fields=["subscription", "publication"], name="agent_deliveries_unique"
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=MessageStatus.values),
                name="agent_deliveries_status_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["publication"], name="agent_deliveries_pub_idx"),
            models.Index(
                fields=["result_ref"],
                condition=models.Q(result_ref__isnull=False),
                name="agent_deliv_result_ref_idx",
            ),
            models.Index(
                fields=["expires_at"],
                condition=models.Q(status__in=["pending", "delivered"]),
                name="agent_deliveries_open_exp_idx",
            ),
            models.Index(
                fields=["-publication"],
                condition=models.Q(status="failed"),
                name="agent_deliveries_failed_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"publication {self.publication_id} → subscription {self.subscription_id}"
