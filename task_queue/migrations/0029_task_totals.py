from django.db import migrations

# Prometheus's counters and histograms, kept by the writes (issue 15, target 5).
# GET /metrics added the stored rollups to everything after the last minute rollup,
# computed at each scrape like a rollup (history joined to tasks, histograms, the
# lot): during a drain of 7,000 tasks a second that tail held 200,000-400,000 rows
# and a scrape took 5.7-8.6 s (docs/performance.md).
#
# task_totals holds, per agent, counters that only grow: tasks created (inserts into
# tasks) and, from every row inserted into task_history (append-only), the attempt's
# outcome, and its run time and queue wait as histogram slots with their sums. Like
# task_counts (0014), statement-level triggers add each statement's figures to the
# rows of the backend that runs it (`shard`, its pid), so writers never wait on each
# other; maintenance folds the rows of ended backends into shard 0.
#
# What a history row counts as (its outcome, run time, queue wait, histogram slot)
# is decided once, by the SQL functions below, which the metric rollups
# (task_queue.sql.metrics.METRICS) call too: the counters and the rollups cannot
# disagree about what a row means. The slot bounds are HISTOGRAM_BOUNDS of
# task_queue.models.metrics (a test checks they agree); changing them takes a
# migration that replaces task_histogram_slot.
#
# The counters start where the scrape's sum of rollups and tail stood, computed in
# one statement (one snapshot) under locks that keep writes to tasks and
# task_history out (the triggers exist by then), so no Prometheus counter drops and
# nothing is counted twice. A TRUNCATE of tasks empties them, as it does task_counts:
# Prometheus reads a counter that drops as a restart.
HISTOGRAM_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
# The bounds negated, in ascending order, for width_bucket (see task_histogram_slot).
NEGATED_BOUNDS = "{" + ",".join(str(-bound) for bound in reversed(HISTOGRAM_BOUNDS)) + "}"


def added_by(history_with_agents: str) -> str:
    """Two CTEs; the second, `added` (agent_name, measure, slot, n, total), is what the
    history rows of `history_with_agents` (a FROM list with the history rows as `h`
    and their tasks as `t`; a row whose task is gone counts for nothing, as in the
    rollups' join) add to the totals: per agent, the outcomes (slot 0, total 0), and
    the run times and queue waits by histogram slot with their sums.

    Three aggregates over the materialised rows rather than one pass that fans each
    row out into three (a LATERAL VALUES list), which measured costlier
    (docs/performance.md, "Prometheus's counters kept by the writes").
    """
    return f"""
ended AS MATERIALIZED (
    SELECT t.agent_name, task_attempt_outcome(h) AS outcome,
           task_attempt_run_seconds(h) AS run, task_attempt_wait_seconds(h) AS wait
    FROM {history_with_agents}
),
added (agent_name, measure, slot, n, total) AS (
    SELECT agent_name, outcome, 0, count(*), 0::numeric
    FROM ended WHERE outcome IS NOT NULL GROUP BY 1, 2
    UNION ALL
    SELECT agent_name, 'run_time', task_histogram_slot(run), count(*), sum(run)::numeric
    FROM ended WHERE run IS NOT NULL GROUP BY 1, 3
    UNION ALL
    SELECT agent_name, 'queue_wait', task_histogram_slot(wait), count(*), sum(wait)::numeric
    FROM ended WHERE wait IS NOT NULL GROUP BY 1, 3
)"""


# A statement's rows: each row's agent is looked up by the task's primary key (OFFSET 0
# keeps the planner from making the lookup a join: PL/pgSQL keeps a statement's plan
# for the session, and a join planned while tasks looked empty could go on scanning
# the whole table).
ADDED_BY_NEW_ROWS = added_by(
    "new_rows h CROSS JOIN LATERAL (SELECT agent_name FROM tasks WHERE id = h.task_id OFFSET 0) AS t"
)
# The history after the rollups, once, at the start: a join.
ADDED_BY_THE_TAIL = added_by(
    "task_history h JOIN tasks t ON t.id = h.task_id"
    " WHERE h.occurred_at >= (SELECT tail_from FROM edges)"
)


