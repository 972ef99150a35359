from django.db import migrations

# Autovacuum of the history and the event outbox without cost-based pauses (issue 15,
# target 4: a drain as fast on a backlog of a million as on twenty thousand).
#
# While a task is drained these tables grow by a row or more per task, so autovacuum
# analyses them about every autovacuum_naptime; an ANALYZE holds a snapshot, and
# while it does, the dead entries that claims leave at the head of
# tasks_pending_lease_idx cannot be cleaned up: every claim walks past them. The
# cost-based pauses (autovacuum_vacuum_cost_delay, 2 ms by default) made each such
# ANALYZE of a few million outbox rows last 3-4 s instead of about 0.6 s. Without
# them (as `tasks` has had since 0024; agents_app 0009 does the same for its two),
# three alternating pairs of million-task drains ran 4-10 % faster at 8-9 % less
# PostgreSQL CPU per task, and the horizon was no longer held for over 5 s
# (docs/performance.md). The cost: these tables' vacuums and analyses run at full
# I/O speed, in bursts as short as they can be.
UNTHROTTLED = """
ALTER TABLE task_history SET (autovacuum_vacuum_cost_delay = 0);
ALTER TABLE event_outbox SET (autovacuum_vacuum_cost_delay = 0);
"""
THROTTLED = """
ALTER TABLE task_history RESET (autovacuum_vacuum_cost_delay);
ALTER TABLE event_outbox RESET (autovacuum_vacuum_cost_delay);
"""


class Migration(migrations.Migration):
    dependencies = [("queue", "0026_channel_listeners")]

    operations = [migrations.RunSQL(UNTHROTTLED, THROTTLED)]
