"""The alert kinds lease_expirations and schedule_missed, and what the second reads
(a schedule's last late slot). The first's index is queue 0038, built concurrently."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0036_alerts_for_escalated_workflows"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="alertrule",
            name="alert_rules_kind_valid",
        ),
        migrations.AddField(
            model_name="schedule",
            name="late_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="schedule",
            name="late_by_seconds",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="alertrule",
            name="kind",
            field=models.TextField(
                choices=[
                    ("dead_letter", "Dead Letter"),
                    ("failure_rate", "Failure Rate"),
                    ("backlog_age", "Backlog Age"),
                    ("no_workers", "No Workers"),
                    ("lease_expirations", "Lease Expirations"),
                    ("schedule_missed", "Schedule Missed"),
                    ("workflow_escalated", "Workflow Escalated"),
                ]
            ),
        ),
        migrations.AddConstraint(
            model_name="alertrule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "kind__in",
                        [
                            "dead_letter",
                            "failure_rate",
                            "backlog_age",
                            "no_workers",
                            "lease_expirations",
                            "schedule_missed",
                            "workflow_escalated",
                        ],
                    )
                ),
                name="alert_rules_kind_valid",
            ),
        ),
    ]
