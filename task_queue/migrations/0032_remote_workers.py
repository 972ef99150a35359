"""Workers of two kinds: ``local`` (runworker) and ``remote`` (an agent elsewhere, over
the HTTP API's worker protocol). A database default, so a worker of the release
before, which does not write the column, still registers. A task keeps the length of
the lease its claim granted (``lease_seconds``), by which a heartbeat over HTTP extends
it: a nullable column without a default, added without rewriting the table."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0031_tasks_workflow_index_leaves_out_tasks_of_no_workflow"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="kind",
            field=models.TextField(
                choices=[("local", "Local"), ("remote", "Remote")], db_default="local"
            ),
        ),
        migrations.AddField(
            model_name="task",
            name="lease_seconds",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddConstraint(
            model_name="worker",
            constraint=models.CheckConstraint(
                condition=models.Q(("kind__in", ["local", "remote"])), name="workers_kind_valid"
            ),
        ),
    ]
