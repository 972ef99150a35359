"""The Workflow model moves from the workflows app to the queue; its table stays.

State only: the table ``workflows`` and the foreign key from ``tasks`` are untouched.
The workflows app's next migration drops its copy from the state.
"""

import uuid

import django.contrib.postgres.functions
import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0008_event_stream"),
        ("workflows", "0002_derived_status"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Workflow",
                    fields=[
                        (
                            "id",
                            models.UUIDField(
                                db_default=django.contrib.postgres.functions.RandomUUID(),
                                default=uuid.uuid4,
                                primary_key=True,
                                serialize=False,
                            ),
                        ),
                        ("name", models.TextField()),
                        ("metadata", models.JSONField(blank=True, default=dict)),
                        ("open", models.BooleanField(db_default=False, default=False)),
                        ("cancelled_at", models.DateTimeField(blank=True, null=True)),
                        ("trace_id", models.TextField(blank=True, null=True)),
                        (
                            "created_at",
                            models.DateTimeField(
                                db_default=django.db.models.functions.datetime.Now()
                            ),
                        ),
                        (
                            "updated_at",
                            models.DateTimeField(
                                db_default=django.db.models.functions.datetime.Now()
                            ),
                        ),
                    ],
                    options={"db_table": "workflows", "ordering": ["-created_at", "-id"]},
                ),
                migrations.AlterField(
                    model_name="task",
                    name="workflow",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="tasks",
                        to="queue.workflow",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
