from django.db import migrations, models

from task_queue.models.stream import SessionRandomUUID

# An envelope's message_id from the session's pseudo-random generator instead of
# gen_random_uuid(), which on a PostgreSQL built without OpenSSL (the embedded one)
# opens, reads and closes the kernel's random source for every id: 5 % of
# PostgreSQL's time in a drain, two envelopes a task (docs/performance.md). Still a
# version 4 UUID with 122 random bits; rows already written keep theirs. The SQL is
# written out here; SessionRandomUUID gives the same to Django's model state. Until
# 2026-11-29 it called PostgreSQL 17's random(min, max); it now takes its bits from
# random(), as on PostgreSQL 15 and 16, and queue 0041 sets the same on databases
# migrated before.
SESSION_RANDOM_UUID = (
    "encode(int8send((floor(random() * 281474976710656)::bigint << 16)"
    " | x'4000'::bigint | floor(random() * 4096)::bigint)"
    " || int8send((floor(random() * 4503599627370496)::bigint << 10)"
    " | floor(random() * 1024)::bigint | x'8000000000000000'::bigint),"
    " 'hex')::uuid"
)


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0029_task_totals"),
    ]

    operations = [
        migrations.RunSQL(
            f"ALTER TABLE event_outbox ALTER COLUMN message_id SET DEFAULT {SESSION_RANDOM_UUID}",
            "ALTER TABLE event_outbox ALTER COLUMN message_id SET DEFAULT gen_random_uuid()",
            state_operations=[
                migrations.AlterField(
                    model_name="outboxevent",
                    name="message_id",
                    field=models.UUIDField(db_default=SessionRandomUUID()),
                ),
            ],
        ),
    ]
