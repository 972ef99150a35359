"""The index of tasks by workflow leaves out tasks in no workflow, so such a task
costs no entry in it, at its insert nor at any later version of its row. Django's own
AlterField would drop and add the foreign key again, checking every task meanwhile;
only the index changes here.

Built and dropped ``CONCURRENTLY`` (so not in a transaction): the queue keeps running
meanwhile.
"""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("queue", "0030_outbox_message_id_from_session_random"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(("workflow__isnull", False)),
                fields=["workflow"],
                name="tasks_workflow_idx",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="task",
                    name="workflow",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="tasks",
                        to="queue.workflow",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    'DROP INDEX CONCURRENTLY IF EXISTS "tasks_workflow_id_f95e4f06"',
                    reverse_sql='CREATE INDEX CONCURRENTLY IF NOT EXISTS "tasks_workflow_id_f95e4f06" '
                    'ON "tasks" ("workflow_id")',
                ),
            ],
        ),
    ]
