"""The messages and publications of one trace (the task page's "In this trace"): an
agent sending while it runs a task puts the task's trace in the metadata
(agents_app.messaging.traced). Partial: only rows that carry a trace. Built
``CONCURRENTLY``, so not in a transaction."""

import django.db.models.fields.json
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("agents_app", "0007_blob_references"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="agentmessage",
            index=models.Index(
                django.db.models.fields.json.KeyTransform("trace_id", "metadata"),
                condition=models.Q(("metadata__has_key", "trace_id")),
                name="agent_messages_trace_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="publication",
            index=models.Index(
                django.db.models.fields.json.KeyTransform("trace_id", "metadata"),
                condition=models.Q(("metadata__has_key", "trace_id")),
                name="agent_pubs_trace_idx",
            ),
        ),
    ]
