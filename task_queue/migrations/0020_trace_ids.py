"""Every task has a trace id (issue 17, point 3): indexes for the tasks and workflows
of one trace (``GET /api/v1/tasks?trace_id=``, the task page's "In this trace").

New tasks get their trace at enqueue (task_queue.sql.enqueue); rows written before
keep a null one (no backfill). Built ``CONCURRENTLY`` (so not in a transaction): the
queue keeps running meanwhile.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("queue", "0019_event_notifications"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(fields=["trace_id"], name="tasks_trace_idx"),
        ),
        AddIndexConcurrently(
            model_name="workflow",
            index=models.Index(fields=["trace_id"], name="workflows_trace_idx"),
        ),
    ]
