"""A notification on ``automechanica_events`` (task_queue.sql.channels.EVENTS_CHANNEL)
when a transaction writes envelopes into the event stream, so that the API's stream
hub (one LISTEN per server process) reads new events as they commit instead of
polling.

A statement trigger with an empty payload: PostgreSQL folds identical notifications
of one transaction into one, so a transaction costs one notification however many
envelopes it writes.
"""

from django.db import migrations

NOTIFY_EVENTS = """
CREATE FUNCTION notify_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM new_rows) THEN  -- an INSERT … SELECT of no rows fires it too
        PERFORM pg_notify('automechanica_events', '');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER event_outbox_notify AFTER INSERT ON event_outbox
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION notify_events();
"""

DROP_NOTIFY_EVENTS = """
DROP TRIGGER event_outbox_notify ON event_outbox;
DROP FUNCTION notify_events();
"""


class Migration(migrations.Migration):
    dependencies = [("queue", "0018_agent_limits")]
    operations = [migrations.RunSQL(NOTIFY_EVENTS, DROP_NOTIFY_EVENTS)]
