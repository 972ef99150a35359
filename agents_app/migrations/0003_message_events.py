from django.db import migrations, models

# Direct messages and publications in the event stream (task_queue 0008 has the tasks'
# side and says why triggers): a message sent (with its payload, or the reference of
# its blob), acknowledged or expired, and every publication as
# evt.agent.<publisher type>.<event name>.v1 (seed 000 §4). Messages get payload_ref
# (task_queue.blobs) too. An envelope carries a message's or publication's payload up
# to 64 KiB (null beyond: read the row, or the blob, by id), so that every envelope
# fits a broker message (NATS: 1 MiB by default).
RECORD_MESSAGE_EVENTS = """
CREATE FUNCTION record_message_sent() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_outbox (kind, trace_id, causation_id, subject_id, emitted_at,
                              payload)
    SELECT 'evt.message.sent.v1', coalesce(n.metadata->>'trace_id', n.correlation_id),
           n.metadata->>'causation_id', n.id::text, n.created_at,
           jsonb_build_object('message_id', n.id, 'from_agent', n.from_agent,
                              'to_agent', n.to_agent, 'message_type', n.message_type,
                              'priority', n.priority, 'correlation_id', n.correlation_id,
                              'reply_to', n.reply_to, 'expires_at', n.expires_at,
                              'payload', CASE WHEN octet_length(n.payload::text) <= 65536
                                              THEN n.payload END,
                              'payload_ref', n.payload_ref)
    FROM new_rows n
    ORDER BY n.created_at, n.id;
    RETURN NULL;
END $$;

CREATE FUNCTION record_message_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_outbox (kind, trace_id, causation_id, subject_id, emitted_at,
                              payload)
    SELECT 'evt.message.' || n.status || '.v1',
           coalesce(n.metadata->>'trace_id', n.correlation_id), n.id::text, n.id::text,
           coalesce(n.acknowledged_at, now()),
           jsonb_build_object('message_id', n.id, 'from_agent', n.from_agent,
                              'to_agent', n.to_agent, 'delivery_count', n.delivery_count)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE n.status IN ('acknowledged', 'expired') AND o.status <> n.status
    ORDER BY n.id;
    RETURN NULL;
END $$;

CREATE FUNCTION record_publication() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_outbox (kind, trace_id, causation_id, subject_id, emitted_at,
                              payload)
    SELECT 'evt.agent.' || coalesce(n.publisher_type, n.publisher_agent) || '.'
               || n.event_name || '.v1',
           n.metadata->>'trace_id', n.metadata->>'causation_id', n.id::text, n.created_at,
           jsonb_build_object('publication_id', n.id, 'publisher_agent', n.publisher_agent,
                              'publisher_type', n.publisher_type,
                              'publication_type', n.publication_type,
                              'event_name', n.event_name, 'expires_at', n.expires_at,
                              'payload', CASE WHEN octet_length(n.payload::text) <= 65536
                                              THEN n.payload END,
                              'payload_bytes', octet_length(n.payload::text))
    FROM new_rows n
    ORDER BY n.id;
    RETURN NULL;
END $$;

CREATE TRIGGER agent_messages_record_sent AFTER INSERT ON agent_messages
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION record_message_sent();
CREATE TRIGGER agent_messages_record_settled AFTER UPDATE ON agent_messages
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION record_message_settled();
CREATE TRIGGER agent_publications_record AFTER INSERT ON agent_publications
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION record_publication();
"""

DROP_MESSAGE_EVENTS = """
DROP TRIGGER agent_messages_record_sent ON agent_messages;
DROP TRIGGER agent_messages_record_settled ON agent_messages;
DROP TRIGGER agent_publications_record ON agent_publications;
DROP FUNCTION record_message_sent();
DROP FUNCTION record_message_settled();
DROP FUNCTION record_publication();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("agents_app", "0002_memory_reports_and_messaging"),
        ("queue", "0008_event_stream"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentmessage",
            name="payload_ref",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.RunSQL(RECORD_MESSAGE_EVENTS, DROP_MESSAGE_EVENTS),
    ]
