"""The operator audit log."""

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models.functions import Now


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
        LIMIT = "limit", "Set agent limits"
        # Agent messaging (agents_app): failed messages or publication deliveries made
        # deliverable again; ``changes`` names them.
        REVIVE_MESSAGES = "revive_messages", "Revive messages"
        REVIVE_DELIVERIES = "revive_deliveries", "Revive publication deliveries"
        # Recurring schedules (task_queue.schedules); ``changes`` names the schedule.
        CREATE_SCHEDULE = "create_schedule", "Create schedule"
        UPDATE_SCHEDULE = "update_schedule", "Change schedule"
        DELETE_SCHEDULE = "delete_schedule", "Delete schedule"
        PAUSE_SCHEDULE = "pause_schedule", "Pause schedule"
        RESUME_SCHEDULE = "resume_schedule", "Resume schedule"
        RUN_SCHEDULE = "run_schedule", "Run schedule now"
        # Alert rules (task_queue.alerts.rules); ``changes`` names the rule.
        CREATE_ALERT_RULE = "create_alert_rule", "Create alert rule"
        UPDATE_ALERT_RULE = "update_alert_rule", "Change alert rule"
        DELETE_ALERT_RULE = "delete_alert_rule", "Delete alert rule"
        SILENCE_ALERT_RULE = "silence_alert_rule", "Silence alert rule"
        TEST_ALERT_RULE = "test_alert_rule", "Send a test alert"
        # An escalated workflow resumed (task_queue.escalation); ``changes`` names it.
        RESUME_WORKFLOW = "resume_workflow", "Resume escalated workflow"

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
