"""Blob references for every large JSON value of the agents' tables (task_queue.blobs):
agent events reference a blobbed result instead of copying it, messages' metadata,
publications' payload and metadata, deliveries' results; each with a partial index for
the blob collector. A publication's envelope names its payload's blob."""

from django.db import migrations, models

# agents_app 0003's record_publication, with the payload's blob reference.
PUBLICATION_EVENTS = """
CREATE OR REPLACE FUNCTION record_publication() RETURNS trigger LANGUAGE plpgsql AS $$
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
                              'payload_bytes', CASE WHEN n.payload_ref IS NULL
                                                    THEN octet_length(n.payload::text) END,
                              'payload_ref', n.payload_ref)
    FROM new_rows n
    ORDER BY n.id;
    RETURN NULL;
END $$;
"""
PREVIOUS_PUBLICATION_EVENTS = """
CREATE OR REPLACE FUNCTION record_publication() RETURNS trigger LANGUAGE plpgsql AS $$
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
"""


class Migration(migrations.Migration):
    dependencies = [
        ("agents_app", "0006_message_failures"),
        ("queue", "0012_blob_references"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentevent",
            name="result_ref",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="agentmessage",
            name="metadata_ref",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="publication",
            name="metadata_ref",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="publication",
            name="payload_ref",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="publicationdelivery",
            name="result_ref",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="agentevent",
            index=models.Index(
                condition=models.Q(("result_ref__isnull", False)),
                fields=["result_ref"],
                name="agent_events_result_ref_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="agentmessage",
            index=models.Index(
                condition=models.Q(("payload_ref__isnull", False)),
                fields=["payload_ref"],
                name="agent_messages_payload_ref_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="agentmessage",
            index=models.Index(
                condition=models.Q(("metadata_ref__isnull", False)),
                fields=["metadata_ref"],
                name="agent_messages_meta_ref_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="publication",
            index=models.Index(
                condition=models.Q(("payload_ref__isnull", False)),
                fields=["payload_ref"],
                name="agent_pubs_payload_ref_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="publication",
            index=models.Index(
                condition=models.Q(("metadata_ref__isnull", False)),
                fields=["metadata_ref"],
                name="agent_pubs_meta_ref_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="publicationdelivery",
            index=models.Index(
                condition=models.Q(("result_ref__isnull", False)),
                fields=["result_ref"],
                name="agent_deliv_result_ref_idx",
            ),
        ),
        migrations.RunSQL(PUBLICATION_EVENTS, PREVIOUS_PUBLICATION_EVENTS),
    ]
