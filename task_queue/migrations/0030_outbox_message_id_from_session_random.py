from django.db import migrations, models

from task_queue.models.stream import SessionRandomUUID

# An envelope's message_id from the session's pseudo-random generator instead of
# gen_random_uuid(), which on a PostgreSQL built without OpenSSL (the embedded one)
# opens, reads and closes the kernel's random source for every id: 5 % of
# PostgreSQL's time in a drain, two envelopes a task (docs/performance.md). Still a
# version 4 UUID with 122 random bits; rows already written keep theirs. Needs
# PostgreSQL 17 (random(min, max)). The SQL is written out here, as it was when this
# migration was made; SessionRandomUUID gives the same to Django's model state.
SESSION_RANDOM_UUID = (
    "encode(int8send((random(-9223372036854775807, 9223372036854775807)"
    " & ~x'F000'::bigint) | x'4000'::bigint)"
    " || int8send(random(0, 4611686018427387903) | x'8000000000000000'::bigint),"
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
