from django.db import migrations

# queue 0030's default, as it now is, on databases that applied it when it called
# PostgreSQL 17's random(min, max): every database gets the same SQL (see
# task_queue.models.stream.SessionRandomUUID). Nothing changes in Django's state.
SESSION_RANDOM_UUID = (
    "encode(int8send((floor(random() * 281474976710656)::bigint << 16)"
    " | x'4000'::bigint | floor(random() * 4096)::bigint)"
    " || int8send((floor(random() * 4503599627370496)::bigint << 10)"
    " | floor(random() * 1024)::bigint | x'8000000000000000'::bigint),"
    " 'hex')::uuid"
)


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0040_alert_firings_and_escalation_checks_index"),
    ]

    operations = [
        migrations.RunSQL(
            f"ALTER TABLE event_outbox ALTER COLUMN message_id SET DEFAULT {SESSION_RANDOM_UUID}",
            migrations.RunSQL.noop,
        ),
    ]
