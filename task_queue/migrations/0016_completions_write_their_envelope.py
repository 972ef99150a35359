"""A completion writes its own evt.task.completed.v1 envelope
(task_queue.sql.outcomes.COMPLETE_TASKS_END), and the history trigger leaves
``completed`` rows out, returning at once when a statement wrote nothing else.

Measured on a 2 vCPU machine, a 50-task completion statement: 4.40 ms median with
the trigger writing the envelopes, 3.78 ms this way. The trigger looked each task up
again and set up a three-way query for every statement, even one with nothing left
for it to do. Every other history row still gets its envelope from the trigger."""

from django.db import migrations

HISTORY_ENVELOPES = """
CREATE OR REPLACE FUNCTION record_task_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM new_rows WHERE event <> 'completed') THEN
        RETURN NULL;
    END IF;
    INSERT INTO event_outbox (kind, trace_id, causation_id, subject_id, emitted_at,
                              payload)
    SELECT 'evt.task.' || e.event || '.v1', t.trace_id, h.task_id::text, h.task_id::text,
           h.occurred_at,
           jsonb_strip_nulls(jsonb_build_object(
               'task_id', h.task_id, 'agent_type', t.agent_name, 'task_type', t.task_type,
               'attempt', h.attempt, 'agent_id', h.actor,
               'from_status', h.from_status, 'to_status', h.to_status,
               'error_class', h.error->>'type', 'error', left(h.error->>'message', 1000),
               'next_attempt_at', h.detail->'retry_at',
               'backoff_ms', round(1000 * extract(epoch FROM
                   (h.detail->>'retry_at')::timestamptz - h.occurred_at))))
    FROM new_rows h
    LEFT JOIN tasks t ON t.id = h.task_id
    CROSS JOIN LATERAL (VALUES (h.event, 1), (h.to_status, 2)) AS e(event, n)
    WHERE h.event <> 'completed'
      AND (e.n = 1 OR (h.event = 'lease_expired' AND h.to_status IN ('dead', 'cancelled')))
    ORDER BY h.id, e.n;
    RETURN NULL;
END $$;
"""

# queue 0008's version, for migrating back with the code that relies on it.
PREVIOUS_HISTORY_ENVELOPES = """
CREATE OR REPLACE FUNCTION record_task_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_outbox (kind, trace_id, causation_id, subject_id, emitted_at,
                              payload)
    SELECT 'evt.task.' || e.event || '.v1', t.trace_id, h.task_id::text, h.task_id::text,
           h.occurred_at,
           jsonb_strip_nulls(jsonb_build_object(
               'task_id', h.task_id, 'agent_type', t.agent_name, 'task_type', t.task_type,
               'attempt', h.attempt, 'agent_id', h.actor,
               'from_status', h.from_status, 'to_status', h.to_status,
               'error_class', h.error->>'type', 'error', left(h.error->>'message', 1000),
               'next_attempt_at', h.detail->'retry_at',
               'backoff_ms', round(1000 * extract(epoch FROM
                   (h.detail->>'retry_at')::timestamptz - h.occurred_at)),
               'duration_ms', CASE WHEN h.event = 'completed' THEN round(1000 * extract(
                   epoch FROM h.occurred_at - h.started_at)) END,
               'result_ref', CASE WHEN h.event = 'completed'
                                  THEN 'db://tasks/' || h.task_id || '/result' END))
    FROM new_rows h
    LEFT JOIN tasks t ON t.id = h.task_id
    CROSS JOIN LATERAL (VALUES (h.event, 1), (h.to_status, 2)) AS e(event, n)
    WHERE e.n = 1 OR (h.event = 'lease_expired' AND h.to_status IN ('dead', 'cancelled'))
    ORDER BY h.id, e.n;
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("queue", "0015_dead_letter_filter_index")]
    operations = [migrations.RunSQL(HISTORY_ENVELOPES, reverse_sql=PREVIOUS_HISTORY_ENVELOPES)]
