from django.db import migrations

# Autovacuum of agent events and embedding jobs without cost-based pauses, as the
# queue's history and event outbox (queue 0027, which says why): an autoanalyse of a
# table that grows with every drained task holds back the cleanup of the claims' dead
# index entries for as long as it runs, and the pauses made it run several times
# longer.
UNTHROTTLED = """
ALTER TABLE agent_events SET (autovacuum_vacuum_cost_delay = 0);
ALTER TABLE embedding_jobs SET (autovacuum_vacuum_cost_delay = 0);
"""
THROTTLED = """
ALTER TABLE agent_events RESET (autovacuum_vacuum_cost_delay);
ALTER TABLE embedding_jobs RESET (autovacuum_vacuum_cost_delay);
"""


class Migration(migrations.Migration):
    dependencies = [("agents_app", "0008_trace_ids")]

    operations = [migrations.RunSQL(UNTHROTTLED, THROTTLED)]
