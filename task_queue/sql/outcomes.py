"""A worker's fenced outcome writes: completed, failed (retry, dead or failed),
cancelled, released; each with its history row in the same statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from functools import cache
from uuid import UUID

from task_queue.leases import backoff, held_params
from task_queue.sql.connections import settings_scope
from task_queue.sql.db import (
    NOW,
    execute,
    fetch,
    fetch_bound,
    remake_plans_when_grown,
    require_transaction,
    set_up_session,
)
from task_queue.sql.leasing import FENCED, HELD, TASK_LEASE

# A completion, in one prepared statement (task_queue.sql.db.fetch_bound): the task,
# its history row, its evt.task.completed.v1 envelope, and what apps above the queue
# add to every completion (``add_to_completion``). Those are CTEs over `completed`
# (columns as its RETURNING names them), written with the task or not at all:
# agents_app adds the AgentEvent and its embedding job
# (agents_app.sql.memory.EVENTS_OF_COMPLETED_TASKS).
COMPLETE_TASKS_START = f"""
WITH held AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(results)s::jsonb[],
                         %(result_refs)s::text[], %(summaries)s::text[])
        AS d(id, lease_token, result, result_ref, summary)
),
completed AS (
    UPDATE tasks t
    SET status = 'completed', result = held.result, result_ref = held.result_ref,
        finished_at = {NOW},
        updated_at = {NOW}, {TASK_LEASE.clear()}
    FROM held
    WHERE {TASK_LEASE.fenced_batch("t", id_array=False)}
      -- IS TRUE: the planner cannot match the index of held leases (status leased or
      -- running) to it, so each task is looked up by its id, as it should be.
      AND (t.status = 'running') IS TRUE
    RETURNING t.id, t.workflow_id, t.agent_name, t.task_type, t.attempts, t.started_at,
              t.available_at, t.trace_id, held.lease_token, held.result, held.result_ref,
              held.summary
),
"""
COMPLETE_TASKS_END = f"""
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              lease_token, started_at, due_at, occurred_at)
    SELECT id, 'completed', 'running', 'completed', attempts + 1, %(owner)s, lease_token,
           started_at, available_at, {NOW}
    FROM completed
),
-- The envelope of seed 000, written here rather than by the history trigger, which
-- leaves completions out (queue 0016): there it cost a completion about a third more.
envelopes AS (
    INSERT INTO event_outbox (kind, trace_id, causation_id, subject_id, emitted_at,
                              payload)
    SELECT 'evt.task.completed.v1', trace_id, id::text, id::text, {NOW},
           jsonb_build_object(
               'task_id', id, 'agent_type', agent_name, 'task_type', task_type,
               'attempt', attempts + 1, 'agent_id', %(owner)s,
               'from_status', 'running', 'to_status', 'completed',
               'duration_ms', round(1000 * extract(epoch FROM {NOW} - started_at)),
               'result_ref', 'db://tasks/' || id || '/result')
    FROM completed
    ORDER BY id
)
SELECT id FROM completed
"""

# The session of a worker's outcome writer, for as long as its connection lasts: the
# completion, a prepared statement, runs its one generic plan from the first run on
# (tests/test_generic_plans.py). PostgreSQL would otherwise plan its first five runs
# for their values with the statistics of the moment: after a burst onto an emptied
# table they say there are no tasks, and the completion then read the whole table for
# every batch (a drain ran at 2,400 tasks/s).
PREPARE_OUTCOME_SESSION = "SELECT set_config('plan_cache_mode', 'force_generic_plan', false)"
# The same until the transaction ends, on a connection others use after it (the web
# server's pool, for the worker protocol over HTTP; a pooler in transaction mode).
PREPARE_OUTCOME_TRANSACTION = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"


def writing_outcomes() -> AbstractContextManager[None]:
    """Where a worker's outcome writer writes a batch (``connections.settings_scope``):
    on its connection set up for it (``prepare_outcome_session``), or behind a pooler
    in transaction mode, in a transaction of its own (``prepare_outcome_transaction``)."""
    return settings_scope(prepare_outcome_session, prepare_outcome_transaction)


def prepare_outcome_session() -> None:
    """Set up this thread's connection for writing outcomes: its settings once per
    connection, its plans made again once ``tasks`` has grown enough to make them
    stale (``remake_plans_when_grown``)."""
    set_up_session(PREPARE_OUTCOME_SESSION)
    remake_plans_when_grown("tasks")


def prepare_outcome_transaction() -> None:
    """The outcome session's settings until the current transaction ends (call it
    inside one); its plans made again as the table grows, as the outcome writer's
    are."""
    require_transaction("prepare_outcome_transaction")
    remake_plans_when_grown("tasks")
    execute(PREPARE_OUTCOME_TRANSACTION, {})


_completion_parts: dict[str, str] = {}


def add_to_completion(name: str, ctes: str) -> None:
    """Add ``ctes`` (one or more ``name AS (...)``, comma-separated, over `completed`;
    ``%(now)s`` is the statement's clock) to every completion statement."""
    _completion_parts[name] = ctes.strip()
    complete_statement.cache_clear()


@cache
def complete_statement() -> str:
    parts = "".join(f"{part},\n" for part in _completion_parts.values())
    return COMPLETE_TASKS_START + parts + COMPLETE_TASKS_END.lstrip("\n")


def complete_tasks(
    *,
    owner: str,
    done: Sequence[tuple[UUID, UUID, str | None, str | None, str]],
    now: datetime | None,
) -> set[UUID]:
    """Record successes: (id, lease token, result as JSON text or None, the result's
    blob reference or None, event summary) each.

    In the same statement: the history row and what apps added (``add_to_completion``:
    the AgentEvent and its embedding job). Returns the ids whose lease was still held;
    the others were refused.
    """
    params = {
        "owner": owner,
        "ids": [d[0] for d in done],
        "tokens": [d[1] for d in done],
        "results": [d[2] for d in done],
        "result_refs": [d[3] for d in done],
        "summaries": [d[4] for d in done],
        "now": now,
    }
    return {row[0] for row in fetch_bound(complete_statement(), params, prepared=True)}


FAIL_TASKS = f"""
WITH held AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(retryable)s::bool[],
                         %(base_delays)s::float8[], %(errors)s::jsonb[])
        AS f(id, lease_token, retryable, base_delay, error)
),
-- When each attempt was due, read before the update moves a retry's available_at.
due AS (
    SELECT t.id, t.available_at FROM tasks t JOIN held ON held.id = t.id
),
failed AS (
    UPDATE tasks t
    SET attempts = t.attempts + 1,
        -- A task whose cancel was requested ends cancelled, whatever its attempt did.
        status = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'cancelled'
                      WHEN NOT held.retryable THEN 'failed'
                      WHEN t.attempts + 1 >= t.max_attempts THEN 'dead'
                      ELSE 'pending' END,
        available_at = CASE WHEN held.retryable AND t.attempts + 1 < t.max_attempts
                                 AND t.cancel_requested_at IS NULL
                            THEN {NOW} + {backoff("t.attempts + 1", "held.base_delay")}
                            ELSE t.available_at END,
        error_info = held.error || jsonb_build_object(
            'attempt', t.attempts + 1, 'worker', %(owner)s, 'at', {NOW}),
        finished_at = {NOW}, updated_at = {NOW},
        {TASK_LEASE.clear()}
    FROM held
    WHERE {FENCED} AND t.status = 'running'
    RETURNING t.id, t.status, t.attempts, t.available_at, t.started_at, t.error_info,
              held.lease_token
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              lease_token, started_at, due_at, occurred_at, error, detail)
    SELECT failed.id, CASE status WHEN 'pending' THEN 'retry_scheduled' ELSE status END,
           'running', status, attempts, %(owner)s, lease_token, started_at,
           due.available_at, {NOW}, error_info,
           CASE status WHEN 'pending' THEN jsonb_build_object('retry_at', failed.available_at)
           END
    FROM failed JOIN due ON due.id = failed.id
)
SELECT id, status, attempts, available_at FROM failed
"""


def fail_tasks(
    *,
    owner: str,
    failures: Sequence[tuple[UUID, UUID, bool, float, str]],
    now: datetime | None,
) -> list[tuple[UUID, str, int, datetime]]:
    """Record failed attempts: (id, lease token, retryable, base delay, error JSON) each.

    attempts + 1; a retryable failure goes back to pending ``attempts² × base_delay``
    seconds from now, or to dead once attempts reach max_attempts; a non-retryable
    one to failed. Returns (id, new status, attempts, available_at) per held task.
    """
    params = {
        "owner": owner,
        "ids": [f[0] for f in failures],
        "tokens": [f[1] for f in failures],
        "retryable": [f[2] for f in failures],
        # float8[]: one list cannot mix the int an agent may give with floats.
        "base_delays": [float(f[3]) for f in failures],
        "errors": [f[4] for f in failures],
        "now": now,
    }
    return fetch_bound(FAIL_TASKS, params)


CONFIRM_CANCELLED = f"""
WITH cancelled AS (
    UPDATE tasks t
    SET status = 'cancelled', finished_at = {NOW}, updated_at = {NOW},
        {TASK_LEASE.clear()}
    FROM {HELD}
    WHERE {FENCED} AND t.status = 'running'
    RETURNING t.id, t.attempts, t.started_at, held.lease_token
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              lease_token, started_at, occurred_at)
    SELECT id, 'cancelled', 'running', 'cancelled', attempts + 1, %(owner)s, lease_token,
           started_at, {NOW}
    FROM cancelled
)
SELECT id FROM cancelled
"""


def confirm_cancelled(
    *, owner: str, held: Sequence[tuple[UUID, UUID]], now: datetime | None
) -> set[UUID]:
    """A worker stopped handlers whose cancellation was requested: mark them cancelled."""
    return {row[0] for row in fetch(CONFIRM_CANCELLED, held_params(owner, held, now))}


RELEASE_TASKS = f"""
WITH target AS (
    SELECT t.id, t.status, held.lease_token
    FROM tasks t, {HELD}
    WHERE {FENCED} AND t.status IN ('leased', 'running')
    FOR UPDATE OF t
),
released AS (
    UPDATE tasks t
    -- A task whose cancel was requested is not given back: it ends cancelled.
    SET status = CASE WHEN t.cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
        available_at = {NOW},
        finished_at = CASE WHEN t.cancel_requested_at IS NULL THEN t.finished_at ELSE {NOW} END,
        updated_at = {NOW}, {TASK_LEASE.clear()}
    FROM target
    WHERE t.id = target.id
    RETURNING t.id, t.agent_name, t.attempts, t.started_at, target.status AS from_status,
              t.status AS to_status, target.lease_token
),
history AS (
    INSERT INTO task_history (task_id, event, from_status, to_status, attempt, actor,
                              lease_token, started_at, occurred_at)
    SELECT id, CASE to_status WHEN 'pending' THEN 'released' ELSE 'cancelled' END,
           from_status, to_status, attempts + 1, %(owner)s, lease_token, started_at, {NOW}
    FROM released
)
SELECT id, agent_name, to_status FROM released
"""


def release_tasks(
    *, owner: str, held: Sequence[tuple[UUID, UUID]], now: datetime | None
) -> list[tuple[UUID, str, str]]:
    """Give held tasks back as pending and due now, without counting an attempt (one
    whose cancel was requested ends cancelled); (id, agent, new status) of each task
    whose lease was still held."""
    return fetch(RELEASE_TASKS, held_params(owner, held, now))
