"""OpenTelemetry (issue 17, point 6): the trace context of the span that enqueued a
task, so that its claim and execution spans join that span's trace
(task_queue.tracing).

A nullable column without a default: adding it rewrites nothing and takes the
table's lock only for a moment. Null for every task enqueued without a span or a
``traceparent`` header, so an enqueue with tracing off writes nothing more.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0020_trace_ids"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="traceparent",
            field=models.TextField(blank=True, null=True),
        ),
    ]
