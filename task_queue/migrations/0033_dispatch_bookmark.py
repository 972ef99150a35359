"""Where ``relay_events --dispatch`` stopped its scan of due times, beside the event
cursor of the same destination: a nullable column, added without a rewrite."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0032_remote_workers"),
    ]

    operations = [
        migrations.AddField(
            model_name="eventrelaycursor",
            name="dispatched_through",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
