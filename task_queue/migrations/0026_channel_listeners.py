from importlib import import_module

from django.db import migrations

# Who listens on which channel: one row per listening connection, written by the one
# LISTEN loop (task_queue.listen) before it listens and deleted when it stops; rows of
# connections that ended without deleting theirs are swept by the next one to listen.
# Unlogged: a crash of the server empties it, with every connection its rows named.
#
# The two notifications sent after every change of tasks and every write to the event
# stream (the dashboard's, on automechanica_task_changes, queue 0006; the stream hub's
# wake-up, on automechanica_events, queue 0019) are sent only while a row says someone
# listens. A web server process's dashboard hub listens while a page is open in it;
# its stream hub from the first stream opened in it until the process stops (the
# reference orchestrator keeps one open). With no one listening they cost the worker's claims and completions
# about a sixth of a drain's throughput (queue_bench, docs/performance.md), for
# notifications no one received. The freed-slot wake-up of workers (queue 0018) and
# enqueue's are sent as before: workers always listen.
#
# A listener registers before it listens, and its first read comes after: a change
# whose statement looked before the registration committed, and that commits after
# that read, is not announced to it. The stream hub reads again every 2 s anyway; a
# dashboard page shows such a change with the next one of its task.
CHANNEL_LISTENERS = """
CREATE UNLOGGED TABLE channel_listeners (
    channel text NOT NULL,
    backend_pid integer NOT NULL,
    since timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (channel, backend_pid)
);

CREATE FUNCTION has_listeners(listened text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT FROM channel_listeners WHERE channel = listened)
$$;
"""

NOTIFY_TASK_CHANGES = """
CREATE OR REPLACE FUNCTION notify_task_changes() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed_count int;
    left_count int;
    arrived_count int;
    sample jsonb;
BEGIN
    IF has_listeners('automechanica_task_changes') THEN
        SELECT count(*),
               count(*) FILTER (WHERE was_dead AND NOT is_dead),
               count(*) FILTER (WHERE is_dead AND NOT was_dead),
               jsonb_agg(jsonb_build_array(id, old_status, new_status)) FILTER (WHERE n <= 60)
        INTO changed_count, left_count, arrived_count, sample
        FROM (
            SELECT id, old_status, new_status, was_dead, is_dead,
                   row_number() OVER (ORDER BY was_dead <> is_dead DESC) AS n
            FROM (
                SELECT new_rows.id, old_rows.status AS old_status,
                       new_rows.status AS new_status,
                       old_rows.status IN ('dead', 'failed') AS was_dead,
                       new_rows.status IN ('dead', 'failed') AS is_dead
                FROM new_rows JOIN old_rows ON old_rows.id = new_rows.id
                WHERE new_rows.updated_at IS DISTINCT FROM old_rows.updated_at
                   OR new_rows.status IS DISTINCT FROM old_rows.status
            ) AS changed
        ) AS ranked;
        IF changed_count > 0 THEN
            PERFORM pg_notify('automechanica_task_changes', jsonb_build_object(
                'tasks', sample, 'more', greatest(changed_count - 60, 0),
                'left', left_count, 'arrived', arrived_count)::text);
        END IF;
    END IF;
    IF EXISTS (SELECT FROM agent_limits WHERE concurrency_limit IS NOT NULL) THEN
        PERFORM pg_notify('automechanica_tasks', freed.agent_name)
        FROM (
            SELECT DISTINCT old_rows.agent_name
            FROM old_rows JOIN new_rows ON new_rows.id = old_rows.id
            JOIN agent_limits l ON l.agent_name = old_rows.agent_name
            WHERE l.concurrency_limit IS NOT NULL
              AND old_rows.status IN ('leased', 'running')
              AND new_rows.status NOT IN ('leased', 'running')
        ) AS freed;
    END IF;
    RETURN NULL;
END $$;
"""

NOTIFY_EVENTS = """
CREATE OR REPLACE FUNCTION notify_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- An INSERT … SELECT of no rows fires it too.
    IF has_listeners('automechanica_events') AND EXISTS (SELECT FROM new_rows) THEN
        PERFORM pg_notify('automechanica_events', '');
    END IF;
    RETURN NULL;
END $$;
"""

# Back to queue 0025: the functions as queue 0018 and 0019 left them.
PREVIOUS_NOTIFY_TASK_CHANGES = import_module(
    "task_queue.migrations.0018_agent_limits"
).NOTIFY_TASK_CHANGES_AND_FREED_SLOTS
_EVENTS_0019 = import_module("task_queue.migrations.0019_event_notifications").NOTIFY_EVENTS
PREVIOUS_NOTIFY_EVENTS = _EVENTS_0019[: _EVENTS_0019.index("CREATE TRIGGER")].replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"
)

DROP_CHANNEL_LISTENERS = """
DROP FUNCTION has_listeners(text);
DROP TABLE channel_listeners;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0025_dead_letter_entries"),
    ]

    operations = [
        migrations.RunSQL(CHANNEL_LISTENERS, DROP_CHANNEL_LISTENERS),
        migrations.RunSQL(NOTIFY_TASK_CHANGES, PREVIOUS_NOTIFY_TASK_CHANGES),
        migrations.RunSQL(NOTIFY_EVENTS, PREVIOUS_NOTIFY_EVENTS),
    ]
