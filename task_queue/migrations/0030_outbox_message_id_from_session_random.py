from django.db import migrations, models

from task_queue.models.stream import SessionRandomUUID

# An envelope's message_id from the session's pseudo-random generator instead of
# gen_random_uuid(), which on a PostgreSQL built without OpenSSL (the embedded one)
# opens, reads and closes the kernel's random source for every id: 5 % of
# PostgreSQL's time in a drain, two envelopes a task (docs/performance.md). Still a
# version 4 UUID with 122 random bits; rows already written keep theirs.


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0029_task_totals"),
    ]

    operations = [
        migrations.AlterField(
            model_name="outboxevent",
            name="message_id",
            field=models.UUIDField(db_default=SessionRandomUUID()),
        ),
    ]
