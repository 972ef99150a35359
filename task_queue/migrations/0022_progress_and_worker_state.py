"""Progress and liveness (issue 17, point 5).

- ``tasks.progress``, ``progress_message``, ``progress_at``: what a handler last
  reported (``TaskContext.progress``), written by its worker's heartbeat in the
  statement that extends its leases (``task_queue.sql.heartbeats.HEARTBEAT``), fenced on
  the lease; a claim clears them, so they belong to the current or last attempt.
- ``workers.state`` (idle, busy, draining) and ``task_ids``: written by the heartbeat
  and at once when a worker starts draining.

Nullable columns without a default, and constant defaults (``state``, ``task_ids``:
what a worker of the release before, which writes neither, registers with): no table
rewrite.
"""

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0021_task_traceparent"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="progress",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="progress_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="progress_message",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="state",
            field=models.TextField(
                choices=[("idle", "Idle"), ("busy", "Busy"), ("draining", "Draining")],
                db_default="idle",
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="task_ids",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.UUIDField(), blank=True, db_default=[], default=list, size=None
            ),
        ),
    ]
