"""The lease expirations of a window, for the lease_expirations alert rules: as many
index entries as leases expired, however busy the history is.

Built ``CONCURRENTLY`` (so not in a transaction): the queue keeps running meanwhile.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("queue", "0037_alert_kinds_for_leases_and_schedules")]

    operations = [
        AddIndexConcurrently(
            model_name="taskhistory",
            index=models.Index(
                condition=models.Q(event="lease_expired"),
                fields=["occurred_at"],
                name="task_history_lease_expired_idx",
            ),
        ),
    ]
