from django.db import migrations, models

# The dead letter's compact table (migration 0023) carries, besides the payload text,
# every column the dead letter filters and orders by (issue 15): the dashboard's page
# and its count (agent, task type, error class, finished time, newest death first),
# the API's `GET /dead-letter` and its bulk revive (status, agent, task type, workflow,
# trace, priority, created and updated times, newest first). So the dead letter is
# counted and paged from this table alone, 200,000 short rows at ten million tasks,
# and only a page's rows are read from `tasks`, by key: a payload search that most of
# the dead letter matches no longer reads every dead task's heap row.
#
# The row triggers of migration 0023 stay as they are (their WHEN clauses are false
# for the claims and outcomes of tasks that are not dead or failed, so the hot path
# evaluates a clause and queues nothing); they fire on every change of a dead or
# failed task, so a copied column stays exact whatever changed it. Only their function
# now copies the columns below. `error_class` is the error's `type` when that is a
# JSON string, which is what the dashboard's filter (`error_info -> 'type'` equal to a
# JSON string) can match.
#
# Indexed for the dead letter's two orders, newest death first (the page) and newest
# first (the API), which a walk stops early however many rows match, and for the
# page's filters (agent, error class, task type) and their counts, which an index of
# its own answers without reading the rows (once vacuum marked their pages visible).
# An agent's errors are of a few classes: the statistics of the three columns together
# tell the planner which combinations are rare, so that it reads those few from the
# filter index instead of walking the order index in hope of an early stop (71 ms for
# a combination no row has, at ten million tasks, against 0.1 ms).
#
# The table is filled again from the dead and failed tasks under the lock on tasks
# this migration takes (no write, so no trigger, meanwhile), in order of death so the
# newest-first walk of its index reads its pages in order.

COLUMNS = (
    "task_id, payload_text, status, agent_name, task_type, error_class, priority, "
    "workflow_id, trace_id, created_at, updated_at, finished_at"
)


def values_of(row: str) -> str:
    """The table's columns, in COLUMNS' order, from a tasks row named ``row``."""
    return (
        f"{row}.id, upper({row}.payload::text), {row}.status, {row}.agent_name, "
        f"{row}.task_type, CASE WHEN jsonb_typeof({row}.error_info -> 'type') = 'string' "
        f"THEN {row}.error_info ->> 'type' END, {row}.priority, {row}.workflow_id, "
        f"{row}.trace_id, {row}.created_at, {row}.updated_at, {row}.finished_at"
    )


ADDED = COLUMNS.removeprefix("task_id, payload_text, ")
UPDATES = ", ".join(f"{name} = EXCLUDED.{name}" for name in COLUMNS.split(", ")[1:])


def keep_function(columns: str, values: str, updates: str) -> str:
    """The row triggers' function (migration 0023), copying ``columns`` from the task
    (``values``, over ``NEW``) and, on conflict, setting ``updates``."""
    return f"""
CREATE OR REPLACE FUNCTION keep_dead_letter_payload() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE'
       OR (TG_OP = 'UPDATE' AND (NEW.status NOT IN ('dead', 'failed') OR NEW.id <> OLD.id)) THEN
        DELETE FROM dead_letter_payloads WHERE task_id = OLD.id;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.status IN ('dead', 'failed') THEN
        INSERT INTO dead_letter_payloads ({columns})
        VALUES ({values})
        ON CONFLICT (task_id) DO UPDATE SET {updates};
    END IF;
    RETURN NULL;
END $$;"""


CARRY_THE_FILTERS = f"""
LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE;

{keep_function(COLUMNS, values_of("NEW"), UPDATES)}

TRUNCATE dead_letter_payloads;
ALTER TABLE dead_letter_payloads
    ADD COLUMN status text NOT NULL,
    ADD COLUMN agent_name text NOT NULL,
    ADD COLUMN task_type text NOT NULL,
    ADD COLUMN error_class text,
    ADD COLUMN priority integer NOT NULL,
    ADD COLUMN workflow_id uuid,
    ADD COLUMN trace_id text,
    ADD COLUMN created_at timestamp with time zone NOT NULL,
    ADD COLUMN updated_at timestamp with time zone NOT NULL,
    ADD COLUMN finished_at timestamp with time zone;

INSERT INTO dead_letter_payloads ({COLUMNS})
SELECT {values_of("t")} FROM tasks t
WHERE t.status IN ('dead', 'failed')
ORDER BY t.finished_at, t.id;

CREATE INDEX dead_letter_payloads_finished_idx ON dead_letter_payloads (finished_at, task_id);
CREATE INDEX dead_letter_payloads_created_idx ON dead_letter_payloads (created_at, task_id);
CREATE INDEX dead_letter_payloads_filter_idx
    ON dead_letter_payloads (agent_name, error_class, task_type, finished_at);
CREATE STATISTICS dead_letter_payloads_filter_stats (mcv)
    ON agent_name, error_class, task_type FROM dead_letter_payloads;
ANALYZE dead_letter_payloads;
"""

PAYLOAD_TEXT_ONLY = f"""
LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE;

{keep_function("task_id, payload_text", "NEW.id, upper(NEW.payload::text)", "payload_text = EXCLUDED.payload_text")}

DROP INDEX dead_letter_payloads_finished_idx;
DROP INDEX dead_letter_payloads_created_idx;
DROP INDEX dead_letter_payloads_filter_idx;
DROP STATISTICS dead_letter_payloads_filter_stats;
ALTER TABLE dead_letter_payloads
    {", ".join(f"DROP COLUMN {name}" for name in ADDED.split(", "))};
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0024_tasks_vacuumed_often"),
    ]

    operations = [
        migrations.RunSQL(CARRY_THE_FILTERS, PAYLOAD_TEXT_ONLY),
        # The table as Django reads it (task_queue.models.DeadLetterEntry); the SQL
        # above and in 0023 makes it.
        migrations.CreateModel(
            name="DeadLetterEntry",
            fields=[
                ("id", models.UUIDField(db_column="task_id", primary_key=True, serialize=False)),
                ("payload_text", models.TextField()),
                ("status", models.TextField()),
                ("agent_name", models.TextField()),
                ("task_type", models.TextField()),
                ("error_class", models.TextField(null=True)),
                ("priority", models.IntegerField()),
                ("workflow_id", models.UUIDField(null=True)),
                ("trace_id", models.TextField(null=True)),
                ("created_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(null=True)),
            ],
            options={"db_table": "dead_letter_payloads", "managed": False},
        ),
    ]
