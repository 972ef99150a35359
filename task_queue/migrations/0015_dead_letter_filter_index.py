"""An index for the dead-letter page's filters (issue 15): agent, error class and task
type over the dead and failed tasks only, so that a filtered page and its count read
that small set instead of every dead-letter row's heap page on a large table.

Built ``CONCURRENTLY`` (so not in a transaction): the queue keeps running meanwhile.
"""

import django.db.models.fields.json
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("queue", "0014_task_counts"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                models.F("agent_name"),
                django.db.models.fields.json.KeyTransform("type", "error_info"),
                models.F("task_type"),
                models.F("finished_at"),
                condition=models.Q(("status__in", ("dead", "failed"))),
                name="tasks_dead_letter_filter_idx",
            ),
        ),
    ]
