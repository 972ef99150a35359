from importlib import import_module

import django.db.models.functions.datetime
from django.db import migrations, models

# The dashboard's change notification as queue 0006 wrote it.
NOTIFY_TASK_CHANGES = import_module(
    "task_queue.migrations.0006_task_changes_detail"
).NOTIFY_TASK_CHANGES

# Cluster-wide limits per agent (issue 16), enforced by the lease query
# (task_queue.sql.leasing.CLAIM_TASKS) for the agents that have a row in
# agent_limits; an agent without one costs its claim an empty index lookup.
#
# agent_claim_allowance: how many of an agent's tasks a claim may start now. It
# first takes the agent's transaction lock (namespace task_queue.sql.locks.
# AGENT_LIMITS, passed in), held until the claim commits; a VOLATILE function takes a
# fresh snapshot for each of its queries (READ COMMITTED), so the counts after the
# lock see every claim committed before it. Held tasks are counted from the running
# totals (task_counts, exact in every transaction), starts from agent_starts.
#
# agent_starts: the start times of rate-limited agents' tasks within their window
# (a sliding-window log, written by the claim, pruned here). A window counts every
# start after (now - period), so any window of that length holds at most rate_count
# starts even when two claims' clocks are a little out of order.
#
# Freed slots: when a held task of an agent with a concurrency limit ends
# (completed, failed, released, reaped, cancelled), wake that agent's workers (NOTIFY
# on task_queue.sql.channels.NOTIFY_CHANNEL with the agent's name): a worker at the
# limit sleeps until then instead of polling. Done by the trigger that already runs
# after every UPDATE of tasks (notify_task_changes, queue 0006) rather than by a
# trigger of its own, whose every call (a claim, a completion) cost ~0.1 ms more.
CREATE_LIMITS_SQL = """
CREATE TABLE agent_starts (
    agent_name text NOT NULL,
    started_at timestamptz NOT NULL
);
CREATE INDEX agent_starts_window_idx ON agent_starts (agent_name, started_at);

CREATE FUNCTION agent_claim_allowance(agent text, lock_space integer, at timestamptz)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    lim agent_limits%ROWTYPE;
    room bigint := 2147483647;
    used bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_space, hashtext(agent));
    SELECT * INTO lim FROM agent_limits WHERE agent_name = agent;
    IF NOT FOUND THEN
        RETURN room;
    END IF;
    IF lim.concurrency_limit IS NOT NULL THEN
        SELECT coalesce(sum(n), 0) INTO used FROM task_counts
        WHERE agent_name = agent AND status IN ('leased', 'running');
        room := least(room, lim.concurrency_limit - used);
    END IF;
    IF lim.rate_count IS NOT NULL THEN
        -- A minute beyond the window: a claim whose clock (its transaction's start)
        -- is a little behind this one's still counts every start in its window.
        DELETE FROM agent_starts
        WHERE agent_name = agent
          AND started_at <= at - make_interval(secs => lim.rate_period_seconds)
                               - interval '1 minute';
        SELECT count(*) INTO used FROM agent_starts
        WHERE agent_name = agent
          AND started_at > at - make_interval(secs => lim.rate_period_seconds);
        room := least(room, lim.rate_count - used);
    END IF;
    RETURN greatest(room, 0);
END $$;

"""

FREED_SLOTS = """
    IF EXISTS (SELECT FROM agent_limits WHERE concurrency_limit IS NOT NULL) THEN
        PERFORM pg_notify('automechanica_tasks', freed.agent_name)
        FROM (
            SELECT DISTINCT old_rows.agent_name
            FROM old_rows JOIN new_rows ON new_rows.id = old_rows.id
            JOIN agent_limits l ON l.agent_name = old_rows.agent_name
            WHERE l.concurrency_limit IS NOT NULL
              AND old_rows.status IN ('leased', 'running')
              AND new_rows.status NOT IN ('leased', 'running')
        ) AS freed;
    END IF;
"""
_FUNCTION_END = "    RETURN NULL;\nEND $$;"
assert NOTIFY_TASK_CHANGES.count(_FUNCTION_END) == 1
NOTIFY_TASK_CHANGES_AND_FREED_SLOTS = NOTIFY_TASK_CHANGES.replace(
    _FUNCTION_END, FREED_SLOTS.lstrip("\n") + _FUNCTION_END
)

DROP_LIMITS_SQL = """
DROP FUNCTION agent_claim_allowance(text, integer, timestamptz);
DROP TABLE agent_starts;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue", "0017_schedules"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="task",
            options={
                "ordering": ["priority", "created_at"],
                "permissions": [
                    ("revive_task", "Can revive dead or failed tasks"),
                    ("cancel_task", "Can cancel tasks"),
                    ("pause_agent", "Can pause and resume an agent's queue"),
                    ("limit_agent", "Can set an agent's concurrency and rate limits"),
                ],
            },
        ),
        migrations.AlterField(
            model_name="operatoraction",
            name="action",
            field=models.TextField(
                choices=[
                    ("revive", "Revive"),
                    ("edit_and_revive", "Edit payload and revive"),
                    ("edit", "Edit"),
                    ("cancel", "Cancel"),
                    ("run_now", "Run now"),
                    ("pause", "Pause agent"),
                    ("resume", "Resume agent"),
                    ("limit", "Set agent limits"),
                    ("revive_messages", "Revive messages"),
                    ("revive_deliveries", "Revive publication deliveries"),
                    ("create_schedule", "Create schedule"),
                    ("update_schedule", "Change schedule"),
                    ("delete_schedule", "Delete schedule"),
                    ("pause_schedule", "Pause schedule"),
                    ("resume_schedule", "Resume schedule"),
                    ("run_schedule", "Run schedule now"),
                ]
            ),
        ),
        migrations.CreateModel(
            name="AgentLimits",
            fields=[
                ("agent_name", models.TextField(primary_key=True, serialize=False)),
                ("concurrency_limit", models.IntegerField(blank=True, null=True)),
                ("rate_count", models.IntegerField(blank=True, null=True)),
                ("rate_period_seconds", models.IntegerField(blank=True, null=True)),
                ("updated_by", models.TextField()),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "agent limits",
                "verbose_name_plural": "agent limits",
                "db_table": "agent_limits",
                "ordering": ["agent_name"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("concurrency_limit__isnull", True),
                            models.Q(
                                ("concurrency_limit__gte", 1), ("concurrency_limit__lte", 100000)
                            ),
                            _connector="OR",
                        ),
                        name="agent_limits_concurrency_range",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(
                                ("rate_count__isnull", True), ("rate_period_seconds__isnull", True)
                            ),
                            models.Q(
                                ("rate_count__gte", 1),
                                ("rate_count__lte", 100000),
                                ("rate_period_seconds__gte", 1),
                                ("rate_period_seconds__lte", 604800),
                            ),
                            _connector="OR",
                        ),
                        name="agent_limits_rate_range",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("concurrency_limit__isnull", False),
                            ("rate_count__isnull", False),
                            _connector="OR",
                        ),
                        name="agent_limits_some_limit",
                    ),
                ],
            },
        ),
        migrations.RunSQL(CREATE_LIMITS_SQL, DROP_LIMITS_SQL),
        migrations.RunSQL(NOTIFY_TASK_CHANGES_AND_FREED_SLOTS, NOTIFY_TASK_CHANGES),
    ]
