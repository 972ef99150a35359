"""Recurring schedules (issue 16): ``schedules`` and their recent runs
(``schedule_runs``), and the audit log's schedule actions."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0016_completions_write_their_envelope"),
    ]

    operations = [
        migrations.AlterField(
            model_name="operatoraction",
            name="action",
            field=models.TextField(
                choices=[
                    ("revive", "Revive"),
                    ("edit_and_revive", "Edit payload and revive"),
                    ("edit", "Edit"),
                    ("cancel", "Cancel"),
                    ("run_now", "Run now"),
                    ("pause", "Pause agent"),
                    ("resume", "Resume agent"),
                    ("revive_messages", "Revive messages"),
                    ("revive_deliveries", "Revive publication deliveries"),
                    ("create_schedule", "Create schedule"),
                    ("update_schedule", "Change schedule"),
                    ("delete_schedule", "Delete schedule"),
                    ("pause_schedule", "Pause schedule"),
                    ("resume_schedule", "Resume schedule"),
                    ("run_schedule", "Run schedule now"),
                ]
            ),
        ),
        migrations.CreateModel(
            name="Schedule",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.TextField(unique=True)),
                ("cron", models.TextField(blank=True, null=True)),
                ("interval_seconds", models.IntegerField(blank=True, null=True)),
                ("timezone", models.TextField(default="UTC")),
                ("agent_name", models.TextField()),
                ("task_type", models.TextField()),
                ("payload", models.JSONField(blank=True, default=dict)),
                ("priority", models.SmallIntegerField(default=2)),
                ("max_attempts", models.IntegerField(blank=True, null=True)),
                ("enabled", models.BooleanField(default=True)),
                (
                    "missed",
                    models.TextField(
                        choices=[
                            ("run_once", "Run the latest once"),
                            ("skip", "Skip to the next slot"),
                        ],
                        default="run_once",
                    ),
                ),
                (
                    "source",
                    models.TextField(
                        choices=[
                            ("code", "Declared in settings"),
                            ("admin", "Admin"),
                            ("api", "API"),
                            ("dashboard", "Dashboard"),
                        ],
                        default="api",
                    ),
                ),
                ("last_run_at", models.DateTimeField(blank=True, null=True)),
                ("next_run_at", models.DateTimeField(blank=True, null=True)),
                ("last_task_id", models.UUIDField(blank=True, null=True)),
                ("last_error", models.TextField(blank=True, default="")),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "db_table": "schedules",
                "ordering": ["name"],
                "permissions": [("operate_schedule", "Can pause, resume and run schedules now")],
                "indexes": [
                    models.Index(
                        condition=models.Q(("enabled", True)),
                        fields=["next_run_at"],
                        name="schedules_due_idx",
                    )
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("cron__isnull", True),
                            ("interval_seconds__isnull", True),
                            _connector="XOR",
                        ),
                        name="schedules_cron_or_interval",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("missed__in", ["run_once", "skip"])),
                        name="schedules_missed_valid",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="ScheduleRun",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("slot", models.DateTimeField()),
                ("task_id", models.UUIDField(blank=True, null=True)),
                ("manual", models.BooleanField(default=False)),
                (
                    "fired_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "schedule",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="runs",
                        to="queue.schedule",
                    ),
                ),
            ],
            options={
                "db_table": "schedule_runs",
                "ordering": ["-slot", "-id"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("schedule", "slot"), name="schedule_runs_one_per_slot"
                    )
                ],
            },
        ),
    ]
