"""A claim starts its tasks (task_queue.sql.leasing.CLAIM_TASKS): the claim statement
writes the one evt.task.claimed.v1 envelope itself, and the trigger that made every
UPDATE of tasks build transition tables, to find claims and starts among them, goes.

Tasks left ``leased`` by a worker of an older version are recovered by the reaper as
before (``leased`` stays a status: such a task's lease still runs out)."""

from django.db import migrations

DROP = """
DROP TRIGGER tasks_record_leases ON tasks;
DROP FUNCTION record_task_leases();
"""

# queue 0008's trigger, for migrating back.
RESTORE = """
CREATE FUNCTION record_task_leases() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_outbox (kind, trace_id, causation_id, subject_id, emitted_at,
                              payload)
    SELECT CASE n.status WHEN 'leased' THEN 'evt.task.claimed.v1'
                         ELSE 'evt.task.started.v1' END,
           n.trace_id, n.id::text, n.id::text, n.updated_at,
           jsonb_build_object('task_id', n.id, 'agent_type', n.agent_name,
                              'agent_id', n.lease_owner, 'attempt', n.attempts + 1,
                              'lease_until', n.lease_expires_at)
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    WHERE (n.status = 'leased' AND n.lease_token IS DISTINCT FROM o.lease_token)
       OR (n.status = 'running' AND o.status = 'leased')
    ORDER BY n.id;
    RETURN NULL;
END $$;
CREATE TRIGGER tasks_record_leases AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION record_task_leases();
"""


class Migration(migrations.Migration):
    dependencies = [("queue", "0012_blob_references")]
    operations = [migrations.RunSQL(DROP, reverse_sql=RESTORE)]