CREATE_TASK_TOTALS = f"""
-- Slot i: above bound i-1 up to and including bound i (Prometheus's `le`); the
-- last slot, beyond the last bound. That is the number of bounds below the value:
-- all of them less those at or above it, which width_bucket counts on the negated
-- bounds. (One mention of `seconds`, so PostgreSQL can inline the function when its
-- argument is an expression; a CASE over the bounds cost the trigger below about 15
-- microseconds a value.)
CREATE FUNCTION task_histogram_slot(seconds float8) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN {len(HISTOGRAM_BOUNDS)} - width_bucket(-seconds, '{NEGATED_BOUNDS}'::float8[]);

-- The attempt's outcome as the counters name it, or NULL (a revive, an update, a
-- release at shutdown...).
CREATE FUNCTION task_attempt_outcome(h task_history) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN h.event = 'completed' THEN 'completed'
    WHEN h.event = 'failed' THEN 'failed'
    WHEN h.event IN ('dead', 'lease_expired') AND h.to_status = 'dead' THEN 'dead'
    WHEN h.event = 'retry_scheduled' OR (h.event = 'lease_expired' AND h.to_status = 'pending')
        THEN 'retried'
    WHEN h.event IN ('cancelled', 'lease_expired') AND h.to_status = 'cancelled'
        THEN 'cancelled'
END;

-- How long the attempt ran, if it ran: a lease that expired before the handler
-- started, or a task given back at shutdown, did not.
CREATE FUNCTION task_attempt_run_seconds(h task_history) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN h.started_at IS NOT NULL AND h.event <> 'released'
                 AND (h.event <> 'lease_expired' OR h.from_status = 'running')
            THEN EXTRACT(EPOCH FROM h.occurred_at - h.started_at)::float8 END;

-- How long the attempt waited from due to started.
CREATE FUNCTION task_attempt_wait_seconds(h task_history) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN h.started_at >= h.due_at
            THEN EXTRACT(EPOCH FROM h.started_at - h.due_at)::float8 END;

-- measure: 'created', an outcome (slot 0, total 0), or 'run_time' / 'queue_wait'
-- (the keys of task_queue.prometheus.HISTOGRAMS)
-- (n: the values in the slot, total: their sum). `total` is numeric: its sums are
-- exact whatever order the shards are added or folded in, so a histogram's _sum
-- never drops by a rounding (which Prometheus would read as a restart).
CREATE TABLE task_totals (
    agent_name text NOT NULL,
    measure text NOT NULL,
    slot integer NOT NULL,
    shard integer NOT NULL,
    n bigint NOT NULL,
    total numeric NOT NULL,
    PRIMARY KEY (agent_name, measure, slot, shard)
) WITH (fillfactor = 50, autovacuum_vacuum_cost_delay = 0);

CREATE FUNCTION count_created_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_totals AS c (agent_name, measure, slot, shard, n, total)
    SELECT agent_name, 'created', 0, pg_backend_pid(), count(*), 0
    FROM new_rows GROUP BY agent_name ORDER BY agent_name
    ON CONFLICT (agent_name, measure, slot, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$;

CREATE FUNCTION count_ended_attempts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH {ADDED_BY_NEW_ROWS}
    INSERT INTO task_totals AS c (agent_name, measure, slot, shard, n, total)
    SELECT agent_name, measure, slot, pg_backend_pid(), n, total FROM added ORDER BY 1, 2, 3
    ON CONFLICT (agent_name, measure, slot, shard)
    DO UPDATE SET n = c.n + EXCLUDED.n, total = c.total + EXCLUDED.total;
    RETURN NULL;
END $$;

CREATE FUNCTION count_truncated_totals() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM task_totals;
    RETURN NULL;
END $$;

LOCK TABLE tasks, task_history IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER tasks_count_created AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_created_tasks();
CREATE TRIGGER tasks_count_truncated_totals AFTER TRUNCATE ON tasks
    FOR EACH STATEMENT EXECUTE FUNCTION count_truncated_totals();
CREATE TRIGGER task_history_count_ended_attempts AFTER INSERT ON task_history
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_ended_attempts();

-- The start: the rollups that cover everything rolled up once (days, then hours, then
-- minutes, as the scrape read them), plus everything after them; with no rollups
-- started, everything.
WITH progress AS (
    SELECT max(computed_until) FILTER (WHERE bucket_seconds = 86400) AS days,
           max(computed_until) FILTER (WHERE bucket_seconds = 3600) AS hours,
           max(computed_until) FILTER (WHERE bucket_seconds = 60) AS minutes
    FROM metrics_rollup_progress
),
edges AS (
    SELECT COALESCE(days, '-infinity') AS days, greatest(days, hours) AS hours,
           COALESCE(greatest(days, hours, minutes), '-infinity') AS tail_from
    FROM progress
),
{ADDED_BY_THE_TAIL},
rolled AS (
    SELECT m.* FROM task_queue_metrics m, edges e
    WHERE (m.bucket_seconds = 86400 AND m.bucket_start < e.days)
       OR (m.bucket_seconds = 3600 AND m.bucket_start >= e.days AND m.bucket_start < e.hours)
       OR (m.bucket_seconds = 60 AND m.bucket_start >= e.hours
           AND m.bucket_start < e.tail_from)
),
started AS (
    SELECT r.agent_name, v.measure, 0 AS slot, v.n, 0::numeric AS total
    FROM rolled r CROSS JOIN LATERAL (VALUES
        ('created', r.tasks_created), ('completed', r.tasks_completed),
        ('failed', r.tasks_failed), ('dead', r.tasks_dead), ('retried', r.tasks_retried),
        ('cancelled', r.tasks_cancelled)) AS v(measure, n)
    UNION ALL
    SELECT r.agent_name, h.measure, s.slot - 1, s.n, 0
    FROM rolled r
    CROSS JOIN LATERAL (VALUES ('run_time', r.run_time_histogram),
                               ('queue_wait', r.queue_wait_histogram)) AS h(measure, slots)
    CROSS JOIN LATERAL unnest(h.slots) WITH ORDINALITY AS s(n, slot)
    UNION ALL  -- the sums, with the first slot
    SELECT r.agent_name, h.measure, 0, 0, h.total::numeric
    FROM rolled r
    CROSS JOIN LATERAL (VALUES ('run_time', r.run_time_sum),
                               ('queue_wait', r.queue_wait_sum)) AS h(measure, total)
    UNION ALL
    SELECT agent_name, 'created', 0, count(*), 0 FROM tasks, edges e
    WHERE created_at >= e.tail_from GROUP BY agent_name
    UNION ALL
    SELECT agent_name, measure, slot, n, total FROM added
)
INSERT INTO task_totals (agent_name, measure, slot, shard, n, total)
SELECT agent_name, measure, slot, 0, sum(n), sum(total) FROM started
GROUP BY 1, 2, 3 HAVING sum(n) <> 0 OR sum(total) <> 0;
"""

DROP_TASK_TOTALS = """
DROP TRIGGER tasks_count_created ON tasks;
DROP TRIGGER tasks_count_truncated_totals ON tasks;
DROP TRIGGER task_history_count_ended_attempts ON task_history;
DROP FUNCTION count_created_tasks();
DROP FUNCTION count_ended_attempts();
DROP FUNCTION count_truncated_totals();
DROP TABLE task_totals;
DROP FUNCTION task_attempt_wait_seconds(task_history);
DROP FUNCTION task_attempt_run_seconds(task_history);
DROP FUNCTION task_attempt_outcome(task_history);
DROP FUNCTION task_histogram_slot(float8);
"""


class Migration(migrations.Migration):
    dependencies = [("queue", "0028_task_finish_counts")]

    operations = [migrations.RunSQL(CREATE_TASK_TOTALS, DROP_TASK_TOTALS)]
