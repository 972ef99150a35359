from django.db import migrations

# The dashboard's notification (task_queue.sql.channels.TASK_CHANGES_CHANNEL) now carries
# each task's status before and after, so a dead-letter page can tell a task that
# left the dead letter from one that arrived, and it fires on every change a task page
# shows (an edited payload or priority, a run-now, a cancel request), not only on
# status changes: every queue statement but a lease renewal sets updated_at, so that
# one timestamp says "changed" without comparing payloads.
#
# Payload: {"tasks": [[id, old_status, new_status], ...], "more": changed beyond those,
#           "left": n, "arrived": n}
# "tasks" holds up to 60 changed tasks, those moving in or out of the dead letter
# first; "left" and "arrived" count every task that left or entered the dead letter.
NOTIFY_TASK_CHANGES = """
CREATE OR REPLACE FUNCTION notify_task_changes() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed_count int;
    left_count int;
    arrived_count int;
    sample jsonb;
BEGIN
    SELECT count(*),
           count(*) FILTER (WHERE was_dead AND NOT is_dead),
           count(*) FILTER (WHERE is_dead AND NOT was_dead),
           jsonb_agg(jsonb_build_array(id, old_status, new_status)) FILTER (WHERE n <= 60)
    INTO changed_count, left_count, arrived_count, sample
    FROM (
        SELECT id, old_status, new_status, was_dead, is_dead,
               row_number() OVER (ORDER BY was_dead <> is_dead DESC) AS n
        FROM (
            SELECT new_rows.id, old_rows.status AS old_status, new_rows.status AS new_status,
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
    RETURN NULL;
END $$;
"""

# 0004's version: status changes only, [id, new_status] pairs, "more" a boolean.
PREVIOUS_NOTIFY_TASK_CHANGES = """
CREATE OR REPLACE FUNCTION notify_task_changes() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed_count int;
    sample jsonb;
BEGIN
    SELECT count(*), jsonb_agg(jsonb_build_array(id, status)) FILTER (WHERE n <= 60)
    INTO changed_count, sample
    FROM (
        SELECT new_rows.id, new_rows.status, row_number() OVER () AS n
        FROM new_rows JOIN old_rows ON old_rows.id = new_rows.id
        WHERE new_rows.status IS DISTINCT FROM old_rows.status
    ) AS changed;
    IF changed_count > 0 THEN
        PERFORM pg_notify('automechanica_task_changes',
                          jsonb_build_object('tasks', sample, 'more', changed_count > 60)::text);
    END IF;
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("queue", "0005_dead_letter_proxy")]

    operations = [
        migrations.RunSQL(NOTIFY_TASK_CHANGES, reverse_sql=PREVIOUS_NOTIFY_TASK_CHANGES),
    ]
