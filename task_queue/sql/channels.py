"""The NOTIFY channels of the queue's tables."""

from __future__ import annotations

NOTIFY_CHANNEL = "automechanica_tasks"

# A notification from one connection to another's channel of its own, to see whether
# LISTEN is in effect (task_queue.listen.heard).
NOTIFY_PROBE = "SELECT pg_notify(%(channel)s, '')"


# Every statement that changes tasks (all but lease renewals) notifies here while
# someone listens (a trigger, migrations queue 0004, 0006 and 0026): {"tasks": [[id,
# old_status, new_status], ... up to 60, dead-letter moves first], "more": changed
# tasks beyond those, "left": tasks that left the dead letter, "arrived": tasks that
# entered it}. The dashboard's hub listens while a page is open in its process.
TASK_CHANGES_CHANNEL = "automechanica_task_changes"

# Every transaction that writes envelopes into event_outbox notifies here, once, with
# an empty payload, while someone listens (a trigger, migrations queue 0019 and 0026).
# The API's stream hub listens, from the first stream opened in its process.
EVENTS_CHANNEL = "automechanica_events"

# The channels above, whose triggers notify only while someone listens: a connection
# that listens on one registers in channel_listeners (migration queue 0026) first.
# Before it does, the rows of connections that ended without deleting theirs are swept
# away: those whose backend is gone, or whose process id a backend started since has
# taken (it started after the row was written; `since` is the registering
# transaction's start, never before its own backend's). pg_stat_activity hides
# backend_start of another role's backends from a role without pg_read_all_stats:
# such a row is kept. The sweep is a statement of its own: in one statement with the
# INSERT, the INSERT would find a stale row of its own channel and process id and add
# nothing, and the DELETE would then remove that row, leaving the listener unregistered.
# (Workers and message readers always listen on theirs: no registration.)
REGISTERED_CHANNELS = frozenset({TASK_CHANGES_CHANNEL, EVENTS_CHANNEL})
SWEEP_LISTENERS = """
DELETE FROM channel_listeners l
WHERE NOT EXISTS (
    SELECT FROM pg_stat_activity a
    WHERE a.pid = l.backend_pid
      AND (a.backend_start IS NULL OR a.backend_start <= l.since)
)
"""
REGISTER_LISTENER = """
INSERT INTO channel_listeners (channel, backend_pid)
VALUES (%(channel)s, pg_backend_pid())
ON CONFLICT (channel, backend_pid) DO NOTHING
"""
UNREGISTER_LISTENER = """
DELETE FROM channel_listeners WHERE channel = %(channel)s AND backend_pid = pg_backend_pid()
"""
