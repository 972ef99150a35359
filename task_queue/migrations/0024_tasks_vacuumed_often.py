from django.db import migrations

# Autovacuum of `tasks` after every 50,000 dead row versions, whatever the table's
# size, and without cost-based pauses (issue 15, a backlog of a million tasks).
#
# A claim reads each agent's due tasks from the head of tasks_pending_lease_idx. Every
# task claimed leaves its entry there, pointing at a row version no longer pending,
# until a vacuum removes it: at the head, where the next claim starts. By default a
# vacuum comes after 20 % of the table has changed; draining a million-task backlog,
# claims then walked past hundreds of thousands of such entries, thousands of index
# pages each, and the drain ran at half the rate of a small one (PostgreSQL's CPU per
# task 172 against 92 µs). With this and the embedded server's one-minute
# autovacuum_naptime shortened to 10 s, the same million drained at 96 µs a task.
# Each task leaves two dead row versions (claim, outcome): a vacuum every ~25,000
# tasks at most, and no more often than the naptime.
VACUUM_OFTEN = """
ALTER TABLE tasks SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0
)
"""
VACUUM_BY_DEFAULT = """
ALTER TABLE tasks RESET (
    autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay
)
"""


class Migration(migrations.Migration):
    dependencies = [("queue", "0023_dead_letter_payloads")]

    operations = [migrations.RunSQL(VACUUM_OFTEN, VACUUM_BY_DEFAULT)]
