from django.db import migrations

# Tasks finished in the last hour, by 10-second bucket, agent and status, kept by the
# writes (issue 15, target 5). The overview, its live snapshot (once a second) and
# GET /api/v1/metrics showed what finished in the last 1, 5 and 15 minutes and the
# overview's chart the last hour by minute; they counted the tasks themselves, so
# their cost grew with the queue's throughput: with 900,000 tasks finished in the
# last 15 minutes (1,000 a second) the snapshot took 5.5 s (docs/performance.md).
#
# Like task_counts (0014): statement-level triggers add each statement's net change
# to the counter rows of the backend that runs it (`shard`, its pid), in the
# statement's transaction, on every path that changes tasks. A task counts in the
# bucket of its finished_at while its status is final, so a revive, a delete or an
# edit of finished_at moves or removes it, as a count of the table would. Only tasks
# finished less than REACH before the writing transaction began (its now()) are
# counted. Readers look back at most an hour from their own now(); every write a
# reader sees began before the reader's snapshot was taken, so as long as the reader's
# transaction is younger than REACH - 1 hour (10 minutes; the dashboard's and the
# API's are short), every bucket it reads was in reach of every write that touched
# it. Maintenance deletes buckets past the reach
# (task_queue.sql.counts.DROP_OLD_FINISH_BUCKETS).
#
# Triggers of their own rather than more work in 0014's: PostgreSQL builds a
# statement's transition tables once for all its triggers, so the cost is one more
# call per statement, and each migration reverses cleanly. The table starts from a
# count of the last REACH taken under the lock that keeps writes out (the triggers
# are created first), so no change is counted twice or lost.
REACH = "interval '70 minutes'"
FINAL = "status IN ('completed', 'failed', 'dead', 'cancelled')"
RECENTLY_FINISHED = f"{FINAL} AND finished_at >= now() - {REACH}"
BUCKET = "date_bin('10 seconds', finished_at, 'epoch')"

CREATE_TASK_FINISH_COUNTS = f"""
CREATE TABLE task_finish_counts (
    bucket_start timestamptz NOT NULL,
    agent_name text NOT NULL,
    status text NOT NULL,
    shard integer NOT NULL,
    n bigint NOT NULL,
    PRIMARY KEY (bucket_start, agent_name, status, shard)
) WITH (fillfactor = 50, autovacuum_vacuum_cost_delay = 0);

CREATE FUNCTION count_inserted_finishes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_finish_counts AS c (bucket_start, agent_name, status, shard, n)
    SELECT {BUCKET}, agent_name, status, pg_backend_pid(), count(*)
    FROM new_rows WHERE {RECENTLY_FINISHED}
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (bucket_start, agent_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE FUNCTION count_updated_finishes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_finish_counts AS c (bucket_start, agent_name, status, shard, n)
    SELECT bucket_start, agent_name, status, pg_backend_pid(), sum(delta)
    FROM (SELECT {BUCKET} AS bucket_start, agent_name, status, 1 AS delta
          FROM new_rows WHERE {RECENTLY_FINISHED}
          UNION ALL
          SELECT {BUCKET}, agent_name, status, -1
          FROM old_rows WHERE {RECENTLY_FINISHED}) AS moved
    GROUP BY 1, 2, 3 HAVING sum(delta) <> 0 ORDER BY 1, 2, 3
    ON CONFLICT (bucket_start, agent_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE FUNCTION count_deleted_finishes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_finish_counts AS c (bucket_start, agent_name, status, shard, n)
    SELECT {BUCKET}, agent_name, status, pg_backend_pid(), -count(*)
    FROM old_rows WHERE {RECENTLY_FINISHED}
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (bucket_start, agent_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE FUNCTION count_truncated_finishes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM task_finish_counts;
    RETURN NULL;
END $$;

LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER tasks_count_inserted_finishes AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_inserted_finishes();
CREATE TRIGGER tasks_count_updated_finishes AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_updated_finishes();
CREATE TRIGGER tasks_count_deleted_finishes AFTER DELETE ON tasks
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_deleted_finishes();
CREATE TRIGGER tasks_count_truncated_finishes AFTER TRUNCATE ON tasks
    FOR EACH STATEMENT EXECUTE FUNCTION count_truncated_finishes();

INSERT INTO task_finish_counts (bucket_start, agent_name, status, shard, n)
SELECT {BUCKET}, agent_name, status, 0, count(*) FROM tasks WHERE {RECENTLY_FINISHED}
GROUP BY 1, 2, 3;
"""

DROP_TASK_FINISH_COUNTS = """
DROP TRIGGER tasks_count_inserted_finishes ON tasks;
DROP TRIGGER tasks_count_updated_finishes ON tasks;
DROP TRIGGER tasks_count_deleted_finishes ON tasks;
DROP TRIGGER tasks_count_truncated_finishes ON tasks;
DROP FUNCTION count_inserted_finishes();
DROP FUNCTION count_updated_finishes();
DROP FUNCTION count_deleted_finishes();
DROP FUNCTION count_truncated_finishes();
DROP TABLE task_finish_counts;
"""


class Migration(migrations.Migration):
    dependencies = [("queue", "0027_append_tables_vacuumed_unthrottled")]

    operations = [migrations.RunSQL(CREATE_TASK_FINISH_COUNTS, DROP_TASK_FINISH_COUNTS)]
