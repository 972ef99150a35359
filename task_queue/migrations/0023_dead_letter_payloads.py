from django.db import migrations

# The dead letter's payload text in a table of its own (issue 15): the dead letter's
# payload search (its `q`) reads this compact table, one short row per dead or
# failed task, instead of the heap row of every dead or failed task spread over the
# whole tasks table (200,000 rows over 144,000 heap pages at ten million tasks).
#
# `payload_text` is `upper(payload::text)` in full (no prefix cap), so a search is
# `strpos(payload_text, upper(term)) > 0`: the same rows, in any case, as
# `upper(payload::text) LIKE upper('%term%')` with the term's wildcards escaped,
# which is what task_queue.models.payload_contains asks of the whole table.
#
# Row-level triggers whose WHEN clause is false unless the old or new row is dead
# or failed keep it exact on every path (an outcome, a revive with or without a new
# payload, a cancel, retention, the admin, a cascade): a claim or completion of an
# ordinary task only evaluates that clause and queues nothing. A TRUNCATE of tasks
# empties it. Like task_counts (migration 0014), it starts from the dead and failed
# tasks read while the lock on tasks this migration holds (its triggers are created
# first) keeps out every write.
CREATE_DEAD_LETTER_PAYLOADS = """
CREATE TABLE dead_letter_payloads (
    task_id uuid PRIMARY KEY,
    payload_text text NOT NULL
);

CREATE FUNCTION keep_dead_letter_payload() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE'
       OR (TG_OP = 'UPDATE' AND (NEW.status NOT IN ('dead', 'failed') OR NEW.id <> OLD.id)) THEN
        DELETE FROM dead_letter_payloads WHERE task_id = OLD.id;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.status IN ('dead', 'failed') THEN
        INSERT INTO dead_letter_payloads (task_id, payload_text)
        VALUES (NEW.id, upper(NEW.payload::text))
        ON CONFLICT (task_id) DO UPDATE SET payload_text = EXCLUDED.payload_text;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION empty_dead_letter_payloads() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM dead_letter_payloads;
    RETURN NULL;
END $$;

LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER tasks_dead_letter_payload_inserted AFTER INSERT ON tasks
    FOR EACH ROW WHEN (NEW.status IN ('dead', 'failed'))
    EXECUTE FUNCTION keep_dead_letter_payload();
CREATE TRIGGER tasks_dead_letter_payload_updated AFTER UPDATE ON tasks
    FOR EACH ROW WHEN (OLD.status IN ('dead', 'failed') OR NEW.status IN ('dead', 'failed'))
    EXECUTE FUNCTION keep_dead_letter_payload();
CREATE TRIGGER tasks_dead_letter_payload_deleted AFTER DELETE ON tasks
    FOR EACH ROW WHEN (OLD.status IN ('dead', 'failed'))
    EXECUTE FUNCTION keep_dead_letter_payload();
CREATE TRIGGER tasks_dead_letter_payloads_truncated AFTER TRUNCATE ON tasks
    FOR EACH STATEMENT EXECUTE FUNCTION empty_dead_letter_payloads();

INSERT INTO dead_letter_payloads (task_id, payload_text)
SELECT id, upper(payload::text) FROM tasks WHERE status IN ('dead', 'failed');
"""

DROP_DEAD_LETTER_PAYLOADS = """
DROP TRIGGER tasks_dead_letter_payload_inserted ON tasks;
DROP TRIGGER tasks_dead_letter_payload_updated ON tasks;
DROP TRIGGER tasks_dead_letter_payload_deleted ON tasks;
DROP TRIGGER tasks_dead_letter_payloads_truncated ON tasks;
DROP FUNCTION keep_dead_letter_payload();
DROP FUNCTION empty_dead_letter_payloads();
DROP TABLE dead_letter_payloads;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0022_progress_and_worker_state"),
    ]

    operations = [
        migrations.RunSQL(CREATE_DEAD_LETTER_PAYLOADS, DROP_DEAD_LETTER_PAYLOADS),
    ]
