"""The Workflow model now lives in the queue (``queue 0009``); this app keeps a proxy
of it for the admin and its permissions. State only: no table changes."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0002_derived_status"),
        ("queue", "0009_workflow_moves_to_the_queue"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="Workflow"),
                migrations.CreateModel(
                    name="Workflow",
                    fields=[],
                    options={
                        "verbose_name": "workflow",
                        "proxy": True,
                        "indexes": [],
                        "constraints": [],
                    },
                    bases=("queue.workflow",),
                ),
            ],
            database_operations=[],
        ),
    ]
