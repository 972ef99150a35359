from django.db import migrations

# Running totals of tasks by agent and status, kept by the writes (issue 15): the
# dashboard, the API and Prometheus read a few hundred rows instead of counting a
# table of millions.
#
# One statement-level trigger per kind of change (a trigger with transition tables
# takes one event) adds the statement's net change per (agent, status) to the
# counter rows of the backend that runs it (`shard` = its pid), in the statement's
# transaction: exact on every path that changes tasks (the worker's SQL, the
# reaper, operator actions, retention, the admin, a cascade), and two live backends
# never write the same row, so busy workers do not queue on each other's counter
# locks. A reader sums the shards. Rows of backends that ended are folded into shard
# 0 by maintenance (task_queue.sql.counts.FOLD_ENDED_COUNTS), which keeps the
# table to a few rows per live connection. A TRUNCATE of tasks empties it.
#
# The table starts from a full count taken while the lock on tasks this migration
# holds (its triggers are created first) keeps out every write, so no change is
# counted twice or lost.
CREATE_TASK_COUNTS = """
CREATE TABLE task_counts (
    agent_name text NOT NULL,
    status text NOT NULL,
    shard integer NOT NULL,
    n bigint NOT NULL,
    PRIMARY KEY (agent_name, status, shard)
) WITH (fillfactor = 50);

CREATE FUNCTION count_inserted_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_counts AS c (agent_name, status, shard, n)
    SELECT agent_name, status, pg_backend_pid(), count(*)
    FROM new_rows GROUP BY agent_name, status ORDER BY agent_name, status
    ON CONFLICT (agent_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE FUNCTION count_updated_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_counts AS c (agent_name, status, shard, n)
    SELECT agent_name, status, pg_backend_pid(), sum(delta)
    FROM (SELECT agent_name, status, 1 AS delta FROM new_rows
          UNION ALL
          SELECT agent_name, status, -1 FROM old_rows) AS moved
    GROUP BY agent_name, status HAVING sum(delta) <> 0 ORDER BY agent_name, status
    ON CONFLICT (agent_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE FUNCTION count_deleted_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_counts AS c (agent_name, status, shard, n)
    SELECT agent_name, status, pg_backend_pid(), -count(*)
    FROM old_rows GROUP BY agent_name, status ORDER BY agent_name, status
    ON CONFLICT (agent_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE FUNCTION count_truncated_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM task_counts;
    RETURN NULL;
END $$;

LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER tasks_count_inserted AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_inserted_tasks();
CREATE TRIGGER tasks_count_updated AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_updated_tasks();
CREATE TRIGGER tasks_count_deleted AFTER DELETE ON tasks
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_deleted_tasks();
CREATE TRIGGER tasks_count_truncated AFTER TRUNCATE ON tasks
    FOR EACH STATEMENT EXECUTE FUNCTION count_truncated_tasks();

INSERT INTO task_counts (agent_name, status, shard, n)
SELECT agent_name, status, 0, count(*) FROM tasks GROUP BY agent_name, status;
"""

DROP_TASK_COUNTS = """
DROP TRIGGER tasks_count_inserted ON tasks;
DROP TRIGGER tasks_count_updated ON tasks;
DROP TRIGGER tasks_count_deleted ON tasks;
DROP TRIGGER tasks_count_truncated ON tasks;
DROP FUNCTION count_inserted_tasks();
DROP FUNCTION count_updated_tasks();
DROP FUNCTION count_deleted_tasks();
DROP FUNCTION count_truncated_tasks();
DROP TABLE task_counts;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0013_claims_start_tasks"),
    ]

    operations = [
        migrations.RunSQL(CREATE_TASK_COUNTS, DROP_TASK_COUNTS),
    ]
