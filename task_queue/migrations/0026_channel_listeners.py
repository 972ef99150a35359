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

# queue 0018's function, its dashboard part (queue 0006's) now sent only while someone
# listens; the freed-slot wake-up as it was.
_0018 = import_module("task_queue.migrations.0018_agent_limits")
PREVIOUS_NOTIFY_TASK_CHANGES = _0018.NOTIFY_TASK_CHANGES_AND_FREED_SLOTS
_DASHBOARD_START = "BEGIN\n"
_DASHBOARD_END = _0018.FREED_SLOTS.lstrip("\n")
assert PREVIOUS_NOTIFY_TASK_CHANGES.count(_DASHBOARD_START) == 1
assert PREVIOUS_NOTIFY_TASK_CHANGES.count(_DASHBOARD_END) == 1
NOTIFY_TASK_CHANGES = PREVIOUS_NOTIFY_TASK_CHANGES.replace(
    _DASHBOARD_START, _DASHBOARD_START + "    IF has_listeners('automechanica_task_changes') THEN\n"
).replace(_DASHBOARD_END, "    END IF;\n" + _DASHBOARD_END)

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

# Back to queue 0025: the function as queue 0019 left it.
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
