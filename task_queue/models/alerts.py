"""Alert rules and what they sent (spec 001 §9, issue 35): a rule watches one condition
of the queue, per agent; the maintenance loop evaluates the rules
(``task_queue.alerts.evaluation``), and a rule that starts or stops holding for an
agent makes a notification, delivered to each of the rule's channels
(``task_queue.alerts.delivery``)."""

from django.db import models
from django.db.models.functions import Now

from .schedules import Schedule


class AlertKind(models.TextChoices):
    DEAD_LETTER = "dead_letter"  # tasks that ended dead or failed in the window
    FAILURE_RATE = "failure_rate"  # failed or dead ÷ finished in the window
    BACKLOG_AGE = "backlog_age"  # seconds the oldest due pending task has waited
    NO_WORKERS = "no_workers"  # due tasks and no live worker (1: holds)
    LEASE_EXPIRATIONS = "lease_expirations"  # leases the reaper took back in the window
    SCHEDULE_MISSED = "schedule_missed"  # seconds a slot was late (or skipped) in the window
    # A workflow escalated (task_queue.escalation), until resumed or cancelled; each
    # such workflow fires on its own (the state's and notification's workflow_id).
    WORKFLOW_ESCALATED = "workflow_escalated"


class AlertRule(models.Model):
    name = models.TextField(unique=True)
    kind = models.TextField(choices=AlertKind.choices)
    # None: every agent, each on its own (a rule fires and resolves per agent).
    agent = models.TextField(null=True, blank=True)
    threshold = models.FloatField()
    window_seconds = models.IntegerField(default=900)
    # failure_rate: fewer tasks finished in the window than this never fire it.
    min_count = models.IntegerField(default=10)
    # While it holds, a firing rule notifies again at most this often.
    repeat_seconds = models.IntegerField(default=3600)
    # [{"type": "webhook", "url", "secret"?}, {"type": "slack", "url"},
    #  {"type": "email", "to": [...]}] (task_queue.alerts.channels checks them).
    channels = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    # Silenced until then: evaluated, but it notifies nothing (a firing that outlasts
    # the silence is notified once it ends).
    silenced_until = models.DateTimeField(null=True, blank=True)
    # Where it was made, as for schedules (settings, the admin, the API, the dashboard).
    source = models.TextField(choices=Schedule.Source.choices, default=Schedule.Source.API)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "alert_rules"
        ordering = ["name"]
        permissions = [("manage_alerts", "Can create, change, silence and test alert rules")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__in=AlertKind.values), name="alert_rules_kind_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(window_seconds__gte=10, window_seconds__lte=3600),
                name="alert_rules_window_in_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class AlertState(models.Model):
    """Where a rule stands for one agent: firing since when, and when it last
    notified. Written only by an evaluation, under its lock."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="states")
    agent = models.TextField()
    # workflow_escalated: the workflow (its agent is the rule's, or "" for every agent).
    workflow_id = models.UUIDField(null=True, blank=True)
    value = models.FloatField(null=True)
    firing_since = models.DateTimeField(null=True)
    notified_at = models.DateTimeField(null=True)
    evaluated_at = models.DateTimeField()

    class Meta:
        db_table = "alert_states"
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "agent", "workflow_id"],
                name="alert_states_rule_agent_workflow",
                nulls_distinct=False,
            )
        ]

    def __str__(self) -> str:
        return f"{self.rule_id}/{self.agent}: {'firing' if self.firing_since else 'ok'}"


class AlertFiring(models.Model):
    """One firing of a rule for an agent (or workflow), from when its condition began
    to hold to when it stopped (``ended_at``; None while it fires): the alerts page's
    history, kept whether or not anyone was told (a silenced rule fires too). Written
    only by an evaluation, under its lock, and by a rule's change that drops its
    states (``rules.redefine``)."""

    class End(models.TextChoices):
        RESOLVED = "resolved"  # the condition stopped holding
        RULE_CHANGED = "rule_changed"  # disabled, or set to watch something else

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="firings")
    agent = models.TextField()
    workflow_id = models.UUIDField(null=True, blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True)
    ended_by = models.TextField(choices=End.choices, null=True)
    peak_value = models.FloatField(null=True)  # the highest reading while it fired

    class Meta:
        db_table = "alert_firings"
        ordering = ["-started_at", "-id"]
        indexes = [
            # The history, newest first (the page, the API), and what retention forgets.
            models.Index(fields=["-started_at", "-id"], name="alert_firings_started_idx"),
            models.Index(
                fields=["ended_at"],
                name="alert_firings_ended_idx",
                condition=models.Q(ended_at__isnull=False),
            ),
        ]
        constraints = [
            models.UniqueConstraint(  # one open firing per (rule, agent, workflow)
                fields=["rule", "agent", "workflow_id"],
                name="alert_firings_one_open",
                condition=models.Q(ended_at__isnull=True),
                nulls_distinct=False,
            )
        ]

    def __str__(self) -> str:
        return f"{self.rule_id}/{self.agent} from {self.started_at}"


class AlertNotification(models.Model):
    class State(models.TextChoices):
        FIRING = "firing"
        RESOLVED = "resolved"
        TEST = "test"  # sent by an operator to check the channels

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="notifications")
    agent = models.TextField()
    workflow_id = models.UUIDField(null=True, blank=True)
    state = models.TextField(choices=State.choices)
    value = models.FloatField(null=True)
    threshold = models.FloatField()
    started_at = models.DateTimeField()  # when the rule began to hold
    # The JSON every channel is sent (the webhook's body), made once.
    body = models.JSONField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "alert_notifications"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.body['rule']} ({self.agent}) {self.state}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # due at available_at
    SENDING = "sending"  # leased to a sender
    SENT = "sent"
    FAILED = "failed"  # every attempt failed


class AlertDelivery(models.Model):
    """A notification to one channel, retried with backoff up to ``max_attempts``."""

    notification = models.ForeignKey(
        AlertNotification, on_delete=models.CASCADE, related_name="deliveries"
    )
    channel = models.JSONField()  # as the rule had it (with its secret: never shown)
    status = models.TextField(choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.IntegerField(default=0)
    max_attempts = models.IntegerField(default=8)
    available_at = models.DateTimeField(db_default=Now())
    lease_token = models.UUIDField(null=True)
    lease_expires_at = models.DateTimeField(null=True)
    sent_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "alert_deliveries"
        indexes = [
            models.Index(
                fields=["available_at"],
                name="alert_deliveries_due_idx",
                condition=models.Q(status="pending"),
            )
        ]

    def __str__(self) -> str:
        return f"delivery {self.pk}: {self.status} after {self.attempts} attempt(s)"


class AlertDeliveryAttempt(models.Model):
    delivery = models.ForeignKey(AlertDelivery, on_delete=models.CASCADE, related_name="tries")
    attempt = models.IntegerField()
    ok = models.BooleanField()
    http_status = models.IntegerField(null=True)
    error = models.TextField(default="")
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "alert_delivery_attempts"
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"attempt {self.attempt}: {'ok' if self.ok else self.error}"
